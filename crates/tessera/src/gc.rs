//! Retention and mark-sweep garbage collection of the container layout.
//!
//! `mark` walks every live recipe into a table of valid chunks per
//! container; `select` picks containers by utilization (live bytes / stored
//! bytes) against a threshold — 0% reclaims every dead byte (perfect GC),
//! 100% only wholly dead containers (container-marker style); `sweep` copies
//! the valid chunks of selected containers forward into new containers,
//! then the index and the recipes are updated and the old containers deleted.
//!
//! Crash safety: new containers are durable before the index and recipes
//! name them, every recipe is rewritten atomically, and old containers are
//! deleted only after every recipe and the index have moved on. An
//! interrupted GC leaves a valid repository plus garbage the next GC reclaims.

use crate::backend::Backend;
use crate::container::{self, Builder, Container, ContainerId};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder};
use crate::index::Relocations;
use crate::repo::Repository;
use crate::snapshot::{self, BackupId, Snapshot};
use serde::Serialize;
use std::collections::BTreeSet;
use std::time::Instant;

type LiveSet = hashbrown::HashSet<(ContainerId, Fingerprint), FingerprintHashBuilder>;

/// Options of a garbage collection.
#[derive(Clone, Copy, Debug)]
pub struct GcOptions {
    /// Utilization threshold in percent: a container with dead chunks is
    /// copied forward when its live bytes are at most `100 - threshold`
    /// percent of its stored bytes. 0 = perfect GC, 100 = only wholly dead containers.
    pub threshold_pct: f64,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions { threshold_pct: 0.0 }
    }
}

/// Seconds spent per GC stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GcStageSeconds {
    /// Walking live recipes.
    pub mark: f64,
    /// Reading container metadata and choosing containers.
    pub select: f64,
    /// Reading selected containers and writing live chunks forward.
    pub sweep: f64,
    /// Rewriting the index and the recipes.
    pub update: f64,
    /// Deleting old containers.
    pub delete: f64,
}

/// Metrics of one garbage collection.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GcStats {
    /// Containers examined.
    pub containers_total: u64,
    /// Containers selected (copied forward or reclaimed whole).
    pub containers_involved: u64,
    /// Containers deleted.
    pub containers_reclaimed: u64,
    /// Containers written by the copy-forward.
    pub containers_produced: u64,
    /// Live chunks copied forward.
    pub chunks_moved: u64,
    /// Bytes of live chunks copied forward.
    pub bytes_moved: u64,
    /// Bytes read from the backend.
    pub bytes_read: u64,
    /// Bytes written to the backend.
    pub bytes_written: u64,
    /// Container bytes freed (deleted minus produced).
    pub bytes_freed: i64,
    /// Recipes rewritten to name the new containers.
    pub recipes_rewritten: u64,
    /// Leftover recipes of interrupted backups removed.
    pub uncommitted_recipes_removed: u64,
    /// Wall time.
    pub seconds: f64,
    /// Time per stage.
    pub stage_seconds: GcStageSeconds,
}

/// Backups a `keep-last` retention would delete: all but the `keep` newest.
pub fn forget_candidates(snapshots: &[Snapshot], keep: usize) -> Vec<BackupId> {
    let mut ids: Vec<BackupId> = snapshots.iter().map(|s| s.id).collect();
    ids.sort_unstable();
    let n = ids.len().saturating_sub(keep);
    ids.truncate(n);
    ids
}

/// Deletes all but the `keep` newest backups; returns the deleted ids.
pub fn forget_keep_last(repo: &Repository, keep: usize, dry_run: bool) -> Result<Vec<BackupId>> {
    let ids = forget_candidates(&repo.snapshots()?, keep);
    if !dry_run {
        for &id in &ids {
            repo.delete_backup(id)?;
        }
    }
    Ok(ids)
}

/// What `select` decided for a container.
struct Selected {
    id: ContainerId,
    /// Stored bytes (nominal, with data).
    size: u64,
    /// Whether it still holds live chunks (copied forward) or none (deleted only).
    has_live: bool,
}

