//! Salvage restore (`restore --skip-damaged`): every chunk that can be read
//! and verified against its fingerprint is written; the bytes of a chunk
//! that is missing or damaged are written as zeros and reported as a lost
//! range. No unverified byte is ever written.
//!
//! The salvage path is simple and sequential (a small cache of loaded
//! containers, or of lifecycle chunk locations): it runs only when a
//! backup is known or suspected to be damaged, where completeness matters
//! more than speed.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::snapshot::BackupId;
use crate::layout::container::ContainerId;
use serde::Serialize;
use std::io::Write;

/// A range of the restored output whose bytes were lost (written as zeros).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LostRange {
    /// Offset in the backup's logical bytes (of the selection, for a selection).
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// `missing` (an object holding the chunks is gone) or `damaged`.
    pub reason: String,
    /// The first error met in the range.
    pub detail: String,
}

/// Writes chunks and zeros, merging adjacent lost ranges of one reason.
pub(crate) struct Sink<'a> {
    pub(crate) out: &'a mut dyn Write,
    pub(crate) offset: u64,
    pub(crate) lost: Vec<LostRange>,
    pub(crate) progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl Sink<'_> {
    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| Error::Output {
            what: "output".into(),
            source: e,
        })?;
        self.offset += bytes.len() as u64;
        if let Some(p) = self.progress {
            p(self.offset);
        }
        Ok(())
    }

    /// Writes `len` zeros for a chunk lost because of `e` (a loss, or an
    /// error that is returned).
    pub(crate) fn lose(&mut self, len: u64, e: Error) -> Result<()> {
        let Some(reason) = e.lost_reason() else {
            return Err(e);
        };
        match self.lost.last_mut() {
            Some(last) if last.offset + last.len == self.offset && last.reason == reason => {
                last.len += len;
            }
            _ => self.lost.push(LostRange {
                offset: self.offset,
                len,
                reason: reason.into(),
                detail: e.to_string(),
            }),
        }
        let zeros = [0u8; 64 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            self.write(&zeros[..n])?;
            left -= n as u64;
        }
        Ok(())
    }
}

/// Damage a restore found in the container layout: missing containers and
/// damaged chunks.
#[derive(Default)]
pub(crate) struct Found {
    pub(crate) whole: std::collections::BTreeSet<ContainerId>,
    pub(crate) chunks: std::collections::BTreeSet<(ContainerId, Fingerprint)>,
}

impl Found {
    /// Records the damage in the quarantine (FORMAT.md §10.8), so that no
    /// later backup deduplicates against it. Best effort: a restore from a
    /// repository it cannot write to still restores (or fails) as it would.
    pub(crate) fn quarantine(self, backend: &dyn Backend) {
        for c in self.whole {
            let _ = crate::repo::quarantine::record_whole(backend, c);
        }
        let mut by_container: std::collections::BTreeMap<ContainerId, Vec<Fingerprint>> =
            Default::default();
        for (c, fp) in self.chunks {
            by_container.entry(c).or_default().push(fp);
        }
        for (c, fps) in by_container {
            let _ = crate::repo::quarantine::record(backend, c, fps);
        }
    }
}

/// A copy of a cached load error (errors are not `Clone`): damage keeps its
/// kind, anything else becomes a pipeline error with the same text.
pub(crate) fn clone_error(e: &Error) -> Error {
    match e {
        Error::NotFound(k) => Error::NotFound(k.clone()),
        Error::Corrupt { object, detail } => Error::corrupt(object.clone(), detail.clone()),
        e if e.lost_reason().is_some() => Error::corrupt("container", e.to_string()),
        e => Error::Pipeline(e.to_string()),
    }
}

pub(crate) fn not_found(id: BackupId, fp: &Fingerprint) -> Error {
    Error::ChunkNotInCategories {
        backup: id,
        version: 0,
        lineage: String::new(),
        fingerprint: fp.to_string(),
        searched: "every readable object of its version".into(),
    }
}
