//! The backup pipeline: read → chunk and fingerprint (in parallel, blocks
//! cut speculatively and stitched in order: [`fused`]) → deduplicate → fill
//! containers → seal and write containers (background, several at once) →
//! commit.
//!
//! Stages run on their own threads connected by bounded channels, so memory
//! stays within a few blocks and containers whatever the input size. Input
//! blocks are small (they stay in the CPU cache from one stage to the next)
//! and their buffers are recycled. Commit order (docs/FORMAT.md §15):
//! containers (all durable, in any order), then the index, the recipe and
//! the policy state (concurrently), then the snapshot; a backup interrupted
//! anywhere before the snapshot write is invisible.

use crate::backend::{Backend, LockMode};
use crate::backup::refetch::{refetch_bytes, Refetch};
use crate::chunker::{cut_all, Chunker};
use crate::delta::stage::DeltaStage;
use crate::delta::{DeltaKind, DeltaStats};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::fingerprint::{BatchHasher, Fingerprinter};
use crate::format::compression::{Compression, CompressionStats, EncodeCounts};
use crate::format::dictionary::Dictionary;
use crate::format::envelope;
use crate::format::snapshot::{
    BackupId, BackupStats, ChunkRef, ClassCount, RecipeWriter, Snapshot, StageSeconds, TreeRef,
};
use crate::index::{table, Chunk, Decision, DedupIndex, Reorder};
use crate::layout::container::{self, AlignedBuf, Builder, ContainerId};
use crate::layout::lifecycle::{self, ArrangeStats, LifecycleBackupOptions};
use crate::repo::config::Layout;
use crate::repo::quarantine::Quarantined;
use crate::repo::Repository;
use crate::rewrite::{RewriteFilter, Verdict};
use crate::util::spill::SpillMap;
use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver, Select, Sender};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod fused;
pub mod refetch;

/// Bytes read from the input per block (at least four maximum-size chunks).
/// Small enough that a block is still in the CPU cache when the next stage
/// (chunking and hashing) reads it after it was copied in.
const BLOCK_SIZE: usize = 1024 * 1024;
/// With at least this many rayon threads, blocks are cut and fingerprinted
/// together on the rayon pool, several at once, and stitched in stream
/// order ([`fused`]): no thread chunks the whole stream. On two cores that
/// measured about 10 % faster for duplicate data and no slower for fresh
/// data than one chunking thread feeding fingerprinting on the pool
/// (docs/MEASUREMENTS.md). That one is left for a single rayon thread (it
/// overlaps chunking with hashing) and for fixed-size chunking (cutting costs
/// nothing, and chains started at a block's start would not meet the true
/// ones).
const FUSED_MIN_THREADS: usize = 2;
/// Blocks or batches queued between two stages.
const QUEUE_DEPTH: usize = 4;
/// With one rayon thread: blocks being fingerprinted or waiting for it on
/// the rayon pool at once.
const HASH_IN_FLIGHT: usize = QUEUE_DEPTH;
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

/// Options of one backup.
#[derive(Default)]
pub struct BackupOptions<'a> {
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
    /// The snapshot's time (seconds since the epoch) instead of the
    /// commit's: a copy keeps its original's (`tessera copy`).
    pub time: Option<u64>,
    /// Compression of the chunks this backup stores, instead of the
    /// repository's setting (only in a repository that compresses).
    pub compression: Option<Compression>,
    /// Lifecycle layout: memory of the previous version's NDF table as the
    /// backup looks it up, and of each sort of the arranging that follows
    /// the backup (`None`: [`crate::gc::DEFAULT_SORT_BUDGET`]).
    pub sort_budget: Option<u64>,
}

/// A block of input as read, in a pooled buffer: the bytes are at
/// `buf[layout.headroom..layout.headroom + len]`, leaving room in front for
/// the bytes the previous block could not cut yet.
struct RawBlock {
    buf: Vec<u8>,
    len: usize,
    eof: bool,
    /// Segment ends and reused chunks within the block, in stream order
    /// (segmented sources only).
    marks: Vec<Mark>,
}

/// A point of a segmented block.
enum Mark {
    /// A segment ends at this offset of the block's input bytes: the chunker cuts there.
    End(usize),
    /// Chunks given whole (fingerprint and length, no bytes) follow at this
    /// offset, which is a segment boundary.
    Reused(usize, Vec<(Fingerprint, u32)>),
    /// A whole segment of this length, cut as one chunk, starts at this
    /// offset, which is a segment boundary.
    Whole(usize, usize),
}

/// Reused chunks gathered in one block at most (they carry no bytes, so a
/// block of unchanged files would otherwise never fill).
const REUSED_PER_BLOCK: usize = 4096;

/// Where input bytes go in a pooled block buffer.
#[derive(Clone, Copy)]
struct BlockLayout {
    /// Room in front of the input for carried bytes (fewer than a maximum-size chunk).
    headroom: usize,
    /// Input bytes read per block.
    read_len: usize,
}

impl BlockLayout {
    fn new(max_chunk: usize) -> Self {
        BlockLayout {
            headroom: max_chunk,
            // Every block that is not the last then cuts at least one chunk.
            read_len: BLOCK_SIZE.max(4 * max_chunk),
        }
    }
}

/// Block buffers handed back when the last chunk referencing them is
/// dropped, so that steady state neither allocates, page-faults nor zeroes
/// memory. The pool only keeps idle buffers: when it is empty a new one is
/// allocated, so it never blocks and memory stays bounded by the pipeline's
/// queues as before.
struct BufferPool {
    layout: BlockLayout,
    size: usize,
    idle_tx: Sender<Vec<u8>>,
    idle_rx: Receiver<Vec<u8>>,
}

