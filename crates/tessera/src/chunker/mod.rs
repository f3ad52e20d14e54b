//! Content-defined and fixed-size chunking.
//!
//! A [`Chunker`] decides where the chunk that starts at the beginning of a
//! slice ends. It is stateless between chunks and looks at no more than
//! `max_size` bytes, so cut points depend only on the data, never on how the
//! input was read or split into blocks ([`cut_all`] drives it over a buffer,
//! [`cut_parallel`] does the same with pieces of the buffer on several threads).

mod fastcdc;
mod fixed;
mod parallel;
mod rabin;

pub use self::fastcdc::FastCdc;
pub use self::fixed::FixedSize;
pub use self::parallel::cut_parallel;
pub(crate) use self::parallel::{piece_starts, stitch, Chain, ChunkLabels};
pub use self::rabin::Rabin;

use crate::error::{Error, Result};
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::io::{self, Read};
use std::str::FromStr;

/// The largest maximum chunk size a configuration may set: 16 MiB.
pub const MAX_CHUNK_SIZE: usize = 16 * 1024 * 1024;

/// Finds chunk boundaries.
pub trait Chunker: Send + Sync {
    /// Length of the chunk starting at `data[0]`.
    ///
    /// `data` holds at least `max_size()` bytes unless it is the end of the
    /// input. The result is in `1..=min(data.len(), max_size())` for non-empty `data`.
    fn cut(&self, data: &[u8]) -> usize;

    /// The largest chunk this chunker produces.
    fn max_size(&self) -> usize;

    /// Whether cut points depend on the content: chains of cuts started
    /// anywhere then meet the true ones within a few chunks (parallel
    /// chunking with stitching relies on it to be fast; its result is
    /// exact either way).
    fn content_defined(&self) -> bool {
        true
    }
}

/// Which chunking algorithm a repository uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChunkerKind {
    /// FastCDC 2020 with normalized chunking (level 1).
    Fastcdc,
    /// Rabin-fingerprint CDC over a 48-byte sliding window.
    Rabin,
    /// Fixed-size chunks of `avg_size` bytes.
    Fixed,
}

impl ChunkerKind {
    /// The name used in configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ChunkerKind::Fastcdc => "fastcdc",
            ChunkerKind::Rabin => "rabin",
            ChunkerKind::Fixed => "fixed",
        }
    }
}

impl FromStr for ChunkerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fastcdc" => Ok(ChunkerKind::Fastcdc),
            "rabin" => Ok(ChunkerKind::Rabin),
            "fixed" => Ok(ChunkerKind::Fixed),
            other => Err(format!(
                "unknown chunker {other:?} (expected fastcdc, rabin or fixed)"
            )),
        }
    }
}

/// Chunking algorithm and sizes, fixed at `init` (chunk boundaries are part of the format).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerParams {
    /// The algorithm.
    pub kind: ChunkerKind,
    /// Smallest chunk (except the last of a stream).
    pub min_size: u32,
    /// Target average chunk size (the chunk size of `fixed`).
    pub avg_size: u32,
    /// Largest chunk.
    pub max_size: u32,
}

impl Default for ChunkerParams {
    fn default() -> Self {
        ChunkerParams {
            kind: ChunkerKind::Fastcdc,
            min_size: 2 * 1024,
            avg_size: 8 * 1024,
            max_size: 64 * 1024,
        }
    }
}

impl ChunkerParams {
    /// Checks that the sizes suit the algorithm.
    pub fn validate(&self) -> Result<()> {
        let (min, avg, max) = (self.min_size, self.avg_size, self.max_size);
        let bad = |msg: String| Err(Error::InvalidConfig(msg));
        if !(min <= avg && avg <= max) {
            return bad(format!(
                "chunk sizes must satisfy min <= avg <= max (got {min}/{avg}/{max})"
            ));
        }
        if max as usize > MAX_CHUNK_SIZE {
            return bad(format!("max chunk size {max} exceeds 16 MiB"));
        }
        match self.kind {
            ChunkerKind::Fastcdc => {
                if min < 64 || !(256..=4 * 1024 * 1024).contains(&avg) || max < 1024 {
                    return bad(format!(
                        "fastcdc needs min >= 64, 256 <= avg <= 4 MiB and max >= 1 KiB (got {min}/{avg}/{max})"
                    ));
                }
                if !(min.is_multiple_of(2) && avg.is_multiple_of(2) && max.is_multiple_of(2)) {
                    return bad(format!(
                        "fastcdc sizes must be even (got {min}/{avg}/{max})"
                    ));
                }
            }
            ChunkerKind::Rabin => {
                if (min as usize) < rabin::WINDOW_SIZE || !avg.is_power_of_two() {
                    return bad(format!(
                        "rabin needs min >= {} and a power-of-two avg (got {min}/{avg}/{max})",
                        rabin::WINDOW_SIZE
                    ));
                }
            }
            ChunkerKind::Fixed => {
                if avg == 0 {
                    return bad("fixed chunk size (avg) must be positive".into());
                }
            }
        }
        Ok(())
    }

