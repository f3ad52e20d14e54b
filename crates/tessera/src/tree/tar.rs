//! Writing the entries of a tree backup as a tar stream (`restore --tar`,
//! `dump` of a directory), with the chunks of the selected files restored
//! and verified as a tree restore does: a first pass over the catalog finds
//! their extents, then one restore of just those chunks feeds the files'
//! contents while a second pass names them. Nothing is held in memory
//! beyond a few blocks: entries and bytes stream through.
//!
//! Entries are GNU tar records (long names and link targets as GNU
//! extension records) with the mode, owner, group and modification time
//! (whole seconds; times before 1970 as 0) of the catalog.

use super::catalog::{Entry, Kind};
use super::cursor::{push_range, Cursor};
use super::relative_path;
use super::restore::TreeRestoreStats;
use super::select::Selection;
use super::stream::{for_each_entry, tree_of};
use crate::error::{Error, Result};
use crate::format::snapshot::BackupId;
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions, RestoreStats};
use crate::util::pipe::{pipe, PipeReader};
use crossbeam_channel::bounded;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::time::Instant;
use tar::{Builder, EntryType, Header};

/// What goes into a tar stream of a tree backup.
#[derive(Clone, Debug, Default)]
pub struct TarScope {
    /// Only the entries this selection takes.
    pub selection: Selection,
    /// Only this path and what is below it, named relative to its parent
    /// directory (`home/ann/docs` gives `docs/…`); `None`: every entry,
    /// named by its full path.
    pub under: Option<Vec<u8>>,
}

impl TarScope {
    fn takes(&self, e: &Entry) -> bool {
        e.kind != Kind::Gap
            && self.under.as_deref().is_none_or(|u| within(u, &e.path))
            && self.selection.matches(&e.path)
    }

    /// The name of the entry at `path` in the tar stream.
    pub(super) fn name(&self, path: &[u8], dir: bool) -> PathBuf {
        let strip = match self.under.as_deref() {
            Some(u) => u.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1),
            None => 0,
        };
        let mut name = path.get(strip..).unwrap_or_default().to_vec();
        if name.is_empty() {
            name.push(b'.');
        }
        if dir {
            name.push(b'/');
        }
        relative_path(&name).to_path_buf()
    }
}

/// Whether `path` is `under` or below it (everything is below the root, ``).
pub(super) fn within(under: &[u8], path: &[u8]) -> bool {
    under.is_empty()
        || path
            .strip_prefix(under)
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'/')
}

/// What an archive of a tree backup's entries is written as, one entry
/// at a time in catalog order (tar, or zip: [`super::zip`]).
pub(super) trait Sink {
    /// Writes entry `e` (taken by `scope`); a regular file's bytes are the
    /// next `e.size` bytes of `bytes` (read them with [`Exact`]).
    fn append(
        &mut self,
        scope: &TarScope,
        e: &Entry,
        bytes: &mut PipeReader,
        stats: &mut TreeRestoreStats,
    ) -> Result<()>;
    /// Ends the archive.
    fn finish(&mut self, stats: &mut TreeRestoreStats) -> Result<()>;
}

struct TarSink<'a>(Builder<&'a mut dyn Write>);

impl Sink for TarSink<'_> {
    fn append(
        &mut self,
        scope: &TarScope,
        e: &Entry,
        bytes: &mut PipeReader,
        stats: &mut TreeRestoreStats,
    ) -> Result<()> {
        append(&mut self.0, scope, e, bytes, stats)
    }

    fn finish(&mut self, _: &mut TreeRestoreStats) -> Result<()> {
        self.0.finish().map_err(tar_err)
    }
}

