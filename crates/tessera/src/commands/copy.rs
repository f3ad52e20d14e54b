//! Copying backups between repositories (`tessera copy`): each backup is
//! restored from the source (every chunk verified) and backed up into the
//! destination through its own pipeline — its chunking, layout, keys and
//! policies — so the copy is deduplicated against what the destination
//! holds. A tree backup is fed as the same segments (its files, then its
//! catalog, byte for byte), so the copy is a tree backup whose files and
//! catalog are those of the original.
//!
//! The copy keeps the source name, host, tags, label and time of the original. A
//! backup is not copied again when the destination holds one with the same
//! source, time, label and length (and, for trees, the same catalog length
//! and entry count) that no other backup of the run claimed: see
//! [`already_copied`]. The bytes are not compared (that would restore
//! both).

use crate::backup::{self, BackupOptions, SegmentRead, Segments, Source};
use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, Snapshot, TreeRef};
use crate::repo::Repository;
use crate::restore::{restore, restore_selection, RestoreOptions};
use crate::tree::catalog::CatalogReader;
use crate::tree::stream::tree_of;
use crate::util::pipe::{pipe, PipeReader};
use serde::Serialize;
use std::io::{ErrorKind, Read};

/// Buffers in flight between the source's restore and the destination's backup.
const PIPE_DEPTH: usize = 16;

/// What happened to one backup.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Copied {
    /// The backup in the source repository.
    pub source_id: BackupId,
    /// Its copy in the destination: new, or the one found already there.
    pub copy_id: BackupId,
    /// Whether it was skipped because the destination already held it.
    pub skipped: bool,
    /// Bytes of the backup's stream.
    pub logical_bytes: u64,
    /// Bytes the destination stored for it (0 when skipped).
    pub stored_bytes: u64,
}

/// The position in `snapshots` (the destination's) of a copy of `original`, if any.
pub fn already_copied(snapshots: &[Snapshot], original: &Snapshot) -> Option<usize> {
    let tree_shape = |t: &Option<TreeRef>| t.as_ref().map(|t| (t.catalog_bytes, t.entries));
    snapshots.iter().position(|s| {
        s.source == original.source
            && s.time == original.time
            && s.label == original.label
            && s.logical_bytes == original.logical_bytes
            && tree_shape(&s.tree) == tree_shape(&original.tree)
    })
}

/// Copies backup `id` of `src` (opened for reading) into `dst` (opened for a
/// backup), unless one of `unclaimed` — the destination's snapshots not yet
/// found to be the copy of another backup — is its copy; that one is then
/// claimed (removed), so two backups alike are never taken for one copy.
pub fn copy_backup(
    src: &Repository,
    dst: &Repository,
    id: BackupId,
    unclaimed: &mut Vec<Snapshot>,
) -> Result<Copied> {
    if src.config().trace || dst.config().trace {
        return Err(Error::InvalidOption(
            "trace repositories hold no data to copy".into(),
        ));
    }
    let snap = src.snapshot(id)?;
    if let Some(at) = already_copied(unclaimed, &snap) {
        let copy = unclaimed.swap_remove(at);
        return Ok(Copied {
            source_id: id,
            copy_id: copy.id,
            skipped: true,
            logical_bytes: snap.logical_bytes,
            stored_bytes: 0,
        });
    }
    let options = BackupOptions {
        label: snap.label.clone(),
        source: snap.source.clone(),
        host: snap.host.clone(),
        tags: snap.tags.clone(),
        time: Some(snap.time),
        ..BackupOptions::default()
    };
    let copy = match &snap.tree {
        Some(_) => copy_tree(src, dst, id, &options)?,
        None => copy_stream(src, dst, id, &options)?,
    };
    if copy.logical_bytes != snap.logical_bytes {
        return Err(Error::Pipeline(format!(
            "copy {} of backup {id} holds {} bytes, the original {}",
            copy.id, copy.logical_bytes, snap.logical_bytes
        )));
    }
    Ok(Copied {
        source_id: id,
        copy_id: copy.id,
        skipped: false,
        logical_bytes: copy.logical_bytes,
        stored_bytes: copy.stats.stored_bytes,
    })
}

