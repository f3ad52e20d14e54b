//! The deduplicating stage: NDF (neighbor-duplicate-focus) indexing against
//! the backup itself and the previous version of its lineage; unique chunks
//! form the new category Cat.(n,n).

use super::arrange::{arrange_lineage, ArrangeOptions};
use super::format::{self, PartWriter};
use super::prev_table::PrevTable;
use super::{cat_key, ndf_key, require_layout, Lineage};
use crate::backend::Backend;
use crate::backup::options::{BackupOptions, Outcome};
use crate::error::{Error, Result};
use crate::format::compression::{CompressionStats, EncodeCounts};
use crate::format::snapshot::{
    BackupId, BackupStats, ChunkRef, ClassCount, RecipeWriter, Snapshot, StageSeconds, TreeRef,
};
use crate::index::{Chunk, IndexStats};
use crate::layout::lifecycle::lineage_state::Version;
use crate::layout::stream::{refetch_bytes, ChunkStream, Refetch};
use crate::repo::config::Arrange;
use crate::repo::Repository;
use crate::util::spill::{byte_order, SpillMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Memory for the backup's set of distinct fingerprints (its NDF table),
/// beyond which it spills to temporary files.
const CUR_BUDGET: u64 = 8 << 20;

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

/// The NDF deduplication of one backup under way: the previous version's
/// table, this version's, the new category being written, the counts.
struct Dedup<'a> {
    id: BackupId,
    has_data: bool,
    v: u64,
    prev: PrevTable,
    /// This version's distinct fingerprints (its NDF table), spilled past CUR_BUDGET.
    cur: SpillMap,
    distinct: u64,
    new_cat: PartWriter<'a>,
    recipe: RecipeWriter,
    unique: ClassCount,
    internal: ClassCount,
    adjacent: ClassCount,
    logical: u64,
    peak_memory: u64,
    index_time: Duration,
    store_time: Duration,
}

/// Backs up `stream` into `repo` (lifecycle layout, opened for a backup) as
/// the next version of the lineage `options.source`, commits it, then
/// arranges unless the configuration says `arrange = "manual"`.
///
/// Chunks must carry their bytes unless the repository is a trace
/// repository (whose categories store fingerprints and lengths only) or
/// `stream.refetch` supplies them. The snapshot records the catalog the
/// stream's facts hold once it ended (a tree backup).
pub(crate) fn backup(
    repo: &Repository,
    stream: ChunkStream,
    options: &BackupOptions,
) -> Result<Outcome> {
    require_layout(repo)?;
    let started = Instant::now();
    let io_before = repo.io_stats();
    let backend = repo.backend().as_ref();
    let id = repo.next_backup_id()?;
    let mut lineage = Lineage::load_or_new(backend, &options.source)?;
    let sort_budget = options
        .sort_budget
        .unwrap_or(ArrangeOptions::default().sort_budget);
    let name = lineage.name.clone();
    let mut dedup = Dedup::start(repo, &lineage, id, options, sort_budget, &name)?;
    let read = dedup.take(stream.chunks, stream.refetch, options);
    // An input error explains a backup that ended early.
    let (read_time, hash_time) = (stream.join_front)()?;
    read?;
    let tree = stream.facts.tree.get().cloned();
    let mut snap = dedup.commit(repo, &mut lineage, tree, options)?;
    snap.stats.stage_seconds.chunk = read_time.as_secs_f64();
    snap.stats.stage_seconds.fingerprint = hash_time.as_secs_f64();
    let snapshot_len = snap.encode()?.len() as u64;
    snap.stats.seconds = started.elapsed().as_secs_f64();
    snap.stats.throughput_mb_s = snap.logical_bytes as f64 / 1e6 / snap.stats.seconds.max(1e-9);
    snap.stats.record_io(&repo.io_stats().since(&io_before));
    snap.stats.bytes_written += snapshot_len;
    repo.commit_snapshot(&snap)?;
    arrange_after(repo, &mut lineage, snap, sort_budget)
}

