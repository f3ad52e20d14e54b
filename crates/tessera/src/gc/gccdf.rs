//! GCCDF (garbage collection that defragments): the live chunks of each GC
//! segment are clustered by *ownership* (the set of backups that reference
//! them) with a binary tree over the segment's involved backups, newest
//! first — each level splits every leaf by whether one backup references its
//! chunks, a leaf below a size threshold is not split further — and the
//! leaves, traversed left to right, give the migration order. Adjacent
//! leaves share their references to the most recent backups, which yields
//! the paper's recency-prioritized, similarity-ordered cluster packing.

use crate::container::ContainerId;
use crate::fingerprint::Fingerprint;
use crate::snapshot::{BackupId, ChunkRef};
use fastbloom::BloomFilter;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// False-positive rate of the per-backup reference filters.
const FPR: f64 = 0.001;
/// Seed of the reference filters' hash.
const SEED: u128 = 0x7465_7373_6572_6167_6363_6466_0000_0001;

/// Who references what: a Bloom filter of each live backup's fingerprints,
/// and for each container the live backups that reference it (the RRT).
#[derive(Default)]
pub struct Owners {
    filters: BTreeMap<BackupId, BloomFilter>,
    rrt: HashMap<ContainerId, BTreeSet<BackupId>>,
}

impl Owners {
    /// Records backup `id`'s recipe.
    pub fn add_backup(&mut self, id: BackupId, chunks: &[ChunkRef]) {
        // A fixed seed keeps GC plans (and so experiments) reproducible.
        let mut filter = BloomFilter::with_false_pos(FPR)
            .seed(&SEED)
            .expected_items(chunks.len().max(1));
        for c in chunks {
            filter.insert(&c.fp.0);
            self.rrt.entry(c.container).or_default().insert(id);
        }
        self.filters.insert(id, filter);
    }

    /// The backups referencing any container of `group`, newest first.
    pub fn involved(&self, group: &[ContainerId]) -> Vec<BackupId> {
        let mut ids: BTreeSet<BackupId> = BTreeSet::new();
        for c in group {
            if let Some(users) = self.rrt.get(c) {
                ids.extend(users);
            }
        }
        ids.into_iter().rev().collect()
    }

    /// Whether backup `id` (probably) references `fp`.
    fn references(&self, id: BackupId, fp: &Fingerprint) -> bool {
        self.filters.get(&id).is_some_and(|f| f.contains(&fp.0))
    }
}

/// A migration order and the size of the tree that produced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Indices into the segment's chunks, in the order to write them.
    pub order: Vec<usize>,
    /// Clusters (leaves).
    pub leaves: u64,
    /// Tree nodes.
    pub nodes: u64,
}

/// Plans the migration of `chunks` (fingerprint and length, in container
/// order) given the segment's `involved` backups, newest first.
pub fn plan(
    chunks: &[(Fingerprint, u32)],
    involved: &[BackupId],
    owners: &Owners,
    split_threshold: u64,
) -> Plan {
    let bytes = |leaf: &[usize]| leaf.iter().map(|&i| u64::from(chunks[i].1)).sum::<u64>();
    let mut leaves: Vec<Vec<usize>> = vec![(0..chunks.len()).collect()];
    let mut nodes = 1u64;
    for &backup in involved {
        let mut next = Vec::with_capacity(leaves.len() * 2);
        for leaf in leaves {
            if leaf.len() < 2 || bytes(&leaf) < split_threshold {
                next.push(leaf);
                continue;
            }
            let (referenced, not): (Vec<usize>, Vec<usize>) = leaf
                .into_iter()
                .partition(|&i| owners.references(backup, &chunks[i].0));
            // Left child: not referenced by this backup; right child: referenced.
            for child in [not, referenced] {
                if !child.is_empty() {
                    nodes += 1;
                    next.push(child);
                }
            }
        }
        leaves = next;
    }
    Plan {
        leaves: leaves.len() as u64,
        nodes,
        order: leaves.concat(),
    }
}

/// A deterministic random permutation of `0..n` (the random-packing ablation).
pub fn random_order(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint([n; 32])
    }

    fn refs(fps: &[u8]) -> Vec<ChunkRef> {
        fps.iter()
            .map(|&n| ChunkRef {
                fp: fp(n),
                len: 100,
                container: 1,
            })
            .collect()
    }

    #[test]
    fn clusters_by_ownership_newest_first() {
        // The paper's Fig. 6: chunks 1,5,7 in all three backups; 2,4,8 in α and β; 3,6,9 in α only.
        let mut owners = Owners::default();
        owners.add_backup(1, &refs(&[1, 2, 3, 4, 5, 6, 7, 8, 9])); // α
        owners.add_backup(2, &refs(&[1, 2, 4, 5, 7, 8])); // β
        owners.add_backup(3, &refs(&[1, 5, 7])); // γ
        let chunks: Vec<(Fingerprint, u32)> = (1..=9).map(|n| (fp(n), 100)).collect();
        let involved = owners.involved(&[1]);
        assert_eq!(involved, vec![3, 2, 1]);
        let p = plan(&chunks, &involved, &owners, 0);
        let order: Vec<u8> = p.order.iter().map(|&i| i as u8 + 1).collect();
        assert_eq!(order, vec![3, 6, 9, 2, 4, 8, 1, 5, 7]);
        assert_eq!(p.leaves, 3);
        // A large split threshold leaves everything in one cluster, in container order.
        let p = plan(&chunks, &involved, &owners, 1 << 20);
        assert_eq!(p.order, (0..9).collect::<Vec<_>>());
        assert_eq!(p.leaves, 1);
    }

    #[test]
    fn random_order_is_a_permutation() {
        let mut o = random_order(1000, 7);
        assert_ne!(o, (0..1000).collect::<Vec<_>>());
        o.sort_unstable();
        assert_eq!(o, (0..1000).collect::<Vec<_>>());
    }
}
