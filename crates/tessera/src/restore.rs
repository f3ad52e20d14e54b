//! Restore: rebuilds a backup from its recipe, reading whole containers
//! through an LRU container cache and verifying every chunk's fingerprint
//! before a byte of it is written.
//!
//! The container loads an LRU cache of the given size will make are known in
//! advance from the recipe, so reader threads fetch (and checksum)
//! containers ahead of the assembler — several at once, handed over in
//! exactly that order — while the assembler verifies chunk fingerprints in
//! parallel.

use crate::backend::Backend;
use crate::container::{self, Container, ContainerId};
use crate::error::{Error, Result};
use crate::fingerprint::FingerprintAlgo;
use crate::repo::Repository;
use crate::snapshot::{BackupId, ChunkRef};
use crossbeam_channel::{bounded, Receiver, Sender};
use lru::LruCache;
use rayon::prelude::*;
use serde::Serialize;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default container cache size, in containers.
pub const DEFAULT_CACHE_CONTAINERS: usize = 32;
/// Containers read ahead of the assembler.
const READ_AHEAD: usize = 4;
/// Containers read concurrently (more requests in flight than one
/// sequential reader keeps the device busier).
const READERS: usize = 2;
/// Bytes of chunks verified together in parallel.
const WINDOW_BYTES: u64 = 8 * 1024 * 1024;

/// Options of one restore.
pub struct RestoreOptions<'a> {
    /// Containers the cache holds.
    pub cache_containers: usize,
    /// Called with the number of bytes restored so far.
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl Default for RestoreOptions<'_> {
    fn default() -> Self {
        RestoreOptions {
            cache_containers: DEFAULT_CACHE_CONTAINERS,
            progress: None,
        }
    }
}

/// Metrics of one restore.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RestoreStats {
    /// The backup restored.
    pub id: BackupId,
    /// Bytes written to the output.
    pub bytes_restored: u64,
    /// Chunks written.
    pub chunks: u64,
    /// Bytes read from the backend.
    pub bytes_read: u64,
    /// bytes_read / bytes_restored.
    pub read_amplification: f64,
    /// Containers read (cache misses).
    pub containers_read: u64,
    /// MiB restored per container read.
    pub speed_factor: f64,
    /// Wall time.
    pub seconds: f64,
    /// MB (10^6 bytes) restored per second.
    pub throughput_mb_s: f64,
    /// Containers the cache held.
    pub cache_containers: usize,
}

/// The containers an LRU cache of `capacity` containers loads, in order,
/// when the chunks are read in recipe order.
pub fn lru_loads(chunks: &[ChunkRef], capacity: NonZeroUsize) -> Vec<ContainerId> {
    let mut cache = LruCache::new(capacity);
    let mut loads = Vec::new();
    for c in chunks {
        if cache.get(&c.container).is_none() {
            cache.put(c.container, ());
            loads.push(c.container);
        }
    }
    loads
}

