//! The DDFS-style exact index (Zhu, Li, Patterson, "Avoiding the disk
//! bottleneck in the Data Domain deduplication file system", FAST'08): the
//! full fingerprint index lives on disk as a bucketed hash table
//! ([`super::table`]); memory holds only a Bloom filter over it (the
//! "summary vector"), a locality-preserving cache of container metadata, and
//! this backup's new fingerprints.
//!
//! Lookup order for each chunk:
//! 1. the cache of container metadata (hit ⇒ duplicate, no I/O);
//! 2. this backup's new fingerprints (⇒ internal duplicate, or a duplicate
//!    of a container this backup wrote);
//! 3. the Bloom filter (negative ⇒ unique, no I/O);
//! 4. one ranged read of the fingerprint's bucket in the on-disk table: a hit
//!    loads the whole metadata section of the container it names into the
//!    cache (so the chunks stored next to it hit in memory), a miss is a
//!    Bloom false positive ⇒ unique.
//!
//! It decides exactly like [`super::Exact`]: same classes for every chunk,
//! and a `Duplicate` always names a container holding the chunk (not always
//! the same one when a fingerprint is stored in several containers). The one
//! known difference: after garbage collection dropped the index entry of a
//! chunk that another surviving container still holds, the exact index
//! forgets that copy, while this one can still find it through the cache.
//!
//! Memory is bounded by configuration at any size: the runs' Bloom
//! filters stay within `bloom_budget` (each new run's filter is sized for
//! its share of a quarter of it; filters that do not fit, the oldest and
//! largest run's first, are not held, and a lookup reads the bucket of
//! every run without a filter: the same decisions, more disk lookups), the
//! cache within `cache_bytes`, this backup's new fingerprints within
//! `PENDING_BUDGET` (then spilled).
//!
//! Persistence (docs/FORMAT.md §10.2), all under `index/ddfs/`:
//! - `t{gen}.{part}`: the parts of the table *run* of generation `gen`
//!   ([`super::table`]); the table is a log-structured set of runs
//!   ([`super::runs`]), newest wins;
//! - `b{gen}`: the Bloom filter over run `gen`, persisted so that opening
//!   the index reads ~1.5 bytes per entry instead of the runs (if it is
//!   missing or damaged it is rebuilt by scanning its run and written back);
//! - `manifest`: the runs (oldest first) and their shapes, the first
//!   container id not yet indexed, and the containers the runs name (as
//!   ranges); written last, so it switches the set of runs atomically.
//!
//! Cost of an update: a commit writes this backup's new entries as a new
//! run (about 80 bytes per entry: 4 KiB buckets at half load) and its Bloom
//! filter, then merges runs as the size-tiered compaction asks
//! ([`runs::Compaction`]: fan-in 4 by default), each merge a streaming
//! k-way pass holding one window per run and one output part in memory. So
//! a fingerprint is written about log₄(entries / 4096) times over its life,
//! and a commit's amortized work is proportional to what it adds, not to
//! the repository. Garbage collection (relocations) and HID/EHID's hot/cold
//! separation merge every run into one.
//!
//! Like every index it is a cache: a missing, damaged or stale manifest,
//! table or bucket is rebuilt from the containers' metadata (this needs the
//! fingerprints of all containers in memory once, 40 bytes each, to sort
//! them into the table).

use super::runs::{self, Compaction, Ranges, Source};
use super::table::{self, order_key, Pushed, Table, TableMeta, TableWriter};
use super::{read_cached, unusable, Chunk, Decision, DedupIndex, IndexStats, Relocations};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap, FINGERPRINT_LEN};
use crate::format::envelope::{self, le4, le8};
use crate::layout::container::{self, Container, ContainerId};
use crate::util::spill::SpillMap;
use fastbloom::BloomFilter;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Directory of the DDFS index objects.
pub const DDFS_PREFIX: &str = "index/ddfs";
/// Key of the manifest.
pub const MANIFEST_KEY: &str = "index/ddfs/manifest";
const MANIFEST_KIND: &[u8; 4] = b"IDXD";
const MANIFEST_VERSION: u32 = 2;
/// Bytes of one run's shape in the manifest.
const RUN_LEN: usize = 32;
/// Each run's Bloom filter is sized for this fraction of `bloom_fpr`, so
/// that the false positives summed over the few runs a lookup meets stay
/// near `bloom_fpr`.
const RUN_FPR_SHARE: f64 = 0.25;
/// A new run's filter gets at most its share of `bloom_budget / this`.
const BUDGET_SHARE_DIVISOR: f64 = 4.0;
/// The smallest filter written (one 512-bit block).
const MIN_BLOOM_BITS: usize = 512;
/// Bytes a stored filter object may hold besides the filter's bits.
const BLOOM_HEADER_ALLOWANCE: u64 = 1024;
const BLOOM_KIND: &[u8; 4] = b"IDXB";
const BLOOM_VERSION: u32 = 1;
/// Marks a fingerprint decided `Unique` in this backup but not yet placed.
const PENDING: ContainerId = ContainerId::MAX;
/// The Bloom filter is sized for at least this many entries.
const MIN_BLOOM_ENTRIES: u64 = 1024;
/// Memory for this backup's new fingerprints, beyond which they spill to
/// temporary files (counted in `memory_bytes`).
const PENDING_BUDGET: u64 = 8 << 20;
/// Estimated bytes per cached container besides its fingerprints (LRU node and map slot).
const CACHE_CONTAINER_OVERHEAD: u64 = 96;

/// Parameters of the DDFS index.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DdfsParams {
    /// Target false-positive rate of the Bloom filter.
    pub bloom_fpr: f64,
    /// Memory budget of the container-metadata cache, in bytes.
    pub cache_bytes: u64,
    /// Bytes per bucket of the on-disk table.
    pub bucket_bytes: u32,
    /// Buckets per table part object.
    pub part_buckets: u32,
    /// When the table's runs are merged.
    pub compaction: Compaction,
    /// Memory budget of the runs' Bloom filters, in bytes: a run's filter
    /// is sized for at most its share of a quarter of it, and a filter that
    /// does not fit is not held (its run is then looked up on disk).
    pub bloom_budget: u64,
}

impl DdfsParams {
    fn checked(self) -> Result<DdfsParams> {
        if !(self.bloom_fpr > 0.0 && self.bloom_fpr <= 0.5) {
            return Err(Error::InvalidConfig(format!(
                "Bloom filter false-positive rate {} is not in (0, 0.5]",
                self.bloom_fpr
            )));
        }
        if !(table::MIN_BUCKET_BYTES..=table::MAX_BUCKET_BYTES).contains(&self.bucket_bytes)
            || self.part_buckets == 0
            || self.compaction.fan_in < 2
            || self.compaction.min_entries == 0
        {
            return Err(Error::InvalidConfig(format!(
                "invalid index table shape {self:?}"
            )));
        }
        Ok(self)
    }
}

impl Default for DdfsParams {
    fn default() -> Self {
        DdfsParams {
            bloom_fpr: super::DEFAULT_BLOOM_FPR,
            cache_bytes: super::DEFAULT_INDEX_CACHE_BYTES,
            bucket_bytes: super::DEFAULT_INDEX_BUCKET_BYTES,
            part_buckets: table::DEFAULT_PART_BUCKETS,
            compaction: Compaction::default(),
            bloom_budget: super::DEFAULT_DDFS_BLOOM_BUDGET,
        }
    }
}

