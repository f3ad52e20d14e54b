//! Deletion without garbage collection (MFDedup §4.5) and space accounting
//! (§4.6).
//!
//! An archived category Cat.(i,j) is dead once every version in i..=j is
//! deleted. The categories of volume j are ordered by `i`, so its dead
//! categories are a suffix: deleting the oldest versions deletes whole
//! volumes, deleting another version truncates its volume's trailing dead
//! categories (the volume object is rewritten without them, atomically).
//! Active and pending categories are kept until arranging archives them
//! (the next version may still reference them); arranging then drops dead
//! chunks instead of archiving them. A lineage without live versions is
//! removed entirely.

use super::format::{self, ReadLog};
use super::{
    cat_key, journal_key, lineages, ndf_dir, ndf_key, parse_num_name, state_copy_key, state_key,
    vol_key, Lineage,
};
use crate::backend::LockMode;
use crate::error::{Error, Result};
use crate::format::snapshot::BackupId;
use crate::repo::config::Layout;
use crate::repo::Repository;
use serde::Serialize;
use std::collections::BTreeSet;

/// What a deletion did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DeleteStats {
    /// Backups deleted.
    pub deleted: Vec<BackupId>,
    /// Volumes deleted whole (all their parts).
    pub volumes_deleted: u64,
    /// Volumes that lost their trailing dead categories (parts deleted or rewritten).
    pub volumes_truncated: u64,
    /// Categories removed.
    pub categories_removed: u64,
    /// Chunk bytes freed (data and metadata of the removed categories).
    pub bytes_freed: u64,
    /// Lineages removed because none of their versions is left.
    pub lineages_removed: u64,
    /// Bytes read (to rewrite truncated volumes) and written.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
}

/// Deletes backups `ids` of `repo` (open exclusively) and reclaims their
/// space at once: no garbage collection pass.
pub fn delete_backups(repo: &Repository, ids: &[BackupId]) -> Result<DeleteStats> {
    require_layout(repo)?;
    for &id in ids {
        repo.remove_snapshot(id)?;
    }
    let mut stats = reclaim(repo)?;
    stats.deleted = ids.to_vec();
    Ok(stats)
}

/// Deletes all but the `keep` newest backups (as [`crate::gc::forget_keep_last`]
/// chooses them) and reclaims their space.
pub fn forget_keep_last(repo: &Repository, keep: usize) -> Result<DeleteStats> {
    require_layout(repo)?;
    let ids = crate::format::snapshot::forget_candidates(&repo.snapshots()?, keep);
    delete_backups(repo, &ids)
}

/// Removes every dead category of every lineage (idempotent; also finishes
/// a deletion that was interrupted after the snapshots went).
pub fn reclaim(repo: &Repository) -> Result<DeleteStats> {
    require_layout(repo)?;
    repo.require(LockMode::Exclusive, "reclaiming space")?;
    let io_before = repo.io_stats();
    let live_ids = live_ids(repo)?;
    let mut stats = DeleteStats::default();
    for l in lineages(repo.backend().as_ref())? {
        reclaim_lineage(repo, &l, &live_ids, &mut stats)?;
    }
    let io = repo.io_stats().since(&io_before);
    stats.bytes_read = io.read_bytes;
    stats.bytes_written = io.write_bytes;
    Ok(stats)
}

fn category_bytes(h: &format::VolumeHeader, idx: usize) -> u64 {
    let c = &h.categories[idx];
    c.data_bytes + c.meta_len()
}

