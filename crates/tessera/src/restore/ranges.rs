//! Reading byte ranges of a backup's stream at random (`tessera mount`):
//! the chunks covering a range are restored through the verified restore
//! path ([`restore_selection`]: every chunk checked against its fingerprint
//! before a byte of it is used) and kept in a bounded cache of decoded
//! chunks, so that a sequence of small reads does not read a container per
//! read.

use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions};
use lru::LruCache;
use std::ops::Range;
use std::sync::Arc;

/// Bytes restored past the end of a read that missed the cache (within the
/// extent the caller allows): sequential reads then miss once per this much.
pub const READ_AHEAD: u64 = 4 << 20;

/// Containers the restore of one missed range may cache: a range is read
/// in stream order, so few are needed, and memory stays small.
const RESTORE_CACHE_CONTAINERS: usize = 4;

/// Where every chunk of a backup's stream is: its recipe with the stream
/// offset at which each chunk ends.
pub struct StreamMap {
    id: BackupId,
    chunks: Vec<ChunkRef>,
    ends: Vec<u64>,
}

impl StreamMap {
    /// The map of backup `id` of `repo` (its recipe).
    pub fn load(repo: &Repository, id: BackupId) -> Result<StreamMap> {
        let chunks = repo.recipe(id)?.chunks;
        let mut end = 0u64;
        let ends = chunks
            .iter()
            .map(|c| {
                end += u64::from(c.len);
                end
            })
            .collect();
        Ok(StreamMap { id, chunks, ends })
    }

    /// The backup mapped.
    pub fn id(&self) -> BackupId {
        self.id
    }

    /// Bytes of the stream.
    pub fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Whether the stream is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where chunk `i` starts in the stream.
    fn start(&self, i: usize) -> u64 {
        match i {
            0 => 0,
            i => self.ends[i - 1],
        }
    }

    /// The chunks holding the bytes `[from, to)` (`from < to <= len`).
    fn covering(&self, from: u64, to: u64) -> Range<usize> {
        let first = self.ends.partition_point(|&e| e <= from);
        let last = self.ends.partition_point(|&e| e < to);
        first..(last + 1).min(self.chunks.len())
    }
}

/// Decoded (verified) chunks by fingerprint, least recently used evicted
/// beyond a byte budget. Chunks are content-addressed, so a chunk shared by
/// several backups or files is cached once.
pub struct ChunkCache {
    lru: LruCache<Fingerprint, Arc<Vec<u8>>>,
    bytes: u64,
    budget: u64,
}

impl ChunkCache {
    /// A cache holding at most `budget` bytes of chunks.
    pub fn new(budget: u64) -> ChunkCache {
        ChunkCache {
            lru: LruCache::unbounded(),
            bytes: 0,
            budget,
        }
    }

    /// Bytes of chunks held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn get(&mut self, fp: &Fingerprint) -> Option<Arc<Vec<u8>>> {
        self.lru.get(fp).cloned()
    }

    fn put(&mut self, fp: Fingerprint, bytes: Arc<Vec<u8>>) {
        self.bytes += bytes.len() as u64;
        if let Some(old) = self.lru.put(fp, bytes) {
            self.bytes -= old.len() as u64;
        }
        while self.bytes > self.budget {
            match self.lru.pop_lru() {
                Some((_, b)) => self.bytes -= b.len() as u64,
                None => break,
            }
        }
    }
}