/// The Bloom filter's 64-bit source hash of a fingerprint: independent of
/// [`Fingerprint::key64`] (which places it in the table) and well mixed even
/// for short trace fingerprints.
pub(super) fn bloom_hash(fp: &Fingerprint) -> u64 {
    let a = u64::from_le_bytes(le8(&fp.0[0..8]));
    let b = u64::from_le_bytes(le8(&fp.0[8..16]));
    let c = u64::from_le_bytes(le8(&fp.0[16..24]));
    let mut x = a ^ b.rotate_left(21) ^ c.rotate_left(42) ^ 0x243F_6A88_85A3_08D3;
    // MurmurHash3's 64-bit finaliser.
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The Bloom filter of one run of about `expected` entries, in a table of
/// about `total` entries (this run's included): sized for `bloom_fpr / 4`,
/// but to at most `expected / total` of a quarter of the memory budget
/// (a higher false-positive rate then), so that the filters of all runs fit
/// in the budget (under the compaction's invariant the sum over the runs
/// of `entries / total` at their writing stays below about 3.6).
fn run_bloom(expected: u64, total: u64, params: &DdfsParams) -> BloomFilter {
    let expected = expected.max(MIN_BLOOM_ENTRIES);
    let share = (params.bloom_budget as f64 / BUDGET_SHARE_DIVISOR) * expected as f64
        / total.max(expected) as f64;
    let cap_bits = (share * 8.0) as usize;
    let fpr_bits = fastbloom::optimal_size(expected as usize, params.bloom_fpr * RUN_FPR_SHARE);
    if fpr_bits <= cap_bits {
        return new_bloom(expected, params.bloom_fpr * RUN_FPR_SHARE);
    }
    BloomFilter::with_num_bits(cap_bits.max(MIN_BLOOM_BITS)).expected_items(expected as usize)
}

fn new_bloom(expected: u64, fpr: f64) -> BloomFilter {
    BloomFilter::with_false_pos(fpr).expected_items(expected.max(MIN_BLOOM_ENTRIES) as usize)
}

#[cfg(test)]
fn bloom_key(generation: u64) -> String {
    bloom_key_in(DDFS_PREFIX, generation)
}

pub(super) fn bloom_key_in(prefix: &str, generation: u64) -> String {
    format!("{prefix}/b{generation:016x}")
}

pub(super) fn encode_bloom(generation: u64, bloom: &BloomFilter) -> Vec<u8> {
    let words = bloom.as_slice();
    let mut payload = Vec::with_capacity(24 + words.len() * 8);
    payload.extend_from_slice(&generation.to_le_bytes());
    payload.extend_from_slice(&bloom.num_hashes().to_le_bytes());
    payload.extend_from_slice(&0u32.to_le_bytes());
    payload.extend_from_slice(&(words.len() as u64).to_le_bytes());
    for w in words {
        payload.extend_from_slice(&w.to_le_bytes());
    }
    envelope::seal(BLOOM_KIND, BLOOM_VERSION, &payload)
}

#[cfg(test)]
fn decode_bloom(generation: u64, bytes: &[u8]) -> Result<BloomFilter> {
    decode_bloom_in(DDFS_PREFIX, generation, bytes)
}

pub(super) fn decode_bloom_in(prefix: &str, generation: u64, bytes: &[u8]) -> Result<BloomFilter> {
    let key = bloom_key_in(prefix, generation);
    let payload = envelope::open(&key, BLOOM_KIND, BLOOM_VERSION, bytes)?;
    if payload.len() < 24 {
        return Err(Error::corrupt(key, "truncated Bloom filter header"));
    }
    let found = u64::from_le_bytes(le8(&payload[0..8]));
    let hashes = u32::from_le_bytes(le4(&payload[8..12]));
    let count = u64::from_le_bytes(le8(&payload[16..24]));
    let body = &payload[24..];
    if found != generation
        || !(1..=64).contains(&hashes)
        || count == 0
        || body.len() as u64 != count.saturating_mul(8)
    {
        return Err(Error::corrupt(
            key,
            "Bloom filter does not match the manifest",
        ));
    }
    let words: Vec<u64> = body
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(le8(w)))
        .collect();
    Ok(BloomFilter::from_vec(words).hashes(hashes))
}

/// The persisted state: which table runs are current.
#[derive(Clone, Debug, PartialEq)]
struct Manifest {
    /// Containers below this id are all in the table (or were damaged).
    next_container: ContainerId,
    /// The runs, oldest first.
    runs: Vec<TableMeta>,
    /// Containers the runs name.
    referenced: Ranges,
}

impl Manifest {
    fn encode(&self) -> Vec<u8> {
        let ranges = self.referenced.ranges();
        let mut p = Vec::with_capacity(24 + self.runs.len() * RUN_LEN + ranges.len() * 16);
        p.extend_from_slice(&self.next_container.to_le_bytes());
        p.extend_from_slice(&(self.runs.len() as u64).to_le_bytes());
        for r in &self.runs {
            p.extend_from_slice(&r.generation.to_le_bytes());
            p.extend_from_slice(&r.buckets.to_le_bytes());
            p.extend_from_slice(&r.entries.to_le_bytes());
            p.extend_from_slice(&r.bucket_bytes.to_le_bytes());
            p.extend_from_slice(&r.part_buckets.to_le_bytes());
        }
        p.extend_from_slice(&(ranges.len() as u64).to_le_bytes());
        for &(first, end) in ranges {
            p.extend_from_slice(&first.to_le_bytes());
            p.extend_from_slice(&(end - first).to_le_bytes());
        }
        envelope::seal(MANIFEST_KIND, MANIFEST_VERSION, &p)
    }

    /// Decodes version 2, or version 1 (one table, a list of ids) as one run.
    fn decode(bytes: &[u8]) -> Result<Manifest> {
        let (version, p) =
            envelope::open_versions(MANIFEST_KEY, MANIFEST_KIND, &[1, MANIFEST_VERSION], bytes)?;
        if version == 1 {
            let (table, next_container) = table::decode_manifest_head(MANIFEST_KEY, p)?;
            let ids = table::decode_ids(MANIFEST_KEY, &p[table::MANIFEST_HEAD_LEN..])?;
            if ids.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Error::corrupt(MANIFEST_KEY, "container list not ascending"));
            }
            return Ok(Manifest {
                next_container,
                runs: vec![table],
                referenced: Ranges::from_sorted(ids),
            });
        }
        let bad = |what: &str| Error::corrupt(MANIFEST_KEY, what.to_string());
        let u64_at = |at: usize| p.get(at..at + 8).map(|b| u64::from_le_bytes(le8(b)));
        let next_container = u64_at(0).ok_or_else(|| bad("truncated manifest"))?;
        let n = u64_at(8).ok_or_else(|| bad("truncated manifest"))?;
        let runs_end = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(RUN_LEN))
            .and_then(|b| b.checked_add(16))
            .filter(|&end| end <= p.len())
            .ok_or_else(|| bad("run list does not match the manifest's size"))?;
        let mut runs = Vec::new();
        let mut generations = BTreeSet::new();
        for r in p[16..runs_end].chunks_exact(RUN_LEN) {
            let meta = TableMeta {
                generation: u64::from_le_bytes(le8(&r[0..8])),
                buckets: u64::from_le_bytes(le8(&r[8..16])),
                entries: u64::from_le_bytes(le8(&r[16..24])),
                bucket_bytes: u32::from_le_bytes(le4(&r[24..28])),
                part_buckets: u32::from_le_bytes(le4(&r[28..32])),
            };
            meta.validate(MANIFEST_KEY)?;
            if !generations.insert(meta.generation) {
                return Err(bad("two runs of the same generation"));
            }
            runs.push(meta);
        }
        let rest = &p[runs_end..];
        let count = rest.get(..8).map(|c| u64::from_le_bytes(le8(c)));
        let body = rest.get(8..).unwrap_or_default();
        if count.is_none_or(|k| body.len() as u64 != k.saturating_mul(16)) {
            return Err(bad("container ranges do not match the manifest's size"));
        }
        let ranges: Vec<(u64, u64)> = body
            .chunks_exact(16)
            .map(|r| {
                let first = u64::from_le_bytes(le8(&r[0..8]));
                (
                    first,
                    first.saturating_add(u64::from_le_bytes(le8(&r[8..16]))),
                )
            })
            .collect();
        let referenced =
            Ranges::from_ranges(ranges).ok_or_else(|| bad("container ranges out of order"))?;
        Ok(Manifest {
            next_container,
            runs,
            referenced,
        })
    }
}