    /// Builds the chunker these parameters describe.
    pub fn build(&self) -> Result<Box<dyn Chunker>> {
        self.validate()?;
        let (min, avg, max) = (
            self.min_size as usize,
            self.avg_size as usize,
            self.max_size as usize,
        );
        Ok(match self.kind {
            ChunkerKind::Fastcdc => Box::new(FastCdc::new(min, avg, max)),
            ChunkerKind::Rabin => Box::new(Rabin::new(min, avg, max)),
            ChunkerKind::Fixed => Box::new(FixedSize::new(avg)),
        })
    }
}

/// Cuts `data` into chunks, appending their lengths to `lengths`.
///
/// Without `eof`, stops before the first chunk whose end could still move
/// with more input (fewer than `max_size` bytes left); with `eof`, cuts
/// everything. Returns the number of bytes consumed.
pub fn cut_all(chunker: &dyn Chunker, data: &[u8], eof: bool, lengths: &mut Vec<u32>) -> usize {
    let max = chunker.max_size();
    let mut pos = 0;
    while pos < data.len() {
        let remaining = data.len() - pos;
        if !eof && remaining < max {
            break;
        }
        let window = &data[pos..pos + remaining.min(max)];
        let n = chunker.cut(window).clamp(1, window.len());
        lengths.push(n as u32);
        pos += n;
    }
    pos
}

/// Reads an input in blocks and cuts each into chunks, carrying the bytes
/// after the last final boundary over into the next block. Yields
/// `(block, chunk lengths)` pairs; the chunks tile the block.
pub struct Blocks<'a, R: Read + ?Sized> {
    input: &'a mut R,
    chunker: &'a dyn Chunker,
    block_size: usize,
    carry: BytesMut,
    eof: bool,
}

impl<'a, R: Read + ?Sized> Blocks<'a, R> {
    /// Blocks of about `block_size` bytes (at least twice the maximum chunk size).
    pub fn new(input: &'a mut R, chunker: &'a dyn Chunker, block_size: usize) -> Self {
        Blocks {
            input,
            chunker,
            block_size: block_size.max(2 * chunker.max_size()),
            carry: BytesMut::new(),
            eof: false,
        }
    }

    /// The next block with its chunk lengths, `None` at the end of the input.
    pub fn next_block(&mut self) -> io::Result<Option<(Bytes, Vec<u32>)>> {
        while !self.eof {
            let mut buf = BytesMut::with_capacity(self.block_size);
            buf.extend_from_slice(&self.carry);
            self.eof = fill(self.input, &mut buf, self.block_size)?;
            let mut lengths = Vec::with_capacity(buf.len() / 2048 + 1);
            let used = cut_all(self.chunker, &buf, self.eof, &mut lengths);
            let mut data = buf.freeze();
            self.carry = BytesMut::from(&data[used..]);
            data.truncate(used);
            if !lengths.is_empty() {
                return Ok(Some((data, lengths)));
            }
        }
        Ok(None)
    }
}

