//! The exact in-memory index: every stored fingerprint in one hash table,
//! persisted as a single object (`index/exact`) so that a new process
//! reopens it with one read. The object is a cache: when it is missing,
//! damaged or stale it is rebuilt from the containers' metadata sections.

use super::{Chunk, Decision, DedupIndex, IndexStats, Relocations};
use crate::backend::{Backend, WriteMode};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap, FINGERPRINT_LEN};
use crate::format::envelope::{self, le8};
use crate::layout::container::ContainerId;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Key of the persisted exact index.
pub const INDEX_KEY: &str = "index/exact";
const KIND: &[u8; 4] = b"IDXE";
const VERSION: u32 = 1;
const ENTRY_LEN: usize = FINGERPRINT_LEN + 8;
/// Marks a fingerprint decided `Unique` in this backup but not yet placed.
const PENDING: ContainerId = ContainerId::MAX;

/// Fingerprint → container id, all in memory.
pub struct Exact {
    backend: Arc<dyn Backend>,
    map: FingerprintMap<ContainerId>,
    /// The `next_container` of the persisted index this one was rebased
    /// on ([`DedupIndex::rebase`]): the commit writes at least this.
    floor: ContainerId,
    stats: IndexStats,
}

impl Exact {
    /// Loads the persisted index, checking it against the containers that
    /// exist (`containers`, sorted); rebuilds it from the containers if it is
    /// missing, damaged or names containers that do not exist, and adds
    /// containers newer than it.
    pub fn open(backend: Arc<dyn Backend>, containers: &[ContainerId]) -> Result<Exact> {
        let loaded = super::read_cached(backend.as_ref(), INDEX_KEY, decode)?;
        let existing: BTreeSet<ContainerId> = containers.iter().copied().collect();
        if let Some((next_container, map)) = loaded {
            if map.values().all(|c| existing.contains(c)) {
                let mut index = Exact::with_map(backend, map);
                let newer: Vec<_> = existing.range(next_container..).copied().collect();
                index.scan(&newer)?;
                index.stats.containers_scanned = newer.len() as u64;
                return Ok(index);
            }
        }
        let mut index = Exact::rebuild(backend, containers)?;
        index.stats.rebuilt = !containers.is_empty();
        Ok(index)
    }

    /// Builds the index from the metadata of `containers`; containers whose
    /// metadata is damaged are left out (their chunks will be stored again).
    pub fn rebuild(backend: Arc<dyn Backend>, containers: &[ContainerId]) -> Result<Exact> {
        let mut index = Exact::with_map(backend, FingerprintMap::default());
        index.scan(containers)?;
        index.stats.containers_scanned = containers.len() as u64;
        Ok(index)
    }

    fn with_map(backend: Arc<dyn Backend>, map: FingerprintMap<ContainerId>) -> Exact {
        Exact {
            backend,
            map,
            floor: 0,
            stats: IndexStats {
                policy: "exact".into(),
                ..IndexStats::default()
            },
        }
    }

    fn scan(&mut self, containers: &[ContainerId]) -> Result<()> {
        let map = &mut self.map;
        super::scan_containers(self.backend.as_ref(), containers, |id, metas| {
            for m in metas {
                map.entry(m.fp).or_insert(id);
            }
        })?;
        self.note_memory();
        Ok(())
    }

    /// Writes the index object (every container below `next_container`
    /// included), streamed: no copy of the entries is held in memory.
    pub fn save(&self, next_container: ContainerId) -> Result<()> {
        let placed = || self.map.iter().filter(|(_, &c)| c != PENDING);
        let count = placed().count() as u64;
        let payload_len = 16 + count * ENTRY_LEN as u64;
        self.backend
            .write_streamed(INDEX_KEY, WriteMode::Replace, &mut |out| {
                envelope::seal_streamed(KIND, VERSION, payload_len, out, |w| {
                    let io_err = |e| Error::io(format!("writing {INDEX_KEY}"), e);
                    w.write_all(&next_container.to_le_bytes()).map_err(io_err)?;
                    w.write_all(&count.to_le_bytes()).map_err(io_err)?;
                    for (fp, c) in placed() {
                        w.write_all(&fp.0).map_err(io_err)?;
                        w.write_all(&c.to_le_bytes()).map_err(io_err)?;
                    }
                    Ok(())
                })
            })?;
        Ok(())
    }

    /// Number of fingerprints indexed.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Records the table's size; `before`: its size before inserts that may
    /// have grown it. Growing holds the old table (half the new one) and
    /// the new one at once; counting it from the new size alone keeps the
    /// figure independent of how inserts were batched.
    fn note_memory_since(&mut self, before: usize) {
        let now = self.map.allocation_size();
        let peak = if now > before { now + now / 2 } else { now };
        self.stats.memory_bytes = self.stats.memory_bytes.max(peak as u64);
        self.stats.entries = self.map.len() as u64;
    }

    fn note_memory(&mut self) {
        self.note_memory_since(self.map.allocation_size());
    }
}

fn decode(bytes: &[u8]) -> Result<(ContainerId, FingerprintMap<ContainerId>)> {
    let payload = envelope::open(INDEX_KEY, KIND, VERSION, bytes)?;
    if payload.len() < 16 {
        return Err(Error::corrupt(INDEX_KEY, "truncated header"));
    }
    let next_container = u64::from_le_bytes(le8(&payload[..8]));
    let count = u64::from_le_bytes(le8(&payload[8..16]));
    let body = &payload[16..];
    if body.len() as u64 != count.saturating_mul(ENTRY_LEN as u64) {
        return Err(Error::corrupt(
            INDEX_KEY,
            "entry count does not match its size",
        ));
    }
    let mut map = FingerprintMap::with_capacity_and_hasher(count as usize, Default::default());
    for e in body.chunks_exact(ENTRY_LEN) {
        let mut fp = [0u8; FINGERPRINT_LEN];
        fp.copy_from_slice(&e[..FINGERPRINT_LEN]);
        map.insert(
            Fingerprint(fp),
            u64::from_le_bytes(le8(&e[FINGERPRINT_LEN..])),
        );
    }
    Ok((next_container, map))
}

