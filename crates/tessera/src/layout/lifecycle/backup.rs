//! The deduplicating stage: NDF (neighbor-duplicate-focus) indexing against
//! the backup itself and the previous version of its lineage; unique chunks
//! form the new category Cat.(n,n).

use super::arrange::{arrange_lineage, ArrangeOptions, ArrangeStats};
use super::format::{self, PartWriter};
use super::prev_table::PrevTable;
use super::{cat_key, ndf_key, require_layout, Lineage};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::format::compression::{Compression, CompressionStats, EncodeCounts};
use crate::format::snapshot::{
    BackupStats, ChunkRef, ClassCount, RecipeWriter, Snapshot, StageSeconds, TreeRef,
};
use crate::index::{Chunk, IndexStats};
use crate::repo::config::Arrange;
use crate::repo::Repository;
use crate::util::spill::{byte_order, SpillMap};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Memory for the backup's set of distinct fingerprints (its NDF table),
/// beyond which it spills to temporary files.
const CUR_BUDGET: u64 = 8 << 20;

/// Options of one lifecycle backup.
#[derive(Default)]
pub struct LifecycleBackupOptions<'a> {
    /// Free-form label.
    pub label: String,
    /// Source lineage name.
    pub source: String,
    /// Host name recorded in the snapshot.
    pub host: String,
    /// Tags recorded in the snapshot (sorted and distinct: see
    /// [`crate::commands::tags::normalize`]).
    pub tags: Vec<String>,
    /// Called with the number of input bytes processed so far.
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
    /// The snapshot's time instead of the commit's (see [`crate::backup::BackupOptions::time`]).
    pub time: Option<u64>,
    /// Compression of the chunks this backup stores, instead of the
    /// repository's setting (only in a repository that compresses).
    pub compression: Option<Compression>,
    /// Memory of the previous version's NDF table as this backup looks it
    /// up (past it, a temporary file with an index and a Bloom filter in
    /// memory), and of each sort of the arranging that follows the backup
    /// ([`ArrangeOptions::sort_budget`]; `None`: the default).
    pub sort_budget: Option<u64>,
}

/// A committed backup and, when the configuration arranges automatically,
/// the arranging that followed it.
#[derive(Clone, Debug)]
pub struct BackupOutcome {
    /// The committed snapshot.
    pub snapshot: Snapshot,
    /// The arranging run after the commit (`None` with `arrange = "manual"`,
    /// or when deferred).
    pub arrange: Option<ArrangeStats>,
    /// Arranging was due but deferred because other processes were reading
    /// the repository (arranging deletes objects they may read): it runs
    /// with the next backup of the lineage or `tessera arrange`.
    pub arrange_deferred: bool,
}

/// Deletes parts `parts..` of Cat.(v,v) left by an interrupted backup of
/// version `v`, so that the category is exactly what this backup wrote.
fn delete_stale_parts(backend: &dyn Backend, lineage: &Lineage, v: u64, parts: u32) -> Result<()> {
    for (i, j, p) in lineage.cat_objects(backend)? {
        if i == v && j == v && p >= parts {
            backend.delete(&cat_key(&lineage.name, i, j, p))?;
        }
    }
    Ok(())
}

/// Backs up the chunks `batches` yields (in stream order) into `repo`
/// (lifecycle layout, open exclusively) as the next version of the lineage
/// `options.source`, commits it, then arranges unless the configuration says
/// `arrange = "manual"`.
///
/// Chunks must carry their bytes unless the repository is a trace
/// repository, whose categories store fingerprints and lengths only.
pub fn backup(
    repo: &Repository,
    batches: impl Iterator<Item = Result<Vec<Chunk>>>,
    options: &LifecycleBackupOptions,
) -> Result<BackupOutcome> {
    backup_stream(repo, batches, options, None, None)
}

