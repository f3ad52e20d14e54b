//! HID and EHID: container-utilization based hot fingerprint distilling
//! (Liu et al., "Improving the Performance of Deduplication-Based Backup
//! Systems via Container Utilization Based Hot Fingerprint Entry
//! Distilling", ACM TOS 17(4), 2021), built on the DDFS index.
//!
//! - CUMM: during a backup, the utilization of every container the backup
//!   references is CU = distinct chunks of the container this backup
//!   references / chunks in the container (its chunk count comes from the
//!   metadata the locality cache loads, or one `read_meta`). Containers with
//!   CU below the threshold (default 50%), and those the backup does not
//!   reference at all (CU = 0), are *sparse*.
//! - ISM: at the end of the backup (`commit`), the DDFS table is rewritten
//!   keeping only the entries naming non-sparse containers (and the
//!   containers this backup wrote): the *hot* index. The other entries are
//!   merged into a second DDFS table, the *cold* index (`index/ehid-cold`).
//!   The next backup looks up the hot index only, so a chunk whose only entry
//!   is cold misses and is stored again as a unique chunk (FTU: fragmented
//!   chunks treated as unique), next to its neighbours.
//! - EHID: the hot table's Bloom filter is rebuilt at each commit from the
//!   hot fingerprints only. HID reads the on-disk table for every chunk the
//!   cache and this backup's own chunks do not answer (no Bloom filter).
//! - `consult_cold`: a hot miss that the cold Bloom filter may hold is looked
//!   up in the cold table (maximum deduplication, at the price of its disk
//!   lookups).
//!
//! Like every index this is a cache: a damaged or missing hot table is
//! rebuilt from the containers (everything hot), a damaged or missing cold
//! table starts empty. Crash safety: a commit writes the new hot generation's
//! table parts, then persists the cold table with the evicted entries, then
//! switches the hot manifest; a crash in between leaves entries in both
//! tables, which the next commit separates again.
//!
//! Known limitation (inherent to the paper's design): a container that one
//! backup does not reference becomes cold, so a repository that alternates
//! unrelated sources deduplicates each only against the last backup's data
//! unless `consult_cold` is set.

use super::ddfs::Layout;
use super::{Chunk, Ddfs, DdfsParams, Decision, DedupIndex, IndexStats, Relocations};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap};
use crate::layout::container::{self, ContainerId};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Directory of the hot table.
pub const EHID_HOT_PREFIX: &str = "index/ehid-hot";
/// Directory of the cold table.
pub const EHID_COLD_PREFIX: &str = "index/ehid-cold";
/// Default sparse-container threshold: CU below 50%.
pub const DEFAULT_SPARSE_THRESHOLD: f64 = super::DEFAULT_EHID_SPARSE_PCT as f64 / 100.0;

/// Parameters of HID/EHID.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EhidParams {
    /// Parameters of the underlying DDFS tables.
    pub ddfs: DdfsParams,
    /// Whether the hot table's Bloom filter screens lookups (EHID) or not (HID).
    pub bloom: bool,
    /// Containers with utilization below this are sparse, in [0, 1].
    pub sparse_threshold: f64,
    /// Whether hot misses are looked up in the cold index too.
    pub consult_cold: bool,
}

impl EhidParams {
    fn hot_layout(&self) -> Layout {
        Layout {
            prefix: EHID_HOT_PREFIX.into(),
            policy: if self.bloom { "ehid" } else { "hid" },
            bloom: self.bloom,
            from_containers: true,
            shared: false,
        }
    }

    fn cold_layout() -> Layout {
        Layout {
            prefix: EHID_COLD_PREFIX.into(),
            policy: "ehid-cold",
            bloom: true,
            from_containers: false,
            shared: false,
        }
    }

    fn checked(self) -> Result<EhidParams> {
        if !(0.0..=1.0).contains(&self.sparse_threshold) {
            return Err(Error::InvalidConfig(format!(
                "sparse-container threshold {} is not in [0, 1]",
                self.sparse_threshold
            )));
        }
        Ok(self)
    }
}

/// Container utilization monitor: the distinct chunks of each container
/// that this backup references.
#[derive(Default)]
pub struct Cumm {
    refs: hashbrown::HashMap<ContainerId, FingerprintMap<()>>,
    written: hashbrown::HashSet<ContainerId>,
}

impl Cumm {
    /// The backup references chunk `fp` stored in container `c`.
    pub fn reference(&mut self, c: ContainerId, fp: Fingerprint) {
        self.refs.entry(c).or_default().insert(fp, ());
    }

