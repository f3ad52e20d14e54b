//! PFC identification by container id (PFC-delta §IV-B1, Algorithm 1),
//! per source lineage, persisted between backups as `delta/s<hex>`.
//!
//! A *fragmented chunk* is a duplicate the rewriting policy stores again.
//! Algorithm 1 keys everything on the container the duplicate *references*
//! (`cid`, where the index found it): FC-CID records the low-reuse
//! containers fragmented chunks were found in, a fragmented chunk found in a
//! container of FC-CID_last is a *persistent* fragmented chunk (PFC), and
//! PFC-CID records the containers PFCs were found in — containers whose
//! other chunks (those stored around the PFC by the backup that wrote it)
//! are the next backup's likely delta bases, and which its index reads
//! anyway to find the PFC again.
//!
//! Where a PFC is found is not stable across backups: the table points at a
//! chunk's newest copy (the container the last backup rewrote it into), but
//! a fingerprint-cache hit resolves it to whichever cached container holds a
//! copy, often the old one it keeps being rewritten from. So both sets also
//! record the container the new copy went to (`stored_in`): a PFC is
//! recognised whether the next backup finds it where it was found or where
//! it was put, and either container is prefetched.
//! HAR rewrites a PFC every second backup, so with HAR "last" means the last
//! two backups.

use super::params::BasePrefetch;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::format::envelope;
use crate::index::Relocations;
use crate::layout::container::ContainerId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};

/// Directory of the per-source PFC state objects.
pub const PFC_DIR: &str = "delta";
const KIND: &[u8; 4] = b"DPFC";
const VERSION: u32 = 1;
/// Backups whose sets are kept (HAR looks two back).
const GENERATIONS: usize = 2;

/// Key of the PFC state of source lineage `source` (hex of its name).
pub fn state_key(source: &str) -> String {
    format!("{PFC_DIR}/s{}", crate::util::source_key::source_hex(source))
}

/// The container-id sets one backup left.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Generation {
    /// Containers the backup's fragmented chunks were found in or copied
    /// to (FC-CID).
    fc: BTreeSet<ContainerId>,
    /// Containers the backup's PFCs were found in or copied to (PFC-CID).
    pfc: BTreeSet<ContainerId>,
}

/// The persisted sets of the last backups of one source, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct State {
    generations: Vec<Generation>,
}

impl State {
    fn decode(key: &str, bytes: &[u8]) -> Result<State> {
        let payload = envelope::open(key, KIND, VERSION, bytes)?;
        postcard::from_bytes(payload)
            .map_err(|e| Error::corrupt(key, format!("undecodable PFC state: {e}")))
    }

    fn encode(&self) -> Result<Vec<u8>> {
        let payload = postcard::to_stdvec(self)
            .map_err(|e| Error::Pipeline(format!("encoding PFC state: {e}")))?;
        Ok(envelope::seal(KIND, VERSION, &payload))
    }

    /// Reads the state at `key`; a missing one is empty, a damaged one too
    /// (it only guides prefetching: losing it costs compression, not data).
    fn load(backend: &dyn Backend, key: &str) -> Result<State> {
        match backend.read(key) {
            Ok(bytes) => Ok(State::decode(key, &bytes).unwrap_or_default()),
            Err(Error::NotFound(_)) => Ok(State::default()),
            Err(e) => Err(e),
        }
    }
}

/// Algorithm 1's sets during one backup of one source.
pub struct PfcTracker {
    key: String,
    state: State,
    fc_last: HashSet<ContainerId>,
    prefetch: HashSet<ContainerId>,
    emerging: Generation,
    pfcs: u64,
}