/// Collects garbage in `repo` (open exclusively).
pub fn gc(repo: &Repository, options: GcOptions) -> Result<GcStats> {
    if !(0.0..=100.0).contains(&options.threshold_pct) {
        return Err(Error::InvalidConfig(format!(
            "GC threshold {}% is outside 0..=100",
            options.threshold_pct
        )));
    }
    let started = Instant::now();
    let io_before = repo.io_stats();
    let backend = repo.backend().as_ref();
    let mut stats = GcStats::default();

    // Mark.
    let t = Instant::now();
    let snapshots = repo.snapshots()?;
    let mut live = LiveSet::default();
    for s in &snapshots {
        for c in &repo.recipe(s.id)?.chunks {
            live.insert((c.container, c.fp));
        }
    }
    stats.stage_seconds.mark = t.elapsed().as_secs_f64();

    // Select.
    let t = Instant::now();
    let containers = repo.containers()?;
    stats.containers_total = containers.len() as u64;
    let keep_fraction = 1.0 - options.threshold_pct / 100.0;
    let mut selected = Vec::new();
    for &cid in &containers {
        let (header, metas) = match container::read_meta(backend, cid) {
            Ok(v) => v,
            // A damaged container is left alone: check reports it, GC must not hide it.
            Err(Error::Corrupt { .. } | Error::UnsupportedVersion { .. }) => continue,
            Err(e) => return Err(e),
        };
        let total: u64 = metas.iter().map(|m| u64::from(m.len)).sum();
        let live_bytes: u64 = metas
            .iter()
            .filter(|m| live.contains(&(cid, m.fp)))
            .map(|m| u64::from(m.len))
            .sum();
        let size = header.total_len() as u64;
        if live_bytes == 0 {
            selected.push(Selected {
                id: cid,
                size,
                has_live: false,
            });
        } else if live_bytes < total && (live_bytes as f64) <= keep_fraction * total as f64 {
            selected.push(Selected {
                id: cid,
                size,
                has_live: true,
            });
        }
    }
    stats.containers_involved = selected.len() as u64;
    stats.stage_seconds.select = t.elapsed().as_secs_f64();

    // Sweep: copy live chunks forward, in container order.
    let t = Instant::now();
    let trace = repo.config().trace;
    let capacity = repo.config().container_size as usize;
    let mut next_id = repo.next_container_id()?;
    let mut moved = Relocations::default();
    let mut open: Option<Builder> = None;
    let mut produced_bytes = 0u64;
    let algo = repo.config().fingerprint;
    for s in selected.iter().filter(|s| s.has_live) {
        let ct = Container::parse(s.id, backend.read(&container::key(s.id))?)?;
        for (i, m) in ct.metas.iter().enumerate() {
            if !live.contains(&(s.id, m.fp)) || moved.contains_key(&(s.id, m.fp)) {
                continue;
            }
            let bytes = ct.chunk(i);
            if !trace && algo.hash(bytes) != m.fp {
                // Never copy a damaged chunk forward: stop before anything refers to the copies.
                return Err(Error::ChunkMismatch {
                    container: s.id,
                    fingerprint: m.fp.to_string(),
                    actual: algo.hash(bytes).to_string(),
                });
            }
            if open.as_ref().is_some_and(|b| !b.fits(m.len as usize)) {
                if let Some(b) = open.take() {
                    produced_bytes += write_container(backend, b)?;
                    stats.containers_produced += 1;
                }
            }
            let b = open.get_or_insert_with(|| {
                let id = next_id;
                next_id += 1;
                if trace {
                    Builder::without_data(id, capacity)
                } else {
                    Builder::new(id, capacity)
                }
            });
            if trace {
                b.push_len(m.fp, m.len);
            } else {
                b.push(m.fp, bytes);
            }
            moved.insert((s.id, m.fp), b.id());
            stats.chunks_moved += 1;
            stats.bytes_moved += u64::from(m.len);
        }
    }
    if let Some(b) = open.take() {
        produced_bytes += write_container(backend, b)?;
        stats.containers_produced += 1;
    }
    stats.stage_seconds.sweep = t.elapsed().as_secs_f64();

    // Update the index, then every recipe that names a selected container.
    let t = Instant::now();
    let removed: BTreeSet<ContainerId> = selected.iter().map(|s| s.id).collect();
    let mut index = repo.open_index()?;
    index.relocate(&removed, &moved)?;
    index.commit(next_id)?;
    for s in &snapshots {
        let mut recipe = repo.recipe(s.id)?;
        let mut changed = false;
        for c in &mut recipe.chunks {
            if removed.contains(&c.container) {
                let new = moved.get(&(c.container, c.fp)).ok_or_else(|| {
                    Error::Pipeline(format!(
                        "GC found no new home for chunk {} of backup {} in container {:016x}",
                        c.fp, s.id, c.container
                    ))
                })?;
                c.container = *new;
                changed = true;
            }
        }
        if changed {
            backend.write(&snapshot::recipe_key(s.id), &recipe.encode()?)?;
            stats.recipes_rewritten += 1;
        }
    }
    stats.stage_seconds.update = t.elapsed().as_secs_f64();

    // Delete old containers and leftover recipes.
    let t = Instant::now();
    repo.reserve_container_ids(next_id)?;
    let mut freed = 0u64;
    for s in &selected {
        backend.delete(&container::key(s.id))?;
        freed += s.size;
    }
    stats.containers_reclaimed = selected.len() as u64;
    let committed: BTreeSet<BackupId> = snapshots.iter().map(|s| s.id).collect();
    for id in repo.recipes()? {
        if !committed.contains(&id) {
            backend.delete(&snapshot::recipe_key(id))?;
            stats.uncommitted_recipes_removed += 1;
        }
    }
    stats.stage_seconds.delete = t.elapsed().as_secs_f64();

    let io = repo.io_stats().since(&io_before);
    stats.bytes_read = io.read_bytes;
    stats.bytes_written = io.write_bytes;
    stats.bytes_freed = freed as i64 - produced_bytes as i64;
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// Seals and writes a container; returns its nominal size.
fn write_container(backend: &dyn Backend, b: Builder) -> Result<u64> {
    let id = b.id();
    let bytes = b.seal();
    let header = container::Header::parse(id, &bytes)?;
    backend.write(&container::key(id), &bytes)?;
    Ok(header.total_len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forget_keeps_the_newest() {
        let snaps: Vec<Snapshot> = [3, 1, 2, 5]
            .iter()
            .map(|&id| Snapshot {
                id,
                time: 0,
                label: String::new(),
                source: String::new(),
                logical_bytes: 0,
                stats: Default::default(),
            })
            .collect();
        assert_eq!(forget_candidates(&snaps, 2), vec![1, 2]);
        assert_eq!(forget_candidates(&snaps, 0), vec![1, 2, 3, 5]);
        assert!(forget_candidates(&snaps, 9).is_empty());
    }
}
