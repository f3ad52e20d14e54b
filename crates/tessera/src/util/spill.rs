//! Spilling a backup's per-chunk state to local temporary files, so that a
//! backup's memory is bounded by configuration, not by its input size.
//!
//! - [`temp_file`]: an unnamed temporary file (created in the system's
//!   temporary directory, `TMPDIR`, and unlinked at once, so nothing is left
//!   behind even after a crash).
//! - [`SpillMap`]: a fingerprint → `u64` map that keeps at most a configured
//!   number of entries in memory and writes the rest as sorted runs, each
//!   with a Bloom filter in memory (~1.2 bytes per spilled entry), so that
//!   lookups of absent fingerprints cost no I/O. Runs are merged tiered
//!   (LSM-style: [`MERGE_FANOUT`] runs of one level into one of the next),
//!   so that a map of `n` entries keeps O(log n) runs — lookups check
//!   O(log n) Bloom filters and the map holds O(log n) open files — and
//!   each entry is rewritten O(log n) times. It iterates in the order it
//!   was made with ([`Order`]: table order or byte order), the newest value
//!   of a key winning.
//!
//! Spill files are scratch space, not repository objects: they are not part
//! of the on-disk format and never read by another process.

use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap, FINGERPRINT_LEN};
use fastbloom::BloomFilter;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

/// The default memory budget of each structure of a maintenance command
/// (GC, check) that grows with the repository, beyond which it spills to
/// temporary files.
pub const DEFAULT_SORT_BUDGET: u64 = 32 << 20;

/// Bytes of one spilled map entry: the fingerprint and the value.
const RECORD_LEN: usize = FINGERPRINT_LEN + 8;
/// False-positive rate of each run's Bloom filter.
const RUN_BLOOM_FPR: f64 = 0.01;
/// How many runs of one level a [`SpillMap`] merges into one run of the
/// next level: with `s` spills it keeps at most
/// `(MERGE_FANOUT - 1) * (log_F(s) + 1)` runs, each entry rewritten about
/// `log_F(s)` times.
const MERGE_FANOUT: usize = 4;
/// Bytes of the buffer of each run read or written whole.
const RUN_BUFFER: usize = 1 << 16;
/// Records per block of a run: the run keeps the sort key of each block's
/// first record in memory (0.16 bytes per entry), and a lookup that passes
/// the Bloom filter reads the one block that may hold its key (10 KiB).
const BLOCK_RECORDS: usize = 256;

/// The sort key of a fingerprint in a [`SpillMap`]'s runs.
pub(crate) type Order = fn(&Fingerprint) -> (u64, Fingerprint);

/// Byte order of fingerprints (their `Ord`), as NDF tables list them.
pub(crate) fn byte_order(fp: &Fingerprint) -> (u64, Fingerprint) {
    let mut head = [0u8; 8];
    head.copy_from_slice(&fp.0[..8]);
    (u64::from_be_bytes(head), *fp)
}

/// Creates an empty, unnamed temporary file in the system's temporary
/// directory (`O_TMPFILE` where the file system has it, else a random name
/// unlinked at once), so it disappears with its handle, even after a crash,
/// and never collides with a file a killed process left behind.
pub(crate) fn temp_file() -> Result<File> {
    tempfile::tempfile().map_err(|e| {
        Error::io(
            format!(
                "creating a spill file in {}",
                std::env::temp_dir().display()
            ),
            e,
        )
    })
}

/// A buffered reader of `file` from its start.
pub(crate) fn reader(mut file: &File) -> Result<BufReader<&File>> {
    file.seek(SeekFrom::Start(0)).map_err(spill_io)?;
    Ok(BufReader::with_capacity(RUN_BUFFER, file))
}

/// An I/O error on a spill file.
pub(crate) fn spill_io(e: std::io::Error) -> Error {
    Error::io("spill file", e)
}

