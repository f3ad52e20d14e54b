//! Salvage restore from lifecycle categories (see
//! [`crate::restore::salvage`]): every chunk located through the lineage's
//! category tables and verified.

use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap};
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::layout::lifecycle::format::{self, ReadLog};
use crate::repo::Repository;
use crate::restore::salvage::{clone_error, not_found, LostRange, Sink};
use std::io::Write;
use std::sync::Arc;

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
pub(crate) fn salvage(
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