/// A run a merge wrote, the containers it names and the entries a
/// separating merge left out.
struct Written {
    run: Run,
    referenced: BTreeSet<ContainerId>,
    evicted: Vec<(Fingerprint, ContainerId)>,
}

/// One run of the table and its Bloom filter (`None` when it does not fit
/// in the memory budget: every lookup reaching the run reads its bucket).
struct Run {
    table: Table,
    bloom: Option<BloomFilter>,
}

impl Run {
    /// Bytes of its filter in memory.
    fn bloom_bytes(&self) -> u64 {
        self.bloom.as_ref().map_or(0, |b| (b.num_bits() / 8) as u64)
    }

    /// Whether a lookup of the fingerprint hashed `h` must read this run
    /// (its filter may hold it, or it has none in memory).
    fn may_hold(&self, h: u64) -> bool {
        self.bloom.as_ref().is_none_or(|b| b.contains_hash(h))
    }
}

/// An LRU cache of container metadata with a memory budget: fingerprint →
/// container for every chunk of the cached containers.
struct Cache {
    map: FingerprintMap<ContainerId>,
    lru: lru::LruCache<ContainerId, Vec<Fingerprint>>,
    entries: usize,
    max_entries: usize,
    peak: u64,
}

impl Cache {
    fn new(budget: u64) -> Cache {
        // The map's buckets are a power of two, 41 bytes each (entry and
        // control byte); each cached fingerprint is also kept in its
        // container's list (32 bytes) and each container costs an LRU node.
        // The map is kept at most half full (7/16 of its buckets, half of
        // the 7/8 it may use): evicting a container leaves tombstones, and
        // when they use up the room left, the map rehashes in place only
        // while it is at most half full; fuller, it would double instead,
        // and every few containers loaded would cost a rehash of the whole
        // cache (the 1 TB scale run spent 70 % of its time so).
        let per_entry =
            41.0 * 16.0 / 7.0 + FINGERPRINT_LEN as f64 + CACHE_CONTAINER_OVERHEAD as f64 / 300.0;
        let mut buckets: u64 = 16;
        let mut max_entries = 0;
        while buckets < 1 << 40 {
            let cap = buckets / 16 * 7;
            if (cap as f64 * per_entry) as u64 > budget {
                break;
            }
            max_entries = cap;
            buckets *= 2;
        }
        Cache {
            map: FingerprintMap::default(),
            lru: lru::LruCache::unbounded(),
            entries: 0,
            max_entries: max_entries as usize,
            peak: 0,
        }
    }

    fn get(&mut self, fp: &Fingerprint) -> Option<ContainerId> {
        let c = *self.map.get(fp)?;
        self.lru.promote(&c);
        Some(c)
    }

    fn insert(&mut self, id: ContainerId, fps: Vec<Fingerprint>) {
        if fps.len() > self.max_entries || self.lru.contains(&id) {
            return;
        }
        while self.entries + fps.len() > self.max_entries {
            let Some((old, list)) = self.lru.pop_lru() else {
                break;
            };
            for fp in &list {
                if self.map.get(fp) == Some(&old) {
                    self.map.remove(fp);
                }
            }
            self.entries -= list.len();
        }
        // A chunk cached in several containers resolves to its newest copy,
        // as the table does (a rewritten chunk's copy sits with its new neighbours).
        for fp in &fps {
            self.map
                .entry(*fp)
                .and_modify(|c| *c = (*c).max(id))
                .or_insert(id);
        }
        self.entries += fps.len();
        self.lru.put(id, fps);
        self.note();
    }

    fn clear(&mut self) {
        self.map.clear();
        self.lru.clear();
        self.entries = 0;
    }

    fn memory(&self) -> u64 {
        (self.map.allocation_size() + self.entries * FINGERPRINT_LEN) as u64
            + self.lru.len() as u64 * CACHE_CONTAINER_OVERHEAD
    }

    fn note(&mut self) {
        self.peak = self.peak.max(self.memory());
    }
}

/// Containers after one whose metadata a lookup read that have theirs
/// read ahead ([`Ddfs::read_ahead_after`]).
const META_READ_AHEAD: ContainerId = 2;

/// The DDFS index.
pub struct Ddfs {
    backend: Arc<dyn Backend>,
    params: DdfsParams,
    /// Containers below this id are all in the runs (or were damaged).
    next_container: ContainerId,
    /// Containers the runs name.
    referenced: Ranges,
    /// The table's runs, oldest first.
    runs: Vec<Run>,
    cache: Cache,
    /// This backup's new fingerprints (`PENDING` until placed) and those of
    /// containers newer than the table.
    /// Spilled to temporary files past [`PENDING_BUDGET`] bytes.
    pending: SpillMap,
    /// Entries of `pending` that are placed (not `PENDING`).
    placed: u64,
    /// GCs not yet committed, oldest first: the containers each removed
    /// and where it moved their chunks.
    relocations: Vec<(BTreeSet<ContainerId>, Relocations)>,
    /// Containers that existed at open, for rebuilding the table.
    containers: Vec<ContainerId>,
    /// Whether a lookup already had to rebuild the table (a second damage is an error).
    rebuilt_here: bool,
    /// A backup sharing the repository (FORMAT.md §13.3) that met a damaged
    /// table: the table rebuilt in memory from the containers that existed
    /// at open (and this backup's committed entries), which answers its
    /// lookups instead of the runs. The runs on disk stay as they are, for
    /// `repair` or the next maintenance.
    memory: Option<FingerprintMap<ContainerId>>,
    dirty: bool,
    stats: IndexStats,
    /// Where the objects live and how the index behaves (plain DDFS or a
    /// hot/cold part of [`super::Ehid`]).
    layout: Layout,
    /// When set, the next merge keeps only entries naming these containers;
    /// the others are handed to the merge's hook (HID index separation).
    keep: Option<hashbrown::HashSet<ContainerId>>,
    /// Chunk counts of the containers whose metadata was read (when tracked).
    sizes: Option<hashbrown::HashMap<ContainerId, u32>>,
    /// Containers read whole instead of their metadata (PFC-delta), and
    /// those read so far, waiting for [`DedupIndex::take_piggybacked`].
    piggyback: std::collections::HashSet<ContainerId>,
    piggybacked: Vec<Arc<Container>>,
    /// The containers whose metadata was last hinted to be read ahead.
    hinted: std::ops::Range<ContainerId>,
}