/// How many entries a hash table of `slot_bytes` per slot holds in about
/// `budget` bytes: 7/8 of the largest power-of-two number of slots that
/// fits (at least 16 slots), the table's load limit, so that it never grows.
pub(crate) fn table_limit(budget: u64, slot_bytes: u64) -> usize {
    let mut slots: u64 = 16;
    while (slots * 2) * slot_bytes <= budget {
        slots *= 2;
    }
    (slots / 8 * 7) as usize
}

/// A sorted run of spilled entries.
struct Run {
    file: File,
    len: u64,
    /// `None` while the run is being merged (its filter freed first, so
    /// that a merge never holds two filters for the same entries): the
    /// run is then searched on every lookup.
    bloom: Option<BloomFilter>,
    /// 0 for a run spilled from memory, `l + 1` for a merge of runs of
    /// level `l`.
    level: u32,
    /// The sort key of the first record of each block of
    /// [`BLOCK_RECORDS`] records.
    firsts: Vec<(u64, Fingerprint)>,
}

impl Run {
    /// Writes the entries `next` yields (sorted in `order`, distinct keys,
    /// at most `expected` of them) as a run of `level`.
    fn write(
        expected: u64,
        level: u32,
        order: Order,
        mut next: impl FnMut() -> Result<Option<(Fingerprint, u64)>>,
    ) -> Result<Run> {
        let file = temp_file()?;
        let mut bloom = BloomFilter::with_false_pos(RUN_BLOOM_FPR)
            .expected_items(usize::try_from(expected).unwrap_or(usize::MAX).max(1));
        let mut w = BufWriter::with_capacity(RUN_BUFFER, &file);
        let mut len = 0u64;
        let mut firsts = Vec::new();
        while let Some((fp, v)) = next()? {
            if len.is_multiple_of(BLOCK_RECORDS as u64) {
                firsts.push(order(&fp));
            }
            bloom.insert_hash(fp.key64());
            w.write_all(&fp.0).map_err(spill_io)?;
            w.write_all(&v.to_le_bytes()).map_err(spill_io)?;
            len += 1;
        }
        w.flush().map_err(spill_io)?;
        drop(w);
        firsts.shrink_to_fit();
        Ok(Run {
            file,
            len,
            bloom: Some(bloom),
            level,
            firsts,
        })
    }

    /// The value of `fp` in this run: one read of the block that may hold
    /// it, searched in memory.
    fn get(&self, fp: &Fingerprint, order: Order) -> Result<Option<u64>> {
        if self
            .bloom
            .as_ref()
            .is_some_and(|b| !b.contains_hash(fp.key64()))
        {
            return Ok(None);
        }
        let key = order(fp);
        // The last block whose first key is at most `key`.
        let Some(block) = self
            .firsts
            .partition_point(|first| *first <= key)
            .checked_sub(1)
        else {
            return Ok(None);
        };
        let start = (block * BLOCK_RECORDS) as u64;
        let records = (self.len - start).min(BLOCK_RECORDS as u64) as usize;
        let mut buf = [0u8; BLOCK_RECORDS * RECORD_LEN];
        let buf = &mut buf[..records * RECORD_LEN];
        self.file
            .read_exact_at(buf, start * RECORD_LEN as u64)
            .map_err(spill_io)?;
        let record = |i: usize| -> (Fingerprint, u64) {
            let mut r = [0u8; RECORD_LEN];
            r.copy_from_slice(&buf[i * RECORD_LEN..(i + 1) * RECORD_LEN]);
            parse_record(&r)
        };
        let (mut lo, mut hi) = (0, records);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (found, v) = record(mid);
            match order(&found).cmp(&key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(Some(v)),
            }
        }
        Ok(None)
    }

    /// Bytes of memory the run holds: its Bloom filter and its block keys.
    fn memory(&self) -> u64 {
        let bloom = self.bloom.as_ref().map_or(0, |b| b.num_bits() as u64 / 8);
        let firsts = self.firsts.capacity() * std::mem::size_of::<(u64, Fingerprint)>();
        bloom + firsts as u64
    }
}

