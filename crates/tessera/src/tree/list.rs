//! Listing a tree backup's catalog (`tessera ls`).

use super::catalog::{Entry, Kind};
use super::dump::normalize_path;
use super::stream::{for_each_entry_in, scope_of, tree_of};
use crate::error::{Error, Result};
use crate::format::snapshot::BackupId;
use crate::repo::Repository;

/// Calls `f` with the catalog entries of tree backup `id` that a listing of
/// `path` shows, in catalog order: with a `path`, the entry itself if it is
/// not a directory, else its children (all its descendants when
/// `recursive`); without, the paths given to the backup (everything when
/// `recursive`). Returns how many entries were shown; fails with
/// [`Error::NotInBackup`] when `path` is not in the backup.
pub fn list_tree(
    repo: &Repository,
    id: BackupId,
    path: Option<&[u8]>,
    recursive: bool,
    mut f: impl FnMut(&Entry) -> Result<()>,
) -> Result<u64> {
    let tree = tree_of(repo, id)?;
    let chunks = repo.recipe(id)?.chunks;
    let path = path.map(|p| normalize_path(p).to_vec());
    // The root always exists; another path must be an entry.
    let mut seen = path.as_ref().is_none_or(|p| p.is_empty());
    let roots: Vec<Vec<u8>> = tree
        .paths
        .iter()
        .map(|p| p.trim_start_matches('/').as_bytes().to_vec())
        .collect();
    let scope = scope_of(
        repo,
        id,
        &tree,
        &chunks,
        path.as_deref().unwrap_or_default(),
    )?;
    let mut shown = 0u64;
    for_each_entry_in(repo, id, &tree, &chunks, &scope, |e| {
        seen |= path
            .as_ref()
            .is_some_and(|p| *p == e.path && e.kind != Kind::Gap);
        let show = match &path {
            None => recursive || roots.contains(&e.path),
            Some(p) if e.path == *p => e.kind != Kind::Dir,
            Some(p) => match e.path.strip_prefix(p.as_slice()) {
                Some(rest) if rest.first() == Some(&b'/') || p.is_empty() => {
                    let rest = rest.strip_prefix(b"/").unwrap_or(rest);
                    recursive || !rest.contains(&b'/')
                }
                _ => false,
            },
        };
        if show && e.kind != Kind::Gap {
            shown += 1;
            f(&e)?;
        }
        Ok(true)
    })?;
    if !seen {
        return Err(Error::NotInBackup {
            backup: id,
            path: format!(
                "/{}",
                String::from_utf8_lossy(path.as_deref().unwrap_or_default())
            ),
        });
    }
    Ok(shown)
}
