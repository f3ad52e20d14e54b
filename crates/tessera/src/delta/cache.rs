//! The base chunk cache (PFC-delta §IV-B2): whole containers with the
//! super-features of their chunks, evicted least recently used a container
//! at a time, searched by super-feature for a chunk to delta-encode against.

use super::features::{super_features, FeatureKind, SUPER_FEATURES};
use crate::container::{BaseRef, Container, ContainerId};
use std::collections::{HashMap, VecDeque};
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
    /// The base's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.container.chunk(self.index)
    }

    /// Where the base lies, for the delta's metadata entry.
    pub fn base_ref(&self) -> BaseRef {
        BaseRef {
            container: self.container.header.id,
            fp: self.container.metas[self.index].fp,
        }
    }
}

/// Containers held for their chunks, with a super-feature index over the
/// chunks stored whole (never over deltas: a base is always a whole chunk).
pub struct BaseCache {
    kind: FeatureKind,
    capacity: usize,
    /// Most recently used first.
    lru: VecDeque<ContainerId>,
    held: HashMap<ContainerId, Held>,
    /// Super-feature `j` → (container, chunk index), newest last.
    by_feature: [HashMap<u64, Vec<(ContainerId, u32)>>; SUPER_FEATURES],
}

struct Held {
    container: Arc<Container>,
    features: Vec<[u64; SUPER_FEATURES]>,
}

impl BaseCache {
    /// An empty cache of `capacity` containers (at least one).
    pub fn new(kind: FeatureKind, capacity: usize) -> Self {
        BaseCache {
            kind,
            capacity: capacity.max(1),
            lru: VecDeque::new(),
            held: HashMap::new(),
            by_feature: Default::default(),
        }
    }

    /// Whether no container is held (nothing can be found).
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether container `id` is held.
    pub fn contains(&self, id: ContainerId) -> bool {
        self.held.contains_key(&id)
    }

    /// Adds a container (a repeated one only counts as used), computing the
    /// super-features of its whole chunks; evicts the least recently used
    /// container beyond capacity.
    pub fn insert(&mut self, container: Arc<Container>) {
        let id = container.header.id;
        if self.held.contains_key(&id) {
            self.touch(id);
            return;
        }
        let mut features = Vec::new();
        if container.header.has_data() {
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
                // Recorded when the chunk was stored, else computed now.
                let sf = m
                    .features
                    .unwrap_or_else(|| super_features(self.kind, container.chunk(i)));
                for (j, map) in self.by_feature.iter_mut().enumerate() {
                    map.entry(sf[j]).or_default().push((id, i as u32));
                }
                features.push(sf);
            }
        }
        self.held.insert(
            id,
            Held {
                container,
                features,
            },
        );
        self.lru.push_front(id);
        while self.lru.len() > self.capacity {
            if let Some(victim) = self.lru.pop_back() {
                self.evict(victim);
            }
        }
    }

    fn touch(&mut self, id: ContainerId) {
        if let Some(pos) = self.lru.iter().position(|&c| c == id) {
            self.lru.remove(pos);
            self.lru.push_front(id);
        }
    }

    fn evict(&mut self, id: ContainerId) {
        let Some(held) = self.held.remove(&id) else {
            return;
        };
        for sf in &held.features {
            for (j, map) in self.by_feature.iter_mut().enumerate() {
                if let Some(list) = map.get_mut(&sf[j]) {
                    list.retain(|&(c, _)| c != id);
                    if list.is_empty() {
                        map.remove(&sf[j]);
                    }
                }
            }
        }
    }

    /// Chunk `fp` of held container `id`, if it is there and stored whole.
    pub fn get(&mut self, id: ContainerId, fp: &crate::fingerprint::Fingerprint) -> Option<Found> {
        let container = self.held.get(&id)?.container.clone();
        let index = container.find(fp)?;
        if container.base(index).is_some() || !container.header.has_data() {
            return None;
        }
        self.touch(id);
        Some(Found { container, index })
    }

    /// A held whole chunk sharing a super-feature with `sf` (the most
    /// recently added one of the first super-feature that matches).
    pub fn find(&mut self, sf: &[u64; SUPER_FEATURES]) -> Option<Found> {
        let hit = self
            .by_feature
            .iter()
            .enumerate()
            .find_map(|(j, map)| map.get(&sf[j]).and_then(|l| l.last().copied()))?;
        let (id, index) = hit;
        let container = self.held.get(&id)?.container.clone();
        self.touch(id);
        Some(Found {
            container,
            index: index as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::Builder;
    use crate::fingerprint::FingerprintAlgo;

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
        let found = cache.find(&super_features(kind, &target)).unwrap();
        assert_eq!(found.bytes(), &a[..]);
        assert_eq!(found.base_ref().container, 1);
        assert!(cache
            .find(&super_features(kind, &random(9, 8192)))
            .is_none());

        // Two more containers evict container 1 and its features.
        cache.insert(container(2, &[random(3, 8192)]));
        cache.insert(container(3, &[random(4, 8192)]));
        assert!(!cache.contains(1));
        assert!(cache.find(&super_features(kind, &target)).is_none());
        assert!(cache
            .by_feature
            .iter()
            .all(|m| m.values().all(|l| l.iter().all(|&(c, _)| c != 1))));
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
        assert!(cache.find(&super_features(kind, &a)).is_none());

        // A chunk listed twice, first as a delta: its whole copy is no base
        // (a reference to it would resolve to the delta).
        let mut b = Builder::new(5, 1 << 20).with_deltas();
        b.push_delta(FingerprintAlgo::Blake3.hash(&a), &a[..100], base)
            .unwrap();
        b.push(FingerprintAlgo::Blake3.hash(&a), &a);
        let mut cache = BaseCache::new(kind, 4);
        cache.insert(Arc::new(Container::parse(5, b.seal()).unwrap()));
        assert!(cache.find(&super_features(kind, &a)).is_none());
    }
}
