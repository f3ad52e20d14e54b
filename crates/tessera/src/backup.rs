//! The backup pipeline: read → chunk → fingerprint (parallel) → deduplicate
//! → fill containers → seal and write containers (background, several at
//! once) → commit.
//!
//! Stages run on their own threads connected by bounded channels, so memory
//! stays within a few blocks and containers whatever the input size. Input
//! blocks are small (they stay in the CPU cache from one stage to the next)
//! and their buffers are recycled. Commit order (docs/FORMAT.md §15):
//! containers (all durable, in any order), then the index, then the recipe,
//! then the snapshot; a backup interrupted anywhere before the snapshot write
//! is invisible.

use crate::backend::Backend;
use crate::chunker::{cut_all, Chunker};
use crate::container::{self, Builder, ContainerId};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::fingerprint::{FingerprintAlgo, FingerprintMap};
use crate::index::{Chunk, Decision, DedupIndex, Reorder};
use crate::repo::Repository;
use crate::snapshot::{self, BackupStats, ChunkRef, ClassCount, Recipe, Snapshot, StageSeconds};
use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;
use std::io::{ErrorKind, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Bytes read from the input per block (at least four maximum-size chunks).
/// Small enough that a block is still in the CPU cache when the next stage
/// (chunking, then hashing) reads it after it was copied in.
const BLOCK_SIZE: usize = 1024 * 1024;
/// Blocks or batches queued between two stages.
const QUEUE_DEPTH: usize = 4;
/// Full containers queued for the writers.
const CONTAINER_QUEUE_DEPTH: usize = 2;
/// Threads writing sealed containers. Each write is synced on its own, so
/// several in flight keep the device busy while others wait for their sync.
const WRITERS: usize = 4;

/// Options of one backup.
#[derive(Default)]
pub struct BackupOptions<'a> {
    /// Free-form label.
    pub label: String,
    /// Source lineage name.
    pub source: String,
    /// Called with the number of input bytes processed so far.
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

/// A block of input as read, in a pooled buffer: the bytes are at
/// `buf[layout.headroom..layout.headroom + len]`, leaving room in front for
/// the bytes the previous block could not cut yet.
struct RawBlock {
    buf: Vec<u8>,
    len: usize,
    eof: bool,
}

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
}

/// Backs up everything `input` yields (named `input_name` in errors) into
/// `repo`, which must be open exclusively, and returns the committed snapshot.
pub fn backup(
    repo: &Repository,
    input: &mut (dyn Read + Send),
    input_name: &str,
    options: &BackupOptions,
) -> Result<Snapshot> {
    let started = Instant::now();
    let io_before = repo.io_stats();
    let config = repo.config().clone();
    let chunker = config.chunker.build()?;
    let id = repo.next_backup_id()?;
    let mut index = repo.open_index()?;
    let next_container = repo.next_container_id()?;
    let backend = repo.shared_backend();

    let layout = BlockLayout::new(chunker.max_size());
    let pool = BufferPool::new(layout);
    let stop = AtomicBool::new(false);

    let (raw_tx, raw_rx) = bounded::<RawBlock>(QUEUE_DEPTH);
    let (block_tx, block_rx) = bounded::<Block>(QUEUE_DEPTH);
    let (chunk_tx, chunk_rx) = bounded::<Vec<Chunk>>(QUEUE_DEPTH);
    let (container_tx, container_rx) = bounded::<Builder>(CONTAINER_QUEUE_DEPTH);

    let (chunks, totals) = std::thread::scope(|s| -> Result<(Vec<ChunkRef>, StoreTotals)> {
        let pool = &pool;
        let reader = s.spawn(move || read_blocks(input, input_name, pool, layout, raw_tx));
        let cutter = s.spawn(|| cut_blocks(chunker.as_ref(), pool, layout, raw_rx, block_tx));
        let hasher = s.spawn(|| fingerprint(config.fingerprint, block_rx, chunk_tx));
        let writers: Vec<_> = (0..WRITERS)
            .map(|_| {
                let (backend, rx, stop) = (backend.as_ref(), container_rx.clone(), &stop);
                s.spawn(move || write_containers(backend, rx, stop))
            })
            .collect();
        drop(container_rx);
        let mut store = Store::new(next_container, config.container_size as usize, container_tx);
        let stored = store_chunks(index.as_mut(), &mut store, chunk_rx, options);
        // Close the container queue whatever happened, so that the writers end.
        let totals = store.finish();
        // Join every writer, then report the first error or, as the writers
        // run in parallel, the busiest one's time.
        let written: Vec<_> = writers
            .into_iter()
            .map(|w| join(w, "container writer"))
            .collect();
        let write_time = written
            .into_iter()
            .try_fold(Duration::ZERO, |acc, r| r.map(|t| acc.max(t)));
        let hash_time = join(hasher, "fingerprinting");
        let cut_time = join(cutter, "chunking");
        let read_time = join(reader, "input reader");
        // Report the earliest stage's error: a failing input explains the rest.
        let read_time = read_time?;
        let cut_time = cut_time?;
        let hash_time = hash_time?;
        let write_time = write_time?;
        let chunks = stored?;
        let mut totals = totals?;
        totals.read_time = read_time + cut_time;
        totals.hash_time = hash_time;
        totals.write_time = write_time;
        Ok((chunks, totals))
    })?;

    let commit_started = Instant::now();
    index.finish(&mut Vec::new())?;
    index.commit(totals.next_container)?;
    let recipe = Recipe { backup: id, chunks };
    let logical_bytes = recipe.logical_bytes();
    repo.backend()
        .write(&snapshot::recipe_key(id), &recipe.encode()?)?;

    let stats = BackupStats {
        logical_bytes,
        stored_bytes: totals.unique.bytes,
        chunks: recipe.chunks.len() as u64,
        unique_chunks: totals.unique.chunks,
        unique: totals.unique,
        internal_duplicates: totals.internal,
        duplicates: totals.duplicates,
        containers_written: totals.containers_written,
        dedup_ratio: ratio(logical_bytes, totals.unique.bytes),
        stage_seconds: StageSeconds {
            chunk: totals.read_time.as_secs_f64(),
            fingerprint: totals.hash_time.as_secs_f64(),
            index: totals.index_time.as_secs_f64(),
            store: totals.store_time.as_secs_f64(),
            write: totals.write_time.as_secs_f64(),
            commit: 0.0,
        },
        index: index.stats(),
        ..BackupStats::default()
    };
    let snap_time = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut snap = Snapshot {
        id,
        time: snap_time,
        label: options.label.clone(),
        source: options.source.clone(),
        logical_bytes,
        stats,
    };
    // The snapshot's own size is not known before it is encoded; count it from a first encoding.
    let snapshot_len = snap.encode()?.len() as u64;
    snap.stats.stage_seconds.commit = commit_started.elapsed().as_secs_f64();
    snap.stats.seconds = started.elapsed().as_secs_f64();
    snap.stats.throughput_mb_s = logical_bytes as f64 / 1e6 / snap.stats.seconds.max(1e-9);
    snap.stats.bytes_written = repo.io_stats().since(&io_before).write_bytes + snapshot_len;
    repo.backend()
        .write(&snapshot::snapshot_key(id), &snap.encode()?)?;
    Ok(snap)
}

