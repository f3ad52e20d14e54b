//! The DDFS table as a log-structured set of immutable *runs*
//! (docs/FORMAT.md §10.2): a backup's commit writes only its new entries,
//! as a new small run, instead of rewriting the whole table; runs are merged
//! by a size-tiered compaction with bounded fan-in, so a fingerprint is
//! rewritten about log_F(entries) times over its life and a commit's work is
//! proportional to what it adds, not to the repository.
//!
//! This module holds what does not depend on the index around it: the
//! compaction policy ([`Compaction`]), the k-way merge of sorted sources
//! ([`merge`]) and the set of containers the runs name ([`Ranges`]).

use super::table::{order_key, Cursor};
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::layout::container::ContainerId;
use crate::util::spill::Sorted;

/// Runs merged at once by default.
pub const DEFAULT_FAN_IN: u32 = 4;
/// Entries below which runs count as the smallest size by default.
pub const DEFAULT_MIN_ENTRIES: u64 = 4096;

/// When runs are merged: size-tiered with fan-in `fan_in`.
///
/// A run of `e` entries is in tier `t` when `min_entries × F^t ≤ e <
/// min_entries × F^(t+1)` (tier 0 below `min_entries × F`). The runs are
/// kept oldest first with tiers that never increase, and at most `F − 1`
/// runs per tier: after a commit appends its run, the newest two runs are
/// merged while the newer is of a higher tier, and the `F` newest runs
/// while they share a tier. Every merge is of consecutive runs, so "newer
/// run wins" stays true; the number of runs is at most `(F − 1)` per tier,
/// logarithmic in the entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compaction {
    /// Runs merged at once (at least 2).
    pub fan_in: u32,
    /// Entries of the smallest tier's unit (at least 1).
    pub min_entries: u64,
}

impl Default for Compaction {
    fn default() -> Self {
        Compaction {
            fan_in: DEFAULT_FAN_IN,
            min_entries: DEFAULT_MIN_ENTRIES,
        }
    }
}

impl Compaction {
    /// The tier of a run of `entries` entries.
    pub fn tier(&self, entries: u64) -> u32 {
        let f = u64::from(self.fan_in.max(2));
        let mut cap = self.min_entries.max(1).saturating_mul(f);
        let mut tier = 0;
        while entries >= cap && cap < u64::MAX {
            cap = cap.saturating_mul(f);
            tier += 1;
        }
        tier
    }

    /// Given the entry counts of the runs (oldest first), the first run of
    /// the suffix to merge into one run next, or `None` when nothing is due.
    pub fn plan(&self, entries: &[u64]) -> Option<usize> {
        let n = entries.len();
        if n < 2 {
            return None;
        }
        let last = self.tier(entries[n - 1]);
        if self.tier(entries[n - 2]) < last {
            return Some(n - 2);
        }
        let same = entries
            .iter()
            .rev()
            .take_while(|&&e| self.tier(e) == last)
            .count();
        (same >= self.fan_in.max(2) as usize).then_some(n - same)
    }
}

/// One sorted source of a merge.
pub(crate) enum Source<'a> {
    /// This backup's new entries; values equal to the marker are skipped.
    Fresh(Sorted<'a>, ContainerId),
    /// A run read in table order.
    Run(Cursor<'a>),
}

impl Source<'_> {
    fn peek(&mut self) -> Result<Option<(Fingerprint, ContainerId)>> {
        match self {
            Source::Fresh(sorted, skip) => {
                while let Some((fp, c)) = sorted.peek()? {
                    if c != *skip {
                        return Ok(Some((fp, c)));
                    }
                    sorted.next()?;
                }
                Ok(None)
            }
            Source::Run(cursor) => cursor.peek(),
        }
    }

    fn advance(&mut self) -> Result<()> {
        match self {
            Source::Fresh(sorted, _) => sorted.next().map(drop),
            Source::Run(cursor) => cursor.next().map(drop),
        }
    }
}

