//! A tree backup's catalog as a directory tree in memory, for browsing
//! (`tessera mount`): read once, record by record, into one node per entry
//! with its children sorted by name and each file's extent in the stream.

use super::catalog::{Entry, Kind};
use super::stream::{for_each_entry, tree_of};
use crate::error::{Error, Result};
use crate::format::snapshot::BackupId;
use crate::repo::Repository;
use std::collections::HashMap;

/// One object of the tree: its catalog entry (without its path), its name
/// and, for a directory, its children.
#[derive(Clone, Debug)]
pub struct Node {
    /// The last component of its path.
    pub name: Vec<u8>,
    /// Its catalog entry (`path` left empty).
    pub entry: Entry,
    /// Where its bytes start in the backup's stream (files).
    pub offset: u64,
    /// Its children, sorted by name (directories).
    pub children: Vec<u32>,
}

/// The directory tree of a tree backup. Node 0 is the root (`/`); a
/// directory the catalog does not list but whose contents it does (the
/// catalog records the given paths' parents, so only a damaged catalog
/// lacks them) appears with mode 0755.
pub struct TreeIndex {
    nodes: Vec<Node>,
}

/// The root's node index.
pub const ROOT: u32 = 0;

impl TreeIndex {
    /// Reads the catalog of tree backup `id`; `root` gives the root
    /// directory's owner, mode and times.
    pub fn load(repo: &Repository, id: BackupId, root: Entry) -> Result<TreeIndex> {
        let tree = tree_of(repo, id)?;
        let chunks = repo.recipe(id)?.chunks;
        let mut index = TreeIndex {
            nodes: vec![Node {
                name: Vec::new(),
                entry: root,
                offset: 0,
                children: Vec::new(),
            }],
        };
        let mut by_path: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut offset = 0u64;
        for_each_entry(repo, id, &tree, &chunks, |mut e| {
            let mut at = offset;
            if e.has_bytes() {
                offset += e.size;
            }
            if e.kind == Kind::Gap {
                return Ok(true);
            }
            if e.kind == Kind::Hardlink {
                // Another name of a file listed earlier: the same bytes.
                let target = e.target.strip_suffix(b"/").unwrap_or(&e.target);
                let file = by_path
                    .get(target)
                    .and_then(|&i| index.nodes.get(i as usize))
                    .filter(|n| n.entry.kind == Kind::File)
                    .ok_or_else(|| {
                        Error::corrupt(
                            format!("catalog of backup {id}"),
                            format!(
                                "hard link {:?} to {:?}, not a file listed before it",
                                String::from_utf8_lossy(&e.path),
                                String::from_utf8_lossy(&e.target)
                            ),
                        )
                    })?;
                at = file.offset;
                e = Entry {
                    path: std::mem::take(&mut e.path),
                    ..file.entry.clone()
                };
            }
            let path = std::mem::take(&mut e.path);
            index.insert(&mut by_path, path, e, at, id)?;
            Ok(true)
        })?;
        for n in &mut index.nodes {
            n.children.shrink_to_fit();
        }
        let names: Vec<Vec<u8>> = index.nodes.iter().map(|n| n.name.clone()).collect();
        for n in &mut index.nodes {
            n.children
                .sort_by(|a, b| names[*a as usize].cmp(&names[*b as usize]));
        }
        Ok(index)
    }

    fn insert(
        &mut self,
        by_path: &mut HashMap<Vec<u8>, u32>,
        path: Vec<u8>,
        entry: Entry,
        offset: u64,
        id: BackupId,
    ) -> Result<()> {
        let path = path.strip_suffix(b"/").unwrap_or(&path).to_vec();
        if path.is_empty()
            || path
                .split(|&b| b == b'/')
                .any(|c| c.is_empty() || c == b"." || c == b"..")
        {
            return Err(Error::corrupt(
                format!("catalog of backup {id}"),
                format!("invalid path {:?}", String::from_utf8_lossy(&path)),
            ));
        }
        let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (
                self.dir(by_path, &path[..i], &entry, id)?,
                path[i + 1..].to_vec(),
            ),
            None => (ROOT, path.clone()),
        };
        if let Some(&existing) = by_path.get(&path) {
            // A directory created for its contents before its own entry.
            let node = &mut self.nodes[existing as usize];
            if node.entry.kind != Kind::Dir || entry.kind != Kind::Dir {
                return Err(Error::corrupt(
                    format!("catalog of backup {id}"),
                    format!("{:?} listed twice", String::from_utf8_lossy(&path)),
                ));
            }
            node.entry = entry;
            return Ok(());
        }
        let i = u32::try_from(self.nodes.len()).map_err(|_| {
            Error::corrupt(format!("catalog of backup {id}"), "more than 2^32 entries")
        })?;
        self.nodes.push(Node {
            name,
            entry,
            offset,
            children: Vec::new(),
        });
        self.nodes[parent as usize].children.push(i);
        by_path.insert(path, i);
        Ok(())
    }

    /// The node of directory `path`, created (mode 0755, times of `like`) if missing.
    fn dir(
        &mut self,
        by_path: &mut HashMap<Vec<u8>, u32>,
        path: &[u8],
        like: &Entry,
        id: BackupId,
    ) -> Result<u32> {
        if let Some(&i) = by_path.get(path) {
            if self.nodes[i as usize].entry.kind != Kind::Dir {
                return Err(Error::corrupt(
                    format!("catalog of backup {id}"),
                    format!(
                        "{:?} has contents but is not a directory",
                        String::from_utf8_lossy(path)
                    ),
                ));
            }
            return Ok(i);
        }
        let entry = Entry {
            kind: Kind::Dir,
            mode: 0o755,
            size: 0,
            target: Vec::new(),
            ..like.clone()
        };
        self.insert(by_path, path.to_vec(), entry, 0, id)?;
        Ok(by_path.get(path).copied().unwrap_or(ROOT))
    }

    /// Node `i`, if there is one.
    pub fn node(&self, i: u32) -> Option<&Node> {
        self.nodes.get(i as usize)
    }

    /// The child of directory `dir` called `name`.
    pub fn child(&self, dir: u32, name: &[u8]) -> Option<u32> {
        let d = self.node(dir)?;
        d.children
            .binary_search_by(|&c| self.nodes[c as usize].name.as_slice().cmp(name))
            .ok()
            .map(|at| d.children[at])
    }

    /// Objects in the tree, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tree holds only its root.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 1
    }
}
