//! HAR, history-aware rewriting (Fu et al., USENIX ATC'14): after each
//! backup, the containers it references whose utilization (distinct bytes
//! it references / the container's data bytes) is below a threshold are
//! *sparse*; the next backup of the same source rewrites its duplicates that
//! live in those sparse containers. Utilization is measured against what a
//! container holds, not its capacity: the last, partly filled container of
//! every backup would otherwise always count as sparse and its chunks be
//! rewritten again and again.

use super::{candidate, Budget, RewriteFilter, Verdict};
use crate::format::snapshot::ChunkRef;
use crate::index::{Chunk, Decision};
use crate::layout::container::ContainerId;
use std::collections::{HashMap, HashSet};

/// The HAR filter.
pub struct Har {
    sparse: HashSet<ContainerId>,
    threshold: f64,
    container_size: u64,
    budget: Budget,
}

impl Har {
    /// HAR with the sparse containers recorded after the previous backup
    /// (`history`, as returned by [`RewriteFilter::learn`]; unreadable history counts as none).
    pub fn new(
        history: Option<&[u8]>,
        threshold: f64,
        container_size: u64,
        budget: Budget,
    ) -> Self {
        let sparse = history
            .map(|h| {
                h.chunks_exact(8)
                    .map(|b| {
                        let mut a = [0u8; 8];
                        a.copy_from_slice(b);
                        u64::from_le_bytes(a)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Har {
            sparse,
            threshold,
            container_size: container_size.max(1),
            budget,
        }
    }

    /// The sparse containers inherited from the previous backup.
    pub fn sparse(&self) -> &HashSet<ContainerId> {
        &self.sparse
    }
}

impl RewriteFilter for Har {
    fn push(&mut self, chunk: Chunk, decision: Decision, out: &mut Vec<Verdict>) {
        self.budget.see(chunk.len);
        let rewrite = candidate(decision)
            .is_some_and(|cid| self.sparse.contains(&cid) && self.budget.allow(chunk.len));
        out.push(Verdict {
            chunk,
            decision,
            rewrite,
        });
    }

    fn finish(&mut self, _out: &mut Vec<Verdict>) {}

    fn needs_container_sizes(&self) -> bool {
        true
    }

    fn learn(
        &mut self,
        recipe: &mut dyn Iterator<Item = ChunkRef>,
        container_bytes: &HashMap<ContainerId, u64>,
    ) -> Option<Vec<u8>> {
        let mut seen = HashSet::new();
        let mut used: HashMap<ContainerId, u64> = HashMap::new();
        for c in recipe {
            if seen.insert((c.container, c.fp)) {
                *used.entry(c.container).or_default() += u64::from(c.len);
            }
        }
        let mut sparse: Vec<ContainerId> = used
            .into_iter()
            .filter(|&(cid, bytes)| {
                let size = container_bytes
                    .get(&cid)
                    .copied()
                    .unwrap_or(self.container_size);
                (bytes as f64) < self.threshold * size.max(1) as f64
            })
            .map(|(cid, _)| cid)
            .collect();
        sparse.sort_unstable();
        self.sparse = sparse.iter().copied().collect();
        Some(sparse.iter().flat_map(|c| c.to_le_bytes()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::rewrite::test_util::run;

    #[test]
    fn learns_sparse_containers_and_rewrites_them_next_time() {
        let refs: Vec<ChunkRef> = [(1, 100u32), (1, 100), (2, 900), (3, 300)]
            .iter()
            .enumerate()
            .map(|(i, &(c, len))| ChunkRef {
                fp: Fingerprint([i as u8; 32]),
                len,
                container: c,
            })
            .collect();
        let mut first = Har::new(None, 0.5, 1000, Budget::new(None));
        // Container 3 holds only 500 bytes (a backup's last container).
        let sizes = HashMap::from([(1, 1000), (2, 1000), (3, 500)]);
        let history = first.learn(&mut refs.into_iter(), &sizes).unwrap();
        // Container 1: 200 of 1000 bytes; 2: 900 of 1000; 3: 300 of 500 -> only 1 is sparse.
        let mut next = Har::new(Some(&history), 0.5, 1000, Budget::new(None));
        assert_eq!(next.sparse(), &HashSet::from([1]));
        let d = Decision::Duplicate;
        let flags = run(
            &mut next,
            &[
                d(1),
                d(2),
                d(3),
                Decision::Unique,
                Decision::InternalDuplicate,
            ],
            10,
        );
        assert_eq!(flags, vec![true, false, false, false, false]);
    }
}
