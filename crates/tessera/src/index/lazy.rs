//! Lazy exact deduplication and its eager baseline (Ma, Stones, Ma, Wang,
//! Ren, Wang, Liu, "Lazy exact deduplication", ACM TOS 13(2), 2017), on the
//! same on-disk structures (§4.2):
//!
//! - an on-disk hash table of the unique fingerprints ([`super::table`]),
//!   each entry pointing at a position of
//! - the log-structured metadata array ([`super::metalog`]): every chunk of
//!   every backup, unique or duplicate, in arrival order, with its container;
//! - in memory: a Bloom filter over the table, an LRU cache of fingerprints
//!   filled by prefetching runs of the metadata log, and this backup's new
//!   fingerprints up to a budget (the rest spills to temporary files,
//!   [`crate::util::spill`]); the log entries a commit appends are spilled as they
//!   are decided and appended a segment at a time.
//!
//! The on-disk table is read a *hash slot* at a time: the key space is cut
//! into `n` slots (the paper's `n` hash buckets, `n = buffer budget /
//! ((S_fp + S_chk)·T)`), and a slot is the run of table buckets holding its
//! keys, read with one ranged request; only the buckets a search needs are
//! checked and decoded.
//!
//! **Eager** (the baseline): Bloom filter → cache → one on-disk lookup of the
//! fingerprint's slot → on a hit, prefetch the `prefetch` log entries that
//! start at the found one into the cache. (The DDFS index, `--index ddfs`,
//! is the finer-grained alternative that reads one 4 KiB bucket per lookup.)
//!
//! **Lazy**: fingerprints that pass the Bloom filter and miss the cache
//! (prelookup) are buffered, with their chunks, in `n` in-memory hash buckets,
//! one per slot. When a buffer bucket holds `bft` fingerprints they are
//! searched on disk together: one read of their slot. A hit of a
//! fingerprint with rank `r` in its buffer cycle prefetches `prefetch` log
//! entries starting `r` entries before the found one, then looks the other
//! fingerprints of that cycle up in the cache (postlookup). Buffer cycles and
//! ranks follow Algorithm 1 (a new cycle after more than 200 consecutive
//! Bloom negatives, or when the rank passes the prefetch volume: the paper's
//! MAX_CYCLE_LENGTH, 2048, equals its N so that one prefetch covers a
//! cycle; at most 10 postlookups per fingerprint, after which it leaves its
//! cycle and is found without prefetching).
//!
//! **Adaptive** (what `Mode::Lazy` does): the paper's method only pays
//! when one bucket read decides several fingerprints, each of which eager
//! would have looked up on disk; on streams whose locality lets one
//! prefetch serve a whole run, buffering only delays the prefetch, and
//! forced flushes of one fingerprint are reads eager never makes. So the
//! index looks each prelookup miss up at once, exactly as eager does (its
//! cache then holds what eager's would), and records the miss's hash slot
//! ([`Shadow`]). It starts buffering when a miss falls in the slot of an
//! earlier recorded miss that a buffer of its budget would still hold (new
//! chunks and misses since then within the buffer's bytes): a buffer would
//! have searched the two with one read where eager made two. It stops
//! buffering (back to immediate lookups; what is buffered stays until its
//! bucket is searched) after a search that decided at most one fingerprint
//! the cache did not: that read saved nothing over eager's. The cache uses
//! the whole budget less the chunk bytes the buffer holds at the moment.
//!
//! Decisions arrive out of stream order; the pipeline restores the order,
//! holding every chunk decided after the oldest undecided one (duplicates
//! without their bytes, unless a rewriting policy may store them). The
//! index bounds the chunk bytes held — buffered chunks plus the new chunks
//! waiting behind them — by the buffer's share of the memory budget (the
//! paper's `(S_fp + S_chk)·n·T`), and the chunks waiting by
//! [`MAX_WAITING_CHUNKS`]: past either, the bucket of the oldest buffered
//! chunk is searched early (a *forced flush*).
//!
//! Both decide exactly like [`super::Exact`]. A damaged table or log object
//! makes the affected chunks unique (stored again, never wrong) and the next
//! commit rebuilds the index from the containers; garbage collection does
//! the same (the log names the containers it deleted).

use super::ddfs::{bloom_hash, bloom_key_in, decode_bloom_in, encode_bloom, next_generation};
use super::metalog::{self, Entry, MetaLog};
use super::table::{self, order_key, Pushed, Table, TableMeta, TableWriter};
use super::{read_cached, unusable, Chunk, Decision, DedupIndex, IndexStats, Relocations};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder, FingerprintMap, FINGERPRINT_LEN};
use crate::format::envelope::{self, le8};
use crate::layout::container::{self, ContainerId};
use crate::util::spill::{self, spill_io, SpillMap};
use fastbloom::BloomFilter;
use std::collections::{BTreeSet, VecDeque};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::sync::Arc;
use std::time::Instant;

/// Directory of the lazy/eager index objects.
pub const LAZY_PREFIX: &str = "index/lazy";
const MANIFEST_KEY: &str = "index/lazy/manifest";
const MANIFEST_KIND: &[u8; 4] = b"IDXL";
const MANIFEST_VERSION: u32 = 1;
/// Marks a fingerprint decided `Unique` in this backup but not yet placed.
const PENDING: ContainerId = ContainerId::MAX;
/// Algorithm 1: consecutive Bloom negatives that end a buffer cycle.
const MAX_UNIQUE_LENGTH: u32 = 200;
/// Cache lookups (postlookups) a buffered fingerprint gets before it leaves its cycle.
const MAX_CACHE_LOOKUPS: u8 = 10;
/// Most chunks that may wait behind the oldest undecided one (their
/// metadata, ~100 bytes each, is held by the pipeline).
pub const MAX_WAITING_CHUNKS: u64 = 1 << 16;
/// Estimated bytes per cached fingerprint (entry, LRU links, map slot).
const CACHE_ENTRY_BYTES: u64 = 96;
/// The smallest Bloom filter.
const MIN_BLOOM_BITS: u64 = 8192;
/// In-memory budget of the map of new fingerprints (spilled past it); the
/// map of their log positions gets half of it, the set of stored
/// duplicates an eighth.
const NEW_BUDGET: u64 = 8 << 20;
/// Log entries held in memory while their chunks wait for a decision or a
/// container, past which decided ones are spilled unresolved (and resolved
/// at commit).
const MAX_TAIL: usize = 2 * MAX_WAITING_CHUNKS as usize;

