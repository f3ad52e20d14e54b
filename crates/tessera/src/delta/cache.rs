//! The base chunk cache (PFC-delta §IV-B2): whole containers with the
//! super-features of their chunks, evicted least recently used a container
//! at a time, searched by super-feature for a chunk to delta-encode against.

use super::features::{super_features, FeatureKind, SUPER_FEATURES};
use crate::fingerprint::Fingerprint;
use crate::layout::container::{BaseRef, Container, ContainerId};
use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// Chunks shorter than this are not delta-encoded nor used as bases: they
/// have few sampled positions, so their super-features say little, and a
/// delta saves at most a few hundred bytes.
pub const MIN_DELTA_LEN: usize = 1024;

/// A base found for a chunk: the container holding it and its index there.
pub struct Found {
    /// The container.
    pub container: Arc<Container>,
    /// Index of the base in the container's chunks.
    pub index: usize,
}

impl Found {
    /// The base's bytes (decoded in a compressing repository).
    pub fn bytes(&self) -> crate::error::Result<std::borrow::Cow<'_, [u8]>> {
        self.container.entry(self.index)
    }

    /// Where the base lies, for the delta's metadata entry.
    pub fn base_ref(&self) -> BaseRef {
        BaseRef {
            container: self.container.header.id,
            fp: self.container.metas[self.index].fp,
        }
    }
}

/// Containers held for their chunks, each with a super-feature index over
/// its chunks stored whole (never over deltas: a base is always a whole
/// chunk). The cache holds few containers, so a lookup asks each in turn;
/// adding or evicting a container builds or drops only its own index.
pub struct BaseCache {
    kind: FeatureKind,
    capacity: usize,
    /// Most recently used first.
    lru: VecDeque<ContainerId>,
    /// In the order they were added, newest last.
    held: Vec<Held>,
}

/// Super-feature → index of the (last) whole chunk of a container having it.
type FeatureMap = hashbrown::HashMap<u64, u32, BuildHasherDefault<FeatureHasher>>;

struct Held {
    container: Arc<Container>,
    by_feature: [FeatureMap; SUPER_FEATURES],
}

/// Hashes a super-feature as itself: super-features are outputs of a
/// mixing function already.
#[derive(Default)]
struct FeatureHasher(u64);

impl Hasher for FeatureHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}

impl BaseCache {
    /// An empty cache of `capacity` containers (at least one).
    pub fn new(kind: FeatureKind, capacity: usize) -> Self {
        BaseCache {
            kind,
            capacity: capacity.max(1),
            lru: VecDeque::new(),
            held: Vec::new(),
        }
    }

    /// Whether no container is held (nothing can be found).
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether container `id` is held.
    pub fn contains(&self, id: ContainerId) -> bool {
        self.holding(id).is_some()
    }

    /// Held container `id`.
    fn holding(&self, id: ContainerId) -> Option<&Held> {
        self.held.iter().find(|h| h.container.header.id == id)
    }

    /// Adds a container (a repeated one only counts as used), indexing the
    /// super-features of its whole chunks; evicts the least recently used
    /// container beyond capacity.
    pub fn insert(&mut self, container: Arc<Container>) {
        let id = container.header.id;
        if self.contains(id) {
            self.touch(id);
            return;
        }
        let mut by_feature: [FeatureMap; SUPER_FEATURES] = Default::default();
        if container.header.has_data() {
            for map in &mut by_feature {
                map.reserve(container.metas.len());
            }
            for (i, m) in container.metas.iter().enumerate() {
                // A delta names its base by (container, fingerprint), which
                // restores resolve to the chunk's first entry there: a
                // container GC filled can list a chunk twice (copies from
                // two containers), once as a delta.
                if m.base.is_some()
                    || (m.len as usize) < MIN_DELTA_LEN
                    || container.find(&m.fp) != Some(i)
                {
                    continue;
                }
                // Recorded when the chunk was stored, else computed now
                // (a chunk that does not decode is no base).
                let sf = match (m.features, container.entry(i)) {
                    (Some(sf), _) => sf,
                    (None, Ok(bytes)) => super_features(self.kind, &bytes),
                    (None, Err(_)) => continue,
                };
                for (map, f) in by_feature.iter_mut().zip(sf) {
                    map.insert(f, i as u32);
                }
            }
        }
        self.held.push(Held {
            container,
            by_feature,
        });
        self.lru.push_front(id);
        while self.lru.len() > self.capacity {
            if let Some(victim) = self.lru.pop_back() {
                self.held.retain(|h| h.container.header.id != victim);
            }
        }
    }