/// Writes the entries of tree backup `id` that `scope` takes to `out` as a
/// tar stream (ended by the two zero blocks), every chunk verified before a
/// byte of it is written. Returns the counts, with the catalog's reads.
pub fn write_tar(
    repo: &Repository,
    id: BackupId,
    scope: &TarScope,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<TreeRestoreStats> {
    write_archive(repo, id, scope, &mut TarSink(Builder::new(out)), options)
}

/// Writes the entries of tree backup `id` that `scope` takes to `sink`.
pub(super) fn write_archive(
    repo: &Repository,
    id: BackupId,
    scope: &TarScope,
    sink: &mut dyn Sink,
    options: &RestoreOptions,
) -> Result<TreeRestoreStats> {
    let started = Instant::now();
    let tree = tree_of(repo, id)?;
    let recipe = repo.recipe(id)?;
    let mut stats = TreeRestoreStats {
        id,
        ..TreeRestoreStats::default()
    };

    // Pass 1: the chunks of the files taken.
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let mut cursor = Cursor::new(&recipe.chunks, id);
    let s = for_each_entry(repo, id, &tree, &recipe.chunks, |e| {
        if e.has_bytes() {
            let extent = cursor.extent(e.size)?;
            if e.kind == Kind::File && scope.takes(&e) {
                push_range(&mut ranges, extent);
            }
        }
        Ok(true)
    })?;
    stats.add_catalog(&s);

    // Pass 2: the entries, named by a second reading of the catalog, and
    // the files' bytes from one restore of their chunks.
    let tree = &tree;
    let ranges = &ranges;
    let chunks = &recipe.chunks[..];
    let (data, named, written) = std::thread::scope(|sc| {
        let (etx, erx) = bounded::<Entry>(64);
        let names = sc.spawn(move || {
            for_each_entry(repo, id, tree, chunks, |e| match scope.takes(&e) {
                true => Ok(etx.send(e).is_ok()),
                false => Ok(true),
            })
        });
        let (mut pipe, mut bytes) = pipe(8);
        let restore = sc.spawn(move || {
            let restored = restore_selection(repo, id, ranges, &mut pipe, options)?;
            pipe.finish();
            Ok(restored)
        });
        let written = (|| -> Result<()> {
            for e in erx.iter() {
                sink.append(scope, &e, &mut bytes, &mut stats)?;
            }
            sink.finish(&mut stats)
        })();
        // Stops the other threads if writing ended early.
        drop(bytes);
        drop(erx);
        let data = restore
            .join()
            .map_err(|_| Error::Pipeline("restore thread panicked".into()));
        let named = names
            .join()
            .map_err(|_| Error::Pipeline("catalog reader thread panicked".into()));
        (data, named, written)
    });
    // A failed restore (a damaged chunk) is the cause of the stream's end.
    let data: RestoreStats = match (data?, written) {
        (Err(e), _) if !matches!(e, Error::Output { .. }) => return Err(e),
        (_, Err(e)) => return Err(e),
        (d, Ok(())) => d?,
    };
    stats.add_catalog(&named??);
    stats.bytes_restored = data.bytes_restored;
    stats.containers_read += data.containers_read;
    stats.bytes_read += data.bytes_read;
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

fn tar_err(e: io::Error) -> Error {
    archive_err(e, "tar stream")
}

/// An error writing archive `what`: the catalog's, when a file's bytes
/// ended early ([`Exact`]), else the output's.
pub(super) fn archive_err(e: io::Error, what: &str) -> Error {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ShortData>())
    {
        Some(short) => Error::corrupt("catalog", short.to_string()),
        None => Error::Output {
            what: what.into(),
            source: e,
        },
    }
}

/// One entry: its header, and a file's bytes.
fn append(
    builder: &mut Builder<&mut dyn Write>,
    scope: &TarScope,
    e: &Entry,
    bytes: &mut PipeReader,
    stats: &mut TreeRestoreStats,
) -> Result<()> {
    let mut h = Header::new_gnu();
    h.set_mode(e.mode & 0o7777);
    h.set_uid(u64::from(e.uid));
    h.set_gid(u64::from(e.gid));
    h.set_mtime(u64::try_from(e.mtime).unwrap_or(0));
    h.set_size(0);
    match e.kind {
        Kind::Dir => {
            h.set_entry_type(EntryType::Directory);
            stats.dirs += 1;
            builder
                .append_data(&mut h, scope.name(&e.path, true), io::empty())
                .map_err(tar_err)
        }
        Kind::Symlink => {
            h.set_entry_type(EntryType::Symlink);
            stats.symlinks += 1;
            builder
                .append_link(&mut h, scope.name(&e.path, false), relative_path(&e.target))
                .map_err(tar_err)
        }
        Kind::File => {
            h.set_entry_type(EntryType::Regular);
            h.set_size(e.size);
            stats.files += 1;
            let data = Exact {
                inner: bytes,
                left: e.size,
                path: &e.path,
            };
            builder
                .append_data(&mut h, scope.name(&e.path, false), data)
                .map_err(tar_err)
        }
        Kind::Hardlink => {
            let target = Entry {
                path: e.target.clone(),
                ..Entry::default()
            };
            if !scope.takes(&target) {
                // Its file is not in the stream: the link would dangle.
                stats.notes.push(format!(
                    "hard link {} left out: its file {} is not selected",
                    String::from_utf8_lossy(&e.path),
                    String::from_utf8_lossy(&e.target)
                ));
                return Ok(());
            }
            h.set_entry_type(EntryType::Link);
            stats.hardlinks += 1;
            builder
                .append_link(
                    &mut h,
                    scope.name(&e.path, false),
                    scope.name(&e.target, false),
                )
                .map_err(tar_err)
        }
        Kind::Fifo | Kind::CharDevice | Kind::BlockDevice => {
            h.set_entry_type(match e.kind {
                Kind::Fifo => EntryType::Fifo,
                Kind::CharDevice => EntryType::Char,
                _ => EntryType::Block,
            });
            if e.kind != Kind::Fifo {
                h.set_device_major(libc::major(e.rdev)).map_err(tar_err)?;
                h.set_device_minor(libc::minor(e.rdev)).map_err(tar_err)?;
            }
            stats.nodes += 1;
            builder
                .append_data(&mut h, scope.name(&e.path, false), io::empty())
                .map_err(tar_err)
        }
        Kind::Gap => Ok(()),
    }
}

/// The next `left` bytes of the restore: fewer is an error, as a tar
/// header promising more than follows would make the stream unreadable.
pub(super) struct Exact<'a> {
    pub(super) inner: &'a mut PipeReader,
    pub(super) left: u64,
    pub(super) path: &'a [u8],
}