/// How much of a backup's new-fingerprint state stays in memory.
#[derive(Clone, Copy, Debug)]
struct SpillLimits {
    budget: u64,
    max_tail: usize,
}

impl SpillLimits {
    fn get() -> SpillLimits {
        #[cfg(test)]
        if let Some(l) = tests::SPILL_LIMITS.with(std::cell::Cell::get) {
            return l;
        }
        SpillLimits {
            budget: NEW_BUDGET,
            max_tail: MAX_TAIL,
        }
    }

    /// Empty `new`, `fresh` and `late` maps.
    fn maps(&self) -> [SpillMap; 3] {
        [1, 2, 8].map(|div| SpillMap::with_budget(self.budget / div, order_key))
    }
}

/// Which lookup method the index uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One on-disk lookup per fingerprint that passes the Bloom filter and misses the cache.
    Eager,
    /// Buffered fingerprints searched on disk a bucket at a time.
    Lazy,
}

/// Parameters of the lazy and eager indexes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LazyParams {
    /// Lookup method.
    pub mode: Mode,
    /// Memory budget of the fingerprint cache and (lazy) the buffer, in bytes.
    pub memory_bytes: u64,
    /// Share of the budget the lazy buffer gets (the rest is the cache); eager uses none.
    pub buffer_share: f64,
    /// Bits of the Bloom filter / 8; 0 sizes it for `bloom_fpr`.
    pub bloom_bytes: u64,
    /// Target false-positive rate when `bloom_bytes` is 0.
    pub bloom_fpr: f64,
    /// Buffer fingerprint threshold: fingerprints a buffer bucket collects before its on-disk search.
    pub bft: u32,
    /// Log entries read into the cache per prefetch.
    pub prefetch: u32,
    /// Average chunk size, to size the buffer's buckets.
    pub avg_chunk: u32,
    /// Bytes per bucket of the on-disk table.
    pub bucket_bytes: u32,
    /// Buckets per table part object.
    pub part_buckets: u32,
    /// Whether the pipeline keeps the bytes of decided duplicates while they
    /// wait for earlier decisions (it does when a rewriting policy may store them).
    pub hold_duplicates: bool,
}

impl LazyParams {
    fn checked(self) -> Result<LazyParams> {
        let bad = |what: String| Err(Error::InvalidConfig(what));
        if self.bft == 0 || self.prefetch == 0 {
            return bad(format!(
                "buffer fingerprint threshold {} and prefetch {} must be positive",
                self.bft, self.prefetch
            ));
        }
        if !(0.0..1.0).contains(&self.buffer_share) {
            return bad(format!(
                "lazy buffer share {} is not in [0, 1)",
                self.buffer_share
            ));
        }
        if self.bloom_bytes == 0 && !(self.bloom_fpr > 0.0 && self.bloom_fpr <= 0.5) {
            return bad(format!(
                "Bloom filter false-positive rate {} is not in (0, 0.5]",
                self.bloom_fpr
            ));
        }
        if !(table::MIN_BUCKET_BYTES..=table::MAX_BUCKET_BYTES).contains(&self.bucket_bytes)
            || self.part_buckets == 0
        {
            return bad(format!("invalid index table shape {self:?}"));
        }
        Ok(self)
    }

    /// Bytes of chunks the lazy buffer may hold back (0 for eager).
    fn buffer_bytes(&self) -> u64 {
        match self.mode {
            Mode::Eager => 0,
            Mode::Lazy => (self.memory_bytes as f64 * self.buffer_share) as u64,
        }
    }

    /// The hash slots of the on-disk table and of the lazy buffer: `n =
    /// buffer budget / ((S_fp + S_chk)·T)`. Both methods use the same
    /// structure, so eager gets the same `n` although its buffer is empty.
    fn slots(&self) -> usize {
        let per_bucket = (FINGERPRINT_LEN as u64 + u64::from(self.avg_chunk)) * u64::from(self.bft);
        let budget = (self.memory_bytes as f64 * self.buffer_share) as u64;
        (budget / per_bucket.max(1)).max(1) as usize
    }

    /// Fingerprints the cache holds at most: the whole budget (lazy gives
    /// back what the buffer holds, see [`Lazy::trim_cache`]).
    fn cache_entries(&self) -> usize {
        (self.memory_bytes / CACHE_ENTRY_BYTES).max(1) as usize
    }

    fn new_bloom(&self, entries: u64) -> BloomFilter {
        let entries = entries.max(1024);
        let bits = if self.bloom_bytes > 0 {
            self.bloom_bytes * 8
        } else {
            // m = -n ln p / (ln 2)^2
            (-(entries as f64) * self.bloom_fpr.ln() / (2f64.ln().powi(2))).ceil() as u64
        };
        BloomFilter::with_num_bits(bits.max(MIN_BLOOM_BITS) as usize)
            .expected_items(entries as usize)
    }
}

/// The persisted state: the current table and log.
#[derive(Clone, Debug, PartialEq)]
struct Manifest {
    /// Containers below this id are all in the index (or were damaged).
    next_container: ContainerId,
    table: TableMeta,
    log_generation: u64,
    log_len: u64,
    /// Containers the log names, ascending.
    referenced: Vec<ContainerId>,
}

impl Manifest {
    fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(64 + self.referenced.len() * 8);
        table::encode_manifest_head(&self.table, self.next_container, &mut p);
        p.extend_from_slice(&self.log_generation.to_le_bytes());
        p.extend_from_slice(&self.log_len.to_le_bytes());
        table::encode_ids(&self.referenced, &mut p);
        envelope::seal(MANIFEST_KIND, MANIFEST_VERSION, &p)
    }

    fn decode(bytes: &[u8]) -> Result<Manifest> {
        let p = envelope::open(MANIFEST_KEY, MANIFEST_KIND, MANIFEST_VERSION, bytes)?;
        let (table, next_container) = table::decode_manifest_head(MANIFEST_KEY, p)?;
        let head = table::MANIFEST_HEAD_LEN;
        if p.len() < head + 16 {
            return Err(Error::corrupt(MANIFEST_KEY, "truncated manifest"));
        }
        Ok(Manifest {
            next_container,
            table,
            log_generation: u64::from_le_bytes(le8(&p[head..head + 8])),
            log_len: u64::from_le_bytes(le8(&p[head + 8..head + 16])),
            referenced: table::decode_ids(MANIFEST_KEY, &p[head + 16..])?,
        })
    }
}

