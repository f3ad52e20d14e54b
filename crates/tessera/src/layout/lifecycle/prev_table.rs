//! The previous version's NDF table as a lifecycle backup looks it up (a
//! chunk new to the backup is an adjacent duplicate iff its fingerprint is
//! in that table and not quarantined), in memory bounded by a budget:
//!
//! - a table that fits the budget is a hash set (the common case);
//! - a larger one is written, as [`with_table`] streams it in byte order,
//!   to an unnamed temporary file ([`temp_file`]) of sorted fingerprints,
//!   with in memory a sparse index (the first fingerprint of each block of
//!   [`MIN_BLOCK`] or more) and a Bloom filter in the rest of the budget: a
//!   lookup that passes the filter reads one block (`pread`) and searches it,
//!   so the answer is exact.
//!
//! The temporary file is scratch space, not a repository object.

use super::table::{with_table, FpSet, NextFp};
use super::Lineage;
use crate::error::Result;
use crate::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use crate::repo::quarantine::Quarantined;
use crate::repo::Repository;
use crate::util::sorted_pairs::Record;
use crate::util::spill::{reader, spill_io, table_limit, temp_file};
use fastbloom::BloomFilter;
use std::cmp::Ordering;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;

/// Bytes of one fingerprint in the table file (and of one index entry).
const FP: u64 = FINGERPRINT_LEN as u64;
/// Bytes of one slot of a hash set of fingerprints (fingerprint and control byte).
const SET_SLOT: u64 = FP + 1;
/// The fewest fingerprints of one block of the table file (4 KiB).
const MIN_BLOCK: u64 = 128;
/// Bloom filter bits per fingerprint at most (about 1 % false positives).
const MAX_BLOOM_BITS: u64 = 10;
/// A Bloom filter of fewer bits is not worth its hashing.
const MIN_BLOOM_BITS: u64 = 1024;

/// Where a fingerprint is among a range of the table file's.
#[derive(PartialEq)]
enum Probe {
    Found,
    /// Not there, and not after the range's first (or the range is empty).
    Before,
    /// Not there, and after the range's last.
    After,
    /// Not there, but between the range's first and last.
    Absent,
}

/// A fingerprint's first 8 bytes as a number: its place in byte order.
fn head(fp: &Fingerprint) -> u64 {
    crate::util::spill::byte_order(fp).0
}

/// Approximate bytes of the fingerprint set `set`.
fn set_memory(set: &FpSet) -> u64 {
    set.capacity() as u64 * SET_SLOT
}

/// Version `v − 1`'s NDF table of a lineage, as version `v`'s backup
/// looks it up.
pub(crate) enum PrevTable {
    /// A table within the budget (or none: the first version, or every
    /// chunk quarantined), quarantined fingerprints removed.
    Memory(FpSet),
    /// A larger table, in a temporary file.
    File(TableFile),
}

impl PrevTable {
    /// Loads version `prev`'s table of `lineage` (`0`: no table), within about
    /// `budget` bytes of memory (twice that for a moment when the table
    /// turns out larger than the budget and what was read is written out),
    /// excluding the chunks `unusable` lists. A table neither stored nor
    /// rebuildable from the recipe is empty: every chunk is then stored
    /// again, which is safe.
    pub(crate) fn load(
        repo: &Repository,
        lineage: &Lineage,
        prev: u64,
        budget: u64,
        unusable: &Quarantined,
    ) -> Result<PrevTable> {
        let quarantined = match unusable {
            Quarantined::All => return Ok(PrevTable::Memory(FpSet::default())),
            Quarantined::Chunks(q) => (!q.is_empty()).then_some(unusable),
        };
        if prev == 0 {
            return Ok(PrevTable::Memory(FpSet::default()));
        }
        let limit = table_limit(budget, SET_SLOT);
        let table = with_table(repo, lineage, prev, budget, |next| {
            let mut set = FpSet::default();
            while let Some(fp) = next()? {
                if set.len() == limit {
                    let set_bytes = set_memory(&set);
                    let mut head: Vec<Fingerprint> = set.into_iter().chain([fp]).collect();
                    head.sort_unstable();
                    let loading = set_bytes + head.capacity() as u64 * FP;
                    let mut file = TableFile::write(head, next, budget, quarantined)?;
                    file.loading = loading;
                    return Ok(PrevTable::File(file));
                }
                set.insert(fp);
            }
            if let Some(q) = quarantined {
                set.retain(|fp| !q.contains(fp));
            }
            Ok(PrevTable::Memory(set))
        })?;
        Ok(table.unwrap_or(PrevTable::Memory(FpSet::default())))
    }