/// Runs `restore` (writing into the pipe) beside `back_up` (reading it):
/// the restore's error wins, as the backup then only saw the data end early.
fn piped(
    restore: impl FnOnce(&mut crate::util::pipe::PipeWriter) -> Result<()> + Send,
    back_up: impl FnOnce(PipeReader) -> Result<Snapshot>,
) -> Result<Snapshot> {
    let (mut writer, reader) = pipe(PIPE_DEPTH);
    std::thread::scope(|s| {
        let restoring = s.spawn(move || {
            restore(&mut writer)?;
            writer.finish();
            Ok(())
        });
        let backed_up = back_up(reader);
        let restored: Result<()> = restoring
            .join()
            .map_err(|_| Error::Pipeline("restore thread panicked".into()))?;
        match (restored, backed_up) {
            // The restore stopped because the backup did (and closed the pipe).
            (Err(Error::Output { .. }), r) => r,
            (Err(e), Err(_)) => Err(e),
            (_, r) => r,
        }
    })
}

fn copy_stream(
    src: &Repository,
    dst: &Repository,
    id: BackupId,
    options: &BackupOptions,
) -> Result<Snapshot> {
    let name = format!("backup {id} of the source repository");
    piped(
        |out| restore(src, id, out, &RestoreOptions::default()).map(|_| ()),
        |mut input| {
            let source = Source::Data {
                input: &mut input,
                name: &name,
            };
            backup::run(dst, source, options).map(|o| o.snapshot)
        },
    )
}

fn copy_tree(
    src: &Repository,
    dst: &Repository,
    id: BackupId,
    options: &BackupOptions,
) -> Result<Snapshot> {
    let tree = tree_of(src, id)?;
    let n_chunks = src.recipe(id)?.chunks.len();
    let first = usize::try_from(tree.catalog_chunk).unwrap_or(usize::MAX);
    let name = format!("catalog of backup {id}");
    // The catalog, whole (as a tree backup builds it), and its index: their
    // bytes are the copy's last segments, the catalog's entries give the
    // files' lengths.
    let mut catalog = Vec::new();
    restore_selection(
        src,
        id,
        std::slice::from_ref(&(first..n_chunks)),
        &mut catalog,
        &RestoreOptions::default(),
    )?;
    if catalog.len() as u64 != tree.catalog_bytes + tree.index_bytes {
        return Err(Error::corrupt(
            &name,
            format!(
                "{} bytes with its index, the snapshot says {} and {}",
                catalog.len(),
                tree.catalog_bytes,
                tree.index_bytes
            ),
        ));
    }
    let mut sizes = Vec::new();
    let mut reader = CatalogReader::new(&catalog[..], &name)?;
    while let Some(e) = reader.next_entry()? {
        if e.has_bytes() {
            sizes.push(e.size);
        }
    }
    if sizes.iter().sum::<u64>() != tree.catalog_offset {
        return Err(Error::corrupt(
            &name,
            format!(
                "its files hold {} bytes, the snapshot says {}",
                sizes.iter().sum::<u64>(),
                tree.catalog_offset
            ),
        ));
    }
    let copy_tree = TreeRef {
        // The parent is a backup of the source repository.
        parent: None,
        ..tree
    };
    piped(
        |out| {
            let files = 0..first;
            let files = std::slice::from_ref(&files);
            restore_selection(src, id, files, out, &RestoreOptions::default()).map(|_| ())
        },
        |input| {
            let mut feed = TreeCopy {
                input,
                sizes: sizes.into_iter(),
                left: None,
                catalog,
                at: 0,
                index_at: usize::try_from(tree.catalog_bytes).unwrap_or(usize::MAX),
                tree: Some(copy_tree),
                name: &name,
            };
            backup::run(dst, Source::Segments(&mut feed), options).map(|o| o.snapshot)
        },
    )
}

