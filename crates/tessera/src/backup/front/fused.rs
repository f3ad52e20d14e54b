//! The front end's cutting and fingerprinting fused, on the rayon pool.
//!
//! Every block read is one rayon task: it cuts the block's bytes into
//! chains of chunks (in [`PIECES`] pieces, and restarting at every segment
//! end, as `cut_blocks` does) and fingerprints them, not knowing yet where
//! the block's first chunk starts (that depends on the bytes the previous
//! block could not cut). Up to [`IN_FLIGHT`] blocks are in flight at once.
//! Then, in stream order on this stage's thread, each block is *stitched*
//! ([`stitch`]): the previous block's uncut tail is copied in front of it
//! and the true boundaries are walked from there, adopting a chain, with
//! its fingerprints, wherever a true boundary is one of its boundaries, and
//! cutting serially elsewhere (usually a few chunks at the block start;
//! those are fingerprinted afterwards, on the pool when they are many).
//! Cut points and fingerprints are those of `cut_blocks` followed by
//! `fingerprint`, bit for bit; no single thread chunks the whole stream.

use super::{
    assemble, ordered_on_pool, reused_misplaced, whole_misplaced, BufferPool, Mark, RawBlock,
};
use crate::chunker::{piece_starts, stitch, Chain, ChunkLabels, Chunker};
use crate::error::Result;
use crate::fingerprint::{BatchHasher, Fingerprint, FINGERPRINT_LEN};
use crate::index::Chunk;
use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Pieces a block's bytes are cut in, each on its own (besides segment
/// ends): one, as blocks in flight keep the threads busy and every piece
/// start costs a resynchronisation (a few chunks cut twice).
pub(super) const PIECES: usize = 1;
/// Blocks cut and fingerprinted on the rayon pool at once.
const IN_FLIGHT: usize = 4;

/// Labels chunks with their fingerprints, timing the hashing.
struct Hashing<'a> {
    hasher: &'a dyn BatchHasher,
    nanos: AtomicU64,
}

impl ChunkLabels for Hashing<'_> {
    type Label = Fingerprint;
    fn label(&self, data: &[u8], start: usize, lengths: &[u32], out: &mut Vec<Fingerprint>) {
        let t = Instant::now();
        let mut off = start;
        let slices: Vec<&[u8]> = lengths
            .iter()
            .map(|&n| {
                let chunk = &data[off..off + n as usize];
                off += n as usize;
                chunk
            })
            .collect();
        self.hasher.hash_batch(&slices, out);
        let spent = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(spent, Ordering::Relaxed);
    }
}

/// Labels the chunks a stitch cuts serially with a placeholder and notes
/// them, to be hashed once the block is stitched: in parallel when they are
/// many (where no chain met the true boundaries: a long run of
/// maximum-size chunks, say), so that a stitch does no more serial work than
/// cutting.
#[derive(Default)]
struct Deferred {
    /// (index in the block's fingerprints, start, length) of each chunk.
    chunks: Mutex<Vec<(usize, usize, usize)>>,
}

impl ChunkLabels for Deferred {
    type Label = Fingerprint;
    fn label(&self, _: &[u8], start: usize, lengths: &[u32], out: &mut Vec<Fingerprint>) {
        let mut chunks = self.chunks.lock().unwrap_or_else(PoisonError::into_inner);
        let mut off = start;
        for &n in lengths {
            chunks.push((out.len(), off, n as usize));
            out.push(Fingerprint([0; FINGERPRINT_LEN]));
            off += n as usize;
        }
    }
}

/// Up to this many serially cut chunks of a block are hashed on the
/// stitching thread (a stitch that meets a chain cuts a few); more on the
/// rayon pool.
const SERIAL_HASH_CHUNKS: usize = 16;

/// A part of a raw block, in offsets of its input bytes (after the headroom).
enum Part {
    /// Cut from where the previous part stopped up to `end` (with `eof`:
    /// to the end); its speculative chains start at `from`.
    Cut { from: usize, end: usize, eof: bool },
    /// Chunks given whole at `at`, a segment boundary.
    Reused {
        at: usize,
        chunks: Vec<(Fingerprint, u32)>,
    },
    /// A whole segment of `len` bytes at `at`, one chunk.
    Whole { at: usize, len: usize },
}