/// Merges `sources` (each in table order, without repeats) in table order:
/// calls `f` with each fingerprint and the containers the sources name for
/// it, in the order of the sources (put the newest first).
pub(crate) fn merge(
    sources: &mut [Source<'_>],
    mut f: impl FnMut(Fingerprint, &[ContainerId]) -> Result<()>,
) -> Result<()> {
    let mut versions = Vec::with_capacity(sources.len());
    loop {
        let mut min: Option<(u64, Fingerprint)> = None;
        for s in sources.iter_mut() {
            if let Some((fp, _)) = s.peek()? {
                let key = order_key(&fp);
                if min.is_none_or(|m| key < m) {
                    min = Some(key);
                }
            }
        }
        let Some((_, fp)) = min else {
            return Ok(());
        };
        versions.clear();
        for s in sources.iter_mut() {
            match s.peek()? {
                Some((other, c)) if other == fp => {
                    versions.push(c);
                    s.advance()?;
                }
                _ => {}
            }
        }
        f(fp, &versions)?;
    }
}

/// A set of container ids as sorted, disjoint, non-adjacent ranges
/// `first..end`: containers are written in id order, so the containers a
/// run names form few ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// The ranges (first, end exclusive), ascending.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// The set of the ids in `ids` (ascending).
    pub fn from_sorted(ids: impl IntoIterator<Item = u64>) -> Ranges {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for id in ids {
            match out.last_mut() {
                Some(last) if last.1 == id => last.1 = id + 1,
                Some(last) if last.1 > id => {}
                _ => out.push((id, id.saturating_add(1))),
            }
        }
        Ranges(out)
    }

    /// Builds the set from ranges `(first, end)` read from disk: `None`
    /// unless they are non-empty, ascending, disjoint and non-adjacent.
    pub fn from_ranges(ranges: Vec<(u64, u64)>) -> Option<Ranges> {
        let ok = ranges.iter().all(|r| r.0 < r.1) && ranges.windows(2).all(|w| w[0].1 < w[1].0);
        ok.then_some(Ranges(ranges))
    }

    /// The union with `other`.
    pub fn union(&self, other: &Ranges) -> Ranges {
        let mut all: Vec<(u64, u64)> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
        for (a, b) in all {
            match out.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        Ranges(out)
    }

    /// Every id in the set.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().flat_map(|&(a, b)| a..b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_grow_by_the_fan_in() {
        let c = Compaction {
            fan_in: 4,
            min_entries: 10,
        };
        assert_eq!(c.tier(0), 0);
        assert_eq!(c.tier(39), 0);
        assert_eq!(c.tier(40), 1);
        assert_eq!(c.tier(159), 1);
        assert_eq!(c.tier(160), 2);
        assert!(c.tier(u64::MAX) < 64);
    }

    #[test]
    fn plan_merges_suffixes() {
        let c = Compaction {
            fan_in: 3,
            min_entries: 1,
        };
        assert_eq!(c.plan(&[]), None);
        assert_eq!(c.plan(&[1]), None);
        assert_eq!(c.plan(&[1, 1]), None);
        assert_eq!(c.plan(&[1, 1, 1]), Some(0));
        assert_eq!(c.plan(&[9, 1, 1, 1]), Some(1));
        // A newer run of a higher tier absorbs the one before it.
        assert_eq!(c.plan(&[9, 1, 9]), Some(1));
    }

    proptest::proptest! {
        /// Whatever the run sizes appended, applying the plan until nothing
        /// is due leaves tiers non-increasing with fewer than F runs per tier.
        #[test]
        fn plan_keeps_the_invariant(adds in proptest::collection::vec(0u64..5000, 1..200),
                                    fan_in in 2u32..6) {
            let c = Compaction { fan_in, min_entries: 16 };
            let mut runs: Vec<u64> = Vec::new();
            for e in adds {
                runs.push(e);
                while let Some(start) = c.plan(&runs) {
                    let merged: u64 = runs[start..].iter().sum();
                    runs.truncate(start);
                    runs.push(merged);
                }
                let tiers: Vec<u32> = runs.iter().map(|&e| c.tier(e)).collect();
                proptest::prop_assert!(tiers.windows(2).all(|w| w[0] >= w[1]), "{tiers:?}");
                for t in &tiers {
                    let n = tiers.iter().filter(|x| *x == t).count();
                    proptest::prop_assert!(n < fan_in as usize, "{tiers:?}");
                }
            }
        }
    }

    #[test]
    fn ranges_union_and_round_trip() {
        let a = Ranges::from_sorted([1, 2, 3, 7, 9, 10]);
        assert_eq!(a.ranges(), &[(1, 4), (7, 8), (9, 11)]);
        let b = Ranges::from_sorted([4, 8, 20]);
        let u = a.union(&b);
        assert_eq!(u.ranges(), &[(1, 5), (7, 11), (20, 21)]);
        assert_eq!(u.ids().count(), 9);
        assert!(Ranges::from_ranges(vec![(1, 3), (3, 5)]).is_none());
        assert!(Ranges::from_ranges(vec![(3, 3)]).is_none());
        assert_eq!(Ranges::from_ranges(u.ranges().to_vec()), Some(u));
    }
}
