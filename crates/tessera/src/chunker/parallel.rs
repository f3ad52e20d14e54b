//! Parallel chunking of large buffers with boundary stitching.
//!
//! [`cut_parallel`] splits a buffer into contiguous pieces, chunks every
//! piece on its own rayon task as if the piece started at a chunk boundary
//! (*speculative* boundaries), and then walks the true boundaries serially:
//! from wherever the true boundaries have reached, it cuts with the chunker
//! exactly as [`cut_all`] does until a true boundary coincides with a
//! speculative one, and from there adopts the speculative boundaries of that
//! piece. That is exact because a [`Chunker`] is stateless between chunks:
//! the chunk starting at a position depends only on the bytes from there
//! (at most `max_size` of them, fewer only at the end of the input), so two
//! chains of cuts that share one boundary share all later ones.
//!
//! Content-defined chunkers resynchronise within a few chunks, so the serial
//! part is small. A piece whose speculative chain never meets the true one
//! (periodic data whose period does not divide the piece offset, say) is
//! simply cut serially: the result is always that of [`cut_all`], only the
//! speed-up is lost. Piece starts are multiples of `max_size`, so that
//! fixed-size chunking, whose true boundaries are the multiples of its chunk
//! size, meets every piece at its first boundary.
//!
//! The pieces ([`Chain`]) and the walk ([`stitch`]) are also the backup
//! pipeline's (`backup/fused.rs`): there a chain carries a label per chunk
//! computed in the same task ([`ChunkLabels`]: its fingerprint), the walk
//! may start anywhere (after the bytes the previous block left uncut), and
//! chains of several blocks are cut at once.

use super::{cut_all, Chunker};
use rayon::prelude::*;

/// The length of the chunk starting at `pos`, by the rule of [`cut_all`], or
/// `None` where `cut_all` stops there: at the end of `data`, or, without
/// `eof`, where fewer than `max_size` bytes are left.
fn step(chunker: &dyn Chunker, data: &[u8], pos: usize, eof: bool) -> Option<usize> {
    let remaining = data.len().checked_sub(pos).filter(|&r| r > 0)?;
    let max = chunker.max_size();
    if !eof && remaining < max {
        return None;
    }
    let window = &data[pos..pos + remaining.min(max)];
    Some(chunker.cut(window).clamp(1, window.len()))
}

/// What a chain computes for each of its chunks besides its length, in the
/// same parallel task (the backup pipeline: its fingerprint).
pub trait ChunkLabels: Sync {
    /// The label of one chunk.
    type Label: Send;
    /// Appends the labels of the chunks of `lengths`, which tile `data` from `start`.
    fn label(&self, data: &[u8], start: usize, lengths: &[u32], out: &mut Vec<Self::Label>);
}

/// No labels: chunk lengths only ([`cut_parallel`]).
struct NoLabels;

impl ChunkLabels for NoLabels {
    type Label = ();
    fn label(&self, _: &[u8], _: usize, lengths: &[u32], out: &mut Vec<()>) {
        out.resize(out.len() + lengths.len(), ());
    }
}

/// The speculative chain of one piece: boundaries of `data` (the whole
/// buffer) from `start`, as if `start` were a chunk boundary, up to the first
/// one at or past `stop` (or where [`step`] stops), and the chunks' labels.
pub struct Chain<L> {
    start: usize,
    /// Lengths of the chain's chunks, the first starting at `start`.
    lengths: Vec<u32>,
    /// Their labels.
    labels: Vec<L>,
    /// Where the chain ends: `start` plus the sum of `lengths`.
    end: usize,
    /// Stitching cursor: the chain's boundary `pos` is at `start + lengths[..next]`.
    next: usize,
    pos: usize,
}

impl<L> Chain<L> {
    /// Cuts the chain of `data` from `start` to the first boundary at or
    /// past `stop`, then labels its chunks.
    pub fn cut<C: ChunkLabels<Label = L> + ?Sized>(
        chunker: &dyn Chunker,
        labels: &C,
        data: &[u8],
        eof: bool,
        start: usize,
        stop: usize,
    ) -> Chain<L> {
        let mut lengths = Vec::with_capacity(stop.saturating_sub(start) / 4096 + 1);
        let mut pos = start;
        while pos < stop {
            let Some(n) = step(chunker, data, pos, eof) else {
                break;
            };
            // `n <= max_size <= u32::MAX` for every chunker `ChunkerParams` builds.
            lengths.push(n as u32);
            pos += n;
        }
        Chain::of(labels, data, start, lengths)
    }

