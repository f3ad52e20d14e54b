//! The parent backup of a tree backup: its catalog read alongside the walk
//! (both in catalog order) to find unchanged files, and its chunks fetched
//! again when a back end must store a reused chunk after all.

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::layout::stream::Refetch;
use crate::layout::Reusable;
use crate::repo::quarantine::Quarantined;
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions};
use crate::tree::catalog::Entry;
use crate::tree::catalog_order;
use crossbeam_channel::Receiver;
use std::collections::{HashSet, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// The chunks of the parent backup's unchanged files, and their bytes when
/// a back end must store them after all: restored from the repository
/// (verified against their fingerprints), not read from the files.
pub(super) struct ParentChunks<'r> {
    pub(super) repo: &'r Repository,
    pub(super) parent: BackupId,
    pub(super) chunks: std::sync::Arc<Vec<ChunkRef>>,
    /// Reused files in stream order: (offset in this stream, first chunk in
    /// the parent's recipe, chunks), dropped once the back end passed them.
    pub(super) files: Mutex<VecDeque<(u64, usize, usize)>>,
    /// Chunks restored ahead: the first one's recipe position and each one's bytes.
    pub(super) ahead: Mutex<(usize, Vec<Vec<u8>>)>,
}

/// Bytes of reused chunks restored at once when a back end needs them (the
/// rest of the file, up to this much): one restore per run, not per chunk.
pub(super) const FETCH_AHEAD: u64 = 8 << 20;

impl Refetch for ParentChunks<'_> {
    fn bytes(&self, offset: u64, fp: &Fingerprint, len: u32) -> Result<Vec<u8>> {
        let at = {
            let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
            let mut found = None;
            while let Some(&(start, first, count)) = files.front() {
                let mut o = start;
                let mut hit = None;
                for i in first..first + count {
                    if o == offset {
                        hit = Some((i, first + count));
                        break;
                    }
                    o += u64::from(self.chunks[i].len);
                }
                if hit.is_some() {
                    found = hit;
                    break;
                }
                if o > offset {
                    break;
                }
                // The back end asks in stream order: this file is done.
                files.pop_front();
            }
            found
        };
        let not_reused = || {
            Error::Pipeline(format!(
                "no reused chunk at byte {offset} of the stream (parent backup {})",
                self.parent
            ))
        };
        let (i, file_end) = at.ok_or_else(not_reused)?;
        let c = &self.chunks[i];
        if c.fp != *fp || c.len != len {
            return Err(not_reused());
        }
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let (first, fetched) = &mut *ahead;
        if i < *first || i >= *first + fetched.len() {
            // The chunks from `i` on to the file's end, within FETCH_AHEAD.
            let mut end = i + 1;
            let mut bytes = u64::from(len);
            while end < file_end && bytes + u64::from(self.chunks[end].len) <= FETCH_AHEAD {
                bytes += u64::from(self.chunks[end].len);
                end += 1;
            }
            let mut out = Vec::with_capacity(bytes as usize);
            // Restoring verifies every chunk against its fingerprint.
            restore_selection(
                self.repo,
                self.parent,
                std::slice::from_ref(&(i..end)),
                &mut out,
                &RestoreOptions::default(),
            )?;
            if out.len() as u64 != bytes {
                return Err(not_reused());
            }
            let mut rest = &out[..];
            fetched.clear();
            for c in &self.chunks[i..end] {
                let (one, more) = rest.split_at(c.len as usize);
                fetched.push(one.to_vec());
                rest = more;
            }
            *first = i;
        }
        Ok(std::mem::take(&mut fetched[i - *first]))
    }
}

/// Entries of the parent's catalog, with their records where the catalog
/// is of this build's version: ranges of `records`.
#[derive(Default)]
pub(super) struct ParentBatch {
    pub(super) entries: Vec<(Entry, Option<Range<usize>>)>,
    pub(super) records: Vec<u8>,
}

impl ParentBatch {
    pub(super) fn push(&mut self, entry: Entry, record: Option<&[u8]>) {
        let range = record.map(|r| {
            let start = self.records.len();
            self.records.extend_from_slice(r);
            start..self.records.len()
        });
        self.entries.push((entry, range));
    }
}

/// A record of the parent's catalog: a range of its batch's records.
pub(super) struct ParentRecord {
    pub(super) records: Arc<Vec<u8>>,
    pub(super) range: Range<usize>,
}

impl ParentRecord {
    pub(super) fn bytes(&self) -> &[u8] {
        &self.records[self.range.clone()]
    }
}