impl<'a> Dedup<'a> {
    /// Opens the previous version's table and a writer of the new category
    /// Cat.(v,v) of `lineage`'s next version `v`.
    fn start(
        repo: &'a Repository,
        lineage: &Lineage,
        id: BackupId,
        options: &BackupOptions,
        sort_budget: u64,
        name: &'a str,
    ) -> Result<Self> {
        let backend = repo.backend().as_ref();
        let has_data = !repo.config().trace;
        let v = lineage.state.last() + 1;
        let t = Instant::now();
        // Damage never spreads: a chunk known to be damaged or missing (or
        // every chunk, when a part of the lineage is missing) is not an
        // adjacent duplicate: it is stored again. Without the previous
        // version's table (and recipe), nothing is an adjacent duplicate
        // either: every chunk is stored again, which is safe.
        let unusable = lineage.unusable(backend)?;
        let prev = PrevTable::load(repo, lineage, v - 1, sort_budget, &unusable)?;
        let index_time = t.elapsed();
        let encoding = repo.config().backup_encoding(options.compression)?;
        let mut new_cat = PartWriter::new(
            backend,
            v,
            has_data,
            repo.config().lifecycle_part_bytes,
            move |p, _| cat_key(name, v, v, p),
        );
        if let Some(setting) = encoding {
            new_cat = new_cat
                .encoding(setting)
                .with_dictionary(repo.dictionary()?);
        }
        // Without a dictionary yet, this backup's first chunks train one for
        // the backups after it (FORMAT.md §7.8).
        if repo.wants_dictionary(encoding) && has_data {
            new_cat = new_cat.sampling();
        }
        // On an object store the parts upload while the next ones fill, as
        // many at once as it takes requests (each holds a part in memory).
        if let Some(at_once) = backend.connections() {
            new_cat = new_cat.uploading(repo.shared_backend(), at_once);
        }
        Ok(Dedup {
            id,
            has_data,
            v,
            peak_memory: prev.peak_memory(),
            prev,
            cur: SpillMap::with_budget(CUR_BUDGET, byte_order),
            distinct: 0,
            new_cat,
            recipe: RecipeWriter::new(id)?,
            unique: ClassCount::default(),
            internal: ClassCount::default(),
            adjacent: ClassCount::default(),
            logical: 0,
            index_time,
            store_time: Duration::ZERO,
        })
    }

    /// Takes every chunk of `batches`: recorded in the recipe, and stored in
    /// the new category unless this version or the previous one has it.
    fn take(
        &mut self,
        batches: impl IntoIterator<Item = Vec<Chunk>>,
        refetch: Option<&dyn Refetch>,
        options: &BackupOptions,
    ) -> Result<()> {
        for batch in batches {
            for c in batch {
                self.take_chunk(&c, refetch)?;
            }
            self.peak_memory = self.peak_memory.max(self.memory());
            if let Some(p) = options.progress {
                p(self.logical);
            }
        }
        self.peak_memory = self.peak_memory.max(self.memory());
        Ok(())
    }

    fn memory(&self) -> u64 {
        self.prev.memory() + self.cur.memory()
    }

