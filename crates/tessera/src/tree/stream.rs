//! Reading a tree backup's catalog as its chunks are restored: entries are
//! decoded one by one, so memory does not grow with the tree; with a
//! catalog index (version 3), only the regions that can hold one path.

use super::catalog::{check_version, is_ancestor, read_index, CatalogReader, Entry, Region};
use super::catalog_order;
use crate::error::{Error, Result};
use crate::format::snapshot::{self, BackupId, ChunkRef, TreeRef};
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions, RestoreStats};
use crate::util::pipe::pipe;
use std::cmp::Ordering;
use std::io::{Read, Write};
use std::ops::Range;

/// Bytes of a catalog's frame after its last record: terminator, count, CRC.
const TRAILER: u64 = 1 + 8 + 4;

/// The tree record of backup `id`, checked to be one this build reads.
pub fn tree_of(repo: &Repository, id: BackupId) -> Result<TreeRef> {
    let tree = repo.snapshot(id)?.tree.ok_or(Error::NotATree(id))?;
    check_version(tree.catalog_version, &format!("catalog of backup {id}"))?;
    Ok(tree)
}

/// Which part of a catalog a reading covers: the whole catalog, or (with an
/// index, docs/FORMAT.md §24.4) the regions that can hold one path and
/// what lies below it.
#[derive(Debug, Default)]
pub struct Scope {
    /// The directory records of the ancestors of the part's first record,
    /// outermost first (read before it).
    ancestors: Vec<Entry>,
    /// The part's catalog chunks (none: the whole catalog)...
    part: Option<Part>,
    /// Stream offset of the first file's bytes in the part.
    pub data_offset: u64,
    /// The metrics of reading the index.
    pub index: RestoreStats,
}

#[derive(Debug)]
struct Part {
    /// The recipe's chunks covering it.
    chunks: Range<usize>,
    /// Bytes of the first chunk before it.
    skip: u64,
    /// Its length.
    len: u64,
}

/// The chunks of backup `id`'s catalog (not its index), checked against the recipe.
fn catalog_chunks(id: BackupId, tree: &TreeRef, chunks: &[ChunkRef]) -> Result<Range<usize>> {
    let first = usize::try_from(tree.catalog_chunk).unwrap_or(usize::MAX);
    let end = match tree.index_bytes {
        0 => chunks.len(),
        _ => usize::try_from(tree.index_chunk).unwrap_or(usize::MAX),
    };
    if first > end || end > chunks.len() {
        return Err(Error::corrupt(
            snapshot::recipe_key(id),
            format!(
                "the catalog spans chunks {first} to {end}, the recipe has {}",
                chunks.len()
            ),
        ));
    }
    Ok(first..end)
}

/// Restores the chunks `range` of backup `id` into `out` (in the container
/// layout by ranges of containers: [`read_catalog_chunks`]).
fn read_chunks(
    repo: &Repository,
    id: BackupId,
    chunks: &[ChunkRef],
    range: Range<usize>,
    out: &mut dyn Write,
) -> Result<RestoreStats> {
    if let Some(stats) = crate::layout::read_chunks_ranged(repo, id, &chunks[range.clone()], out)? {
        return Ok(stats);
    }
    let ranges = std::slice::from_ref(&range);
    restore_selection(repo, id, ranges, out, &RestoreOptions::default())
}

/// The recipe's chunks `range` (a segment's, starting at its byte 0)
/// covering its bytes `[start, end)`, with the bytes of the first before
/// `start`.
fn covering(
    id: BackupId,
    chunks: &[ChunkRef],
    range: Range<usize>,
    start: u64,
    end: u64,
) -> Result<Part> {
    let mut at = 0u64;
    let mut first: Option<(usize, u64)> = None;
    let mut last = range.start;
    for k in range {
        let len = u64::from(chunks[k].len);
        if first.is_none() && start < at + len {
            first = Some((k, start - at));
        }
        at += len;
        last = k + 1;
        if at >= end {
            break;
        }
    }
    match (first, at >= end) {
        (Some((from, skip)), true) => Ok(Part {
            chunks: from..last,
            skip,
            len: end - start,
        }),
        _ => Err(Error::corrupt(
            snapshot::recipe_key(id),
            format!("the chunks end before byte {end} of the catalog or its index"),
        )),
    }
}