    /// Whether `fp` is in the table (and not quarantined).
    pub(crate) fn contains(&mut self, fp: &Fingerprint) -> Result<bool> {
        match self {
            PrevTable::Memory(set) => Ok(set.contains(fp)),
            PrevTable::File(file) => file.contains(fp),
        }
    }

    /// Fingerprints in the table, quarantined ones excluded.
    pub(crate) fn len(&self) -> u64 {
        match self {
            PrevTable::Memory(set) => set.len() as u64,
            PrevTable::File(file) => file.len - file.excluded.len() as u64,
        }
    }

    /// Bytes of memory the table holds.
    pub(crate) fn memory(&self) -> u64 {
        match self {
            PrevTable::Memory(set) => set_memory(set),
            PrevTable::File(file) => file.memory(),
        }
    }

    /// Bytes of memory the table held at most, loading included.
    pub(crate) fn peak_memory(&self) -> u64 {
        match self {
            PrevTable::Memory(set) => set_memory(set),
            PrevTable::File(file) => file.loading.max(file.memory()),
        }
    }
}

/// A table's distinct fingerprints, sorted, in a temporary file.
pub(crate) struct TableFile {
    file: File,
    /// Fingerprints in the file.
    len: u64,
    /// Fingerprints per block.
    block: u64,
    /// The first fingerprint of each block.
    index: Vec<Fingerprint>,
    /// The file's fingerprints (`None`: too few bits for one).
    bloom: Option<BloomFilter>,
    /// The file's fingerprints that are quarantined.
    excluded: FpSet,
    /// One block, as last read.
    buf: Vec<u8>,
    /// Bytes of memory held while loading (the hash set and its sorted
    /// copy, before the table turned out larger than the budget).
    loading: u64,
}

impl TableFile {
    /// Writes the fingerprints `head`, then those `next` returns (all
    /// distinct and in byte order), to a temporary file, and indexes it in
    /// about `budget` bytes; `quarantined` fingerprints are excluded from
    /// lookups.
    fn write(
        head: Vec<Fingerprint>,
        next: NextFp,
        budget: u64,
        quarantined: Option<&Quarantined>,
    ) -> Result<TableFile> {
        let file = temp_file()?;
        let mut w = BufWriter::with_capacity(1 << 16, &file);
        let mut len = 0u64;
        for fp in head {
            fp.write_to(&mut w).map_err(spill_io)?;
            len += 1;
        }
        while let Some(fp) = next()? {
            fp.write_to(&mut w).map_err(spill_io)?;
            len += 1;
        }
        w.flush().map_err(spill_io)?;
        drop(w);
        TableFile::index(file, len, budget, quarantined)
    }

    /// Indexes `file` of `len` sorted distinct fingerprints in about
    /// `budget` bytes: half for the sparse index (blocks of at least
    /// [`MIN_BLOCK`] fingerprints, doubled until the index fits), the rest
    /// for the Bloom filter.
    fn index(
        file: File,
        len: u64,
        budget: u64,
        quarantined: Option<&Quarantined>,
    ) -> Result<TableFile> {
        let max_entries = (budget / 2 / FP).max(1);
        let mut block = MIN_BLOCK;
        while len.div_ceil(block) > max_entries {
            block *= 2;
        }
        let entries = len.div_ceil(block);
        let bloom_bits = (budget.saturating_sub(entries * FP) * 8).min(len * MAX_BLOOM_BITS);
        let mut bloom = (bloom_bits >= MIN_BLOOM_BITS)
            .then(|| BloomFilter::with_num_bits(bloom_bits as usize).expected_items(len as usize));
        let mut index = Vec::with_capacity(entries as usize);
        let mut excluded = FpSet::default();
        let mut r = reader(&file)?;
        let mut b = [0u8; FINGERPRINT_LEN];
        for i in 0..len {
            r.read_exact(&mut b).map_err(spill_io)?;
            let fp = Fingerprint::read_from(&b);
            if i % block == 0 {
                index.push(fp);
            }
            if let Some(bloom) = &mut bloom {
                bloom.insert_hash(fp.key64());
            }
            if quarantined.is_some_and(|q| q.contains(&fp)) {
                excluded.insert(fp);
            }
        }
        drop(r);
        Ok(TableFile {
            file,
            len,
            block,
            index,
            bloom,
            excluded,
            buf: Vec::new(),
            loading: 0,
        })
    }