impl PfcTracker {
    /// Loads the sets of source `source`; `lookback` backups count as "last"
    /// (2 for HAR, else 1); `prefetch` says which set the index reads whole.
    pub fn open(
        backend: &dyn Backend,
        source: &str,
        lookback: usize,
        prefetch: BasePrefetch,
    ) -> Result<Self> {
        let key = state_key(source);
        let state = State::load(backend, &key)?;
        let recent = state.generations.iter().take(lookback.max(1));
        let (mut fc_last, mut pfc_last) = (HashSet::new(), HashSet::new());
        for g in recent {
            fc_last.extend(g.fc.iter().copied());
            pfc_last.extend(g.pfc.iter().copied());
            if prefetch == BasePrefetch::Fc {
                pfc_last.extend(g.fc.iter().copied());
            }
        }
        Ok(PfcTracker {
            key,
            state,
            fc_last,
            prefetch: pfc_last,
            emerging: Generation::default(),
            pfcs: 0,
        })
    }

    /// PFC-CID_last (with [`BasePrefetch::Fc`], and FC-CID_last):
    /// containers whose data the index's metadata loads piggyback.
    pub fn prefetch_set(&self) -> HashSet<ContainerId> {
        self.prefetch.clone()
    }

    /// Whether an earlier backup of the source left its sets (not so in
    /// the source's first backup, or after the state was lost).
    pub fn has_history(&self) -> bool {
        !self.state.generations.is_empty()
    }

    /// A fragmented chunk found in `found_in` was stored again in `stored_in`.
    pub fn fragmented(&mut self, found_in: ContainerId, stored_in: ContainerId) {
        // Every PFC is a fragmented chunk too, so it can be persistent again.
        self.emerging.fc.extend([found_in, stored_in]);
        if self.fc_last.contains(&found_in) {
            self.emerging.pfc.extend([found_in, stored_in]);
            self.pfcs += 1;
        }
    }

    /// (PFCs, FC-CID containers, PFC-CID containers) of this backup so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.pfcs,
            self.emerging.fc.len() as u64,
            self.emerging.pfc.len() as u64,
        )
    }

    /// Persists this backup's sets as the newest generation.
    pub fn commit(mut self, backend: &dyn Backend) -> Result<()> {
        self.state.generations.insert(0, self.emerging);
        self.state.generations.truncate(GENERATIONS);
        backend.write(&self.key, &self.state.encode()?)
    }
}

