//! The read-only file system of `tessera mount`, without FUSE: the names,
//! attributes and bytes the CLI's FUSE adapter serves.
//!
//! ```text
//! ids/<ID>                 each backup: a tree backup's directory tree, a stream backup as one file
//! sources/<SOURCE>/<ID>    symbolic link to ../../ids/<ID>, for each backup of SOURCE
//! sources/<SOURCE>/latest  symbolic link to the newest backup of SOURCE
//! tags/<TAG>/<ID>          symbolic link to ../../ids/<ID>, for each backup tagged TAG
//! tags/<TAG>/latest        symbolic link to the newest backup tagged TAG
//! latest                   symbolic link to ids/<ID> of the newest backup overall
//! ```
//!
//! A source or tag name is shown with `%` as `%25` and `/` as `%2F` (and a name
//! of `.` or `..` with its dots so escaped). The backups are those
//! committed when the file system was created. A backup's catalog is read
//! when its tree is first visited and kept for the [`TREES_KEPT`] most
//! recently visited backups; file bytes are read through [`crate::restore::ranges`]
//! (every chunk verified, a bounded cache of decoded chunks).

use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, Snapshot};
use crate::repo::Repository;
use crate::restore::ranges::{read_range, ChunkCache, StreamMap};
use crate::tree::catalog::{Entry, Kind};
use crate::tree::index::{TreeIndex, ROOT};
use lru::LruCache;
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

/// Backups whose catalog (as a [`TreeIndex`]) and recipe are kept in memory.
pub const TREES_KEPT: usize = 8;
/// Bytes of decoded chunks kept by default.
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;

/// A directory's entries: name and attributes.
pub type DirEntries = Vec<(Vec<u8>, Attr)>;

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

/// The attributes of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Its inode number (the root is 1).
    pub ino: u64,
    /// What it is.
    pub kind: NodeKind,
    /// Bytes (files: their length; symbolic links: their target's).
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time (seconds since the epoch, nanoseconds).
    pub mtime: (i64, u32),
    /// Status-change time.
    pub ctime: (i64, u32),
    /// The device number (character and block devices).
    pub rdev: u64,
}

/// A node of the file system.
#[derive(Clone, Debug)]
enum Node {
    Root,
    Ids,
    /// `sources` or `tags`.
    Groups(View),
    /// `sources/<name>` or `tags/<name>`: index into the view's groups.
    Group(View, usize),
    /// A symbolic link to this target.
    Link(Vec<u8>),
    /// `ids/<ID>`: the tree's root, or the stream as a file.
    Backup(BackupId),
    /// Node `node` of backup `id`'s tree.
    InTree {
        id: BackupId,
        node: u32,
    },
}

/// A directory of backups grouped by a property.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum View {
    /// `sources/`: by source.
    Sources,
    /// `tags/`: by tag (a backup with several tags is in each).
    Tags,
}

/// Nodes created so far: inode `i + 1` is `nodes[i]`; each (parent, name)
/// always gets the same inode.
struct Inodes {
    nodes: Vec<Node>,
    named: HashMap<(u64, Vec<u8>), u64>,
}

struct Caches {
    trees: LruCache<BackupId, Arc<TreeIndex>>,
    maps: LruCache<BackupId, Arc<StreamMap>>,
    chunks: ChunkCache,
}

/// The file system of a repository's backups.
pub struct MountedRepo {
    repo: Repository,
    backups: BTreeMap<BackupId, Snapshot>,
    /// Source names, and the backups of each in id order.
    sources: Vec<(String, Vec<BackupId>)>,
    /// Tags, and the backups of each in id order.
    tags: Vec<(String, Vec<BackupId>)>,
    inodes: Mutex<Inodes>,
    caches: Mutex<Caches>,
}

/// The inode of the root directory.
pub const ROOT_INO: u64 = 1;