impl DedupIndex for Exact {
    fn submit(&mut self, batch: Vec<Chunk>, decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        decided.reserve(batch.len());
        let before = self.map.allocation_size();
        for chunk in batch {
            self.stats.lookups += 1;
            let decision = match self.map.entry(chunk.fp) {
                hashbrown::hash_map::Entry::Occupied(e) if *e.get() == PENDING => {
                    Decision::InternalDuplicate
                }
                hashbrown::hash_map::Entry::Occupied(e) => Decision::Duplicate(*e.get()),
                hashbrown::hash_map::Entry::Vacant(e) => {
                    e.insert(PENDING);
                    Decision::Unique
                }
            };
            decided.push((chunk, decision));
        }
        self.note_memory_since(before);
        Ok(())
    }

    fn finish(&mut self, _decided: &mut Vec<(Chunk, Decision)>) -> Result<()> {
        self.note_memory();
        Ok(())
    }

    fn placed(&mut self, stored: &[(Fingerprint, ContainerId)]) -> Result<()> {
        for (fp, c) in stored {
            self.map.insert(*fp, *c);
        }
        Ok(())
    }

    fn relocate(&mut self, removed: &BTreeSet<ContainerId>, moved: &Relocations) -> Result<()> {
        let mut failed = None;
        self.map.retain(|fp, c| {
            if !removed.contains(c) {
                return true;
            }
            match moved.get(*c, fp) {
                Ok(Some(new)) => {
                    *c = new;
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    failed.get_or_insert(e);
                    true
                }
            }
        });
        self.note_memory();
        failed.map_or(Ok(()), Err)
    }

    fn commit(&mut self, next_container: ContainerId) -> Result<()> {
        self.note_memory();
        self.save(next_container.max(self.floor))
    }

    /// Adds the entries of the persisted index as it is now (a fingerprint
    /// this index holds keeps its container). A missing or damaged object
    /// adds nothing: this index then overwrites it with what it knows.
    fn rebase(&mut self) -> Result<()> {
        // A listing first: a backend with a metadata cache then knows the
        // version other writers left (FORMAT.md §13.2) and reads that one.
        self.backend.list("index")?;
        if let Some((next_container, map)) =
            super::read_cached(self.backend.as_ref(), INDEX_KEY, decode)?
        {
            let before = self.map.allocation_size();
            for (fp, c) in map.iter() {
                self.map.entry(*fp).or_insert(*c);
            }
            self.floor = self.floor.max(next_container);
            self.note_memory_since(before);
        }
        Ok(())
    }

    fn stats(&self) -> IndexStats {
        self.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Local;
    use crate::layout::container;

    fn chunk(seq: u64, b: u8) -> Chunk {
        Chunk {
            seq,
            fp: Fingerprint([b; 32]),
            len: 1,
            data: None,
        }
    }

    #[test]
    fn decides_first_occurrence_unique_then_internal_then_stored() {
        let dir = tempfile::tempdir().unwrap();
        let backend: Arc<dyn Backend> = Arc::new(Local::new(dir.path()));
        let mut idx = Exact::open(backend.clone(), &[]).unwrap();
        let mut out = Vec::new();
        idx.submit(vec![chunk(0, 1), chunk(1, 2), chunk(2, 1)], &mut out)
            .unwrap();
        let d: Vec<_> = out.iter().map(|x| x.1).collect();
        assert_eq!(
            d,
            vec![
                Decision::Unique,
                Decision::Unique,
                Decision::InternalDuplicate
            ]
        );
        idx.placed(&[(Fingerprint([1; 32]), 5), (Fingerprint([2; 32]), 5)])
            .unwrap();
        out.clear();
        idx.submit(vec![chunk(3, 1)], &mut out).unwrap();
        assert_eq!(out[0].1, Decision::Duplicate(5));
    }

    #[test]
    fn stale_or_damaged_index_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let backend: Arc<dyn Backend> = Arc::new(Local::new(dir.path()));
        let mut b = container::Builder::new(1, 1 << 16);
        b.push(Fingerprint([9; 32]), b"data");
        backend.write(&container::key(1), &b.seal()).unwrap();

        // Missing: rebuilt from the container.
        let idx = Exact::open(backend.clone(), &[1]).unwrap();
        assert!(idx.stats().rebuilt);
        assert_eq!(idx.len(), 1);
        idx.save(2).unwrap();

        // Intact: loaded as is.
        let idx = Exact::open(backend.clone(), &[1]).unwrap();
        assert!(!idx.stats().rebuilt);
        assert_eq!(idx.len(), 1);

        // Truncated: rebuilt.
        let bytes = backend.read(INDEX_KEY).unwrap();
        backend.write(INDEX_KEY, &bytes[..bytes.len() - 3]).unwrap();
        let idx = Exact::open(backend.clone(), &[1]).unwrap();
        assert!(idx.stats().rebuilt);
        assert_eq!(idx.len(), 1);

        // Names a container that is gone: not trusted, rebuilt from what exists.
        idx.save(2).unwrap();
        let idx = Exact::open(backend.clone(), &[]).unwrap();
        assert!(idx.is_empty());
    }
}
