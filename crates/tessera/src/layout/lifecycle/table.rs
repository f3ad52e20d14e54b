//! Version `v`'s NDF table read as a sorted stream of fingerprints: the
//! stored table or, when it is missing or damaged (it is derived data), the
//! same fingerprints rebuilt from the recipe of the version's backup (the
//! table is exactly the distinct fingerprints of that recipe, streamed and
//! sorted in bounded memory).

use super::format::NdfReader;
use super::{ndf_key, Lineage};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder};
use crate::format::recipe_reader::for_each_ref;
use crate::repo::Repository;
use crate::util::sorted_pairs::Sorter;

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
/// checked). The recipe is streamed too, its fingerprints sorted in
/// `budget` bytes of memory.
pub(crate) fn with_table<T>(
    repo: &Repository,
    lineage: &Lineage,
    v: u64,
    budget: u64,
    mut consume: impl FnMut(NextFp) -> Result<T>,
) -> Result<Option<T>> {
    let backend = repo.backend().as_ref();
    let key = ndf_key(&lineage.name, v);
    match NdfReader::open(backend, &key) {
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
    let Some(id) = lineage.state.backup_of(v) else {
        return Ok(None);
    };
    let mut fps = Sorter::<Fingerprint>::with_budget(budget);
    // An error sorting (local disk) is not the recipe's.
    let mut sorting: Option<Error> = None;
    let read = for_each_ref(backend, id, |c| {
        fps.push(c.fp).map_err(|e| {
            let pass = Error::Pipeline(format!("sorting the fingerprints of backup {id}: {e}"));
            sorting = Some(e);
            pass
        })
    });
    if let Some(e) = sorting {
        return Err(e);
    }
    if read.is_err() {
        return Ok(None);
    }
    let fps = fps.finish()?;
    let mut stream = fps.stream()?;
    consume(&mut || stream.next()).map(Some)
}