/// Verifies the lazy/eager index's objects as `tessera check` does: the
/// table the manifest names (part headers, bucket checksums, entry count),
/// its Bloom filter and every page of the metadata log up to `log_len`.
/// Returns what is damaged or missing, each error naming its object;
/// nothing when the manifest is missing or unusable (reported as a derived
/// object; the index is rebuilt then). Errors other than damage (I/O) pass.
pub(super) fn verify(backend: &dyn Backend) -> Result<Vec<Error>> {
    let Some(m) = read_cached(backend, MANIFEST_KEY, Manifest::decode)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    if let Err(e) = Table::new(LAZY_PREFIX, m.table).scan(backend, |_, _| Ok(())) {
        out.push(e);
    }
    let g = m.table.generation;
    if let Err(e) = backend
        .read(&bloom_key_in(LAZY_PREFIX, g))
        .and_then(|b| decode_bloom_in(LAZY_PREFIX, g, &b))
    {
        out.push(e);
    }
    let log = MetaLog::new(LAZY_PREFIX, m.log_generation, m.log_len);
    // One segment at a time, so that memory stays bounded.
    let mut at = 0;
    while at < m.log_len {
        if let Err(e) = log.read(backend, at, metalog::SEGMENT_ENTRIES) {
            out.push(e);
        }
        at += metalog::SEGMENT_ENTRIES;
    }
    out.into_iter()
        .map(|e| if unusable(&e) { Ok(e) } else { Err(e) })
        .collect()
}

/// A buffered fingerprint: its chunks (the first occurrence and later
/// repeats) wait for the on-disk search of its bucket.
struct Buffered {
    /// Stream position of the first occurrence.
    seq: u64,
    chunks: Vec<Chunk>,
    /// Buffer cycle and rank (Algorithm 1); `None` once out of its cycle.
    cycle: Option<u64>,
    rank: u32,
    lookups: u8,
    bucket: usize,
}

/// The lazy or eager index.
pub struct Lazy {
    backend: Arc<dyn Backend>,
    params: LazyParams,
    manifest: Manifest,
    table: Table,
    log: MetaLog,
    bloom: BloomFilter,
    cache: lru::LruCache<Fingerprint, ContainerId, FingerprintHashBuilder>,
    /// This backup's new fingerprints (`PENDING` until placed), those of
    /// containers newer than the index and the stored duplicates (spilled
    /// to temporary files past `limits.budget`).
    new: SpillMap,
    /// Entries of `new` that are placed (not `PENDING`).
    placed_new: u64,
    /// The fingerprints of `new` with the position of their first entry in
    /// `appends` (those of `late` get theirs at commit).
    fresh: SpillMap,
    /// Entries of `fresh`.
    fresh_len: u64,
    /// Stored duplicates (a rewriting policy's copies) that `new` did not
    /// hold: their first log position is found at commit.
    late: SpillMap,
    late_len: u64,
    /// The log entries to append: those of the containers newer than the
    /// index, then this backup's chunks in stream order with their
    /// containers (`PENDING` for chunks stored by this backup).
    appends: Appends,
    limits: SpillLimits,
    buffer: FingerprintMap<Buffered>,
    buckets: Vec<Vec<Fingerprint>>,
    cycles: hashbrown::HashMap<u64, Vec<Fingerprint>>,
    /// Buffered first occurrences in stream order (stale items are skipped).
    oldest: VecDeque<(u64, Fingerprint)>,
    /// Bytes of the buffered first occurrences.
    buffered_bytes: u64,
    /// Decided chunks whose bytes the pipeline holds behind an undecided
    /// one: stream position → length.
    waiting: std::collections::BTreeMap<u64, u32>,
    waiting_bytes: u64,
    uniques: u32,
    rank: u32,
    cycle: u64,
    /// Adaptive lazy: whether prelookup misses are buffered now (else
    /// looked up at once, as eager does).
    buffering: bool,
    /// Adaptive lazy: the misses looked up at once, to tell when buffering pays.
    shadow: Shadow,
    /// The index must be rebuilt from the containers at commit (GC moved
    /// chunks, or an index object was found damaged).
    stale: bool,
    stats: IndexStats,
}

impl Lazy {
    /// Opens the index, checking it against the containers that exist
    /// (`containers`, sorted): rebuilds it if the manifest or Bloom filter
    /// is missing or damaged or the log names containers that do not exist,
    /// and adds the containers newer than it.
    pub fn open(
        backend: Arc<dyn Backend>,
        containers: &[ContainerId],
        params: LazyParams,
    ) -> Result<Lazy> {
        let params = params.checked()?;
        let manifest = read_cached(backend.as_ref(), MANIFEST_KEY, Manifest::decode)?;
        let existing: BTreeSet<ContainerId> = containers.iter().copied().collect();
        let manifest = manifest.filter(|m| m.referenced.iter().all(|c| existing.contains(c)));
        let bloom = match &manifest {
            Some(m) => {
                let g = m.table.generation;
                read_cached(backend.as_ref(), &bloom_key_in(LAZY_PREFIX, g), |bytes| {
                    decode_bloom_in(LAZY_PREFIX, g, bytes)
                })?
            }
            None => None,
        };
        let (Some(manifest), Some(bloom)) = (manifest, bloom) else {
            let mut index = Lazy::rebuild(backend, containers, params)?;
            index.stats.rebuilt = !containers.is_empty();
            return Ok(index);
        };
        let mut index = Lazy::with_state(backend, params, manifest, bloom);
        let newer: Vec<_> = existing
            .range(index.manifest.next_container..)
            .copied()
            .collect();
        let (new, fresh, appends) = (&mut index.new, &mut index.fresh, &mut index.appends);
        let (mut added, mut failed) = (0, Ok(()));
        super::scan_containers(index.backend.as_ref(), &newer, |id, metas| {
            for m in metas {
                if failed.is_ok() {
                    failed = scan_entry(new, fresh, appends, (m.fp, id)).map(|first| {
                        added += u64::from(first);
                    });
                }
            }
        })?;
        failed?;
        index.appends.scanned = index.appends.written;
        index.placed_new = added;
        index.fresh_len = added;
        index.stats.containers_scanned = newer.len() as u64;
        index.note_memory();
        Ok(index)
    }

    /// Builds the index from the metadata of `containers` (their chunks in
    /// container order form the log) and persists it.
    pub fn rebuild(
        backend: Arc<dyn Backend>,
        containers: &[ContainerId],
        params: LazyParams,
    ) -> Result<Lazy> {
        let params = params.checked()?;
        let (manifest, bloom) = build_from_containers(backend.as_ref(), containers, &params)?;
        let mut index = Lazy::with_state(backend, params, manifest, bloom);
        index.stats.containers_scanned = containers.len() as u64;
        index.note_memory();
        Ok(index)
    }