    /// Whether `fp` is in the file and not quarantined.
    fn contains(&mut self, fp: &Fingerprint) -> Result<bool> {
        if self
            .bloom
            .as_ref()
            .is_some_and(|b| !b.contains_hash(fp.key64()))
        {
            return Ok(false);
        }
        // The block whose first fingerprint is the last one not after `fp`.
        let Some(b) = self.index.partition_point(|f| f <= fp).checked_sub(1) else {
            return Ok(false);
        };
        if self.index[b] == *fp {
            return Ok(!self.excluded.contains(fp));
        }
        let start = b as u64 * self.block;
        let n = self.block.min(self.len - start);
        // Fingerprints are hashes, spread evenly between this block's first
        // and the next one's: read a window around where `fp` would be,
        // then, if it is not inside, the part of the block on its side.
        let (low, high) = (
            head(&self.index[b]),
            self.index.get(b + 1).map_or(u64::MAX, head),
        );
        let guess = u128::from(head(fp) - low) * u128::from(n) / u128::from((high - low).max(1));
        let half = 2 * self.block.isqrt();
        let from = (guess as u64).saturating_sub(half).min(n);
        let to = (from + 2 * half).min(n);
        let found = match self.probe(start + from, start + to, fp)? {
            Probe::Found => true,
            Probe::Absent => false,
            Probe::Before => self.probe(start, start + from, fp)? == Probe::Found,
            Probe::After => self.probe(start + to, start + n, fp)? == Probe::Found,
        };
        Ok(found && !self.excluded.contains(fp))
    }

