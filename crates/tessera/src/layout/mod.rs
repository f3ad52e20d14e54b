//! The two storage layouts a repository may have (fixed at `init`): the
//! container log ([`container`]) and MFDedup's lifecycle volumes
//! ([`lifecycle`]).

//!
//! What differs between them is chosen here, in one place, by the
//! repository's layout: the rest of the engine calls these functions and
//! never branches on the layout itself.

pub mod container;
pub mod lifecycle;
pub(crate) mod stream;

use crate::backup::options::{BackupOptions, Outcome};
use crate::commands::check::report::{CheckOptions, CheckReport};
use crate::error::Result;
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::progress::Progress;
use crate::repo::config::Layout;
use crate::repo::{RepoTotals, Repository};
use crate::restore::options::{RestoreOptions, RestoreStats};
use crate::restore::salvage::LostRange;
use std::io::Write;
use std::ops::Range;

/// The back end of a backup: takes the chunk stream the front end
/// ([`crate::backup`]) produces, deduplicates and stores it in the
/// repository's layout, and commits the backup.
pub(crate) fn store_backup(
    repo: &Repository,
    stream: stream::ChunkStream,
    options: &BackupOptions,
) -> Result<Outcome> {
    match repo.config().layout {
        Layout::Container => container::backup::backup(repo, stream, options).map(Outcome::of),
        Layout::Lifecycle => lifecycle::backup(repo, stream, options),
    }
}

/// Restores the chunks `select` picks (all without) of backup `id` into
/// `out` along the strict path: any missing or damaged chunk fails it.
pub(crate) fn restore(
    repo: &Repository,
    id: BackupId,
    select: Option<&[Range<usize>]>,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    match repo.config().layout {
        Layout::Container => container::restore::read(repo, id, select, out, options),
        Layout::Lifecycle => lifecycle::read_backup(repo, id, select, out, options),
    }
}

/// Refuses a restore cache of `n` containers the machine cannot hold
/// (the lifecycle layout reads without one).
pub(crate) fn check_restore_cache(repo: &Repository, n: u64) -> Result<()> {
    match repo.config().layout {
        Layout::Container => container::restore::check_cache(repo, n),
        Layout::Lifecycle => Ok(()),
    }
}

/// Writes `chunks` of backup `id` into `out` along the salvage path, zeros
/// for what no intact copy holds: (chunks written, objects read, the lost
/// ranges). See [`crate::restore::salvage`].
pub(crate) fn salvage(
    repo: &Repository,
    id: BackupId,
    chunks: &[ChunkRef],
    out: &mut dyn Write,
    cache_containers: usize,
    progress: Option<&(dyn Fn(u64) + Sync)>,
) -> Result<(u64, u64, Vec<LostRange>)> {
    match repo.config().layout {
        Layout::Container => {
            container::salvage::salvage(repo, id, chunks, out, cache_containers, progress)
        }
        Layout::Lifecycle => lifecycle::salvage(repo, id, chunks, out, progress),
    }
}

/// The policy name a salvage restore reports.
pub(crate) fn salvage_policy(repo: &Repository) -> &'static str {
    match repo.config().layout {
        Layout::Container => "salvage",
        Layout::Lifecycle => "lifecycle",
    }
}

/// Totals over the whole repository (`tessera stats`).
pub fn totals(repo: &Repository) -> Result<RepoTotals> {
    match repo.config().layout {
        Layout::Container => container::totals::totals(repo),
        Layout::Lifecycle => lifecycle::totals(repo),
    }
}

/// Deletes backups `ids`. The container layout drops their snapshots (`gc`
/// reclaims their space later): `None`; the lifecycle layout frees the
/// space at once and says how much.
pub fn delete_backups(
    repo: &Repository,
    ids: &[BackupId],
) -> Result<Option<lifecycle::DeleteStats>> {
    match repo.config().layout {
        Layout::Container => {
            for &id in ids {
                repo.remove_snapshot(id)?;
            }
            Ok(None)
        }
        Layout::Lifecycle => lifecycle::delete_backups(repo, ids).map(Some),
    }
}

/// Verifies the layout's objects and every retained backup (`tessera check`).
pub(crate) fn check(
    repo: &Repository,
    options: CheckOptions,
    progress: &dyn Progress,
) -> Result<CheckReport> {
    match repo.config().layout {
        Layout::Container => container::check::check_containers(repo, options, progress),
        Layout::Lifecycle => lifecycle::check(repo, options, progress),
    }
}
