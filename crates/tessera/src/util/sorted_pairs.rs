//! An external sort of fixed-size records in bounded memory, read back as
//! streams in the records' order, each record once: what garbage
//! collection's mark phase collects (every (container, fingerprint) pair a
//! retained recipe references) and its select and sweep phases consume one
//! container at a time, in container order; what `check` compares as
//! sorted streams; what the lifecycle arranging joins (the chunks of
//! the active categories by fingerprint with the version's NDF table, then
//! the positions it keeps in stream order); and the fingerprints of a
//! lifecycle version's recipe and of the categories it reads, which
//! `check` compares.
//!
//! Records are buffered up to a budget, then sorted, deduplicated and
//! written as a run to an unlinked temporary file
//! ([`crate::util::spill::temp_file`]); runs are merged level by level (the
//! [`FAN_IN`] runs of a level into one run of the next), so there are at
//! most `FAN_IN − 1` runs per level, a logarithmic number, and a record is
//! rewritten once per level. Reading holds one small buffer per run. Spill
//! files are scratch space, not repository objects.

use crate::error::Result;
use crate::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use crate::layout::container::ContainerId;
use crate::util::spill::{reader, spill_io, temp_file};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};

/// Runs of one level merged at once.
pub(crate) const FAN_IN: usize = 8;
/// Read buffer per run while merging or streaming.
const READ_BUFFER: usize = 64 << 10;

/// A fixed-size record of an external sort, sorted by its `Ord`.
pub(crate) trait Record: Copy + Ord {
    /// Bytes of one record on disk.
    const LEN: usize;
    /// Writes the record's `LEN` bytes.
    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()>;
    /// The record of `LEN` bytes `b`.
    fn read_from(b: &[u8]) -> Self;
}

/// One (container, fingerprint) pair.
pub(crate) type Pair = (ContainerId, Fingerprint);

fn u64_at(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn fp_at(b: &[u8]) -> Fingerprint {
    let mut fp = [0u8; FINGERPRINT_LEN];
    fp.copy_from_slice(&b[..FINGERPRINT_LEN]);
    Fingerprint(fp)
}

/// On disk: container id (u64 LE) then fingerprint.
impl Record for Pair {
    const LEN: usize = 8 + FINGERPRINT_LEN;
    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.0.to_le_bytes())?;
        w.write_all(&self.1 .0)
    }
    fn read_from(b: &[u8]) -> Self {
        (u64_at(b), fp_at(&b[8..]))
    }
}

/// A fingerprint and a number (a chunk's position), sorted by fingerprint;
/// on disk: fingerprint then number (u64 LE).
impl Record for (Fingerprint, u64) {
    const LEN: usize = FINGERPRINT_LEN + 8;
    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.0 .0)?;
        w.write_all(&self.1.to_le_bytes())
    }
    fn read_from(b: &[u8]) -> Self {
        (fp_at(b), u64_at(&b[FINGERPRINT_LEN..]))
    }
}

/// A fingerprint; on disk as its bytes.
impl Record for Fingerprint {
    const LEN: usize = FINGERPRINT_LEN;
    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.0)
    }
    fn read_from(b: &[u8]) -> Self {
        fp_at(b)
    }
}

/// A number (a chunk's position); on disk as u64 LE.
impl Record for u64 {
    const LEN: usize = 8;
    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.to_le_bytes())
    }
    fn read_from(b: &[u8]) -> Self {
        u64_at(b)
    }
}

/// A sorted run of distinct records in a temporary file.
struct Run {
    file: File,
    len: u64,
    level: u32,
}

/// Collects records in bounded memory; [`Sorter::finish`] sorts them.
pub(crate) struct Sorter<R> {
    buf: Vec<R>,
    limit: usize,
    runs: Vec<Run>,
}

/// Collects (container, fingerprint) pairs.
pub(crate) type PairSorter = Sorter<Pair>;
/// Sorted (container, fingerprint) pairs.
pub(crate) type SortedPairs = Sorted<Pair>;

impl<R: Record> Sorter<R> {
    /// A sorter whose buffer holds about `budget` bytes (at least 16 records).
    pub(crate) fn with_budget(budget: u64) -> Sorter<R> {
        let limit = (budget / std::mem::size_of::<R>() as u64).max(16) as usize;
        Sorter {
            buf: Vec::new(),
            limit,
            runs: Vec::new(),
        }
    }