    /// Where `fp` is among the file's fingerprints `from..to`.
    fn probe(&mut self, from: u64, to: u64, fp: &Fingerprint) -> Result<Probe> {
        self.buf.resize(((to - from) * FP) as usize, 0);
        self.file
            .read_exact_at(&mut self.buf, from * FP)
            .map_err(spill_io)?;
        let n = self.buf.len() / FINGERPRINT_LEN;
        let (mut lo, mut hi) = (0usize, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let at = mid * FINGERPRINT_LEN;
            match self.buf[at..at + FINGERPRINT_LEN].cmp(&fp.0[..]) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return Ok(Probe::Found),
            }
        }
        Ok(match lo {
            0 => Probe::Before,
            _ if lo == n => Probe::After,
            _ => Probe::Absent,
        })
    }

    /// Bytes of memory: index, Bloom filter, quarantined set, block buffer.
    fn memory(&self) -> u64 {
        self.index.capacity() as u64 * FP
            + self.bloom.as_ref().map_or(0, |b| b.num_bits() as u64 / 8)
            + set_memory(&self.excluded)
            + self.buf.capacity() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(i: u64) -> Fingerprint {
        let mut f = [0u8; FINGERPRINT_LEN];
        f[..8].copy_from_slice(&i.to_be_bytes());
        f[31] = 1;
        Fingerprint(f)
    }

    /// A table file of the fingerprints `fp(2 i)`, `i < n` (the first
    /// three in memory, the others streamed), indexed in `budget` bytes.
    fn table(n: u64, budget: u64, quarantined: Option<&Quarantined>) -> TableFile {
        let head = (0..n.min(3)).map(|i| fp(2 * i)).collect();
        let mut rest = (3..n).map(|i| fp(2 * i));
        TableFile::write(head, &mut || Ok(rest.next()), budget, quarantined).unwrap()
    }

    #[test]
    fn finds_exactly_the_fingerprints_of_the_file_at_block_edges() {
        for budget in [0, 4 << 10, 1 << 20] {
            let n = 1000;
            let mut t = table(n, budget, None);
            assert_eq!(t.len, n);
            assert!(t.block >= MIN_BLOCK);
            for i in 0..n {
                assert!(t.contains(&fp(2 * i)).unwrap(), "fp {i} budget {budget}");
                assert!(
                    !t.contains(&fp(2 * i + 1)).unwrap(),
                    "fp {i}+ budget {budget}"
                );
            }
            // Before the first and after the last.
            assert!(!t.contains(&Fingerprint([0; FINGERPRINT_LEN])).unwrap());
            assert!(!t.contains(&Fingerprint([0xff; FINGERPRINT_LEN])).unwrap());
            // Each block's first and last fingerprint, and what is between blocks.
            for b in 0..n.div_ceil(t.block) {
                let first = b * t.block;
                let last = (first + t.block - 1).min(n - 1);
                assert!(t.contains(&fp(2 * first)).unwrap());
                assert!(t.contains(&fp(2 * last)).unwrap());
                assert!(!t.contains(&fp(2 * last + 1)).unwrap());
            }
        }
    }

    #[test]
    fn finds_exactly_unevenly_spread_fingerprints() {
        // Heads growing as cubes (the guessed place is far off), and
        // fingerprints that differ only after their head.
        let cube = |i: u64| fp(i * i * i);
        let tail = |i: u64| {
            let mut f = [7u8; FINGERPRINT_LEN];
            f[24..].copy_from_slice(&i.to_be_bytes());
            Fingerprint(f)
        };
        for of in [&cube as &dyn Fn(u64) -> Fingerprint, &tail] {
            let n = 700;
            let mut rest = (0..n).map(|i| of(2 * i));
            let mut t =
                TableFile::write(Vec::new(), &mut || Ok(rest.next()), 2 << 10, None).unwrap();
            for i in 0..n {
                assert!(t.contains(&of(2 * i)).unwrap(), "{i}");
                assert!(!t.contains(&of(2 * i + 1)).unwrap(), "{i}+");
            }
        }
    }

    #[test]
    fn a_zero_budget_reads_the_whole_file_as_one_block_without_a_filter() {
        let mut t = table(300, 0, None);
        assert_eq!(t.index.len(), 1);
        assert!(t.bloom.is_none());
        assert!(t.contains(&fp(0)).unwrap());
        assert!(t.contains(&fp(598)).unwrap());
        assert!(!t.contains(&fp(600)).unwrap());
    }

    #[test]
    fn the_index_and_filter_stay_within_the_budget() {
        let budget = 4 << 10;
        let mut t = table(5000, budget, None);
        assert!(t.index.len() as u64 * FP <= budget / 2);
        assert!(t.bloom.is_some());
        assert!(t.contains(&fp(2 * 4999)).unwrap());
        assert!(t.memory() <= budget + t.block * FP);
    }

    #[test]
    fn empty_single_and_tiny_tables() {
        for n in 0..5 {
            let mut t = table(n, 1 << 10, None);
            assert_eq!(t.len, n);
            assert!(!t.contains(&fp(2 * n)).unwrap());
            for i in 0..n {
                assert!(t.contains(&fp(2 * i)).unwrap());
                assert!(!t.contains(&fp(2 * i + 1)).unwrap());
            }
        }
    }

    #[test]
    fn quarantined_fingerprints_are_not_found_and_not_counted() {
        let q = Quarantined::Chunks(
            [fp(0), fp(256), fp(1998)]
                .iter()
                .map(|f| f.to_string())
                .collect(),
        );
        let mut t = PrevTable::File(table(1000, 1 << 10, Some(&q)));
        assert_eq!(t.len(), 997);
        for i in [0, 128, 999] {
            assert!(!t.contains(&fp(2 * i)).unwrap());
        }
        assert!(t.contains(&fp(2)).unwrap());
        assert!(t.contains(&fp(1996)).unwrap());
    }

    #[test]
    fn an_empty_set_finds_nothing() {
        let mut t = PrevTable::Memory(FpSet::default());
        assert_eq!(t.len(), 0);
        assert!(!t.contains(&fp(0)).unwrap());
    }
}