/// A pooled buffer owned by the `Bytes` of a block.
struct PooledBuffer {
    buf: Vec<u8>,
    home: Sender<Vec<u8>>,
}

impl AsRef<[u8]> for PooledBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        // The pool is full or gone: free the buffer.
        let _ = self.home.try_send(std::mem::take(&mut self.buf));
    }
}

impl BufferPool {
    fn new(layout: BlockLayout) -> Self {
        // Idle buffers kept: about as many as the queues can hold at once.
        let (idle_tx, idle_rx) = bounded(3 * QUEUE_DEPTH + 4);
        BufferPool {
            layout,
            size: layout.headroom + layout.read_len,
            idle_tx,
            idle_rx,
        }
    }

    fn take(&self) -> Vec<u8> {
        self.idle_rx
            .try_recv()
            .unwrap_or_else(|_| vec![0; self.size])
    }

    /// `buf[range]` as `Bytes`; the buffer returns to the pool when the last reference drops.
    fn share(&self, buf: Vec<u8>, range: std::ops::Range<usize>) -> Bytes {
        Bytes::from_owner(PooledBuffer {
            buf,
            home: self.idle_tx.clone(),
        })
        .slice(range)
    }
}

/// A block of input cut into chunks.
struct Block {
    data: Bytes,
    lengths: Vec<u32>,
    first_seq: u64,
    /// Chunks without bytes, each group inserted before `lengths[at]`.
    reused: Vec<(usize, Vec<(Fingerprint, u32)>)>,
}

/// Where a backup's chunks come from.
pub enum Source<'a> {
    /// A byte stream, chunked and fingerprinted by the pipeline.
    Data {
        /// The stream.
        input: &'a mut (dyn Read + Send),
        /// Its name in errors (a path or `stdin`).
        name: &'a str,
    },
    /// A fingerprint trace: fingerprint and length per chunk, no data (trace repositories).
    Trace(&'a mut (dyn Iterator<Item = Result<(Fingerprint, u32)>> + Send)),
    /// A stream of segments, each chunked on its own: the chunker restarts
    /// at every segment and a segment's last chunk ends at its end (a
    /// directory tree: its files, then its catalog).
    Segments(&'a mut dyn Segments),
}

/// What [`Segments::read`] delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentRead {
    /// This many bytes (at least one) of the current segment.
    Data(usize),
    /// The current segment ended; the next read starts the next one.
    SegmentEnd,
    /// The next segment is given whole as chunks, without its bytes
    /// ([`Segments::take_reused`]; an unchanged file of a tree backup). It
    /// comes at a segment boundary and needs no `SegmentEnd`.
    Reused,
    /// This many bytes (at least one, at most the chunker's maximum chunk
    /// size): a whole segment, stored as exactly one chunk (a tree backup's
    /// catalog regions and index pages). It comes at a segment boundary and
    /// needs no `SegmentEnd`; every read is given at least the maximum chunk
    /// size of room.
    Whole(usize),
    /// The stream ended (after its last segment's end).
    End,
}

/// A stream of segments (see [`Source::Segments`]).
pub trait Segments: Send {
    /// Reads the next bytes of the stream into `buf` (never empty).
    fn read(&mut self, buf: &mut [u8]) -> Result<SegmentRead>;
    /// The chunks of the segment announced by [`SegmentRead::Reused`]: the
    /// fingerprints and lengths a read of its bytes would produce.
    fn take_reused(&mut self) -> Vec<(Fingerprint, u32)> {
        Vec::new()
    }
    /// The tree the stream holds, asked once [`Segments::read`] returned
    /// [`SegmentRead::End`]: its snapshot records it.
    fn tree(&mut self) -> Option<TreeRef>;
}

/// A committed backup and, for the lifecycle layout, the arranging that followed it.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The committed snapshot.
    pub snapshot: Snapshot,
    /// Arranging run after the backup (lifecycle layout with automatic arranging).
    pub arrange: Option<ArrangeStats>,
    /// Arranging was due but deferred while other processes read the
    /// repository (see [`lifecycle::BackupOutcome::arrange_deferred`]).
    pub arrange_deferred: bool,
}

/// Backs up everything `input` yields (named `input_name` in errors) into
/// `repo`, opened for a backup ([`crate::backend::LockMode::Backup`] or
/// `Exclusive`), and returns the committed snapshot.
pub fn backup(
    repo: &Repository,
    input: &mut (dyn Read + Send),
    input_name: &str,
    options: &BackupOptions,
) -> Result<Snapshot> {
    let source = Source::Data {
        input,
        name: input_name,
    };
    run(repo, source, options).map(|o| o.snapshot)
}

/// Backs up the chunks of `source` into `repo` (opened for a backup), in the
/// repository's layout: the general entry point behind [`backup`].
pub fn run(repo: &Repository, source: Source, options: &BackupOptions) -> Result<Outcome> {
    run_with(repo, source, options, None)
}

/// [`run`] of a source that may give chunks without their bytes
/// ([`SegmentRead::Reused`]): `refetch` supplies them when a back end must
/// store them.
pub fn run_with(
    repo: &Repository,
    source: Source,
    options: &BackupOptions,
    refetch: Option<&dyn Refetch>,
) -> Result<Outcome> {
    repo.require(LockMode::Backup, "a backup")?;
    repo.write_missing_commit_marks()?;
    let config = repo.config();
    match (&source, config.trace) {
        (Source::Data { .. } | Source::Segments(_), true) => {
            return Err(Error::InvalidConfig(format!(
                "{}: a trace repository takes fingerprint traces, not data",
                repo.backend().location()
            )))
        }
        (Source::Trace(_), false) => {
            return Err(Error::InvalidConfig(format!(
                "{}: fingerprint traces need a trace repository (init --trace)",
                repo.backend().location()
            )))
        }
        _ => {}
    }
    match config.layout {
        Layout::Container => {
            backup_containers(repo, source, options, refetch).map(|snapshot| Outcome {
                snapshot,
                arrange: None,
                arrange_deferred: false,
            })
        }
        Layout::Lifecycle => backup_lifecycle(repo, source, options, refetch),
    }
}

