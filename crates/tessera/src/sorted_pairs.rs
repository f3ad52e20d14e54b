//! An external sort of (container, fingerprint) pairs in bounded memory,
//! read back as streams in (container, fingerprint) order, each pair once:
//! what garbage collection's mark phase collects (every chunk a retained
//! recipe references) and its select and sweep phases consume one
//! container at a time, in container order.
//!
//! Pairs are buffered up to a budget, then sorted, deduplicated and written
//! as a run to an unlinked temporary file ([`crate::spill::temp_file`]);
//! runs are merged level by level (the [`FAN_IN`] runs of a level into one
//! run of the next), so there are at most `FAN_IN − 1` runs per level, a
//! logarithmic number, and a pair is rewritten once per level. Reading
//! holds one small buffer per run. Spill files are scratch space, not
//! repository objects.

use crate::container::ContainerId;
use crate::error::Result;
use crate::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use crate::spill::{reader, spill_io, temp_file};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};

/// Bytes of one pair on disk: container id (u64 LE) then fingerprint.
const RECORD_LEN: usize = 8 + FINGERPRINT_LEN;
/// Runs of one level merged at once.
pub(crate) const FAN_IN: usize = 8;
/// Read buffer per run while merging or streaming.
const READ_BUFFER: usize = 64 << 10;

/// One pair.
pub(crate) type Pair = (ContainerId, Fingerprint);

/// A sorted run of distinct pairs in a temporary file.
struct Run {
    file: File,
    len: u64,
    level: u32,
}

/// Collects pairs in bounded memory; [`PairSorter::finish`] sorts them.
pub(crate) struct PairSorter {
    buf: Vec<Pair>,
    limit: usize,
    runs: Vec<Run>,
}

impl PairSorter {
    /// A sorter whose buffer holds about `budget` bytes (at least 16 pairs).
    pub(crate) fn with_budget(budget: u64) -> PairSorter {
        let limit = (budget / std::mem::size_of::<Pair>() as u64).max(16) as usize;
        PairSorter {
            buf: Vec::new(),
            limit,
            runs: Vec::new(),
        }
    }

    /// Adds a pair (repeats are kept once).
    pub(crate) fn push(&mut self, container: ContainerId, fp: Fingerprint) -> Result<()> {
        self.buf.push((container, fp));
        if self.buf.len() >= self.limit {
            self.spill()?;
        }
        Ok(())
    }

    /// Writes the buffer as a run of level 0, then merges every level that
    /// reached [`FAN_IN`] runs.
    fn spill(&mut self) -> Result<()> {
        self.buf.sort_unstable();
        self.buf.dedup();
        let run = write_run(self.buf.drain(..).map(Ok), 0)?;
        self.runs.push(run);
        while self.runs.len() >= FAN_IN
            && self.runs[self.runs.len() - FAN_IN..]
                .iter()
                .all(|r| r.level == self.runs[self.runs.len() - 1].level)
        {
            let start = self.runs.len() - FAN_IN;
            let level = self.runs[start].level + 1;
            let merged = {
                let mut stream = PairStream::new(&self.runs[start..])?;
                write_run(std::iter::from_fn(|| stream.next().transpose()), level)?
            };
            self.runs.truncate(start);
            self.runs.push(merged);
        }
        Ok(())
    }

    /// Sorts what was pushed.
    pub(crate) fn finish(mut self) -> Result<SortedPairs> {
        if !self.buf.is_empty() {
            self.spill()?;
        }
        Ok(SortedPairs { runs: self.runs })
    }
}

/// Writes `pairs` (sorted, distinct) as a run of `level`.
fn write_run(pairs: impl Iterator<Item = Result<Pair>>, level: u32) -> Result<Run> {
    let file = temp_file()?;
    let mut w = BufWriter::with_capacity(READ_BUFFER, &file);
    let mut len = 0;
    for pair in pairs {
        let (c, fp) = pair?;
        w.write_all(&c.to_le_bytes()).map_err(spill_io)?;
        w.write_all(&fp.0).map_err(spill_io)?;
        len += 1;
    }
    w.flush().map_err(spill_io)?;
    drop(w);
    Ok(Run { file, len, level })
}

/// Every pair pushed, sorted; read as often as needed with [`SortedPairs::stream`].
pub(crate) struct SortedPairs {
    runs: Vec<Run>,
}

impl SortedPairs {
    /// The pairs in (container, fingerprint) order, each once.
    pub(crate) fn stream(&self) -> Result<PairStream<'_>> {
        PairStream::new(&self.runs)
    }
}

impl SortedPairs {
    /// The pairs of `self` that `other` lacks, in order (a merge join of
    /// the two streams: memory for the result only).
    pub(crate) fn absent_from(&self, other: &SortedPairs) -> Result<Vec<Pair>> {
        let mut absent = Vec::new();
        let (mut wanted, mut have) = (self.stream()?, other.stream()?);
        while let Some(pair) = wanted.next()? {
            loop {
                match have.peek()? {
                    Some(h) if h < pair => {
                        have.next()?;
                    }
                    Some(h) if h == pair => break,
                    _ => {
                        absent.push(pair);
                        break;
                    }
                }
            }
        }
        Ok(absent)
    }
}

