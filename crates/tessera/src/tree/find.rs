//! `tessera find`: the entries whose path matches a glob, in every tree
//! backup, newest backup first; each catalog is read as a stream.

use super::catalog::{Entry, Kind};
use super::select::Selection;
use super::stream::{for_each_entry, tree_of};
use crate::commands::list::BackupFilter;
use crate::error::Result;
use crate::format::snapshot::{BackupId, Snapshot};
use crate::repo::Repository;
use serde::Serialize;

/// Counts of a [`find`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FindStats {
    /// Tree backups searched.
    pub backups_searched: u64,
    /// Of which holding at least one match.
    pub backups_matching: u64,
    /// Entries found.
    pub matches: u64,
    /// Backups that could not be searched, each with why (a damaged
    /// snapshot or catalog); the others are searched all the same.
    pub skipped: Vec<(BackupId, String)>,
}

/// Calls `f` with every entry whose path matches `pattern` in each tree
/// backup of `repo` that `filter` takes, newest backup first and, within
/// one, in catalog order. `pattern` is a glob over paths as `ls` shows them
/// (`/home/*/docs/*.txt`, a leading `/` optional); one without `/` matches
/// a name at any depth (`*.rs`). Backups of a single stream are passed over.
pub fn find(
    repo: &Repository,
    pattern: &str,
    filter: &BackupFilter,
    mut f: impl FnMut(&Snapshot, &Entry) -> Result<()>,
) -> Result<FindStats> {
    let select = Selection::new(&[pattern.to_string()], &[])?;
    let mut stats = FindStats::default();
    for id in repo.backups()?.into_iter().rev() {
        let snap = match repo.snapshot(id) {
            Ok(s) => s,
            Err(e) => {
                stats.skipped.push((id, e.to_string()));
                continue;
            }
        };
        if snap.tree.is_none() || !filter.matches(&snap) {
            continue;
        }
        let searched = (|| -> Result<u64> {
            let tree = tree_of(repo, id)?;
            let chunks = repo.recipe(id)?.chunks;
            let mut found = 0u64;
            for_each_entry(repo, id, &tree, &chunks, |e| {
                if e.kind != Kind::Gap && select.matches_path(&e.path) {
                    found += 1;
                    f(&snap, &e)?;
                }
                Ok(true)
            })?;
            Ok(found)
        })();
        match searched {
            Ok(found) => {
                stats.backups_searched += 1;
                stats.matches += found;
                stats.backups_matching += u64::from(found > 0);
            }
            // An error of `f` (the output) ends the search.
            Err(e @ crate::Error::Output { .. }) => return Err(e),
            Err(e) => stats.skipped.push((id, e.to_string())),
        }
    }
    Ok(stats)
}