/// What the front end learns of the stream while it runs.
struct StreamFacts {
    /// The tree a segmented source holds (set when it ends).
    tree: OnceLock<TreeRef>,
    /// The sequence number of the first chunk of a whole segment
    /// ([`SegmentRead::Whole`]; `u64::MAX`: none yet): it and the chunks
    /// after it (a tree's catalog and index) are never stored as deltas, as
    /// a reader of one would need its base too.
    whole_from: AtomicU64,
}

impl Default for StreamFacts {
    fn default() -> Self {
        StreamFacts {
            tree: OnceLock::new(),
            whole_from: AtomicU64::new(u64::MAX),
        }
    }
}

/// Handles of the front-end threads and the stage each runs; each thread
/// returns its busy time (reading and chunking, fingerprinting).
type FrontEnd<'scope> = Vec<(
    &'static str,
    std::thread::ScopedJoinHandle<'scope, Result<(Duration, Duration)>>,
)>;

/// Starts the front end of `source` on threads of `s`: batches of
/// fingerprinted chunks, in stream order, go to `tx`.
fn spawn_front_end<'scope, 'env, 'src: 'scope>(
    s: &'scope std::thread::Scope<'scope, 'env>,
    source: Source<'src>,
    chunker: &'scope dyn Chunker,
    hasher: &'scope Fingerprinter,
    pool: &'scope BufferPool,
    facts: &'scope StreamFacts,
    tx: Sender<Vec<Chunk>>,
) -> FrontEnd<'scope> {
    let (tree, whole_from) = (&facts.tree, &facts.whole_from);
    let layout = pool.layout;
    let (raw_tx, raw_rx) = bounded::<RawBlock>(QUEUE_DEPTH);
    let reading = |r: Result<Duration>| r.map(|t| (t, Duration::ZERO));
    let reader = match source {
        Source::Trace(chunks) => {
            return vec![(
                "trace reader",
                s.spawn(move || reading(read_trace(chunks, tx))),
            )]
        }
        Source::Data { input, name } => {
            s.spawn(move || reading(read_blocks(input, name, pool, layout, raw_tx)))
        }
        Source::Segments(input) => s.spawn(move || {
            let busy = read_segments(input, pool, layout, raw_tx)?;
            if let Some(t) = input.tree() {
                // Set once: this thread is the only writer.
                let _ = tree.set(t);
            }
            Ok((busy, Duration::ZERO))
        }),
    };
    if chunker.content_defined() && rayon::current_num_threads() >= FUSED_MIN_THREADS {
        return vec![
            ("input reader", reader),
            (
                "chunking and fingerprinting",
                s.spawn(move || {
                    fused::cut_and_hash(
                        chunker,
                        hasher,
                        pool,
                        whole_from,
                        raw_rx,
                        tx,
                        fused::PIECES,
                    )
                }),
            ),
        ];
    }
    let (block_tx, block_rx) = bounded::<Block>(QUEUE_DEPTH);
    vec![
        ("input reader", reader),
        (
            "chunking",
            s.spawn(move || {
                reading(cut_blocks(
                    chunker, pool, layout, whole_from, raw_rx, block_tx,
                ))
            }),
        ),
        (
            "fingerprinting",
            s.spawn(move || fingerprint(hasher, block_rx, tx).map(|t| (Duration::ZERO, t))),
        ),
    ]
}

/// Joins the front end; returns (reading and chunking, fingerprinting) time
/// or the first stage's error.
fn join_front_end(front: FrontEnd) -> Result<(Duration, Duration)> {
    let mut read = Duration::ZERO;
    let mut hash = Duration::ZERO;
    let joined: Vec<_> = front.into_iter().map(|(stage, h)| join(h, stage)).collect();
    for r in joined {
        let (r, h) = r?;
        read += r;
        hash += h;
    }
    Ok((read, hash))
}

/// Stage 1 of a trace backup: batches the trace's chunks.
fn read_trace(
    chunks: &mut (dyn Iterator<Item = Result<(Fingerprint, u32)>> + Send),
    tx: Sender<Vec<Chunk>>,
) -> Result<Duration> {
    const BATCH: usize = 4096;
    let mut busy = Duration::ZERO;
    let mut batch = Vec::with_capacity(BATCH);
    // When the batch being read started (waits to send are not busy time).
    let mut t = Instant::now();
    for (seq, item) in (0u64..).zip(chunks) {
        let (fp, len) = item?;
        batch.push(Chunk {
            seq,
            fp,
            len,
            data: None,
        });
        if batch.len() == BATCH {
            busy += t.elapsed();
            if tx
                .send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))
                .is_err()
            {
                return Ok(busy);
            }
            t = Instant::now();
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(batch);
    }
    Ok(busy + t.elapsed())
}

