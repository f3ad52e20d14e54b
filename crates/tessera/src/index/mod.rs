//! Deduplication indexes: decide for each chunk whether it is new, a
//! duplicate of a stored chunk, or a duplicate of an earlier chunk of the
//! same stream.
//!
//! The interface is batch-oriented and allows an index to defer decisions
//! (a lazy index buffers fingerprints until a bucket fills): `submit` may
//! return decisions for any chunks submitted so far, in any order, and
//! `finish` resolves the rest. The pipeline restores stream order with a
//! [`Reorder`] buffer.

mod ddfs;
mod ehid;
mod exact;
mod lazy;
pub mod metalog;
mod relocations;
pub mod runs;
pub mod table;
#[cfg(test)]
mod test_sim;

pub use ddfs::{Ddfs, DdfsParams, DDFS_PREFIX};
pub use ehid::{
    Cumm, Ehid, EhidParams, DEFAULT_SPARSE_THRESHOLD, EHID_COLD_PREFIX, EHID_HOT_PREFIX,
};
pub use exact::Exact;
pub use lazy::{Lazy, LazyParams, Mode as LazyMode, LAZY_PREFIX};
pub use runs::Compaction;

/// Default target false-positive rate of the DDFS Bloom filter.
pub const DEFAULT_BLOOM_FPR: f64 = 0.01;
/// Default memory budget of the DDFS container-metadata cache: 64 MiB.
pub const DEFAULT_INDEX_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// Default memory budget of the DDFS Bloom filters (`bloom_bytes` 0): 256 MiB,
/// enough for ~170 million chunks (~1.4 TB stored at 8 KiB) at the target rate.
pub const DEFAULT_DDFS_BLOOM_BUDGET: u64 = 256 * 1024 * 1024;
/// Default bucket size of on-disk fingerprint tables: 4 KiB.
pub const DEFAULT_INDEX_BUCKET_BYTES: u32 = 4096;
/// Default sparse-container threshold of HID/EHID, in percent.
pub const DEFAULT_EHID_SPARSE_PCT: u32 = 50;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::layout::container::{self, ContainerId};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

pub use relocations::Relocations;

/// A fingerprinted chunk travelling through the backup pipeline.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// Position in the stream (0, 1, 2, …).
    pub seq: u64,
    /// Fingerprint of the bytes.
    pub fp: Fingerprint,
    /// Length in bytes.
    pub len: u32,
    /// The bytes (`None` when replaying a fingerprint trace).
    pub data: Option<Bytes>,
}

/// What the index decided for a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// First occurrence: store it.
    Unique,
    /// Already stored by an earlier backup, in this container.
    Duplicate(ContainerId),
    /// Duplicate of an earlier chunk of the same stream (decided `Unique`).
    InternalDuplicate,
}

/// Counters every index reports (policies fill what applies to them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct IndexStats {
    /// Index policy name.
    pub policy: String,
    /// Fingerprints in the index after the backup.
    pub entries: u64,
    /// Peak memory of the index's in-memory structures, in bytes.
    pub memory_bytes: u64,
    /// Lookups answered from memory.
    pub lookups: u64,
    /// Lookups that had to read the on-disk index.
    pub disk_lookups: u64,
    /// Whether the persisted index was missing or damaged and was rebuilt from the containers.
    pub rebuilt: bool,
    /// Whether a backup sharing the repository (FORMAT.md §13.3) met a
    /// damaged on-disk table and left it as it was: it looked chunks up in
    /// a table rebuilt in memory (DDFS), and `repair`, `index rebuild` or
    /// the next `gc` rebuilds the table on disk.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub damaged_left: bool,
    /// Containers added to the persisted index by scanning them (newer than the index).
    pub containers_scanned: u64,
    /// Lookups answered by the cache of container metadata (DDFS).
    pub cache_hits: u64,
    /// Lookups the Bloom filter answered "not stored" (DDFS).
    pub bloom_negatives: u64,
    /// On-disk lookups that found nothing: Bloom filter false positives (DDFS).
    pub bloom_false_positives: u64,
    /// Container metadata sections loaded into the cache after an on-disk hit (DDFS).
    pub container_loads: u64,
    /// Bytes of the Bloom filter (DDFS).
    pub bloom_bytes: u64,
    /// Peak bytes of the container-metadata cache (DDFS).
    pub cache_peak_bytes: u64,
    /// Bytes of the on-disk index after the last commit (DDFS).
    pub table_bytes: u64,
    /// Bytes written to persist the index in the last commit (DDFS).
    pub commit_write_bytes: u64,
    /// Entries of the cold index (HID/EHID): they name sparse containers and
    /// are not looked up unless `ehid_consult_cold` is set.
    pub cold_entries: u64,
    /// Bytes of the cold index's on-disk table (HID/EHID).
    pub cold_table_bytes: u64,
    /// Bytes of the cold index's Bloom filter (HID/EHID; counted in
    /// `memory_bytes` only when the cold index is consulted).
    pub cold_bloom_bytes: u64,
    /// Chunks that missed the hot index while the cold index's Bloom filter
    /// holds them: fragmented chunks stored again as unique (FTU; an estimate
    /// that includes the cold filter's false positives) (HID/EHID).
    pub ftu_chunks: u64,
    /// Chunks deduplicated by the cold index (`ehid_consult_cold`).
    pub cold_hits: u64,
    /// Containers this backup referenced whose utilization was below the
    /// threshold (HID/EHID).
    pub sparse_containers: u64,
    /// Entries moved from the hot to the cold index by the last commit (HID/EHID).
    pub evicted_entries: u64,
    /// Runs of metadata-log entries read into the cache after an on-disk hit (lazy/eager).
    pub prefetches: u64,
    /// Single metadata-log entries read without prefetching (lazy: found
    /// fingerprints outside any buffer cycle).
    pub log_reads: u64,
    /// Fingerprint-cache lookups (lazy/eager: prelookups and postlookups).
    pub cache_lookups: u64,
    /// Fingerprints found in the cache as they arrived (lazy/eager).
    pub prelookup_hits: u64,
    /// Buffered fingerprints found in the cache after a prefetch (lazy).
    pub postlookup_hits: u64,
    /// Prelookup misses the adaptive lazy index looked up at once, as eager
    /// does, instead of buffering them (lazy).
    pub immediate_lookups: u64,
    /// Buffer buckets searched before they were full, to bound the bytes
    /// held back behind the oldest undecided chunk (lazy).
    pub forced_flushes: u64,
    /// Peak bytes of chunks held back behind the oldest undecided chunk (lazy).
    pub buffer_peak_bytes: u64,
    /// Seconds spent reading the on-disk table (lazy/eager).
    pub disk_seconds: f64,
    /// Seconds spent reading the metadata log (lazy/eager).
    pub prefetch_seconds: f64,
}

