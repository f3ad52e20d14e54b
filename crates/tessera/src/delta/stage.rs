//! The delta-compression stage of the backup pipeline: for each chunk to be
//! stored (unique or rewritten) it looks for a similar base chunk and, when
//! the delta saves enough, has the chunk stored as that delta.
//!
//! * `pfc` (PFC-delta): bases come only from the base chunk cache, filled
//!   with the containers of PFC-CID_last that the deduplication index reads
//!   anyway ([`crate::index::DedupIndex::piggyback`]): no extra reads.
//! * `greedy` (the paper's Greedy baseline): bases are any whole chunk stored
//!   by an earlier backup, found through a persisted super-feature index and
//!   read from storage (extra reads, cached by container).

use super::cache::{BaseCache, Found, MIN_DELTA_LEN};
use super::features::{super_features, SUPER_FEATURES};
use super::pfc::PfcTracker;
use super::BASE_CONTAINERS;
use super::{encode, Method};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::format::envelope;
use crate::layout::container::{self, BaseRef, Builder, Container, ContainerId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

pub use super::params::{
    BasePrefetch, BaseScope, DeltaKind, DeltaParams, DEFAULT_BASE_CACHE_CONTAINERS,
};

/// A delta is kept only if it (with the base reference its metadata entry
/// adds) is at most this fraction of the chunk: restoring a delta needs its
/// base too, which only a real saving pays for.
const MAX_DELTA_FRACTION: f64 = 0.75;
/// Metadata bytes a delta entry adds (the base's container and fingerprint).
const BASE_REF_BYTES: usize = container::DELTA_META_ENTRY_LEN - container::META_ENTRY_LEN;

/// Counters of a backup's delta compression (`backup --json` → `delta`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeltaStats {
    /// Policy name (`none`, `pfc`, `greedy`).
    pub policy: String,
    /// Chunks to store that were looked up for a base.
    pub candidates: u64,
    /// Candidates for which a similar base was found.
    pub base_hits: u64,
    /// Chunks stored as deltas.
    pub delta_chunks: u64,
    /// Bytes of the chunks stored as deltas.
    pub delta_input_bytes: u64,
    /// Bytes of their deltas.
    pub delta_bytes: u64,
    /// Bytes not stored thanks to delta compression (input − deltas).
    pub bytes_saved: u64,
    /// Deltas made by hash-less encoding.
    pub hashless: u64,
    /// Deltas made by the Edelta-style fallback.
    pub edelta: u64,
    /// Bases found whose delta saved too little (the chunk was stored whole).
    pub rejected: u64,
    /// Persistent fragmented chunks identified (pfc).
    pub pfc_chunks: u64,
    /// Containers of this backup's fragmented chunks (FC-CID, pfc).
    pub fc_containers: u64,
    /// Containers of this backup's PFCs (PFC-CID, pfc).
    pub pfc_containers: u64,
    /// Containers whose data the index's metadata reads brought along (pfc).
    pub piggybacked_containers: u64,
    /// Data bytes those reads transferred beyond the metadata (pfc).
    pub piggybacked_bytes: u64,
    /// Extra container reads for bases (0 unless greedy).
    pub base_reads: u64,
    /// Bytes of those reads.
    pub base_read_bytes: u64,
    /// Bases found whose bytes did not match their checksum or fingerprint (a damaged
    /// container, which `check --read-data` names): not used, the chunks
    /// were stored whole.
    pub corrupt_bases: u64,
    /// Seconds computing super-features (of chunks to store, and of
    /// prefetched chunks whose container does not record them).
    pub features_seconds: f64,
    /// Seconds delta-encoding.
    pub encode_seconds: f64,
    /// MB (10^6 bytes) of input delta-encoded per second of encoding.
    pub encode_mb_s: f64,
}

/// What [`DeltaStage::compress`] produced for a chunk.
pub struct Compressed {
    /// The delta.
    pub delta: Vec<u8>,
    /// Its base.
    pub base: BaseRef,
}