/// The lifecycle layout (MFDedup): the same front end, then NDF deduplication
/// into categories and, unless configured otherwise, arranging.
fn backup_lifecycle(
    repo: &Repository,
    source: Source,
    options: &BackupOptions,
    refetch: Option<&dyn Refetch>,
) -> Result<Outcome> {
    let config = repo.config();
    let chunker = config.chunker.build()?;
    let pool = BufferPool::new(BlockLayout::new(chunker.max_size()));
    let (tx, rx) = bounded::<Vec<Chunk>>(QUEUE_DEPTH);
    let lifecycle_options = LifecycleBackupOptions {
        label: options.label.clone(),
        source: options.source.clone(),
        host: options.host.clone(),
        tags: options.tags.clone(),
        progress: options.progress,
        time: options.time,
        compression: options.compression,
        sort_budget: options.sort_budget,
    };
    // (The lifecycle layout stores no deltas: `whole_from` is not used.)
    let facts = StreamFacts::default();
    std::thread::scope(|s| {
        let front = spawn_front_end(
            s,
            source,
            chunker.as_ref(),
            repo.fingerprinter(),
            &pool,
            &facts,
            tx,
        );
        let done = lifecycle::backup_stream(
            repo,
            rx.into_iter().map(Ok),
            &lifecycle_options,
            Some(&facts.tree),
            refetch,
        );
        // An input error explains a backup that ended early.
        join_front_end(front)?;
        let outcome = done?;
        Ok(Outcome {
            snapshot: outcome.snapshot,
            arrange: outcome.arrange,
            arrange_deferred: outcome.arrange_deferred,
        })
    })
}