/// [`backup`] of a stream that may be a tree backup: its snapshot records
/// the catalog `tree` holds once `batches` ended. Chunks without bytes
/// (reused ones) get them from `refetch` when they must be stored.
pub(crate) fn backup_stream(
    repo: &Repository,
    batches: impl Iterator<Item = Result<Vec<Chunk>>>,
    options: &LifecycleBackupOptions,
    tree: Option<&std::sync::OnceLock<TreeRef>>,
    refetch: Option<&dyn crate::backup::refetch::Refetch>,
) -> Result<BackupOutcome> {
    require_layout(repo)?;
    let started = Instant::now();
    let io_before = repo.io_stats();
    let backend = repo.backend().as_ref();
    let has_data = !repo.config().trace;
    let id = repo.next_backup_id()?;
    let mut lineage = Lineage::load_or_new(backend, &options.source)?;
    let v = lineage.state.last() + 1;

    let t = Instant::now();
    let sort_budget = options
        .sort_budget
        .unwrap_or(ArrangeOptions::default().sort_budget);
    // Damage never spreads: a chunk known to be damaged or missing (or
    // every chunk, when a part of the lineage is missing) is not an
    // adjacent duplicate: it is stored again. Without the previous
    // version's table (and recipe), nothing is an adjacent duplicate
    // either: every chunk is stored again, which is safe.
    let unusable = lineage.unusable(backend)?;
    let mut prev = PrevTable::load(repo, &lineage, v - 1, sort_budget, &unusable)?;
    let mut index_time = t.elapsed();
    let mut store_time = std::time::Duration::ZERO;
    // This version's distinct fingerprints (its NDF table), spilled past CUR_BUDGET.
    let mut cur = SpillMap::with_budget(CUR_BUDGET, byte_order);
    let mut distinct = 0u64;
    let name = lineage.name.clone();
    let encoding = repo.config().backup_encoding(options.compression)?;
    let mut new_cat = PartWriter::new(
        backend,
        v,
        has_data,
        repo.config().lifecycle_part_bytes,
        |p, _| cat_key(&name, v, v, p),
    );
    if let Some(setting) = encoding {
        new_cat = new_cat.encoding(setting).with_dictionary(repo.dictionary());
    }
    // Without a dictionary yet, this backup's first chunks train one for
    // the backups after it (FORMAT.md §7.8).
    let train = repo.wants_dictionary(encoding) && has_data;
    if train {
        new_cat = new_cat.sampling();
    }
    // On an object store the parts upload while the next ones fill, as
    // many at once as it takes requests (each holds a part in memory).
    if let Some(at_once) = backend.connections() {
        new_cat = new_cat.uploading(repo.shared_backend(), at_once);
    }
    let mut write_time = std::time::Duration::ZERO;
    let mut recipe = RecipeWriter::new(id)?;
    let (mut unique, mut internal, mut adjacent) = (
        ClassCount::default(),
        ClassCount::default(),
        ClassCount::default(),
    );
    let mut logical = 0u64;
    let mut peak_memory = prev.peak_memory();
    for batch in batches {
        for c in batch? {
            let bytes = match (&c.data, has_data) {
                (Some(b), true) if b.len() == c.len as usize => Some(&b[..]),
                (_, false) => None,
                // Reused: fetched below if it must be stored.
                (None, true) if refetch.is_some() => None,
                _ => {
                    return Err(Error::Pipeline(format!(
                        "chunk {} has no bytes or a wrong length for a repository that stores data",
                        c.seq
                    )))
                }
            };
            let offset = logical;
            logical += u64::from(c.len);
            recipe.push(&ChunkRef {
                fp: c.fp,
                len: c.len,
                container: 0,
            })?;
            let t = Instant::now();
            let fresh = cur.insert(c.fp, 0)?.is_none();
            distinct += u64::from(fresh);
            let in_prev = fresh && prev.contains(&c.fp)?;
            index_time += t.elapsed();
            if !fresh {
                internal.add(c.len);
            } else if in_prev {
                adjacent.add(c.len);
            } else {
                let t = Instant::now();
                unique.add(c.len);
                let fetched = match (bytes, has_data) {
                    (None, true) => Some(crate::backup::refetch::refetch_bytes(
                        refetch, offset, &c.fp, c.len, c.seq,
                    )?),
                    _ => None,
                };
                let bytes = fetched.as_deref().or(bytes);
                new_cat.push(v, &c.fp, c.len, bytes)?;
                store_time += t.elapsed();
            }
        }
        peak_memory = peak_memory.max(prev.memory() + cur.memory());
        if let Some(p) = options.progress {
            p(logical);
        }
    }
    peak_memory = peak_memory.max(prev.memory() + cur.memory());
    let index_stats = IndexStats {
        policy: "ndf".into(),
        entries: prev.len() + distinct,
        memory_bytes: peak_memory,
        lookups: recipe.chunks(),
        ..IndexStats::default()
    };
    drop(prev);

    // Commit order: the new category and NDF table, then the recipe, then
    // the lineage state, then the snapshot. An interruption before the
    // state leaves objects the next backup of the lineage overwrites; one
    // between state and snapshot leaves a version that counts as deleted.
    let t = Instant::now();
    let encoded = match encoding {
        Some(_) => new_cat.counts(),
        None => EncodeCounts {
            raw: unique.chunks,
            bytes_in: unique.bytes,
            bytes_out: unique.bytes,
            ..EncodeCounts::default()
        },
    };
    let samples = new_cat.take_samples();
    let parts = new_cat.finish()?;
    if train {
        let samples: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
        repo.train_dictionary(&samples)?;
    }
    delete_stale_parts(backend, &lineage, v, parts)?;
    write_time += t.elapsed();
    let commit_started = Instant::now();
    format::write_ndf(backend, &ndf_key(&lineage.name, v), &mut cur, distinct)?;
    drop(cur);
    let tree = match tree.and_then(|t| t.get()) {
        Some(t) => {
            let mut t = t.clone();
            t.locate(recipe.refs()?)?;
            Some(t)
        }
        None => None,
    };
    recipe.store(backend)?;
    let written: Vec<String> = (0..parts)
        .map(|p| cat_key(&lineage.name, v, v, p))
        .collect();
    lineage.update_parts(backend, &[], &written)?;
    lineage
        .state
        .versions
        .push(crate::layout::lifecycle::lineage_state::Version {
            version: v,
            backup: id,
        });
    lineage.save(backend)?;

    let stats = BackupStats {
        logical_bytes: logical,
        stored_bytes: unique.bytes,
        chunks: recipe.chunks(),
        unique_chunks: unique.chunks,
        unique,
        internal_duplicates: internal,
        duplicates: adjacent,
        containers_written: 1,
        dedup_ratio: crate::util::units::ratio(logical, unique.bytes),
        stage_seconds: StageSeconds {
            index: index_time.as_secs_f64(),
            store: store_time.as_secs_f64(),
            write: write_time.as_secs_f64(),
            ..StageSeconds::default()
        },
        index: index_stats,
        compression: CompressionStats::new(encoding, &encoded),
        ..BackupStats::default()
    };
    let time = options.time.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let mut snap = Snapshot {
        id,
        time,
        label: options.label.clone(),
        source: options.source.clone(),
        host: options.host.clone(),
        tags: options.tags.clone(),
        logical_bytes: logical,
        stats,
        tree,
    };
    let snapshot_len = snap.encode()?.len() as u64;
    snap.stats.stage_seconds.commit = commit_started.elapsed().as_secs_f64();
    snap.stats.seconds = started.elapsed().as_secs_f64();
    snap.stats.throughput_mb_s = logical as f64 / 1e6 / snap.stats.seconds.max(1e-9);
    snap.stats.record_io(&repo.io_stats().since(&io_before));
    snap.stats.bytes_written += snapshot_len;
    repo.commit_snapshot(&snap)?;

    let due = repo.config().arrange == Arrange::Auto;
    let may_arrange = due && repo.exclude_readers()?;
    let arrange = match may_arrange {
        // The backup is committed: a damaged object arranging must read
        // defers arranging (an interrupted round, resumed later) instead
        // of failing the backup.
        true => match arrange_lineage(
            repo,
            &mut lineage,
            &ArrangeOptions {
                rounds: None,
                sort_budget,
            },
            &crate::progress::Silent,
        ) {
            Ok(s) => Some(s),
            Err(e) if e.is_damage() => None,
            Err(e) => return Err(e),
        },
        false => None,
    };
    Ok(BackupOutcome {
        snapshot: snap,
        arrange_deferred: due && arrange.is_none(),
        arrange,
    })
}
