//! GCCDF (garbage collection that defragments): the live chunks of each GC
//! segment are clustered by *ownership* (the set of backups that reference
//! them) with a binary tree over the segment's involved backups, newest
//! first — each level splits every leaf by whether one backup references its
//! chunks, a leaf below a size threshold is not split further — and the
//! leaves, traversed left to right, give the migration order. Adjacent
//! leaves share their references to the most recent backups, which yields
//! the paper's recency-prioritized, similarity-ordered cluster packing.
//!
//! Within a cluster, chunks follow the order in which the newest backup
//! that references them reads them (its recipe order), so each container a
//! cluster fills holds a stretch of that backup's stream rather than a
//! sample of all of it: the recency priority applied inside the cluster,
//! where the paper's clustering leaves the order open.

use crate::error::Result;
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder};
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::layout::container::ContainerId;
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

/// Where the newest involved backup that references a chunk reads it: that
/// backup's rank among the involved backups (0 = newest) and the chunk's
/// index in its recipe. Orders chunks newest reader first, then in that
/// reader's stream order.
pub type ReadAt = (usize, usize);

/// Where a chunk no involved backup references sorts: after all others.
pub const UNREAD: ReadAt = (usize::MAX, usize::MAX);

/// A live chunk of a segment, as the analyzer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentChunk {
    /// Its fingerprint.
    pub fp: Fingerprint,
    /// Its length in bytes.
    pub len: u32,
    /// Where the newest involved backup that references it reads it.
    pub read_at: ReadAt,
}