fn parse_record(buf: &[u8; RECORD_LEN]) -> (Fingerprint, u64) {
    let mut fp = [0u8; FINGERPRINT_LEN];
    fp.copy_from_slice(&buf[..FINGERPRINT_LEN]);
    let mut v = [0u8; 8];
    v.copy_from_slice(&buf[FINGERPRINT_LEN..]);
    (Fingerprint(fp), u64::from_le_bytes(v))
}

/// A fingerprint → `u64` map holding at most `limit` entries in memory; the
/// others are spilled to sorted runs on local disk, merged tiered (see
/// [`SpillMap::spill`]): after `s` spills it keeps at most
/// `(MERGE_FANOUT - 1) * (log_F(s) + 1)` runs (at most 18 for the 130
/// million chunks of a 1 TiB backup at an 8 MiB budget, not 1,133), so
/// an insert of a new key checks that many Bloom filters (and reads one
/// 10 KiB block of a run whose filter lets it through) and the map holds
/// that many open files. A merge streams with one 64 KiB buffer per run it
/// reads and one for the run it writes.
pub(crate) struct SpillMap {
    mem: FingerprintMap<u64>,
    limit: usize,
    runs: Vec<Run>,
    order: Order,
}

impl SpillMap {
    /// A map whose in-memory part stays within about `budget` bytes,
    /// iterated in `order`.
    pub(crate) fn with_budget(budget: u64, order: Order) -> SpillMap {
        SpillMap {
            mem: FingerprintMap::default(),
            limit: table_limit(budget, RECORD_LEN as u64 + 1),
            runs: Vec::new(),
            order,
        }
    }

    /// The newest value of `fp`.
    pub(crate) fn get(&self, fp: &Fingerprint) -> Result<Option<u64>> {
        match self.mem.get(fp) {
            Some(&v) => Ok(Some(v)),
            None => self.get_spilled(fp),
        }
    }

    /// Sets `fp` to `v`; returns the value it had.
    pub(crate) fn insert(&mut self, fp: Fingerprint, v: u64) -> Result<Option<u64>> {
        let old = match self.mem.insert(fp, v) {
            Some(old) => Some(old),
            None if self.runs.is_empty() => None,
            None => self.get_spilled(&fp)?,
        };
        self.spill_if_full()?;
        Ok(old)
    }

    /// Sets `fp` to `v`: [`SpillMap::insert`] without its search of the
    /// spilled runs for the old value (a value in memory is newer than
    /// any spilled one, for lookups and merges alike).
    pub(crate) fn set(&mut self, fp: Fingerprint, v: u64) -> Result<()> {
        self.mem.insert(fp, v);
        self.spill_if_full()
    }

    fn spill_if_full(&mut self) -> Result<()> {
        match self.mem.len() >= self.limit {
            true => self.spill(),
            false => Ok(()),
        }
    }

