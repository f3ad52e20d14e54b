//! `tessera diff`: what changed between two tree backups. Both catalogs are
//! in the same order (docs/FORMAT.md §24.2: component by component), so
//! they are read side by side, entry by entry, and merged like sorted lists;
//! memory does not grow with the trees. Files' contents are compared by the
//! fingerprints of their chunks, without reading any data.

use super::catalog::{Entry, Kind};
use super::catalog_order;
use super::cursor::Cursor;
use super::stream::{for_each_entry, tree_of};
use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::repo::Repository;
use crossbeam_channel::{bounded, Receiver};
use serde::Serialize;
use std::cmp::Ordering;

/// How an entry differs between the two backups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Only in the second backup.
    Added,
    /// Only in the first backup.
    Removed,
    /// In both, with other contents: a file's bytes, a link's target, or
    /// the kind of object.
    Changed,
    /// In both with the same contents, but other mode, owner, group or
    /// modification time.
    Metadata,
}

/// One difference.
#[derive(Clone, Debug)]
pub struct Change {
    /// How it differs.
    pub kind: ChangeKind,
    /// The entry in the first backup (absent when added).
    pub old: Option<Entry>,
    /// The entry in the second backup (absent when removed).
    pub new: Option<Entry>,
}

impl Change {
    /// The entry's path (catalog form, without the leading `/`).
    pub fn path(&self) -> &[u8] {
        match (&self.new, &self.old) {
            (Some(e), _) | (None, Some(e)) => &e.path,
            (None, None) => &[],
        }
    }
}

/// Counts of a [`diff`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiffStats {
    /// The first backup.
    pub from: BackupId,
    /// The second backup.
    pub to: BackupId,
    /// Entries only in the second backup.
    pub added: u64,
    /// Entries only in the first.
    pub removed: u64,
    /// Entries whose contents differ.
    pub changed: u64,
    /// Entries whose metadata only differ.
    pub metadata: u64,
    /// Entries the same in both.
    pub unchanged: u64,
    /// File bytes of the added entries.
    pub bytes_added: u64,
    /// File bytes of the removed entries.
    pub bytes_removed: u64,
}

impl DiffStats {
    fn removed(&mut self, old: Entry) -> Option<Change> {
        self.removed += 1;
        self.bytes_removed += old.size;
        Some(Change {
            kind: ChangeKind::Removed,
            old: Some(old),
            new: None,
        })
    }

    fn added(&mut self, new: Entry) -> Option<Change> {
        self.added += 1;
        self.bytes_added += new.size;
        Some(Change {
            kind: ChangeKind::Added,
            old: None,
            new: Some(new),
        })
    }

    fn both(&mut self, old: Item, new: Item) -> Option<Change> {
        let kind = compare(&old, &new);
        match kind {
            None => self.unchanged += 1,
            Some(ChangeKind::Changed) => self.changed += 1,
            Some(_) => self.metadata += 1,
        }
        kind.map(|kind| Change {
            kind,
            old: Some(old.0),
            new: Some(new.0),
        })
    }
}

/// One side of the merge: a catalog's entries in order, each file with the
/// fingerprints of its chunks.
struct Side<'a> {
    id: BackupId,
    rx: Receiver<Entry>,
    cursor: Cursor<'a>,
    chunks: &'a [ChunkRef],
    /// The previous entry's path.
    last: Option<Vec<u8>>,
}

/// An entry and, for a file, its chunks in the recipe.
type Item<'a> = (Entry, &'a [ChunkRef]);

impl<'a> Side<'a> {
    /// The next entry that exists (gaps are skipped), checked to come
    /// after the previous one.
    fn next(&mut self) -> Result<Option<Item<'a>>> {
        while let Ok(e) = self.rx.recv() {
            let chunks = self.chunks;
            let extent = match e.has_bytes() {
                true => &chunks[self.cursor.extent(e.size)?],
                false => &[],
            };
            if e.kind == Kind::Gap {
                continue;
            }
            if let Some(prev) = &self.last {
                if catalog_order(prev, &e.path) != Ordering::Less {
                    return Err(Error::corrupt(
                        format!("catalog of backup {}", self.id),
                        format!(
                            "entries out of order: /{} after /{}",
                            String::from_utf8_lossy(&e.path),
                            String::from_utf8_lossy(prev)
                        ),
                    ));
                }
            }
            self.last = Some(e.path.clone());
            return Ok(Some((e, extent)));
        }
        Ok(None)
    }
}

/// How entries `a` and `b` at the same path differ, if they do.
fn compare(a: &Item, b: &Item) -> Option<ChangeKind> {
    let (ea, eb) = (&a.0, &b.0);
    let same_chunks = || a.1.iter().map(|c| c.fp).eq(b.1.iter().map(|c| c.fp));
    if ea.kind != eb.kind || ea.target != eb.target || ea.size != eb.size || !same_chunks() {
        return Some(ChangeKind::Changed);
    }
    let meta = (ea.mode, ea.uid, ea.gid, ea.mtime, ea.mtime_ns);
    (meta != (eb.mode, eb.uid, eb.gid, eb.mtime, eb.mtime_ns)).then_some(ChangeKind::Metadata)
}

