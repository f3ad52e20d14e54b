//! Where garbage collection moved live chunks, in bounded memory.
//!
//! GC copies each live fingerprint of the containers it selects forward
//! once (a fingerprint live in two selected containers is written once and
//! both old places name that copy), so a relocation is a map from the
//! fingerprint to its new container, held in a [`SpillMap`] within a
//! budget (runs on local disk past it), plus the few chunks GC kept in
//! place (delta bases in containers it compacted, same id). The indexes,
//! the recipes and PFC-delta's container sets follow it; the index of a
//! commit not yet written shares it ([`Relocations`] is cheap to clone).

use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder};
use crate::layout::container::ContainerId;
use crate::util::spill::{byte_order, SpillMap, DEFAULT_SORT_BUDGET};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Where garbage collection moved live chunks: (old container,
/// fingerprint) → new container (the old one for a chunk kept in place).
#[derive(Clone)]
pub struct Relocations(Arc<Moves>);

struct Moves {
    /// Fingerprint → the container GC copied it to.
    copies: SpillMap,
    /// Chunks kept in place (a compacted container keeps its id).
    kept: hashbrown::HashSet<(ContainerId, Fingerprint), FingerprintHashBuilder>,
    /// Old container → the containers its live chunks went to.
    homes: BTreeMap<ContainerId, BTreeSet<ContainerId>>,
}

impl Default for Relocations {
    fn default() -> Self {
        Relocations::with_budget(DEFAULT_SORT_BUDGET)
    }
}

impl std::fmt::Debug for Relocations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relocations")
            .field("kept", &self.0.kept.len())
            .field("homes", &self.0.homes.len())
            .finish_non_exhaustive()
    }
}

impl Relocations {
    /// Empty relocations whose copies map holds about `budget` bytes in
    /// memory (the rest spilled to temporary files).
    pub fn with_budget(budget: u64) -> Relocations {
        Relocations(Arc::new(Moves {
            copies: SpillMap::with_budget(budget, byte_order),
            kept: Default::default(),
            homes: BTreeMap::new(),
        }))
    }

    fn moves(&mut self) -> Result<&mut Moves> {
        Arc::get_mut(&mut self.0)
            .ok_or_else(|| Error::Pipeline("relocations changed after an index took them".into()))
    }

    /// Records that the chunk `fp` of container `old` is now in `new`
    /// (`new == old`: kept in place). A fingerprint is copied to one place:
    /// a second copy of it replaces the first for every old container.
    pub fn insert(
        &mut self,
        (old, fp): (ContainerId, Fingerprint),
        new: ContainerId,
    ) -> Result<()> {
        let m = self.moves()?;
        if new == old {
            m.kept.insert((old, fp));
        } else {
            m.copies.set(fp, new)?;
        }
        m.homes.entry(old).or_default().insert(new);
        Ok(())
    }

    /// Where this GC copied `fp`, if it did.
    pub fn copy_of(&self, fp: &Fingerprint) -> Result<Option<ContainerId>> {
        self.0.copies.get(fp)
    }

    /// Where the chunk `fp` of the removed container `old` is now (`None`:
    /// it was dropped). A dead chunk whose fingerprint was copied from
    /// another container is found in that copy.
    pub fn get(&self, old: ContainerId, fp: &Fingerprint) -> Result<Option<ContainerId>> {
        if self.0.kept.contains(&(old, *fp)) {
            return Ok(Some(old));
        }
        self.0.copies.get(fp)
    }

    /// The containers the live chunks of `old` went to.
    pub fn homes(&self, old: ContainerId) -> Option<&BTreeSet<ContainerId>> {
        self.0.homes.get(&old)
    }

    /// Whether nothing was moved or kept.
    pub fn is_empty(&self) -> bool {
        self.0.homes.is_empty()
    }

    /// Bytes of memory held: the copies' table and filters, and the kept set.
    pub fn memory(&self) -> u64 {
        self.0.copies.memory() + self.0.kept.allocation_size() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(i: u64) -> Fingerprint {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&i.to_le_bytes());
        b[9] = 3;
        Fingerprint(b)
    }

    #[test]
    fn spilled_relocations_are_found_and_kept_chunks_stay() {
        let mut r = Relocations::with_budget(0);
        for i in 0..5_000u64 {
            r.insert((i % 7, fp(i)), 100 + i % 3).unwrap();
        }
        r.insert((3, fp(9_999)), 3).unwrap();
        assert!(r.0.copies.memory() < 5_000 * 40, "spilled");
        for i in (0..5_000u64).step_by(13) {
            assert_eq!(r.get(i % 7, &fp(i)).unwrap(), Some(100 + i % 3));
            // Another old place of the same fingerprint names the copy too.
            assert_eq!(r.get(50, &fp(i)).unwrap(), Some(100 + i % 3));
        }
        assert_eq!(r.get(3, &fp(9_999)).unwrap(), Some(3));
        assert_eq!(r.get(4, &fp(9_999)).unwrap(), None);
        assert_eq!(r.copy_of(&fp(9_999)).unwrap(), None);
        assert_eq!(r.homes(3).unwrap(), &BTreeSet::from([3, 100, 101, 102]));
        let shared = r.clone();
        assert!(
            r.insert((1, fp(1)), 2).is_err(),
            "shared relocations are frozen"
        );
        assert!(!shared.is_empty());
    }
}