    fn with_state(
        backend: Arc<dyn Backend>,
        params: LazyParams,
        manifest: Manifest,
        bloom: BloomFilter,
    ) -> Lazy {
        let policy = match params.mode {
            Mode::Eager => "eager",
            Mode::Lazy => "lazy",
        };
        let cache_entries = std::num::NonZeroUsize::new(params.cache_entries())
            .unwrap_or(std::num::NonZeroUsize::MIN);
        let limits = SpillLimits::get();
        let [new, fresh, late] = limits.maps();
        Lazy {
            table: Table::new(LAZY_PREFIX, manifest.table),
            log: MetaLog::new(LAZY_PREFIX, manifest.log_generation, manifest.log_len),
            stats: IndexStats {
                policy: policy.into(),
                entries: manifest.table.entries,
                table_bytes: manifest.table.total_bytes(),
                ..IndexStats::default()
            },
            backend,
            manifest,
            bloom,
            cache: lru::LruCache::with_hasher(cache_entries, FingerprintHashBuilder),
            new,
            placed_new: 0,
            fresh,
            fresh_len: 0,
            late,
            late_len: 0,
            appends: Appends::default(),
            limits,
            buffer: FingerprintMap::default(),
            buckets: vec![Vec::new(); params.slots()],
            cycles: hashbrown::HashMap::new(),
            oldest: VecDeque::new(),
            buffered_bytes: 0,
            waiting: std::collections::BTreeMap::new(),
            waiting_bytes: 0,
            uniques: 0,
            rank: 0,
            cycle: 0,
            buffering: false,
            shadow: Shadow::new(params.slots()),
            stale: false,
            params,
        }
    }

    /// Records `chunks`' decision (the first gets `first`, repeats follow it).
    fn emit(
        &mut self,
        chunks: Vec<Chunk>,
        first: Decision,
        decided: &mut Vec<(Chunk, Decision)>,
    ) -> Result<()> {
        if first == Decision::Unique {
            if let Some(c) = chunks.first() {
                self.new.set(c.fp, PENDING)?;
                // Its first log position (the earliest, should it come again).
                let pos = self.appends.scanned + c.seq;
                match self.fresh.insert(c.fp, pos)? {
                    None => self.fresh_len += 1,
                    Some(old) if old < pos => {
                        self.fresh.set(c.fp, old)?;
                    }
                    Some(_) => {}
                }
            }
        }
        let oldest = self.oldest_undecided().map(|(seq, _)| seq);
        for (i, chunk) in chunks.into_iter().enumerate() {
            let d = match first {
                Decision::Unique if i > 0 => Decision::InternalDuplicate,
                d => d,
            };
            let held = d == Decision::Unique || self.params.hold_duplicates;
            if held && oldest.is_some_and(|o| o < chunk.seq) {
                self.waiting.insert(chunk.seq, chunk.len);
                self.waiting_bytes += u64::from(chunk.len);
            }
            if let (Decision::Duplicate(c), Some(e)) = (d, self.appends.entry_mut(chunk.seq)) {
                e.1 = c;
            }
            decided.push((chunk, d));
        }
        Ok(())
    }

    /// Algorithm 1 for a chunk the Bloom filter calls new.
    fn count_unique(&mut self) {
        self.uniques += 1;
        if self.uniques > MAX_UNIQUE_LENGTH {
            self.rank = 0;
            self.uniques = 0;
            self.cycle += 1;
        }
    }

    /// Decides one chunk as it arrives (or buffers it).
    fn offer(&mut self, chunk: Chunk, decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        if self.appends.stream_len() != chunk.seq {
            return Err(Error::Pipeline(format!(
                "chunk {} offered out of order (expected {})",
                chunk.seq,
                self.appends.stream_len()
            )));
        }
        self.appends.tail.push_back((chunk.fp, PENDING));
        self.stats.lookups += 1;
        let fp = chunk.fp;
        if let Some(b) = self.buffer.get_mut(&fp) {
            b.chunks.push(chunk);
            self.rank += self.uniques + 1;
            self.uniques = 0;
            return Ok(());
        }
        match self.new.get(&fp)? {
            Some(PENDING) => {
                decided.push((chunk, Decision::InternalDuplicate));
                return Ok(());
            }
            Some(c) => {
                self.emit(vec![chunk], Decision::Duplicate(c), decided)?;
                return Ok(());
            }
            None => {}
        }
        if !self.bloom.contains_hash(bloom_hash(&fp)) {
            self.stats.bloom_negatives += 1;
            self.shadow.held += u64::from(chunk.len);
            self.count_unique();
            self.emit(vec![chunk], Decision::Unique, decided)?;
            return Ok(());
        }
        self.rank += self.uniques;
        self.uniques = 0;
        self.stats.cache_lookups += 1;
        if let Some(&c) = self.cache.get(&fp) {
            self.stats.prelookup_hits += 1;
            self.stats.cache_hits += 1;
            self.rank += 1;
            self.emit(vec![chunk], Decision::Duplicate(c), decided)?;
            return Ok(());
        }
        match self.params.mode {
            Mode::Eager => {
                let d = self.lookup_one(&fp)?;
                self.emit(vec![chunk], d, decided)?;
            }
            Mode::Lazy if !self.buffering => {
                // Adaptive: eager until a buffer would have searched this
                // miss together with an earlier one.
                self.shadow.held += u64::from(chunk.len);
                let slot = self.buffer_bucket(&fp);
                if self.shadow.shares(slot, self.params.buffer_bytes()) {
                    self.buffering = true;
                    self.rank = 0;
                    self.cycle += 1;
                }
                self.stats.immediate_lookups += 1;
                let d = self.lookup_one(&fp)?;
                self.emit(vec![chunk], d, decided)?;
            }
            Mode::Lazy => {
                if self.rank >= self.params.prefetch {
                    self.rank = 0;
                    self.cycle += 1;
                }
                let bucket = self.buffer_bucket(&fp);
                self.buffered_bytes += u64::from(chunk.len);
                self.buffer.insert(
                    fp,
                    Buffered {
                        seq: chunk.seq,
                        chunks: vec![chunk],
                        cycle: Some(self.cycle),
                        rank: self.rank,
                        lookups: 0,
                        bucket,
                    },
                );
                self.cycles.entry(self.cycle).or_default().push(fp);
                self.oldest.push_back((self.seq_of(&fp), fp));
                self.buckets[bucket].push(fp);
                if self.buckets[bucket].len() >= self.params.bft as usize {
                    self.flush(bucket, decided)?;
                }
            }
        }
        self.rank += 1;
        // Bound the bytes held back and the chunks waiting.
        let limit = self.params.buffer_bytes();
        while let Some((seq, bucket)) = self.oldest_undecided() {
            let held = self.buffered_bytes + self.waiting_bytes;
            let behind = self.appends.stream_len() - seq;
            if held <= limit && behind <= MAX_WAITING_CHUNKS {
                self.stats.buffer_peak_bytes = self.stats.buffer_peak_bytes.max(held);
                break;
            }
            self.stats.forced_flushes += 1;
            self.flush(bucket, decided)?;
        }
        self.trim_cache();
        Ok(())
    }

