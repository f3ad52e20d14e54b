//! SMR (Wu, Hua, Zuo, Sun, TPDS'19): per segment, selects old containers
//! greedily by the number of *distinct* chunks of the segment they would
//! serve (a coverage function, so the greedy choice is the classic
//! approximation of submodular maximization), up to `level` containers;
//! duplicates in unselected containers are rewritten. Unlike Capping,
//! repeated references to the same chunk count once, so containers that
//! serve many different chunks win over ones referenced many times for few.

use super::{candidate, Budget, SegmentSize, Segmented, SelectContainers};
use crate::fingerprint::Fingerprint;
use crate::index::{Chunk, Decision};
use crate::layout::container::ContainerId;
use std::collections::{HashMap, HashSet};

/// SMR selects up to `level` containers greedily by distinct chunks served.
pub struct SmrSelect {
    level: usize,
}

/// The SMR filter.
pub type Smr = Segmented<SmrSelect>;

impl Smr {
    /// Segments of `size`, at most `level` containers selected each.
    pub fn new(size: SegmentSize, level: u32, budget: Budget) -> Self {
        Segmented::with_selector(
            size,
            SmrSelect {
                level: level as usize,
            },
            budget,
        )
    }
}

impl SelectContainers for SmrSelect {
    /// The greedy selection: repeatedly the container covering the most
    /// not-yet-covered distinct chunks (bytes break ties, then lower id).
    fn select(&self, segment: &[(Chunk, Decision)]) -> HashSet<ContainerId> {
        let mut covers: HashMap<ContainerId, HashMap<Fingerprint, u32>> = HashMap::new();
        for (c, d) in segment {
            if let Some(cid) = candidate(*d) {
                covers.entry(cid).or_default().insert(c.fp, c.len);
            }
        }
        let mut covered: HashSet<Fingerprint> = HashSet::new();
        let mut selected = HashSet::new();
        while selected.len() < self.level {
            let best = covers
                .iter()
                .filter(|(cid, _)| !selected.contains(*cid))
                .map(|(cid, fps)| {
                    let fresh: Vec<(&Fingerprint, &u32)> = fps
                        .iter()
                        .filter(|(fp, _)| !covered.contains(*fp))
                        .collect();
                    let bytes: u64 = fresh.iter().map(|(_, &l)| u64::from(l)).sum();
                    (fresh.len(), bytes, std::cmp::Reverse(*cid))
                })
                .max();
            match best {
                Some((gain, _, std::cmp::Reverse(cid))) if gain > 0 => {
                    if let Some(fps) = covers.get(&cid) {
                        covered.extend(fps.keys().copied());
                    }
                    selected.insert(cid);
                }
                _ => break,
            }
        }
        selected
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::test_util::chunk;
    use crate::rewrite::RewriteFilter;

    #[test]
    fn prefers_containers_with_more_distinct_chunks() {
        // Container 1 is referenced 4 times but for one distinct chunk;
        // container 2 serves 3 distinct chunks. With one container allowed,
        // Capping would keep 1; SMR keeps 2.
        let mut f = Smr::new(SegmentSize::Bytes(1 << 30), 1, Budget::new(None));
        let mut out = Vec::new();
        let items = [(7, 1), (7, 1), (7, 1), (7, 1), (8, 2), (9, 2), (10, 2)];
        for (i, &(id, cid)) in items.iter().enumerate() {
            f.push(chunk(i as u64, id, 100), Decision::Duplicate(cid), &mut out);
        }
        f.finish(&mut out);
        let flags: Vec<bool> = out.iter().map(|v| v.rewrite).collect();
        assert_eq!(flags, vec![true, true, true, true, false, false, false]);
    }
}