impl MountedRepo {
    /// The file system of the backups committed in `repo` (opened for
    /// reading), with at most `cache_bytes` of decoded chunks in memory.
    /// Backups whose snapshot cannot be read are left out; a trace
    /// repository (no data) is refused.
    pub fn new(repo: Repository, cache_bytes: u64) -> Result<MountedRepo> {
        if repo.config().trace {
            return Err(Error::InvalidOption(
                "a trace repository holds no data to mount".into(),
            ));
        }
        let mut backups = BTreeMap::new();
        let mut by_source: BTreeMap<String, Vec<BackupId>> = BTreeMap::new();
        let mut by_tag: BTreeMap<String, Vec<BackupId>> = BTreeMap::new();
        for listed in repo.listing()? {
            if let Ok(snap) = listed.snapshot {
                by_source
                    .entry(snap.source.clone())
                    .or_default()
                    .push(snap.id);
                for tag in &snap.tags {
                    by_tag.entry(tag.clone()).or_default().push(snap.id);
                }
                backups.insert(snap.id, snap);
            }
        }
        let kept = NonZeroUsize::new(TREES_KEPT).unwrap_or(NonZeroUsize::MIN);
        Ok(MountedRepo {
            repo,
            backups,
            sources: by_source.into_iter().collect(),
            tags: by_tag.into_iter().collect(),
            inodes: Mutex::new(Inodes {
                nodes: vec![Node::Root],
                named: HashMap::new(),
            }),
            caches: Mutex::new(Caches {
                trees: LruCache::new(kept),
                maps: LruCache::new(kept),
                chunks: ChunkCache::new(cache_bytes),
            }),
        })
    }

    /// The attributes of inode `ino`, if there is one.
    pub fn getattr(&self, ino: u64) -> Result<Option<Attr>> {
        match self.node(ino) {
            Some(node) => self.attr(ino, &node).map(Some),
            None => Ok(None),
        }
    }