/// The segments of a tree backup being copied: the files' bytes (restored
/// from the source), cut at the catalog's lengths, then the catalog.
struct TreeCopy<'a> {
    input: PipeReader,
    sizes: std::vec::IntoIter<u64>,
    /// Bytes left of the current file (`None`: between files).
    left: Option<u64>,
    /// The catalog and its index.
    catalog: Vec<u8>,
    /// Catalog (and index) bytes fed so far.
    at: usize,
    /// Where the index starts in `catalog`: a segment ends there.
    index_at: usize,
    tree: Option<TreeRef>,
    name: &'a str,
}

impl Segments for TreeCopy<'_> {
    fn read(&mut self, buf: &mut [u8]) -> Result<SegmentRead> {
        loop {
            match self.left {
                None => match self.sizes.next() {
                    Some(size) => self.left = Some(size),
                    None => break,
                },
                Some(0) => {
                    self.left = None;
                    return Ok(SegmentRead::SegmentEnd);
                }
                Some(left) => {
                    let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let n = match self.input.read(&mut buf[..want]) {
                        Ok(0) => {
                            return Err(Error::corrupt(
                                self.name,
                                "the backup holds fewer file bytes than its catalog lists",
                            ))
                        }
                        Ok(n) => n,
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(e) => return Err(Error::io(format!("reading {}", self.name), e)),
                    };
                    self.left = Some(left - n as u64);
                    return Ok(SegmentRead::Data(n));
                }
            }
        }
        if self.at == self.index_at && self.at < self.catalog.len() {
            // The index is a segment of its own; fed once (`usize::MAX` after).
            self.index_at = usize::MAX;
            return Ok(SegmentRead::SegmentEnd);
        }
        let end = match self.at < self.index_at {
            true => self.index_at.min(self.catalog.len()),
            false => self.catalog.len(),
        };
        let n = buf.len().min(end - self.at);
        if n == 0 {
            return Ok(SegmentRead::End);
        }
        buf[..n].copy_from_slice(&self.catalog[self.at..self.at + n]);
        self.at += n;
        Ok(SegmentRead::Data(n))
    }

    fn tree(&mut self) -> Option<TreeRef> {
        self.tree.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LockMode;
    use crate::repo::config::Config;

    fn repo(path: &std::path::Path) -> Repository {
        Repository::init(path, Config::new("test".into())).unwrap()
    }

    #[test]
    fn alike_backups_are_copied_once_each_and_a_damaged_source_commits_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let src = repo(&dir.path().join("src"));
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let options = BackupOptions {
            source: "db".into(),
            host: "laptop".into(),
            tags: vec!["daily".into(), "db".into()],
            time: Some(1_000),
            ..BackupOptions::default()
        };
        for _ in 0..2 {
            backup::backup(
                &src,
                crate::backup::Input::Stream {
                    input: &mut &data[..],
                    name: "in",
                },
                &options,
            )
            .map(|o| o.snapshot)
            .unwrap();
        }
        let dst = repo(&dir.path().join("dst"));
        for round in 0..2 {
            let mut unclaimed = dst.snapshots().unwrap();
            let copied: Vec<Copied> = src
                .backups()
                .unwrap()
                .into_iter()
                .map(|id| copy_backup(&src, &dst, id, &mut unclaimed).unwrap())
                .collect();
            assert!(
                copied.iter().all(|c| c.skipped == (round == 1)),
                "{copied:?}"
            );
            assert_ne!(copied[0].copy_id, copied[1].copy_id);
        }
        let copies = dst.snapshots().unwrap();
        assert_eq!(copies.len(), 2);
        assert!(copies.iter().all(|s| s.time == 1_000
            && s.source == "db"
            && s.host == "laptop"
            && s.tags == ["daily", "db"]));
        let mut out = Vec::new();
        restore(&dst, copies[1].id, &mut out, &RestoreOptions::default()).unwrap();
        assert!(out == data);

        // A source whose data is gone: the copy fails, the destination is unchanged.
        drop(src);
        for e in std::fs::read_dir(dir.path().join("src/containers")).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let src = Repository::open(&dir.path().join("src"), LockMode::Read).unwrap();
        let empty = repo(&dir.path().join("empty"));
        let err = copy_backup(&src, &empty, 1, &mut Vec::new()).unwrap_err();
        assert!(!matches!(err, Error::Output { .. }), "{err}");
        assert!(empty.backups().unwrap().is_empty());
    }
}