/// The delta stage of one backup.
pub struct DeltaStage {
    params: DeltaParams,
    /// The repository's fingerprints, which verify every base before use.
    algo: Fingerprinter,
    backend: Arc<dyn Backend>,
    cache: BaseCache,
    pfc: Option<PfcTracker>,
    greedy: Option<Greedy>,
    /// The last [`BASE_CONTAINERS`] distinct containers this backup's
    /// recipe referenced for kept duplicates (preferred for bases; with
    /// [`BaseScope::Referenced`], the only ones allowed).
    referenced: VecDeque<ContainerId>,
    /// Bases from unchecked containers whose bytes matched their checksum or fingerprint.
    verified: HashSet<BaseRef>,
    /// Bases whose bytes did not verify: quarantined at commit (FORMAT.md
    /// §10.8), so that later backups store them again.
    corrupt: HashSet<BaseRef>,
    /// Whether every chunk stored whole gets its super-features as it is
    /// stored (see [`DeltaStage::compress`]): greedy, which indexes them
    /// all, and a source's first PFC-delta backup, which stores the data
    /// set that later backups keep finding their PFCs in.
    features_for_all: bool,
    /// The container the last fragmented chunk was stored in.
    fragmented_into: Option<ContainerId>,
    stats: DeltaStats,
}

impl DeltaStage {
    /// The stage for a backup of source `source`, or `None` when the
    /// repository does not delta-compress. PFC counts the chunks of the
    /// last `lookback` backups as recent (the rewriting policy decides how
    /// many: HAR judges containers over two backups).
    pub fn open(
        backend: Arc<dyn Backend>,
        params: DeltaParams,
        algo: Fingerprinter,
        lookback: usize,
        source: &str,
    ) -> Result<Option<Self>> {
        let (pfc, greedy) = match params.kind {
            DeltaKind::None => return Ok(None),
            DeltaKind::Pfc => (
                Some(PfcTracker::open(
                    backend.as_ref(),
                    source,
                    lookback,
                    params.prefetch,
                )?),
                None,
            ),
            DeltaKind::Greedy => (None, Some(Greedy::load(backend.as_ref())?)),
        };
        let features_for_all = pfc.as_ref().is_none_or(|p| !p.has_history());
        Ok(Some(DeltaStage {
            cache: BaseCache::new(params.features, params.base_cache_containers as usize),
            params,
            algo,
            backend,
            pfc,
            greedy,
            referenced: VecDeque::new(),
            verified: HashSet::new(),
            corrupt: HashSet::new(),
            features_for_all,
            fragmented_into: None,
            stats: DeltaStats {
                policy: params.kind.name().into(),
                ..DeltaStats::default()
            },
        }))
    }

    /// Containers whose data the index should read along with their
    /// metadata (PFC-CID_last; empty unless pfc).
    pub fn prefetch_set(&self) -> HashSet<ContainerId> {
        self.pfc
            .as_ref()
            .map(PfcTracker::prefetch_set)
            .unwrap_or_default()
    }

    /// Takes containers the index read whole into the base chunk cache.
    pub fn offer(&mut self, containers: Vec<Arc<Container>>) {
        for c in containers {
            self.stats.piggybacked_containers += 1;
            self.stats.piggybacked_bytes += (c.object_len() - c.header.data_start()) as u64;
            let t = Instant::now();
            self.cache.insert(c);
            self.stats.features_seconds += t.elapsed().as_secs_f64();
        }
    }

    /// This backup keeps a duplicate in container `c` (its recipe references `c`).
    pub fn referenced(&mut self, c: ContainerId) {
        if self.referenced.front() == Some(&c) {
            return;
        }
        self.referenced.retain(|&r| r != c);
        self.referenced.push_front(c);
        self.referenced.truncate(BASE_CONTAINERS);
    }

    /// A fragmented chunk found in `found_in` was stored again in `stored_in`.
    pub fn fragmented(&mut self, found_in: ContainerId, stored_in: ContainerId) {
        if let Some(p) = &mut self.pfc {
            p.fragmented(found_in, stored_in);
        }
        self.fragmented_into = Some(stored_in);
    }

    /// Completes the super-features of container `b`, about to be sealed,
    /// whose chunks [`DeltaStage::compress`] stored without them, when a
    /// later backup is likely to prefetch it: it holds a fragmented chunk
    /// (it joins this backup's PFC sets), or the base chunk cache holds
    /// containers by now (the backup has reached the data around its PFCs).
    /// Otherwise a cache that does prefetch it computes them then.
    pub fn seal(&mut self, b: &mut Builder) {
        if self.features_for_all || (self.fragmented_into != Some(b.id()) && self.cache.is_empty())
        {
            return;
        }
        let t = Instant::now();
        let kind = self.params.features;
        b.complete_features(MIN_DELTA_LEN, |data| super_features(kind, data));
        self.stats.features_seconds += t.elapsed().as_secs_f64();
    }