    /// The child `name` of directory `parent`, if there is one.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Option<Attr>> {
        let Some(node) = self.node(parent) else {
            return Ok(None);
        };
        let in_tree = match node {
            Node::Backup(id) if self.is_tree(id) => Some((id, ROOT)),
            Node::InTree { id, node } => Some((id, node)),
            _ => None,
        };
        let found = match in_tree {
            // Large directories: found by name, not listed.
            Some((id, dir)) => self
                .tree(id)?
                .child(dir, name)
                .map(|node| (name.to_vec(), Node::InTree { id, node })),
            None => self.children(&node)?.into_iter().find(|(n, _)| n == name),
        };
        match found {
            Some((name, child)) => {
                let ino = self.inode(parent, name, child.clone());
                self.attr(ino, &child).map(Some)
            }
            None => Ok(None),
        }
    }

    /// The entries of directory `ino` (without `.` and `..`): name and attributes.
    pub fn readdir(&self, ino: u64) -> Result<Option<DirEntries>> {
        let Some(node) = self.node(ino) else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for (name, child) in self.children(&node)? {
            let child_ino = self.inode(ino, name.clone(), child.clone());
            out.push((name, self.attr(child_ino, &child)?));
        }
        Ok(Some(out))
    }

    /// The target of symbolic link `ino`.
    pub fn readlink(&self, ino: u64) -> Result<Option<Vec<u8>>> {
        Ok(match self.node(ino) {
            Some(Node::Link(target)) => Some(target),
            Some(Node::InTree { id, node }) => {
                let tree = self.tree(id)?;
                tree.node(node)
                    .filter(|n| n.entry.kind == Kind::Symlink)
                    .map(|n| n.entry.target.clone())
            }
            _ => None,
        })
    }

    /// Up to `size` bytes of file `ino` from `offset` (fewer at its end).
    /// Every chunk read is verified: a damaged one fails the read.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Option<Vec<u8>>> {
        let (id, start, len) = match self.node(ino) {
            Some(Node::Backup(id)) if !self.is_tree(id) => {
                let len = self.backups.get(&id).map_or(0, |s| s.logical_bytes);
                (id, 0, len)
            }
            Some(Node::InTree { id, node }) => {
                let tree = self.tree(id)?;
                match tree.node(node) {
                    Some(n) if n.entry.kind == Kind::File => (id, n.offset, n.entry.size),
                    _ => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        if offset >= len {
            return Ok(Some(Vec::new()));
        }
        let want = (size as u64).min(len - offset) as usize;
        let map = self.map(id)?;
        let mut caches = self.caches.lock().unwrap_or_else(|e| e.into_inner());
        read_range(
            &self.repo,
            &map,
            &mut caches.chunks,
            start + offset,
            want,
            start + len,
        )
        .map(Some)
    }

    fn is_tree(&self, id: BackupId) -> bool {
        self.backups.get(&id).is_some_and(|s| s.tree.is_some())
    }

    fn node(&self, ino: u64) -> Option<Node> {
        let inodes = self.inodes.lock().unwrap_or_else(|e| e.into_inner());
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        inodes.nodes.get(i).cloned()
    }

    /// The inode of `parent`'s child `name`, created if new.
    fn inode(&self, parent: u64, name: Vec<u8>, node: Node) -> u64 {
        let mut inodes = self.inodes.lock().unwrap_or_else(|e| e.into_inner());
        let key = (parent, name);
        if let Some(&ino) = inodes.named.get(&key) {
            return ino;
        }
        inodes.nodes.push(node);
        let ino = inodes.nodes.len() as u64;
        inodes.named.insert(key, ino);
        ino
    }

    /// The children of a directory node, in name order.
    fn children(&self, node: &Node) -> Result<Vec<(Vec<u8>, Node)>> {
        let link_to = |id: BackupId| Node::Link(format!("../../ids/{id}").into_bytes());
        Ok(match node {
            Node::Root => {
                let mut v = vec![(b"ids".to_vec(), Node::Ids)];
                if let Some(&id) = self.backups.keys().next_back() {
                    v.push((
                        b"latest".to_vec(),
                        Node::Link(format!("ids/{id}").into_bytes()),
                    ));
                }
                v.push((b"sources".to_vec(), Node::Groups(View::Sources)));
                v.push((b"tags".to_vec(), Node::Groups(View::Tags)));
                v
            }
            Node::Ids => self
                .backups
                .keys()
                .map(|&id| (id.to_string().into_bytes(), Node::Backup(id)))
                .collect(),
            Node::Groups(view) => self
                .groups(*view)
                .iter()
                .enumerate()
                .map(|(i, (name, _))| (escape_name(name).into_bytes(), Node::Group(*view, i)))
                .collect(),
            Node::Group(view, i) => {
                let ids = self.group(*view, *i);
                let mut v: Vec<(Vec<u8>, Node)> = ids
                    .iter()
                    .map(|&id| (id.to_string().into_bytes(), link_to(id)))
                    .collect();
                if let Some(&id) = ids.last() {
                    v.push((b"latest".to_vec(), link_to(id)));
                }
                v
            }
            Node::Backup(id) if self.is_tree(*id) => self.tree_children(*id, ROOT)?,
            Node::InTree { id, node } => self.tree_children(*id, *node)?,
            Node::Backup(_) | Node::Link(_) => Vec::new(),
        })
    }

    /// The groups of a view: names and their backups.
    fn groups(&self, view: View) -> &[(String, Vec<BackupId>)] {
        match view {
            View::Sources => &self.sources,
            View::Tags => &self.tags,
        }
    }

    /// The backups of group `i` of a view, in id order.
    fn group(&self, view: View, i: usize) -> &[BackupId] {
        self.groups(view)
            .get(i)
            .map(|g| g.1.as_slice())
            .unwrap_or_default()
    }

    fn tree_children(&self, id: BackupId, node: u32) -> Result<Vec<(Vec<u8>, Node)>> {
        let tree = self.tree(id)?;
        Ok(tree
            .node(node)
            .map(|n| {
                n.children
                    .iter()
                    .filter_map(|&c| tree.node(c).map(|child| (child.name.clone(), c)))
                    .map(|(name, c)| (name, Node::InTree { id, node: c }))
                    .collect()
            })
            .unwrap_or_default())
    }

    fn attr(&self, ino: u64, node: &Node) -> Result<Attr> {
        let dir = |mtime: i64| Attr {
            ino,
            kind: NodeKind::Dir,
            size: 0,
            mode: 0o555,
            uid: 0,
            gid: 0,
            mtime: (mtime, 0),
            ctime: (mtime, 0),
            rdev: 0,
        };
        let newest = self.backups.values().map(|s| s.time).max().unwrap_or(0) as i64;
        Ok(match node {
            Node::Root | Node::Ids | Node::Groups(_) => dir(newest),
            Node::Group(view, i) => {
                let time = self
                    .group(*view, *i)
                    .iter()
                    .filter_map(|id| self.backups.get(id))
                    .map(|s| s.time)
                    .max()
                    .unwrap_or(0);
                dir(time as i64)
            }
            Node::Link(target) => Attr {
                kind: NodeKind::Symlink,
                size: target.len() as u64,
                mode: 0o777,
                ..dir(newest)
            },
            Node::Backup(id) => {
                let snap = self.backups.get(id);
                let time = snap.map_or(0, |s| s.time) as i64;
                match snap {
                    Some(s) if s.tree.is_some() => {
                        let tree = self.tree(*id)?;
                        match tree.node(ROOT) {
                            Some(root) => entry_attr(ino, &root.entry),
                            None => dir(time),
                        }
                    }
                    _ => Attr {
                        kind: NodeKind::File,
                        size: snap.map_or(0, |s| s.logical_bytes),
                        mode: 0o444,
                        ..dir(time)
                    },
                }
            }
            Node::InTree { id, node } => {
                let tree = self.tree(*id)?;
                let n = tree.node(*node).ok_or_else(|| {
                    Error::corrupt(format!("catalog of backup {id}"), "node out of range")
                })?;
                entry_attr(ino, &n.entry)
            }
        })
    }

    /// The value `slot` of the caches holds for `id`, made by `load` (the
    /// caches unlocked meanwhile) when absent.
    fn cached<T>(
        &self,
        id: BackupId,
        slot: fn(&mut Caches) -> &mut LruCache<BackupId, Arc<T>>,
        load: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        let lock = || self.caches.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = slot(&mut lock()).get(&id) {
            return Ok(v.clone());
        }
        let v = Arc::new(load()?);
        slot(&mut lock()).put(id, v.clone());
        Ok(v)
    }

    /// The tree of backup `id`, its catalog read on first use.
    fn tree(&self, id: BackupId) -> Result<Arc<TreeIndex>> {
        let time = self.backups.get(&id).map_or(0, |s| s.time) as i64;
        let root = Entry {
            kind: Kind::Dir,
            mode: 0o755,
            mtime: time,
            ctime: time,
            ..Entry::default()
        };
        self.cached(
            id,
            |c| &mut c.trees,
            || TreeIndex::load(&self.repo, id, root),
        )
    }

    /// The stream map (recipe) of backup `id`.
    fn map(&self, id: BackupId) -> Result<Arc<StreamMap>> {
        self.cached(id, |c| &mut c.maps, || StreamMap::load(&self.repo, id))
    }
}

fn entry_attr(ino: u64, e: &Entry) -> Attr {
    Attr {
        ino,
        kind: match e.kind {
            Kind::Dir => NodeKind::Dir,
            Kind::Symlink => NodeKind::Symlink,
            Kind::Fifo => NodeKind::Fifo,
            Kind::CharDevice => NodeKind::CharDevice,
            Kind::BlockDevice => NodeKind::BlockDevice,
            // Hard links are resolved to their file by the tree index.
            Kind::File | Kind::Gap | Kind::Hardlink => NodeKind::File,
        },
        size: match e.kind {
            Kind::Symlink => e.target.len() as u64,
            _ => e.size,
        },
        mode: e.mode & 0o7777,
        uid: e.uid,
        gid: e.gid,
        mtime: (e.mtime, e.mtime_ns),
        ctime: (e.ctime, e.ctime_ns),
        rdev: e.rdev,
    }
}

/// A source name as one file name: `%` as `%25`, `/` as `%2F`, and a name
/// of only dots (or none) with its dots as `%2E`.
pub fn escape_name(name: &str) -> String {
    if name.bytes().all(|b| b == b'.') {
        return name.replace('.', "%2E") + if name.is_empty() { "%" } else { "" };
    }
    name.replace('%', "%25").replace('/', "%2F")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::tree::backup_tree;
    use crate::backup::TreeBackupOptions;
    use crate::backup::{backup, BackupOptions};
    use crate::repo::config::Config;
    use std::fs;

    fn walk(m: &MountedRepo, ino: u64, path: &str, out: &mut Vec<(String, Vec<u8>)>) {
        for (name, attr) in m.readdir(ino).unwrap().unwrap() {
            let p = format!("{path}/{}", String::from_utf8_lossy(&name));
            assert_eq!(m.lookup(ino, &name).unwrap().unwrap(), attr);
            match attr.kind {
                NodeKind::Dir => walk(m, attr.ino, &p, out),
                NodeKind::File => {
                    let mut bytes = Vec::new();
                    loop {
                        let more = m.read(attr.ino, bytes.len() as u64, 7000).unwrap().unwrap();
                        if more.is_empty() {
                            break;
                        }
                        bytes.extend(more);
                    }
                    assert_eq!(bytes.len() as u64, attr.size, "{p}");
                    out.push((p, bytes));
                }
                NodeKind::Symlink => out.push((p, m.readlink(attr.ino).unwrap().unwrap())),
                NodeKind::Fifo | NodeKind::CharDevice | NodeKind::BlockDevice => {
                    out.push((p, format!("{:?}", attr.kind).into_bytes()))
                }
            }
        }
    }

    #[test]
    fn views_show_every_backup_and_files_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("a/b/one"), vec![7u8; 100_000]).unwrap();
        fs::write(src.join("a/empty"), b"").unwrap();
        std::os::unix::fs::symlink("b/one", src.join("a/link")).unwrap();
        fs::hard_link(src.join("a/b/one"), src.join("a/hard")).unwrap();
        let fifo =
            std::ffi::CString::new(src.join("a/fifo").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let repo = Repository::init(&dir.path().join("r"), Config::new("test".into())).unwrap();
        let opts = BackupOptions {
            source: "host:/x".into(),
            tags: vec!["daily".into(), "a/b".into()],
            ..BackupOptions::default()
        };
        let t = backup_tree(
            &repo,
            std::slice::from_ref(&src),
            &TreeBackupOptions::default(),
            &opts,
        )
        .unwrap();
        let s = backup(
            &repo,
            crate::backup::Input::Stream {
                input: &mut &b"stream"[..],
                name: "in",
            },
            &BackupOptions::default(),
        )
        .map(|o| o.snapshot)
        .unwrap();
        let m = MountedRepo::new(repo, 1 << 20).unwrap();
        let mut seen = Vec::new();
        walk(&m, ROOT_INO, "", &mut seen);
        let get = |p: &str| seen.iter().find(|(n, _)| n == p).map(|x| x.1.clone());
        let inside = format!("/ids/{}{}", t.snapshot.id, src.display());
        assert_eq!(get(&format!("{inside}/a/b/one")), Some(vec![7u8; 100_000]));
        assert_eq!(get(&format!("{inside}/a/empty")), Some(Vec::new()));
        assert_eq!(get(&format!("{inside}/a/link")), Some(b"b/one".to_vec()));
        // A hard link reads as its file; a FIFO shows as one.
        assert_eq!(get(&format!("{inside}/a/hard")), Some(vec![7u8; 100_000]));
        assert_eq!(get(&format!("{inside}/a/fifo")), Some(b"Fifo".to_vec()));
        assert_eq!(get(&format!("/ids/{}", s.id)), Some(b"stream".to_vec()));
        assert_eq!(get("/latest"), Some(format!("ids/{}", s.id).into_bytes()));
        let link = format!("../../ids/{}", t.snapshot.id).into_bytes();
        assert_eq!(get("/sources/host:%2Fx/latest"), Some(link.clone()));
        let id = t.snapshot.id;
        assert_eq!(get("/tags/daily/latest"), Some(link.clone()));
        assert_eq!(get(&format!("/tags/a%2Fb/{id}")), Some(link));
        // The untagged stream backup is in no tag's directory.
        assert!(!seen
            .iter()
            .any(|(p, _)| p == &format!("/tags/daily/{}", s.id)));
        assert!(m.lookup(ROOT_INO, b"nope").unwrap().is_none());
        assert_eq!(escape_name(".."), "%2E%2E");
        assert_eq!(escape_name("a%/b"), "a%25%2Fb");
    }
}