    /// Adds a record (repeats are kept once).
    pub(crate) fn push(&mut self, record: R) -> Result<()> {
        self.buf.push(record);
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
                let mut stream = Stream::<R>::new(&self.runs[start..])?;
                write_run(std::iter::from_fn(|| stream.next().transpose()), level)?
            };
            self.runs.truncate(start);
            self.runs.push(merged);
        }
        Ok(())
    }

    /// Sorts what was pushed.
    pub(crate) fn finish(mut self) -> Result<Sorted<R>> {
        if !self.buf.is_empty() {
            self.spill()?;
        }
        Ok(Sorted {
            runs: self.runs,
            record: std::marker::PhantomData,
        })
    }
}

/// Writes `records` (sorted, distinct) as a run of `level`.
fn write_run<R: Record>(records: impl Iterator<Item = Result<R>>, level: u32) -> Result<Run> {
    let file = temp_file()?;
    let mut w = BufWriter::with_capacity(READ_BUFFER, &file);
    let mut len = 0;
    for record in records {
        record?.write_to(&mut w).map_err(spill_io)?;
        len += 1;
    }
    w.flush().map_err(spill_io)?;
    drop(w);
    Ok(Run { file, len, level })
}

/// Every record pushed, sorted; read as often as needed with [`Sorted::stream`].
pub(crate) struct Sorted<R> {
    runs: Vec<Run>,
    record: std::marker::PhantomData<R>,
}

impl<R: Record> Sorted<R> {
    /// The records in order, each once.
    pub(crate) fn stream(&self) -> Result<Stream<'_, R>> {
        Stream::new(&self.runs)
    }

    /// The records of `self` that `other` lacks, in order (a merge join of
    /// the two streams: memory for the result only).
    pub(crate) fn absent_from(&self, other: &Sorted<R>) -> Result<Vec<R>> {
        let mut absent = Vec::new();
        let (mut wanted, mut have) = (self.stream()?, other.stream()?);
        while let Some(record) = wanted.next()? {
            loop {
                match have.peek()? {
                    Some(h) if h < record => {
                        have.next()?;
                    }
                    Some(h) if h == record => break,
                    _ => {
                        absent.push(record);
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
    buf: Vec<u8>,
}

impl RunReader<'_> {
    fn next<R: Record>(&mut self) -> Result<Option<R>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.reader.read_exact(&mut self.buf).map_err(spill_io)?;
        self.left -= 1;
        Ok(Some(R::read_from(&self.buf)))
    }
}

/// A merge of sorted runs: records in order, each once.
pub(crate) struct Stream<'a, R> {
    readers: Vec<RunReader<'a>>,
    heap: BinaryHeap<Reverse<(R, usize)>>,
    last: Option<R>,
    peeked: Option<R>,
}

impl<'a, R: Record> Stream<'a, R> {
    fn new(runs: &'a [Run]) -> Result<Stream<'a, R>> {
        let mut s = Stream {
            readers: Vec::with_capacity(runs.len()),
            heap: BinaryHeap::with_capacity(runs.len()),
            last: None,
            peeked: None,
        };
        for run in runs {
            s.readers.push(RunReader {
                reader: reader(&run.file)?,
                left: run.len,
                buf: vec![0; R::LEN],
            });
        }
        for i in 0..s.readers.len() {
            s.advance(i)?;
        }
        Ok(s)
    }

    fn advance(&mut self, i: usize) -> Result<()> {
        if let Some(record) = self.readers[i].next()? {
            self.heap.push(Reverse((record, i)));
        }
        Ok(())
    }

    /// The next distinct record.
    pub(crate) fn next(&mut self) -> Result<Option<R>> {
        match self.peeked.take() {
            Some(record) => Ok(Some(record)),
            None => self.pull(),
        }
    }

    /// The next distinct record, without taking it.
    pub(crate) fn peek(&mut self) -> Result<Option<R>> {
        if self.peeked.is_none() {
            self.peeked = self.pull()?;
        }
        Ok(self.peeked)
    }

    fn pull(&mut self) -> Result<Option<R>> {
        while let Some(Reverse((record, i))) = self.heap.pop() {
            self.advance(i)?;
            if self.last != Some(record) {
                self.last = Some(record);
                return Ok(Some(record));
            }
        }
        Ok(None)
    }
}

impl Stream<'_, Pair> {
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
                s.push((k % 97, fp(k))).unwrap();
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
