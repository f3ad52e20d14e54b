//! Version `v`'s NDF table read as a sorted stream of fingerprints: the
//! stored table or, when it is missing or damaged (it is derived data), the
//! same fingerprints rebuilt from the recipe of the version's backup (the
//! table is exactly the distinct fingerprints of that recipe).

use super::format::NdfReader;
use super::{ndf_key, Lineage};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder};
use crate::repo::Repository;

/// A set of fingerprints (one NDF table in memory).
pub(crate) type FpSet = hashbrown::HashSet<Fingerprint, FingerprintHashBuilder>;

/// The next fingerprint of a table in byte order, `None` after the last.
pub(crate) type NextFp<'a> = &'a mut dyn FnMut() -> Result<Option<Fingerprint>>;

/// Whether `e`, reading a stored NDF table, means the table is unusable
/// (missing, damaged or of an unknown version): it is then rebuilt.
fn unusable(e: &Error) -> bool {
    matches!(e, Error::NotFound(_) | Error::UnsupportedVersion { .. }) || e.is_damage()
}

/// Calls `consume` with the fingerprints of version `v`'s NDF table of
/// `lineage`, in byte order, each once, and returns what it returns; `None`
/// if neither the table nor the version's recipe is readable.
///
/// The stored table is streamed (a window at a time): when it turns out
/// damaged part-way, what `consume` returned is dropped and it is called
/// again with the recipe's fingerprints, so `consume` must not act on the
/// fingerprints before it returns (only then is the table's checksum
/// checked). The recipe is held in memory, as every recipe reader does.
pub(crate) fn with_table<T>(
    repo: &Repository,
    lineage: &Lineage,
    v: u64,
    mut consume: impl FnMut(NextFp) -> Result<T>,
) -> Result<Option<T>> {
    let key = ndf_key(&lineage.name, v);
    match NdfReader::open(repo.backend().as_ref(), &key) {
        Ok(mut reader) => {
            let mut damaged = false;
            let mut next = || match reader.next() {
                Err(e) if unusable(&e) => {
                    damaged = true;
                    Ok(None)
                }
                r => r,
            };
            let out = consume(&mut next)?;
            // The checksum is checked at the end: read to it.
            while next()?.is_some() {}
            if !damaged {
                return Ok(Some(out));
            }
        }
        Err(e) if unusable(&e) => {}
        Err(e) => return Err(e),
    }
    let Some(recipe) = lineage
        .state
        .backup_of(v)
        .and_then(|id| repo.recipe(id).ok())
    else {
        return Ok(None);
    };
    let mut fps: Vec<Fingerprint> = recipe.chunks.iter().map(|c| c.fp).collect();
    drop(recipe);
    fps.sort_unstable();
    fps.dedup();
    let mut fps = fps.into_iter();
    consume(&mut || Ok(fps.next())).map(Some)
}

/// Version `v`'s NDF table of `lineage` as a set in memory (see
/// [`with_table`]). `None` if neither the table nor the recipe is readable.
pub(crate) fn load_table(repo: &Repository, lineage: &Lineage, v: u64) -> Result<Option<FpSet>> {
    with_table(repo, lineage, v, |next| {
        let mut set = FpSet::default();
        while let Some(fp) = next()? {
            set.insert(fp);
        }
        Ok(set)
    })
}