fn reclaim_lineage(
    repo: &Repository,
    l: &Lineage,
    live_ids: &BTreeSet<u64>,
    stats: &mut DeleteStats,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    let live = l.live_versions(live_ids);
    let mut log = ReadLog::default();
    if live.is_empty() {
        // Nothing left to restore: remove the lineage, its state first. A
        // removal interrupted after that leaves objects no state refers to:
        // a new backup of the source starts a fresh lineage over them, and
        // its first arranging deletes those it does not overwrite.
        l.delete_state(backend)?;
        for (i, j, p) in l.cat_objects(backend)? {
            let key = cat_key(&l.name, i, j, p);
            if let Some(h) = super::header_if_exists(backend, &key, &mut log)? {
                stats.bytes_freed += (0..h.categories.len())
                    .map(|x| category_bytes(&h, x))
                    .sum::<u64>();
                stats.categories_removed += h.categories.len() as u64;
            }
            backend.delete(&key)?;
        }
        for (j, parts) in l.volumes(backend)? {
            for (p, first) in parts {
                let key = vol_key(&l.name, j, p, first);
                if let Some(h) = super::header_if_exists(backend, &key, &mut log)? {
                    stats.bytes_freed += (0..h.categories.len())
                        .map(|x| category_bytes(&h, x))
                        .sum::<u64>();
                    stats.categories_removed += h.categories.len() as u64;
                }
                backend.delete(&key)?;
            }
            stats.volumes_deleted += 1;
        }
        for name in backend.list(&ndf_dir(&l.name))? {
            if let Some(v) = parse_num_name(&name) {
                backend.delete(&ndf_key(&l.name, v))?;
            }
        }
        backend.delete(&journal_key(&l.name))?;
        stats.lineages_removed += 1;
        return Ok(());
    }
    // Parts to delete: first dropped from the state's list of parts (so
    // that none is ever listed but gone), then deleted.
    let mut doomed: Vec<String> = Vec::new();
    for (j, parts) in l.volumes(backend)? {
        if j >= l.state.arranged {
            continue; // left by an interrupted round: arranging deletes it
        }
        if live.contains(&j) {
            // Every category Cat.(i,j) of the volume holds the live version
            // j: nothing to reclaim, and no header to read (so deleting the
            // oldest backup does not read every volume's header).
            continue;
        }
        // The dead categories are a suffix of the volume, across its parts.
        let (mut cut, mut first_kept) = (false, false);
        for (n, &(p, first)) in parts.iter().enumerate() {
            let key = vol_key(&l.name, j, p, first);
            let h = format::read_header(backend, &key, &mut log)?;
            let keep = if cut {
                0
            } else {
                h.categories
                    .iter()
                    .take_while(|c| live.range(c.start..=j).next().is_some())
                    .count()
            };
            if n == 0 {
                first_kept = keep > 0;
            }
            if keep == h.categories.len() {
                continue;
            }
            cut = true;
            stats.bytes_freed += (keep..h.categories.len())
                .map(|x| category_bytes(&h, x))
                .sum::<u64>();
            stats.categories_removed += (h.categories.len() - keep) as u64;
            if keep == 0 {
                doomed.push(key);
            } else {
                let end = h.categories[keep].offset;
                let prefix = log.read(backend, &key, 0, end)?;
                let rewritten = format::truncate_volume(&key, &h, keep, &prefix)?;
                backend.write(&key, &rewritten)?;
            }
        }
        if cut {
            if first_kept {
                stats.volumes_truncated += 1;
            } else {
                stats.volumes_deleted += 1;
            }
        }
    }
    if !doomed.is_empty() {
        let mut l = l.clone();
        l.update_parts(backend, &doomed, &[])?;
        l.save(backend)?;
        for key in &doomed {
            backend.delete(key)?;
        }
    }
    Ok(())
}

/// Bytes (chunk data and metadata) that deleting backups `ids` would free
/// at once, from the volume headers: the archived categories all of whose
/// versions would be dead, plus, for a lineage left without any live
/// version, everything it stores. Active categories are freed only by the
/// next arranging and are not counted otherwise.
pub fn space(repo: &Repository, ids: &[BackupId]) -> Result<u64> {
    require_layout(repo)?;
    let backend = repo.backend().as_ref();
    let mut remaining = live_ids(repo)?;
    for id in ids {
        if !remaining.remove(id) {
            return Err(Error::NoSuchBackup(*id));
        }
    }
    let mut log = ReadLog::default();
    let mut freed = 0u64;
    for l in lineages(backend)? {
        let live = l.live_versions(&remaining);
        let whole = live.is_empty();
        let mut keys: Vec<(String, u64)> = Vec::new();
        for (j, parts) in l.volumes(backend)? {
            if j < l.state.arranged {
                keys.extend(
                    parts
                        .into_iter()
                        .map(|(p, first)| (vol_key(&l.name, j, p, first), j)),
                );
            }
        }
        if whole {
            for (i, j, p) in l.cat_objects(backend)? {
                keys.push((cat_key(&l.name, i, j, p), j));
            }
        }
        for (key, j) in keys {
            let Some(h) = super::header_if_exists(backend, &key, &mut log)? else {
                continue;
            };
            for (x, c) in h.categories.iter().enumerate() {
                if whole || live.range(c.start..=j).next().is_none() {
                    freed += category_bytes(&h, x);
                }
            }
        }
    }
    Ok(freed)
}

/// Space of one version of a lineage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VersionSpace {
    /// Lineage-local version number.
    pub version: u64,
    /// Backup id.
    pub backup: BackupId,
    /// Whether the backup still exists.
    pub live: bool,
    /// Bytes of new data the version brought: the size of Cat.(n,n) when it
    /// was backed up (`None` once the backup is deleted).
    pub new_bytes: Option<u64>,
    /// Chunk bytes of volume `version` now (chunks of versions ≤ `version`
    /// that the next version no longer references; `None` while not archived).
    pub volume_bytes: Option<u64>,
}