    /// Lazy: shrinks the cache so that it and the chunk bytes held back
    /// stay within the memory budget together.
    fn trim_cache(&mut self) {
        if self.params.mode == Mode::Lazy {
            let held = self.buffered_bytes + self.waiting_bytes;
            let room = self.params.memory_bytes.saturating_sub(held) / CACHE_ENTRY_BYTES;
            while self.cache.len() as u64 > room.max(1) {
                self.cache.pop_lru();
            }
        }
    }

    fn seq_of(&self, fp: &Fingerprint) -> u64 {
        self.buffer.get(fp).map_or(0, |b| b.seq)
    }

    /// The stream position and buffer bucket of the oldest undecided chunk;
    /// forgets the waiting chunks before it.
    fn oldest_undecided(&mut self) -> Option<(u64, usize)> {
        let found = loop {
            let Some(&(seq, fp)) = self.oldest.front() else {
                break None;
            };
            match self.buffer.get(&fp) {
                Some(b) if b.seq == seq => break Some((seq, b.bucket)),
                _ => {
                    self.oldest.pop_front();
                }
            }
        };
        let keep_from = found.map_or(u64::MAX, |(seq, _)| seq);
        while let Some(entry) = self.waiting.first_entry() {
            if *entry.key() >= keep_from {
                break;
            }
            self.waiting_bytes -= u64::from(entry.remove());
        }
        found
    }

    /// The hash slot of `fp` (its buffer bucket): the same key order as the on-disk table.
    fn buffer_bucket(&self, fp: &Fingerprint) -> usize {
        let n = self.buckets.len() as u128;
        ((u128::from(fp.key64()) * n) >> 64) as usize
    }

    /// Eager: one on-disk lookup, and a prefetch on a hit.
    fn lookup_one(&mut self, fp: &Fingerprint) -> Result<Decision> {
        if self.manifest.table.entries == 0 {
            self.stats.bloom_false_positives += 1;
            return Ok(Decision::Unique);
        }
        let bucket = self.table.meta().bucket_of(fp);
        let found = self
            .read_slot(self.buffer_bucket(fp), |b| b == bucket)?
            .into_iter()
            .find(|e| e.0 == *fp)
            .map(|e| e.1);
        let Some(pos) = found else {
            self.stats.bloom_false_positives += 1;
            return Ok(Decision::Unique);
        };
        Ok(match self.fetch(pos, Some(0), fp)? {
            Some(c) => Decision::Duplicate(c),
            None => Decision::Unique,
        })
    }

