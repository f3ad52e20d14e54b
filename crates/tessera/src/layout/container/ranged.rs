//! Reading a tree backup's catalog chunks by ranges of their containers'
//! data sections rather than whole containers (container layout): each run
//! of catalog chunks stored one after another in a container is one ranged
//! read, through [`crate::backend::ObjectStore::read_range_cached`], so
//! that an object store's local cache keeps it (FORMAT.md §13.2) and a
//! second `ls`, `find` or `diff` of the same backup reads no container data
//! from the store. Every chunk is verified against its fingerprint before
//! a byte of it is used.

use crate::backend::Backend;
use crate::delta;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::compression;
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::layout::container::{self, ChunkMeta, ContainerId, Header};
use crate::repo::Repository;
use crate::restore::options::RestoreStats;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::Write;

/// A container's header and where each of its chunks lies (the first
/// entry of a fingerprint stored twice, as [`container::Container::find`]).
struct Located {
    header: Header,
    by_fp: HashMap<Fingerprint, ChunkMeta>,
}

/// The containers whose metadata sections were read, by id.
struct Containers<'a> {
    backend: &'a dyn Backend,
    read: HashMap<ContainerId, Located>,
    /// Containers some data was read from.
    touched: HashSet<ContainerId>,
    /// Ranged reads of data.
    extents: u64,
}

impl Containers<'_> {
    fn locate(&mut self, id: ContainerId) -> Result<&Located> {
        if !self.read.contains_key(&id) {
            let (header, metas) = container::read_meta(self.backend, id)?;
            let mut by_fp = HashMap::with_capacity(metas.len());
            for m in metas {
                by_fp.entry(m.fp).or_insert(m);
            }
            self.read.insert(id, Located { header, by_fp });
        }
        self.read
            .get(&id)
            .ok_or_else(|| Error::Pipeline(format!("container {id:016x} lost")))
    }

    /// The metadata entry of chunk `fp` in container `id`.
    fn meta(&mut self, backup: BackupId, id: ContainerId, fp: &Fingerprint) -> Result<ChunkMeta> {
        let found = self.locate(id)?;
        if !found.header.has_data() {
            return Err(Error::corrupt(container::key(id), "no chunk data"));
        }
        found
            .by_fp
            .get(fp)
            .copied()
            .ok_or_else(|| Error::MissingChunk {
                backup,
                container: id,
                fingerprint: fp.to_string(),
            })
    }

    /// The stored bytes of `len` bytes of container `id`'s data section
    /// from `offset` (one ranged read, kept by a caching backend).
    fn data(&mut self, id: ContainerId, offset: u32, len: u64) -> Result<Vec<u8>> {
        let start = self.locate(id)?.header.data_start() as u64 + u64::from(offset);
        let key = container::key(id);
        let bytes = self.backend.read_range_cached(&key, start, len)?;
        if bytes.len() as u64 != len {
            return Err(Error::corrupt(
                key,
                format!(
                    "{} bytes at {start}, {len} expected (truncated?)",
                    bytes.len()
                ),
            ));
        }
        self.touched.insert(id);
        self.extents += 1;
        Ok(bytes)
    }

    /// A stored entry of container `id`, decoded if the container is encoded.
    fn decode<'b>(
        &mut self,
        id: ContainerId,
        fp: &Fingerprint,
        stored: &'b [u8],
    ) -> Result<Cow<'b, [u8]>> {
        if !self.locate(id)?.header.encoded() {
            return Ok(Cow::Borrowed(stored));
        }
        compression::decode(stored).map_err(|e| {
            Error::corrupt(
                container::key(id),
                format!("chunk {fp}: stored entry does not decode: {e}"),
            )
        })
    }

    /// Chunk `c` from its stored entry `stored` (`meta`): decoded, and a
    /// delta applied to its base (read on its own).
    fn chunk(
        &mut self,
        backup: BackupId,
        c: &ChunkRef,
        meta: &ChunkMeta,
        stored: &[u8],
    ) -> Result<Vec<u8>> {
        let entry = self.decode(c.container, &c.fp, stored)?;
        let Some(base) = meta.base else {
            return Ok(entry.into_owned());
        };
        let bm = self.meta(backup, base.container, &base.fp)?;
        if bm.base.is_some() {
            return Err(Error::corrupt(
                container::key(c.container),
                format!(
                    "chunk {} is a delta whose base {} is not stored whole in container {:016x}",
                    c.fp, base.fp, base.container
                ),
            ));
        }
        let base_stored = self.data(base.container, bm.offset, u64::from(bm.len))?;
        let base_bytes = self.decode(base.container, &base.fp, &base_stored)?;
        delta::decode(&base_bytes, &entry).map_err(|e| {
            Error::corrupt(
                container::key(c.container),
                format!("delta of chunk {}: {e}", c.fp),
            )
        })
    }
}

/// Writes the catalog chunks `chunks` of backup `id` into `out`, each
/// verified, reading each run of them stored contiguously in one
/// container with one ranged read; returns the metrics (containers read:
/// those data was read from).
pub(crate) fn read_catalog_chunks(
    repo: &Repository,
    id: BackupId,
    chunks: &[ChunkRef],
    out: &mut dyn Write,
) -> Result<RestoreStats> {
    let started = std::time::Instant::now();
    let before = repo.io_stats();
    let algo = repo.fingerprinter();
    let mut containers = Containers {
        backend: repo.backend().as_ref(),
        read: HashMap::new(),
        touched: HashSet::new(),
        extents: 0,
    };
    let mut stats = RestoreStats {
        id,
        ..RestoreStats::default()
    };
    let mut k = 0;
    while k < chunks.len() {
        // The run: the chunks after `k` in the same container, each stored
        // right after the one before.
        let cid = chunks[k].container;
        let mut metas = vec![containers.meta(id, cid, &chunks[k].fp)?];
        while let Some(next) = chunks.get(k + metas.len()).filter(|c| c.container == cid) {
            let m = containers.meta(id, cid, &next.fp)?;
            let last = metas[metas.len() - 1];
            if u64::from(m.offset) != u64::from(last.offset) + u64::from(last.len) {
                break;
            }
            metas.push(m);
        }
        let first = metas[0].offset;
        let len = metas.iter().map(|m| u64::from(m.len)).sum();
        let run = containers.data(cid, first, len)?;
        for (c, m) in chunks[k..k + metas.len()].iter().zip(&metas) {
            let at = (m.offset - first) as usize;
            let stored = run.get(at..at + m.len as usize).unwrap_or_default();
            let bytes = containers.chunk(id, c, m, stored)?;
            c.verify(algo, &bytes)?;
            out.write_all(&bytes).map_err(|e| Error::Output {
                what: "output".into(),
                source: e,
            })?;
            stats.bytes_restored += bytes.len() as u64;
            stats.chunks += 1;
        }
        k += metas.len();
    }
    stats.bytes_read = repo.io_stats().since(&before).read_bytes;
    stats.containers_read = containers.touched.len() as u64;
    stats.extents = containers.extents;
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}
