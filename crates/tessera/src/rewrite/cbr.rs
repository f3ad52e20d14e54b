//! CBR, context-based rewriting (Kaczmarczyk et al., SYSTOR'12), at
//! container granularity: a duplicate's *stream context* is the next
//! `stream_context` bytes of the stream starting at it; its rewrite utility
//! is the fraction of its container that the stream context does not use.
//! A duplicate is rewritten when its utility is at least the minimal
//! utility (70%) and among the best utilities seen so far within the
//! rewrite budget (5% of the bytes), which the budget also caps.

use super::{candidate, Budget, RewriteFilter, Verdict};
use crate::index::{Chunk, Decision};
use crate::layout::container::ContainerId;
use std::collections::{HashMap, VecDeque};

const BUCKETS: usize = 100;

/// The CBR filter.
pub struct Cbr {
    stream_context: u64,
    min_utility: f64,
    container_size: f64,
    budget: Budget,
    window: VecDeque<(Chunk, Decision)>,
    window_bytes: u64,
    /// Bytes of the window's duplicates per referenced container.
    in_context: HashMap<ContainerId, u64>,
    /// Histogram of the utilities of all duplicates seen.
    utilities: [u64; BUCKETS + 1],
    duplicates: u64,
    /// Fraction of duplicates whose utility may rank as "best".
    best_fraction: f64,
}

impl Cbr {
    /// CBR over a stream context of `stream_context` bytes.
    pub fn new(stream_context: u64, min_utility: f64, container_size: u64, budget: Budget) -> Self {
        Cbr {
            stream_context,
            min_utility,
            container_size: container_size.max(1) as f64,
            best_fraction: budget_fraction(&budget),
            budget,
            window: VecDeque::new(),
            window_bytes: 0,
            in_context: HashMap::new(),
            utilities: [0; BUCKETS + 1],
            duplicates: 0,
        }
    }

    /// The lowest utility bucket still among the best `best_fraction` of
    /// the duplicates seen (ties in that bucket count as best).
    fn threshold_bucket(&self) -> usize {
        let allowed = (self.best_fraction * self.duplicates as f64).ceil() as u64;
        let mut above = 0;
        for b in (0..=BUCKETS).rev() {
            above += self.utilities[b];
            if above >= allowed {
                return b;
            }
        }
        0
    }

    /// Decides the chunk at the head of the window (its context is complete or the stream ended).
    fn decide_head(&mut self, out: &mut Vec<Verdict>) {
        let Some((chunk, decision)) = self.window.pop_front() else {
            return;
        };
        let mut rewrite = false;
        if let Some(cid) = candidate(decision) {
            let used = self.in_context.get(&cid).copied().unwrap_or(0) as f64;
            let utility = (1.0 - used / self.container_size).clamp(0.0, 1.0);
            let bucket = (utility * BUCKETS as f64).floor() as usize;
            self.utilities[bucket] += 1;
            self.duplicates += 1;
            rewrite = utility >= self.min_utility
                && bucket >= self.threshold_bucket()
                && self.budget.allow(chunk.len);
            if let Some(n) = self.in_context.get_mut(&cid) {
                *n = n.saturating_sub(u64::from(chunk.len));
            }
        }
        self.window_bytes -= u64::from(chunk.len);
        out.push(Verdict {
            chunk,
            decision,
            rewrite,
        });
    }
}

fn budget_fraction(b: &Budget) -> f64 {
    b.limit.unwrap_or(1.0)
}

impl RewriteFilter for Cbr {
    fn push(&mut self, chunk: Chunk, decision: Decision, out: &mut Vec<Verdict>) {
        self.budget.see(chunk.len);
        if let Some(cid) = candidate(decision) {
            *self.in_context.entry(cid).or_default() += u64::from(chunk.len);
        }
        self.window_bytes += u64::from(chunk.len);
        self.window.push_back((chunk, decision));
        while self
            .window
            .front()
            .is_some_and(|(c, _)| self.window_bytes - u64::from(c.len) >= self.stream_context)
        {
            self.decide_head(out);
        }
    }

    fn finish(&mut self, out: &mut Vec<Verdict>) {
        while !self.window.is_empty() {
            self.decide_head(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::test_util::run;

    #[test]
    fn rewrites_duplicates_whose_container_the_context_barely_uses() {
        // 100 chunks of 100 bytes, containers of 1000 bytes, context 1000 bytes.
        // Chunks 0..50 reference container 1 densely (its context uses all of it);
        // every 10th of the rest references a different old container alone.
        let mut decisions = Vec::new();
        for i in 0..100u64 {
            decisions.push(if i < 50 {
                Decision::Duplicate(1)
            } else if i % 10 == 0 {
                Decision::Duplicate(100 + i)
            } else {
                Decision::Unique
            });
        }
        let mut f = Cbr::new(1000, 0.7, 1000, Budget::new(Some(0.5)));
        let flags = run(&mut f, &decisions, 100);
        for (i, &f) in flags.iter().enumerate().take(40) {
            assert!(!f, "dense duplicate {i} rewritten");
        }
        for i in (50..100).step_by(10) {
            assert!(flags[i], "isolated duplicate {i} kept");
        }
    }

    #[test]
    fn respects_the_budget() {
        let decisions: Vec<Decision> = (0..1000u64).map(Decision::Duplicate).collect();
        let mut f = Cbr::new(1000, 0.7, 1_000_000, Budget::new(Some(0.05)));
        let flags = run(&mut f, &decisions, 100);
        let n = flags.iter().filter(|&&r| r).count();
        assert!(n <= 50, "{n} rewrites exceed 5%");
        assert!(n > 0);
    }
}
