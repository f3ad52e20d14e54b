//! Restore planning: which containers a restore reads, in which order,
//! under a cache policy with a memory budget. The plan depends only on the
//! recipe, so it serves real restores (a reader thread prefetches exactly
//! the planned reads) and trace replays (metrics without data) alike.
//!
//! - LRU: a cache of `n` containers, least recently used evicted.
//! - OPT: the same cache with Belady's rule: evict the container whose next
//!   use in the recipe is farthest away (the recipe is the future).
//! - FAA, forward assembly (Lillibridge et al., FAST'13): the recipe is
//!   assembled in windows of `n × container size` bytes; each container the
//!   window needs is read once and all its chunks for the window copied.

use crate::format::snapshot::ChunkRef;
use crate::layout::container::ContainerId;
use lru::LruCache;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroUsize;
use std::str::FromStr;

/// A restore cache policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// Least recently used container cache.
    #[default]
    Lru,
    /// Belady's optimal replacement using the recipe's future references.
    Opt,
    /// Forward assembly area.
    Faa,
}

impl CachePolicy {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Lru => "lru",
            CachePolicy::Opt => "opt",
            CachePolicy::Faa => "faa",
        }
    }
}

impl FromStr for CachePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lru" => Ok(CachePolicy::Lru),
            "opt" => Ok(CachePolicy::Opt),
            "faa" => Ok(CachePolicy::Faa),
            other => Err(format!(
                "unknown cache policy {other:?} (expected lru, opt or faa)"
            )),
        }
    }
}

/// What to do for one chunk of the recipe (LRU and OPT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The chunk's container is cached.
    Hit,
    /// Read the chunk's container (the next planned read), first evicting this one.
    Load {
        /// The container to drop, when the cache is full.
        evict: Option<ContainerId>,
    },
}

/// A restore plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// A container cache (LRU or OPT): one step per chunk.
    Cache {
        /// Containers read, in order.
        reads: Vec<ContainerId>,
        /// One step per recipe chunk.
        steps: Vec<Step>,
    },
    /// Forward assembly: windows of consecutive chunks.
    Assembly {
        /// Containers read, in order (each window's containers in first-use order).
        reads: Vec<ContainerId>,
        /// Per window: the number of chunks it covers and of containers it reads.
        windows: Vec<(usize, usize)>,
    },
}

impl Plan {
    /// The containers read, in order.
    pub fn reads(&self) -> &[ContainerId] {
        match self {
            Plan::Cache { reads, .. } | Plan::Assembly { reads, .. } => reads,
        }
    }
}

/// Plans the restore of `chunks` under `policy` with a budget of
/// `containers` containers (FAA: an area of `containers × container_size` bytes).
pub fn plan(
    chunks: &[ChunkRef],
    policy: CachePolicy,
    containers: usize,
    container_size: u64,
) -> Plan {
    let n = NonZeroUsize::new(containers).unwrap_or(NonZeroUsize::MIN);
    match policy {
        CachePolicy::Lru => plan_lru(chunks, n),
        CachePolicy::Opt => plan_opt(chunks, n),
        CachePolicy::Faa => plan_faa(chunks, n.get() as u64 * container_size.max(1)),
    }
}

fn plan_lru(chunks: &[ChunkRef], capacity: NonZeroUsize) -> Plan {
    let mut cache: LruCache<ContainerId, ()> = LruCache::new(capacity);
    let mut reads = Vec::new();
    let mut steps = Vec::with_capacity(chunks.len());
    for c in chunks {
        if cache.get(&c.container).is_some() {
            steps.push(Step::Hit);
        } else {
            let evict = if cache.len() == capacity.get() {
                cache.pop_lru().map(|(k, _)| k)
            } else {
                None
            };
            cache.put(c.container, ());
            reads.push(c.container);
            steps.push(Step::Load { evict });
        }
    }
    Plan::Cache { reads, steps }
}

