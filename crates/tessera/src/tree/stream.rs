//! Reading a tree backup's catalog as its chunks are restored: entries are
//! decoded one by one, so memory does not grow with the tree.

use super::catalog::{check_version, CatalogReader, Entry};
use super::catalog_read::read_catalog_chunks;
use crate::config::Layout;
use crate::error::{Error, Result};
use crate::pipe::pipe;
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions, RestoreStats};
use crate::snapshot::{self, BackupId, ChunkRef, TreeRef};

/// The tree record of backup `id`, checked to be one this build reads.
pub fn tree_of(repo: &Repository, id: BackupId) -> Result<TreeRef> {
    let tree = repo.snapshot(id)?.tree.ok_or(Error::NotATree(id))?;
    check_version(tree.catalog_version, &format!("catalog of backup {id}"))?;
    Ok(tree)
}

/// Calls `f` with every catalog entry of tree backup `id` in order, until it
/// returns `false`; returns the metrics of restoring the catalog's chunks
/// (in the container layout, read by ranges: [`read_catalog_chunks`]).
/// `chunks` is the backup's recipe (its catalog chunks are read).
pub fn for_each_entry(
    repo: &Repository,
    id: BackupId,
    tree: &TreeRef,
    chunks: &[ChunkRef],
    mut f: impl FnMut(Entry) -> Result<bool>,
) -> Result<RestoreStats> {
    let first = usize::try_from(tree.catalog_chunk).unwrap_or(usize::MAX);
    let catalog = chunks.get(first..).ok_or_else(|| {
        Error::corrupt(
            snapshot::recipe_key(id),
            format!(
                "the catalog starts at chunk {first}, beyond the recipe's {}",
                chunks.len()
            ),
        )
    })?;
    let (mut out, input) = pipe(8);
    std::thread::scope(|s| {
        let reader = s.spawn(move || {
            let ranged = repo.config().layout == Layout::Container && !repo.config().trace;
            let restored = match ranged {
                true => read_catalog_chunks(repo, id, catalog, &mut out)?,
                false => {
                    let range = first..chunks.len();
                    let ranges = std::slice::from_ref(&range);
                    restore_selection(repo, id, ranges, &mut out, &RestoreOptions::default())?
                }
            };
            out.finish();
            Ok(restored)
        });
        let name = format!("catalog of backup {id}");
        let parsed = (|| -> Result<()> {
            let mut catalog = CatalogReader::new(input, &name)?;
            while let Some(entry) = catalog.next_entry()? {
                if !f(entry)? {
                    break;
                }
            }
            Ok(())
        })();
        // The reader ends when its pipe closes (here, on an early stop).
        let restored = reader
            .join()
            .map_err(|_| Error::Pipeline("catalog reader thread panicked".into()))?;
        parsed?;
        restored.or_else(|e| match e {
            // The listing stopped early and closed the pipe.
            Error::Output { .. } => Ok(RestoreStats::default()),
            e => Err(e),
        })
    })
}