    /// Looks for a base for chunk `fp` with bytes `data` (to be stored) and
    /// returns its delta when it saves enough, else the chunk's super-features
    /// when they were computed (to be recorded with it; greedy also indexes
    /// them, via [`DeltaStage::stored_whole`]). `old_copy` is the container of the
    /// copy a rewritten chunk duplicates. Every base is verified (by the
    /// checksum its entry records, else its fingerprint) before a delta is
    /// encoded against it.
    pub fn compress(
        &mut self,
        fp: &Fingerprint,
        data: &[u8],
        old_copy: Option<ContainerId>,
    ) -> Result<(Option<Compressed>, Features)> {
        // The paper computes features for every chunk to be stored, and the
        // container records them with a chunk stored whole, so that a base
        // chunk cache prefetching it later need not compute them again. With
        // nothing cached to match, though, they serve only such a later
        // prefetch, which most containers never see (on Redis releases with
        // Capping, half the features computed): [`DeltaStage::seal`] records
        // them for the containers likely to be prefetched, and a cache
        // computes the others' if it ever prefetches them (the same values).
        if data.len() < MIN_DELTA_LEN || (self.cache.is_empty() && !self.features_for_all) {
            return Ok((None, None));
        }
        // A rewritten chunk whose old copy is held (a PFC: its container was
        // prefetched) has them recorded there already.
        let t = Instant::now();
        let sf = old_copy
            .and_then(|c| self.cache.recorded_features(c, fp))
            .unwrap_or_else(|| super_features(self.params.features, data));
        self.stats.features_seconds += t.elapsed().as_secs_f64();
        if self.greedy.is_none() && self.cache.is_empty() {
            return Ok((None, Some(sf)));
        }
        self.stats.candidates += 1;
        // A rewritten chunk is stored again for its locality: not as a
        // delta against its own old copy, which restores would have to read.
        // Bases in containers the recipe references (which restores read
        // anyway) are preferred.
        let referenced = &self.referenced;
        let in_scope =
            |c: ContainerId| self.params.scope == BaseScope::Any || referenced.contains(&c);
        let usable = |c: ContainerId, base: &Fingerprint| base != fp && in_scope(c);
        let found = match self.cache.find(&sf, usable, |c| referenced.contains(&c)) {
            Some(f) => Some(f),
            None => match &mut self.greedy {
                Some(g) => g
                    .find(self.backend.as_ref(), &mut self.cache, &sf, &mut self.stats)?
                    .filter(|f| usable(f.base_ref().container, &f.base_ref().fp)),
                None => None,
            },
        };
        let Some(found) = found else {
            return Ok((None, Some(sf)));
        };
        self.stats.base_hits += 1;
        // A prefetched container's data checksum is not checked
        // (`DedupIndex::take_piggybacked`): the base is, here, once, by the
        // checksum its entry records, else by its fingerprint.
        let base = found.base_ref();
        let Ok(base_bytes) = found.bytes() else {
            self.stats.corrupt_bases += 1;
            self.corrupt.insert(base);
            return Ok((None, Some(sf)));
        };
        if !found.container.data_checked() && !self.verified.contains(&base) {
            let sound = match found.container.chunk_crc_matches(found.index) {
                Some(matches) => matches,
                None => self.algo.hash(&base_bytes) == base.fp,
            };
            if !sound {
                self.stats.corrupt_bases += 1;
                self.corrupt.insert(base);
                return Ok((None, Some(sf)));
            }
            self.verified.insert(base);
        }
        let t = Instant::now();
        let d = encode(&base_bytes, data);
        self.stats.encode_seconds += t.elapsed().as_secs_f64();
        self.stats.delta_input_bytes += data.len() as u64;
        if (d.bytes.len() + BASE_REF_BYTES) as f64 > MAX_DELTA_FRACTION * data.len() as f64 {
            self.stats.rejected += 1;
            return Ok((None, Some(sf)));
        }
        match d.method {
            Method::HashLess => self.stats.hashless += 1,
            Method::Edelta => self.stats.edelta += 1,
        }
        self.stats.delta_chunks += 1;
        self.stats.delta_bytes += d.bytes.len() as u64;
        self.stats.bytes_saved += (data.len() - d.bytes.len()) as u64;
        Ok((
            Some(Compressed {
                delta: d.bytes,
                base: found.base_ref(),
            }),
            None,
        ))
    }