/// For each chunk of a segment (its container and fingerprint), where the
/// newest of the `involved` backups (newest first) that references it reads
/// it. Reads the recipes through `recipe`, newest first, one at a time, and
/// stops as soon as every chunk is placed, so memory stays bounded by the
/// segment. A chunk no involved backup references gets [`UNREAD`].
pub fn newest_reads(
    chunks: &[(ContainerId, Fingerprint)],
    involved: &[BackupId],
    mut recipe: impl FnMut(BackupId) -> Result<Vec<ChunkRef>>,
) -> Result<Vec<ReadAt>> {
    let mut unplaced: hashbrown::HashMap<
        (ContainerId, Fingerprint),
        usize,
        FingerprintHashBuilder,
    > = chunks.iter().enumerate().map(|(i, &k)| (k, i)).collect();
    let mut reads = vec![UNREAD; chunks.len()];
    for (rank, &id) in involved.iter().enumerate() {
        if unplaced.is_empty() {
            break;
        }
        for (pos, c) in recipe(id)?.iter().enumerate() {
            if let Some(i) = unplaced.remove(&(c.container, c.fp)) {
                reads[i] = (rank, pos);
            }
        }
    }
    Ok(reads)
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

/// Plans the migration of `chunks` (in container order) given the segment's
/// `involved` backups, newest first: the leaves of the ownership tree left
/// to right, each in its chunks' [`ReadAt`] order (container order among
/// equals).
pub fn plan(
    chunks: &[SegmentChunk],
    involved: &[BackupId],
    owners: &Owners,
    split_threshold: u64,
) -> Plan {
    let bytes = |leaf: &[usize]| leaf.iter().map(|&i| u64::from(chunks[i].len)).sum::<u64>();
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
                .partition(|&i| owners.references(backup, &chunks[i].fp));
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
    for leaf in &mut leaves {
        // Stable: chunks read at the same place keep their container order.
        leaf.sort_by_key(|&i| chunks[i].read_at);
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

    /// Segment chunks 1..=9, each read where its number says.
    fn segment(read_at: impl Fn(u8) -> ReadAt) -> Vec<SegmentChunk> {
        (1..=9)
            .map(|n| SegmentChunk {
                fp: fp(n),
                len: 100,
                read_at: read_at(n),
            })
            .collect()
    }

    fn numbers(p: &Plan) -> Vec<u8> {
        p.order.iter().map(|&i| i as u8 + 1).collect()
    }

    #[test]
    fn clusters_by_ownership_newest_first() {
        // The paper's Fig. 6: chunks 1,5,7 in all three backups; 2,4,8 in α and β; 3,6,9 in α only.
        let mut owners = Owners::default();
        owners.add_backup(1, &refs(&[1, 2, 3, 4, 5, 6, 7, 8, 9])); // α
        owners.add_backup(2, &refs(&[1, 2, 4, 5, 7, 8])); // β
        owners.add_backup(3, &refs(&[1, 5, 7])); // γ
        let involved = owners.involved(&[1]);
        assert_eq!(involved, vec![3, 2, 1]);
        let chunks = segment(|n| (0, usize::from(n)));
        let p = plan(&chunks, &involved, &owners, 0);
        assert_eq!(numbers(&p), vec![3, 6, 9, 2, 4, 8, 1, 5, 7]);
        assert_eq!(p.leaves, 3);
        // A large split threshold leaves everything in one cluster.
        let p = plan(&chunks, &involved, &owners, 1 << 20);
        assert_eq!(numbers(&p), (1..=9).collect::<Vec<_>>());
        assert_eq!(p.leaves, 1);
    }

    #[test]
    fn clusters_keep_their_newest_readers_order() {
        let mut owners = Owners::default();
        owners.add_backup(1, &refs(&[1, 2, 3, 4, 5, 6, 7, 8, 9]));
        owners.add_backup(2, &refs(&[1, 5, 7]));
        let involved = owners.involved(&[1]);
        // Backup 2 reads 7, 1, 5 in that order; backup 1 reads the rest backwards.
        let chunks = segment(|n| match n {
            7 => (0, 0),
            1 => (0, 1),
            5 => (0, 2),
            n => (1, 9 - usize::from(n)),
        });
        let p = plan(&chunks, &involved, &owners, 0);
        assert_eq!(numbers(&p), vec![9, 8, 6, 4, 3, 2, 7, 1, 5]);
        // One cluster: the newest backup's chunks first, unread chunks last in container order.
        let mut chunks = chunks;
        chunks[3].read_at = UNREAD;
        chunks[1].read_at = UNREAD;
        let p = plan(&chunks, &involved, &owners, 1 << 20);
        assert_eq!(numbers(&p), vec![7, 1, 5, 9, 8, 6, 3, 2, 4]);
    }

    #[test]
    fn newest_reads_stop_once_every_chunk_is_placed() {
        let recipes = [(3, refs(&[5, 1, 5])), (2, refs(&[2, 1])), (1, refs(&[3]))];
        // The reads of `chunks` and the recipes read to find them.
        let run = |chunks: &[(ContainerId, Fingerprint)]| {
            let mut asked = Vec::new();
            let reads = newest_reads(chunks, &[3, 2, 1], |id| {
                asked.push(id);
                Ok(recipes
                    .iter()
                    .find(|(r, _)| *r == id)
                    .map(|(_, c)| c.clone())
                    .unwrap_or_default())
            });
            (reads.ok(), asked)
        };
        let chunks = [(1, fp(1)), (1, fp(2)), (1, fp(5)), (2, fp(1))];
        // The first place in the newest recipe; another container's copy is another chunk.
        let (reads, asked) = run(&chunks);
        assert_eq!(reads, Some(vec![(0, 1), (1, 0), (0, 0), UNREAD]));
        assert_eq!(asked, vec![3, 2, 1]);
        let (reads, asked) = run(&chunks[..3]);
        assert_eq!(reads, Some(vec![(0, 1), (1, 0), (0, 0)]));
        assert_eq!(asked, vec![3, 2], "backup 1 is never read");
    }

    #[test]
    fn random_order_is_a_permutation() {
        let mut o = random_order(1000, 7);
        assert_ne!(o, (0..1000).collect::<Vec<_>>());
        o.sort_unstable();
        assert_eq!(o, (0..1000).collect::<Vec<_>>());
    }
}
