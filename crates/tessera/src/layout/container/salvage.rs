//! Salvage restore from the container log (see [`crate::restore::salvage`]):
//! a small cache of loaded containers, every chunk verified.

use crate::delta;
use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::layout::container::{self, Container, ContainerId};
use crate::repo::Repository;
use crate::restore::salvage::{clone_error, Found, LostRange, Sink};
use lru::LruCache;
use std::io::Write;
use std::num::NonZeroUsize;
use std::sync::Arc;

/// Salvages `chunks` of backup `id` (container layout) into `out`. Returns
/// (chunks written whole, containers read, lost ranges).
pub(crate) fn salvage(
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
