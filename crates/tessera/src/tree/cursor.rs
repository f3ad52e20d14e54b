//! Reading a tree backup's catalog in order: a cursor over its entries
//! (streamed, or kept in memory while it fits), and the path helpers the
//! readers share (restore, diff, dump, tar).

use super::catalog::Entry;
use super::stream::{for_each_entry_in, Scope};
use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, ChunkRef, TreeRef};
use crate::repo::Repository;
use crate::restore::RestoreStats;
use std::ops::Range;

/// Bytes of catalog entries a restore keeps from its first reading of the
/// catalog at most (beyond, it reads the catalog again for each pass).
const KEPT_BYTES: usize = 16 << 20;

/// The part of a backup's catalog a restore reads, kept in memory after
/// its first reading while it fits in [`KEPT_BYTES`].
pub(super) struct Catalog<'a> {
    pub(super) repo: &'a Repository,
    pub(super) id: BackupId,
    pub(super) tree: &'a TreeRef,
    pub(super) chunks: &'a [ChunkRef],
    pub(super) scope: &'a Scope,
    pub(super) kept: Option<Vec<Entry>>,
}

impl Catalog<'_> {
    /// Reads the catalog's part, calling `f` with each entry, and keeps the
    /// entries if they fit.
    pub(super) fn read_keeping(
        &mut self,
        mut f: impl FnMut(&Entry) -> Result<bool>,
    ) -> Result<RestoreStats> {
        let mut kept = Some((Vec::new(), 0usize));
        let s = for_each_entry_in(
            self.repo,
            self.id,
            self.tree,
            self.chunks,
            self.scope,
            |e| {
                let go = f(&e)?;
                if let Some((v, bytes)) = &mut kept {
                    *bytes += entry_bytes(&e);
                    match *bytes > KEPT_BYTES {
                        true => kept = None,
                        false => v.push(e),
                    }
                }
                Ok(go)
            },
        )?;
        self.kept = kept.map(|(v, _)| v);
        Ok(s)
    }

    /// Calls `f` with each entry of the part, until it returns `false`:
    /// those kept, or read again.
    pub(super) fn each(&self, mut f: impl FnMut(&Entry) -> Result<bool>) -> Result<RestoreStats> {
        match &self.kept {
            Some(entries) => {
                for e in entries {
                    if !f(e)? {
                        break;
                    }
                }
                Ok(RestoreStats::default())
            }
            None => for_each_entry_in(
                self.repo,
                self.id,
                self.tree,
                self.chunks,
                self.scope,
                |e| f(&e),
            ),
        }
    }
}

/// Memory an entry takes, roughly.
fn entry_bytes(e: &Entry) -> usize {
    let xattrs: usize = e
        .xattrs
        .iter()
        .map(|x| x.name.len() + x.value.len() + 48)
        .sum();
    std::mem::size_of::<Entry>()
        + e.path.len()
        + e.target.len()
        + e.user.len()
        + e.group.len()
        + xattrs
}

/// A catalog path's directory and name (`a/b/c`: `a/b` and `c`).
pub(super) fn split_path(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// Walks the recipe along the files' bytes: the chunks of each extent.
pub(super) struct Cursor<'a> {
    chunks: &'a [ChunkRef],
    index: usize,
    offset: u64,
    backup: BackupId,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of backup `backup`'s stream of `chunks`.
    pub(super) fn new(chunks: &'a [ChunkRef], backup: BackupId) -> Self {
        Cursor {
            chunks,
            index: 0,
            offset: 0,
            backup,
        }
    }

    /// A cursor at byte `offset` of backup `backup`'s stream of `chunks`
    /// (a chunk boundary: where a part of its catalog starts,
    /// [`crate::tree::stream::Scope`]).
    pub(super) fn at(chunks: &'a [ChunkRef], backup: BackupId, offset: u64) -> Result<Self> {
        let mut c = Cursor::new(chunks, backup);
        c.extent(offset)?;
        Ok(c)
    }

    /// The chunks of the next `size` bytes, which must start and end at chunk boundaries.
    pub(super) fn extent(&mut self, size: u64) -> Result<Range<usize>> {
        let start = self.index;
        let end_offset = self.offset + size;
        while self.offset < end_offset {
            let c = self.chunks.get(self.index).ok_or_else(|| self.corrupt())?;
            self.offset += u64::from(c.len);
            self.index += 1;
        }
        if self.offset != end_offset {
            return Err(self.corrupt());
        }
        Ok(start..self.index)
    }

    fn corrupt(&self) -> Error {
        Error::corrupt(
            format!("catalog of backup {}", self.backup),
            format!(
                "a file's extent does not end at a chunk boundary (byte {})",
                self.offset
            ),
        )
    }
}

/// Adds the chunks `r` to `ranges`, merged with the last range when adjacent.
pub(super) fn push_range(ranges: &mut Vec<Range<usize>>, r: Range<usize>) {
    if r.is_empty() {
        return;
    }
    match ranges.last_mut() {
        Some(last) if last.end == r.start => last.end = r.end,
        _ => ranges.push(r),
    }
}