/// Where a DDFS table lives and how it is opened.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    /// Directory of the objects.
    pub prefix: String,
    /// Policy name reported in the counters.
    pub policy: &'static str,
    /// Whether the Bloom filter screens lookups (HID reads the table for every miss).
    pub bloom: bool,
    /// Whether a missing or damaged table is rebuilt from the containers and
    /// containers newer than the table are added (otherwise it starts empty).
    pub from_containers: bool,
    /// Whether other backups share the table (docs/FORMAT.md §13.3): the
    /// objects of runs a new manifest no longer names are left in place
    /// for them (deleted by the next write under the exclusive lock).
    pub shared: bool,
}

impl Layout {
    fn ddfs() -> Layout {
        Layout {
            prefix: DDFS_PREFIX.into(),
            policy: "ddfs",
            bloom: true,
            from_containers: true,
            shared: false,
        }
    }

    fn manifest_key(&self) -> String {
        format!("{}/manifest", self.prefix)
    }
}

/// Hands the entries a separating merge dropped to the caller, before the
/// new generation becomes current.
pub(crate) type EvictHook<'a> = &'a mut dyn FnMut(Vec<(Fingerprint, ContainerId)>) -> Result<()>;

impl Ddfs {
    /// Opens the index, checking it against the containers that exist
    /// (`containers`, sorted): rebuilds it from them if the manifest is
    /// missing, damaged or names containers that do not exist; rebuilds the
    /// Bloom filter from the table if it is missing or damaged; and adds the
    /// containers newer than the table to this backup's set.
    pub fn open(
        backend: Arc<dyn Backend>,
        containers: &[ContainerId],
        params: DdfsParams,
    ) -> Result<Ddfs> {
        Ddfs::open_in(backend, containers, params, Layout::ddfs())
    }

    /// [`Ddfs::open`] for a backup that shares the repository with other
    /// backups (docs/FORMAT.md §13.3), opened in its commit section: no
    /// index object another backup may read is deleted, and its commit is
    /// rebased on the table as it is then ([`DedupIndex::rebase`]).
    pub fn open_shared(
        backend: Arc<dyn Backend>,
        containers: &[ContainerId],
        params: DdfsParams,
    ) -> Result<Ddfs> {
        let layout = Layout {
            shared: true,
            ..Layout::ddfs()
        };
        Ddfs::open_in(backend, containers, params, layout)
    }

    /// [`Ddfs::open`] with the objects and behaviour of `layout`.
    pub(crate) fn open_in(
        backend: Arc<dyn Backend>,
        containers: &[ContainerId],
        params: DdfsParams,
        layout: Layout,
    ) -> Result<Ddfs> {
        let params = params.checked()?;
        let manifest = read_cached(backend.as_ref(), &layout.manifest_key(), Manifest::decode)?;
        let existing: BTreeSet<ContainerId> = containers.iter().copied().collect();
        let Some(manifest) = manifest.filter(|m| m.referenced.ids().all(|c| existing.contains(&c)))
        else {
            let mut index = Ddfs::rebuild_in(backend, containers, params, layout)?;
            index.stats.rebuilt = !containers.is_empty();
            return Ok(index);
        };
        let mut runs = Vec::with_capacity(manifest.runs.len());
        let total = manifest.runs.iter().map(|r| r.entries).sum();
        let mut room = params.bloom_budget;
        // Newest first: the filters that do not fit are the oldest, largest runs'.
        for meta in manifest.runs.iter().rev() {
            let opened = open_run(
                backend.as_ref(),
                &layout.prefix,
                *meta,
                &params,
                total,
                &mut room,
            );
            match opened {
                Ok(run) => runs.push(run),
                Err(e) if unusable(&e) => {
                    let mut index = Ddfs::rebuild_in(backend, containers, params, layout)?;
                    index.stats.rebuilt = true;
                    return Ok(index);
                }
                Err(e) => return Err(e),
            }
        }
        runs.reverse();
        let scan_newer = layout.from_containers;
        let mut index = Ddfs::with_state(backend, params, manifest, runs, containers, layout);
        let newer: Vec<_> = if scan_newer {
            existing.range(index.next_container..).copied().collect()
        } else {
            Vec::new()
        };
        let pending = &mut index.pending;
        let (mut placed, mut failed) = (0, Ok(None));
        super::scan_containers(index.backend.as_ref(), &newer, |id, metas| {
            // Ascending ids: a chunk's newest copy wins, as in a merge.
            for m in metas {
                if failed.is_ok() {
                    failed = pending.insert(m.fp, id);
                    placed += u64::from(matches!(failed, Ok(None)));
                }
            }
        })?;
        failed?;
        index.placed = placed;
        index.dirty = !newer.is_empty();
        index.stats.containers_scanned = newer.len() as u64;
        index.note_memory();
        Ok(index)
    }

    /// Builds the index from the metadata of `containers` and persists it;
    /// containers whose metadata is damaged are left out.
    pub fn rebuild(
        backend: Arc<dyn Backend>,
        containers: &[ContainerId],
        params: DdfsParams,
    ) -> Result<Ddfs> {
        Ddfs::rebuild_in(backend, containers, params, Layout::ddfs())
    }

    /// [`Ddfs::rebuild`] with the objects and behaviour of `layout` (a
    /// layout not built from the containers starts empty).
    pub(crate) fn rebuild_in(
        backend: Arc<dyn Backend>,
        containers: &[ContainerId],
        params: DdfsParams,
        layout: Layout,
    ) -> Result<Ddfs> {
        let params = params.checked()?;
        let containers = if layout.from_containers {
            containers
        } else {
            &[]
        };
        let (manifest, run) = build_from_containers(
            backend.as_ref(),
            &layout.prefix,
            containers,
            params,
            !layout.shared,
        )?;
        let runs = run.into_iter().collect();
        let mut index = Ddfs::with_state(backend, params, manifest, runs, containers, layout);
        index.stats.containers_scanned = containers.len() as u64;
        index.note_memory();
        Ok(index)
    }

    fn with_state(
        backend: Arc<dyn Backend>,
        params: DdfsParams,
        manifest: Manifest,
        runs: Vec<Run>,
        containers: &[ContainerId],
        layout: Layout,
    ) -> Ddfs {
        let containers = if layout.from_containers {
            containers
        } else {
            &[]
        };
        let stats = IndexStats {
            policy: layout.policy.into(),
            entries: manifest.runs.iter().map(|r| r.entries).sum(),
            table_bytes: manifest.runs.iter().map(|r| r.total_bytes()).sum(),
            ..IndexStats::default()
        };
        Ddfs {
            backend,
            params,
            next_container: manifest.next_container,
            referenced: manifest.referenced,
            runs,
            cache: Cache::new(params.cache_bytes),
            pending: SpillMap::with_budget(PENDING_BUDGET, order_key),
            placed: 0,
            relocations: Vec::new(),
            containers: containers.to_vec(),
            rebuilt_here: false,
            memory: None,
            dirty: false,
            stats,
            layout,
            keep: None,
            sizes: None,
            piggyback: Default::default(),
            piggybacked: Vec::new(),
            hinted: 0..0,
        }
    }

    /// Entries in the persisted table's runs (a fingerprint stored again
    /// by a later backup is in two runs until they are merged).
    pub fn table_entries(&self) -> u64 {
        self.runs.iter().map(|r| r.table.meta().entries).sum()
    }