    fn touch(&mut self, id: ContainerId) {
        if let Some(pos) = self.lru.iter().position(|&c| c == id) {
            self.lru.remove(pos);
            self.lru.push_front(id);
        }
    }

    /// Chunk `fp` of held container `id`, if it is there and stored whole.
    pub fn get(&mut self, id: ContainerId, fp: &Fingerprint) -> Option<Found> {
        let container = self.holding(id)?.container.clone();
        let index = container.find(fp)?;
        if container.base(index).is_some() || !container.header.has_data() {
            return None;
        }
        self.touch(id);
        Some(Found { container, index })
    }

    /// The super-features recorded for chunk `fp` in held container `id`.
    pub fn recorded_features(
        &self,
        id: ContainerId,
        fp: &Fingerprint,
    ) -> Option<[u64; SUPER_FEATURES]> {
        let container = &self.holding(id)?.container;
        container.metas[container.find(fp)?].features
    }

    /// A held whole chunk sharing a super-feature with `sf` that `usable`
    /// accepts (by container and fingerprint), preferring one in a
    /// container `preferred` names. The candidates are taken super-feature
    /// by super-feature, each from the most recently added container having
    /// it (the last such chunk there).
    pub fn find(
        &mut self,
        sf: &[u64; SUPER_FEATURES],
        usable: impl Fn(ContainerId, &Fingerprint) -> bool,
        preferred: impl Fn(ContainerId) -> bool,
    ) -> Option<Found> {
        let mut candidates = sf
            .iter()
            .enumerate()
            .flat_map(|(j, f)| {
                self.held
                    .iter()
                    .rev()
                    .filter_map(move |h| Some((h, *h.by_feature[j].get(f)? as usize)))
            })
            .filter(|(h, i)| usable(h.container.header.id, &h.container.metas[*i].fp));
        let first = candidates.next()?;
        let (held, index) = if preferred(first.0.container.header.id) {
            first
        } else {
            candidates
                .find(|(h, _)| preferred(h.container.header.id))
                .unwrap_or(first)
        };
        let container = held.container.clone();
        self.touch(container.header.id);
        Some(Found { container, index })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::FingerprintAlgo;
    use crate::layout::container::Builder;

    fn container(id: ContainerId, chunks: &[Vec<u8>]) -> Arc<Container> {
        let mut b = Builder::new(id, 1 << 20).with_deltas();
        for c in chunks {
            b.push(FingerprintAlgo::Blake3.hash(c), c);
        }
        Arc::new(Container::parse(id, b.seal()).unwrap())
    }

    fn random(seed: u64, len: usize) -> Vec<u8> {
        crate::chunker::pseudo_random(len, seed)
    }

    #[test]
    fn finds_a_similar_chunk_and_forgets_evicted_containers() {
        let kind = FeatureKind::Odess;
        let mut cache = BaseCache::new(kind, 2);
        let a = random(1, 8192);
        cache.insert(container(1, &[a.clone(), random(2, 8192)]));
        let mut target = a.clone();
        target[100..116].copy_from_slice(b"0123456789abcdef");
        let found = cache
            .find(&super_features(kind, &target), |_, _| true, |_| false)
            .unwrap();
        assert_eq!(found.bytes().unwrap().as_ref(), &a[..]);
        assert_eq!(found.base_ref().container, 1);
        assert!(cache
            .find(
                &super_features(kind, &random(9, 8192)),
                |_, _| true,
                |_| false
            )
            .is_none());

        // Two more containers evict container 1 and its features.
        cache.insert(container(2, &[random(3, 8192)]));
        cache.insert(container(3, &[random(4, 8192)]));
        assert!(!cache.contains(1));
        assert!(cache
            .find(&super_features(kind, &target), |_, _| true, |_| false)
            .is_none());
        assert!(cache.held.iter().all(|h| h.container.header.id != 1));
    }

    #[test]
    fn the_newest_usable_candidate_wins_unless_another_is_preferred() {
        let kind = FeatureKind::Odess;
        let a = random(11, 8192);
        // Containers 1 and 2 hold the same chunk, 3 an unrelated one.
        let mut cache = BaseCache::new(kind, 4);
        cache.insert(container(1, std::slice::from_ref(&a)));
        cache.insert(container(2, std::slice::from_ref(&a)));
        cache.insert(container(3, &[random(12, 8192)]));
        let sf = super_features(kind, &a);
        let mut found = |usable: &dyn Fn(ContainerId) -> bool,
                         preferred: &dyn Fn(ContainerId) -> bool| {
            cache
                .find(&sf, |c, _| usable(c), preferred)
                .map(|f| f.base_ref().container)
        };
        assert_eq!(found(&|_| true, &|_| false), Some(2));
        assert_eq!(found(&|_| true, &|c| c == 1), Some(1));
        assert_eq!(found(&|c| c != 2, &|_| false), Some(1));
        assert_eq!(found(&|_| false, &|_| true), None);
    }

    #[test]
    fn recorded_features_come_from_held_containers_only() {
        let kind = FeatureKind::Odess;
        let a = random(6, 8192);
        let sf = super_features(kind, &a);
        let fp = FingerprintAlgo::Blake3.hash(&a);
        let mut b = Builder::new(7, 1 << 20).with_deltas();
        b.push_with_features(fp, &a, sf);
        let other = random(7, 8192);
        b.push(FingerprintAlgo::Blake3.hash(&other), &other);
        let mut cache = BaseCache::new(kind, 4);
        cache.insert(Arc::new(Container::parse(7, b.seal()).unwrap()));
        assert_eq!(cache.recorded_features(7, &fp), Some(sf));
        // Held, but stored without features; not held; not in the container.
        let other_fp = FingerprintAlgo::Blake3.hash(&other);
        assert_eq!(cache.recorded_features(7, &other_fp), None);
        assert_eq!(cache.recorded_features(8, &fp), None);
        let absent = FingerprintAlgo::Blake3.hash(b"absent");
        assert_eq!(cache.recorded_features(7, &absent), None);
    }

    #[test]
    fn deltas_and_tiny_chunks_are_never_bases() {
        let kind = FeatureKind::Odess;
        let a = random(5, 8192);
        let mut b = Builder::new(4, 1 << 20).with_deltas();
        let base = BaseRef {
            container: 1,
            fp: FingerprintAlgo::Blake3.hash(b"x"),
        };
        b.push_delta(FingerprintAlgo::Blake3.hash(&a), &a, base)
            .unwrap();
        b.push(FingerprintAlgo::Blake3.hash(&a[..500]), &a[..500]);
        let mut cache = BaseCache::new(kind, 4);
        cache.insert(Arc::new(Container::parse(4, b.seal()).unwrap()));
        assert!(cache
            .find(&super_features(kind, &a), |_, _| true, |_| false)
            .is_none());

        // A chunk listed twice, first as a delta: its whole copy is no base
        // (a reference to it would resolve to the delta).
        let mut b = Builder::new(5, 1 << 20).with_deltas();
        b.push_delta(FingerprintAlgo::Blake3.hash(&a), &a[..100], base)
            .unwrap();
        b.push(FingerprintAlgo::Blake3.hash(&a), &a);
        let mut cache = BaseCache::new(kind, 4);
        cache.insert(Arc::new(Container::parse(5, b.seal()).unwrap()));
        assert!(cache
            .find(&super_features(kind, &a), |_, _| true, |_| false)
            .is_none());
    }
}