    /// Reads hash slot `slot` of the on-disk table (the run of table buckets
    /// whose keys fall in it) and returns the entries of the buckets `wanted`
    /// selects (only those are checked and decoded). A damaged slot reads
    /// as empty and makes the commit rebuild the index.
    fn read_slot(
        &mut self,
        slot: usize,
        wanted: impl Fn(u64) -> bool,
    ) -> Result<Vec<(Fingerprint, u64)>> {
        let (first, count) = slot_buckets(slot, self.buckets.len(), self.table.meta().buckets);
        let t = Instant::now();
        let read = self
            .table
            .read_buckets(self.backend.as_ref(), first, count, wanted);
        self.stats.disk_seconds += t.elapsed().as_secs_f64();
        match read {
            Ok((entries, reads)) => {
                self.stats.disk_lookups += reads;
                Ok(entries)
            }
            Err(e) if unusable(&e) => {
                self.stale = true;
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        }
    }

    /// The container of log entry `pos` (which must hold `fp`). With a rank
    /// `r`, prefetches `prefetch` entries from `pos - r` into the cache;
    /// without, reads only the entry.
    fn fetch(
        &mut self,
        pos: u64,
        rank: Option<u32>,
        fp: &Fingerprint,
    ) -> Result<Option<ContainerId>> {
        let (start, count) = match rank {
            Some(r) => (
                pos.saturating_sub(u64::from(r)),
                u64::from(self.params.prefetch),
            ),
            None => (pos, 1),
        };
        let t = Instant::now();
        let read = self.log.read(self.backend.as_ref(), start, count);
        self.stats.prefetch_seconds += t.elapsed().as_secs_f64();
        let (entries, reads) = match read {
            Ok(r) => r,
            Err(e) if unusable(&e) => {
                self.stale = true;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if rank.is_some() {
            self.stats.prefetches += reads;
            for &(f, c) in &entries {
                self.cache.put(f, c);
            }
            self.stats.cache_peak_bytes = self
                .stats
                .cache_peak_bytes
                .max(self.cache.len() as u64 * CACHE_ENTRY_BYTES);
        } else {
            self.stats.log_reads += reads;
        }
        match entries.get((pos - start) as usize) {
            Some(&(f, c)) if f == *fp => Ok(Some(c)),
            _ => {
                // The table points at an entry of another fingerprint: damaged.
                self.stale = true;
                Ok(None)
            }
        }
    }

    /// Lazy: searches buffer bucket `bucket` on disk and decides its fingerprints.
    fn flush(&mut self, bucket: usize, decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        let mut fps = std::mem::take(&mut self.buckets[bucket]);
        fps.retain(|fp| self.buffer.contains_key(fp));
        if fps.is_empty() {
            return Ok(());
        }
        let mut found = FingerprintMap::<u64>::default();
        if self.manifest.table.entries > 0 {
            let meta = *self.table.meta();
            let needed: BTreeSet<u64> = fps.iter().map(|f| meta.bucket_of(f)).collect();
            let entries = self.read_slot(bucket, |b| needed.contains(&b))?;
            let wanted: hashbrown::HashSet<Fingerprint, FingerprintHashBuilder> =
                fps.iter().copied().collect();
            found.extend(entries.into_iter().filter(|e| wanted.contains(&e.0)));
        }
        fps.sort_by_key(|fp| self.seq_of(fp));
        // Fingerprints this search decided that the cache did not.
        let mut searched = 0u32;
        for fp in fps {
            let Some(b) = self.take_buffered(&fp) else {
                continue; // decided by a postlookup of this flush
            };
            let Some(&pos) = found.get(&fp) else {
                searched += 1;
                self.stats.bloom_false_positives += 1;
                self.emit(b.chunks, Decision::Unique, decided)?;
                continue;
            };
            // An earlier prefetch of this flush may have brought it in.
            self.stats.cache_lookups += 1;
            if let Some(&c) = self.cache.get(&fp) {
                self.stats.postlookup_hits += 1;
                self.stats.cache_hits += 1;
                self.emit(b.chunks, Decision::Duplicate(c), decided)?;
                continue;
            }
            searched += 1;
            let rank = b.cycle.map(|_| b.rank);
            let decision = match self.fetch(pos, rank, &fp)? {
                Some(c) => Decision::Duplicate(c),
                None => Decision::Unique,
            };
            self.emit(b.chunks, decision, decided)?;
            if let Some(cycle) = b.cycle {
                self.postlookup(cycle, decided)?;
            }
        }
        if searched <= 1 {
            // The read served one fingerprint, as eager's would: stop buffering.
            self.buffering = false;
        }
        Ok(())
    }

    /// Removes `fp` from the buffer.
    fn take_buffered(&mut self, fp: &Fingerprint) -> Option<Buffered> {
        let b = self.buffer.remove(fp)?;
        if let Some(first) = b.chunks.first() {
            self.buffered_bytes -= u64::from(first.len);
        }
        Some(b)
    }

    /// Looks the buffered fingerprints of `cycle` up in the cache after a prefetch.
    fn postlookup(&mut self, cycle: u64, decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        let Some(members) = self.cycles.remove(&cycle) else {
            return Ok(());
        };
        let mut keep = Vec::new();
        for fp in members {
            let Some(b) = self.buffer.get_mut(&fp) else {
                continue;
            };
            if b.cycle != Some(cycle) {
                continue;
            }
            self.stats.cache_lookups += 1;
            if let Some(&c) = self.cache.get(&fp) {
                self.stats.postlookup_hits += 1;
                self.stats.cache_hits += 1;
                if let Some(b) = self.take_buffered(&fp) {
                    self.buckets[b.bucket].retain(|f| *f != fp);
                    self.emit(b.chunks, Decision::Duplicate(c), decided)?;
                }
                continue;
            }
            b.lookups += 1;
            if b.lookups >= MAX_CACHE_LOOKUPS {
                b.cycle = None;
            } else {
                keep.push(fp);
            }
        }
        if !keep.is_empty() {
            self.cycles.entry(cycle).or_default().extend(keep);
        }
        Ok(())
    }

    /// The stream position of the oldest undecided chunk (without
    /// forgetting anything, unlike [`Lazy::oldest_undecided`]).
    fn oldest_seq(&self) -> Option<u64> {
        self.oldest
            .iter()
            .find_map(|&(seq, fp)| match self.buffer.get(&fp) {
                Some(b) if b.seq == seq => Some(seq),
                _ => None,
            })
    }

    /// Writes the decided log entries before the oldest undecided chunk to
    /// the spill file, with the containers of the chunks stored by this
    /// backup once placed (all of them, resolved, at `commit`).
    fn drain_decided(&mut self, commit: bool) -> Result<()> {
        let limit = match commit {
            true => u64::MAX,
            false => self.oldest_seq().unwrap_or(u64::MAX),
        };
        while let Some(&(fp, c)) = self.appends.tail.front() {
            if self.appends.tail_start() >= limit {
                break;
            }
            let c = match c {
                PENDING => match self.new.get(&fp)? {
                    Some(c) if c != PENDING => c,
                    _ if commit => return Err(never_stored(&fp)),
                    _ if self.appends.tail.len() > self.limits.max_tail => PENDING,
                    _ => break,
                },
                c => c,
            };
            self.appends.tail.pop_front();
            self.appends.write((fp, c))?;
        }
        Ok(())
    }

    /// Appends this backup's log entries, merges its new fingerprints into
    /// a new table generation and switches the manifest to it.
    fn append_and_merge(&mut self, next_container: ContainerId) -> Result<()> {
        self.drain_decided(true)?;
        let base = self.log.len();
        let mut referenced: BTreeSet<ContainerId> =
            self.manifest.referenced.iter().copied().collect();
        let count = self.appends.written;
        let file = self.appends.take_file()?;
        let mut appender = self.log.appender(self.backend.as_ref())?;
        if let Some(file) = &file {
            let mut r = spill::reader(file)?;
            for i in 0..count {
                let mut buf = [0u8; APPEND_RECORD];
                r.read_exact(&mut buf).map_err(spill_io)?;
                let mut fp = Fingerprint([0; FINGERPRINT_LEN]);
                fp.0.copy_from_slice(&buf[..FINGERPRINT_LEN]);
                let c = u64::from_le_bytes(le8(&buf[FINGERPRINT_LEN..]));
                let c = match c {
                    PENDING => match self.new.get(&fp)? {
                        Some(c) if c != PENDING => c,
                        _ => return Err(never_stored(&fp)),
                    },
                    c => c,
                };
                if self.late_len > 0
                    && self.late.get(&fp)?.is_some()
                    && self.fresh.get(&fp)?.is_none()
                {
                    self.fresh.set(fp, i)?;
                    self.fresh_len += 1;
                }
                referenced.insert(c);
                appender.push((fp, c))?;
            }
        }
        appender.finish()?;
        let (table, bloom) = self.merge(base)?;
        let manifest = Manifest {
            next_container,
            table: *table.meta(),
            log_generation: self.log.generation(),
            log_len: self.log.len(),
            referenced: referenced.into_iter().collect(),
        };
        persist(self.backend.as_ref(), &manifest, &bloom)?;
        self.stats.commit_write_bytes = table.meta().total_bytes();
        self.table = table;
        self.manifest = manifest;
        self.bloom = bloom;
        Ok(())
    }

    /// The old table merged with `fresh` (its positions relative to `base`;
    /// an old entry wins).
    fn merge(&mut self, base: u64) -> Result<(Table, BloomFilter)> {
        let upper = self.manifest.table.entries + self.fresh_len;
        let generation = self.manifest.table.generation + 1;
        let p = &self.params;
        let mut buckets = table::buckets_for(upper, p.bucket_bytes);
        let mut doublings = 0;
        let backend = self.backend.as_ref();
        loop {
            let mut out = Merged {
                writer: TableWriter::new(
                    backend,
                    LAZY_PREFIX,
                    generation,
                    buckets,
                    p.bucket_bytes,
                    p.part_buckets,
                )?,
                bloom: p.new_bloom(upper),
                overflow: false,
            };
            let mut next = self.fresh.sorted()?;
            self.table.scan(backend, |fp, pos| {
                let key = order_key(&fp);
                while let Some((nfp, npos)) = next.peek()? {
                    if order_key(&nfp) >= key {
                        break;
                    }
                    out.emit(nfp, base + npos)?;
                    next.next()?;
                }
                if next.peek()?.is_some_and(|n| n.0 == fp) {
                    next.next()?;
                }
                out.emit(fp, pos)
            })?;
            while let Some((fp, pos)) = next.next()? {
                out.emit(fp, base + pos)?;
            }
            if out.overflow {
                buckets = table::grow(buckets, doublings)?;
                doublings += 1;
                continue;
            }
            return Ok((out.writer.finish()?, out.bloom));
        }
    }

    fn note_memory(&mut self) {
        let bloom = (self.bloom.num_bits() / 8) as u64;
        let cache = self.cache.len() as u64 * CACHE_ENTRY_BYTES;
        let new = self.new.memory() + self.fresh.memory() + self.late.memory();
        let tail = (self.appends.tail.capacity() * APPEND_RECORD) as u64;
        let now = bloom + cache + self.stats.buffer_peak_bytes + new + tail;
        self.stats.memory_bytes = self.stats.memory_bytes.max(now);
        self.stats.bloom_bytes = bloom;
        self.stats.entries = self.manifest.table.entries + self.placed_new;
        self.stats.table_bytes = self.manifest.table.total_bytes();
    }
}

/// The adaptive lazy index's record of the prelookup misses it looked up at
/// once: the buffer bucket (hash slot) of each, with the bytes a buffer
/// would have held when it came (`held`: the new chunks and misses of the
/// backup so far). A miss whose slot an earlier recorded miss shares, within
/// the buffer's budget of held bytes, is one a buffer would have searched
/// together with that one: one on-disk read where eager made two.
struct Shadow {
    held: u64,
    recent: VecDeque<(u64, usize)>,
    per_slot: Vec<u32>,
}

impl Shadow {
    fn new(slots: usize) -> Shadow {
        Shadow {
            held: 0,
            recent: VecDeque::new(),
            per_slot: vec![0; slots],
        }
    }

    /// Records a miss of slot `slot`; returns whether a buffer of `budget`
    /// bytes would have searched it together with a recorded one (and then
    /// forgets them all: the index buffers from now on).
    fn shares(&mut self, slot: usize, budget: u64) -> bool {
        while let Some(&(at, s)) = self.recent.front() {
            if self.held - at <= budget {
                break;
            }
            self.recent.pop_front();
            self.per_slot[s] -= 1;
        }
        if self.per_slot[slot] > 0 {
            for (_, s) in self.recent.drain(..) {
                self.per_slot[s] -= 1;
            }
            return true;
        }
        self.recent.push_back((self.held, slot));
        self.per_slot[slot] += 1;
        false
    }
}

/// Bytes of one log entry in the spill file of [`Appends`].
const APPEND_RECORD: usize = FINGERPRINT_LEN + 8;

/// The log entries a commit appends, spilled to an unnamed temporary file
/// as they are decided: the entries of the containers newer than the index
/// (`scanned`), then this backup's chunks in stream order. The `tail`, this
/// backup's chunks from stream position `written - scanned` on, stays in
/// memory while a decision or a container may still change it.
#[derive(Default)]
struct Appends {
    file: Option<BufWriter<File>>,
    /// Entries in the file.
    written: u64,
    /// Entries of the containers newer than the index (the file's first).
    scanned: u64,
    tail: VecDeque<Entry>,
}

impl Appends {
    fn len(&self) -> u64 {
        self.written + self.tail.len() as u64
    }

    /// Chunks of this backup offered so far.
    fn stream_len(&self) -> u64 {
        self.len() - self.scanned
    }

    /// The stream position of the tail's first entry.
    fn tail_start(&self) -> u64 {
        self.written - self.scanned
    }

    /// The entry of stream position `seq`, if still in memory.
    fn entry_mut(&mut self, seq: u64) -> Option<&mut Entry> {
        let i = seq.checked_sub(self.tail_start())?;
        self.tail.get_mut(usize::try_from(i).ok()?)
    }

    /// Appends an entry to the file.
    fn write(&mut self, (fp, c): Entry) -> Result<()> {
        let w = match &mut self.file {
            Some(w) => w,
            None => self
                .file
                .insert(BufWriter::with_capacity(1 << 16, spill::temp_file()?)),
        };
        w.write_all(&fp.0).map_err(spill_io)?;
        w.write_all(&c.to_le_bytes()).map_err(spill_io)?;
        self.written += 1;
        Ok(())
    }

    /// The file, flushed (`None` if nothing was written).
    fn take_file(&mut self) -> Result<Option<File>> {
        self.file
            .take()
            .map(|w| w.into_inner().map_err(|e| spill_io(e.into_error())))
            .transpose()
    }
}

/// Adds a log entry of a container newer than the index: its fingerprint
/// joins `new` and `fresh` unless an earlier entry brought it (returns
/// whether it did).
fn scan_entry(
    new: &mut SpillMap,
    fresh: &mut SpillMap,
    appends: &mut Appends,
    (fp, id): Entry,
) -> Result<bool> {
    let first = new.get(&fp)?.is_none();
    if first {
        new.set(fp, id)?;
        fresh.set(fp, appends.written)?;
    }
    appends.write((fp, id))?;
    Ok(first)
}

fn never_stored(fp: &Fingerprint) -> Error {
    Error::Pipeline(format!("chunk {fp} was decided new but never stored"))
}

/// The table buckets of hash slot `slot` of `slots`: those holding the keys
/// `slot·2^64/slots ..= (slot+1)·2^64/slots - 1` (first bucket, count).
fn slot_buckets(slot: usize, slots: usize, buckets: u64) -> (u64, u64) {
    let (s, n) = (slot as u128, slots.max(1) as u128);
    let lo_key = (s << 64).div_ceil(n);
    let hi_key = (((s + 1) << 64).div_ceil(n) - 1).min(u128::from(u64::MAX));
    let bucket = |key: u128| ((key * u128::from(buckets)) >> 64) as u64;
    let first = bucket(lo_key);
    (first, bucket(hi_key) - first + 1)
}

/// Streams entries into a new table generation and its Bloom filter.
struct Merged<'a> {
    writer: TableWriter<'a>,
    bloom: BloomFilter,
    overflow: bool,
}

impl Merged<'_> {
    fn emit(&mut self, fp: Fingerprint, pos: u64) -> Result<()> {
        if self.overflow {
            return Ok(());
        }
        if self.writer.push(fp, pos)? == Pushed::Overflow {
            self.overflow = true;
        } else {
            self.bloom.insert_hash(bloom_hash(&fp));
        }
        Ok(())
    }
}

/// Builds and persists a new log, table and Bloom filter from the
/// containers' metadata.
fn build_from_containers(
    backend: &dyn Backend,
    containers: &[ContainerId],
    params: &LazyParams,
) -> Result<(Manifest, BloomFilter)> {
    let mut entries = Vec::new();
    super::scan_containers(backend, containers, |id, metas| {
        entries.extend(metas.iter().map(|m| (m.fp, id)));
    })?;
    let mut log_generation = 0;
    for name in backend.list(LAZY_PREFIX)? {
        if let Some(g) = metalog::segment_generation(&name) {
            log_generation = log_generation.max(g);
        }
    }
    let mut log = MetaLog::new(LAZY_PREFIX, log_generation + 1, 0);
    log.append(backend, &entries)?;
    let mut first: FingerprintMap<u64> = FingerprintMap::default();
    for (i, (fp, _)) in entries.iter().enumerate() {
        first.entry(*fp).or_insert(i as u64);
    }
    let mut sorted: Vec<(Fingerprint, u64)> = first.into_iter().collect();
    sorted.sort_unstable_by_key(|e| order_key(&e.0));
    let generation = next_generation(backend, LAZY_PREFIX)?;
    let table = table::write_sorted(
        backend,
        LAZY_PREFIX,
        generation,
        params.bucket_bytes,
        params.part_buckets,
        &sorted,
    )?;
    let mut bloom = params.new_bloom(sorted.len() as u64);
    for (fp, _) in &sorted {
        bloom.insert_hash(bloom_hash(fp));
    }
    let referenced: BTreeSet<ContainerId> = entries.iter().map(|e| e.1).collect();
    let manifest = Manifest {
        next_container: containers.last().map_or(0, |c| c + 1),
        table: *table.meta(),
        log_generation: log.generation(),
        log_len: log.len(),
        referenced: referenced.into_iter().collect(),
    };
    persist(backend, &manifest, &bloom)?;
    Ok((manifest, bloom))
}

/// Writes the Bloom filter and then the manifest (table parts and log
/// segments are written already), then deletes other generations' objects.
fn persist(backend: &dyn Backend, manifest: &Manifest, bloom: &BloomFilter) -> Result<()> {
    let generation = manifest.table.generation;
    backend.write(
        &bloom_key_in(LAZY_PREFIX, generation),
        &encode_bloom(generation, bloom),
    )?;
    backend.write(MANIFEST_KEY, &manifest.encode())?;
    for name in backend.list(LAZY_PREFIX)? {
        let table_gen = table::parse_part_name(&name).map(|(g, _)| g).or_else(|| {
            let hex = name.strip_prefix('b')?;
            (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
        });
        let stale = table_gen.is_some_and(|g| g != generation)
            || metalog::segment_generation(&name).is_some_and(|g| g != manifest.log_generation);
        if stale {
            backend.delete(&format!("{LAZY_PREFIX}/{name}"))?;
        }
    }
    Ok(())
}

impl DedupIndex for Lazy {
    fn submit(&mut self, batch: Vec<Chunk>, decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        decided.reserve(batch.len());
        for chunk in batch {
            self.offer(chunk, decided)?;
        }
        self.drain_decided(false)?;
        self.note_memory();
        Ok(())
    }

    fn finish(&mut self, decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        while let Some((_, bucket)) = self.oldest_undecided() {
            self.flush(bucket, decided)?;
        }
        self.note_memory();
        Ok(())
    }

    fn placed(&mut self, stored: &[(Fingerprint, ContainerId)]) -> Result<()> {
        for &(fp, c) in stored {
            match self.new.insert(fp, c)? {
                Some(PENDING) => self.placed_new += 1,
                Some(_) => {}
                None => {
                    self.placed_new += 1;
                    self.late.set(fp, 0)?;
                    self.late_len += 1;
                }
            }
        }
        self.drain_decided(false)
    }

    fn relocate(&mut self, _removed: &BTreeSet<ContainerId>, _moved: &Relocations) -> Result<()> {
        // The log names the removed containers: rebuild at commit.
        self.stale = true;
        self.cache.clear();
        Ok(())
    }

    fn commit(&mut self, next_container: ContainerId) -> Result<()> {
        self.stats.commit_write_bytes = 0;
        let next_container = next_container.max(self.manifest.next_container);
        if self.stale {
            let mut containers: Vec<ContainerId> = self
                .backend
                .list(container::CONTAINER_DIR)?
                .iter()
                .filter_map(|n| container::parse_key_name(n))
                .collect();
            containers.sort_unstable();
            let (manifest, bloom) =
                build_from_containers(self.backend.as_ref(), &containers, &self.params)?;
            self.table = Table::new(LAZY_PREFIX, manifest.table);
            self.log = MetaLog::new(LAZY_PREFIX, manifest.log_generation, manifest.log_len);
            self.manifest = manifest;
            self.bloom = bloom;
            self.stats.rebuilt = true;
        } else if self.appends.len() > 0 {
            self.append_and_merge(next_container)?;
        } else if next_container > self.manifest.next_container {
            self.manifest.next_container = next_container;
            self.backend.write(MANIFEST_KEY, &self.manifest.encode())?;
        }
        [self.new, self.fresh, self.late] = self.limits.maps();
        (self.placed_new, self.fresh_len, self.late_len) = (0, 0, 0);
        self.appends = Appends::default();
        self.stale = false;
        self.note_memory();
        Ok(())
    }

    fn stats(&self) -> IndexStats {
        self.stats.clone()
    }
}

#[cfg(test)]
#[path = "lazy_tests.rs"]
mod tests;
