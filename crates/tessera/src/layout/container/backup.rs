//! The container log's back end of a backup: asks the index about each
//! chunk, applies the rewriting policy (and delta compression), fills
//! containers, writes them in the background (several at once), and
//! commits: containers, then the index, recipe and policy state, then the
//! snapshot (docs/FORMAT.md §15). A shared backup commits in the commit
//! section (§13.3).

use crate::backend::Backend;
use crate::backup::options::BackupOptions;
use crate::delta::stage::DeltaStage;
use crate::delta::{DeltaKind, DeltaStats};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::compression::{Compression, CompressionStats, EncodeCounts};
use crate::format::dictionary::Dictionary;
use crate::format::envelope;
use crate::format::snapshot::{
    BackupId, BackupStats, ChunkRef, ClassCount, RecipeWriter, Snapshot, StageSeconds, TreeRef,
};
use crate::index::{table, Chunk, Decision, DedupIndex, Reorder};
use crate::layout::container::{self, AlignedBuf, Builder, ContainerId};
use crate::layout::stream::{refetch_bytes, ChunkStream, Refetch};
use crate::repo::quarantine::Quarantined;
use crate::repo::Repository;
use crate::rewrite::{RewriteFilter, Verdict};
use crate::util::spill::SpillMap;
use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver, Sender};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Full containers queued for the writers.
const CONTAINER_QUEUE_DEPTH: usize = 2;

/// Threads writing sealed containers to a backend without a setting of its
/// own. Each write is synced on its own, so several in flight keep the
/// device busy while others wait for their sync; an object store writes
/// `--connections` at once ([`crate::backend::Hints::connections`]).
const WRITERS: usize = 4;

/// Memory for the map of where this backup stored its chunks, beyond
/// which it spills to a temporary file (about 2.5 MiB of map per GiB of new
/// data at 8 KiB chunks).
const HERE_BUDGET: u64 = 8 << 20;

