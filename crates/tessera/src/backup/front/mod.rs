//! The front end of every backup: reads the input in blocks, cuts them
//! into chunks and fingerprints them, and sends the chunks in stream order
//! to the layout's back end ([`crate::layout::stream::ChunkStream`]).

use super::{SegmentRead, Segments, Source};

mod fused;
use crate::chunker::{cut_all, Chunker};
use crate::error::{Error, Result};
use crate::fingerprint::{BatchHasher, Fingerprint, Fingerprinter};
use crate::index::Chunk;
use crate::layout::stream::StreamFacts;
use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver, Select, Sender};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes read from the input per block (at least four maximum-size chunks).
/// Small enough that a block is still in the CPU cache when the next stage
/// (chunking and hashing) reads it after it was copied in.
pub(super) const BLOCK_SIZE: usize = 1024 * 1024;

/// With at least this many rayon threads, blocks are cut and fingerprinted
/// together on the rayon pool, several at once, and stitched in stream
/// order ([`fused`]): no thread chunks the whole stream. On two cores that
/// measured about 10 % faster for duplicate data and no slower for fresh
/// data than one chunking thread feeding fingerprinting on the pool
/// (docs/MEASUREMENTS.md). That one is left for a single rayon thread (it
/// overlaps chunking with hashing) and for fixed-size chunking (cutting costs
/// nothing, and chains started at a block's start would not meet the true
/// ones).
pub(super) const FUSED_MIN_THREADS: usize = 2;

/// Blocks or batches queued between two stages.
pub(super) const QUEUE_DEPTH: usize = 4;

/// With one rayon thread: blocks being fingerprinted or waiting for it on
/// the rayon pool at once.
pub(super) const HASH_IN_FLIGHT: usize = QUEUE_DEPTH;

/// A block of input as read, in a pooled buffer: the bytes are at
/// `buf[layout.headroom..layout.headroom + len]`, leaving room in front for
/// the bytes the previous block could not cut yet.
pub(super) struct RawBlock {
    pub(super) buf: Vec<u8>,
    pub(super) len: usize,
    pub(super) eof: bool,
    /// Segment ends and reused chunks within the block, in stream order
    /// (segmented sources only).
    pub(super) marks: Vec<Mark>,
}

/// A point of a segmented block.
pub(super) enum Mark {
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
pub(super) const REUSED_PER_BLOCK: usize = 4096;

/// Where input bytes go in a pooled block buffer.
#[derive(Clone, Copy)]
pub(super) struct BlockLayout {
    /// Room in front of the input for carried bytes (fewer than a maximum-size chunk).
    pub(super) headroom: usize,
    /// Input bytes read per block.
    pub(super) read_len: usize,
}

impl BlockLayout {
    pub(super) fn new(max_chunk: usize) -> Self {
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
pub(super) struct BufferPool {
    pub(super) layout: BlockLayout,
    pub(super) size: usize,
    pub(super) idle_tx: Sender<Vec<u8>>,
    pub(super) idle_rx: Receiver<Vec<u8>>,
}

/// A pooled buffer owned by the `Bytes` of a block.
pub(super) struct PooledBuffer {
    pub(super) buf: Vec<u8>,
    pub(super) home: Sender<Vec<u8>>,
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        // The pool is full or gone: free the buffer.
        let _ = self.home.try_send(std::mem::take(&mut self.buf));
    }
}

impl BufferPool {
    pub(super) fn new(layout: BlockLayout) -> Self {
        // Idle buffers kept: about as many as the queues can hold at once.
        let (idle_tx, idle_rx) = bounded(3 * QUEUE_DEPTH + 4);
        BufferPool {
            layout,
            size: layout.headroom + layout.read_len,
            idle_tx,
            idle_rx,
        }
    }

    pub(super) fn take(&self) -> Vec<u8> {
        self.idle_rx
            .try_recv()
            .unwrap_or_else(|_| vec![0; self.size])
    }

    /// `buf[range]` as `Bytes`; the buffer returns to the pool when the last reference drops.
    pub(super) fn share(&self, buf: Vec<u8>, range: std::ops::Range<usize>) -> Bytes {
        Bytes::from_owner(PooledBuffer {
            buf,
            home: self.idle_tx.clone(),
        })
        .slice(range)
    }
}

/// A block of input cut into chunks.
pub(super) struct Block {
    pub(super) data: Bytes,
    pub(super) lengths: Vec<u32>,
    pub(super) first_seq: u64,
    /// Chunks without bytes, each group inserted before `lengths[at]`.
    pub(super) reused: Vec<(usize, Vec<(Fingerprint, u32)>)>,
}

/// Handles of the front-end threads and the stage each runs; each thread
/// returns its busy time (reading and chunking, fingerprinting).
pub(super) type FrontEnd<'scope> = Vec<(
    &'static str,
    std::thread::ScopedJoinHandle<'scope, Result<(Duration, Duration)>>,
)>;

/// Starts the front end of `source` on threads of `s`: batches of
/// fingerprinted chunks, in stream order, go to `tx`.
pub(super) fn spawn_front_end<'scope, 'env, 'src: 'scope>(
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
pub(super) fn join_front_end(front: FrontEnd) -> Result<(Duration, Duration)> {
    let mut read = Duration::ZERO;
    let mut hash = Duration::ZERO;
    let joined: Vec<_> = front
        .into_iter()
        .map(|(stage, h)| crate::util::join_stage(h, stage))
        .collect();
    for r in joined {
        let (r, h) = r?;
        read += r;
        hash += h;
    }
    Ok((read, hash))
}

/// Stage 1 of a trace backup: batches the trace's chunks.
pub(super) fn read_trace(
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

/// Stage 1a: reads blocks of input into pooled buffers.
pub(super) fn read_blocks(
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
pub(super) fn read_segments(
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
pub(super) fn fill(input: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<(usize, bool)> {
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
pub(super) fn cut_blocks(
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
pub(super) fn reused_misplaced() -> Error {
    Error::Pipeline("reused chunks do not start at a segment boundary".into())
}

/// The error of a whole segment of `n` bytes given within a segment, or too long.
pub(super) fn whole_misplaced(n: usize) -> Error {
    Error::Pipeline(format!(
        "a whole segment of {n} bytes does not start at a segment boundary or exceeds \
         the maximum chunk size"
    ))
}

/// Stage 2 with one rayon thread: fingerprints blocks on the rayon pool, a
/// whole block per task, and forwards their chunks in stream order, up to
/// [`HASH_IN_FLIGHT`] blocks queued at once ([`ordered_on_pool`]). Returns
/// the summed hashing time.
pub(super) fn fingerprint(
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
pub(super) fn ordered_on_pool<I: Send, R: Send>(
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
pub(super) fn hash_block(hasher: &dyn BatchHasher, block: Block) -> Vec<Chunk> {
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
pub(super) fn assemble(
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

impl AsRef<[u8]> for PooledBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}