/// The parts of a block of `len` input bytes with these marks.
fn parts(marks: Vec<Mark>, len: usize, eof: bool) -> Vec<Part> {
    let mut parts = Vec::with_capacity(marks.len() + 1);
    let mut from = 0;
    for mark in marks {
        match mark {
            Mark::End(e) => {
                let end = e.min(len);
                parts.push(Part::Cut {
                    from,
                    end,
                    eof: true,
                });
                from = end;
            }
            Mark::Reused(at, chunks) => parts.push(Part::Reused { at, chunks }),
            Mark::Whole(at, n) => {
                parts.push(Part::Whole { at, len: n });
                from = at.saturating_add(n).min(len);
            }
        }
    }
    parts.push(Part::Cut {
        from: from.min(len),
        end: len,
        eof,
    });
    parts
}

/// A block cut and fingerprinted speculatively.
struct Speculated {
    buf: Vec<u8>,
    len: usize,
    parts: Vec<Part>,
    /// The chains, in order, and the index of the part of each.
    chains: Vec<Chain<Fingerprint>>,
    chain_parts: Vec<usize>,
    cut: Duration,
    hash: Duration,
}

/// Cuts and fingerprints a raw block's parts (the rayon task of a block).
fn speculate(
    chunker: &dyn Chunker,
    hasher: &dyn BatchHasher,
    headroom: usize,
    pieces: usize,
    block: RawBlock,
) -> Speculated {
    let t = Instant::now();
    let RawBlock {
        buf,
        len,
        eof,
        marks,
    } = block;
    let parts = parts(marks, len, eof);
    let max = chunker.max_size();
    // (part, start, stop, end, eof) of every chain, in buffer offsets.
    let mut spans = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        match *part {
            Part::Cut { from, end, eof } if end > from => {
                let starts = piece_starts(end - from, pieces, max);
                for (j, &s) in starts.iter().enumerate() {
                    let stop = starts.get(j + 1).map_or(end, |&next| from + next);
                    spans.push((i, headroom + from + s, headroom + stop, headroom + end, eof));
                }
            }
            Part::Whole { at, len: n } if n > 0 && n <= max && at.saturating_add(n) <= len => {
                spans.push((i, headroom + at, headroom + at + n, headroom + at + n, true));
            }
            _ => {}
        }
    }
    let labels = Hashing {
        hasher,
        nanos: AtomicU64::new(0),
    };
    let chains: Vec<Chain<Fingerprint>> = spans
        .par_iter()
        .map(|&(i, start, stop, end, eof)| {
            let data = &buf[..end];
            if matches!(parts[i], Part::Whole { .. }) {
                Chain::of(&labels, data, start, vec![(stop - start) as u32])
            } else {
                Chain::cut(chunker, &labels, data, eof, start, stop)
            }
        })
        .collect();
    let hash = Duration::from_nanos(labels.nanos.load(Ordering::Relaxed));
    Speculated {
        buf,
        len,
        chain_parts: spans.iter().map(|s| s.0).collect(),
        parts,
        chains,
        cut: t.elapsed().saturating_sub(hash),
        hash,
    }
}

/// The stream position between blocks.
struct Stitcher<'a> {
    chunker: &'a dyn Chunker,
    hasher: &'a dyn BatchHasher,
    deferred: Deferred,
    /// Time spent hashing serially cut chunks.
    hashing: Duration,
    pool: &'a BufferPool,
    whole_from: &'a AtomicU64,
    /// The uncut tail of the previous block, still in that block's buffer.
    carry: Bytes,
    /// The sequence number of the next chunk.
    seq: u64,
}