/// The container layout: deduplicate, rewrite, fill containers, commit.
pub(crate) fn backup(
    repo: &Repository,
    stream: ChunkStream,
    options: &BackupOptions,
) -> Result<Snapshot> {
    let started = Instant::now();
    let io_before = repo.io_stats();
    let config = repo.config().clone();
    let ChunkStream {
        chunks: chunk_rx,
        facts,
        refetch,
        join_front,
    } = stream;
    // A shared backup's id is taken at its commit (FORMAT.md §13.3).
    let id = repo.next_backup_id()?;
    let (mut index, first_ids) = open_index_and_ids(repo)?;
    let more_ids = || -> Result<std::ops::Range<ContainerId>> {
        let _section = repo.commit_section()?;
        repo.reserve_containers(CONTAINER_BLOCK)
    };
    let train = |samples: &[&[u8]]| repo.train_dictionary(samples);
    let find_dictionary = || repo.dictionary();
    let history_key = rewrite_history_key(&options.source);
    let history = read_history(repo, &history_key)?;
    let mut filter = config
        .rewrite
        .build(u64::from(config.container_size), history.as_deref());
    let next_container = first_ids.start;
    let encoding = config.backup_encoding(options.compression)?;
    let backend = repo.shared_backend();
    let (delta, readahead) = open_delta_stage(repo, &config, options, index.as_mut())?;

    let stop = AtomicBool::new(false);
    let (container_tx, container_rx) = bounded::<Builder>(CONTAINER_QUEUE_DEPTH);
    // Data buffers of written containers, reused by the next ones.
    let writers = backend.connections().unwrap_or(WRITERS).max(1);
    let (spare_tx, spare_rx) = bounded::<AlignedBuf>(writers + CONTAINER_QUEUE_DEPTH);

    let mut recipe = RecipeWriter::new(id)?;
    let mut totals = std::thread::scope(|s| -> Result<StoreTotals> {
        if !readahead.is_empty() {
            // The index reads nearly all of them whole, when it meets their
            // chunks: have their transfer overlap the work until then (on a
            // thread of its own, as opening each file takes a while).
            s.spawn(|| backend.will_read(&readahead));
        }
        let writers: Vec<_> = (0..writers)
            .map(|_| {
                let (backend, rx, stop) = (backend.as_ref(), container_rx.clone(), &stop);
                let spare = spare_tx.clone();
                s.spawn(move || write_containers(backend, rx, spare, stop))
            })
            .collect();
        drop(container_rx);
        let mut store = Store::new(
            next_container,
            config.container_size as usize,
            config.trace,
            container_tx,
            spare_rx,
            delta,
            refetch,
        );
        store.quarantine = crate::repo::quarantine::load(repo.backend().as_ref())?;
        store.whole_from = Some(&facts.whole_from);
        store.ids_end = first_ids.end;
        store.more_ids = Some(&more_ids);
        store.encoding = encoding;
        // The dictionary is read when the first container is opened: a
        // backup that stores nothing never reads it.
        store.find_dictionary = Some(&find_dictionary);
        if repo.wants_dictionary(encoding) && !config.trace {
            store.train = Some(&train);
        }
        // Containers that are encoded or encrypted anyway hold their chunks
        // (copied out of their read blocks while most recent chunks are
        // duplicates: [`Recent::sparse`]) and encode them when written,
        // straight into the object, instead of filling a buffer that is
        // encoded into a second one.
        store.hold = encoding.is_some() || repo.backend().transforms_objects();
        let stored = store_chunks(
            index.as_mut(),
            filter.as_mut(),
            &mut store,
            &mut recipe,
            chunk_rx,
            options,
            config.rewrite.kind != crate::rewrite::RewriteKind::None,
        );
        // Close the container queue whatever happened, so that the writers end.
        let totals = store.finish();
        // Join every writer, then report the first error or, as the writers
        // run in parallel, the busiest one's time.
        let written = join_writers(writers);
        // Report the earliest stage's error: a failing input explains the rest.
        let (read_time, hash_time) = (join_front)()?;
        let (write_time, encoded) = written?;
        stored?;
        let mut totals = totals?;
        totals.read_time = read_time;
        totals.hash_time = hash_time;
        totals.write_time = write_time;
        totals.encoded = encoded;
        Ok(totals)
    })?;

    let commit_started = Instant::now();
    index.finish(&mut Vec::new())?;
    let logical_bytes = recipe.logical_bytes();
    let tree = located(facts.tree.get().cloned(), &mut recipe)?;
    let history = learn_history(repo, filter.as_mut(), &mut recipe)?;
    let delta = totals.delta.take();
    let delta_stats = delta.as_ref().map_or_else(no_delta, DeltaStage::stats);
    // A shared backup commits its index entries and takes its id in the
    // commit section, against the index as other backups left it.
    let (section, id) = enter_commit(repo, index.as_mut(), &mut recipe, id)?;
    let history = history.map(|h| (history_key.as_str(), h));
    let own_recipe = section.is_none();
    write_commit(
        repo,
        index.as_mut(),
        &mut recipe,
        own_recipe,
        history,
        delta,
        totals.next_container,
    )?;
    drop(section);

    let stats = container_stats(
        &totals,
        logical_bytes,
        recipe.chunks(),
        index.as_ref(),
        delta_stats,
        encoding,
    );
    let mut snap = new_snapshot(id, options, logical_bytes, stats, tree);
    snap.stats.stage_seconds.commit = commit_started.elapsed().as_secs_f64();
    snap.stats.stage_seconds.commit_lock = repo.commit_lock_waited().as_secs_f64();
    snap.stats.seconds = started.elapsed().as_secs_f64();
    snap.stats.throughput_mb_s = logical_bytes as f64 / 1e6 / snap.stats.seconds.max(1e-9);
    snap.stats.record_io(&repo.io_stats().since(&io_before));
    repo.commit_snapshot(&snap)?;
    Ok(snap)
}