/// Per-version trend of new data of the lineage of `source` (MFDedup §4.6):
/// the size of each version's Cat.(n,n) and of its volume.
pub fn trend(repo: &Repository, source: &str) -> Result<Vec<VersionSpace>> {
    require_layout(repo)?;
    let backend = repo.backend().as_ref();
    let Some(l) = Lineage::load(backend, &super::lineage_name(source))? else {
        return Ok(Vec::new());
    };
    let live = live_ids(repo)?;
    let vols = l.volumes(backend)?;
    let mut log = ReadLog::default();
    let mut out = Vec::new();
    for v in &l.state.versions {
        let is_live = live.contains(&v.backup);
        let new_bytes = if is_live {
            Some(repo.snapshot(v.backup)?.stats.unique.bytes)
        } else {
            None
        };
        let volume_bytes = if v.version < l.state.arranged {
            let mut bytes = 0;
            for &(p, first) in vols.get(&v.version).map_or(&[][..], |p| &p[..]) {
                let h =
                    format::read_header(backend, &vol_key(&l.name, v.version, p, first), &mut log)?;
                bytes += h.categories.iter().map(|c| c.data_bytes).sum::<u64>();
            }
            Some(bytes)
        } else {
            None
        };
        out.push(VersionSpace {
            version: v.version,
            backup: v.backup,
            live: is_live,
            new_bytes,
            volume_bytes,
        });
    }
    Ok(out)
}

/// Totals over a lifecycle repository, like [`crate::commands::stats::totals`]:
/// `physical_bytes` sums every object of the layout (category and volume
/// parts, NDF tables, lineage states, journals) and `containers` counts the
/// category and volume parts.
pub fn totals(repo: &Repository) -> Result<crate::repo::RepoTotals> {
    require_layout(repo)?;
    let backend = repo.backend().as_ref();
    let snapshots = repo.snapshots()?;
    let (mut physical_bytes, mut parts) = (0u64, 0u64);
    // A trace repository stores no chunk bytes: count the bytes its
    // category and volume objects stand for (their headers' data lengths).
    let trace = repo.config().trace;
    // Compressing repositories: every stored chunk, for the compression ratio.
    let encoded = repo.config().encoding().is_some();
    let (mut copies, mut numbered) = (crate::commands::stats::stored_copies(), 0);
    let object_bytes = |key: &str| -> Result<u64> {
        let size = backend.size(key)?;
        if !trace {
            return Ok(size);
        }
        let header = format::read_header(backend, key, &mut ReadLog::default())?;
        Ok(size + header.categories.iter().map(|c| c.data_bytes).sum::<u64>())
    };
    for l in lineages(backend)? {
        for key in [state_key(&l.name), state_copy_key(&l.name)] {
            physical_bytes += match backend.size(&key) {
                Err(Error::NotFound(_)) => 0,
                size => size?,
            };
        }
        let mut keys: Vec<String> = l
            .cat_objects(backend)?
            .into_iter()
            .map(|(i, j, p)| cat_key(&l.name, i, j, p))
            .collect();
        for (j, vol_parts) in l.volumes(backend)? {
            keys.extend(
                vol_parts
                    .into_iter()
                    .map(|(p, f)| vol_key(&l.name, j, p, f)),
            );
        }
        for key in &keys {
            physical_bytes += object_bytes(key)?;
            parts += 1;
            if encoded {
                add_copies(backend, key, &mut copies, &mut numbered)?;
            }
        }
        for name in backend.list(&ndf_dir(&l.name))? {
            if let Some(v) = parse_num_name(&name) {
                physical_bytes += backend.size(&ndf_key(&l.name, v))?;
            }
        }
    }
    let totals = crate::repo::RepoTotals::new(&snapshots, physical_bytes, parts);
    if !encoded {
        return Ok(totals);
    }
    let ids: Vec<BackupId> = snapshots.iter().map(|s| s.id).collect();
    let stored = crate::commands::stats::lifecycle_compression(repo, &ids, copies)?;
    Ok(totals.with_compression(stored))
}

/// Adds every chunk stored in the category or volume part `key` to
/// `copies` (as its fingerprint, a number unique to the copy — `numbered`
/// counts them —, its stored length). A part whose header or metadata cannot be read is left out
/// (`check` reports it).
fn add_copies(
    backend: &dyn crate::backend::Backend,
    key: &str,
    copies: &mut crate::util::sorted_pairs::Sorter<crate::commands::stats::StoredCopy>,
    numbered: &mut u64,
) -> Result<()> {
    use crate::commands::stats::unless_damaged as readable;
    let mut log = ReadLog::default();
    let Some(header) = readable(format::read_header(backend, key, &mut log))? else {
        return Ok(());
    };
    for idx in 0..header.categories.len() {
        let Some(metas) = readable(format::read_meta(backend, key, &header, idx, &mut log))? else {
            continue;
        };
        for (fp, len) in metas {
            *numbered += 1;
            copies.push(crate::commands::stats::StoredCopy(fp, *numbered, len))?;
        }
    }
    Ok(())
}

/// Fails unless `repo` uses the lifecycle layout.
pub(crate) fn require_layout(repo: &Repository) -> Result<()> {
    if repo.config().layout != Layout::Lifecycle {
        return Err(Error::InvalidConfig(
            "this operation needs a repository with the lifecycle layout".into(),
        ));
    }
    Ok(())
}

/// Ids of the backups whose data must be kept: committed ones, and those
/// whose lost snapshot can still be recovered
/// ([`Repository::retained_backups`]).
pub(crate) fn live_ids(repo: &Repository) -> Result<BTreeSet<u64>> {
    repo.retained_backups()
}