/// Reads until `buf` holds `target` bytes or the input ends; returns whether it ended.
fn fill<R: Read + ?Sized>(input: &mut R, buf: &mut BytesMut, target: usize) -> io::Result<bool> {
    while buf.len() < target {
        let start = buf.len();
        buf.resize(target, 0);
        match input.read(&mut buf[start..]) {
            Ok(0) => {
                buf.truncate(start);
                return Ok(true);
            }
            Ok(n) => buf.truncate(start + n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => buf.truncate(start),
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        }
    }
    Ok(false)
}

/// Deterministic pseudo-random bytes (xorshift) for the tests of chunking and
/// of the stages built on it.
#[cfg(test)]
pub(crate) fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all_params() -> Vec<ChunkerParams> {
        let mut v = Vec::new();
        for kind in [ChunkerKind::Fastcdc, ChunkerKind::Rabin, ChunkerKind::Fixed] {
            v.push(ChunkerParams {
                kind,
                min_size: 256,
                avg_size: 1024,
                max_size: 4096,
            });
        }
        v.push(ChunkerParams::default());
        v
    }

    /// Chunks `data` feeding it in pieces of `piece` bytes, as a stream reader would.
    fn chunk_streaming(c: &dyn Chunker, data: &[u8], piece: usize) -> Vec<u32> {
        let mut buf: Vec<u8> = Vec::new();
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            let take = piece.min(data.len() - fed);
            buf.extend_from_slice(&data[fed..fed + take]);
            fed += take;
            let eof = fed == data.len();
            let used = cut_all(c, &buf, eof, &mut out);
            buf.drain(..used);
            if eof {
                break;
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn boundaries_do_not_depend_on_read_size(
            len in 0usize..200_000, seed: u64, piece in 1usize..70_000, which in 0usize..4
        ) {
            let p = all_params()[which];
            let c = p.build().unwrap();
            let data = pseudo_random(len, seed);
            let whole = chunk_streaming(c.as_ref(), &data, data.len().max(1));
            let pieces = chunk_streaming(c.as_ref(), &data, piece);
            prop_assert_eq!(&whole, &pieces);
            prop_assert_eq!(whole.iter().map(|&n| n as usize).sum::<usize>(), len);
            let n = whole.len();
            for (i, &l) in whole.iter().enumerate() {
                prop_assert!(l as usize <= c.max_size());
                if i + 1 < n && p.kind != ChunkerKind::Fixed {
                    prop_assert!(l >= p.min_size, "chunk {} of {} is {} < min", i, n, l);
                }
            }
        }
    }

    /// A reader that returns at most `piece` bytes per call.
    struct Trickle<'a> {
        data: &'a [u8],
        piece: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.piece.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn blocks_match_whole_input_chunking(
            len in 0usize..600_000, seed: u64, piece in 1usize..100_000, block in 1usize..300_000
        ) {
            let c = ChunkerParams::default().build().unwrap();
            let data = pseudo_random(len, seed);
            let expected = chunk_streaming(c.as_ref(), &data, data.len().max(1));
            let mut input = Trickle { data: &data, piece };
            let mut blocks = Blocks::new(&mut input, c.as_ref(), block);
            let mut got = Vec::new();
            let mut bytes = Vec::new();
            while let Some((b, lengths)) = blocks.next_block().unwrap() {
                prop_assert_eq!(b.len() as u64, lengths.iter().map(|&l| u64::from(l)).sum::<u64>());
                bytes.extend_from_slice(&b);
                got.extend(lengths);
            }
            prop_assert_eq!(got, expected);
            prop_assert_eq!(bytes, data);
        }
    }

    #[test]
    fn content_defined_chunkers_resynchronise_after_an_insertion() {
        let data = pseudo_random(400_000, 7);
        let mut edited = data[..100_000].to_vec();
        edited.extend_from_slice(b"an insertion that shifts every later byte");
        edited.extend_from_slice(&data[100_000..]);
        for kind in [ChunkerKind::Fastcdc, ChunkerKind::Rabin] {
            let c = ChunkerParams {
                kind,
                ..ChunkerParams::default()
            }
            .build()
            .unwrap();
            let a = chunk_streaming(c.as_ref(), &data, 1 << 20);
            let b = chunk_streaming(c.as_ref(), &edited, 1 << 20);
            // The tail chunks after the edit must be identical.
            let tail = |v: &[u32]| v.iter().rev().take(10).copied().collect::<Vec<_>>();
            assert_eq!(tail(&a), tail(&b), "{kind:?} did not resynchronise");
        }
    }

    #[test]
    fn mean_chunk_size_is_near_the_target() {
        let data = pseudo_random(8 << 20, 3);
        for kind in [ChunkerKind::Fastcdc, ChunkerKind::Rabin] {
            let c = ChunkerParams {
                kind,
                ..ChunkerParams::default()
            }
            .build()
            .unwrap();
            let lens = chunk_streaming(c.as_ref(), &data, 1 << 20);
            let mean = data.len() / lens.len();
            assert!(
                (6 * 1024..=14 * 1024).contains(&mean),
                "{kind:?}: mean chunk {mean}"
            );
        }
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        let bad = [
            ChunkerParams {
                min_size: 9000,
                ..ChunkerParams::default()
            },
            ChunkerParams {
                max_size: 32 << 20,
                ..ChunkerParams::default()
            },
            ChunkerParams {
                kind: ChunkerKind::Rabin,
                avg_size: 6000,
                ..ChunkerParams::default()
            },
            ChunkerParams {
                kind: ChunkerKind::Fastcdc,
                min_size: 3,
                avg_size: 8,
                max_size: 16,
            },
        ];
        for p in bad {
            assert!(
                matches!(p.build(), Err(Error::InvalidConfig(_))),
                "{p:?} accepted"
            );
        }
    }
}