/// Logical / stored bytes; `None` when nothing was stored.
pub fn ratio(logical: u64, stored: u64) -> Option<f64> {
    (stored > 0).then(|| logical as f64 / stored as f64)
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
        if tx.send(RawBlock { buf, len, eof }).is_err() || eof {
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

/// Stage 1b: cuts blocks into chunks. Bytes past the last final boundary of
/// a block are carried into the headroom of the next block.
fn cut_blocks(
    chunker: &dyn Chunker,
    pool: &BufferPool,
    layout: BlockLayout,
    rx: Receiver<RawBlock>,
    tx: Sender<Block>,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    let mut carry: Vec<u8> = Vec::with_capacity(layout.headroom);
    let mut seq = 0u64;
    for RawBlock { mut buf, len, eof } in rx {
        let t = Instant::now();
        // `cut_all` leaves fewer than `max_size` (= headroom) bytes uncut.
        let start = layout.headroom - carry.len();
        let end = layout.headroom + len;
        buf[start..layout.headroom].copy_from_slice(&carry);
        let mut lengths = Vec::with_capacity((end - start) / 4096 + 1);
        let used = cut_all(chunker, &buf[start..end], eof, &mut lengths);
        carry.clear();
        carry.extend_from_slice(&buf[start + used..end]);
        busy += t.elapsed();
        let n = lengths.len() as u64;
        if n > 0 {
            let block = Block {
                data: pool.share(buf, start..start + used),
                lengths,
                first_seq: seq,
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

/// Stage 2: fingerprints the chunks of each block in parallel.
fn fingerprint(
    algo: FingerprintAlgo,
    rx: Receiver<Block>,
    tx: Sender<Vec<Chunk>>,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    for block in rx {
        let t = Instant::now();
        let mut offsets = Vec::with_capacity(block.lengths.len());
        let mut off = 0usize;
        for &len in &block.lengths {
            offsets.push(off);
            off += len as usize;
        }
        let chunks: Vec<Chunk> = offsets
            .par_iter()
            .zip(block.lengths.par_iter())
            .enumerate()
            .map(|(i, (&off, &len))| {
                let data = block.data.slice(off..off + len as usize);
                Chunk {
                    seq: block.first_seq + i as u64,
                    fp: algo.hash(&data),
                    len,
                    data: Some(data),
                }
            })
            .collect();
        busy += t.elapsed();
        if tx.send(chunks).is_err() {
            break;
        }
    }
    Ok(busy)
}

/// Stage 4 (background, [`WRITERS`] threads): seals full containers and
/// writes each atomically. After a failure the other writers stop too; the
/// backup then fails before anything refers to the containers.
fn write_containers(
    backend: &dyn Backend,
    rx: Receiver<Builder>,
    stop: &AtomicBool,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    for builder in rx {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        let id = builder.id();
        let written = backend.write(&container::key(id), &builder.seal());
        busy += t.elapsed();
        if written.is_err() {
            stop.store(true, Ordering::Relaxed);
            return written.map(|()| busy);
        }
    }
    Ok(busy)
}

/// Stage 3: asks the index, restores stream order, fills containers and
/// builds the recipe.
fn store_chunks(
    index: &mut dyn DedupIndex,
    store: &mut Store,
    rx: Receiver<Vec<Chunk>>,
    options: &BackupOptions,
) -> Result<Vec<ChunkRef>> {
    let mut recipe = Vec::new();
    let mut reorder = Reorder::default();
    let mut decided = Vec::new();
    let mut ready = Vec::new();
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
        reorder.push(decided.drain(..), &mut ready);
        store.totals.index_time += t.elapsed();

        let t = Instant::now();
        let placed_before = store.placed.len();
        for (chunk, decision) in ready.drain(..) {
            done_bytes += u64::from(chunk.len);
            recipe.push(store.put(chunk, decision)?);
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
    Ok(recipe)
}

/// Fills containers with the chunks to store and remembers where this
/// backup's chunks went (for internal duplicates).
struct Store {
    open: Option<Builder>,
    next_container: ContainerId,
    capacity: usize,
    tx: Sender<Builder>,
    here: FingerprintMap<ContainerId>,
    placed: Vec<(Fingerprint, ContainerId)>,
    totals: StoreTotals,
}

/// Counters and timings of a backup's stages.
#[derive(Default)]
struct StoreTotals {
    next_container: ContainerId,
    unique: ClassCount,
    internal: ClassCount,
    duplicates: ClassCount,
    containers_written: u64,
    index_time: Duration,
    store_time: Duration,
    read_time: Duration,
    hash_time: Duration,
    write_time: Duration,
}

impl Store {
    fn new(next_container: ContainerId, capacity: usize, tx: Sender<Builder>) -> Self {
        Store {
            open: None,
            next_container,
            capacity,
            tx,
            here: FingerprintMap::default(),
            placed: Vec::new(),
            totals: StoreTotals::default(),
        }
    }

    /// Records one decided chunk, storing it if it is unique.
    fn put(&mut self, chunk: Chunk, decision: Decision) -> Result<ChunkRef> {
        let container = match decision {
            Decision::Duplicate(c) => {
                self.totals.duplicates.add(chunk.len);
                c
            }
            Decision::InternalDuplicate => {
                self.totals.internal.add(chunk.len);
                *self.here.get(&chunk.fp).ok_or_else(|| {
                    Error::Pipeline(format!(
                        "chunk {} decided an internal duplicate before its first occurrence",
                        chunk.seq
                    ))
                })?
            }
            Decision::Unique => {
                self.totals.unique.add(chunk.len);
                let data = chunk.data.as_deref().ok_or_else(|| {
                    Error::Pipeline(format!("chunk {} has no data to store", chunk.seq))
                })?;
                let c = self.append(&chunk, data)?;
                self.here.insert(chunk.fp, c);
                self.placed.push((chunk.fp, c));
                c
            }
        };
        Ok(ChunkRef {
            fp: chunk.fp,
            len: chunk.len,
            container,
        })
    }

    fn append(&mut self, chunk: &Chunk, data: &[u8]) -> Result<ContainerId> {
        if self.open.as_ref().is_some_and(|b| !b.fits(data.len())) {
            self.seal()?;
        }
        let builder = match &mut self.open {
            Some(b) => b,
            None => {
                let b = Builder::new(self.next_container, self.capacity);
                self.next_container += 1;
                self.open.insert(b)
            }
        };
        builder.push(chunk.fp, data);
        Ok(builder.id())
    }

    fn seal(&mut self) -> Result<()> {
        if let Some(b) = self.open.take() {
            // The writers serialise it, off this thread.
            self.tx
                .send(b)
                .map_err(|_| Error::Pipeline("container writer stopped".into()))?;
            self.totals.containers_written += 1;
        }
        Ok(())
    }

    /// Seals the last container and closes the queue to the writer.
    fn finish(mut self) -> Result<StoreTotals> {
        self.seal()?;
        self.totals.next_container = self.next_container;
        Ok(self.totals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunker::{ChunkerKind, ChunkerParams};
    use crate::config::Config;
    use crate::restore::{restore, RestoreOptions};

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

    fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
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
}