/// Calls `f` with every difference between tree backups `from` and `to`
/// of `repo`, in catalog order, and returns the counts. Files are compared
/// by size and chunk fingerprints; metadata by mode, owner, group and
/// modification time (not by status-change time, device or inode, which
/// change without the file changing).
pub fn diff(
    repo: &Repository,
    from: BackupId,
    to: BackupId,
    mut f: impl FnMut(&Change) -> Result<()>,
) -> Result<DiffStats> {
    let (tree_a, tree_b) = (tree_of(repo, from)?, tree_of(repo, to)?);
    let (recipe_a, recipe_b) = (repo.recipe(from)?, repo.recipe(to)?);
    let mut stats = DiffStats {
        from,
        to,
        ..DiffStats::default()
    };
    std::thread::scope(|sc| {
        let (txa, rxa) = bounded::<Entry>(256);
        let (txb, rxb) = bounded::<Entry>(256);
        let (na, nb) = (&recipe_a.chunks[..], &recipe_b.chunks[..]);
        let (ta, tb) = (&tree_a, &tree_b);
        let read_a =
            sc.spawn(move || for_each_entry(repo, from, ta, na, |e| Ok(txa.send(e).is_ok())));
        let read_b =
            sc.spawn(move || for_each_entry(repo, to, tb, nb, |e| Ok(txb.send(e).is_ok())));
        let mut a = Side {
            id: from,
            rx: rxa,
            cursor: Cursor::new(&recipe_a.chunks, from),
            chunks: &recipe_a.chunks,
            last: None,
        };
        let mut b = Side {
            id: to,
            rx: rxb,
            cursor: Cursor::new(&recipe_b.chunks, to),
            chunks: &recipe_b.chunks,
            last: None,
        };
        let merged = (|| -> Result<()> {
            let (mut x, mut y) = (a.next()?, b.next()?);
            loop {
                let change = match (x.take(), y.take()) {
                    (None, None) => return Ok(()),
                    (Some(p), None) => {
                        x = a.next()?;
                        stats.removed(p.0)
                    }
                    (None, Some(q)) => {
                        y = b.next()?;
                        stats.added(q.0)
                    }
                    (Some(p), Some(q)) => match catalog_order(&p.0.path, &q.0.path) {
                        Ordering::Less => {
                            (x, y) = (a.next()?, Some(q));
                            stats.removed(p.0)
                        }
                        Ordering::Greater => {
                            (x, y) = (Some(p), b.next()?);
                            stats.added(q.0)
                        }
                        Ordering::Equal => {
                            (x, y) = (a.next()?, b.next()?);
                            stats.both(p, q)
                        }
                    },
                };
                if let Some(c) = change {
                    f(&c)?;
                }
            }
        })();
        // Stops the readers if the merge ended early.
        drop(a);
        drop(b);
        let ra = read_a
            .join()
            .map_err(|_| Error::Pipeline("catalog reader thread panicked".into()))?;
        let rb = read_b
            .join()
            .map_err(|_| Error::Pipeline("catalog reader thread panicked".into()))?;
        merged?;
        ra?;
        rb?;
        Ok(stats)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;

    fn entry(kind: Kind, size: u64) -> Entry {
        Entry {
            path: b"home/f".to_vec(),
            kind,
            mode: 0o644,
            uid: 1,
            gid: 2,
            mtime: 3,
            mtime_ns: 4,
            ctime: 5,
            ctime_ns: 6,
            dev: 7,
            ino: 8,
            size,
            ..Entry::default()
        }
    }

    fn chunk(b: u8) -> ChunkRef {
        ChunkRef {
            fp: Fingerprint([b; 32]),
            len: 5,
            container: u64::from(b),
        }
    }

    #[test]
    fn contents_are_compared_by_fingerprints_metadata_by_mode_owner_and_time() {
        let (x, y, z) = (
            [chunk(1), chunk(2)],
            [chunk(1), chunk(2)],
            [chunk(1), chunk(3)],
        );
        let f = entry(Kind::File, 10);
        assert_eq!(compare(&(f.clone(), &x), &(f.clone(), &y)), None);
        assert_eq!(
            compare(&(f.clone(), &x), &(f.clone(), &z)),
            Some(ChangeKind::Changed)
        );
        // Status-change time, device and inode change without the file changing.
        let moved = Entry {
            ctime: 50,
            dev: 70,
            ino: 80,
            ..f.clone()
        };
        assert_eq!(compare(&(f.clone(), &x), &(moved, &y)), None);
        let chmod = Entry {
            mode: 0o600,
            ..f.clone()
        };
        assert_eq!(
            compare(&(f.clone(), &x), &(chmod, &y)),
            Some(ChangeKind::Metadata)
        );
        let dir = entry(Kind::Dir, 0);
        let empty: &[ChunkRef] = &[];
        assert_eq!(
            compare(&(entry(Kind::File, 0), empty), &(dir.clone(), empty)),
            Some(ChangeKind::Changed)
        );
        let link = |t: &[u8]| Entry {
            target: t.to_vec(),
            ..entry(Kind::Symlink, 0)
        };
        assert_eq!(
            compare(&(link(b"a"), empty), &(link(b"b"), empty)),
            Some(ChangeKind::Changed)
        );
    }
}