    fn get_spilled(&self, fp: &Fingerprint) -> Result<Option<u64>> {
        for run in self.runs.iter().rev() {
            if let Some(v) = run.get(fp, self.order)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// Writes the in-memory entries as a new run of level 0, then, while
    /// the newest [`MERGE_FANOUT`] runs are of one level, merges them into
    /// one run of the next level (they are the newest runs, so the newest
    /// value of a key still wins). Levels thus never increase from the
    /// oldest run to the newest, with fewer than [`MERGE_FANOUT`] runs per
    /// level. The merged runs' Bloom filters are freed before the merged
    /// run's is built, so that memory stays at one filter bit count per
    /// entry (an I/O error leaves the runs without filters: still exact).
    fn spill(&mut self) -> Result<()> {
        let mut entries: Vec<(Fingerprint, u64)> = self.mem.drain().collect();
        let order = self.order;
        entries.sort_unstable_by_key(|e| order(&e.0));
        let mut it = entries.into_iter();
        self.runs
            .push(Run::write(it.len() as u64, 0, order, || Ok(it.next()))?);
        while let Some(first) = self.runs.len().checked_sub(MERGE_FANOUT) {
            let level = self.runs[first].level;
            if self.runs[first..].iter().any(|r| r.level != level) {
                break;
            }
            let expected = self.runs[first..].iter().map(|r| r.len).sum();
            for run in &mut self.runs[first..] {
                run.bloom = None;
            }
            let merged = {
                let mut all = Sorted::of(&self.runs[first..], order)?;
                Run::write(expected, level + 1, order, || all.next())?
            };
            self.runs.truncate(first);
            self.runs.push(merged);
        }
        Ok(())
    }

    /// Bytes of memory the map holds between calls: its table and the
    /// runs' Bloom filters and block keys. While a spill merges runs it
    /// also holds the buffers of the runs it reads and of the one it
    /// writes, ([`MERGE_FANOUT`] + 1) × [`RUN_BUFFER`] bytes, freed when
    /// it ends.
    pub(crate) fn memory(&self) -> u64 {
        let runs: u64 = self.runs.iter().map(Run::memory).sum();
        self.mem.allocation_size() as u64 + runs
    }

    /// Every entry once, in the map's order, with its newest value.
    pub(crate) fn sorted(&mut self) -> Result<Sorted<'_>> {
        if !self.mem.is_empty() {
            self.spill()?;
        }
        Sorted::of(&self.runs, self.order)
    }

    /// Keeps the entries for which `f` returns a (possibly new) value; drops
    /// the others.
    pub(crate) fn retain_map(
        &mut self,
        mut f: impl FnMut(&Fingerprint, u64) -> Option<u64>,
    ) -> Result<()> {
        if self.runs.is_empty() {
            self.mem.retain(|fp, v| match f(fp, *v) {
                Some(new) => {
                    *v = new;
                    true
                }
                None => false,
            });
            return Ok(());
        }
        let mut kept = SpillMap {
            mem: FingerprintMap::default(),
            limit: self.limit,
            runs: Vec::new(),
            order: self.order,
        };
        let mut all = self.sorted()?;
        while let Some((fp, v)) = all.next()? {
            if let Some(new) = f(&fp, v) {
                kept.insert(fp, new)?;
            }
        }
        *self = kept;
        Ok(())
    }
}

/// A run's next record: (sort key, newest run first, value).
type Head = Reverse<((u64, Fingerprint), Reverse<usize>, u64)>;

/// The entries of a [`SpillMap`] in its order: a merge of its runs.
pub(crate) struct Sorted<'a> {
    readers: Vec<RunReader<'a>>,
    heap: BinaryHeap<Head>,
    peeked: Option<(Fingerprint, u64)>,
    order: Order,
}

impl<'a> Sorted<'a> {
    /// The merge of `runs` (oldest first).
    fn of(runs: &'a [Run], order: Order) -> Result<Sorted<'a>> {
        let mut sorted = Sorted {
            readers: Vec::with_capacity(runs.len()),
            heap: BinaryHeap::new(),
            peeked: None,
            order,
        };
        for (i, r) in runs.iter().enumerate() {
            sorted.readers.push(RunReader {
                reader: reader(&r.file)?,
                left: r.len,
            });
            sorted.advance(i)?;
        }
        Ok(sorted)
    }

    /// Queues run `i`'s next record.
    fn advance(&mut self, i: usize) -> Result<()> {
        if let Some((fp, v)) = self.readers[i].next()? {
            self.heap.push(Reverse(((self.order)(&fp), Reverse(i), v)));
        }
        Ok(())
    }

    /// The next key with its newest value (older values of it are skipped).
    fn pull(&mut self) -> Result<Option<(Fingerprint, u64)>> {
        let Some(Reverse(((_, fp), Reverse(i), v))) = self.heap.pop() else {
            return Ok(None);
        };
        self.advance(i)?;
        while let Some(Reverse(((_, older), Reverse(j), _))) = self.heap.peek() {
            if *older != fp {
                break;
            }
            let j = *j;
            self.heap.pop();
            self.advance(j)?;
        }
        Ok(Some((fp, v)))
    }

    /// The next entry, without taking it.
    pub(crate) fn peek(&mut self) -> Result<Option<(Fingerprint, u64)>> {
        if self.peeked.is_none() {
            self.peeked = self.pull()?;
        }
        Ok(self.peeked)
    }

    /// Takes the next entry.
    pub(crate) fn next(&mut self) -> Result<Option<(Fingerprint, u64)>> {
        match self.peeked.take() {
            Some(e) => Ok(Some(e)),
            None => self.pull(),
        }
    }
}

/// Reads a run's records in order.
struct RunReader<'a> {
    reader: BufReader<&'a File>,
    left: u64,
}