fn plan_opt(chunks: &[ChunkRef], capacity: NonZeroUsize) -> Plan {
    // next_use[i]: the next position after i that needs the same container.
    let mut next_use = vec![usize::MAX; chunks.len()];
    let mut last: HashMap<ContainerId, usize> = HashMap::new();
    for (i, c) in chunks.iter().enumerate().rev() {
        if let Some(&j) = last.get(&c.container) {
            next_use[i] = j;
        }
        last.insert(c.container, i);
    }
    // Cached containers ordered by their next use (farthest last).
    let mut by_next: BTreeSet<(usize, ContainerId)> = BTreeSet::new();
    let mut cached: HashMap<ContainerId, usize> = HashMap::new();
    let mut reads = Vec::new();
    let mut steps = Vec::with_capacity(chunks.len());
    for (i, c) in chunks.iter().enumerate() {
        if let Some(old) = cached.get(&c.container).copied() {
            by_next.remove(&(old, c.container));
            steps.push(Step::Hit);
        } else {
            let evict = if cached.len() == capacity.get() {
                by_next.pop_last().map(|(_, victim)| {
                    cached.remove(&victim);
                    victim
                })
            } else {
                None
            };
            reads.push(c.container);
            steps.push(Step::Load { evict });
        }
        cached.insert(c.container, next_use[i]);
        by_next.insert((next_use[i], c.container));
    }
    Plan::Cache { reads, steps }
}

fn plan_faa(chunks: &[ChunkRef], area: u64) -> Plan {
    let mut reads = Vec::new();
    let mut windows = Vec::new();
    let mut start = 0;
    while start < chunks.len() {
        let mut bytes = 0u64;
        let mut end = start;
        // A window holds at least one chunk, and as many more as fit the area.
        while end < chunks.len() && (end == start || bytes + u64::from(chunks[end].len) <= area) {
            bytes += u64::from(chunks[end].len);
            end += 1;
        }
        let mut seen = std::collections::HashSet::new();
        let before = reads.len();
        for c in &chunks[start..end] {
            if seen.insert(c.container) {
                reads.push(c.container);
            }
        }
        windows.push((end - start, reads.len() - before));
        start = end;
    }
    Plan::Assembly { reads, windows }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use proptest::prelude::*;

    fn refs(containers: &[u64], len: u32) -> Vec<ChunkRef> {
        containers
            .iter()
            .map(|&c| ChunkRef {
                fp: Fingerprint::default(),
                len,
                container: c,
            })
            .collect()
    }

    #[test]
    fn lru_and_opt_on_a_known_sequence() {
        let r = refs(&[1, 2, 3, 1, 2, 4, 1, 2, 3, 4], 1);
        let lru = plan(&r, CachePolicy::Lru, 3, 4096);
        assert_eq!(lru.reads(), &[1, 2, 3, 4, 3, 4]);
        let opt = plan(&r, CachePolicy::Opt, 3, 4096);
        // Belady evicts 3 at the load of 4 (next used farthest away).
        assert_eq!(opt.reads(), &[1, 2, 3, 4, 3]);
    }

    #[test]
    fn faa_reads_each_container_once_per_window() {
        let r = refs(&[1, 2, 1, 2, 3, 1], 100);
        match plan(&r, CachePolicy::Faa, 3, 100) {
            Plan::Assembly { reads, windows } => {
                assert_eq!(windows, vec![(3, 2), (3, 3)]);
                assert_eq!(reads, vec![1, 2, 2, 3, 1]);
            }
            other => panic!("{other:?}"),
        }
    }

    /// Replays a cache plan and checks every step is consistent: hits are
    /// cached, loads read the planned container, the cache never exceeds capacity.
    fn replay(r: &[ChunkRef], plan: &Plan, capacity: usize) {
        let Plan::Cache { reads, steps } = plan else {
            panic!("not a cache plan");
        };
        let mut cached = std::collections::HashSet::new();
        let mut next_read = reads.iter();
        for (c, step) in r.iter().zip(steps) {
            match step {
                Step::Hit => assert!(cached.contains(&c.container)),
                Step::Load { evict } => {
                    if let Some(v) = evict {
                        assert!(cached.remove(v));
                    }
                    assert_eq!(next_read.next(), Some(&c.container));
                    cached.insert(c.container);
                }
            }
            assert!(cached.len() <= capacity);
        }
        assert!(next_read.next().is_none());
    }

    proptest! {
        #[test]
        fn opt_never_reads_more_than_lru(seq in prop::collection::vec(0u64..12, 0..300), cap in 1usize..8) {
            let r = refs(&seq, 1);
            let lru = plan(&r, CachePolicy::Lru, cap, 1);
            let opt = plan(&r, CachePolicy::Opt, cap, 1);
            replay(&r, &lru, cap);
            replay(&r, &opt, cap);
            prop_assert!(opt.reads().len() <= lru.reads().len());
            let distinct: std::collections::HashSet<_> = seq.iter().collect();
            prop_assert!(opt.reads().len() >= distinct.len());
        }
    }
}