impl Stitcher<'_> {
    /// The chunks of a speculated block, in stream order (none if it holds
    /// no chunk); keeps its uncut tail for the next.
    fn block(&mut self, spec: Speculated) -> Result<Option<Vec<Chunk>>> {
        let Speculated {
            mut buf,
            len,
            parts,
            mut chains,
            chain_parts,
            ..
        } = spec;
        let headroom = self.pool.layout.headroom;
        let carried = self.carry.len();
        // Stitching leaves fewer than `max_size` (= headroom) bytes uncut.
        let start = headroom - carried;
        let end = headroom + len;
        buf[start..headroom].copy_from_slice(&self.carry);
        let mut lengths = Vec::with_capacity((end - start) / 4096 + 1);
        let mut fps = Vec::with_capacity(lengths.capacity());
        let mut used = 0;
        let mut reused = Vec::new();
        let mut reused_count = 0;
        let mut next = 0;
        for (i, part) in parts.into_iter().enumerate() {
            let first = next;
            while chain_parts.get(next) == Some(&i) {
                next += 1;
            }
            let chains = &mut chains[first..next];
            match part {
                Part::Cut { end, eof, .. } => {
                    let (pos, _) = stitch(
                        self.chunker,
                        &self.deferred,
                        &buf[..headroom + end],
                        eof,
                        start + used,
                        chains,
                        &mut lengths,
                        &mut fps,
                    );
                    used = pos - start;
                }
                Part::Reused { at, chunks } => {
                    // Every byte before them is cut: they start a segment.
                    if used != carried + at {
                        return Err(reused_misplaced());
                    }
                    reused_count += chunks.len();
                    reused.push((lengths.len(), chunks));
                }
                Part::Whole { at, len: n } => {
                    // Every byte before it is cut; it is one chunk.
                    let fp = chains.first_mut().map(|c| c.take_labels());
                    let fp = match fp.as_deref() {
                        Some(&[fp]) if used == carried + at => fp,
                        _ => return Err(whole_misplaced(n)),
                    };
                    if self.whole_from.load(Ordering::Relaxed) == u64::MAX {
                        let at = self.seq + (lengths.len() + reused_count) as u64;
                        self.whole_from.store(at, Ordering::Release);
                    }
                    lengths.push(n as u32);
                    fps.push(fp);
                    used += n;
                }
            }
        }
        self.hash_deferred(&buf, &mut fps);
        let data = self.pool.share(buf, start..end);
        self.carry = data.slice(used..);
        let first_seq = self.seq;
        let n = lengths.len() + reused_count;
        self.seq += n as u64;
        Ok((n > 0).then(|| assemble(&data.slice(..used), &lengths, fps, reused, first_seq)))
    }

    /// Fingerprints the chunks of `buf` the stitch cut serially into their places in `fps`.
    fn hash_deferred(&mut self, buf: &[u8], fps: &mut [Fingerprint]) {
        let chunks = std::mem::take(
            &mut *self
                .deferred
                .chunks
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if chunks.is_empty() {
            return;
        }
        let t = Instant::now();
        let hash = |group: &[(usize, usize, usize)]| {
            let slices: Vec<&[u8]> = group.iter().map(|&(_, s, n)| &buf[s..s + n]).collect();
            let mut out = Vec::with_capacity(slices.len());
            self.hasher.hash_batch(&slices, &mut out);
            out
        };
        let hashed = if chunks.len() <= SERIAL_HASH_CHUNKS {
            hash(&chunks)
        } else {
            chunks.par_chunks(8).flat_map_iter(hash).collect()
        };
        for (&(i, _, _), fp) in chunks.iter().zip(hashed) {
            fps[i] = fp;
        }
        self.hashing += t.elapsed();
    }
}