impl RunReader<'_> {
    fn next(&mut self) -> Result<Option<(Fingerprint, u64)>> {
        if self.left == 0 {
            return Ok(None);
        }
        let mut buf = [0u8; RECORD_LEN];
        self.reader.read_exact(&mut buf).map_err(spill_io)?;
        self.left -= 1;
        Ok(Some(parse_record(&buf)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::table::order_key;

    fn fp(i: u64) -> Fingerprint {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&i.to_le_bytes());
        b[8] = 1;
        Fingerprint(b)
    }

    #[test]
    fn spilled_entries_are_found_and_drained_once_with_the_newest_value() {
        let mut m = SpillMap::with_budget(1024 * (RECORD_LEN as u64 + 1), order_key);
        let limit = m.limit as u64;
        assert_eq!(limit, 896);
        let n = 5 * limit + 17;
        for i in 0..n {
            assert_eq!(m.insert(fp(i), i).unwrap(), None);
        }
        // The in-memory part never holds more than its limit.
        assert!(m.mem.len() < m.limit);
        // Five spills: the first four merged into one run of level 1.
        assert_eq!(m.runs.iter().map(|r| r.level).collect::<Vec<_>>(), [1, 0]);
        for i in (0..n).step_by(97) {
            assert_eq!(m.insert(fp(i), i + 1_000_000).unwrap(), Some(i));
        }
        assert_eq!(m.get(&fp(97)).unwrap(), Some(97 + 1_000_000));
        assert_eq!(m.get(&fp(98)).unwrap(), Some(98));
        assert_eq!(m.get(&fp(n + 1)).unwrap(), None);
        m.retain_map(|_, v| (v % 2 == 0).then_some(v)).unwrap();
        let mut seen = Vec::new();
        let mut all = m.sorted().unwrap();
        assert_eq!(all.peek().unwrap(), all.peek().unwrap());
        while let Some(e) = all.next().unwrap() {
            seen.push(e);
        }
        let mut expected: Vec<(Fingerprint, u64)> = (0..n)
            .map(|i| (fp(i), if i % 97 == 0 { i + 1_000_000 } else { i }))
            .filter(|e| e.1 % 2 == 0)
            .collect();
        expected.sort_unstable_by_key(|e| order_key(&e.0));
        assert_eq!(seen, expected);
        let mut bytes = SpillMap::with_budget(0, byte_order);
        for i in (0..n).rev() {
            bytes.insert(fp(i), 0).unwrap();
        }
        let mut all = bytes.sorted().unwrap();
        let mut last = None;
        while let Some((f, _)) = all.next().unwrap() {
            assert!(last < Some(f));
            last = Some(f);
        }
    }

    #[test]
    fn runs_stay_logarithmic_in_the_number_of_spills() {
        let mut m = SpillMap::with_budget(0, order_key);
        let limit = m.limit as u64;
        let mut spills = 0u64;
        for i in 0..100 * limit {
            m.insert(fp(i), i).unwrap();
            if !m.mem.is_empty() {
                continue;
            }
            spills += 1;
            // One run per base-4 digit unit of the number of spills.
            let mut digits = 0;
            let mut s = spills;
            while s > 0 {
                digits += s % MERGE_FANOUT as u64;
                s /= MERGE_FANOUT as u64;
            }
            assert_eq!(m.runs.len() as u64, digits, "after {spills} spills");
            assert!(m.runs.windows(2).all(|w| w[0].level >= w[1].level));
        }
        assert_eq!(spills, 100);
        // 100 = 1210 in base 4: levels 3, 2, 2, 1.
        let levels: Vec<u32> = m.runs.iter().map(|r| r.level).collect();
        assert_eq!(levels, [3, 2, 2, 1]);
        assert!(m.runs.len() <= (MERGE_FANOUT - 1) * 4);
        let lens: u64 = m.runs.iter().map(|r| r.len).sum();
        assert_eq!(lens, 100 * limit);
        for i in (0..100 * limit).step_by(37) {
            assert_eq!(m.get(&fp(i)).unwrap(), Some(i));
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u64),
        Set(u16, u64),
        Get(u16),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (any::<u16>(), any::<u64>()).prop_map(|(k, v)| Op::Insert(k, v)),
            1 => (any::<u16>(), any::<u64>()).prop_map(|(k, v)| Op::Set(k, v)),
            2 => any::<u16>().prop_map(Op::Get),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// A map of a tiny budget (14 entries in memory: many spills and
        /// merges over several levels) behaves as a `HashMap`, over 80 keys
        /// (runs of one block) or 3,000 (merged runs of several blocks).
        #[test]
        fn spill_map_behaves_as_a_hash_map(
            ops in proptest::collection::vec(op(), 0..3000),
            keep in 0u64..4,
            bytes in proptest::bool::ANY,
            keys in proptest::prop_oneof![proptest::strategy::Just(80u16), proptest::strategy::Just(3000u16)],
        ) {
            let order = if bytes { byte_order } else { order_key };
            let mut m = SpillMap::with_budget(0, order);
            let mut model = std::collections::HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        let k = k % keys;
                        proptest::prop_assert_eq!(m.insert(fp(k.into()), v).unwrap(), model.insert(k, v));
                    }
                    Op::Set(k, v) => {
                        let k = k % keys;
                        m.set(fp(k.into()), v).unwrap();
                        model.insert(k, v);
                    }
                    Op::Get(k) => {
                        let k = k % keys;
                        proptest::prop_assert_eq!(m.get(&fp(k.into())).unwrap(), model.get(&k).copied());
                    }
                }
                proptest::prop_assert!(m.runs.len() <= (MERGE_FANOUT - 1) * 8);
            }
            let sorted_model = |model: &std::collections::HashMap<u16, u64>| {
                let mut v: Vec<(Fingerprint, u64)> =
                    model.iter().map(|(&k, &v)| (fp(k.into()), v)).collect();
                v.sort_unstable_by_key(|e| order(&e.0));
                v
            };
            let drain = |m: &mut SpillMap| {
                let mut seen = Vec::new();
                let mut all = m.sorted().unwrap();
                while let Some(e) = all.next().unwrap() {
                    seen.push(e);
                }
                seen
            };
            proptest::prop_assert_eq!(drain(&mut m), sorted_model(&model));
            let f = |v: u64| (v % 4 != keep).then_some(v / 2);
            m.retain_map(|_, v| f(v)).unwrap();
            model = model.into_iter().filter_map(|(k, v)| f(v).map(|v| (k, v))).collect();
            proptest::prop_assert_eq!(drain(&mut m), sorted_model(&model));
            for k in 0..keys {
                proptest::prop_assert_eq!(m.get(&fp(k.into())).unwrap(), model.get(&k).copied());
            }
        }
    }
}