    /// The number of runs of the persisted table.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Looks `fp` up in the runs, newest first (those whose Bloom filter
    /// may hold it, or all without filters): the container of the newest
    /// entry that survives the relocations not yet committed. Counts the
    /// bucket reads; `screened` is set when a filter let a lookup through.
    fn lookup_runs(
        &mut self,
        fp: &Fingerprint,
        screen: bool,
        screened: &mut bool,
    ) -> Result<Option<ContainerId>> {
        if let Some(memory) = &self.memory {
            return match memory.get(fp) {
                Some(&c) => self.relocated(fp, c),
                None => Ok(None),
            };
        }
        let h = bloom_hash(fp);
        for i in (0..self.runs.len()).rev() {
            let run = &self.runs[i];
            if screen && !run.may_hold(h) {
                continue;
            }
            // A miss in a run without a filter in memory is no false positive.
            *screened |= run.bloom.is_some();
            self.stats.disk_lookups += 1;
            let found = run.table.lookup(self.backend.as_ref(), fp)?;
            if let Some(c) = found {
                if let Some(c) = self.relocated(fp, c)? {
                    return Ok(Some(c));
                }
            }
        }
        Ok(None)
    }

    /// Where a table entry points after the relocations not yet committed
    /// (`None`: the chunk was dropped).
    fn relocated(&self, fp: &Fingerprint, c: ContainerId) -> Result<Option<ContainerId>> {
        follow(&self.relocations, fp, c)
    }

    fn decide(&mut self, fp: &Fingerprint) -> Result<Decision> {
        if let Some(c) = self.cache.get(fp) {
            self.stats.cache_hits += 1;
            return Ok(Decision::Duplicate(c));
        }
        match self.pending.get(fp)? {
            Some(PENDING) => return Ok(Decision::InternalDuplicate),
            Some(c) => return Ok(Decision::Duplicate(c)),
            None => {}
        }
        let mut screened = false;
        let screen = self.layout.bloom;
        let found = match self.lookup_runs(fp, screen, &mut screened) {
            Ok(found) => found,
            Err(e) if unusable(&e) && !self.rebuilt_here => {
                self.rebuild_here()?;
                self.lookup_runs(fp, screen, &mut screened)?
            }
            Err(e) => return Err(e),
        };
        match found {
            Some(c) => {
                self.load_container(c)?;
                Ok(Decision::Duplicate(c))
            }
            None => {
                match (self.layout.bloom, screened) {
                    (false, _) => {}
                    (true, true) => self.stats.bloom_false_positives += 1,
                    (true, false) => self.stats.bloom_negatives += 1,
                }
                self.pending.set(*fp, PENDING)?;
                Ok(Decision::Unique)
            }
        }
    }

    /// Reads container `c`'s metadata (or, for PFC-delta, the whole container).
    fn read_container(&mut self, c: ContainerId) -> Result<Vec<container::ChunkMeta>> {
        if !self.piggyback.contains(&c) {
            return container::read_meta(self.backend.as_ref(), c).map(|(_, metas)| metas);
        }
        let whole = self.backend.read_shared(&container::key(c))?;
        // The delta stage verifies each base it uses (checksum or fingerprint).
        let ct = Arc::new(Container::parse_unchecked_data(c, whole)?);
        let metas = ct.metas.clone();
        self.piggybacked.push(ct);
        Ok(metas)
    }