/// The bytes `[offset, offset + len)` of the stream of `map`'s backup (fewer
/// at its end). On a miss, the chunks up to [`READ_AHEAD`] bytes further,
/// but not past `limit` (the end of the file read), are restored too.
///
/// Every chunk is restored and verified by [`restore_selection`]: a missing
/// or damaged chunk fails the read, never yields wrong bytes.
pub fn read_range(
    repo: &Repository,
    map: &StreamMap,
    cache: &mut ChunkCache,
    offset: u64,
    len: usize,
    limit: u64,
) -> Result<Vec<u8>> {
    let end = offset.saturating_add(len as u64).min(map.len());
    if offset >= end {
        return Ok(Vec::new());
    }
    let needed = map.covering(offset, end);
    let mut have: Vec<Option<Arc<Vec<u8>>>> = needed
        .clone()
        .map(|i| cache.get(&map.chunks[i].fp))
        .collect();
    if have.iter().any(Option::is_none) {
        let ahead_to = limit.min(map.len()).max(end).min(end + READ_AHEAD);
        let window = needed.start..map.covering(offset, ahead_to).end;
        let mut runs: Vec<Range<usize>> = Vec::new();
        for i in window {
            let wanted = i < needed.end && have[i - needed.start].is_none();
            if !wanted && (i < needed.end || cache.lru.contains(&map.chunks[i].fp)) {
                continue;
            }
            match runs.last_mut() {
                Some(r) if r.end == i => r.end = i + 1,
                _ => runs.push(i..i + 1),
            }
        }
        let mut out = Vec::new();
        let options = RestoreOptions {
            cache_containers: RESTORE_CACHE_CONTAINERS,
            ..RestoreOptions::default()
        };
        restore_selection(repo, map.id, &runs, &mut out, &options)?;
        let mut rest = &out[..];
        for i in runs.into_iter().flatten() {
            let c = &map.chunks[i];
            let (bytes, more) = rest.split_at((c.len as usize).min(rest.len()));
            rest = more;
            let bytes = Arc::new(bytes.to_vec());
            if needed.contains(&i) {
                have[i - needed.start] = Some(bytes.clone());
            }
            cache.put(c.fp, bytes);
        }
    }
    let mut out = Vec::with_capacity((end - offset) as usize);
    for (i, bytes) in needed.zip(have) {
        let bytes = bytes.unwrap_or_default();
        let start = map.start(i);
        let from = offset.saturating_sub(start) as usize;
        let to = ((end - start) as usize).min(bytes.len());
        out.extend_from_slice(bytes.get(from..to).unwrap_or_default());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::{backup, BackupOptions};
    use crate::repo::config::Config;
    use rand::{Rng, SeedableRng};

    #[test]
    fn ranges_read_the_stream_bytes_and_cache_within_budget() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(&dir.path().join("r"), Config::new("test".into())).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut data = vec![0u8; 3 << 20];
        rng.fill(&mut data[..]);
        let snap = backup(
            &repo,
            crate::backup::Input::Stream {
                input: &mut &data[..],
                name: "input",
            },
            &BackupOptions::default(),
        )
        .map(|o| o.snapshot)
        .unwrap();
        let map = StreamMap::load(&repo, snap.id).unwrap();
        assert_eq!(map.len(), data.len() as u64);
        let mut cache = ChunkCache::new(1 << 20);
        for _ in 0..200 {
            let offset = rng.random_range(0..data.len() as u64 + 10);
            let len = rng.random_range(0..200_000usize);
            let got = read_range(&repo, &map, &mut cache, offset, len, map.len()).unwrap();
            let from = (offset as usize).min(data.len());
            let to = (from + len).min(data.len());
            assert_eq!(got, data[from..to], "offset {offset} len {len}");
            assert!(cache.bytes() <= 1 << 20);
        }

        // A damaged byte: every read of its chunk fails, none returns other
        // bytes (reads of the container's intact chunks succeed: each chunk
        // is verified by its fingerprint). The reads cover the whole stream.
        let containers = dir.path().join("r/containers");
        for e in std::fs::read_dir(&containers).unwrap() {
            let path = e.unwrap().path();
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[1 << 20] ^= 1;
            std::fs::write(&path, bytes).unwrap();
        }
        let mut cache = ChunkCache::new(1 << 20);
        let mut failed = 0;
        for at in (0..data.len()).step_by(50_000) {
            let len = 50_000.min(data.len() - at);
            let end = (at + len) as u64;
            match read_range(&repo, &map, &mut cache, at as u64, len, end) {
                Ok(got) => assert_eq!(got, data[at..at + len]),
                Err(_) => failed += 1,
            }
        }
        assert!(failed > 0);
    }
}
