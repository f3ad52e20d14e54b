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
use crate::delta;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap};
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::layout::container::{self, Container, ContainerId};
use crate::layout::lifecycle::format::{self, ReadLog};
use crate::repo::Repository;
use lru::LruCache;
use serde::Serialize;
use std::io::Write;
use std::num::NonZeroUsize;
use std::sync::Arc;

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
struct Sink<'a> {
    out: &'a mut dyn Write,
    offset: u64,
    lost: Vec<LostRange>,
    progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl Sink<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
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
    fn lose(&mut self, len: u64, e: Error) -> Result<()> {
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

/// Salvages `chunks` of backup `id` (container layout) into `out`. Returns
/// (chunks written whole, containers read, lost ranges).
pub(crate) fn salvage_containers(
    repo: &Repository,
    id: BackupId,
    chunks: &[ChunkRef],
    out: &mut dyn Write,
    cache_containers: usize,
    progress: Option<&(dyn Fn(u64) + Sync)>,
) -> Result<(u64, u64, Vec<LostRange>)> {
    let algo = repo.fingerprinter();
    let backend = repo.backend().as_ref();
    let mut cache: LruCache<ContainerId, std::result::Result<Arc<Container>, Arc<Error>>> =
        LruCache::new(NonZeroUsize::new(cache_containers.max(2)).unwrap_or(NonZeroUsize::MIN));
    let mut reads = 0u64;
    let mut load = |cid: ContainerId| -> Result<Arc<Container>> {
        if cache.get(&cid).is_none() {
            reads += 1;
            let loaded = backend
                .read(&container::key(cid))
                // Every chunk is verified by its fingerprint below: a
                // damaged byte loses its chunk only.
                .and_then(|bytes| Container::parse_unchecked_data(cid, bytes))
                .map(Arc::new)
                .map_err(Arc::new);
            cache.put(cid, loaded);
        }
        match cache.get(&cid) {
            Some(Ok(ct)) => Ok(ct.clone()),
            Some(Err(e)) => Err(clone_error(e)),
            None => Err(Error::Pipeline("salvage cache lost a container".into())),
        }
    };
    let mut sink = Sink {
        out,
        offset: 0,
        lost: Vec::new(),
        progress,
    };
    let mut whole = 0u64;
    let mut found = Found::default();
    for c in chunks {
        let bytes = (|| -> Result<Vec<u8>> {
            let ct = load(c.container)?;
            let i = ct.find(&c.fp).ok_or_else(|| Error::MissingChunk {
                backup: id,
                container: c.container,
                fingerprint: c.fp.to_string(),
            })?;
            let bytes = match ct.base(i) {
                None => ct.entry(i)?.into_owned(),
                Some(base) => {
                    let bc = load(base.container)?;
                    let j = bc
                        .find(&base.fp)
                        .filter(|&j| bc.base(j).is_none())
                        .ok_or_else(|| {
                            Error::corrupt(
                                container::key(c.container),
                                format!("chunk {} is a delta whose base {} is not stored whole in container {:016x}", c.fp, base.fp, base.container),
                            )
                        })?;
                    delta::decode(&bc.entry(j)?, &ct.entry(i)?).map_err(|e| {
                        Error::corrupt(
                            container::key(c.container),
                            format!("delta of chunk {}: {e}", c.fp),
                        )
                    })?
                }
            };
            c.verify(algo, &bytes)?;
            Ok(bytes)
        })();
        match bytes {
            Ok(b) => {
                sink.write(&b)?;
                whole += 1;
            }
            Err(e) => {
                match &e {
                    Error::NotFound(_) => found.whole.insert(c.container),
                    e if e.lost_reason() == Some("damaged") => {
                        found.chunks.insert((c.container, c.fp))
                    }
                    _ => false,
                };
                sink.lose(u64::from(c.len), e)?
            }
        }
    }
    found.quarantine(backend);
    Ok((whole, reads, sink.lost))
}

/// Damage a restore found in the container layout: missing containers and
/// damaged chunks.
#[derive(Default)]
struct Found {
    whole: std::collections::BTreeSet<ContainerId>,
    chunks: std::collections::BTreeSet<(ContainerId, Fingerprint)>,
}

impl Found {
    /// Records the damage in the quarantine (FORMAT.md §10.8), so that no
    /// later backup deduplicates against it. Best effort: a restore from a
    /// repository it cannot write to still restores (or fails) as it would.
    fn quarantine(self, backend: &dyn Backend) {
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
fn clone_error(e: &Error) -> Error {
    match e {
        Error::NotFound(k) => Error::NotFound(k.clone()),
        Error::Corrupt { object, detail } => Error::corrupt(object.clone(), detail.clone()),
        e if e.lost_reason().is_some() => Error::corrupt("container", e.to_string()),
        e => Error::Pipeline(e.to_string()),
    }
}

/// Where a lifecycle chunk is stored: object key, absolute offset, stored
/// length, and whether it is an encoded entry.
struct Loc {
    key: Arc<str>,
    offset: u64,
    len: u32,
    encoded: bool,
}

/// Salvages `chunks` of lifecycle-layout backup `id` into `out`: every
/// required object whose header and chunk metadata can be read lists where
/// chunks are; each chunk is read from the first of its locations that
/// verifies. Returns (chunks written whole, objects read, lost ranges).
pub(crate) fn salvage_lifecycle(
    repo: &Repository,
    id: BackupId,
    chunks: &[ChunkRef],
    out: &mut dyn Write,
    progress: Option<&(dyn Fn(u64) + Sync)>,
) -> Result<(u64, u64, Vec<LostRange>)> {
    let algo = repo.fingerprinter();
    let backend = repo.backend().as_ref();
    let (lineage, _, required) = crate::layout::lifecycle::locate(repo, id)?;
    // Chunks with a damaged copy, or without any intact one: quarantined.
    let mut bad: std::collections::BTreeSet<Fingerprint> = Default::default();
    let mut log = ReadLog::default();
    let mut wanted: FingerprintMap<Vec<Loc>> = chunks.iter().map(|c| (c.fp, Vec::new())).collect();
    let mut unreadable: Vec<Error> = Vec::new();
    for req in &required {
        let header = match crate::layout::lifecycle::header_if_exists(backend, &req.key, &mut log) {
            Ok(Some(h)) => h,
            Ok(None) => continue,
            Err(e) if e.lost_reason().is_some() => {
                unreadable.push(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let key: Arc<str> = req.key.as_str().into();
        for idx in 0..req.prefix(&header) {
            let metas = match format::read_meta(backend, &req.key, &header, idx, &mut log) {
                Ok(m) => m,
                Err(e) if e.lost_reason().is_some() => {
                    unreadable.push(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut offset = header.data_offset(idx);
            for (fp, len) in metas {
                if let Some(locs) = wanted.get_mut(&fp) {
                    locs.push(Loc {
                        key: key.clone(),
                        offset,
                        len,
                        encoded: header.encoded,
                    });
                }
                offset += u64::from(len);
            }
        }
    }
    let mut sink = Sink {
        out,
        offset: 0,
        lost: Vec::new(),
        progress,
    };
    let mut whole = 0u64;
    for c in chunks {
        let mut last: Option<Error> = None;
        let mut found = None;
        for loc in wanted.get(&c.fp).map(Vec::as_slice).unwrap_or_default() {
            if loc.len != c.len && !loc.encoded {
                continue;
            }
            let read = log
                .read(backend, &loc.key, loc.offset, u64::from(loc.len))
                .and_then(|b| {
                    format::decode_entry(loc.encoded, &loc.key, &c.fp, &b).map(|d| d.into_owned())
                });
            match read {
                Ok(b) if b.len() == c.len as usize && algo.hash(&b) == c.fp => {
                    found = Some(b);
                    break;
                }
                Ok(b) => {
                    bad.insert(c.fp);
                    last = Some(Error::ObjectChunkMismatch {
                        object: loc.key.to_string(),
                        fingerprint: c.fp.to_string(),
                        actual: algo.hash(&b).to_string(),
                    })
                }
                Err(e) if e.lost_reason().is_some() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        match found {
            Some(b) => {
                sink.write(&b)?;
                whole += 1;
            }
            None => {
                bad.insert(c.fp);
                let e = last
                    .or_else(|| unreadable.first().map(clone_error))
                    .unwrap_or_else(|| not_found(id, &c.fp));
                sink.lose(u64::from(c.len), e)?;
            }
        }
    }
    if !bad.is_empty() {
        // Best effort, as for containers.
        let _ = crate::repo::quarantine::record_lineage(backend, &lineage.name, bad);
    }
    Ok((whole, log.objects.len() as u64, sink.lost))
}

fn not_found(id: BackupId, fp: &Fingerprint) -> Error {
    Error::ChunkNotInCategories {
        backup: id,
        version: 0,
        lineage: String::new(),
        fingerprint: fp.to_string(),
        searched: "every readable object of its version".into(),
    }
}