/// The container layout: deduplicate, rewrite, fill containers, commit.
fn backup_containers(
    repo: &Repository,
    source: Source,
    options: &BackupOptions,
    refetch: Option<&dyn Refetch>,
) -> Result<Snapshot> {
    let started = Instant::now();
    let io_before = repo.io_stats();
    let config = repo.config().clone();
    let chunker = config.chunker.build()?;
    // A shared backup's id is taken at its commit (FORMAT.md §13.3).
    let id = repo.next_backup_id()?;
    let (mut index, first_ids) = open_index_and_ids(repo)?;
    let more_ids = || -> Result<std::ops::Range<ContainerId>> {
        let _section = repo.commit_section()?;
        repo.reserve_containers(CONTAINER_BLOCK)
    };
    let train = |samples: &[&[u8]]| repo.train_dictionary(samples);
    let history_key = rewrite_history_key(&options.source);
    let history = read_history(repo, &history_key)?;
    let mut filter = config
        .rewrite
        .build(u64::from(config.container_size), history.as_deref());
    let next_container = first_ids.start;
    let encoding = config.backup_encoding(options.compression)?;
    let backend = repo.shared_backend();
    let (delta, readahead) = open_delta_stage(repo, &config, options, index.as_mut())?;

    let pool = BufferPool::new(BlockLayout::new(chunker.max_size()));
    let stop = AtomicBool::new(false);
    let (chunk_tx, chunk_rx) = bounded::<Vec<Chunk>>(QUEUE_DEPTH);
    let (container_tx, container_rx) = bounded::<Builder>(CONTAINER_QUEUE_DEPTH);
    // Data buffers of written containers, reused by the next ones.
    let writers = backend.connections().unwrap_or(WRITERS).max(1);
    let (spare_tx, spare_rx) = bounded::<AlignedBuf>(writers + CONTAINER_QUEUE_DEPTH);

    let mut recipe = RecipeWriter::new(id)?;
    let facts = StreamFacts::default();
    let mut totals = std::thread::scope(|s| -> Result<StoreTotals> {
        if !readahead.is_empty() {
            // The index reads nearly all of them whole, when it meets their
            // chunks: have their transfer overlap the work until then (on a
            // thread of its own, as opening each file takes a while).
            s.spawn(|| backend.will_read(&readahead));
        }
        let front = spawn_front_end(
            s,
            source,
            chunker.as_ref(),
            repo.fingerprinter(),
            &pool,
            &facts,
            chunk_tx,
        );
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
        store.dictionary = repo.dictionary();
        if repo.wants_dictionary(encoding) && !config.trace {
            store.train = Some(&train);
        }
        // Containers that are encoded or encrypted anyway are copied once,
        // when written, instead of when filled and again then.
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
        let (read_time, hash_time) = join_front_end(front)?;
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
    let tree = located(facts.tree.into_inner(), &mut recipe)?;
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
        .map(|w| join(w, "container writer"))
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
        let recipe_written = recipe_write.map_or(Ok(()), |r| join(r, "recipe writer"));
        let history_written = history_write.map_or(Ok(()), |h| join(h, "history writer"));
        let delta_written = delta_write.map_or(Ok(()), |d| join(d, "delta state writer"));
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

fn join<T>(handle: std::thread::ScopedJoinHandle<'_, Result<T>>, stage: &str) -> Result<T> {
    handle
        .join()
        .map_err(|_| Error::Pipeline(format!("{stage} thread panicked")))?
}

/// Stage 1a: reads blocks of input into pooled buffers.
fn read_blocks(
    input: &mut (dyn Read + Send),
    input_name: &str,
    pool: &BufferPool,
    layout: BlockLayout,
    tx: Sender<RawBlock>,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    loop {
        let mut buf = pool.take();
        let t = Instant::now();
        let target = &mut buf[layout.headroom..layout.headroom + layout.read_len];
        let (len, eof) = fill(input, target).map_err(|e| Error::Input {
            what: input_name.to_string(),
            source: e,
        })?;
        busy += t.elapsed();
        // A closed queue means the consumer stopped: its error is reported, not ours.
        let block = RawBlock {
            buf,
            len,
            eof,
            marks: Vec::new(),
        };
        if tx.send(block).is_err() || eof {
            return Ok(busy);
        }
    }
}

/// Stage 1a of a segmented source: fills pooled buffers with the stream's
/// bytes, noting where each segment ends.
fn read_segments(
    input: &mut dyn Segments,
    pool: &BufferPool,
    layout: BlockLayout,
    tx: Sender<RawBlock>,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    loop {
        let mut buf = pool.take();
        let t = Instant::now();
        let target = &mut buf[layout.headroom..layout.headroom + layout.read_len];
        let mut len = 0;
        let mut marks = Vec::new();
        let mut reused = 0;
        let mut eof = false;
        // Every read has room for a whole segment ([`SegmentRead::Whole`]).
        while target.len() - len >= layout.headroom && reused < REUSED_PER_BLOCK {
            match input.read(&mut target[len..])? {
                SegmentRead::Data(n) => len += n,
                SegmentRead::Whole(n) => {
                    marks.push(Mark::Whole(len, n));
                    len += n;
                }
                SegmentRead::SegmentEnd => marks.push(Mark::End(len)),
                SegmentRead::Reused => {
                    let chunks = input.take_reused();
                    if !chunks.is_empty() {
                        reused += chunks.len();
                        marks.push(Mark::Reused(len, chunks));
                    }
                }
                SegmentRead::End => {
                    eof = true;
                    break;
                }
            }
        }
        busy += t.elapsed();
        let block = RawBlock {
            buf,
            len,
            eof,
            marks,
        };
        // A closed queue means the consumer stopped: its error is reported, not ours.
        if tx.send(block).is_err() || eof {
            return Ok(busy);
        }
    }
}

/// Fills `buf` from `input`; returns the bytes read and whether the input
/// ended (fewer than `buf.len()` bytes read).
fn fill(input: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<(usize, bool)> {
    let mut len = 0;
    while len < buf.len() {
        match input.read(&mut buf[len..]) {
            Ok(0) => return Ok((len, true)),
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((len, false))
}

/// Stage 1b with one rayon thread (else [`fused::cut_and_hash`]): cuts
/// blocks into chunks. Bytes past the last final boundary of a block are
/// carried into the headroom of the next block.
/// The sequence number of the first chunk of a whole segment goes to
/// `whole_from` (before the block holding it is sent).
fn cut_blocks(
    chunker: &dyn Chunker,
    pool: &BufferPool,
    layout: BlockLayout,
    whole_from: &AtomicU64,
    rx: Receiver<RawBlock>,
    tx: Sender<Block>,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    // The uncut tail of the previous block, still in that block's buffer.
    let mut carry = Bytes::new();
    let mut seq = 0u64;
    for RawBlock {
        mut buf,
        len,
        eof,
        marks,
    } in rx
    {
        let t = Instant::now();
        // `cut_all` leaves fewer than `max_size` (= headroom) bytes uncut.
        let start = layout.headroom - carry.len();
        let end = layout.headroom + len;
        buf[start..layout.headroom].copy_from_slice(&carry);
        let mut lengths = Vec::with_capacity((end - start) / 4096 + 1);
        // Each segment ending in the block is cut to its end; the chunker
        // restarts after it.
        let mut used = 0;
        let mut reused = Vec::new();
        let mut reused_count = 0;
        for mark in marks {
            match mark {
                Mark::End(e) => {
                    let segment_end = carry.len() + e;
                    used += cut_all(
                        chunker,
                        &buf[start + used..start + segment_end],
                        true,
                        &mut lengths,
                    );
                }
                Mark::Reused(at, chunks) => {
                    // Every byte before them is cut: they start a segment.
                    if used != carry.len() + at {
                        return Err(reused_misplaced());
                    }
                    reused_count += chunks.len();
                    reused.push((lengths.len(), chunks));
                }
                Mark::Whole(at, n) => {
                    // Every byte before it is cut; it is one chunk.
                    if used != carry.len() + at || n == 0 || n > chunker.max_size() {
                        return Err(whole_misplaced(n));
                    }
                    if whole_from.load(Ordering::Relaxed) == u64::MAX {
                        let at = seq + (lengths.len() + reused_count) as u64;
                        whole_from.store(at, Ordering::Release);
                    }
                    lengths.push(n as u32);
                    used += n;
                }
            }
        }
        used += cut_all(chunker, &buf[start + used..end], eof, &mut lengths);
        let data = pool.share(buf, start..end);
        carry = data.slice(used..);
        busy += t.elapsed();
        let n = (lengths.len() + reused_count) as u64;
        if n > 0 {
            let block = Block {
                data: data.slice(..used),
                lengths,
                first_seq: seq,
                reused,
            };
            if tx.send(block).is_err() {
                // The consumer stopped: its error is reported, not ours.
                return Ok(busy);
            }
        }
        seq += n;
        if eof {
            break;
        }
    }
    Ok(busy)
}

/// The error of reused chunks given within a segment.
fn reused_misplaced() -> Error {
    Error::Pipeline("reused chunks do not start at a segment boundary".into())
}

/// The error of a whole segment of `n` bytes given within a segment, or too long.
fn whole_misplaced(n: usize) -> Error {
    Error::Pipeline(format!(
        "a whole segment of {n} bytes does not start at a segment boundary or exceeds \
         the maximum chunk size"
    ))
}

/// Stage 2 with one rayon thread: fingerprints blocks on the rayon pool, a
/// whole block per task, and forwards their chunks in stream order, up to
/// [`HASH_IN_FLIGHT`] blocks queued at once ([`ordered_on_pool`]). Returns
/// the summed hashing time.
fn fingerprint(
    hasher: &dyn BatchHasher,
    rx: Receiver<Block>,
    tx: Sender<Vec<Chunk>>,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    ordered_on_pool(
        &rx,
        HASH_IN_FLIGHT,
        |block| {
            let t = Instant::now();
            let chunks = hash_block(hasher, block);
            (chunks, t.elapsed())
        },
        |(chunks, t)| {
            busy += t;
            // The consumer stopped: its error is reported, not ours.
            Ok(tx.send(chunks).is_ok())
        },
    )?;
    Ok(busy)
}

/// Runs `work` on the rayon pool for every item of `rx`, up to `in_flight`
/// items at once, and hands the results to `deliver` in the order of the
/// items, until `rx` closes, `deliver` returns `false` or an error (which is
/// returned). Several items in flight keep every rayon thread busy: no fork
/// and join per item, no thread idling while another finishes its share.
fn ordered_on_pool<I: Send, R: Send>(
    rx: &Receiver<I>,
    in_flight: usize,
    work: impl Fn(I) -> R + Sync,
    mut deliver: impl FnMut(R) -> Result<bool>,
) -> Result<()> {
    let work = &work;
    rayon::in_place_scope(|scope| {
        let mut pending: VecDeque<Receiver<R>> = VecDeque::new();
        let mut input_open = true;
        let spawn = |item: I| {
            let (done_tx, done_rx) = bounded(1);
            scope.spawn(move |_| {
                // The collector stopped: its error is reported, not ours.
                let _ = done_tx.send(work(item));
            });
            done_rx
        };
        loop {
            let room = input_open && pending.len() < in_flight;
            let Some(oldest) = pending.front().cloned() else {
                if !room {
                    return Ok(());
                }
                // Nothing in flight: wait for an item.
                match rx.recv() {
                    Ok(item) => pending.push_back(spawn(item)),
                    Err(_) => input_open = false,
                }
                continue;
            };
            // Take a new item when there is room, or the oldest result, whichever comes first.
            let mut select = Select::new();
            let input = room.then(|| select.recv(rx));
            let output = select.recv(&oldest);
            let op = select.select();
            if Some(op.index()) == input {
                match op.recv(rx) {
                    Ok(item) => pending.push_back(spawn(item)),
                    Err(_) => input_open = false,
                }
                continue;
            }
            debug_assert_eq!(op.index(), output);
            pending.pop_front();
            // A task that ended without sending panicked; rayon re-raises it at scope end.
            let Ok(result) = op.recv(&oldest) else {
                return Ok(());
            };
            if !deliver(result)? {
                return Ok(());
            }
        }
    })
}

/// Fingerprints one block's chunks (on the calling thread).
fn hash_block(hasher: &dyn BatchHasher, block: Block) -> Vec<Chunk> {
    let mut off = 0usize;
    let slices: Vec<&[u8]> = block
        .lengths
        .iter()
        .map(|&len| {
            let data = &block.data[off..off + len as usize];
            off += len as usize;
            data
        })
        .collect();
    let mut fps = Vec::with_capacity(slices.len());
    hasher.hash_batch(&slices, &mut fps);
    assemble(
        &block.data,
        &block.lengths,
        fps,
        block.reused,
        block.first_seq,
    )
}

/// The chunks of a block in stream order, numbered from `first_seq`: those
/// of `lengths`, which tile `data`, with the fingerprints `fps`, and the
/// `reused` groups (no bytes), each inserted before the chunk of its index.
fn assemble(
    data: &Bytes,
    lengths: &[u32],
    fps: Vec<Fingerprint>,
    reused: Vec<(usize, Vec<(Fingerprint, u32)>)>,
    first_seq: u64,
) -> Vec<Chunk> {
    let mut off = 0usize;
    let hashed = lengths.iter().zip(fps).map(|(&len, fp)| {
        let bytes = data.slice(off..off + len as usize);
        off += len as usize;
        (fp, len, Some(bytes))
    });
    if reused.is_empty() {
        return hashed
            .enumerate()
            .map(|(i, (fp, len, data))| Chunk {
                seq: first_seq + i as u64,
                fp,
                len,
                data,
            })
            .collect();
    }
    // Reused chunks (no bytes) go between the hashed ones where they were given.
    let mut hashed = hashed.peekable();
    let mut all = Vec::with_capacity(lengths.len());
    let mut next = 0;
    for (at, group) in reused {
        while next < at {
            all.extend(hashed.next());
            next += 1;
        }
        all.extend(group.into_iter().map(|(fp, len)| (fp, len, None)));
    }
    all.extend(hashed);
    all.into_iter()
        .enumerate()
        .map(|(i, (fp, len, data))| Chunk {
            seq: first_seq + i as u64,
            fp,
            len,
            data,
        })
        .collect()
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
    /// Trains and stores a dictionary from the entries of the first
    /// container sealed, when the repository wants one.
    train: Option<&'a TrainDictionary<'a>>,
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
            train: None,
            pending: Vec::new(),
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
        let whole = compressed.is_none();
        if data.is_some() {
            self.totals.entries += 1;
            self.totals.entry_bytes += len as u64;
        }
        match (&chunk.data, compressed) {
            (_, Some(c)) => builder.push_delta(chunk.fp, &c.delta, c.base)?,
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
    use crate::chunker::{pseudo_random, ChunkerKind, ChunkerParams};
    use crate::repo::config::Config;
    use crate::restore::{restore, RestoreOptions};

    /// The trace reader's busy time is the time it spent reading, at most
    /// the wall time of the whole read (it was once the sum of the time
    /// since the start at every batch: hours for a minute's read).
    #[test]
    fn the_trace_readers_busy_time_is_at_most_its_wall_time() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut chunks = (0..100_000u32).map(|i| {
            let mut fp = [0u8; crate::fingerprint::FINGERPRINT_LEN];
            fp[..4].copy_from_slice(&i.to_le_bytes());
            Ok((Fingerprint(fp), 4096))
        });
        let started = Instant::now();
        let (busy, read) = std::thread::scope(|s| {
            let reader = s.spawn(|| read_trace(&mut chunks, tx));
            let read: usize = rx.iter().map(|b: Vec<Chunk>| b.len()).sum();
            (reader.join().unwrap().unwrap(), read)
        });
        assert_eq!(read, 100_000);
        assert!(
            busy <= started.elapsed(),
            "{busy:?} busy in {:?}",
            started.elapsed()
        );
    }

    /// A reader that returns at most `piece` bytes per call, then optionally fails.
    struct Trickle<'a> {
        data: &'a [u8],
        piece: usize,
        fail_at_end: bool,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.data.is_empty() && self.fail_at_end {
                return Err(std::io::Error::other("input broke"));
            }
            let n = self.piece.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// Backs `data` up through a trickling reader and checks that the recipe
    /// has the cut points of the whole input and that it restores.
    fn round_trip(chunker: ChunkerParams, data: &[u8], piece: usize) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new("test".into());
        config.chunker = chunker;
        let repo = Repository::init(&dir.path().join("repo"), config).unwrap();
        let mut input = Trickle {
            data,
            piece,
            fail_at_end: false,
        };
        let snap = backup(&repo, &mut input, "input", &BackupOptions::default()).unwrap();
        assert_eq!(snap.logical_bytes, data.len() as u64);

        let mut expected = Vec::new();
        cut_all(chunker.build().unwrap().as_ref(), data, true, &mut expected);
        let recipe = repo.recipe(snap.id).unwrap();
        let lengths: Vec<u32> = recipe.chunks.iter().map(|c| c.len).collect();
        assert_eq!(
            lengths,
            expected,
            "{} bytes in pieces of {piece}",
            data.len()
        );

        let mut out = Vec::new();
        restore(&repo, snap.id, &mut out, &RestoreOptions::default()).unwrap();
        assert!(out == data, "restore of {} bytes differs", data.len());
    }

    #[test]
    fn block_edges_keep_the_cut_points_of_the_whole_input() {
        let params = ChunkerParams::default();
        let read_len = BlockLayout::new(params.max_size as usize).read_len;
        let data = pseudo_random(3 * read_len + 12_345, 11);
        for len in [0, 1, 4095, read_len - 1, read_len, read_len + 1, data.len()] {
            for piece in [777_777, 1000] {
                round_trip(params, &data[..len], piece);
            }
        }
    }

    /// Fixed-size chunking takes the chunking thread and fingerprinting on
    /// the pool (not the fused front end): the same cut points, a chunk
    /// size that does not divide the block size included.
    #[test]
    fn fixed_size_chunking_keeps_the_cut_points_of_the_whole_input() {
        for size in [4096, 5000] {
            let params = ChunkerParams {
                kind: ChunkerKind::Fixed,
                min_size: size,
                avg_size: size,
                max_size: size,
            };
            assert!(!params.build().unwrap().content_defined());
            let data = pseudo_random(3 * BLOCK_SIZE + 777, 13);
            round_trip(params, &data, 100_000);
        }
    }

    #[test]
    fn chunks_larger_than_a_block_are_carried() {
        // max 2 MiB: blocks grow to 8 MiB and the carry to almost 2 MiB.
        let params = ChunkerParams {
            kind: ChunkerKind::Fastcdc,
            min_size: 64 * 1024,
            avg_size: 256 * 1024,
            max_size: 2 * 1024 * 1024,
        };
        let mut data = pseudo_random(20 << 20, 5);
        // Zeros have no content-defined cut point: maximum-size chunks.
        data[3 << 20..9 << 20].fill(0);
        round_trip(params, &data, 1 << 20);
    }

    /// Segments fed in pieces of at most `piece` bytes.
    struct Pieces {
        segments: Vec<Vec<u8>>,
        at: (usize, usize),
        piece: usize,
    }

    impl Segments for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> Result<SegmentRead> {
            let (s, o) = self.at;
            let Some(seg) = self.segments.get(s) else {
                return Ok(SegmentRead::End);
            };
            if o == seg.len() {
                self.at = (s + 1, 0);
                return Ok(SegmentRead::SegmentEnd);
            }
            let n = self.piece.min(buf.len()).min(seg.len() - o);
            buf[..n].copy_from_slice(&seg[o..o + n]);
            self.at.1 += n;
            Ok(SegmentRead::Data(n))
        }

        fn tree(&mut self) -> Option<TreeRef> {
            None
        }
    }

    #[test]
    fn segments_are_cut_on_their_own() {
        let params = ChunkerParams::default();
        let read_len = BlockLayout::new(params.max_size as usize).read_len;
        let data = pseudo_random(3 * read_len, 17);
        let sizes = [
            0,
            1,
            5000,
            read_len - 3,
            0,
            params.max_size as usize,
            70_000,
        ];
        let mut segments = Vec::new();
        let mut at = 0;
        for n in sizes {
            segments.push(data[at..at + n].to_vec());
            at += n;
        }
        let chunker = params.build().unwrap();
        let mut expected = Vec::new();
        for seg in &segments {
            cut_all(chunker.as_ref(), seg, true, &mut expected);
        }
        for piece in [1 << 20, 3000] {
            let dir = tempfile::tempdir().unwrap();
            let repo = Repository::init(&dir.path().join("repo"), Config::new("t".into())).unwrap();
            let mut feed = Pieces {
                segments: segments.clone(),
                at: (0, 0),
                piece,
            };
            let snap = run(
                &repo,
                Source::Segments(&mut feed),
                &BackupOptions::default(),
            )
            .unwrap()
            .snapshot;
            let lengths: Vec<u32> = repo
                .recipe(snap.id)
                .unwrap()
                .chunks
                .iter()
                .map(|c| c.len)
                .collect();
            assert_eq!(lengths, expected, "pieces of {piece}");
            assert_eq!(snap.logical_bytes, at as u64);
        }
    }

    /// Segments of which those with chunks in `reused` are given as chunks.
    struct Reusing {
        pieces: Pieces,
        reused: Vec<Option<Vec<(Fingerprint, u32)>>>,
        taken: Vec<(Fingerprint, u32)>,
    }

    impl Segments for Reusing {
        fn read(&mut self, buf: &mut [u8]) -> Result<SegmentRead> {
            let (s, o) = self.pieces.at;
            if o == 0 {
                if let Some(Some(chunks)) = self.reused.get_mut(s) {
                    self.taken = std::mem::take(chunks);
                    self.reused[s] = None;
                    self.pieces.at = (s + 1, 0);
                    return Ok(SegmentRead::Reused);
                }
            }
            self.pieces.read(buf)
        }

        fn take_reused(&mut self) -> Vec<(Fingerprint, u32)> {
            std::mem::take(&mut self.taken)
        }

        fn tree(&mut self) -> Option<TreeRef> {
            None
        }
    }

    /// Reused chunks (no bytes) between read segments, several per block and
    /// more than a block takes, make the recipe a re-read makes; in the
    /// lifecycle layout too, where a new lineage fetches their bytes back.
    #[test]
    fn reused_segments_are_the_chunks_a_read_makes() {
        /// The bytes of the stream (the segments' concatenation).
        struct Stream<'a>(&'a [u8], &'a Fingerprinter);
        impl Refetch for Stream<'_> {
            fn bytes(&self, offset: u64, fp: &Fingerprint, len: u32) -> Result<Vec<u8>> {
                let bytes = self.0[offset as usize..][..len as usize].to_vec();
                assert_eq!(self.1.hash(&bytes), *fp);
                Ok(bytes)
            }
        }
        let params = ChunkerParams {
            kind: ChunkerKind::Fastcdc,
            min_size: 64,
            avg_size: 256,
            max_size: 1024,
        };
        let data = pseudo_random(4 << 20, 23);
        // Small segments around a large one of more than REUSED_PER_BLOCK chunks.
        let sizes = [5000, 0, 300, 1 << 20, 7, 12_345, 2 << 20, 999];
        let mut segments = Vec::new();
        let mut at = 0;
        for n in sizes {
            segments.push(data[at..at + n].to_vec());
            at += n;
        }
        for layout in [Layout::Container, Layout::Lifecycle] {
            let dir = tempfile::tempdir().unwrap();
            let mut config = Config::new("t".into());
            config.chunker = params;
            config.layout = layout;
            let repo = Repository::init(&dir.path().join("repo"), config).unwrap();
            let feed = |reused| Pieces {
                segments: segments.clone(),
                at: (0, 0),
                piece: if reused { 3000 } else { 1 << 20 },
            };
            let first = run(
                &repo,
                Source::Segments(&mut feed(false)),
                &BackupOptions::default(),
            )
            .unwrap()
            .snapshot;
            let chunks = repo.recipe(first.id).unwrap().chunks;
            let chunker = params.build().unwrap();
            let mut reused = Vec::new();
            let mut next = 0;
            for (i, seg) in segments.iter().enumerate() {
                let mut lengths = Vec::new();
                cut_all(chunker.as_ref(), seg, true, &mut lengths);
                let mine: Vec<_> = chunks[next..next + lengths.len()]
                    .iter()
                    .map(|c| (c.fp, c.len))
                    .collect();
                next += lengths.len();
                reused.push((i % 2 == 0).then_some(mine));
            }
            assert!(reused[6].as_ref().unwrap().len() > REUSED_PER_BLOCK);
            let refetch = Stream(&data[..at], repo.fingerprinter());
            for source in ["", "other lineage"] {
                let mut feed = Reusing {
                    pieces: feed(true),
                    reused: reused.clone(),
                    taken: Vec::new(),
                };
                let options = BackupOptions {
                    source: source.into(),
                    ..BackupOptions::default()
                };
                let snap = run_with(&repo, Source::Segments(&mut feed), &options, Some(&refetch))
                    .unwrap()
                    .snapshot;
                assert_eq!(repo.recipe(snap.id).unwrap().chunks.len(), chunks.len());
                let again: Vec<_> = repo.recipe(snap.id).unwrap().chunks;
                let pairs = |c: &[ChunkRef]| c.iter().map(|c| (c.fp, c.len)).collect::<Vec<_>>();
                assert_eq!(pairs(&again), pairs(&chunks), "{layout:?} {source:?}");
                let mut out = Vec::new();
                restore(&repo, snap.id, &mut out, &RestoreOptions::default()).unwrap();
                assert!(out == data[..at], "{layout:?} {source:?}");
            }
        }
    }

    #[test]
    fn an_input_error_fails_the_backup_without_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(&dir.path().join("repo"), Config::new("t".into())).unwrap();
        let data = pseudo_random(5 << 20, 3);
        let mut input = Trickle {
            data: &data,
            piece: 100_000,
            fail_at_end: true,
        };
        let err = backup(&repo, &mut input, "broken", &BackupOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Input { .. }), "{err}");
        assert!(repo.backups().unwrap().is_empty());
    }

    #[test]
    fn backup_stats_count_the_reads_and_writes_of_the_backend() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new("t".into());
        config.index = crate::repo::config::IndexKind::Ddfs;
        let repo = Repository::init(&dir.path().join("repo"), config).unwrap();
        let data = pseudo_random(3 << 20, 9);
        let options = BackupOptions::default();
        let first = backup(&repo, &mut &data[..], "a", &options).unwrap();
        let before = repo.io_stats();
        let second = backup(&repo, &mut &data[..], "a", &options).unwrap();
        let io = repo.io_stats().since(&before);
        // Every chunk is a duplicate: the second backup finds the first's
        // fingerprints in the on-disk table and loads its containers' metadata.
        let index = &second.stats.index;
        assert!(
            index.disk_lookups > 0 && index.container_loads > 0,
            "{index:?}"
        );
        assert!(second.stats.reads >= index.disk_lookups + index.container_loads);
        // The counts end before the snapshot is written (its size depends on them).
        assert_eq!(second.stats.reads, io.reads);
        assert_eq!(second.stats.bytes_read, io.read_bytes);
        assert!(second.stats.bytes_written < io.write_bytes);
        assert!(first.stats.bytes_written > data.len() as u64);
    }
}
