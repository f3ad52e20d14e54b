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
//! Persistence (docs/FORMAT.md, "DDFS index"), all under `index/ddfs/`:
//! - `t{gen}.{part}`: the table parts of generation `gen` ([`super::table`]);
//! - `b{gen}`: the Bloom filter over that table, persisted so that opening
//!   the index reads ~1.2 bytes per entry instead of the whole table (if it is
//!   missing or damaged it is rebuilt by scanning the table: one sequential
//!   read of ~80 bytes per entry, and written back);
//! - `manifest`: generation, table shape, the first container id not yet
//!   indexed, and the containers the table names; written last, so it
//!   switches generations atomically.
//!
//! Cost of an update: every commit that has new entries (or relocations)
//! rewrites the table: it reads the old table sequentially (part by part,
//! 1 MiB requests) and writes a new generation of about 80 bytes per entry
//! (4 KiB buckets at half load), merging in this backup's new fingerprints
//! in one streaming pass; memory is one part (16 MiB) plus the sorted new
//! entries. So a backup costs O(index size) sequential I/O at commit, the
//! price of immutable objects (DDFS itself updates buckets in place).
//!
//! Like every index it is a cache: a missing, damaged or stale manifest,
//! table or bucket is rebuilt from the containers' metadata (this needs the
//! fingerprints of all containers in memory once, 40 bytes each, to sort
//! them into the table).

use super::table::{self, order_key, Pushed, Table, TableMeta, TableWriter};
use super::{read_cached, unusable, Chunk, Decision, DedupIndex, IndexStats, Relocations};
use crate::backend::Backend;
use crate::config::Config;
use crate::container::{self, Container, ContainerId};
use crate::envelope::{self, le4, le8};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap, FINGERPRINT_LEN};
use crate::spill::SpillMap;
use fastbloom::BloomFilter;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Directory of the DDFS index objects.
pub const DDFS_PREFIX: &str = "index/ddfs";
/// Key of the manifest.
pub const MANIFEST_KEY: &str = "index/ddfs/manifest";
const MANIFEST_KIND: &[u8; 4] = b"IDXD";
const MANIFEST_VERSION: u32 = 1;
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
}

impl DdfsParams {
    /// The parameters a repository configuration sets.
    pub fn from_config(config: &Config) -> DdfsParams {
        DdfsParams {
            bloom_fpr: config.bloom_fpr,
            cache_bytes: config.index_cache_bytes,
            bucket_bytes: config.index_bucket_bytes,
            part_buckets: table::DEFAULT_PART_BUCKETS,
        }
    }