    /// The chain of the given chunks of `data` from `start`, labelled (a
    /// segment given whole, say); they must lie within `data`.
    pub fn of<C: ChunkLabels<Label = L> + ?Sized>(
        labels: &C,
        data: &[u8],
        start: usize,
        lengths: Vec<u32>,
    ) -> Chain<L> {
        let mut out = Vec::with_capacity(lengths.len());
        labels.label(data, start, &lengths, &mut out);
        let end = start + lengths.iter().map(|&n| n as usize).sum::<usize>();
        Chain {
            start,
            lengths,
            labels: out,
            end,
            next: 0,
            pos: start,
        }
    }

    /// Moves the chunk after boundary `at` of this chain, and all the
    /// chain's chunks after it, to `lengths` and `labels`, if `at` is one
    /// of its boundaries with chunks after it. Calls must come with
    /// non-decreasing `at`.
    fn take_from(&mut self, at: usize, lengths: &mut Vec<u32>, labels: &mut Vec<L>) -> bool {
        while self.pos < at && self.next < self.lengths.len() {
            self.pos += self.lengths[self.next] as usize;
            self.next += 1;
        }
        if self.pos != at || self.next >= self.lengths.len() {
            return false;
        }
        lengths.extend_from_slice(&self.lengths[self.next..]);
        labels.extend(self.labels.drain(self.next..));
        self.next = self.lengths.len();
        self.pos = self.end;
        true
    }

    /// Takes the labels of the chain's chunks, in order.
    pub fn take_labels(&mut self) -> Vec<L> {
        std::mem::take(&mut self.labels)
    }
}

/// Where the pieces of `len` bytes start: `segments` about equal pieces,
/// their starts rounded down to multiples of `max` and deduplicated.
pub fn piece_starts(len: usize, segments: usize, max: usize) -> Vec<usize> {
    let max = max.max(1);
    let mut starts: Vec<usize> = (0..segments)
        .map(|j| {
            // j * len / segments without overflow.
            let s = (j as u128 * len as u128 / segments as u128) as usize;
            s - s % max
        })
        .collect();
    starts.dedup();
    starts
}

/// Cuts `data` into chunks like [`cut_all`], chunking `segments` pieces of it
/// in parallel on the rayon thread pool.
///
/// Same contract and same result as [`cut_all`], bit for bit: appends the
/// chunk lengths to `lengths` and returns the number of bytes consumed;
/// without `eof`, stops before the first chunk whose end could still move
/// with more input (fewer than `max_size` bytes left). With `segments <= 1`
/// (or a buffer too small to split at multiples of `max_size`) it is `cut_all`.
///
/// The speed-up needs pieces of several maximum-size chunks each; the work
/// beyond `cut_all`'s is the serial resynchronisation at each piece start
/// (usually a few chunks), and, for a piece that never resynchronises, that
/// whole piece (then cut twice).
pub fn cut_parallel(
    chunker: &dyn Chunker,
    data: &[u8],
    eof: bool,
    segments: usize,
    lengths: &mut Vec<u32>,
) -> usize {
    cut_parallel_counted(chunker, data, eof, segments, lengths).0
}

/// [`cut_parallel`], also returning how many chunks were cut serially while stitching.
fn cut_parallel_counted(
    chunker: &dyn Chunker,
    data: &[u8],
    eof: bool,
    segments: usize,
    lengths: &mut Vec<u32>,
) -> (usize, usize) {
    let starts = piece_starts(data.len(), segments.min(data.len()), chunker.max_size());
    if starts.len() <= 1 {
        let before = lengths.len();
        let used = cut_all(chunker, data, eof, lengths);
        return (used, lengths.len() - before);
    }
    let mut pieces: Vec<Chain<()>> = starts
        .par_iter()
        .enumerate()
        .map(|(j, &start)| {
            let stop = starts.get(j + 1).copied().unwrap_or(data.len());
            Chain::cut(chunker, &NoLabels, data, eof, start, stop)
        })
        .collect();
    stitch(
        chunker,
        &NoLabels,
        data,
        eof,
        0,
        &mut pieces,
        lengths,
        &mut Vec::new(),
    )
}