    /// One chunk of [`Dedup::take`].
    fn take_chunk(&mut self, c: &Chunk, refetch: Option<&dyn Refetch>) -> Result<()> {
        let bytes = match (&c.data, self.has_data) {
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
        let offset = self.logical;
        self.logical += u64::from(c.len);
        self.recipe.push(&ChunkRef {
            fp: c.fp,
            len: c.len,
            container: 0,
        })?;
        let t = Instant::now();
        let fresh = self.cur.insert(c.fp, 0)?.is_none();
        self.distinct += u64::from(fresh);
        let in_prev = fresh && self.prev.contains(&c.fp)?;
        self.index_time += t.elapsed();
        if !fresh {
            self.internal.add(c.len);
        } else if in_prev {
            self.adjacent.add(c.len);
        } else {
            let t = Instant::now();
            self.unique.add(c.len);
            let fetched = match (bytes, self.has_data) {
                (None, true) => Some(refetch_bytes(refetch, offset, &c.fp, c.len, c.seq)?),
                _ => None,
            };
            let bytes = fetched.as_deref().or(bytes);
            self.new_cat.push(self.v, &c.fp, c.len, bytes)?;
            self.store_time += t.elapsed();
        }
        Ok(())
    }

    /// Commits what was taken (the snapshot itself is the caller's to
    /// write): the new category and NDF table, then the recipe, then the
    /// lineage state. An interruption before the state leaves objects the
    /// next backup of the lineage overwrites; one between state and
    /// snapshot leaves a version that counts as deleted. Returns the
    /// snapshot to commit.
    fn commit(
        mut self,
        repo: &Repository,
        lineage: &mut Lineage,
        tree: Option<TreeRef>,
        options: &BackupOptions,
    ) -> Result<Snapshot> {
        let backend = repo.backend().as_ref();
        let encoding = repo.config().backup_encoding(options.compression)?;
        let index_stats = IndexStats {
            policy: "ndf".into(),
            entries: self.prev.len() + self.distinct,
            memory_bytes: self.peak_memory,
            lookups: self.recipe.chunks(),
            ..IndexStats::default()
        };
        let v = self.v;
        let t = Instant::now();
        let encoded = match encoding {
            Some(_) => self.new_cat.counts(),
            None => EncodeCounts {
                raw: self.unique.chunks,
                bytes_in: self.unique.bytes,
                bytes_out: self.unique.bytes,
                ..EncodeCounts::default()
            },
        };
        let samples = self.new_cat.take_samples();
        let parts = self.new_cat.finish()?;
        if !samples.is_empty() {
            let samples: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
            repo.train_dictionary(&samples)?;
        }
        delete_stale_parts(backend, lineage, v, parts)?;
        let write_time = t.elapsed();
        let commit_started = Instant::now();
        format::write_ndf(
            backend,
            &ndf_key(&lineage.name, v),
            &mut self.cur,
            self.distinct,
        )?;
        let tree = match tree {
            Some(mut t) => {
                t.locate(self.recipe.refs()?)?;
                Some(t)
            }
            None => None,
        };
        self.recipe.store(backend)?;
        let written: Vec<String> = (0..parts)
            .map(|p| cat_key(&lineage.name, v, v, p))
            .collect();
        lineage.update_parts(backend, &[], &written)?;
        lineage.state.versions.push(Version {
            version: v,
            backup: self.id,
        });
        lineage.save(backend)?;
        let logical = self.logical;
        let stats = BackupStats {
            logical_bytes: logical,
            stored_bytes: self.unique.bytes,
            chunks: self.recipe.chunks(),
            unique_chunks: self.unique.chunks,
            unique: self.unique,
            internal_duplicates: self.internal,
            duplicates: self.adjacent,
            containers_written: 1,
            dedup_ratio: crate::util::units::ratio(logical, self.unique.bytes),
            stage_seconds: StageSeconds {
                index: self.index_time.as_secs_f64(),
                store: self.store_time.as_secs_f64(),
                write: write_time.as_secs_f64(),
                commit: commit_started.elapsed().as_secs_f64(),
                ..StageSeconds::default()
            },
            index: index_stats,
            compression: CompressionStats::new(encoding, &encoded),
            ..BackupStats::default()
        };
        let snap = Snapshot {
            id: self.id,
            time: options.time.unwrap_or_else(now),
            label: options.label.clone(),
            source: options.source.clone(),
            host: options.host.clone(),
            tags: options.tags.clone(),
            logical_bytes: logical,
            stats,
            tree,
        };
        Ok(snap)
    }
}

/// Seconds since the epoch, now.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Arranges `lineage` after its committed backup `snap` when the
/// configuration says so and no other process reads the repository.
fn arrange_after(
    repo: &Repository,
    lineage: &mut Lineage,
    snap: Snapshot,
    sort_budget: u64,
) -> Result<Outcome> {
    let due = repo.config().arrange == Arrange::Auto;
    let may_arrange = due && repo.exclude_readers()?;
    let arrange = match may_arrange {
        // The backup is committed: a damaged object arranging must read
        // defers arranging (an interrupted round, resumed later) instead
        // of failing the backup.
        true => match arrange_lineage(
            repo,
            lineage,
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
    Ok(Outcome {
        arrange_deferred: due && arrange.is_none(),
        arrange,
        ..Outcome::of(snap)
    })
}
