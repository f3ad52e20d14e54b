//! Totals over a repository, whatever its layout (`tessera stats`):
//! backups, logical and stored bytes, containers or parts, and the ratios.
//!
//! The compression ratio is measured on what is stored, not taken from the
//! backups' statistics: a backup's statistics count the chunks *it* stored,
//! so once the backup that stored a chunk is forgotten, the chunk — still
//! used by later backups — would drop out of a sum over the retained
//! backups, and the ratios would differ from those of a copy of the same
//! backups. Here every chunk the retained backups reference is counted as
//! stored, once per stored copy: its own length (from the recipes) against
//! the length of its stored entry (from the container or category
//! metadata). A repository that does not compress needs no such walk.

use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use crate::format::snapshot::BackupId;
use crate::layout::container::{self, ContainerId};
use crate::repo::{RepoTotals, Repository};
use crate::util::sorted_pairs::{Record, Sorter};
use crate::util::spill::DEFAULT_SORT_BUDGET;
use std::io::Write;

/// Totals over the whole repository (each layout counts its own, see
/// [`crate::layout::totals`]).
pub fn totals(repo: &Repository) -> Result<RepoTotals> {
    crate::layout::totals(repo)
}

pub use crate::repo::StoredBytes as Stored;

/// One reference of a recipe: container, fingerprint, chunk length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Reference(ContainerId, Fingerprint, u32);

impl Record for Reference {
    const LEN: usize = 8 + FINGERPRINT_LEN + 4;
    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.0.to_le_bytes())?;
        w.write_all(&self.1 .0)?;
        w.write_all(&self.2.to_le_bytes())
    }
    fn read_from(b: &[u8]) -> Self {
        let mut fp = [0u8; FINGERPRINT_LEN];
        fp.copy_from_slice(&b[8..8 + FINGERPRINT_LEN]);
        Reference(
            u64_at(b),
            Fingerprint(fp),
            u32_at(&b[8 + FINGERPRINT_LEN..]),
        )
    }
}

fn u64_at(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

/// Container layout: the distinct (container, chunk) references of the
/// backups `ids`, sorted in bounded memory, then each container's
/// metadata for the stored lengths. A container whose metadata cannot be
/// read is left out (`check` reports it).
pub(crate) fn container_compression(repo: &Repository, ids: &[BackupId]) -> Result<Stored> {
    let mut refs = Sorter::<Reference>::with_budget(DEFAULT_SORT_BUDGET);
    for &id in ids {
        for c in &repo.recipe(id)?.chunks {
            refs.push(Reference(c.container, c.fp, c.len))?;
        }
    }
    let refs = refs.finish()?;
    let mut stream = refs.stream()?;
    let mut total = Stored::default();
    let mut group: Vec<(Fingerprint, u32)> = Vec::new();
    let mut current = None;
    loop {
        let next = stream.next()?;
        if current.is_some() && next.map(|r| r.0) != current {
            if let Some(cid) = current {
                add_container(repo, cid, &group, &mut total)?;
            }
            group.clear();
        }
        let Some(Reference(cid, fp, len)) = next else {
            return Ok(total);
        };
        current = Some(cid);
        group.push((fp, len));
    }
}

/// Adds the chunks `used` (fingerprint, own length) of container `cid`.
fn add_container(
    repo: &Repository,
    cid: ContainerId,
    used: &[(Fingerprint, u32)],
    total: &mut Stored,
) -> Result<()> {
    let Some((_, metas)) = unless_damaged(container::read_meta(repo.backend().as_ref(), cid))?
    else {
        return Ok(());
    };
    let stored: std::collections::HashMap<Fingerprint, u32> =
        metas.iter().map(|m| (m.fp, m.len)).collect();
    for (fp, len) in used {
        if let Some(&entry) = stored.get(fp) {
            total.plain += u64::from(*len);
            total.stored += u64::from(entry);
        }
    }
    Ok(())
}

/// `r`, or `None` when it failed on a missing, damaged or unknown object
/// (which `check` reports; totals leave it out).
pub(crate) fn unless_damaged<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(
            Error::NotFound(_)
            | Error::Corrupt { .. }
            | Error::Authentication { .. }
            | Error::UnsupportedVersion { .. },
        ) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A chunk stored in a lifecycle object: fingerprint, a number unique to
/// the copy, the stored entry's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct StoredCopy(pub Fingerprint, pub u64, pub u32);

impl Record for StoredCopy {
    const LEN: usize = FINGERPRINT_LEN + 8 + 4;
    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.0 .0)?;
        w.write_all(&self.1.to_le_bytes())?;
        w.write_all(&self.2.to_le_bytes())
    }
    fn read_from(b: &[u8]) -> Self {
        let mut fp = [0u8; FINGERPRINT_LEN];
        fp.copy_from_slice(&b[..FINGERPRINT_LEN]);
        let rest = &b[FINGERPRINT_LEN..];
        StoredCopy(Fingerprint(fp), u64_at(rest), u32_at(&rest[8..]))
    }
}

/// A sorter of the chunks stored in lifecycle objects, within the default budget.
pub(crate) fn stored_copies() -> Sorter<StoredCopy> {
    Sorter::with_budget(DEFAULT_SORT_BUDGET)
}

/// Lifecycle layout: the `copies` stored (every chunk of every category
/// part and volume part) joined by fingerprint with the chunks of the
/// backups `ids` (a chunk NDF stored again is counted once per copy; a
/// copy no backup uses is left out).
pub(crate) fn lifecycle_compression(
    repo: &Repository,
    ids: &[BackupId],
    copies: Sorter<StoredCopy>,
) -> Result<Stored> {
    let mut used = Sorter::<(Fingerprint, u64)>::with_budget(DEFAULT_SORT_BUDGET);
    for &id in ids {
        for c in &repo.recipe(id)?.chunks {
            used.push((c.fp, u64::from(c.len)))?;
        }
    }
    let (used, copies) = (used.finish()?, copies.finish()?);
    let (mut used, mut copies) = (used.stream()?, copies.stream()?);
    let mut total = Stored::default();
    while let Some(StoredCopy(fp, _, entry)) = copies.next()? {
        while used.peek()?.is_some_and(|(u, _)| u < fp) {
            used.next()?;
        }
        if let Some((u, len)) = used.peek()? {
            if u == fp {
                total.plain += len;
                total.stored += u64::from(entry);
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_sort_by_their_first_field() {
        let fp = |b: u8| Fingerprint([b; FINGERPRINT_LEN]);
        let r = Reference(7, fp(3), 0xdead_beef);
        let mut bytes = Vec::new();
        r.write_to(&mut bytes).unwrap();
        assert_eq!(bytes.len(), Reference::LEN);
        assert_eq!(Reference::read_from(&bytes), r);
        let c = StoredCopy(fp(9), u64::MAX - 1, 12345);
        let mut bytes = Vec::new();
        c.write_to(&mut bytes).unwrap();
        assert_eq!(bytes.len(), StoredCopy::LEN);
        assert_eq!(StoredCopy::read_from(&bytes), c);
        assert!(Reference(1, fp(9), 0) < Reference(2, fp(0), 0));
        assert!(StoredCopy(fp(1), 9, 0) < StoredCopy(fp(2), 0, 0));
    }
}