/// Walks the true boundaries of `data` from `from` (a true boundary),
/// adopting a chain (and its labels) wherever a true boundary is one of its
/// boundaries and cutting (and labelling) serially elsewhere, exactly as
/// [`cut_all`] cuts `data[from..]`. `chains` are in order of their starts.
/// Returns where the cut stopped (`from` plus the bytes consumed) and the
/// number of chunks cut serially.
#[allow(clippy::too_many_arguments)]
pub fn stitch<C: ChunkLabels + ?Sized>(
    chunker: &dyn Chunker,
    labeller: &C,
    data: &[u8],
    eof: bool,
    from: usize,
    chains: &mut [Chain<C::Label>],
    lengths: &mut Vec<u32>,
    labels: &mut Vec<C::Label>,
) -> (usize, usize) {
    let mut pos = from;
    let mut serial = 0;
    // Chains before `first` end at or before `pos` and can no longer help.
    let mut first = 0;
    loop {
        while chains.get(first).is_some_and(|p| p.end <= pos) {
            first += 1;
        }
        let mut adopted = None;
        for chain in &mut chains[first..] {
            if chain.start > pos {
                break;
            }
            if chain.end <= pos {
                continue;
            }
            if chain.take_from(pos, lengths, labels) {
                adopted = Some(chain.end);
                break;
            }
        }
        if let Some(end) = adopted {
            // The chain from a true boundary is the true chain; where it
            // stopped short (no `eof`), the serial step below stops too.
            pos = end;
            continue;
        }
        match step(chunker, data, pos, eof) {
            Some(n) => {
                lengths.push(n as u32);
                labeller.label(data, pos, &[n as u32], labels);
                pos += n;
                serial += 1;
            }
            None => return (pos, serial),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{pseudo_random, ChunkerKind, ChunkerParams};
    use super::*;
    use proptest::prelude::*;

    /// Small sizes, so that inputs of a few hundred KiB hold many chunks.
    fn small_params(kind: ChunkerKind) -> ChunkerParams {
        ChunkerParams {
            kind,
            min_size: 256,
            avg_size: 1024,
            max_size: 4096,
        }
    }

    fn kinds() -> [ChunkerKind; 3] {
        [ChunkerKind::Fastcdc, ChunkerKind::Rabin, ChunkerKind::Fixed]
    }

    /// Test data of several shapes: random, constant, short-period
    /// repetitions, a repeated random block, and random with constant runs.
    fn make_data(shape: u8, len: usize, seed: u64, period: usize) -> Vec<u8> {
        match shape % 5 {
            0 => pseudo_random(len, seed),
            1 => vec![(seed & 0xff) as u8; len],
            2 => (0..len).map(|i| (i % period) as u8).collect(),
            3 => {
                let block = pseudo_random(period * 16 + 1, seed);
                (0..len).map(|i| block[i % block.len()]).collect()
            }
            _ => {
                let mut v = pseudo_random(len, seed);
                let mut i = 0;
                while i < len {
                    let run = (period * 37).min(len - i);
                    v[i..i + run].fill(0);
                    i += run + period * 101;
                }
                v
            }
        }
    }

    fn check(c: &dyn Chunker, data: &[u8], eof: bool, segments: usize) {
        let mut serial = vec![7];
        let used_serial = cut_all(c, data, eof, &mut serial);
        let mut parallel = vec![7];
        let used_parallel = cut_parallel(c, data, eof, segments, &mut parallel);
        assert_eq!(used_parallel, used_serial, "bytes consumed");
        assert!(parallel == serial, "chunk lengths differ");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn parallel_cut_points_are_the_serial_ones(
            shape in 0u8..5,
            // Lengths anywhere, and lengths within a few bytes of multiples of max_size.
            len in prop_oneof![0usize..300_000, (0usize..64, -3isize..=3).prop_map(|(m, d)| (m * 4096).saturating_add_signed(d))],
            seed: u64,
            period in 1usize..300,
            segments in 1usize..=8,
            eof: bool,
            kind in 0usize..3,
        ) {
            let c = small_params(kinds()[kind]).build().unwrap();
            let data = make_data(shape, len, seed, period);
            let mut serial = Vec::new();
            let used_serial = cut_all(c.as_ref(), &data, eof, &mut serial);
            let mut parallel = Vec::new();
            let used_parallel = cut_parallel(c.as_ref(), &data, eof, segments, &mut parallel);
            prop_assert_eq!(used_parallel, used_serial);
            prop_assert_eq!(parallel, serial);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn parallel_cut_points_are_the_serial_ones_with_default_params(
            shape in 0u8..5, len in 0usize..2_000_000, seed: u64, period in 1usize..300,
            segments in 1usize..=8, eof: bool,
        ) {
            let c = ChunkerParams::default().build().unwrap();
            check(c.as_ref(), &make_data(shape, len, seed, period), eof, segments);
        }
    }

    #[test]
    fn empty_input_cuts_nothing() {
        for kind in kinds() {
            let c = small_params(kind).build().unwrap();
            for eof in [false, true] {
                for segments in [0, 1, 2, 8] {
                    let mut lengths = Vec::new();
                    assert_eq!(
                        cut_parallel(c.as_ref(), &[], eof, segments, &mut lengths),
                        0
                    );
                    assert!(lengths.is_empty());
                }
            }
        }
    }

    #[test]
    fn pieces_smaller_than_max_size() {
        // Fewer bytes than one maximum-size chunk and many segments: one
        // piece. Just over a few multiples: a last piece of a few bytes.
        let data = pseudo_random(5 * 4096 + 10, 1);
        for kind in kinds() {
            let c = small_params(kind).build().unwrap();
            for len in [1, 100, 4095, 4096, 4097, 2 * 4096 + 1, 5 * 4096 + 10] {
                for segments in [2, 3, 8, 1000, usize::MAX] {
                    for eof in [false, true] {
                        check(c.as_ref(), &data[..len], eof, segments);
                    }
                }
            }
        }
    }

    #[test]
    fn random_data_resynchronises_within_a_few_chunks() {
        let data = pseudo_random(1 << 20, 2);
        for kind in kinds() {
            let c = small_params(kind).build().unwrap();
            for segments in 2..=8 {
                let mut lengths = Vec::new();
                let (_, serial) =
                    cut_parallel_counted(c.as_ref(), &data, true, segments, &mut lengths);
                assert!(
                    serial <= 8 * segments,
                    "{kind:?}: {serial} chunks cut serially"
                );
                check(c.as_ref(), &data, true, segments);
            }
        }
    }

    #[test]
    fn pieces_that_never_resynchronise_are_cut_serially() {
        // Data with a period of 1000 bytes under a content-defined chunker
        // cuts at a multiple of the period at the same phase whatever the
        // start, so chains started at multiples of 4096 stay out of phase.
        let block = pseudo_random(1000, 5);
        let data: Vec<u8> = (0..300_001).map(|i| block[i % 1000]).collect();
        let mut fell_back = 0;
        for kind in [ChunkerKind::Fastcdc, ChunkerKind::Rabin] {
            let c = small_params(kind).build().unwrap();
            let mut serial = Vec::new();
            cut_all(c.as_ref(), &data, true, &mut serial);
            for segments in 2..=8 {
                let mut lengths = Vec::new();
                let (used, serial_cuts) =
                    cut_parallel_counted(c.as_ref(), &data, true, segments, &mut lengths);
                assert_eq!(used, data.len());
                assert!(lengths == serial, "{kind:?} with {segments} segments");
                if serial_cuts * 2 > serial.len() {
                    fell_back += 1;
                }
                check(c.as_ref(), &data, false, segments);
            }
        }
        assert!(fell_back > 0, "no piece fell back to serial chunking");
    }

    #[test]
    fn without_eof_the_tail_is_left_uncut() {
        for kind in kinds() {
            let c = small_params(kind).build().unwrap();
            let data = pseudo_random(100_000, 9);
            let mut lengths = Vec::new();
            let used = cut_parallel(c.as_ref(), &data, false, 4, &mut lengths);
            assert_eq!(used, lengths.iter().map(|&n| n as usize).sum::<usize>());
            assert!(
                data.len() - used < c.max_size(),
                "{kind:?} left {}",
                data.len() - used
            );
            let mut all = Vec::new();
            assert_eq!(
                cut_parallel(c.as_ref(), &data, true, 4, &mut all),
                data.len()
            );
            assert_eq!(all.iter().map(|&n| n as usize).sum::<usize>(), data.len());
        }
    }

    #[test]
    fn appends_to_existing_lengths() {
        let c = small_params(ChunkerKind::Fastcdc).build().unwrap();
        let data = pseudo_random(50_000, 4);
        check(c.as_ref(), &data, true, 3);
        let mut lengths = vec![1, 2, 3];
        cut_parallel(c.as_ref(), &data, true, 3, &mut lengths);
        assert_eq!(&lengths[..3], &[1, 2, 3]);
    }

    #[test]
    fn piece_starts_are_aligned_and_distinct() {
        assert_eq!(piece_starts(10_000, 4, 1000), vec![0, 2000, 5000, 7000]);
        assert_eq!(piece_starts(1500, 8, 1000), vec![0, 1000]);
        assert_eq!(piece_starts(999, 8, 1000), vec![0]);
        assert_eq!(piece_starts(usize::MAX, 3, 1), {
            let third = usize::MAX / 3;
            vec![0, third, 2 * third]
        });
    }
}