/// Stage 1b on several threads: cuts and fingerprints the blocks of `rx` on
/// the rayon pool and sends their chunks, in stream order, to `tx`. The
/// sequence number of the first chunk of a whole segment goes to
/// `whole_from` (before the block holding it is sent). Each block is cut in
/// `pieces` pieces ([`PIECES`]). Returns the time spent cutting and
/// hashing, summed over the threads.
pub(super) fn cut_and_hash(
    chunker: &dyn Chunker,
    hasher: &dyn BatchHasher,
    pool: &BufferPool,
    whole_from: &AtomicU64,
    rx: Receiver<RawBlock>,
    tx: Sender<Vec<Chunk>>,
    pieces: usize,
) -> Result<(Duration, Duration)> {
    let headroom = pool.layout.headroom;
    let mut stitcher = Stitcher {
        chunker,
        hasher,
        deferred: Deferred::default(),
        hashing: Duration::ZERO,
        pool,
        whole_from,
        carry: Bytes::new(),
        seq: 0,
    };
    let (mut cut, mut hash) = (Duration::ZERO, Duration::ZERO);
    let mut stitching = Duration::ZERO;
    ordered_on_pool(
        &rx,
        IN_FLIGHT,
        |block| speculate(chunker, hasher, headroom, pieces, block),
        |spec| {
            cut += spec.cut;
            hash += spec.hash;
            let t = Instant::now();
            let chunks = stitcher.block(spec)?;
            stitching += t.elapsed();
            // The consumer stopped: its error is reported, not ours.
            Ok(chunks.is_none_or(|chunks| tx.send(chunks).is_ok()))
        },
    )?;
    let serial_hash = stitcher.hashing;
    Ok((
        cut + stitching.saturating_sub(serial_hash),
        hash + serial_hash,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::{read_blocks, read_segments, BlockLayout, QUEUE_DEPTH};
    use super::*;
    use crate::backup::{SegmentRead, Segments};
    use crate::chunker::{cut_all, pseudo_random, ChunkerKind, ChunkerParams};
    use crate::fingerprint::FingerprintAlgo;
    use crate::format::snapshot::TreeRef;
    use crossbeam_channel::{bounded, unbounded};
    use proptest::prelude::*;

    const HASHER: FingerprintAlgo = FingerprintAlgo::Blake3;

    /// A segment of a test stream.
    #[derive(Clone, Debug)]
    enum Item {
        /// Bytes, chunked on their own.
        Data(Vec<u8>),
        /// Chunks given without bytes.
        Reused(Vec<(Fingerprint, u32)>),
        /// A whole segment: one chunk.
        Whole(Vec<u8>),
    }

    /// The items fed in reads of at most `piece` bytes.
    struct Feed {
        items: Vec<Item>,
        at: (usize, usize),
        piece: usize,
        taken: Vec<(Fingerprint, u32)>,
    }

    impl Segments for Feed {
        fn read(&mut self, buf: &mut [u8]) -> crate::error::Result<SegmentRead> {
            let (i, off) = self.at;
            let Some(item) = self.items.get(i) else {
                return Ok(SegmentRead::End);
            };
            Ok(match item {
                Item::Data(v) if off < v.len() => {
                    let n = self.piece.min(buf.len()).min(v.len() - off);
                    buf[..n].copy_from_slice(&v[off..off + n]);
                    self.at.1 += n;
                    SegmentRead::Data(n)
                }
                Item::Data(_) => {
                    self.at = (i + 1, 0);
                    SegmentRead::SegmentEnd
                }
                Item::Reused(chunks) => {
                    self.taken = chunks.clone();
                    self.at = (i + 1, 0);
                    SegmentRead::Reused
                }
                Item::Whole(v) => {
                    buf[..v.len()].copy_from_slice(v);
                    self.at = (i + 1, 0);
                    SegmentRead::Whole(v.len())
                }
            })
        }

        fn take_reused(&mut self) -> Vec<(Fingerprint, u32)> {
            std::mem::take(&mut self.taken)
        }

        fn tree(&mut self) -> Option<TreeRef> {
            None
        }
    }

    /// (fingerprint, length, bytes) of each chunk, and the sequence number
    /// of the first whole segment's chunk.
    type Stream = (Vec<(Fingerprint, u32, Option<Vec<u8>>)>, u64);

    /// What a serial cut and hash of every item makes.
    fn expected(chunker: &dyn Chunker, items: &[Item]) -> Stream {
        let mut out = Vec::new();
        let mut whole_from = u64::MAX;
        for item in items {
            match item {
                Item::Data(v) => {
                    let mut lengths = Vec::new();
                    cut_all(chunker, v, true, &mut lengths);
                    let mut off = 0;
                    for n in lengths {
                        let bytes = &v[off..off + n as usize];
                        out.push((HASHER.hash(bytes), n, Some(bytes.to_vec())));
                        off += n as usize;
                    }
                }
                Item::Reused(chunks) => out.extend(chunks.iter().map(|&(fp, n)| (fp, n, None))),
                Item::Whole(v) => {
                    if whole_from == u64::MAX {
                        whole_from = out.len() as u64;
                    }
                    out.push((HASHER.hash(v), v.len() as u32, Some(v.clone())));
                }
            }
        }
        (out, whole_from)
    }

    /// Runs `feed` into [`cut_and_hash`] with blocks of `read_len` bytes.
    fn fused<F>(chunker: &dyn Chunker, read_len: usize, pieces: usize, feed: F) -> Stream
    where
        F: FnOnce(&BufferPool, BlockLayout, Sender<RawBlock>) -> crate::error::Result<Duration>
            + Send,
    {
        let layout = BlockLayout {
            headroom: chunker.max_size(),
            read_len,
        };
        let pool = BufferPool::new(layout);
        let whole_from = AtomicU64::new(u64::MAX);
        let (raw_tx, raw_rx) = bounded(QUEUE_DEPTH);
        let (tx, rx) = unbounded();
        std::thread::scope(|s| {
            let reader = s.spawn(|| feed(&pool, layout, raw_tx));
            cut_and_hash(chunker, &HASHER, &pool, &whole_from, raw_rx, tx, pieces).unwrap();
            reader.join().unwrap().unwrap();
        });
        let chunks: Vec<Chunk> = rx.into_iter().flatten().collect();
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.seq, i as u64, "sequence numbers");
        }
        let chunks = chunks
            .into_iter()
            .map(|c| (c.fp, c.len, c.data.map(|d| d.to_vec())))
            .collect();
        (chunks, whole_from.into_inner())
    }

    fn params(kind: usize) -> ChunkerParams {
        ChunkerParams {
            kind: [ChunkerKind::Fastcdc, ChunkerKind::Rabin, ChunkerKind::Fixed][kind],
            min_size: 256,
            avg_size: 1024,
            max_size: 4096,
        }
    }

    /// Random bytes, constant bytes, or a random block repeated (whose
    /// chains may never meet the true ones).
    fn data(shape: u8, len: usize, seed: u64) -> Vec<u8> {
        match shape % 3 {
            0 => pseudo_random(len, seed),
            1 => vec![seed as u8; len],
            _ => {
                let block = pseudo_random(1000, seed);
                (0..len).map(|i| block[i % 1000]).collect()
            }
        }
    }

    fn item(kind: u8, len: usize, seed: u64, max: usize) -> Item {
        match kind % 4 {
            0 | 1 => Item::Data(data(kind / 4, len, seed)),
            2 => Item::Reused(
                (0..len % 7)
                    .map(|i| {
                        let fp = pseudo_random(FINGERPRINT_LEN, seed + i as u64);
                        (Fingerprint(fp.try_into().unwrap()), 1 + i as u32)
                    })
                    .collect(),
            ),
            _ => Item::Whole(pseudo_random(1 + len % max, seed)),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// A byte stream: the chunks and fingerprints of a serial cut and hash.
        #[test]
        fn fused_stream_is_the_serial_cut_and_hash(
            shape in 0u8..3,
            len in 0usize..400_000,
            seed: u64,
            read_len in prop_oneof![1usize..5000, 5000usize..200_000],
            pieces in 1usize..=4,
            kind in 0usize..3,
        ) {
            let chunker = params(kind).build().unwrap();
            let bytes = data(shape, len, seed);
            let want = expected(chunker.as_ref(), &[Item::Data(bytes.clone())]);
            let got = fused(chunker.as_ref(), read_len, pieces, |pool, layout, tx| {
                read_blocks(&mut &bytes[..], "input", pool, layout, tx)
            });
            prop_assert_eq!(got, want);
        }

        /// A segmented stream (a tree backup's) with reused runs and whole
        /// segments: every segment cut on its own, as a serial cut and hash does.
        #[test]
        fn fused_segments_are_the_serial_cut_and_hash(
            items in prop::collection::vec((0u8..12, 0usize..40_000, any::<u64>()), 0..24),
            read_len in prop_oneof![4096usize..10_000, 10_000usize..70_000],
            read_piece in 1usize..50_000,
            pieces in 1usize..=4,
            kind in 0usize..3,
        ) {
            let chunker = params(kind).build().unwrap();
            let max = chunker.max_size();
            let items: Vec<Item> = items
                .into_iter()
                .map(|(k, len, seed)| item(k, len, seed, max))
                .collect();
            let want = expected(chunker.as_ref(), &items);
            let got = fused(chunker.as_ref(), read_len, pieces, |pool, layout, tx| {
                let mut feed = Feed { items, at: (0, 0), piece: read_piece, taken: Vec::new() };
                read_segments(&mut feed, pool, layout, tx)
            });
            prop_assert_eq!(got, want);
        }
    }
}