/// The regions of tree backup `id`'s index that a reading of `path` needs
/// (docs/FORMAT.md §24.4): with index pages (version 4), those of the
/// pages that can hold them only; all of them otherwise.
fn regions_for(
    repo: &Repository,
    id: BackupId,
    tree: &TreeRef,
    chunks: &[ChunkRef],
    path: &[u8],
) -> Result<(Vec<Region>, RestoreStats)> {
    let name = format!("catalog index of backup {id}");
    let index = catalog_chunks(id, tree, chunks)?.end..chunks.len();
    let records_end = tree.catalog_bytes.saturating_sub(TRAILER);
    let mut firsts = Vec::with_capacity(tree.index_pages.len());
    for p in &tree.index_pages {
        firsts.push(hex::decode(&p.path).map_err(|e| {
            Error::corrupt(snapshot::snapshot_key(id), format!("index page path: {e}"))
        })?);
    }
    let pages: Vec<u64> = match tree.index_pages.is_empty() {
        true => vec![tree.index_bytes],
        false => tree.index_pages.iter().map(|p| p.bytes).collect(),
    };
    if pages.iter().sum::<u64>() != tree.index_bytes {
        return Err(Error::corrupt(
            &name,
            format!("its pages do not add up to its {} bytes", tree.index_bytes),
        ));
    }
    // The last page starting at or before `path`, and the pages after it
    // that start below `path`.
    let (from, to) = match firsts.is_empty() {
        true => (0, 1),
        false => {
            let from = firsts
                .partition_point(|f| catalog_order(f, path) != Ordering::Greater)
                .saturating_sub(1);
            let to = (from + 1..firsts.len())
                .find(|&k| !is_ancestor(path, &firsts[k]))
                .unwrap_or(firsts.len());
            (from, to)
        }
    };
    let start: u64 = pages[..from].iter().sum();
    let end: u64 = start + pages[from..to].iter().sum::<u64>();
    let part = covering(id, chunks, index, start, end)?;
    let mut bytes = Vec::new();
    let stats = read_chunks(repo, id, chunks, part.chunks.clone(), &mut bytes)?;
    let mine = usize::try_from(part.skip)
        .ok()
        .and_then(|s| bytes.get(s..s + usize::try_from(part.len).ok()?))
        .ok_or_else(|| Error::corrupt(&name, "truncated"))?;
    let mut regions = Vec::new();
    let mut at = 0usize;
    for &len in &pages[from..to] {
        let page = mine
            .get(at..at + len as usize)
            .ok_or_else(|| Error::corrupt(&name, "truncated"))?;
        regions.extend(read_index(page, &name, tree.catalog_version, records_end)?);
        at += len as usize;
    }
    Ok((regions, stats))
}

/// The part of tree backup `id`'s catalog a reading of `path` (a catalog
/// path) and what lies below it needs: with an index, the regions that can
/// hold them (the index, or the pages of it that can list them, is read);
/// the whole catalog otherwise (an older catalog, or the root).
pub fn scope_of(
    repo: &Repository,
    id: BackupId,
    tree: &TreeRef,
    chunks: &[ChunkRef],
    path: &[u8],
) -> Result<Scope> {
    if tree.index_bytes == 0 || path.is_empty() {
        return Ok(Scope::default());
    }
    let catalog = catalog_chunks(id, tree, chunks)?;
    let name = format!("catalog index of backup {id}");
    let (regions, index) = regions_for(repo, id, tree, chunks, path)?;
    // The last region starting at or before `path`, and the regions after
    // it that start below `path`.
    let first = regions
        .partition_point(|r| catalog_order(&r.path, path) != Ordering::Greater)
        .saturating_sub(1);
    let Some(region) = regions.get(first) else {
        return Err(Error::corrupt(&name, "no regions"));
    };
    let end_region = (first + 1..regions.len())
        .find(|&k| !is_ancestor(path, &regions[k].path))
        .unwrap_or(regions.len());
    let records_end = tree.catalog_bytes.saturating_sub(TRAILER);
    let (start, end) = (region.offset, regions[end_region - 1].end);
    if start < 8 || start >= end || end > records_end {
        return Err(Error::corrupt(
            &name,
            format!("region {start}..{end} outside the catalog's records (8..{records_end})"),
        ));
    }
    Ok(Scope {
        ancestors: region.ancestors.clone(),
        part: Some(covering(id, chunks, catalog, start, end)?),
        data_offset: region.data_offset,
        index,
    })
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
    f: impl FnMut(Entry) -> Result<bool>,
) -> Result<RestoreStats> {
    for_each_entry_in(repo, id, tree, chunks, &Scope::default(), f)
}