/// Restores backup `id` of `repo` into `out` and returns the metrics.
///
/// Fails on the first chunk that is missing or whose bytes do not match its
/// fingerprint, before writing any of it.
pub fn restore(
    repo: &Repository,
    id: BackupId,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    let started = Instant::now();
    let io_before = repo.io_stats();
    repo.snapshot(id)?;
    let recipe = repo.recipe(id)?;
    let capacity = NonZeroUsize::new(options.cache_containers.max(1)).unwrap_or(NonZeroUsize::MIN);
    let loads = lru_loads(&recipe.chunks, capacity);
    let algo = repo.config().fingerprint;
    let backend = repo.shared_backend();
    // Each load gets a one-slot channel for its result; the slots travel to
    // the assembler in load order, so readers may finish out of order.
    let (slot_tx, slot_rx) = bounded::<Receiver<Result<Arc<Container>>>>(READ_AHEAD);
    let (job_tx, job_rx) = bounded::<(ContainerId, Sender<Result<Arc<Container>>>)>(0);

    let mut stats = std::thread::scope(|s| -> Result<RestoreStats> {
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (backend, jobs) = (backend.as_ref(), job_rx.clone());
                s.spawn(move || {
                    for (cid, result) in jobs {
                        let loaded = load_container(backend, cid);
                        let failed = loaded.is_err();
                        // A closed slot means the assembler stopped.
                        if result.send(loaded).is_err() || failed {
                            break;
                        }
                    }
                })
            })
            .collect();
        drop(job_rx);
        let loads = &loads;
        let dispatcher = s.spawn(move || {
            for &cid in loads {
                let (result_tx, result_rx) = bounded(1);
                if slot_tx.send(result_rx).is_err() || job_tx.send((cid, result_tx)).is_err() {
                    break;
                }
            }
        });
        let result = assemble(id, &recipe.chunks, capacity, algo, slot_rx, out, options);
        let panicked = |_| Error::Pipeline("container reader thread panicked".into());
        dispatcher.join().map_err(panicked)?;
        for r in readers {
            r.join().map_err(panicked)?;
        }
        result
    })?;
    out.flush().map_err(|e| Error::Output {
        what: "output".into(),
        source: e,
    })?;
    stats.id = id;
    stats.cache_containers = capacity.get();
    stats.containers_read = loads.len() as u64;
    stats.bytes_read = repo.io_stats().since(&io_before).read_bytes;
    stats.read_amplification = if stats.bytes_restored == 0 {
        0.0
    } else {
        stats.bytes_read as f64 / stats.bytes_restored as f64
    };
    stats.speed_factor = if stats.containers_read == 0 {
        0.0
    } else {
        stats.bytes_restored as f64 / (1024.0 * 1024.0) / stats.containers_read as f64
    };
    stats.seconds = started.elapsed().as_secs_f64();
    stats.throughput_mb_s = stats.bytes_restored as f64 / 1e6 / stats.seconds.max(1e-9);
    Ok(stats)
}

