//! Rewriting: turns some duplicates of stored chunks into new copies, so
//! that a backup's chunks are less scattered over old containers (faster
//! restores) at the cost of space. Each policy is a [`RewriteFilter`] that
//! receives decided chunks in stream order and hands them on, possibly
//! later (windowed policies buffer a segment), with a verdict.

mod capping;
mod cbr;
mod har;
mod smr;

pub use capping::Capping;
pub use cbr::Cbr;
pub use har::Har;
pub use smr::Smr;

use crate::format::snapshot::ChunkRef;
use crate::index::{Chunk, Decision};
use crate::layout::container::ContainerId;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// A chunk with the index's decision and the rewrite filter's verdict.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// The chunk.
    pub chunk: Chunk,
    /// The index's decision.
    pub decision: Decision,
    /// Store it again although it is a duplicate (only for `Decision::Duplicate`).
    pub rewrite: bool,
}

/// A rewriting policy.
pub trait RewriteFilter: Send {
    /// Accepts the next decided chunk (stream order) and appends to `out`
    /// every chunk whose verdict is now final, in stream order.
    fn push(&mut self, chunk: Chunk, decision: Decision, out: &mut Vec<Verdict>);
    /// End of stream: appends the chunks still held back.
    fn finish(&mut self, out: &mut Vec<Verdict>);
    /// Whether [`RewriteFilter::learn`] needs the data sizes of the containers the recipe names.
    fn needs_container_sizes(&self) -> bool {
        false
    }
    /// After the backup's recipe is final: history-based policies learn from
    /// it (and from the data bytes of the containers it names, when they asked
    /// for them) and return the state to persist (`None` when stateless).
    fn learn(
        &mut self,
        _recipe: &mut dyn Iterator<Item = ChunkRef>,
        _container_bytes: &std::collections::HashMap<ContainerId, u64>,
    ) -> Option<Vec<u8>> {
        None
    }
}

/// Which rewriting policy a repository uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewriteKind {
    /// No rewriting.
    #[default]
    None,
    /// Context-based rewriting (Kaczmarczyk et al., SYSTOR'12).
    Cbr,
    /// Capping (Lillibridge et al., FAST'13).
    Capping,
    /// History-aware rewriting (Fu et al., ATC'14).
    Har,
    /// Submodular-maximization rewriting (Wu et al., TPDS'19).
    Smr,
}

impl RewriteKind {
    /// The name used in configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            RewriteKind::None => "none",
            RewriteKind::Cbr => "cbr",
            RewriteKind::Capping => "capping",
            RewriteKind::Har => "har",
            RewriteKind::Smr => "smr",
        }
    }
}

impl FromStr for RewriteKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(RewriteKind::None),
            "cbr" => Ok(RewriteKind::Cbr),
            "capping" => Ok(RewriteKind::Capping),
            "har" => Ok(RewriteKind::Har),
            "smr" => Ok(RewriteKind::Smr),
            other => Err(format!(
                "unknown rewrite policy {other:?} (expected none, cbr, capping, har or smr)"
            )),
        }
    }
}

/// Rewriting parameters, with each paper's defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RewriteParams {
    /// The policy.
    pub kind: RewriteKind,
    /// At most this fraction of the bytes seen so far is rewritten (e.g. 0.05); none if absent.
    /// CBR always applies its own 5% budget unless this is set.
    pub limit: Option<f64>,
    /// CBR: bytes of upcoming stream that form a chunk's stream context (5 MiB).
    pub cbr_stream_context: u64,
    /// CBR: minimal rewrite utility (0.7).
    pub cbr_min_utility: f64,
    /// Capping and SMR: segment size in bytes (20 MiB).
    pub segment_bytes: u64,
    /// Capping and SMR: segment size in chunks instead of bytes (as Destor
    /// and the Capping paper count segments: 1024 chunks); overrides
    /// `segment_bytes` when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_chunks: Option<u32>,
    /// Capping: containers a segment may reference (20 per 20 MiB segment).
    pub capping_level: u32,
    /// SMR: containers selected per segment (20 per 20 MiB segment).
    pub smr_level: u32,
    /// HAR: containers below this utilization are sparse (0.5).
    pub har_utilization: f64,
}