/// Calls `f` with the metadata of each of `containers` in order; containers
/// whose metadata is damaged or of an unknown version are skipped, and
/// quarantined chunks left out (their chunks will be stored again). Every index rebuilds itself from this.
pub(crate) fn scan_containers(
    backend: &dyn Backend,
    containers: &[ContainerId],
    mut f: impl FnMut(ContainerId, &[container::ChunkMeta]),
) -> Result<()> {
    // Quarantined chunks (known damaged) are left out: stored again.
    let quarantined = crate::repo::quarantine::load(backend)?;
    for &id in containers {
        match container::read_meta(backend, id) {
            Ok((_, metas)) => match quarantined.get(&id) {
                None => f(id, &metas),
                Some(q) => {
                    let kept: Vec<_> = metas.into_iter().filter(|m| !q.contains(&m.fp)).collect();
                    f(id, &kept)
                }
            },
            Err(
                Error::Corrupt { .. }
                | Error::Authentication { .. }
                | Error::UnsupportedVersion { .. },
            ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Verifies the objects of every on-disk index present (DDFS, HID/EHID hot
/// and cold, lazy/eager) that their manifests list: table parts, Bloom
/// filters and metadata log segments (`tessera check`). Returns the damaged
/// or missing ones, each error naming its object; the manifests themselves
/// are checked with the other derived objects.
pub(crate) fn verify(backend: &dyn Backend) -> Result<Vec<Error>> {
    let mut out = Vec::new();
    for prefix in [DDFS_PREFIX, EHID_HOT_PREFIX, EHID_COLD_PREFIX] {
        out.extend(ddfs::verify_in(backend, prefix)?);
    }
    out.extend(lazy::verify(backend)?);
    Ok(out)
}

/// Whether an error means "this cached object cannot be used" (so rebuild it).
pub(crate) fn unusable(e: &Error) -> bool {
    matches!(
        e,
        Error::Corrupt { .. }
            | Error::Authentication { .. }
            | Error::UnsupportedVersion { .. }
            | Error::NotFound(_)
    )
}

/// Reads and decodes the cached index object `key`: `None` when it is
/// missing, damaged or of an unknown version (the caller rebuilds it);
/// other errors (I/O) pass.
pub(crate) fn read_cached<T>(
    backend: &dyn Backend,
    key: &str,
    decode: impl FnOnce(&[u8]) -> Result<T>,
) -> Result<Option<T>> {
    match backend.read(key).and_then(|bytes| decode(&bytes)) {
        Ok(v) => Ok(Some(v)),
        Err(e) if unusable(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A deduplication index policy.
pub trait DedupIndex: Send {
    /// Offers chunks in stream order; appends every decision that is final now.
    fn submit(&mut self, batch: Vec<Chunk>, decided: &mut Vec<(Chunk, Decision)>) -> Result<()>;
    /// End of stream: appends the decisions still pending.
    fn finish(&mut self, decided: &mut Vec<(Chunk, Decision)>) -> Result<()>;
    /// Tells the index where chunks decided `Unique` were stored.
    fn placed(&mut self, stored: &[(Fingerprint, ContainerId)]) -> Result<()>;
    /// After garbage collection deleted the containers in `removed`: entries
    /// pointing into them move to `moved[(old container, fp)]` or are dropped.
    fn relocate(&mut self, removed: &BTreeSet<ContainerId>, moved: &Relocations) -> Result<()>;
    /// Persists the index once every container below `next_container` is durable.
    fn commit(&mut self, next_container: ContainerId) -> Result<()>;
    /// Makes the next [`DedupIndex::commit`] add this backup's entries to
    /// the index as it is persisted *now*, which other backups may have
    /// committed to since it was opened, and leave the objects they may
    /// still read in place (a shared backup in its commit section,
    /// docs/FORMAT.md §13.3). Indexes whose backups never share keep this
    /// default, which does nothing.
    fn rebase(&mut self) -> Result<()> {
        Ok(())
    }
    /// The counters.
    fn stats(&self) -> IndexStats;
    /// PFC-delta's piggybacking: from now on, when the index loads the
    /// metadata of one of `containers` it reads the whole container instead
    /// (still one request) and keeps it for [`DedupIndex::take_piggybacked`].
    /// Returns whether the index loads container metadata at all (DDFS,
    /// HID/EHID); others ignore the request.
    fn piggyback(&mut self, containers: std::collections::HashSet<ContainerId>) -> bool {
        let _ = containers;
        false
    }
    /// Moves the containers read whole since the last call into `out`.
    /// Their data checksum is not checked
    /// ([`container::Container::parse_unchecked_data`]): whoever uses a
    /// chunk of them verifies it (by its recorded checksum or fingerprint).
    fn take_piggybacked(&mut self, out: &mut Vec<std::sync::Arc<container::Container>>) {
        let _ = out;
    }
}

/// Hands decisions on in stream order, holding back those that arrive early.
///
/// Stream positions are dense, so the held decisions live in a ring indexed
/// by their distance from the next position to hand on (O(1) per decision).
#[derive(Default)]
pub struct Reorder {
    next: u64,
    early: VecDeque<Option<(Chunk, Decision)>>,
    waiting: usize,
}

impl Reorder {
    /// Accepts decisions in any order and appends to `ready` those whose
    /// predecessors have all been decided, in stream order.
    pub fn push(
        &mut self,
        decided: impl IntoIterator<Item = (Chunk, Decision)>,
        ready: &mut Vec<(Chunk, Decision)>,
    ) {
        for item in decided {
            let Some(slot) = item.0.seq.checked_sub(self.next) else {
                continue; // decided twice: the first decision stands
            };
            let slot = slot as usize;
            if slot >= self.early.len() {
                self.early.resize_with(slot + 1, || None);
            }
            if self.early[slot].replace(item).is_none() {
                self.waiting += 1;
            }
        }
        while let Some(Some(_)) = self.early.front() {
            if let Some(Some(item)) = self.early.pop_front() {
                ready.push(item);
            }
            self.waiting -= 1;
            self.next += 1;
        }
    }

    /// Decisions held back, waiting for earlier ones.
    pub fn waiting(&self) -> usize {
        self.waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seq: u64) -> Chunk {
        Chunk {
            seq,
            fp: Fingerprint::default(),
            len: 1,
            data: None,
        }
    }

    #[test]
    fn reorder_restores_stream_order() {
        let mut r = Reorder::default();
        let mut ready = Vec::new();
        r.push([3, 1].map(|s| (chunk(s), Decision::Unique)), &mut ready);
        assert!(ready.is_empty());
        assert_eq!(r.waiting(), 2);
        r.push([0].map(|s| (chunk(s), Decision::Unique)), &mut ready);
        assert_eq!(
            ready.iter().map(|c| c.0.seq).collect::<Vec<_>>(),
            vec![0, 1]
        );
        r.push([2, 4].map(|s| (chunk(s), Decision::Unique)), &mut ready);
        assert_eq!(
            ready.iter().map(|c| c.0.seq).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        assert_eq!(r.waiting(), 0);
    }

    proptest::proptest! {
        /// Any order of any batching comes out in stream order, each once.
        #[test]
        fn reorder_emits_every_permutation_in_order(
            order in proptest::strategy::Strategy::prop_shuffle(
                proptest::strategy::Just((0u64..300).collect::<Vec<_>>())),
            cut in 1usize..40,
        ) {
            let mut r = Reorder::default();
            let mut ready = Vec::new();
            for part in order.chunks(cut) {
                r.push(part.iter().map(|&s| (chunk(s), Decision::Unique)), &mut ready);
            }
            let got: Vec<u64> = ready.iter().map(|c| c.0.seq).collect();
            proptest::prop_assert_eq!(got, (0..300).collect::<Vec<_>>());
            proptest::prop_assert_eq!(r.waiting(), 0);
        }
    }
}