/// The parent's catalog, walked in step with the file system.
pub(super) struct ParentWalk {
    /// The parent's entries in batches, from the thread reading its catalog...
    pub(super) rx: Receiver<ParentBatch>,
    /// ...and the rest of the last batch, with its records.
    pub(super) batch: std::vec::IntoIter<(Entry, Option<Range<usize>>)>,
    pub(super) records: Arc<Vec<u8>>,
    /// The next entry not yet passed (of the last batch), and its record.
    pub(super) next: Option<(Entry, Option<Range<usize>>)>,
    /// Offset of `next` in the parent's stream.
    pub(super) offset: u64,
    pub(super) chunks: std::sync::Arc<Vec<ChunkRef>>,
    /// The first chunk at or after `offset` and where it starts.
    pub(super) chunk: usize,
    pub(super) chunk_offset: u64,
    pub(super) usable: Usable,
}

/// Which of the parent's chunks an unchanged file may reuse: not
/// quarantined, and (container layout) in a container that exists;
/// (lifecycle layout) not unusable in the source's lineage
/// ([`crate::layout::lifecycle::Lineage::unusable`]).
pub(super) struct Usable {
    pub(super) quarantine:
        std::collections::HashMap<crate::layout::container::ContainerId, Quarantined>,
    pub(super) containers: Option<HashSet<crate::layout::container::ContainerId>>,
    pub(super) lineage: Option<Quarantined>,
}

impl Usable {
    pub(super) fn of(repo: &Repository, source: &str) -> Result<Usable> {
        let backend = repo.backend().as_ref();
        let (containers, lineage) = match crate::layout::reusable(repo, source)? {
            Reusable::Containers(c) => (Some(c), None),
            Reusable::Lineage(q) => (None, Some(q)),
        };
        Ok(Usable {
            quarantine: crate::repo::quarantine::load(backend)?,
            containers,
            lineage,
        })
    }

    pub(super) fn allows(&self, c: &ChunkRef) -> bool {
        !crate::repo::quarantine::is_quarantined(&self.quarantine, c.container, &c.fp)
            && self
                .containers
                .as_ref()
                .is_none_or(|set| set.contains(&c.container))
            && self.lineage.as_ref().is_none_or(|q| !q.contains(&c.fp))
    }
}

impl ParentWalk {
    /// The parent's entry of `path` (entries before it are passed), if
    /// any, and its record if the catalog is of this build's version.
    pub(super) fn find(&mut self, path: &[u8]) -> Option<(Entry, Option<ParentRecord>)> {
        loop {
            if self.next.is_none() {
                self.next = match self.batch.next() {
                    Some(e) => Some(e),
                    None => {
                        let batch = self.rx.recv().ok()?;
                        self.batch = batch.entries.into_iter();
                        self.records = Arc::new(batch.records);
                        continue;
                    }
                };
            }
            let next = self.next.as_ref()?;
            match catalog_order(&next.0.path, path) {
                std::cmp::Ordering::Less => self.pass(),
                std::cmp::Ordering::Equal => {
                    let (e, range) = self.next.take()?;
                    if e.has_bytes() {
                        self.offset += e.size;
                    }
                    let record = range.map(|range| ParentRecord {
                        records: self.records.clone(),
                        range,
                    });
                    return Some((e, record));
                }
                std::cmp::Ordering::Greater => return None,
            }
        }
    }

    pub(super) fn pass(&mut self) {
        if let Some((e, _)) = self.next.take() {
            if e.has_bytes() {
                self.offset += e.size;
            }
        }
    }

    /// The parent's chunks of the file of `size` bytes at `offset` of its
    /// stream (which must start and end at chunk boundaries, as files are
    /// cut at their ends): the first one's position in its recipe and their count.
    pub(super) fn chunks_of(&mut self, offset: u64, size: u64) -> Option<(usize, usize)> {
        while self.chunk_offset < offset {
            let c = self.chunks.get(self.chunk)?;
            self.chunk_offset += u64::from(c.len);
            self.chunk += 1;
        }
        if self.chunk_offset != offset {
            return None;
        }
        let first = self.chunk;
        let mut end = offset;
        let mut usable = true;
        while end < offset + size {
            let c = self.chunks.get(self.chunk)?;
            usable &= self.usable.allows(c);
            end += u64::from(c.len);
            self.chunk += 1;
            self.chunk_offset = end;
        }
        if end != offset + size || !usable {
            return None;
        }
        Some((first, self.chunk - first))
    }
}