    /// The backup wrote chunks into container `c` (never sparse).
    pub fn wrote(&mut self, c: ContainerId) {
        self.written.insert(c);
    }

    /// Containers referenced or written, whatever their utilization.
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty() && self.written.is_empty()
    }

    /// Utilization of the referenced container `c` of `size` chunks.
    pub fn utilization(&self, c: ContainerId, size: u32) -> f64 {
        let used = self.refs.get(&c).map_or(0, |s| s.len());
        if size == 0 {
            return 1.0;
        }
        used as f64 / f64::from(size)
    }

    /// Splits the referenced containers into (hot, sparse) given their chunk
    /// counts (`size`; unknown sizes count as hot) and `threshold`; the
    /// containers this backup wrote are hot.
    pub fn separate(
        &self,
        threshold: f64,
        mut size: impl FnMut(ContainerId) -> Result<Option<u32>>,
    ) -> Result<(hashbrown::HashSet<ContainerId>, Vec<ContainerId>)> {
        let mut hot: hashbrown::HashSet<ContainerId> = self.written.clone();
        let mut sparse = Vec::new();
        for &c in self.refs.keys() {
            if hot.contains(&c) {
                continue;
            }
            match size(c)? {
                Some(n) if self.utilization(c, n) < threshold => sparse.push(c),
                _ => {
                    hot.insert(c);
                }
            }
        }
        sparse.sort_unstable();
        Ok((hot, sparse))
    }

    /// Approximate bytes of memory held.
    pub fn memory(&self) -> u64 {
        let sets: usize = self.refs.values().map(|s| s.allocation_size()).sum();
        (sets + self.refs.allocation_size() + self.written.allocation_size()) as u64
    }

    fn clear(&mut self) {
        self.refs.clear();
        self.written.clear();
    }
}

/// The HID/EHID index: a hot DDFS table used for lookups and a cold one.
pub struct Ehid {
    backend: Arc<dyn Backend>,
    params: EhidParams,
    hot: Ddfs,
    cold: Ddfs,
    cumm: Cumm,
    /// Whether chunks were offered since the last commit (a commit without a
    /// backup, e.g. after garbage collection, does not separate).
    streamed: bool,
    /// Hot misses that the cold Bloom filter holds (FTU), this backup.
    ftu_chunks: u64,
    /// Hot misses found in the cold table (`consult_cold`).
    cold_hits: u64,
    /// Containers found sparse at the last commit (among those referenced).
    sparse_containers: u64,
    /// Entries moved from hot to cold at the last commit.
    evicted: u64,
    /// Peak memory of the utilization monitor.
    cumm_peak: u64,
}

impl Ehid {
    /// Opens the index (see [`Ddfs::open`]; the cold table starts empty when
    /// missing or damaged).
    pub fn open(
        backend: Arc<dyn Backend>,
        containers: &[ContainerId],
        params: EhidParams,
    ) -> Result<Ehid> {
        let params = params.checked()?;
        let hot = Ddfs::open_in(
            backend.clone(),
            containers,
            params.ddfs,
            params.hot_layout(),
        )?;
        let cold = Ddfs::open_in(
            backend.clone(),
            containers,
            params.ddfs,
            EhidParams::cold_layout(),
        )?;
        Ok(Ehid::with(backend, params, hot, cold))
    }

    /// Rebuilds the index from the containers: every entry hot, cold empty.
    pub fn rebuild(
        backend: Arc<dyn Backend>,
        containers: &[ContainerId],
        params: EhidParams,
    ) -> Result<Ehid> {
        let params = params.checked()?;
        let hot = Ddfs::rebuild_in(
            backend.clone(),
            containers,
            params.ddfs,
            params.hot_layout(),
        )?;
        let cold = Ddfs::rebuild_in(
            backend.clone(),
            containers,
            params.ddfs,
            EhidParams::cold_layout(),
        )?;
        Ok(Ehid::with(backend, params, hot, cold))
    }

    fn with(backend: Arc<dyn Backend>, params: EhidParams, mut hot: Ddfs, cold: Ddfs) -> Ehid {
        hot.track_sizes();
        Ehid {
            backend,
            params,
            hot,
            cold,
            cumm: Cumm::default(),
            streamed: false,
            ftu_chunks: 0,
            cold_hits: 0,
            sparse_containers: 0,
            evicted: 0,
            cumm_peak: 0,
        }
    }

    /// Entries of the hot table.
    pub fn hot_entries(&self) -> u64 {
        self.hot.table_entries()
    }