    fn checked(self) -> Result<DdfsParams> {
        if !(self.bloom_fpr > 0.0 && self.bloom_fpr <= 0.5) {
            return Err(Error::InvalidConfig(format!(
                "Bloom filter false-positive rate {} is not in (0, 0.5]",
                self.bloom_fpr
            )));
        }
        if !(table::MIN_BUCKET_BYTES..=table::MAX_BUCKET_BYTES).contains(&self.bucket_bytes)
            || self.part_buckets == 0
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
            bloom_fpr: crate::config::DEFAULT_BLOOM_FPR,
            cache_bytes: crate::config::DEFAULT_INDEX_CACHE_BYTES,
            bucket_bytes: crate::config::DEFAULT_INDEX_BUCKET_BYTES,
            part_buckets: table::DEFAULT_PART_BUCKETS,
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

/// The persisted state: which table generation is current.
#[derive(Clone, Debug, PartialEq)]
struct Manifest {
    /// Containers below this id are all in the table (or were damaged).
    next_container: ContainerId,
    table: TableMeta,
    /// Containers the table names, ascending.
    referenced: Vec<ContainerId>,
}

impl Manifest {
    fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(48 + self.referenced.len() * 8);
        table::encode_manifest_head(&self.table, self.next_container, &mut p);
        table::encode_ids(&self.referenced, &mut p);
        envelope::seal(MANIFEST_KIND, MANIFEST_VERSION, &p)
    }

    fn decode(bytes: &[u8]) -> Result<Manifest> {
        let p = envelope::open(MANIFEST_KEY, MANIFEST_KIND, MANIFEST_VERSION, bytes)?;
        let (table, next_container) = table::decode_manifest_head(MANIFEST_KEY, p)?;
        Ok(Manifest {
            next_container,
            table,
            referenced: table::decode_ids(MANIFEST_KEY, &p[table::MANIFEST_HEAD_LEN..])?,
        })
    }
}

/// An LRU cache of container metadata with a memory budget: fingerprint →
/// container for every chunk of the cached containers.
struct Cache {
    map: FingerprintMap<ContainerId>,
    lru: lru::LruCache<ContainerId, Vec<Fingerprint>>,
    entries: usize,
    max_entries: usize,
    /// Allocation of the map when it holds `max_entries` entries.
    map_limit: usize,
    peak: u64,
}

impl Cache {
    fn new(budget: u64) -> Cache {
        // The map's buckets are a power of two, 7/8 usable, 41 bytes each
        // (entry and control byte); each cached fingerprint is also kept in
        // its container's list (32 bytes) and each container costs an LRU node.
        let per_entry =
            41.0 * 8.0 / 7.0 + FINGERPRINT_LEN as f64 + CACHE_CONTAINER_OVERHEAD as f64 / 300.0;
        let mut buckets: u64 = 8;
        let mut max_entries = 0;
        while buckets < 1 << 40 {
            let cap = buckets / 8 * 7;
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
            map_limit: (max_entries as usize / 7 * 8) * 41 + 64,
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
        if self.map.allocation_size() > self.map_limit {
            // Tombstones made the map grow past the budget's size: rehash smaller.
            self.map.shrink_to(self.max_entries);
        }
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

/// The DDFS index.
pub struct Ddfs {
    backend: Arc<dyn Backend>,
    params: DdfsParams,
    manifest: Manifest,
    table: Table,
    bloom: BloomFilter,
    cache: Cache,
    /// This backup's new fingerprints (`PENDING` until placed) and those of
    /// containers newer than the table.
    /// Spilled to temporary files past [`PENDING_BUDGET`] bytes.
    pending: SpillMap,
    /// Entries of `pending` that are placed (not `PENDING`).
    placed: u64,
    removed: BTreeSet<ContainerId>,
    moved: Relocations,
    /// Containers that existed at open, for rebuilding the table.
    containers: Vec<ContainerId>,
    /// Whether a lookup already had to rebuild the table (a second damage is an error).
    rebuilt_here: bool,
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
}

impl Layout {
    fn ddfs() -> Layout {
        Layout {
            prefix: DDFS_PREFIX.into(),
            policy: "ddfs",
            bloom: true,
            from_containers: true,
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
        let Some(manifest) = manifest.filter(|m| m.referenced.iter().all(|c| existing.contains(c)))
        else {
            let mut index = Ddfs::rebuild_in(backend, containers, params, layout)?;
            index.stats.rebuilt = !containers.is_empty();
            return Ok(index);
        };
        let prefix = layout.prefix.clone();
        let table = Table::new(&prefix, manifest.table);
        let generation = manifest.table.generation;
        let cached = read_cached(
            backend.as_ref(),
            &bloom_key_in(&prefix, generation),
            |bytes| decode_bloom_in(&prefix, generation, bytes),
        )?;
        let bloom = match cached {
            Some(b) => b,
            None => {
                let mut bloom = new_bloom(manifest.table.entries, params.bloom_fpr);
                let scanned = table.scan(backend.as_ref(), |fp, _| {
                    bloom.insert_hash(bloom_hash(&fp));
                    Ok(())
                });
                match scanned {
                    Ok(()) => {
                        backend.write(
                            &bloom_key_in(&prefix, generation),
                            &encode_bloom(generation, &bloom),
                        )?;
                        bloom
                    }
                    Err(e) if unusable(&e) => {
                        let mut index = Ddfs::rebuild_in(backend, containers, params, layout)?;
                        index.stats.rebuilt = true;
                        return Ok(index);
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let scan_newer = layout.from_containers;
        let mut index = Ddfs::with_state(backend, params, manifest, bloom, containers, layout);
        let newer: Vec<_> = if scan_newer {
            existing
                .range(index.manifest.next_container..)
                .copied()
                .collect()
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
        let (manifest, bloom) =
            build_from_containers(backend.as_ref(), &layout.prefix, containers, params)?;
        let mut index = Ddfs::with_state(backend, params, manifest, bloom, containers, layout);
        index.stats.containers_scanned = containers.len() as u64;
        index.note_memory();
        Ok(index)
    }

    fn with_state(
        backend: Arc<dyn Backend>,
        params: DdfsParams,
        manifest: Manifest,
        bloom: BloomFilter,
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
            entries: manifest.table.entries,
            table_bytes: manifest.table.total_bytes(),
            ..IndexStats::default()
        };
        Ddfs {
            backend,
            params,
            table: Table::new(&layout.prefix, manifest.table),
            manifest,
            bloom,
            cache: Cache::new(params.cache_bytes),
            pending: SpillMap::with_budget(PENDING_BUDGET, order_key),
            placed: 0,
            removed: BTreeSet::new(),
            moved: Relocations::default(),
            containers: containers.to_vec(),
            rebuilt_here: false,
            dirty: false,
            stats,
            layout,
            keep: None,
            sizes: None,
            piggyback: Default::default(),
            piggybacked: Vec::new(),
        }
    }

    /// Fingerprints in the persisted table.
    pub fn table_entries(&self) -> u64 {
        self.manifest.table.entries
    }

    /// Where a table entry points after the relocations not yet committed
    /// (`None`: the chunk was dropped).
    fn relocated(&self, fp: &Fingerprint, c: ContainerId) -> Option<ContainerId> {
        follow(&self.removed, &self.moved, fp, c)
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
        if self.layout.bloom && !self.bloom.contains_hash(bloom_hash(fp)) {
            self.stats.bloom_negatives += 1;
            self.pending.insert(*fp, PENDING)?;
            return Ok(Decision::Unique);
        }
        self.stats.disk_lookups += 1;
        let found = match self.table.lookup(self.backend.as_ref(), fp) {
            Ok(found) => found,
            Err(e) if unusable(&e) && !self.rebuilt_here => {
                self.rebuild_here()?;
                self.table.lookup(self.backend.as_ref(), fp)?
            }
            Err(e) => return Err(e),
        };
        match found.and_then(|c| self.relocated(fp, c)) {
            Some(c) => {
                self.load_container(c)?;
                Ok(Decision::Duplicate(c))
            }
            None => {
                if self.layout.bloom {
                    self.stats.bloom_false_positives += 1;
                }
                self.pending.insert(*fp, PENDING)?;
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

    /// A lookup met a damaged table: rebuild it from the containers that
    /// existed at open (this backup's own are in `pending`).
    fn rebuild_here(&mut self) -> Result<()> {
        let (manifest, bloom) = build_from_containers(
            self.backend.as_ref(),
            &self.layout.prefix,
            &self.containers,
            self.params,
        )?;
        self.table = Table::new(&self.layout.prefix, manifest.table);
        self.manifest = manifest;
        self.bloom = bloom;
        self.rebuilt_here = true;
        self.stats.rebuilt = true;
        self.stats.containers_scanned += self.containers.len() as u64;
        Ok(())
    }

    /// Writes a new table generation: the old table (with relocations
    /// applied) merged with the placed entries of `pending`.
    fn merge(&mut self, next_container: ContainerId, hook: Option<EvictHook>) -> Result<()> {
        let upper = self.manifest.table.entries + self.placed;
        let generation = self.manifest.table.generation + 1;
        let mut buckets = table::buckets_for(upper, self.params.bucket_bytes);
        let mut doublings = 0;
        let backend = self.backend.clone();
        let prefix = self.layout.prefix.clone();
        let (removed, moved) = (&self.removed, &self.moved);
        let (table, bloom, referenced, evicted) = loop {
            let mut m = Merger {
                writer: TableWriter::new(
                    backend.as_ref(),
                    &prefix,
                    generation,
                    buckets,
                    self.params.bucket_bytes,
                    self.params.part_buckets,
                )?,
                bloom: new_bloom(upper, self.params.bloom_fpr),
                referenced: BTreeSet::new(),
                overflow: false,
                keep: self.keep.as_ref(),
                evicted: Vec::new(),
            };
            let mut fresh = self.pending.sorted()?;
            let scanned = self.table.scan(backend.as_ref(), |fp, c| {
                let key = order_key(&fp);
                let mut new = None;
                while let Some((nfp, nc)) = fresh.peek()? {
                    if order_key(&nfp) > key {
                        break;
                    }
                    fresh.next()?;
                    match (nfp == fp, nc) {
                        (_, PENDING) => {}
                        (true, _) => new = Some(nc),
                        (false, _) => m.emit(nfp, nc)?,
                    }
                }
                // A fresh entry (a copy this backup stored: a rewritten
                // duplicate) wins, as in the exact index and in HAR's
                // design, so later backups deduplicate against the newest
                // copy; a separating merge that drops the old entry keeps
                // both (the old one is evicted).
                match (follow(removed, moved, &fp, c), new) {
                    (Some(old), Some(new)) if m.keep.is_some_and(|k| !k.contains(&old)) => {
                        m.emit(fp, old)?;
                        m.emit(fp, new)
                    }
                    (old, fresh) => match fresh.or(old) {
                        Some(c) => m.emit(fp, c),
                        None => Ok(()),
                    },
                }
            });
            match scanned {
                Ok(()) => {}
                Err(e) if unusable(&e) && !self.rebuilt_here => {
                    // The old table is damaged: rebuild it, then merge again.
                    drop(fresh);
                    self.rebuild_here()?;
                    return self.merge(next_container, hook);
                }
                Err(e) => return Err(e),
            }
            while let Some((fp, c)) = fresh.next()? {
                if c != PENDING {
                    m.emit(fp, c)?;
                }
            }
            if m.overflow {
                buckets = table::grow(buckets, doublings)?;
                doublings += 1;
                continue;
            }
            break (m.writer.finish()?, m.bloom, m.referenced, m.evicted);
        };
        if let Some(hook) = hook {
            hook(evicted)?;
        }
        let manifest = Manifest {
            next_container,
            table: *table.meta(),
            referenced: referenced.into_iter().collect(),
        };
        persist(backend.as_ref(), &self.layout, &manifest, &bloom)?;
        self.stats.commit_write_bytes = table.meta().total_bytes();
        self.table = table;
        self.manifest = manifest;
        self.bloom = bloom;
        Ok(())
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

    /// Whether the Bloom filter may hold `fp` (no I/O).
    pub(crate) fn may_contain(&self, fp: &Fingerprint) -> bool {
        self.bloom.contains_hash(bloom_hash(fp))
    }

    /// Looks `fp` up in the table only (Bloom filter, then one bucket read),
    /// without recording anything for this backup.
    pub(crate) fn find(&mut self, fp: &Fingerprint) -> Result<Option<ContainerId>> {
        if self.manifest.table.entries == 0 || !self.may_contain(fp) {
            return Ok(None);
        }
        self.stats.disk_lookups += 1;
        let found = match self.table.lookup(self.backend.as_ref(), fp) {
            Ok(found) => found,
            // A damaged table part of a part that may start empty: treat as a miss.
            Err(e) if unusable(&e) && !self.layout.from_containers => None,
            Err(e) => return Err(e),
        };
        Ok(found.and_then(|c| self.relocated(fp, c)))
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
        let bloom = (self.bloom.num_bits() / 8) as u64;
        let now = bloom + self.cache.memory() + self.pending.memory();
        self.stats.memory_bytes = self.stats.memory_bytes.max(now);
        self.stats.bloom_bytes = bloom;
        self.stats.cache_peak_bytes = self.cache.peak;
        self.stats.entries = self.manifest.table.entries + self.placed;
        self.stats.table_bytes = self.manifest.table.total_bytes();
    }
}

/// Where an entry pointing to container `c` points after garbage collection
/// removed `removed` and moved chunks as `moved` (`None`: dropped).
pub(super) fn follow(
    removed: &BTreeSet<ContainerId>,
    moved: &Relocations,
    fp: &Fingerprint,
    mut c: ContainerId,
) -> Option<ContainerId> {
    for _ in 0..=removed.len() {
        if !removed.contains(&c) {
            return Some(c);
        }
        let next = *moved.get(&(c, *fp))?;
        if next == c {
            // Kept in place: a delta base in a container GC compacted.
            return Some(c);
        }
        c = next;
    }
    None
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

/// Builds and persists a new generation from the containers' metadata.
fn build_from_containers(
    backend: &dyn Backend,
    prefix: &str,
    containers: &[ContainerId],
    params: DdfsParams,
) -> Result<(Manifest, BloomFilter)> {
    let mut entries = Vec::new();
    super::scan_containers(backend, containers, |id, metas| {
        entries.extend(metas.iter().map(|m| (m.fp, id)));
    })?;
    // The first container holding a fingerprint wins, as in the exact index.
    entries.sort_unstable_by_key(|e| (order_key(&e.0), e.1));
    entries.dedup_by_key(|e| e.0);
    let generation = next_generation(backend, prefix)?;
    let table = table::write_sorted(
        backend,
        prefix,
        generation,
        params.bucket_bytes,
        params.part_buckets,
        &entries,
    )?;
    let mut bloom = new_bloom(entries.len() as u64, params.bloom_fpr);
    let mut referenced = BTreeSet::new();
    for (fp, c) in &entries {
        bloom.insert_hash(bloom_hash(fp));
        referenced.insert(*c);
    }
    let manifest = Manifest {
        next_container: containers.last().map_or(0, |c| c + 1),
        table: *table.meta(),
        referenced: referenced.into_iter().collect(),
    };
    persist_in(backend, prefix, &manifest, &bloom)?;
    Ok((manifest, bloom))
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

/// Writes the Bloom filter and then the manifest (the table parts are
/// written already), and deletes the objects of other generations.
fn persist(
    backend: &dyn Backend,
    layout: &Layout,
    manifest: &Manifest,
    bloom: &BloomFilter,
) -> Result<()> {
    persist_in(backend, &layout.prefix, manifest, bloom)
}

/// [`persist`] under `prefix`.
fn persist_in(
    backend: &dyn Backend,
    prefix: &str,
    manifest: &Manifest,
    bloom: &BloomFilter,
) -> Result<()> {
    let generation = manifest.table.generation;
    backend.write(
        &bloom_key_in(prefix, generation),
        &encode_bloom(generation, bloom),
    )?;
    backend.write(&format!("{prefix}/manifest"), &manifest.encode())?;
    for name in backend.list(prefix)? {
        if object_generation(&name).is_some_and(|g| g != generation) {
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
        self.removed.extend(removed.iter().copied());
        self.moved.extend(moved.iter().map(|(k, v)| (*k, *v)));
        let (gone, map) = (&self.removed, &self.moved);
        let mut placed = 0;
        self.pending.retain_map(|fp, c| {
            let kept = match c {
                PENDING => Some(c),
                _ => follow(gone, map, fp, c),
            };
            placed += u64::from(kept.is_some_and(|c| c != PENDING));
            kept
        })?;
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

    fn stats(&self) -> IndexStats {
        self.stats.clone()
    }
}

impl Ddfs {
    /// [`DedupIndex::commit`]; when `keep` is set, `hook` receives the
    /// entries it leaves out before the new generation becomes current.
    pub(crate) fn commit_with(
        &mut self,
        next_container: ContainerId,
        hook: Option<EvictHook>,
    ) -> Result<()> {
        self.stats.commit_write_bytes = 0;
        let next_container = next_container.max(self.manifest.next_container);
        if self.dirty || self.keep.is_some() {
            self.merge(next_container, hook)?;
            self.pending
                .retain_map(|_, c| (c == PENDING).then_some(c))?;
            self.placed = 0;
            self.removed.clear();
            self.moved.clear();
            self.dirty = false;
        } else if next_container > self.manifest.next_container {
            self.manifest.next_container = next_container;
            self.backend
                .write(&self.layout.manifest_key(), &self.manifest.encode())?;
        }
        self.note_memory();
        Ok(())
    }
}

#[cfg(test)]
#[path = "ddfs_tests.rs"]
mod tests;
