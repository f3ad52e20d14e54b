//! `tessera dump`: one file of a tree backup as its bytes, or a directory
//! as a tar stream. Reading a file reads the catalog, then only the chunks
//! of the file's extent, each verified.

use super::catalog::Kind;
use super::cursor::Cursor;
use super::restore::TreeRestoreStats;
use super::stream::{for_each_entry_in, scope_of, tree_of};
use super::tar::{write_tar, TarScope};
use crate::error::{Error, Result};
use crate::format::snapshot::BackupId;
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions};
use std::io::Write;
use std::ops::Range;
use std::time::Instant;

/// What `path` was, for a [`dump`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dumped {
    /// A regular file: its bytes were written.
    File,
    /// A directory: a tar stream of it and everything below it.
    Tar,
}

/// A catalog path as given by a user (`/home/ann/`): without the leading
/// and trailing `/`.
pub fn normalize_path(path: &[u8]) -> &[u8] {
    let p = path.strip_prefix(b"/").unwrap_or(path);
    p.strip_suffix(b"/").unwrap_or(p)
}

/// Writes the entry at `path` of tree backup `id` to `out`: a regular
/// file's bytes, or a directory (`/` for the whole tree) as a tar stream
/// (see [`write_tar`]); a hard link's file by any of its names. Fails with [`Error::NotInBackup`] when the backup
/// has no such entry, and for a symbolic link (its target is named).
pub fn dump(
    repo: &Repository,
    id: BackupId,
    path: &[u8],
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<(Dumped, TreeRestoreStats)> {
    dump_entry(repo, id, path, out, options, true)
}

/// [`dump`]; a hard link is followed to its file when `follow`, else
/// (from another hard link: a damaged catalog) refused.
fn dump_entry(
    repo: &Repository,
    id: BackupId,
    path: &[u8],
    out: &mut dyn Write,
    options: &RestoreOptions,
    follow: bool,
) -> Result<(Dumped, TreeRestoreStats)> {
    let started = Instant::now();
    let wanted = normalize_path(path);
    let shown = || format!("/{}", String::from_utf8_lossy(wanted));
    let tree = tree_of(repo, id)?;
    if wanted.is_empty() {
        return write_tar(repo, id, &TarScope::default(), out, options).map(|s| (Dumped::Tar, s));
    }
    let recipe = repo.recipe(id)?;
    let scope = scope_of(repo, id, &tree, &recipe.chunks, wanted)?;
    let mut cursor = Cursor::at(&recipe.chunks, id, scope.data_offset)?;
    let mut found: Option<(Kind, Range<usize>, Vec<u8>)> = None;
    let catalog = for_each_entry_in(repo, id, &tree, &recipe.chunks, &scope, |e| {
        let extent = match e.has_bytes() {
            true => cursor.extent(e.size)?,
            false => 0..0,
        };
        if e.path == wanted && e.kind != Kind::Gap {
            found = Some((e.kind, extent, e.target));
            return Ok(false);
        }
        Ok(true)
    })?;
    drop(recipe);
    let not_found = || Error::NotInBackup {
        backup: id,
        path: shown(),
    };
    match found.ok_or_else(not_found)? {
        (Kind::File, extent, _) => {
            let data = restore_selection(repo, id, &[extent], out, options)?;
            let mut stats = TreeRestoreStats {
                id,
                files: 1,
                bytes_restored: data.bytes_restored,
                containers_read: data.containers_read,
                bytes_read: data.bytes_read,
                ..TreeRestoreStats::default()
            };
            stats.add_catalog(&scope.index);
            stats.add_catalog(&catalog);
            stats.seconds = started.elapsed().as_secs_f64();
            Ok((Dumped::File, stats))
        }
        (Kind::Dir, _, _) => {
            let tar_scope = TarScope {
                under: Some(wanted.to_vec()),
                ..TarScope::default()
            };
            let mut stats = write_tar(repo, id, &tar_scope, out, options)?;
            stats.add_catalog(&scope.index);
            stats.add_catalog(&catalog);
            Ok((Dumped::Tar, stats))
        }
        (Kind::Symlink, _, target) => Err(Error::InvalidOption(format!(
            "backup {id}: {} is a symbolic link to {}, not a file or directory",
            shown(),
            String::from_utf8_lossy(&target)
        ))),
        // Another name of a file recorded before it: that file's bytes.
        (Kind::Hardlink, _, target) if follow => dump_entry(repo, id, &target, out, options, false),
        (Kind::Hardlink, _, _) => Err(Error::corrupt(
            format!("catalog of backup {id}"),
            format!("{} is a hard link to another hard link", shown()),
        )),
        (Kind::Fifo | Kind::CharDevice | Kind::BlockDevice, _, _) => {
            Err(Error::InvalidOption(format!(
                "backup {id}: {} is a FIFO or device, not a file or directory",
                shown()
            )))
        }
        (Kind::Gap, _, _) => Err(not_found()),
    }
}
