//! Folding duplicate copies (docs/FORMAT.md §16.2, step 1b): a fingerprint
//! live in several containers — two backups sharing the repository stored
//! the same new chunk at once (§13.3), or a chunk was stored again after a
//! damaged copy was quarantined — keeps one copy, its *keeper*: the copy in
//! the lowest-numbered container whose metadata reads and that has no
//! quarantine record. The other copies are dead to selection, so the GC
//! that selects their containers drops them and points their backups'
//! references at the keeper (or where the keeper itself moved).
//!
//! Only in repositories that make no copy on purpose: without a rewriting
//! policy (whose copies place a chunk near its readers) and without delta
//! compression (whose bases are pinned where deltas name them).

use super::LiveSet;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::index::Relocations;
use crate::layout::container::{self, ContainerId};
use crate::repo::quarantine::Quarantined;
use crate::repo::Repository;
use crate::util::sorted_pairs::{PairSorter, SortedPairs, Sorter};
use std::collections::{BTreeSet, HashMap};

/// One copy folded away: the chunk `fp` of container `from` is the copy
/// the keeper in container `to` stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fold {
    pub from: ContainerId,
    pub fp: Fingerprint,
    pub to: ContainerId,
}

/// Whether GC folds duplicate copies in `repo` (the module's rule).
pub(super) fn applies(repo: &Repository) -> bool {
    let config = repo.config();
    config.delta.kind == crate::delta::DeltaKind::None
        && config.rewrite.kind == crate::rewrite::RewriteKind::None
}

/// The live pairs `live` without the copies folded away, and the folds
/// (none where folding does not apply). Sorts the live pairs by
/// fingerprint within `budget` bytes of memory.
pub(super) fn fold(
    repo: &Repository,
    quarantined: &HashMap<ContainerId, Quarantined>,
    live: SortedPairs,
    budget: u64,
) -> Result<(SortedPairs, Vec<Fold>)> {
    if !applies(repo) {
        return Ok((live, Vec::new()));
    }
    let mut by_fp = Sorter::<(Fingerprint, u64)>::with_budget(budget);
    let mut stream = live.stream()?;
    while let Some((c, fp)) = stream.next()? {
        by_fp.push((fp, c))?;
    }
    let by_fp = by_fp.finish()?;
    let mut stream = by_fp.stream()?;
    let mut keepers = Keepers {
        backend: repo.backend().as_ref(),
        quarantined,
        usable: HashMap::new(),
    };
    let mut folds = Vec::new();
    let mut group: Vec<ContainerId> = Vec::new();
    let mut current: Option<Fingerprint> = None;
    loop {
        let next = stream.next()?;
        if let (Some(fp), Some((f, c))) = (current, next) {
            if f == fp {
                group.push(c);
                continue;
            }
        }
        if let Some(fp) = current {
            keepers.fold_group(fp, &group, &mut folds)?;
        }
        let Some((f, c)) = next else { break };
        current = Some(f);
        group.clear();
        group.push(c);
    }
    if folds.is_empty() {
        return Ok((live, folds));
    }
    let away: LiveSet = folds.iter().map(|f| (f.from, f.fp)).collect();
    let mut kept = PairSorter::with_budget(budget);
    let mut stream = live.stream()?;
    while let Some(pair) = stream.next()? {
        if !away.contains(&pair) {
            kept.push(pair)?;
        }
    }
    Ok((kept.finish()?, folds))
}

/// Which containers may keep a chunk for the others.
struct Keepers<'a> {
    backend: &'a dyn Backend,
    quarantined: &'a HashMap<ContainerId, Quarantined>,
    usable: HashMap<ContainerId, bool>,
}

impl Keepers<'_> {
    /// Whether container `c` may be a keeper: its metadata reads and it
    /// holds no known damage.
    fn usable(&mut self, c: ContainerId) -> Result<bool> {
        if let Some(&u) = self.usable.get(&c) {
            return Ok(u);
        }
        let u = !self.quarantined.contains_key(&c)
            && match container::read_meta(self.backend, c) {
                Ok(_) => true,
                Err(
                    Error::Corrupt { .. }
                    | Error::Authentication { .. }
                    | Error::UnsupportedVersion { .. }
                    | Error::NotFound(_),
                ) => false,
                Err(e) => return Err(e),
            };
        self.usable.insert(c, u);
        Ok(u)
    }

    /// The folds of fingerprint `fp`, live in `containers` (ascending):
    /// every copy but the keeper's, if there is a keeper.
    fn fold_group(
        &mut self,
        fp: Fingerprint,
        containers: &[ContainerId],
        folds: &mut Vec<Fold>,
    ) -> Result<()> {
        if containers.len() < 2 {
            return Ok(());
        }
        let mut keeper = None;
        for &c in containers {
            if self.usable(c)? {
                keeper = Some(c);
                break;
            }
        }
        if let Some(to) = keeper {
            folds.extend(containers.iter().filter(|&&c| c != to).map(|&from| Fold {
                from,
                fp,
                to,
            }));
        }
        Ok(())
    }
}

/// Records in `moved` where each folded copy of a removed container went:
/// to its keeper, or, when the keeper's container was removed too, to the
/// copy this GC made of the keeper (already in `moved`). Returns the number
/// of copies folded away.
pub(super) fn relocate(
    folds: &[Fold],
    removed: &BTreeSet<ContainerId>,
    moved: &mut Relocations,
) -> Result<u64> {
    let mut folded = 0;
    for f in folds.iter().filter(|f| removed.contains(&f.from)) {
        if !removed.contains(&f.to) {
            moved.insert((f.from, f.fp), f.to)?;
        } else if moved.copy_of(&f.fp)?.is_none() {
            return Err(Error::Pipeline(format!(
                "GC folded chunk {} of container {:016x} into container {:016x} but did not copy it",
                f.fp, f.from, f.to
            )));
        }
        folded += 1;
    }
    Ok(folded)
}