/// [`for_each_entry`] over the part `scope` of the catalog: its ancestors'
/// directory records, then its records (with the whole catalog's scope,
/// every record).
pub fn for_each_entry_in(
    repo: &Repository,
    id: BackupId,
    tree: &TreeRef,
    chunks: &[ChunkRef],
    scope: &Scope,
    mut f: impl FnMut(Entry) -> Result<bool>,
) -> Result<RestoreStats> {
    for_each_record_in(repo, id, tree, chunks, scope, |e, _| f(e))
}

/// [`for_each_entry`] with each entry's record as the catalog holds it,
/// when the catalog is of this build's version (see
/// [`super::catalog::CatalogWriter::push_record`]).
pub(crate) fn for_each_record(
    repo: &Repository,
    id: BackupId,
    tree: &TreeRef,
    chunks: &[ChunkRef],
    f: impl FnMut(Entry, Option<&[u8]>) -> Result<bool>,
) -> Result<RestoreStats> {
    for_each_record_in(repo, id, tree, chunks, &Scope::default(), f)
}

/// [`for_each_entry_in`] with the records ([`for_each_record`]; none for
/// the scope's ancestors).
fn for_each_record_in(
    repo: &Repository,
    id: BackupId,
    tree: &TreeRef,
    chunks: &[ChunkRef],
    scope: &Scope,
    mut f: impl FnMut(Entry, Option<&[u8]>) -> Result<bool>,
) -> Result<RestoreStats> {
    let range = match &scope.part {
        Some(part) => part.chunks.clone(),
        None => catalog_chunks(id, tree, chunks)?,
    };
    for e in &scope.ancestors {
        if !f(e.clone(), None)? {
            return Ok(RestoreStats::default());
        }
    }
    let (mut out, input) = pipe(8);
    std::thread::scope(|s| {
        let reader = s.spawn(move || {
            let restored = read_chunks(repo, id, chunks, range, &mut out)?;
            out.finish();
            Ok(restored)
        });
        let name = format!("catalog of backup {id}");
        let mut input = input;
        let parsed = (|| -> Result<()> {
            let mut catalog = match &scope.part {
                None => CatalogReader::new(Box::new(&mut input) as Box<dyn Read>, &name)?,
                Some(part) => {
                    let skipped =
                        std::io::copy(&mut (&mut input).take(part.skip), &mut std::io::sink())
                            .map_err(|e| Error::io(format!("reading {name}"), e))?;
                    if skipped != part.skip {
                        return Err(Error::corrupt(&name, "truncated"));
                    }
                    let region = Box::new((&mut input).take(part.len));
                    CatalogReader::region(region as Box<dyn Read>, &name, tree.catalog_version)?
                }
            };
            while let Some(entry) = catalog.next_entry()? {
                if !f(entry, catalog.record())? {
                    return Ok(());
                }
            }
            drop(catalog);
            // The rest of a part's last chunk: the reader finishes (and
            // counts what it read).
            if scope.part.is_some() {
                std::io::copy(&mut input, &mut std::io::sink())
                    .map_err(|e| Error::io(format!("reading {name}"), e))?;
            }
            Ok(())
        })();
        drop(input);
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
