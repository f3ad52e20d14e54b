//! The backup pipeline: read → chunk → fingerprint (parallel) → deduplicate
//! → fill containers → write containers (background) → commit.
//!
//! Stages run on their own threads connected by bounded channels, so memory
//! stays within a few blocks whatever the input size. Commit order (DESIGN.md
//! rule 6): containers, then the index, then the recipe, then the snapshot;
//! a backup interrupted anywhere before the snapshot write is invisible.

use crate::backend::Backend;
use crate::chunker::{cut_all, Chunker};
use crate::container::{self, Builder, ContainerId};
use crate::error::{Error, Result};
use crate::fingerprint::{FingerprintAlgo, FingerprintMap};
use crate::index::{Chunk, Decision, DedupIndex, Reorder};
use crate::repo::Repository;
use crate::fingerprint::Fingerprint;
use crate::snapshot::{self, BackupStats, ChunkRef, ClassCount, Recipe, Snapshot, StageSeconds};
use bytes::{Bytes, BytesMut};
use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;
use std::io::{ErrorKind, Read};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Bytes read from the input per block.
const BLOCK_SIZE: usize = 8 * 1024 * 1024;
/// Blocks or batches queued between two stages.
const QUEUE_DEPTH: usize = 2;

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

    let (block_tx, block_rx) = bounded::<Block>(QUEUE_DEPTH);
    let (chunk_tx, chunk_rx) = bounded::<Vec<Chunk>>(QUEUE_DEPTH);
    let (container_tx, container_rx) = bounded::<(ContainerId, Vec<u8>)>(QUEUE_DEPTH);

    let (chunks, totals) = std::thread::scope(|s| -> Result<(Vec<ChunkRef>, StoreTotals)> {
        let reader = s.spawn(|| read_and_chunk(input, input_name, chunker.as_ref(), block_tx));
        let hasher = s.spawn(|| fingerprint(config.fingerprint, block_rx, chunk_tx));
        let writer = s.spawn(|| write_containers(backend.as_ref(), container_rx));
        let mut store = Store::new(next_container, config.container_size as usize, container_tx);
        let stored = store_chunks(index.as_mut(), &mut store, chunk_rx, options);
        // Close the container queue whatever happened, so that the writer ends.
        let totals = store.finish();
        let write_time = join(writer, "container writer");
        let hash_time = join(hasher, "fingerprinting");
        let read_time = join(reader, "input reader");
        // Report the earliest stage's error: a failing input explains the rest.
        let read_time = read_time?;
        let hash_time = hash_time?;
        let write_time = write_time?;
        let chunks = stored?;
        let mut totals = totals?;
        totals.read_time = read_time;
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

/// Stage 1: reads blocks of input and cuts them into chunks. Bytes past the
/// last final boundary of a block are carried into the next block.
fn read_and_chunk(
    input: &mut (dyn Read + Send),
    input_name: &str,
    chunker: &dyn Chunker,
    tx: Sender<Block>,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    let mut carry = BytesMut::new();
    let mut seq = 0u64;
    loop {
        let mut buf = BytesMut::with_capacity(BLOCK_SIZE.max(carry.len() * 2));
        buf.extend_from_slice(&carry);
        let t = Instant::now();
        let eof = fill(input, &mut buf, BLOCK_SIZE).map_err(|e| Error::Input {
            what: input_name.to_string(),
            source: e,
        })?;
        let mut lengths = Vec::with_capacity(buf.len() / 4096 + 1);
        let used = cut_all(chunker, &buf, eof, &mut lengths);
        busy += t.elapsed();
        let mut data = buf.freeze();
        carry = BytesMut::from(&data[used..]);
        data.truncate(used);
        let n = lengths.len() as u64;
        if n > 0 {
            let block = Block {
                data,
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
            return Ok(busy);
        }
    }
}

/// Reads until `buf` holds `target` bytes or the input ends; returns whether it ended.
fn fill(input: &mut dyn Read, buf: &mut BytesMut, target: usize) -> std::io::Result<bool> {
    while buf.len() < target {
        let start = buf.len();
        buf.resize(target, 0);
        match input.read(&mut buf[start..]) {
            Ok(0) => {
                buf.truncate(start);
                return Ok(true);
            }
            Ok(n) => buf.truncate(start + n),
            Err(e) if e.kind() == ErrorKind::Interrupted => buf.truncate(start),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
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

/// Stage 4 (background): writes sealed containers.
fn write_containers(
    backend: &dyn Backend,
    rx: Receiver<(ContainerId, Vec<u8>)>,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    for (id, bytes) in rx {
        let t = Instant::now();
        backend.write(&container::key(id), &bytes)?;
        busy += t.elapsed();
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
    tx: Sender<(ContainerId, Vec<u8>)>,
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
    fn new(next_container: ContainerId, capacity: usize, tx: Sender<(ContainerId, Vec<u8>)>) -> Self {
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
            let id = b.id();
            self.tx
                .send((id, b.seal()))
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