/// A file's bytes ended early: the catalog lists more than the stream holds
/// (or the restore stopped, whose own error is then reported).
#[derive(Debug)]
struct ShortData(String);

impl std::fmt::Display for ShortData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "/{}: fewer bytes in the backup than the catalog lists",
            self.0
        )
    }
}

impl std::error::Error for ShortData {}

impl Read for Exact<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                ShortData(String::from_utf8_lossy(self.path).into_owned()),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_relative_to_the_parent_of_the_dumped_path() {
        let all = TarScope::default();
        assert_eq!(all.name(b"home/ann/a", false), PathBuf::from("home/ann/a"));
        assert_eq!(all.name(b"home", true), PathBuf::from("home/"));
        assert_eq!(all.name(b"", true), PathBuf::from("./"));
        let docs = TarScope {
            under: Some(b"home/ann/docs".to_vec()),
            ..TarScope::default()
        };
        assert_eq!(docs.name(b"home/ann/docs", true), PathBuf::from("docs/"));
        assert_eq!(
            docs.name(b"home/ann/docs/x", false),
            PathBuf::from("docs/x")
        );
        assert!(within(b"home/ann", b"home/ann/x"));
        assert!(within(b"home/ann", b"home/ann"));
        assert!(!within(b"home/ann", b"home/anna"));
        assert!(within(b"", b"etc"));
    }
}