    /// A chunk was stored whole in `container` (greedy indexes it as a
    /// future base once the backup commits).
    pub fn stored_whole(&mut self, fp: Fingerprint, container: ContainerId, features: Features) {
        if let (Some(g), Some(sf)) = (&mut self.greedy, features) {
            g.pending.push(Entry {
                features: sf,
                container,
                fp,
            });
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> DeltaStats {
        let mut s = self.stats.clone();
        if let Some(p) = &self.pfc {
            (s.pfc_chunks, s.fc_containers, s.pfc_containers) = p.counts();
        }
        s.encode_mb_s = if s.encode_seconds > 0.0 {
            s.delta_input_bytes as f64 / 1e6 / s.encode_seconds
        } else {
            0.0
        };
        s
    }

    /// Persists what the next backup needs (PFC sets, greedy's feature
    /// index, the quarantine of bases that did not verify), once every
    /// container of this backup is durable.
    pub fn commit(self) -> Result<()> {
        // Damage this backup's read of a base found never spreads: the
        // quarantine makes later backups store the chunk again.
        let mut corrupt: BTreeMap<ContainerId, Vec<Fingerprint>> = BTreeMap::new();
        for b in &self.corrupt {
            corrupt.entry(b.container).or_default().push(b.fp);
        }
        for (c, fps) in corrupt {
            crate::repo::quarantine::record(self.backend.as_ref(), c, fps)?;
        }
        if let Some(p) = self.pfc {
            p.commit(self.backend.as_ref())?;
        }
        if let Some(g) = self.greedy {
            g.commit(self.backend.as_ref())?;
        }
        Ok(())
    }
}

/// A chunk's super-features when they were computed but it was stored whole.
pub type Features = Option<[u64; SUPER_FEATURES]>;

/// Key of greedy's super-feature index.
pub const GREEDY_INDEX_KEY: &str = "delta-index/features";
const GREEDY_KIND: &[u8; 4] = b"DSFI";
const GREEDY_VERSION: u32 = 1;

/// A whole chunk greedy may use as a base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    features: [u64; SUPER_FEATURES],
    container: ContainerId,
    fp: Fingerprint,
}

/// Greedy's super-feature index over the whole chunks of earlier backups.
/// Entries may be stale (GC moved or freed the chunk): a base that is not
/// where the entry says is skipped and the entry dropped.
struct Greedy {
    entries: Vec<Entry>,
    /// Super-feature `j` → entry index (the newest chunk wins).
    by_feature: [HashMap<u64, usize>; SUPER_FEATURES],
    dropped: HashSet<usize>,
    /// This backup's whole chunks, indexed at commit.
    pending: Vec<Entry>,
}

impl Greedy {
    fn load(backend: &dyn Backend) -> Result<Greedy> {
        let entries: Vec<Entry> = match backend.read(GREEDY_INDEX_KEY) {
            Ok(bytes) => envelope::open(GREEDY_INDEX_KEY, GREEDY_KIND, GREEDY_VERSION, &bytes)
                .ok()
                .and_then(|p| postcard::from_bytes(p).ok())
                // A damaged index only costs compression: start over.
                .unwrap_or_default(),
            Err(Error::NotFound(_)) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut by_feature: [HashMap<u64, usize>; SUPER_FEATURES] = Default::default();
        for (i, e) in entries.iter().enumerate() {
            for (j, map) in by_feature.iter_mut().enumerate() {
                map.insert(e.features[j], i);
            }
        }
        Ok(Greedy {
            entries,
            by_feature,
            dropped: HashSet::new(),
            pending: Vec::new(),
        })
    }

    /// Finds a stored base by super-feature, reading its container (through
    /// the cache) from storage.
    fn find(
        &mut self,
        backend: &dyn Backend,
        cache: &mut BaseCache,
        sf: &[u64; SUPER_FEATURES],
        stats: &mut DeltaStats,
    ) -> Result<Option<Found>> {
        for (map, f) in self.by_feature.iter().zip(sf) {
            let Some(&i) = map.get(f) else {
                continue;
            };
            if self.dropped.contains(&i) {
                continue;
            }
            let e = self.entries[i];
            if !cache.contains(e.container) {
                match backend.read(&container::key(e.container)) {
                    Ok(bytes) => {
                        stats.base_reads += 1;
                        stats.base_read_bytes += bytes.len() as u64;
                        match Container::parse(e.container, bytes) {
                            Ok(c) => cache.insert(Arc::new(c)),
                            Err(
                                Error::Corrupt { .. }
                                | Error::Authentication { .. }
                                | Error::UnsupportedVersion { .. },
                            ) => {}
                            Err(err) => return Err(err),
                        }
                    }
                    Err(Error::NotFound(_)) => {}
                    Err(err) => return Err(err),
                }
            }
            if let Some(found) = cache.get(e.container, &e.fp) {
                return Ok(Some(found));
            }
            self.dropped.insert(i);
        }
        Ok(None)
    }

    fn commit(self, backend: &dyn Backend) -> Result<()> {
        let dropped = &self.dropped;
        let entries: Vec<Entry> = self
            .entries
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !dropped.contains(i))
            .map(|(_, e)| e)
            .chain(self.pending)
            .collect();
        let payload = postcard::to_stdvec(&entries)
            .map_err(|e| Error::Pipeline(format!("encoding the delta feature index: {e}")))?;
        backend.write(
            GREEDY_INDEX_KEY,
            &envelope::seal(GREEDY_KIND, GREEDY_VERSION, &payload),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Local;
    use crate::delta::features::FeatureKind;
    use crate::fingerprint::FingerprintAlgo;

    /// A PFC stage whose base cache holds container 1 with `chunks`,
    /// parsed without its data check (as prefetched), after `damage`.
    fn stage_with_chunks(
        chunks: &[&[u8]],
        damage: impl Fn(&mut Vec<u8>),
    ) -> (tempfile::TempDir, DeltaStage) {
        stage_with_container(chunks, |mut bytes| {
            damage(&mut bytes);
            bytes
        })
    }

    /// [`stage_with_chunks`] with the sealed container turned into the
    /// bytes to parse by `make`.
    fn stage_with_container(
        chunks: &[&[u8]],
        make: impl Fn(Vec<u8>) -> Vec<u8>,
    ) -> (tempfile::TempDir, DeltaStage) {
        let dir = tempfile::tempdir().unwrap();
        let algo = FingerprintAlgo::Blake3;
        let mut stage = pfc_stage(dir.path());
        let mut b = Builder::new(1, 1 << 20).with_deltas();
        for c in chunks {
            b.push(algo.hash(c), c);
        }
        let bytes = make(b.seal());
        stage.offer(vec![Arc::new(
            Container::parse_unchecked_data(1, bytes).unwrap(),
        )]);
        (dir, stage)
    }

    /// A random 8 KiB base, a target with 16 bytes changed in its middle,
    /// and the target's fingerprint.
    fn base_and_target() -> (Vec<u8>, Vec<u8>, Fingerprint) {
        let base = crate::chunker::pseudo_random(8192, 7);
        let mut target = base.clone();
        target[4000..4016].copy_from_slice(b"0123456789abcdef");
        let fp = FingerprintAlgo::Blake3.hash(&target);
        (base, target, fp)
    }

    /// A PFC stage for source "s" of the repository in `dir`.
    fn pfc_stage(dir: &std::path::Path) -> DeltaStage {
        let params = DeltaParams {
            kind: DeltaKind::Pfc,
            ..DeltaParams::default()
        };
        let backend: Arc<dyn Backend> = Arc::new(Local::new(dir));
        DeltaStage::open(
            backend,
            params,
            Fingerprinter::plain(FingerprintAlgo::Blake3),
            1,
            "s",
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn super_features_are_recorded_where_a_later_backup_is_likely_to_prefetch_them() {
        let dir = tempfile::tempdir().unwrap();
        let chunk = crate::chunker::pseudo_random(8192, 9);
        let fp = FingerprintAlgo::Blake3.hash(&chunk);
        let features = super_features(FeatureKind::Odess, &chunk);
        // The source's first backup: every chunk's, as it is stored.
        let mut first = pfc_stage(dir.path());
        let (delta, f) = first.compress(&fp, &chunk, None).unwrap();
        assert!(delta.is_none());
        assert_eq!(f, Some(features));
        first.commit().unwrap();

        // Later, with nothing cached, none as the chunk is stored; at
        // sealing, only if its container holds a fragmented chunk or the
        // cache holds containers by then.
        let sealed = |fragmented: bool, cached: bool| {
            let mut stage = pfc_stage(dir.path());
            let (delta, f) = stage.compress(&fp, &chunk, None).unwrap();
            assert!(delta.is_none() && f.is_none());
            let mut b = Builder::new(7, 1 << 20).with_deltas();
            b.push(fp, &chunk);
            if fragmented {
                stage.fragmented(3, 7);
            }
            if cached {
                let mut other = Builder::new(1, 1 << 20).with_deltas();
                other.push(fp, &chunk);
                stage.offer(vec![Arc::new(Container::parse(1, other.seal()).unwrap())]);
            }
            stage.seal(&mut b);
            Container::parse(7, b.seal()).unwrap().metas[0].features
        };
        assert_eq!(sealed(false, false), None);
        assert_eq!(sealed(true, false), Some(features));
        assert_eq!(sealed(false, true), Some(features));
    }

    #[test]
    fn a_base_is_verified_before_use() {
        let (base, target, fp) = base_and_target();

        let (dir, mut intact) = stage_with_chunks(&[&base], |_| {});
        let (delta, _) = intact.compress(&fp, &target, None).unwrap();
        assert_eq!(
            delta
                .expect("a delta against the intact base")
                .base
                .container,
            1
        );
        assert_eq!(intact.stats().corrupt_bases, 0);

        // One flipped byte far from the features' samples of the target's
        // edit: the base is still found by its features, but not used.
        let (dir2, mut damaged) = stage_with_chunks(&[&base], |bytes| {
            let last = bytes.len() - 1;
            bytes[last] ^= 0x40;
        });
        let (delta, features) = damaged.compress(&fp, &target, None).unwrap();
        assert!(delta.is_none(), "a delta against damaged bytes");
        assert!(
            features.is_some(),
            "the chunk is stored whole with its features"
        );
        let stats = damaged.stats();
        assert_eq!((stats.base_hits, stats.corrupt_bases), (1, 1));
        // The commit quarantines the damaged base (issue 20: damage a
        // backup's read of a base finds never spreads).
        damaged.commit().unwrap();
        let q = crate::repo::quarantine::load(&Local::new(dir2.path())).unwrap();
        let base_fp = FingerprintAlgo::Blake3.hash(&base);
        assert!(
            crate::repo::quarantine::is_quarantined(&q, 1, &base_fp),
            "{q:?}"
        );
        intact.commit().unwrap();
        assert!(crate::repo::quarantine::load(&Local::new(dir.path()))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_base_of_a_container_without_chunk_checksums_is_verified_by_its_fingerprint() {
        let (base, target, fp) = base_and_target();
        for (flip, corrupt) in [(false, 0), (true, 1)] {
            let (_dir, mut stage) = stage_with_container(&[&base], |bytes| {
                let mut old = crate::layout::container::without_chunk_crcs(&bytes);
                if flip {
                    let last = old.len() - 1;
                    old[last] ^= 0x40;
                }
                old
            });
            let (delta, _) = stage.compress(&fp, &target, None).unwrap();
            assert_eq!(delta.is_some(), !flip);
            assert_eq!(stage.stats().corrupt_bases, corrupt);
        }
    }

    #[test]
    fn an_intact_base_in_a_container_damaged_elsewhere_is_used() {
        let (base, target, fp) = base_and_target();
        let other = crate::chunker::pseudo_random(8192, 8);
        // The last byte belongs to `other`: the container's data checksum
        // would fail, the base's own checksum and fingerprint match.
        let (_dir, mut stage) = stage_with_chunks(&[&base, &other], |bytes| {
            let last = bytes.len() - 1;
            bytes[last] ^= 0x40;
        });
        let (delta, _) = stage.compress(&fp, &target, None).unwrap();
        let delta = delta.expect("a delta against the intact base");
        assert_eq!(delta.base.fp, FingerprintAlgo::Blake3.hash(&base));
        assert_eq!(stage.stats().corrupt_bases, 0);
    }
}