/// After garbage collection (PFC-delta §IV-D): in every source's sets, a
/// container GC removed is replaced by the containers its live chunks moved
/// to (a container compacted in place keeps its id), so prefetching keeps
/// finding the chunks after GC.
pub fn relocate(
    backend: &dyn Backend,
    removed: &BTreeSet<ContainerId>,
    moved: &Relocations,
) -> Result<()> {
    let map = |set: &BTreeSet<ContainerId>| -> BTreeSet<ContainerId> {
        set.iter()
            .flat_map(|c| {
                if removed.contains(c) {
                    moved.homes(*c).cloned().unwrap_or_default()
                } else {
                    BTreeSet::from([*c])
                }
            })
            .collect()
    };
    for name in backend.list(PFC_DIR)? {
        let key = format!("{PFC_DIR}/{name}");
        let mut state = State::load(backend, &key)?;
        for g in &mut state.generations {
            g.fc = map(&g.fc);
            g.pfc = map(&g.pfc);
        }
        backend.write(&key, &state.encode()?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Local, ObjectStore};
    use crate::fingerprint::Fingerprint;

    fn backend() -> (tempfile::TempDir, Local) {
        let dir = tempfile::tempdir().unwrap();
        let b = Local::new(dir.path());
        (dir, b)
    }

    #[test]
    fn a_chunk_rewritten_twice_in_a_row_is_a_pfc() {
        let (_d, b) = backend();
        let mut t = PfcTracker::open(&b, "src", 1, BasePrefetch::Pfc).unwrap();
        t.fragmented(3, 10);
        assert_eq!(t.counts(), (0, 2, 0));
        t.commit(&b).unwrap();

        let mut t = PfcTracker::open(&b, "src", 1, BasePrefetch::Pfc).unwrap();
        assert!(t.prefetch_set().is_empty());
        t.fragmented(10, 20); // found where the last backup put it: a PFC
        t.fragmented(4, 21); // found elsewhere: fragmented only
        assert_eq!(t.counts(), (1, 4, 2));
        t.commit(&b).unwrap();

        let t = PfcTracker::open(&b, "src", 1, BasePrefetch::Pfc).unwrap();
        assert_eq!(t.prefetch_set(), HashSet::from([10, 20]));
        let t = PfcTracker::open(&b, "src", 1, BasePrefetch::Fc).unwrap();
        assert_eq!(t.prefetch_set(), HashSet::from([4, 10, 20, 21]));
        // Another source has its own sets.
        assert!(PfcTracker::open(&b, "other", 1, BasePrefetch::Pfc)
            .unwrap()
            .prefetch_set()
            .is_empty());
    }

    #[test]
    fn a_chunk_found_again_where_it_was_found_is_a_pfc() {
        // The index's cache resolves the chunk to its old copy every time,
        // not to the copy the last backup wrote.
        let (_d, b) = backend();
        let mut t = PfcTracker::open(&b, "src", 1, BasePrefetch::Pfc).unwrap();
        t.fragmented(3, 10);
        t.commit(&b).unwrap();
        let mut t = PfcTracker::open(&b, "src", 1, BasePrefetch::Pfc).unwrap();
        t.fragmented(3, 20);
        assert_eq!(t.counts().0, 1);
        t.commit(&b).unwrap();
        let t = PfcTracker::open(&b, "src", 1, BasePrefetch::Pfc).unwrap();
        assert_eq!(t.prefetch_set(), HashSet::from([3, 20]));
    }

    #[test]
    fn har_looks_two_backups_back() {
        let (_d, b) = backend();
        let mut t = PfcTracker::open(&b, "", 2, BasePrefetch::Pfc).unwrap();
        t.fragmented(1, 5);
        t.commit(&b).unwrap();
        PfcTracker::open(&b, "", 2, BasePrefetch::Pfc)
            .unwrap()
            .commit(&b)
            .unwrap(); // nothing rewritten
        let mut t = PfcTracker::open(&b, "", 2, BasePrefetch::Pfc).unwrap();
        t.fragmented(5, 9);
        assert_eq!(t.counts().0, 1);
        let mut t1 = PfcTracker::open(&b, "", 1, BasePrefetch::Pfc).unwrap();
        t1.fragmented(5, 9);
        assert_eq!(t1.counts().0, 0);
    }

    #[test]
    fn gc_moves_the_sets_to_the_new_containers() {
        let (_d, b) = backend();
        let mut t = PfcTracker::open(&b, "s", 1, BasePrefetch::Pfc).unwrap();
        t.fragmented(0, 7);
        t.fragmented(0, 8);
        t.commit(&b).unwrap();
        let mut t = PfcTracker::open(&b, "s", 1, BasePrefetch::Pfc).unwrap();
        t.fragmented(7, 12);
        t.fragmented(8, 13);
        t.commit(&b).unwrap();
        let fp = |i: u8| Fingerprint([i; 32]);
        let mut moved = Relocations::default();
        moved.insert((12, fp(1)), 30).unwrap();
        moved.insert((12, fp(2)), 31).unwrap();
        relocate(&b, &BTreeSet::from([12, 13]), &moved).unwrap();
        let t = PfcTracker::open(&b, "s", 1, BasePrefetch::Pfc).unwrap();
        assert_eq!(t.prefetch_set(), HashSet::from([7, 8, 30, 31]));
        // A damaged state is treated as empty.
        b.write(&state_key("s"), b"garbage").unwrap();
        assert!(PfcTracker::open(&b, "s", 1, BasePrefetch::Pfc)
            .unwrap()
            .prefetch_set()
            .is_empty());
    }
}