    /// Prefetches container `c`'s metadata into the cache.
    fn load_container(&mut self, c: ContainerId) -> Result<()> {
        match self.read_container(c) {
            Ok(metas) => {
                self.stats.container_loads += 1;
                if let Some(sizes) = &mut self.sizes {
                    sizes.insert(c, metas.len() as u32);
                }
                self.cache.insert(c, metas.iter().map(|m| m.fp).collect());
                if !self.piggyback.contains(&c) {
                    self.read_ahead_after(c);
                }
                Ok(())
            }
            // The table is right that the chunk is there; only its neighbours go uncached.
            Err(
                Error::Corrupt { .. }
                | Error::Authentication { .. }
                | Error::UnsupportedVersion { .. },
            ) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Hints the backend to read ahead the metadata of the
    /// [`META_READ_AHEAD`] containers after `c` (those not hinted yet): a
    /// backup of data like an earlier one's meets their chunks next, and
    /// their reads then overlap the work until then. Changes no decision
    /// and no statistic.
    fn read_ahead_after(&mut self, c: ContainerId) {
        let want = (c + 1)..(c + 1 + META_READ_AHEAD).min(self.next_container);
        let start = match self.hinted.contains(&want.start) {
            true => self.hinted.end.max(want.start),
            false => want.start,
        };
        let keys: Vec<String> = (start..want.end)
            .filter(|n| !self.piggyback.contains(n))
            .map(container::key)
            .collect();
        if !keys.is_empty() {
            self.backend.will_read_heads(&keys, container::META_GUESS);
        }
        self.hinted = want;
    }

    /// A lookup met a damaged table: rebuild it from the containers that
    /// existed at open (this backup's own are in `pending`). A backup
    /// sharing the repository rebuilds it in memory only
    /// ([`Ddfs::rebuild_in_memory`]).
    fn rebuild_here(&mut self) -> Result<()> {
        if self.layout.shared {
            return self.rebuild_in_memory();
        }
        let (manifest, run) = build_from_containers(
            self.backend.as_ref(),
            &self.layout.prefix,
            &self.containers,
            self.params,
            true,
        )?;
        self.next_container = manifest.next_container;
        self.referenced = manifest.referenced;
        self.runs = run.into_iter().collect();
        self.rebuilt_here = true;
        self.stats.rebuilt = true;
        self.stats.containers_scanned += self.containers.len() as u64;
        Ok(())
    }

    /// [`Ddfs::rebuild_here`] for a backup sharing the repository: outside
    /// its commit section it may not write index objects (another backup
    /// may be writing the same generation), and inside it repairing the
    /// table is maintenance's work. So the table is rebuilt in memory from
    /// the containers' metadata (the first container holding a
    /// fingerprint wins, as in [`build_from_containers`]) and answers this
    /// backup's lookups; its commit still adds its entries as a new run but
    /// merges no runs (a merge would read the damaged one).
    fn rebuild_in_memory(&mut self) -> Result<()> {
        let mut memory = FingerprintMap::default();
        super::scan_containers(self.backend.as_ref(), &self.containers, |id, metas| {
            for m in metas {
                memory
                    .entry(m.fp)
                    .and_modify(|c: &mut ContainerId| *c = (*c).min(id))
                    .or_insert(id);
            }
        })?;
        self.memory = Some(memory);
        self.rebuilt_here = true;
        self.stats.rebuilt = true;
        self.stats.damaged_left = true;
        self.stats.containers_scanned += self.containers.len() as u64;
        self.note_memory();
        Ok(())
    }

    /// Writes run `generation` by merging this backup's entries (when
    /// `fresh`) and the runs in `merged`, newest first, applying the
    /// relocations and (when `hook`) `keep`; grows the bucket count until
    /// no bucket overflows.
    fn write_run(
        &mut self,
        generation: u64,
        fresh: bool,
        merged: std::ops::Range<usize>,
        hook: bool,
    ) -> Result<Written> {
        let upper = self.runs[merged.clone()]
            .iter()
            .map(|r| r.table.meta().entries)
            .sum::<u64>()
            + if fresh { self.placed } else { 0 };
        let total = self.table_entries() + if fresh { self.placed } else { 0 };
        // The merged runs' filters are not needed any more (without them a
        // lookup reads the bucket, so decisions stay exact even if this fails).
        for run in &mut self.runs[merged.clone()] {
            run.bloom = None;
        }
        let mut buckets = table::buckets_for(upper, self.params.bucket_bytes);
        let mut doublings = 0;
        let backend = self.backend.as_ref();
        let relocations = &self.relocations;
        let keep = if hook { self.keep.as_ref() } else { None };
        loop {
            let mut m = Merger {
                writer: TableWriter::new(
                    backend,
                    &self.layout.prefix,
                    generation,
                    buckets,
                    self.params.bucket_bytes,
                    self.params.part_buckets,
                )?,
                bloom: run_bloom(upper, total, &self.params),
                referenced: BTreeSet::new(),
                overflow: false,
                keep,
                evicted: Vec::new(),
            };
            let mut sources = Vec::with_capacity(merged.len() + 1);
            if fresh {
                sources.push(Source::Fresh(self.pending.sorted()?, PENDING));
            }
            for run in self.runs[merged.clone()].iter().rev() {
                sources.push(Source::Run(run.table.cursor(backend)));
            }
            runs::merge(&mut sources, |fp, versions| {
                // The newest surviving entry wins (a copy stored again, a
                // rewritten duplicate, names its newest copy, as in the
                // exact index and HAR's design); a separating merge also
                // hands on the older entries it does not keep.
                let mut live = Vec::with_capacity(versions.len());
                for &c in versions {
                    live.extend(follow(relocations, &fp, c)?);
                }
                let mut live = live.into_iter();
                let Some(winner) = live.next() else {
                    return Ok(());
                };
                if let Some(k) = m.keep {
                    for old in live.filter(|&c| c != winner && !k.contains(&c)) {
                        m.evicted.push((fp, old));
                    }
                }
                m.emit(fp, winner)
            })?;
            if m.overflow {
                buckets = table::grow(buckets, doublings)?;
                doublings += 1;
                continue;
            }
            let table = m.writer.finish()?;
            backend.write(
                &bloom_key_in(&self.layout.prefix, generation),
                &encode_bloom(generation, &m.bloom),
            )?;
            self.stats.commit_write_bytes +=
                table.meta().total_bytes() + (m.bloom.num_bits() / 8) as u64;
            let run = Run {
                table,
                bloom: Some(m.bloom),
            };
            return Ok(Written {
                run,
                referenced: m.referenced,
                evicted: m.evicted,
            });
        }
    }

    /// The commit's table work: with relocations or `keep`, every run and
    /// this backup's entries merge into one run; otherwise this backup's
    /// entries become a new run and the compaction merges what is due.
    fn write_runs(&mut self, hook: Option<EvictHook>) -> Result<()> {
        let mut generation = next_generation(self.backend.as_ref(), &self.layout.prefix)?;
        let full = self.keep.is_some() || !self.relocations.is_empty();
        if full {
            let Written {
                run,
                referenced,
                evicted,
            } = self.write_run(generation, true, 0..self.runs.len(), true)?;
            if let Some(hook) = hook {
                hook(evicted)?;
            }
            self.referenced = Ranges::from_sorted(referenced);
            // An empty run is left out (its objects go with the switch).
            self.runs = if run.table.meta().entries > 0 {
                vec![run]
            } else {
                Vec::new()
            };
            return Ok(());
        }
        if self.placed > 0 {
            let end = self.runs.len();
            let Written {
                run, referenced, ..
            } = self.write_run(generation, true, end..end, false)?;
            generation += 1;
            self.referenced = self.referenced.union(&Ranges::from_sorted(referenced));
            self.runs.push(run);
        }
        loop {
            // A damaged run a shared backup met stays until maintenance
            // rebuilds the table: merging would read it.
            if self.stats.damaged_left {
                return Ok(());
            }
            let sizes: Vec<u64> = self.runs.iter().map(|r| r.table.meta().entries).collect();
            let Some(start) = self.params.compaction.plan(&sizes) else {
                return Ok(());
            };
            let run = match self.write_run(generation, false, start..self.runs.len(), false) {
                Ok(written) => written.run,
                // The runs stay as they were; the objects the merge wrote
                // are leftovers for the next write under the exclusive lock.
                Err(e) if unusable(&e) && self.layout.shared => {
                    self.stats.damaged_left = true;
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            generation += 1;
            self.runs.truncate(start);
            self.runs.push(run);
        }
    }

    /// Persists the table: new runs, then the manifest (the switch), then
    /// deletes the objects of runs no longer current. A damaged run met
    /// on the way is rebuilt from the containers (once) and the commit redone.
    fn persist_runs(&mut self, next_container: ContainerId, hook: Option<EvictHook>) -> Result<()> {
        let mut hook = hook;
        match self.write_runs(hook.as_mut().map(|h| &mut **h as EvictHook)) {
            Ok(()) => {}
            // (A shared backup's new run was written already: no second one.)
            Err(e) if unusable(&e) && !self.rebuilt_here && !self.layout.shared => {
                self.rebuild_here()?;
                self.write_runs(hook)?;
            }
            Err(e) => return Err(e),
        }
        self.fit_blooms();
        self.next_container = next_container;
        let manifest = self.manifest();
        let bytes = manifest.encode();
        self.stats.commit_write_bytes += bytes.len() as u64;
        persist_manifest(
            self.backend.as_ref(),
            &self.layout.prefix,
            &manifest,
            &bytes,
            !self.layout.shared,
        )
    }

    fn manifest(&self) -> Manifest {
        Manifest {
            next_container: self.next_container,
            runs: self.runs.iter().map(|r| *r.table.meta()).collect(),
            referenced: self.referenced.clone(),
        }
    }

    /// Makes the next commit keep only entries naming `keep` (all when `None`).
    pub(crate) fn set_keep(&mut self, keep: Option<hashbrown::HashSet<ContainerId>>) {
        self.keep = keep;
    }

    /// Records the chunk count of every container whose metadata is read.
    pub(crate) fn track_sizes(&mut self) {
        self.sizes.get_or_insert_with(Default::default);
    }

    /// The chunk count of container `c`, if its metadata was read.
    pub(crate) fn container_size(&self, c: ContainerId) -> Option<u32> {
        self.sizes.as_ref()?.get(&c).copied()
    }

    /// Whether a run's Bloom filter may hold `fp` (no I/O; true when a
    /// run has no filter in memory).
    pub(crate) fn may_contain(&self, fp: &Fingerprint) -> bool {
        let h = bloom_hash(fp);
        self.runs.iter().any(|r| r.may_hold(h))
    }

    /// Keeps the runs' filters within the memory budget: newest first, a
    /// filter that does not fit any more is let go (its run is then looked
    /// up on disk). The oldest run is the largest, so it goes first.
    fn fit_blooms(&mut self) {
        let mut room = self.params.bloom_budget;
        for run in self.runs.iter_mut().rev() {
            let bytes = run.bloom_bytes();
            if bytes > room {
                run.bloom = None;
            } else {
                room -= bytes;
            }
        }
    }

    /// Looks `fp` up in the table only (Bloom filter, then one bucket read),
    /// without recording anything for this backup.
    pub(crate) fn find(&mut self, fp: &Fingerprint) -> Result<Option<ContainerId>> {
        if self.table_entries() == 0 || !self.may_contain(fp) {
            return Ok(None);
        }
        match self.lookup_runs(fp, true, &mut false) {
            Ok(found) => Ok(found),
            // A damaged table part of a part that may start empty: treat as a miss.
            Err(e) if unusable(&e) && !self.layout.from_containers => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Makes `fp`, decided `Unique` by [`Ddfs::decide`] this backup, a
    /// duplicate of container `c` instead (found elsewhere), and caches `c`'s
    /// metadata.
    pub(crate) fn adopt(&mut self, fp: Fingerprint, c: ContainerId) -> Result<()> {
        self.placed(&[(fp, c)])?;
        self.load_container(c)
    }

    /// This backup's decision for `fp` (the DDFS lookup order).
    pub(crate) fn decide_one(&mut self, fp: &Fingerprint) -> Result<Decision> {
        self.stats.lookups += 1;
        self.decide(fp)
    }

    pub(crate) fn refresh_stats(&mut self) {
        self.note_memory();
    }

    fn note_memory(&mut self) {
        self.cache.note();
        let bloom: u64 = self.runs.iter().map(Run::bloom_bytes).sum();
        let rebuilt = self
            .memory
            .as_ref()
            .map_or(0, |m| m.allocation_size() as u64);
        let now = bloom + self.cache.memory() + self.pending.memory() + rebuilt;
        self.stats.memory_bytes = self.stats.memory_bytes.max(now);
        self.stats.bloom_bytes = bloom;
        self.stats.cache_peak_bytes = self.cache.peak;
        self.stats.entries = self.table_entries() + self.placed;
        self.stats.table_bytes = self.runs.iter().map(|r| r.table.meta().total_bytes()).sum();
    }
}

/// Where an entry pointing to container `c` points after the garbage
/// collections `relocations` (oldest first: each removed its containers and
/// moved their chunks as it says; `None`: dropped). A container one GC
/// wrote can only be removed by a later one.
pub(super) fn follow(
    relocations: &[(BTreeSet<ContainerId>, Relocations)],
    fp: &Fingerprint,
    mut c: ContainerId,
) -> Result<Option<ContainerId>> {
    for (removed, moved) in relocations {
        if removed.contains(&c) {
            // The same id when kept in place: a delta base in a container GC compacted.
            match moved.get(c, fp)? {
                Some(next) => c = next,
                None => return Ok(None),
            }
        }
    }
    Ok(Some(c))
}

/// Streams entries into a new table and its Bloom filter.
struct Merger<'a> {
    writer: TableWriter<'a>,
    bloom: BloomFilter,
    referenced: BTreeSet<ContainerId>,
    overflow: bool,
    /// Only entries naming these containers are kept (all when `None`).
    keep: Option<&'a hashbrown::HashSet<ContainerId>>,
    /// The entries `keep` left out.
    evicted: Vec<(Fingerprint, ContainerId)>,
}

impl Merger<'_> {
    fn emit(&mut self, fp: Fingerprint, c: ContainerId) -> Result<()> {
        if self.overflow {
            return Ok(());
        }
        if self.keep.is_some_and(|k| !k.contains(&c)) {
            self.evicted.push((fp, c));
            return Ok(());
        }
        if self.writer.push(fp, c)? == Pushed::Overflow {
            self.overflow = true;
            return Ok(());
        }
        self.bloom.insert_hash(bloom_hash(&fp));
        self.referenced.insert(c);
        Ok(())
    }
}

/// Opens run `meta` of a table of `total` entries with `room` bytes of the
/// filters' budget left: reads its Bloom filter, or rebuilds it by scanning
/// the run (and writes it back) when it is missing or damaged; a filter that
/// does not fit in `room` is neither read nor rebuilt (the run is then
/// looked up on disk).
fn open_run(
    backend: &dyn Backend,
    prefix: &str,
    meta: TableMeta,
    params: &DdfsParams,
    total: u64,
    room: &mut u64,
) -> Result<Run> {
    let table = Table::new(prefix, meta);
    let generation = meta.generation;
    let key = bloom_key_in(prefix, generation);
    // The stored object is the filter plus a small header (and, encrypted,
    // an authentication tag): one clearly too large is not read at all.
    let too_large = match backend.size(&key) {
        Ok(stored) => stored > room.saturating_add(BLOOM_HEADER_ALLOWANCE),
        Err(e) if unusable(&e) => false,
        Err(e) => return Err(e),
    };
    if too_large {
        return Ok(Run { table, bloom: None });
    }
    let cached = read_cached(backend, &key, |bytes| {
        decode_bloom_in(prefix, generation, bytes)
    })?;
    let bloom = match cached {
        Some(bloom) => bloom,
        None => {
            let mut bloom = run_bloom(meta.entries, total, params);
            if (bloom.num_bits() / 8) as u64 > *room {
                return Ok(Run { table, bloom: None });
            }
            table.scan(backend, |fp, _| {
                bloom.insert_hash(bloom_hash(&fp));
                Ok(())
            })?;
            backend.write(&key, &encode_bloom(generation, &bloom))?;
            bloom
        }
    };
    let run = Run {
        table,
        bloom: Some(bloom),
    };
    match room.checked_sub(run.bloom_bytes()) {
        Some(left) => {
            *room = left;
            Ok(run)
        }
        None => Ok(Run { bloom: None, ..run }),
    }
}

/// Verifies the on-disk table under `prefix` (the DDFS table, or HID/EHID's
/// hot or cold one) as `tessera check` does: every run the manifest lists
/// — each part's header, every bucket's checksum and the entry count — and
/// each run's Bloom filter. Returns what is damaged or missing, each error
/// naming its object; nothing when the manifest itself is missing or
/// unusable (the check of derived objects reports it; the index is rebuilt
/// from the containers then). Errors other than damage (I/O) pass.
pub(super) fn verify_in(backend: &dyn Backend, prefix: &str) -> Result<Vec<Error>> {
    let key = format!("{prefix}/manifest");
    let Some(manifest) = read_cached(backend, &key, Manifest::decode)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for meta in manifest.runs {
        let table = Table::new(prefix, meta);
        if let Err(e) = table.scan(backend, |_, _| Ok(())) {
            out.push(e);
        }
        let generation = meta.generation;
        if let Err(e) = backend
            .read(&bloom_key_in(prefix, generation))
            .and_then(|b| decode_bloom_in(prefix, generation, &b))
        {
            out.push(e);
        }
    }
    out.into_iter()
        .map(|e| if unusable(&e) { Ok(e) } else { Err(e) })
        .collect()
}

/// Builds and persists a table of one run (none without entries) from the
/// containers' metadata.
fn build_from_containers(
    backend: &dyn Backend,
    prefix: &str,
    containers: &[ContainerId],
    params: DdfsParams,
    delete: bool,
) -> Result<(Manifest, Option<Run>)> {
    let mut entries = Vec::new();
    super::scan_containers(backend, containers, |id, metas| {
        entries.extend(metas.iter().map(|m| (m.fp, id)));
    })?;
    // The first container holding a fingerprint wins, as in the exact index.
    entries.sort_unstable_by_key(|e| (order_key(&e.0), e.1));
    entries.dedup_by_key(|e| e.0);
    if entries.is_empty() {
        let manifest = Manifest {
            next_container: containers.last().map_or(0, |c| c + 1),
            runs: Vec::new(),
            referenced: Ranges::default(),
        };
        persist_manifest(backend, prefix, &manifest, &manifest.encode(), delete)?;
        return Ok((manifest, None));
    }
    let generation = next_generation(backend, prefix)?;
    let table = table::write_sorted(
        backend,
        prefix,
        generation,
        params.bucket_bytes,
        params.part_buckets,
        &entries,
    )?;
    let mut bloom = run_bloom(entries.len() as u64, entries.len() as u64, &params);
    let mut referenced = BTreeSet::new();
    for (fp, c) in &entries {
        bloom.insert_hash(bloom_hash(fp));
        referenced.insert(*c);
    }
    backend.write(
        &bloom_key_in(prefix, generation),
        &encode_bloom(generation, &bloom),
    )?;
    let manifest = Manifest {
        next_container: containers.last().map_or(0, |c| c + 1),
        runs: vec![*table.meta()],
        referenced: Ranges::from_sorted(referenced),
    };
    persist_manifest(backend, prefix, &manifest, &manifest.encode(), delete)?;
    let mut run = Run {
        table,
        bloom: Some(bloom),
    };
    if run.bloom_bytes() > params.bloom_budget {
        run.bloom = None;
    }
    Ok((manifest, Some(run)))
}

/// A generation above every one present.
pub(super) fn next_generation(backend: &dyn Backend, prefix: &str) -> Result<u64> {
    let mut top = 0;
    for name in backend.list(prefix)? {
        if let Some(g) = object_generation(&name) {
            top = top.max(g);
        }
    }
    Ok(top + 1)
}

/// The generation of an index object name (table part or Bloom filter).
fn object_generation(name: &str) -> Option<u64> {
    if let Some((g, _)) = table::parse_part_name(name) {
        return Some(g);
    }
    let hex = name.strip_prefix('b')?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

/// Writes the manifest `encoded` (its runs' parts and Bloom filters are
/// written already), then (with `delete`) deletes the objects of runs it
/// does not name.
fn persist_manifest(
    backend: &dyn Backend,
    prefix: &str,
    manifest: &Manifest,
    encoded: &[u8],
    delete: bool,
) -> Result<()> {
    backend.write(&format!("{prefix}/manifest"), encoded)?;
    match delete {
        true => delete_unnamed(backend, prefix, manifest),
        false => Ok(()),
    }
}

/// Deletes the objects of the runs `manifest` does not name (merged runs,
/// leftovers of interrupted writes, runs shared backups left).
fn delete_unnamed(backend: &dyn Backend, prefix: &str, manifest: &Manifest) -> Result<()> {
    let current: BTreeSet<u64> = manifest.runs.iter().map(|r| r.generation).collect();
    for name in backend.list(prefix)? {
        if object_generation(&name).is_some_and(|g| !current.contains(&g)) {
            backend.delete(&format!("{prefix}/{name}"))?;
        }
    }
    Ok(())
}

impl DedupIndex for Ddfs {
    fn submit(&mut self, batch: Vec<Chunk>, decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        decided.reserve(batch.len());
        for chunk in batch {
            self.stats.lookups += 1;
            let decision = self.decide(&chunk.fp)?;
            decided.push((chunk, decision));
        }
        self.note_memory();
        Ok(())
    }

    fn finish(&mut self, _decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        self.note_memory();
        Ok(())
    }

    fn piggyback(&mut self, containers: std::collections::HashSet<ContainerId>) -> bool {
        self.piggyback = containers;
        true
    }

    fn take_piggybacked(&mut self, out: &mut Vec<Arc<Container>>) {
        out.append(&mut self.piggybacked);
    }

    fn placed(&mut self, stored: &[(Fingerprint, ContainerId)]) -> Result<()> {
        for (fp, c) in stored {
            if matches!(self.pending.insert(*fp, *c)?, None | Some(PENDING)) {
                self.placed += 1;
            }
            self.dirty = true;
        }
        Ok(())
    }

    fn relocate(&mut self, removed: &BTreeSet<ContainerId>, moved: &Relocations) -> Result<()> {
        self.relocations.push((removed.clone(), moved.clone()));
        let relocations = &self.relocations;
        let mut placed = 0;
        let mut failed = None;
        self.pending.retain_map(|fp, c| {
            let kept = match c {
                PENDING => Some(c),
                _ => follow(relocations, fp, c).unwrap_or_else(|e| {
                    failed.get_or_insert(e);
                    Some(c)
                }),
            };
            placed += u64::from(kept.is_some_and(|c| c != PENDING));
            kept
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        self.placed = placed;
        // Cached containers may be among the removed ones.
        self.cache.clear();
        self.dirty = true;
        self.note_memory();
        Ok(())
    }

    fn commit(&mut self, next_container: ContainerId) -> Result<()> {
        self.commit_with(next_container, None)
    }

    fn rebase(&mut self) -> Result<()> {
        self.rebase_on_persisted()
    }

    fn stats(&self) -> IndexStats {
        self.stats.clone()
    }
}

impl Ddfs {
    /// [`DedupIndex::rebase`]: takes the runs of the manifest as it is
    /// persisted now as the base of the next commit (reusing the runs this
    /// index holds already). A missing or damaged manifest, or a run that
    /// cannot be opened, leaves this index as it is: its commit then writes
    /// what it knows, as a single writer's would.
    fn rebase_on_persisted(&mut self) -> Result<()> {
        let key = self.layout.manifest_key();
        // A listing first: a backend with a metadata cache then knows the
        // version other writers left (FORMAT.md §13.2) and reads that one.
        self.backend.list(&self.layout.prefix)?;
        let Some(manifest) = read_cached(self.backend.as_ref(), &key, Manifest::decode)? else {
            return Ok(());
        };
        let mut held: HashMap<u64, Run> = std::mem::take(&mut self.runs)
            .into_iter()
            .map(|r| (r.table.meta().generation, r))
            .collect();
        let total = manifest.runs.iter().map(|r| r.entries).sum();
        let mut room = self.params.bloom_budget;
        let mut runs = Vec::with_capacity(manifest.runs.len());
        for meta in manifest.runs.iter().rev() {
            let opened = match held.remove(&meta.generation) {
                Some(run) => Ok(run),
                None => open_run(
                    self.backend.as_ref(),
                    &self.layout.prefix,
                    *meta,
                    &self.params,
                    total,
                    &mut room,
                ),
            };
            match opened {
                Ok(run) => runs.push(run),
                Err(e) if unusable(&e) => {
                    // Keep what this index had: the runs it opened are still there.
                    let mut mine: Vec<Run> = held.into_values().chain(runs).collect();
                    mine.sort_by_key(|r| r.table.meta().generation);
                    self.runs = mine;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        runs.reverse();
        self.runs = runs;
        self.referenced = self.referenced.union(&manifest.referenced);
        self.next_container = self.next_container.max(manifest.next_container);
        self.stats.entries = manifest.runs.iter().map(|r| r.entries).sum();
        self.dirty = true;
        Ok(())
    }

    /// [`DedupIndex::commit`]; when `keep` is set, `hook` receives the
    /// entries it leaves out before the new generation becomes current.
    pub(crate) fn commit_with(
        &mut self,
        next_container: ContainerId,
        hook: Option<EvictHook>,
    ) -> Result<()> {
        self.stats.commit_write_bytes = 0;
        let next_container = next_container.max(self.next_container);
        if self.dirty || self.keep.is_some() {
            self.persist_runs(next_container, hook)?;
            // A table rebuilt in memory keeps this backup's committed
            // entries: lookups after the commit do not read the runs.
            let memory = &mut self.memory;
            self.pending.retain_map(|fp, c| {
                if let (Some(m), true) = (memory.as_mut(), c != PENDING) {
                    m.insert(*fp, c);
                }
                (c == PENDING).then_some(c)
            })?;
            self.placed = 0;
            self.relocations.clear();
            self.dirty = false;
        } else {
            if next_container > self.next_container {
                self.next_container = next_container;
                let bytes = self.manifest().encode();
                self.stats.commit_write_bytes = bytes.len() as u64;
                self.backend.write(&self.layout.manifest_key(), &bytes)?;
            }
            // A writer alone also deletes what shared backups left: runs no
            // manifest names any more (FORMAT.md §13.3).
            if !self.layout.shared {
                delete_unnamed(self.backend.as_ref(), &self.layout.prefix, &self.manifest())?;
            }
        }
        self.note_memory();
        Ok(())
    }
}

#[cfg(test)]
#[path = "ddfs_tests.rs"]
mod tests;
