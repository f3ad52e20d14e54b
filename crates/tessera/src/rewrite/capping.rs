//! Capping (Lillibridge, Eshghi, Bhagwat, FAST'13): the stream is cut into
//! segments; a segment may reference at most `level` old containers — those
//! holding the most of its bytes — and duplicates in any other container
//! are rewritten.

use super::{candidate, Budget, SegmentSize, Segmented, SelectContainers};
use crate::index::{Chunk, Decision};
use crate::layout::container::ContainerId;
use std::collections::{HashMap, HashSet};

/// Capping keeps the `level` containers holding the most bytes of the segment.
pub struct CappingSelect {
    level: usize,
}

/// The Capping filter.
pub type Capping = Segmented<CappingSelect>;

impl Capping {
    /// Segments of `size`, at most `level` containers each.
    pub fn new(size: SegmentSize, level: u32, budget: Budget) -> Self {
        Segmented::with_selector(
            size,
            CappingSelect {
                level: level as usize,
            },
            budget,
        )
    }
}

impl SelectContainers for CappingSelect {
    fn select(&self, segment: &[(Chunk, Decision)]) -> HashSet<ContainerId> {
        let mut per_container: HashMap<ContainerId, u64> = HashMap::new();
        for (c, d) in segment {
            if let Some(cid) = candidate(*d) {
                *per_container.entry(cid).or_default() += u64::from(c.len);
            }
        }
        let mut ranked: Vec<(ContainerId, u64)> = per_container.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.iter().take(self.level).map(|r| r.0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::test_util::run;

    #[test]
    fn rewrites_the_least_referenced_containers_of_a_segment() {
        // One segment of 10 chunks: 4 in container 1, 3 in 2, 2 in 3, 1 new.
        let d = |c| Decision::Duplicate(c);
        let decisions = [
            d(1),
            d(2),
            d(1),
            d(3),
            d(1),
            d(2),
            d(3),
            d(2),
            d(1),
            Decision::Unique,
        ];
        let flags = run(
            &mut Capping::new(SegmentSize::Bytes(1 << 30), 2, Budget::new(None)),
            &decisions,
            100,
        );
        assert_eq!(
            flags,
            vec![false, false, false, true, false, false, true, false, false, false]
        );
        // Segments of 3 chunks and a cap of 1: each segment keeps its biggest
        // container (ties: the lowest id).
        let flags = run(
            &mut Capping::new(SegmentSize::Bytes(300), 1, Budget::new(None)),
            &decisions,
            100,
        );
        assert_eq!(
            flags,
            vec![false, true, false, true, false, true, true, true, false, false]
        );
        // The same segments counted in chunks (as Destor counts them).
        let by_count = run(
            &mut Capping::new(SegmentSize::Chunks(3), 1, Budget::new(None)),
            &decisions,
            100,
        );
        assert_eq!(by_count, flags);
    }
}