/// The rewriting policy's history of earlier backups of the source, if any.
fn read_history(repo: &Repository, key: &str) -> Result<Option<Vec<u8>>> {
    match repo.backend().read(key) {
        Ok(bytes) => Ok(envelope::open(key, HISTORY_KIND, HISTORY_VERSION, &bytes)
            .ok()
            .map(<[u8]>::to_vec)),
        Err(Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The delta stage of the configuration (if any) and the keys of the
/// containers the index will read whole for PFC-delta, to be read ahead.
fn open_delta_stage(
    repo: &Repository,
    config: &crate::repo::config::Config,
    options: &BackupOptions,
    index: &mut dyn DedupIndex,
) -> Result<(Option<DeltaStage>, Vec<String>)> {
    let delta = DeltaStage::open(
        repo.shared_backend(),
        config.delta,
        repo.fingerprinter().clone(),
        if config.rewrite.kind == crate::rewrite::RewriteKind::Har {
            2
        } else {
            1
        },
        &options.source,
    )?;
    let mut readahead = Vec::new();
    if let Some(d) = &delta {
        let prefetch = d.prefetch_set();
        let mut keys: Vec<String> = prefetch.iter().map(|&c| container::key(c)).collect();
        if index.piggyback(prefetch) {
            keys.sort_unstable();
            readahead = keys;
        }
    }
    Ok((delta, readahead))
}

/// Joins every container writer: the first error or, as the writers run
/// in parallel, the busiest one's time, and what they encoded.
fn join_writers(
    writers: Vec<std::thread::ScopedJoinHandle<'_, Result<(Duration, EncodeCounts)>>>,
) -> Result<(Duration, EncodeCounts)> {
    let written: Vec<_> = writers
        .into_iter()
        .map(|w| crate::util::join_stage(w, "container writer"))
        .collect();
    let mut encoded = EncodeCounts::default();
    let time = written.into_iter().try_fold(Duration::ZERO, |acc, r| {
        r.map(|(t, counts)| {
            encoded.add(&counts);
            acc.max(t)
        })
    })?;
    Ok((time, encoded))
}

/// Has the rewriting policy learn from the backup's recipe: its new
/// history, sealed, if it keeps one.
fn learn_history(
    repo: &Repository,
    filter: &mut dyn RewriteFilter,
    recipe: &mut RecipeWriter,
) -> Result<Option<Vec<u8>>> {
    let container_bytes = if filter.needs_container_sizes() {
        container_sizes(repo.backend().as_ref(), recipe)?
    } else {
        HashMap::new()
    };
    let mut failed = None;
    let history = filter
        .learn(
            &mut recipe
                .refs()?
                .map_while(|r| r.map_err(|e| failed = Some(e)).ok()),
            &container_bytes,
        )
        .map(|state| envelope::seal(HISTORY_KIND, HISTORY_VERSION, &state));
    match failed {
        Some(e) => Err(e),
        None => Ok(history),
    }
}

/// The tree a segmented source held, with its catalog located in the recipe.
fn located(tree: Option<TreeRef>, recipe: &mut RecipeWriter) -> Result<Option<TreeRef>> {
    match tree {
        Some(mut t) => {
            t.locate(recipe.refs()?)?;
            Ok(Some(t))
        }
        None => Ok(None),
    }
}

/// The delta statistics of a backup without delta compression.
fn no_delta() -> DeltaStats {
    DeltaStats {
        policy: DeltaKind::None.name().into(),
        ..DeltaStats::default()
    }
}

/// Writes what a backup's snapshot needs besides its containers: the
/// index, the recipe (`own_recipe`: unless the commit section stored it),
/// the rewrite history and the delta state. Each needs only the containers,
/// durable by now: they are written concurrently (each durably), all
/// before the snapshot.
fn write_commit(
    repo: &Repository,
    index: &mut dyn DedupIndex,
    recipe: &mut RecipeWriter,
    own_recipe: bool,
    history: Option<(&str, Vec<u8>)>,
    delta: Option<DeltaStage>,
    next_container: ContainerId,
) -> Result<()> {
    let backend = repo.backend();
    std::thread::scope(|s| -> Result<()> {
        let recipe_write = own_recipe.then(|| s.spawn(|| recipe.store(backend.as_ref())));
        let history_write = history
            .as_ref()
            .map(|(key, h)| s.spawn(|| backend.write(key, h)));
        let delta_write = delta.map(|d| s.spawn(|| d.commit()));
        let here = index.commit(next_container);
        let recipe_written =
            recipe_write.map_or(Ok(()), |r| crate::util::join_stage(r, "recipe writer"));
        let history_written =
            history_write.map_or(Ok(()), |h| crate::util::join_stage(h, "history writer"));
        let delta_written =
            delta_write.map_or(Ok(()), |d| crate::util::join_stage(d, "delta state writer"));
        here.and(recipe_written)
            .and(history_written)
            .and(delta_written)
    })
}

/// The statistics of a container-layout backup from what its store counted.
fn container_stats(
    totals: &StoreTotals,
    logical_bytes: u64,
    chunks: u64,
    index: &dyn DedupIndex,
    delta_stats: DeltaStats,
    encoding: Option<Compression>,
) -> BackupStats {
    let stored_bytes =
        (totals.unique.bytes + totals.rewritten.bytes).saturating_sub(delta_stats.bytes_saved);
    BackupStats {
        logical_bytes,
        stored_bytes,
        chunks,
        unique_chunks: totals.unique.chunks,
        unique: totals.unique,
        internal_duplicates: totals.internal,
        duplicates: totals.duplicates,
        rewritten: totals.rewritten,
        containers_written: totals.containers_written,
        dedup_ratio: crate::util::units::ratio(logical_bytes, stored_bytes),
        stage_seconds: StageSeconds {
            chunk: totals.read_time.as_secs_f64(),
            fingerprint: totals.hash_time.as_secs_f64(),
            index: totals.index_time.as_secs_f64(),
            store: totals.store_time.as_secs_f64(),
            write: totals.write_time.as_secs_f64(),
            ..StageSeconds::default()
        },
        index: index.stats(),
        delta: delta_stats,
        compression: CompressionStats::new(encoding, &plain_counts(totals, encoding)),
        ..BackupStats::default()
    }
}

/// The snapshot of backup `id` of `options`' source, before its timings.
fn new_snapshot(
    id: BackupId,
    options: &BackupOptions,
    logical_bytes: u64,
    stats: BackupStats,
    tree: Option<TreeRef>,
) -> Snapshot {
    let snap_time = options.time.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    Snapshot {
        id,
        time: snap_time,
        label: options.label.clone(),
        source: options.source.clone(),
        host: options.host.clone(),
        tags: options.tags.clone(),
        logical_bytes,
        stats,
        tree,
    }
}

/// Opens the index and takes the first container ids: a shared backup
/// does both in the commit section (FORMAT.md §13.3), so that no other
/// writer writes index objects or takes those ids meanwhile, and gets a
/// block of ids; a backup alone numbers its containers from the next id on.
fn open_index_and_ids(
    repo: &Repository,
) -> Result<(Box<dyn DedupIndex>, std::ops::Range<ContainerId>)> {
    let section = repo.commit_section()?;
    let index = repo.open_index()?;
    let ids = match section.is_some() {
        true => repo.reserve_containers(CONTAINER_BLOCK)?,
        false => repo.next_container_id()?..ContainerId::MAX,
    };
    Ok((index, ids))
}

/// Enters the commit of a backup whose id would be `id` alone: a shared
/// backup takes the commit lock (returned, held until its index is
/// committed), rebases its index on what other backups committed, and
/// takes its id by storing its recipe (FORMAT.md §13.3).
fn enter_commit(
    repo: &Repository,
    index: &mut dyn DedupIndex,
    recipe: &mut RecipeWriter,
    id: BackupId,
) -> Result<(Option<crate::backend::LockGuard>, BackupId)> {
    let Some(section) = repo.commit_section()? else {
        return Ok((None, id));
    };
    index.rebase()?;
    let id = store_recipe_at_free_id(repo, recipe)?;
    Ok((Some(section), id))
}

/// Stores `recipe` under the lowest free backup id (FORMAT.md §13.3): the
/// id after every one recorded, or the next while another writer created
/// a recipe of that id meanwhile. Returns the id.
fn store_recipe_at_free_id(repo: &Repository, recipe: &mut RecipeWriter) -> Result<BackupId> {
    let mut id = repo.next_backup_id()?;
    for _ in 0..ID_ATTEMPTS {
        recipe.set_backup(id);
        match recipe.store(repo.backend().as_ref()) {
            Err(Error::ObjectExists(_)) => id = repo.next_backup_id()?.max(id + 1),
            stored => return stored.map(|()| id),
        }
    }
    Err(Error::Pipeline(format!(
        "{}: no free backup id found after {ID_ATTEMPTS} attempts",
        repo.backend().location()
    )))
}

/// The data bytes of every container `recipe` names (read from their headers).
fn container_sizes(
    backend: &dyn Backend,
    recipe: &mut RecipeWriter,
) -> Result<HashMap<ContainerId, u64>> {
    let mut sizes = HashMap::new();
    for c in recipe.refs()? {
        let c = c?.container;
        if let std::collections::hash_map::Entry::Vacant(e) = sizes.entry(c) {
            let head = backend.read_range(&container::key(c), 0, container::HEADER_LEN as u64)?;
            e.insert(u64::from(container::Header::parse(c, &head)?.data_len));
        }
    }
    Ok(sizes)
}

/// Envelope kind and version of a rewrite policy's history (HAR's sparse containers).
const HISTORY_KIND: &[u8; 4] = b"RWHI";

const HISTORY_VERSION: u32 = 1;

/// Key of the rewrite history of source lineage `source` (hex of its name).
pub fn rewrite_history_key(source: &str) -> String {
    format!("rewrite/s{}", crate::util::source_key::source_hex(source))
}

/// The encoder's counts of a backup, or (in a repository that stores
/// chunks as they are) the stored entries counted as raw and unchanged.
fn plain_counts(totals: &StoreTotals, encoding: Option<Compression>) -> EncodeCounts {
    match encoding {
        Some(_) => totals.encoded,
        None => EncodeCounts {
            raw: totals.entries,
            bytes_in: totals.entry_bytes,
            bytes_out: totals.entry_bytes,
            ..EncodeCounts::default()
        },
    }
}

/// Stage 4 (background, [`WRITERS`] threads or `--connections`): seals full containers
/// (compressing their entries in a compressing repository) and writes each
/// atomically. After a failure the other writers stop too; the backup then
/// fails before anything refers to the containers. Returns the time it was
/// busy and what it encoded.
fn write_containers(
    backend: &dyn Backend,
    rx: Receiver<Builder>,
    spare: Sender<AlignedBuf>,
    stop: &AtomicBool,
) -> Result<(Duration, EncodeCounts)> {
    let mut busy = Duration::ZERO;
    let mut encoded = EncodeCounts::default();
    for builder in rx {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        let written = builder.write_new(backend);
        busy += t.elapsed();
        match written {
            Ok((counts, data)) => {
                encoded.add(&counts);
                // Hand the data buffer back for the next container (dropped if enough are spare).
                if let Some(buf) = data {
                    let _ = spare.try_send(buf);
                }
            }
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
    }
    Ok((busy, encoded))
}

/// Stage 3: asks the index, restores stream order, applies the rewrite
/// filter, fills containers and builds the recipe. Duplicates keep their
/// bytes only when `keep_duplicate_data` (a rewriting policy may store them).
fn store_chunks(
    index: &mut dyn DedupIndex,
    filter: &mut dyn RewriteFilter,
    store: &mut Store,
    recipe: &mut RecipeWriter,
    rx: Receiver<Vec<Chunk>>,
    options: &BackupOptions,
    keep_duplicate_data: bool,
) -> Result<()> {
    let mut reorder = Reorder::default();
    let mut decided = Vec::new();
    let mut ready = Vec::new();
    let mut verdicts = Vec::new();
    let mut done_bytes = 0u64;
    let mut batches = rx.into_iter();
    loop {
        let next = batches.next();
        let t = Instant::now();
        let last = match next {
            Some(batch) => {
                index.submit(batch, &mut decided)?;
                false
            }
            None => {
                index.finish(&mut decided)?;
                true
            }
        };
        if !keep_duplicate_data {
            // A duplicate is never stored again (unless its copy is
            // quarantined): drop its bytes now, so that decisions waiting
            // for an earlier one (a lazy index) hold only metadata.
            for (chunk, decision) in &mut decided {
                let keep = match *decision {
                    Decision::Unique => true,
                    Decision::Duplicate(c) => store.quarantined(c, &chunk.fp),
                    Decision::InternalDuplicate => false,
                };
                if !keep {
                    chunk.data = None;
                }
            }
        }
        reorder.push(decided.drain(..), &mut ready);
        store.totals.index_time += t.elapsed();
        if let Some(d) = &mut store.delta {
            let mut whole = Vec::new();
            index.take_piggybacked(&mut whole);
            d.offer(whole);
        }

        let t = Instant::now();
        for (chunk, decision) in ready.drain(..) {
            filter.push(chunk, decision, &mut verdicts);
        }
        if last {
            filter.finish(&mut verdicts);
        }
        let placed_before = store.placed.len();
        for v in verdicts.drain(..) {
            let offset = done_bytes;
            done_bytes += u64::from(v.chunk.len);
            recipe.push(&store.put(v, offset)?)?;
        }
        store.totals.store_time += t.elapsed();
        let t = Instant::now();
        index.placed(&store.placed[placed_before..])?;
        store.placed.clear();
        store.totals.index_time += t.elapsed();
        if let Some(progress) = options.progress {
            progress(done_bytes);
        }
        if last {
            break;
        }
    }
    if reorder.waiting() > 0 {
        return Err(Error::Pipeline(format!(
            "index left {} chunks undecided",
            reorder.waiting()
        )));
    }
    Ok(())
}

/// Fills containers with the chunks to store and remembers where this
/// backup's chunks went (for internal duplicates and rewritten chunks).
struct Store<'a> {
    open: Option<Builder>,
    next_container: ContainerId,
    capacity: usize,
    trace: bool,
    /// Containers' entries are encoded under this setting (`None`: stored
    /// as they are).
    encoding: Option<Compression>,
    /// Whether containers hold their chunks by reference until written
    /// ([`Builder::holding`]).
    hold: bool,
    tx: Sender<Builder>,
    spare: Receiver<AlignedBuf>,
    /// Where this backup stored each chunk (spilled past [`HERE_BUDGET`]).
    here: SpillMap,
    placed: Vec<(Fingerprint, ContainerId)>,
    /// Delta compression of the chunks stored (when configured).
    delta: Option<DeltaStage>,
    /// The bytes of reused chunks (given without them) that must be stored.
    refetch: Option<&'a dyn Refetch>,
    /// Chunks known damaged (FORMAT.md §10.8): a duplicate of one is stored again.
    quarantine: HashMap<ContainerId, Quarantined>,
    /// The sequence number of the stream's first whole segment
    /// ([`SegmentRead::Whole`]), set by the chunking stage: it and the
    /// chunks after it (a tree's catalog and index) are never stored as deltas.
    whole_from: Option<&'a AtomicU64>,
    /// The end of the container ids reserved for this backup (a shared
    /// backup's block; `ContainerId::MAX` otherwise), and how to reserve
    /// the next block when they are used up (FORMAT.md §13.3).
    ids_end: ContainerId,
    more_ids: Option<&'a MoreIds<'a>>,
    /// The compression dictionary entries are compressed with (FORMAT.md §7.8).
    dictionary: Option<Arc<Dictionary>>,
    /// Finds the repository's dictionary when the first container is
    /// opened (taken then: asked once).
    find_dictionary: Option<&'a FindDictionary<'a>>,
    /// Trains and stores a dictionary from the entries of the first
    /// container sealed, when the repository wants one.
    train: Option<&'a TrainDictionary<'a>>,
    /// How much of the recent chunks' bytes this backup stores.
    recent: Recent,
    /// Containers sealed while the dictionary is still to be trained
    /// (at most [`TRAIN_CONTAINERS`]): written once it is.
    pending: Vec<Builder>,
    totals: StoreTotals,
}

/// Containers a backup that trains a dictionary fills before training it
/// from their entries (FORMAT.md §7.8).
const TRAIN_CONTAINERS: usize = 4;

/// Trains and stores a compression dictionary from samples.
type TrainDictionary<'a> = dyn Fn(&[&[u8]]) -> Result<Option<Arc<Dictionary>>> + 'a;

/// The repository's compression dictionary, read when first needed.
type FindDictionary<'a> = dyn Fn() -> Result<Option<Arc<Dictionary>>> + 'a;

/// Bytes of the chunks met lately, and of those stored, both halved as
/// they pass [`RECENT_BYTES`]: whether a held chunk is copied out of its
/// read block ([`Recent::sparse`]).
#[derive(Default)]
struct Recent {
    seen: u64,
    stored: u64,
}

/// See [`Recent`].
const RECENT_BYTES: u64 = 16 << 20;

impl Recent {
    fn seen(&mut self, len: u32) {
        self.seen += u64::from(len);
        if self.seen > RECENT_BYTES {
            self.seen /= 2;
            self.stored /= 2;
        }
    }

    fn stored(&mut self, len: u32) {
        self.stored += u64::from(len);
    }

    /// Whether under half of the recent bytes are stored. A chunk held by
    /// reference keeps its whole 1 MiB read block alive until its
    /// container is written: where most chunks are duplicates, the
    /// containers in flight pinned blocks of chunks they do not store
    /// (encrypted 0.9 GB tree of 78 Redis versions: peak 170–188 MiB, plain
    /// 66–74), so the chunk is copied out instead (93 MiB). Where most
    /// are stored, the blocks are needed anyway and the copy is saved.
    fn sparse(&self) -> bool {
        self.stored * 2 < self.seen
    }
}

/// Reserves the next block of container ids of a shared backup.
type MoreIds<'a> = dyn Fn() -> Result<std::ops::Range<ContainerId>> + 'a;

/// Container ids a shared backup reserves at once (FORMAT.md §13.3).
const CONTAINER_BLOCK: u64 = 256;

/// Backup ids a shared backup tries at its commit before it gives up (each
/// taken meanwhile by another writer).
const ID_ATTEMPTS: usize = 1000;

/// Counters and timings of a backup's stages.
#[derive(Default)]
struct StoreTotals {
    next_container: ContainerId,
    unique: ClassCount,
    internal: ClassCount,
    duplicates: ClassCount,
    rewritten: ClassCount,
    containers_written: u64,
    index_time: Duration,
    store_time: Duration,
    read_time: Duration,
    hash_time: Duration,
    write_time: Duration,
    /// Entries stored (chunks or deltas) and their bytes, before encoding.
    entries: u64,
    entry_bytes: u64,
    /// What the container writers encoded.
    encoded: EncodeCounts,
    /// The delta stage, handed back for its counters and commit.
    delta: Option<DeltaStage>,
}

impl<'a> Store<'a> {
    fn new(
        next_container: ContainerId,
        capacity: usize,
        trace: bool,
        tx: Sender<Builder>,
        spare: Receiver<AlignedBuf>,
        delta: Option<DeltaStage>,
        refetch: Option<&'a dyn Refetch>,
    ) -> Self {
        Store {
            open: None,
            next_container,
            capacity,
            trace,
            encoding: None,
            hold: false,
            tx,
            spare,
            here: SpillMap::with_budget(HERE_BUDGET, table::order_key),
            placed: Vec::new(),
            delta,
            refetch,
            quarantine: HashMap::new(),
            whole_from: None,
            ids_end: ContainerId::MAX,
            more_ids: None,
            dictionary: None,
            find_dictionary: None,
            train: None,
            pending: Vec::new(),
            recent: Recent::default(),
            totals: StoreTotals::default(),
        }
    }

    /// Whether the copy of `fp` in container `c` is known damaged.
    fn quarantined(&self, c: ContainerId, fp: &Fingerprint) -> bool {
        crate::repo::quarantine::is_quarantined(&self.quarantine, c, fp)
    }

    /// Records one chunk with its verdict, storing it if it is unique or rewritten.
    /// `offset`: where the chunk starts in the stream.
    fn put(&mut self, v: Verdict, offset: u64) -> Result<ChunkRef> {
        let Verdict {
            chunk,
            decision,
            rewrite,
        } = v;
        self.recent.seen(chunk.len);
        // A duplicate already rewritten earlier in this stream uses that copy.
        let here = match decision {
            Decision::Unique => None,
            Decision::Duplicate(_) | Decision::InternalDuplicate => self.here.get(&chunk.fp)?,
        };
        let container = match (decision, here) {
            (Decision::Duplicate(_) | Decision::InternalDuplicate, Some(c)) => {
                self.totals.internal.add(chunk.len);
                c
            }
            // Never reference a copy known damaged: store the chunk again.
            (Decision::Duplicate(c), None) if self.quarantined(c, &chunk.fp) => {
                self.totals.unique.add(chunk.len);
                self.store(chunk.clone(), None, offset)?
            }
            (Decision::Duplicate(found_in), None) if rewrite => {
                self.totals.rewritten.add(chunk.len);
                let stored_in = self.store(chunk.clone(), Some(found_in), offset)?;
                if let Some(d) = &mut self.delta {
                    d.fragmented(found_in, stored_in);
                }
                stored_in
            }
            (Decision::Duplicate(c), None) => {
                self.totals.duplicates.add(chunk.len);
                if let Some(d) = &mut self.delta {
                    d.referenced(c);
                }
                c
            }
            (Decision::InternalDuplicate, None) => {
                return Err(Error::Pipeline(format!(
                    "chunk {} decided an internal duplicate before its first occurrence",
                    chunk.seq
                )))
            }
            (Decision::Unique, _) => {
                self.totals.unique.add(chunk.len);
                self.store(chunk.clone(), None, offset)?
            }
        };
        Ok(ChunkRef {
            fp: chunk.fp,
            len: chunk.len,
            container,
        })
    }

    /// Appends a chunk to the open container (lengths only in trace
    /// repositories), as a delta when the delta stage finds a good base.
    /// `old_copy`: the container of the copy a rewritten chunk duplicates.
    fn store(
        &mut self,
        mut chunk: Chunk,
        old_copy: Option<ContainerId>,
        offset: u64,
    ) -> Result<ContainerId> {
        if chunk.data.is_none() && !self.trace {
            // A reused chunk that must be stored after all: fetch its bytes.
            let bytes = refetch_bytes(self.refetch, offset, &chunk.fp, chunk.len, chunk.seq)?;
            chunk.data = Some(Bytes::from(bytes));
        }
        let chunk = &chunk;
        let data = match (&chunk.data, self.trace) {
            (Some(d), false) => Some(d.as_ref()),
            (None, true) => None,
            _ => {
                return Err(Error::Pipeline(format!(
                    "chunk {} has {} data in a {} repository",
                    chunk.seq,
                    if chunk.data.is_some() { "" } else { "no" },
                    if self.trace { "trace" } else { "data" }
                )))
            }
        };
        let catalog = self
            .whole_from
            .is_some_and(|w| chunk.seq >= w.load(Ordering::Acquire));
        let (compressed, features) = match (&mut self.delta, data) {
            (Some(d), Some(bytes)) if !catalog => d.compress(&chunk.fp, bytes, old_copy)?,
            _ => (None, None),
        };
        let len = compressed
            .as_ref()
            .map_or(chunk.len as usize, |c| c.delta.len());
        if self.open.as_ref().is_some_and(|b| !b.fits(len)) {
            self.seal()?;
        }
        let deltas = self.delta.is_some();
        let builder = match &mut self.open {
            Some(b) => b,
            None => {
                let mut b = if self.trace {
                    Builder::without_data(self.next_container, self.capacity)
                } else if self.hold {
                    Builder::new(self.next_container, self.capacity).holding()
                } else {
                    match self.spare.try_recv() {
                        Ok(buf) => Builder::with_buffer(self.next_container, self.capacity, buf),
                        Err(_) => Builder::new(self.next_container, self.capacity),
                    }
                };
                if deltas {
                    b = b.with_deltas();
                }
                if let Some(setting) = self.encoding {
                    if let Some(find) = self.find_dictionary.take() {
                        if self.train.is_none() {
                            self.dictionary = find()?;
                        }
                    }
                    b = b
                        .with_encoding(setting)
                        .with_dictionary(self.dictionary.clone());
                }
                self.next_container += 1;
                if self.next_container >= self.ids_end {
                    // This block is used up (its last id is the builder's):
                    // the next container takes the next block's first.
                    let more = self.more_ids.ok_or_else(|| {
                        Error::Pipeline(
                            "container ids used up without a way to reserve more".into(),
                        )
                    })?;
                    let block = more()?;
                    self.next_container = block.start;
                    self.ids_end = block.end;
                }
                self.open.insert(b)
            }
        };
        self.recent.stored(chunk.len);
        let whole = compressed.is_none();
        if data.is_some() {
            self.totals.entries += 1;
            self.totals.entry_bytes += len as u64;
        }
        match (&chunk.data, compressed) {
            (_, Some(c)) => builder.push_delta(chunk.fp, &c.delta, c.base)?,
            (Some(d), None) if self.hold && self.recent.sparse() => {
                builder.push_shared(chunk.fp, &Bytes::copy_from_slice(d), features)
            }
            (Some(d), None) => builder.push_shared(chunk.fp, d, features),
            (None, None) => builder.push_len(chunk.fp, chunk.len),
        }
        let c = builder.id();
        if let (true, Some(d)) = (whole, &mut self.delta) {
            d.stored_whole(chunk.fp, c, features);
        }
        self.here.set(chunk.fp, c)?;
        self.placed.push((chunk.fp, c));
        Ok(c)
    }

    fn seal(&mut self) -> Result<()> {
        if let Some(mut b) = self.open.take() {
            if let Some(d) = &mut self.delta {
                d.seal(&mut b);
            }
            self.totals.containers_written += 1;
            if self.train.is_some() && !self.trace {
                self.pending.push(b);
                if self.pending.len() >= TRAIN_CONTAINERS {
                    self.train_dictionary()?;
                }
                return Ok(());
            }
            self.send(b)?;
        }
        Ok(())
    }

    /// Hands a sealed container to the writers, which serialise it off
    /// this thread.
    fn send(&self, b: Builder) -> Result<()> {
        self.tx
            .send(b)
            .map_err(|_| Error::Pipeline("container writer stopped".into()))
    }

    /// Trains the repository's compression dictionary (FORMAT.md §7.8)
    /// from the entries of the containers held back for it, sets it on
    /// them (and on the open one) and hands them to the writers.
    fn train_dictionary(&mut self) -> Result<()> {
        let Some(train) = self.train.take() else {
            return Ok(());
        };
        let pending = std::mem::take(&mut self.pending);
        let samples: Vec<&[u8]> = pending.iter().flat_map(Builder::whole_entries).collect();
        self.dictionary = train(&samples)?;
        drop(samples);
        if let Some(open) = &mut self.open {
            open.set_dictionary(self.dictionary.clone());
        }
        for mut b in pending {
            b.set_dictionary(self.dictionary.clone());
            self.send(b)?;
        }
        Ok(())
    }

    /// Seals the last container and closes the queue to the writer.
    fn finish(mut self) -> Result<StoreTotals> {
        self.seal()?;
        self.train_dictionary()?;
        self.totals.next_container = self.next_container;
        self.totals.delta = self.delta;
        Ok(self.totals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_chunks_are_copied_where_most_recent_bytes_are_duplicates() {
        let mut r = Recent::default();
        // A fresh stream: everything stored, the read blocks kept anyway.
        for _ in 0..4096 {
            r.seen(8192);
            r.stored(8192);
        }
        assert!(!r.sparse());
        // Then mostly duplicates: one chunk in four stored.
        for i in 0..4096 {
            r.seen(8192);
            if i % 4 == 0 {
                r.stored(8192);
            }
        }
        assert!(r.sparse());
        // The window stays bounded, so the stream's start is forgotten.
        assert!(r.seen <= RECENT_BYTES);
        // And stored data again turns the copies off.
        for _ in 0..4096 {
            r.seen(8192);
            r.stored(8192);
        }
        assert!(!r.sparse());
    }
}