    /// Entries of the cold table.
    pub fn cold_entries(&self) -> u64 {
        self.cold.table_entries()
    }

    fn decide(&mut self, fp: &Fingerprint) -> Result<Decision> {
        let mut d = self.hot.decide_one(fp)?;
        if d == Decision::Unique && self.cold.table_entries() > 0 && self.cold.may_contain(fp) {
            if self.params.consult_cold {
                if let Some(c) = self.cold.find(fp)? {
                    self.hot.adopt(*fp, c)?;
                    self.cold_hits += 1;
                    d = Decision::Duplicate(c);
                }
            } else {
                self.ftu_chunks += 1;
            }
        }
        if let Decision::Duplicate(c) = d {
            self.cumm.reference(c, *fp);
        }
        Ok(d)
    }

    /// The chunk count of container `c` (from the cache's loads, else its metadata).
    fn size_of(&self, c: ContainerId) -> Result<Option<u32>> {
        if let Some(n) = self.hot.container_size(c) {
            return Ok(Some(n));
        }
        match container::read_meta(self.backend.as_ref(), c) {
            Ok((_, metas)) => Ok(Some(metas.len() as u32)),
            Err(
                Error::Corrupt { .. }
                | Error::Authentication { .. }
                | Error::UnsupportedVersion { .. }
                | Error::NotFound(_),
            ) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl DedupIndex for Ehid {
    fn submit(&mut self, batch: Vec<Chunk>, decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        decided.reserve(batch.len());
        for chunk in batch {
            self.streamed = true;
            let d = self.decide(&chunk.fp)?;
            decided.push((chunk, d));
        }
        self.hot.refresh_stats();
        self.cumm_peak = self.cumm_peak.max(self.cumm.memory());
        Ok(())
    }

    fn finish(&mut self, decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        self.hot.finish(decided)
    }

    fn placed(&mut self, stored: &[(Fingerprint, ContainerId)]) -> Result<()> {
        for &(_, c) in stored {
            self.cumm.wrote(c);
        }
        self.hot.placed(stored)
    }

    fn relocate(&mut self, removed: &BTreeSet<ContainerId>, moved: &Relocations) -> Result<()> {
        self.hot.relocate(removed, moved)?;
        self.cold.relocate(removed, moved)
    }

    fn commit(&mut self, next_container: ContainerId) -> Result<()> {
        if !self.streamed || self.cumm.is_empty() {
            self.hot.commit(next_container)?;
            return self.cold.commit(next_container);
        }
        let (hot_set, sparse) = {
            let threshold = self.params.sparse_threshold;
            let this = &*self;
            this.cumm.separate(threshold, |c| this.size_of(c))?
        };
        self.sparse_containers = sparse.len() as u64;
        self.hot.set_keep(Some(hot_set));
        let cold = &mut self.cold;
        let mut evicted = 0;
        let mut hook = |entries: Vec<(Fingerprint, ContainerId)>| -> Result<()> {
            evicted = entries.len() as u64;
            cold.placed(&entries)?;
            cold.commit(next_container)
        };
        let done = self.hot.commit_with(next_container, Some(&mut hook));
        self.hot.set_keep(None);
        done?;
        self.evicted = evicted;
        self.cumm.clear();
        self.streamed = false;
        Ok(())
    }

    fn stats(&self) -> IndexStats {
        let mut s = self.hot.stats();
        let cold = self.cold.stats();
        s.cold_entries = cold.entries;
        s.disk_lookups += cold.disk_lookups;
        s.bloom_false_positives += cold.bloom_false_positives;
        s.container_loads += cold.container_loads;
        s.commit_write_bytes += cold.commit_write_bytes;
        s.cold_table_bytes = cold.table_bytes;
        s.cold_bloom_bytes = cold.bloom_bytes;
        // The monitor's peak and the hot index's peak need not coincide: an upper bound.
        s.memory_bytes += self.cumm_peak;
        if self.params.consult_cold {
            s.memory_bytes += cold.bloom_bytes;
        }
        s.ftu_chunks = self.ftu_chunks;
        s.cold_hits = self.cold_hits;
        s.sparse_containers = self.sparse_containers;
        s.evicted_entries = self.evicted;
        s
    }

    fn piggyback(&mut self, containers: std::collections::HashSet<ContainerId>) -> bool {
        self.hot.piggyback(containers)
    }

    fn take_piggybacked(&mut self, out: &mut Vec<Arc<crate::layout::container::Container>>) {
        self.hot.take_piggybacked(out);
    }
}

#[cfg(test)]
#[path = "ehid_tests.rs"]
mod tests;