impl Default for RewriteParams {
    fn default() -> Self {
        RewriteParams {
            kind: RewriteKind::None,
            limit: None,
            cbr_stream_context: 5 << 20,
            cbr_min_utility: 0.7,
            segment_bytes: 20 << 20,
            segment_chunks: None,
            capping_level: 20,
            smr_level: 20,
            har_utilization: 0.5,
        }
    }
}

impl RewriteParams {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(l) = self.limit {
            if !(0.0..=1.0).contains(&l) {
                return Err(format!("rewrite limit {l} is outside 0..=1"));
            }
        }
        if !(0.0..=1.0).contains(&self.cbr_min_utility)
            || !(0.0..=1.0).contains(&self.har_utilization)
        {
            return Err("CBR utility and HAR utilization thresholds must be within 0..=1".into());
        }
        if self.segment_bytes == 0 || self.cbr_stream_context == 0 || self.segment_chunks == Some(0)
        {
            return Err("rewrite segment and stream context sizes must be positive".into());
        }
        if self.capping_level == 0 || self.smr_level == 0 {
            return Err("capping and SMR levels must be at least 1 container".into());
        }
        Ok(())
    }

    /// Builds the filter; `history` is what the policy persisted after the
    /// previous backup of the same source (HAR), `container_size` the
    /// repository's container capacity.
    pub fn build(&self, container_size: u64, history: Option<&[u8]>) -> Box<dyn RewriteFilter> {
        let limit = Budget::new(self.limit);
        match self.kind {
            RewriteKind::None => Box::new(NoRewrite),
            RewriteKind::Cbr => Box::new(Cbr::new(
                self.cbr_stream_context,
                self.cbr_min_utility,
                container_size,
                Budget::new(Some(self.limit.unwrap_or(0.05))),
            )),
            RewriteKind::Capping => {
                Box::new(Capping::new(self.segment(), self.capping_level, limit))
            }
            RewriteKind::Har => Box::new(Har::new(
                history,
                self.har_utilization,
                container_size,
                limit,
            )),
            RewriteKind::Smr => Box::new(Smr::new(self.segment(), self.smr_level, limit)),
        }
    }

    /// Where Capping and SMR cut their segments.
    pub fn segment(&self) -> SegmentSize {
        match self.segment_chunks {
            Some(n) => SegmentSize::Chunks(n as usize),
            None => SegmentSize::Bytes(self.segment_bytes),
        }
    }
}

/// The size of a Capping or SMR segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentSize {
    /// A segment ends once it holds this many bytes.
    Bytes(u64),
    /// A segment ends once it holds this many chunks.
    Chunks(usize),
}

/// The default filter: hands every chunk on unchanged.
pub struct NoRewrite;

impl RewriteFilter for NoRewrite {
    fn push(&mut self, chunk: Chunk, decision: Decision, out: &mut Vec<Verdict>) {
        out.push(Verdict {
            chunk,
            decision,
            rewrite: false,
        });
    }
    fn finish(&mut self, _out: &mut Vec<Verdict>) {}
}

/// The optional cap on rewritten bytes as a fraction of the bytes seen so far.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// The fraction, or `None` for no limit.
    pub limit: Option<f64>,
    seen: u64,
    rewritten: u64,
}

impl Budget {
    /// A budget of `limit` (a fraction), or unlimited.
    pub fn new(limit: Option<f64>) -> Self {
        Budget {
            limit,
            seen: 0,
            rewritten: 0,
        }
    }

    /// Counts a chunk of the stream.
    pub fn see(&mut self, len: u32) {
        self.seen += u64::from(len);
    }

    /// Whether rewriting `len` more bytes stays within the budget; records it if so.
    pub fn allow(&mut self, len: u32) -> bool {
        let ok = match self.limit {
            None => true,
            Some(l) => (self.rewritten + u64::from(len)) as f64 <= l * self.seen as f64,
        };
        if ok {
            self.rewritten += u64::from(len);
        }
        ok
    }
}