/// Reads one run's records in order.
struct RunReader<'a> {
    reader: BufReader<&'a File>,
    left: u64,
}

impl RunReader<'_> {
    fn next(&mut self) -> Result<Option<Pair>> {
        if self.left == 0 {
            return Ok(None);
        }
        let mut buf = [0u8; RECORD_LEN];
        self.reader.read_exact(&mut buf).map_err(spill_io)?;
        self.left -= 1;
        let mut c = [0u8; 8];
        c.copy_from_slice(&buf[..8]);
        let mut fp = [0u8; FINGERPRINT_LEN];
        fp.copy_from_slice(&buf[8..]);
        Ok(Some((u64::from_le_bytes(c), Fingerprint(fp))))
    }
}

/// A merge of sorted runs: pairs in order, each once.
pub(crate) struct PairStream<'a> {
    readers: Vec<RunReader<'a>>,
    heap: BinaryHeap<Reverse<(Pair, usize)>>,
    last: Option<Pair>,
    peeked: Option<Pair>,
}

impl<'a> PairStream<'a> {
    fn new(runs: &'a [Run]) -> Result<PairStream<'a>> {
        let mut s = PairStream {
            readers: Vec::with_capacity(runs.len()),
            heap: BinaryHeap::with_capacity(runs.len()),
            last: None,
            peeked: None,
        };
        for run in runs {
            s.readers.push(RunReader {
                reader: reader(&run.file)?,
                left: run.len,
            });
        }
        for i in 0..s.readers.len() {
            s.advance(i)?;
        }
        Ok(s)
    }

    fn advance(&mut self, i: usize) -> Result<()> {
        if let Some(pair) = self.readers[i].next()? {
            self.heap.push(Reverse((pair, i)));
        }
        Ok(())
    }

    /// The next distinct pair.
    pub(crate) fn next(&mut self) -> Result<Option<Pair>> {
        match self.peeked.take() {
            Some(pair) => Ok(Some(pair)),
            None => self.pull(),
        }
    }

    fn peek(&mut self) -> Result<Option<Pair>> {
        if self.peeked.is_none() {
            self.peeked = self.pull()?;
        }
        Ok(self.peeked)
    }

    fn pull(&mut self) -> Result<Option<Pair>> {
        while let Some(Reverse((pair, i))) = self.heap.pop() {
            self.advance(i)?;
            if self.last != Some(pair) {
                self.last = Some(pair);
                return Ok(Some(pair));
            }
        }
        Ok(None)
    }

    /// The fingerprints paired with `container`, skipping the pairs of
    /// smaller containers (call with ascending containers).
    pub(crate) fn take(&mut self, container: ContainerId) -> Result<Vec<Fingerprint>> {
        let mut out = Vec::new();
        while let Some((c, fp)) = self.peek()? {
            if c > container {
                break;
            }
            self.peeked = None;
            if c == container {
                out.push(fp);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(i: u64) -> Fingerprint {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&i.to_be_bytes());
        b[31] = 7;
        Fingerprint(b)
    }

    #[test]
    fn sorts_and_deduplicates_across_levels() {
        let mut s = PairSorter::with_budget(1024 * std::mem::size_of::<Pair>() as u64);
        assert_eq!(s.limit, 1024);
        // Every pair three times, in a scrambled order, over many runs and levels.
        let n = 40_000u64;
        for round in 0..3 {
            for i in 0..n {
                let k = (i * 7919 + round) % n;
                s.push(k % 97, fp(k)).unwrap();
            }
        }
        let sorted = s.finish().unwrap();
        assert!(sorted.runs.len() < 3 * FAN_IN, "{}", sorted.runs.len());
        assert!(sorted.runs.iter().any(|r| r.level >= 1));
        let mut expected: Vec<Pair> = (0..n).map(|k| (k % 97, fp(k))).collect();
        expected.sort_unstable();
        for _ in 0..2 {
            let mut stream = sorted.stream().unwrap();
            let mut seen = Vec::new();
            while let Some(p) = stream.next().unwrap() {
                seen.push(p);
            }
            assert_eq!(seen, expected);
        }
        // Taking by container skips the containers not asked for.
        let mut stream = sorted.stream().unwrap();
        let three: Vec<Fingerprint> = stream.take(3).unwrap();
        assert_eq!(
            three,
            expected
                .iter()
                .filter(|p| p.0 == 3)
                .map(|p| p.1)
                .collect::<Vec<_>>()
        );
        assert!(stream.take(2).unwrap().is_empty());
        assert_eq!(
            stream.take(96).unwrap().len(),
            expected.iter().filter(|p| p.0 == 96).count()
        );
        assert!(stream.take(500).unwrap().is_empty());
        let empty = PairSorter::with_budget(1 << 20).finish().unwrap();
        assert_eq!(empty.stream().unwrap().next().unwrap(), None);
    }
}