/// Restores backup `id` into the file `path`: written to a temporary file
/// beside it and renamed into place only when every chunk verified, so a
/// failed restore leaves no partial output.
pub fn restore_to_path(
    repo: &Repository,
    id: BackupId,
    path: &Path,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "restore".into());
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    let tmp = dir.join(format!(".{name}.tessera-partial.{}", std::process::id()));
    let out_err = |e| Error::Output {
        what: path.display().to_string(),
        source: e,
    };
    let file = File::create(&tmp).map_err(out_err)?;
    let mut writer = BufWriter::with_capacity(1 << 20, file);
    let result = restore(repo, id, &mut writer, options).and_then(|stats| {
        let file = writer.into_inner().map_err(|e| out_err(e.into_error()))?;
        file.sync_all().map_err(out_err)?;
        fs::rename(&tmp, path).map_err(out_err)?;
        Ok(stats)
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn load_container(backend: &dyn Backend, id: ContainerId) -> Result<Arc<Container>> {
    let bytes = backend.read(&container::key(id))?;
    Ok(Arc::new(Container::parse(id, bytes)?))
}

/// Replays the LRU cache over the recipe, taking loaded containers from the
/// reader in order, verifies windows of chunks in parallel and writes them.
fn assemble(
    id: BackupId,
    chunks: &[ChunkRef],
    capacity: NonZeroUsize,
    algo: FingerprintAlgo,
    loaded: Receiver<Receiver<Result<Arc<Container>>>>,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    let mut cache: LruCache<ContainerId, Arc<Container>> = LruCache::new(capacity);
    let mut stats = RestoreStats::default();
    let mut window: Vec<(Arc<Container>, usize, &ChunkRef)> = Vec::new();
    let mut window_bytes = 0u64;
    let mut wait = Duration::ZERO;
    for c in chunks {
        let container = match cache.get(&c.container) {
            Some(ct) => ct.clone(),
            None => {
                let t = Instant::now();
                let stopped = |_| Error::Pipeline("container reader stopped early".into());
                let ct = loaded.recv().map_err(stopped)?.recv().map_err(stopped)??;
                wait += t.elapsed();
                if ct.header.id != c.container {
                    return Err(Error::Pipeline(format!(
                        "reader delivered container {:016x}, expected {:016x}",
                        ct.header.id, c.container
                    )));
                }
                cache.put(c.container, ct.clone());
                ct
            }
        };
        let i = container.find(&c.fp).ok_or_else(|| Error::MissingChunk {
            backup: id,
            container: c.container,
            fingerprint: c.fp.to_string(),
        })?;
        window_bytes += u64::from(c.len);
        window.push((container, i, c));
        if window_bytes >= WINDOW_BYTES {
            flush_window(&mut window, algo, out, &mut stats)?;
            window_bytes = 0;
            if let Some(p) = options.progress {
                p(stats.bytes_restored);
            }
        }
    }
    flush_window(&mut window, algo, out, &mut stats)?;
    Ok(stats)
}

/// Verifies every chunk of the window (in parallel), then writes them in order.
fn flush_window(
    window: &mut Vec<(Arc<Container>, usize, &ChunkRef)>,
    algo: FingerprintAlgo,
    out: &mut dyn Write,
    stats: &mut RestoreStats,
) -> Result<()> {
    window.par_iter().try_for_each(|(ct, i, c)| {
        let bytes = ct.chunk(*i);
        let actual = algo.hash(bytes);
        if actual != c.fp || bytes.len() != c.len as usize {
            return Err(Error::ChunkMismatch {
                container: c.container,
                fingerprint: c.fp.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(())
    })?;
    for (ct, i, _) in window.drain(..) {
        let bytes = ct.chunk(i);
        out.write_all(bytes).map_err(|e| Error::Output {
            what: "output".into(),
            source: e,
        })?;
        stats.bytes_restored += bytes.len() as u64;
        stats.chunks += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;

    #[test]
    fn lru_loads_follow_the_cache() {
        let refs: Vec<ChunkRef> = [1, 2, 1, 3, 1, 2]
            .iter()
            .map(|&c| ChunkRef {
                fp: Fingerprint::default(),
                len: 1,
                container: c,
            })
            .collect();
        assert_eq!(
            lru_loads(&refs, NonZeroUsize::new(2).unwrap()),
            vec![1, 2, 3, 2]
        );
        assert_eq!(
            lru_loads(&refs, NonZeroUsize::new(3).unwrap()),
            vec![1, 2, 3]
        );
        assert_eq!(
            lru_loads(&refs, NonZeroUsize::new(1).unwrap()),
            vec![1, 2, 1, 3, 1, 2]
        );
    }

    /// Backs up 12 MiB of varied data (several containers, chunks repeated
    /// far apart) and returns the repository and its backup id.
    fn repository() -> (tempfile::TempDir, Repository, BackupId, Vec<u8>) {
        use crate::backup::{backup, BackupOptions};
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(
            &dir.path().join("repo"),
            crate::config::Config::new("t".into()),
        )
        .unwrap();
        let mut x = 7u64;
        let mut data: Vec<u8> = (0..10 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        data.extend_from_within(..2 << 20);
        let mut input = std::io::Cursor::new(data.clone());
        let snap = backup(&repo, &mut input, "input", &BackupOptions::default()).unwrap();
        assert!(repo.containers().unwrap().len() >= 3);
        (dir, repo, snap.id, data)
    }

    #[test]
    fn restores_with_any_cache_size() {
        let (_dir, repo, id, data) = repository();
        for cache_containers in [1, 2, 32] {
            let mut out = Vec::new();
            let options = RestoreOptions {
                cache_containers,
                progress: None,
            };
            let stats = restore(&repo, id, &mut out, &options).unwrap();
            assert!(out == data, "cache {cache_containers}");
            assert_eq!(stats.bytes_restored, data.len() as u64);
        }
    }

    #[test]
    fn a_missing_or_damaged_container_fails_the_restore() {
        let (dir, repo, id, _) = repository();
        let ids = repo.containers().unwrap();
        let path = dir.path().join("repo").join(container::key(ids[1]));
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let err = restore(&repo, id, &mut std::io::sink(), &RestoreOptions::default());
        assert!(matches!(err, Err(Error::Corrupt { .. })), "{err:?}");
        fs::remove_file(&path).unwrap();
        let err = restore(&repo, id, &mut std::io::sink(), &RestoreOptions::default());
        assert!(matches!(err, Err(Error::NotFound(_))), "{err:?}");
    }
}