/// Chooses, for a full segment, the old containers whose duplicates stay
/// references; duplicates in any other container are rewritten.
pub trait SelectContainers: Send {
    /// The containers to keep for `segment`.
    fn select(&self, segment: &[(Chunk, Decision)]) -> std::collections::HashSet<ContainerId>;
}

/// A segment-based rewriting policy (Capping, SMR): buffers a segment of
/// the stream, asks its selector which containers to keep, and rewrites
/// the other duplicates within the budget.
pub struct Segmented<S> {
    size: SegmentSize,
    budget: Budget,
    segment: Vec<(Chunk, Decision)>,
    bytes: u64,
    selector: S,
}

impl<S: SelectContainers> Segmented<S> {
    /// Segments of `size` judged by `selector`.
    pub fn with_selector(size: SegmentSize, selector: S, budget: Budget) -> Self {
        Segmented {
            size,
            budget,
            segment: Vec::new(),
            bytes: 0,
            selector,
        }
    }

    fn flush(&mut self, out: &mut Vec<Verdict>) {
        let kept = self.selector.select(&self.segment);
        for (chunk, decision) in self.segment.drain(..) {
            let rewrite = candidate(decision)
                .is_some_and(|cid| !kept.contains(&cid) && self.budget.allow(chunk.len));
            out.push(Verdict {
                chunk,
                decision,
                rewrite,
            });
        }
        self.bytes = 0;
    }
}

impl<S: SelectContainers> RewriteFilter for Segmented<S> {
    fn push(&mut self, chunk: Chunk, decision: Decision, out: &mut Vec<Verdict>) {
        self.budget.see(chunk.len);
        self.bytes += u64::from(chunk.len);
        self.segment.push((chunk, decision));
        let full = match self.size {
            SegmentSize::Bytes(n) => self.bytes >= n,
            SegmentSize::Chunks(n) => self.segment.len() >= n,
        };
        if full {
            self.flush(out);
        }
    }

    fn finish(&mut self, out: &mut Vec<Verdict>) {
        self.flush(out);
    }
}

/// The container a duplicate references, if it is a rewrite candidate.
pub(crate) fn candidate(decision: Decision) -> Option<ContainerId> {
    match decision {
        Decision::Duplicate(c) => Some(c),
        Decision::Unique | Decision::InternalDuplicate => None,
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;
    use crate::fingerprint::Fingerprint;

    /// A chunk `seq` of `len` bytes with a fingerprint derived from `id`.
    pub fn chunk(seq: u64, id: u64, len: u32) -> Chunk {
        let mut fp = [0u8; 32];
        fp[..8].copy_from_slice(&id.to_le_bytes());
        Chunk {
            seq,
            fp: Fingerprint(fp),
            len,
            data: None,
        }
    }

    /// Runs `filter` over (decision) items of `len` bytes each; returns the rewrite flags.
    pub fn run(filter: &mut dyn RewriteFilter, decisions: &[Decision], len: u32) -> Vec<bool> {
        let mut out = Vec::new();
        for (i, &d) in decisions.iter().enumerate() {
            filter.push(chunk(i as u64, i as u64, len), d, &mut out);
        }
        filter.finish(&mut out);
        assert_eq!(out.len(), decisions.len(), "every chunk comes out once");
        for (i, v) in out.iter().enumerate() {
            assert_eq!(v.chunk.seq, i as u64, "stream order is kept");
            assert!(!v.rewrite || matches!(v.decision, Decision::Duplicate(_)));
        }
        out.iter().map(|v| v.rewrite).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_caps_rewrites() {
        let mut b = Budget::new(Some(0.05));
        let mut rewritten = 0;
        for _ in 0..1000 {
            b.see(100);
            if b.allow(100) {
                rewritten += 1;
            }
        }
        assert_eq!(rewritten, 50);
        let mut unlimited = Budget::new(None);
        unlimited.see(1);
        assert!(unlimited.allow(1_000_000));
    }

    #[test]
    fn names_round_trip() {
        for k in [
            RewriteKind::None,
            RewriteKind::Cbr,
            RewriteKind::Capping,
            RewriteKind::Har,
            RewriteKind::Smr,
        ] {
            assert_eq!(k.name().parse::<RewriteKind>().unwrap(), k);
        }
    }
}
