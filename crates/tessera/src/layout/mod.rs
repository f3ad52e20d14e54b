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
use crate::commands::repair::report::RepairReport;
use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::progress::Progress;
use crate::repo::config::Layout;
use crate::repo::quarantine::Quarantined;
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

/// The layout's own steps of `tessera repair`, after the snapshots are
/// recovered: re-pointing recipes and rebuilding a damaged index
/// (container layout), rewriting damaged parts of every lineage
/// (lifecycle layout; a trace repository stores no chunk bytes to verify).
pub(crate) fn repair(
    repo: &Repository,
    dry: bool,
    report: &mut RepairReport,
    progress: &dyn Progress,
) -> Result<()> {
    match repo.config().layout {
        Layout::Container => container::repair::repair(repo, dry, report, progress),
        Layout::Lifecycle if repo.config().trace => Ok(()),
        Layout::Lifecycle => lifecycle::repair_lineages(repo, dry, report),
    }
}

/// Whether the layout frees space by garbage collection (`gc`, `prune`):
/// the container layout does; the lifecycle layout frees it when backups
/// are deleted.
pub fn needs_gc(repo: &Repository) -> bool {
    repo.config().layout == Layout::Container
}

/// Refuses garbage collection where the layout needs none.
pub(crate) fn require_gc(repo: &Repository) -> Result<()> {
    match needs_gc(repo) {
        true => Ok(()),
        false => Err(Error::InvalidConfig(format!(
            "{}: the lifecycle layout frees space when backups are deleted and needs no GC",
            repo.backend().location()
        ))),
    }
}

/// The index object a repository whose layout keeps a deduplication index
/// always has once a committed backup stored chunks (`None` in the
/// lifecycle layout, whose NDF tables are checked per lineage, or before
/// any chunk was stored).
pub(crate) fn expected_index(repo: &Repository) -> Result<Option<&'static str>> {
    match repo.config().layout {
        Layout::Container => container::check::expected_index(repo),
        Layout::Lifecycle => Ok(None),
    }
}

/// Reads `chunks` of backup `id` (a tree's catalog chunks) into `out` by
/// ranged reads of the containers' data sections, which an object store's
/// cache keeps (container layout); `None`, having written nothing, where
/// the layout has no such path (the caller then restores them).
pub(crate) fn read_chunks_ranged(
    repo: &Repository,
    id: BackupId,
    chunks: &[ChunkRef],
    out: &mut dyn Write,
) -> Result<Option<RestoreStats>> {
    match repo.config().layout == Layout::Container && !repo.config().trace {
        true => container::ranged::read_catalog_chunks(repo, id, chunks, out).map(Some),
        false => Ok(None),
    }
}

/// Where a new backup of `source` may point at chunks it reuses without
/// reading them (an unchanged file's, from its parent).
pub(crate) enum Reusable {
    /// Container layout: the containers that exist.
    Containers(std::collections::HashSet<container::ContainerId>),
    /// Lifecycle layout: the lineage's chunks known damaged or missing.
    Lineage(Quarantined),
}

/// What a new backup of `source` may reuse ([`Reusable`]).
pub(crate) fn reusable(repo: &Repository, source: &str) -> Result<Reusable> {
    let backend = repo.backend().as_ref();
    Ok(match repo.config().layout {
        Layout::Container => Reusable::Containers(repo.containers()?.into_iter().collect()),
        Layout::Lifecycle => {
            let l = lifecycle::Lineage::load_or_new(backend, source)?;
            Reusable::Lineage(l.unusable(backend)?)
        }
    })
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

/// Bytes that deleting backups `ids` would free at once, where the layout
/// knows it exactly: the lifecycle layout (`lifecycle::space`); `None` in
/// the container layout, where it depends on what `gc` later finds
/// unreferenced.
pub fn freed_by_deleting(repo: &Repository, ids: &[BackupId]) -> Result<Option<u64>> {
    match repo.config().layout {
        Layout::Container => Ok(None),
        Layout::Lifecycle if ids.is_empty() => Ok(Some(0)),
        Layout::Lifecycle => lifecycle::space(repo, ids).map(Some),
    }
}

/// A layout by its name in the configuration (`container`, `lifecycle`).
impl std::str::FromStr for Layout {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "container" => Ok(Layout::Container),
            "lifecycle" => Ok(Layout::Lifecycle),
            other => Err(format!(
                "unknown layout {other:?} (expected container or lifecycle)"
            )),
        }
    }
}
