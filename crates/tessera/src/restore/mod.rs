//! Restore: rebuilds a backup from its recipe, reading whole containers
//! through an LRU container cache and verifying every chunk's fingerprint
//! before a byte of it is written.
//!
//! The container loads an LRU cache of the given size will make are known in
//! advance from the recipe, so reader threads fetch (and checksum)
//! containers ahead of the assembler — several at once, handed over in
//! exactly that order — while the assembler verifies chunk fingerprints in
//! parallel.
//!
//! A chunk stored as a delta is decoded against its base when its window is
//! flushed, the base taken from the containers the restore holds or loaded
//! (bases sit beside chunks the backup reads anyway), else read on demand
//! and counted in `base_reads`; the decoded chunk is verified like any other.

pub mod options;
pub mod output;
pub mod plan;
pub mod ranges;
pub mod salvage;

use crate::error::{Error, Result};
use crate::format::snapshot::BackupId;
use crate::repo::Repository;
use crate::restore::options::{finish_stats, report_done, selected_chunks};
pub use crate::restore::options::{RestoreOptions, RestoreStats, DEFAULT_CACHE_CONTAINERS};
pub use crate::restore::output::ExistingFile;
use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::time::Instant;

/// Restores backup `id` of `repo` into `out` and returns the metrics.
///
/// Fails on the first chunk that is missing or whose bytes do not match its
/// fingerprint, before writing any of it. In a trace repository nothing is
/// written: the restore is planned from the metadata and its metrics
/// computed, identical to those of a real restore of the same recipe.
///
/// Options out of range are refused (see [`check_options`]).
pub fn restore(
    repo: &Repository,
    id: BackupId,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    restore_chunks(repo, id, None, out, options)
}

/// Checks restore options against the repository and the machine: the
/// cache holds at least one container, and (when it holds data: a
/// container-layout repository that is not a trace repository) no more
/// containers than fit in the machine's memory (`MemTotal` of
/// `/proc/meminfo`, else [`FALLBACK_MEMORY_BYTES`]).
pub fn check_options(repo: &Repository, options: &RestoreOptions) -> Result<()> {
    let n = options.cache_containers as u64;
    if n == 0 {
        return Err(Error::InvalidOption(
            "restore cache size (--cache-size) is 0 containers: it must hold at least 1".into(),
        ));
    }
    crate::layout::check_restore_cache(repo, n)
}

/// Restores the chunks `select` picks of backup `id` — ranges of recipe
/// positions, in order — into `out`, one after the other: planned, read and
/// verified as [`restore`] does, reading only what those chunks need.
pub fn restore_selection(
    repo: &Repository,
    id: BackupId,
    select: &[Range<usize>],
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    restore_chunks(repo, id, Some(select), out, options)
}

/// [`restore`] or [`restore_selection`]: checks the options, then restores.
fn restore_chunks(
    repo: &Repository,
    id: BackupId,
    select: Option<&[Range<usize>]>,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    check_options(repo, options)?;
    if options.skip_damaged && !repo.config().trace {
        return salvage(repo, id, select, out, options);
    }
    if repo.config().trace {
        return restore_verified(repo, id, select, out, options);
    }
    let mut counted = Counted {
        inner: out,
        written: 0,
    };
    match restore_verified(repo, id, select, &mut counted, options) {
        Err(e) if e.lost_reason().is_some() => {
            let written = counted.written;
            after_damage(repo, id, select, out, options, written, e)
        }
        r => r,
    }
}

/// A writer that counts the bytes written through it.
struct Counted<'a> {
    inner: &'a mut dyn Write,
    written: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A writer that drops the first `skip` bytes written through it (the
/// output already holds them).
struct SkipFirst<'a> {
    inner: &'a mut dyn Write,
    skip: u64,
}

impl Write for SkipFirst<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let dropped = self.skip.min(buf.len() as u64) as usize;
        self.skip -= dropped as u64;
        if dropped == buf.len() {
            return Ok(dropped);
        }
        Ok(dropped + self.inner.write(&buf[dropped..])?)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A restore that met damage (`e`): the salvage path, run once into
/// nothing, finds every damaged chunk and quarantines it (issue 20: damage
/// a restore finds never spreads into new backups). When every chunk still
/// verifies somewhere (a lifecycle version's chunks each have an intact
/// copy among the objects of the version) the backup is restored along the
/// salvage path, past the bytes already written (identical: each was
/// verified); otherwise the error stands.
fn after_damage(
    repo: &Repository,
    id: BackupId,
    select: Option<&[Range<usize>]>,
    out: &mut dyn Write,
    options: &RestoreOptions,
    written: u64,
    e: Error,
) -> Result<RestoreStats> {
    let Ok(chunks) = repo.recipe(id).and_then(|r| r.selected(select)) else {
        return Err(e);
    };
    let sink = &mut std::io::sink();
    let found = crate::layout::salvage(repo, id, &chunks, sink, options.cache_containers, None);
    match found {
        Ok((_, _, lost)) if lost.is_empty() => {
            let mut rest = SkipFirst {
                inner: out,
                skip: written,
            };
            match salvage(repo, id, select, &mut rest, options) {
                Ok(stats) if stats.lost.is_empty() => Ok(stats),
                _ => Err(e),
            }
        }
        _ => Err(e),
    }
}

/// [`restore_chunks`] along the normal (fast, strict) path: any missing or
/// damaged chunk fails it. The layout reads (see [`crate::layout::restore`]).
fn restore_verified(
    repo: &Repository,
    id: BackupId,
    select: Option<&[Range<usize>]>,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    crate::layout::restore(repo, id, select, out, options)
}

/// A salvage restore (`skip_damaged`), either layout: see [`crate::restore::salvage`].
fn salvage(
    repo: &Repository,
    id: BackupId,
    select: Option<&[Range<usize>]>,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    let started = Instant::now();
    let chunks = selected_chunks(repo, id, select, options)?;
    let io_before = repo.io_stats();
    let done = |n| report_done(options, n);
    let progress = options.progress.map(|_| &done as &(dyn Fn(u64) + Sync));
    let (whole, reads, lost) =
        crate::layout::salvage(repo, id, &chunks, out, options.cache_containers, progress)?;
    out.flush().map_err(|e| Error::Output {
        what: "output".into(),
        source: e,
    })?;
    let mut stats = RestoreStats {
        id,
        bytes_restored: chunks.iter().map(|c| u64::from(c.len)).sum(),
        chunks: whole,
        bytes_read: repo.io_stats().since(&io_before).read_bytes,
        containers_read: reads,
        extents: reads,
        cache_containers: options.cache_containers,
        policy: crate::layout::salvage_policy(repo).into(),
        lost,
        ..RestoreStats::default()
    };
    finish_stats(&mut stats, started);
    Ok(stats)
}

/// Restores backup `id` into `path`, by what is there (see
/// [`crate::restore::output`]): a new or (with [`ExistingFile::Replace`])
/// existing regular file is written to a temporary file beside it and
/// renamed into place only when every chunk verified, so a failed restore
/// leaves no partial output and the old file intact; a device, FIFO or
/// socket is written in place; a directory, or an existing file without
/// `Replace`, is refused before anything is read.
pub fn restore_to_path(
    repo: &Repository,
    id: BackupId,
    path: &Path,
    existing: ExistingFile,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    check_options(repo, options)?;
    output::write_to_path(path, existing, |out| {
        restore_chunks(repo, id, None, out, options)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::container;
    use crate::progress::ByteProgress;
    use crate::restore::plan::CachePolicy;
    use std::collections::HashMap;
    use std::fs;

    /// Backs up 12 MiB of varied data (several containers, chunks repeated
    /// far apart) and returns the repository and its backup id.
    fn repository() -> (tempfile::TempDir, Repository, BackupId, Vec<u8>) {
        use crate::backup::{backup, BackupOptions};
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(
            &dir.path().join("repo"),
            crate::repo::config::Config::new("t".into()),
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
        let snap = backup(
            &repo,
            crate::backup::Input::Stream {
                input: &mut input,
                name: "input",
            },
            &BackupOptions::default(),
        )
        .map(|o| o.snapshot)
        .unwrap();
        assert!(repo.containers().unwrap().len() >= 3);
        (dir, repo, snap.id, data)
    }

    /// Records what a restore tells its progress.
    #[derive(Default)]
    struct Told {
        totals: std::sync::Mutex<Vec<u64>>,
        done: std::sync::Mutex<Vec<u64>>,
    }

    impl ByteProgress for Told {
        fn total(&self, bytes: u64) {
            assert!(self.done.lock().unwrap().is_empty(), "total after progress");
            self.totals.lock().unwrap().push(bytes);
        }
        fn done(&self, bytes: u64) {
            self.done.lock().unwrap().push(bytes);
        }
    }

    #[test]
    fn progress_learns_the_total_before_the_first_bytes() {
        let (_dir, repo, id, data) = repository();
        let chunks = repo.recipe(id).unwrap().chunks;
        let selected: u64 = chunks[2..5].iter().map(|c| u64::from(c.len)).sum();
        let middle: Vec<Range<usize>> = std::iter::once(2..5).collect();
        for (select, total) in [(None, data.len() as u64), (Some(middle), selected)] {
            for skip_damaged in [false, true] {
                let told = Told::default();
                let options = RestoreOptions {
                    progress: Some(&told),
                    skip_damaged,
                    ..RestoreOptions::default()
                };
                let mut out = Vec::new();
                restore_chunks(&repo, id, select.as_deref(), &mut out, &options).unwrap();
                assert_eq!(out.len() as u64, total);
                assert_eq!(*told.totals.lock().unwrap(), [total], "{select:?}");
                let done = told.done.lock().unwrap();
                assert!(done.windows(2).all(|w| w[0] <= w[1]), "{done:?}");
                assert_eq!(done.last(), Some(&total), "{select:?} {skip_damaged}");
            }
        }
    }

    #[test]
    fn restores_with_any_policy_and_cache_size() {
        let (_dir, repo, id, data) = repository();
        let mut reads = HashMap::new();
        for policy in [CachePolicy::Lru, CachePolicy::Opt, CachePolicy::Faa] {
            for cache_containers in [1, 2, 32] {
                let mut out = Vec::new();
                let options = RestoreOptions {
                    cache_containers,
                    policy,
                    progress: None,
                    skip_damaged: false,
                };
                let stats = restore(&repo, id, &mut out, &options).unwrap();
                assert!(out == data, "{policy:?}, cache {cache_containers}");
                assert_eq!(stats.bytes_restored, data.len() as u64);
                assert!(!stats.plan_only);
                reads.insert((policy, cache_containers), stats.containers_read);
            }
        }
        // The 2 MiB repeated at the end needs its containers again: a cache
        // of one container re-reads, OPT never reads more than LRU.
        for n in [1, 2, 32] {
            assert!(reads[&(CachePolicy::Opt, n)] <= reads[&(CachePolicy::Lru, n)]);
        }
        assert!(reads[&(CachePolicy::Lru, 1)] > reads[&(CachePolicy::Lru, 32)]);
    }

    #[test]
    fn trace_repositories_plan_restores_with_the_same_metrics() {
        use crate::backup::{run, BackupOptions, Source};
        let (_dir, repo, id, _) = repository();
        let recipe = repo.recipe(id).unwrap();
        let tdir = tempfile::tempdir().unwrap();
        let mut config = crate::repo::config::Config::new("t".into());
        config.trace = true;
        let trace = Repository::init(&tdir.path().join("trace"), config).unwrap();
        let mut chunks = recipe.chunks.iter().map(|c| Ok((c.fp, c.len)));
        let snap = run(
            &trace,
            Source::Trace(&mut chunks),
            &BackupOptions::default(),
        )
        .unwrap()
        .snapshot;
        for policy in [CachePolicy::Lru, CachePolicy::Opt, CachePolicy::Faa] {
            let options = RestoreOptions {
                cache_containers: 2,
                policy,
                progress: None,
                skip_damaged: false,
            };
            let real = restore(&repo, id, &mut std::io::sink(), &options).unwrap();
            let planned = restore(&trace, snap.id, &mut std::io::sink(), &options).unwrap();
            assert!(planned.plan_only);
            assert_eq!(
                (
                    planned.bytes_restored,
                    planned.containers_read,
                    planned.bytes_read
                ),
                (real.bytes_restored, real.containers_read, real.bytes_read),
                "{policy:?}"
            );
            assert_eq!(planned.read_amplification, real.read_amplification);
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
        // The data checksum is not read: the damaged chunk fails its
        // fingerprint, naming its container.
        let err = restore(&repo, id, &mut std::io::sink(), &RestoreOptions::default());
        assert!(
            matches!(err, Err(Error::ChunkMismatch { container, .. }) if container == ids[1]),
            "{err:?}"
        );
        fs::remove_file(&path).unwrap();
        let err = restore(&repo, id, &mut std::io::sink(), &RestoreOptions::default());
        assert!(matches!(err, Err(Error::NotFound(_))), "{err:?}");
    }

    #[test]
    fn cache_sizes_beyond_the_machine_are_refused() {
        use crate::layout::container::restore::{machine_memory, mem_total};
        assert_eq!(
            mem_total("MemFree: 1 kB\nMemTotal:   2048 kB\n"),
            Some(2 << 20)
        );
        assert_eq!(mem_total("MemTotal: lots\n"), None);
        let (_dir, repo, id, _) = repository();
        let (memory, _) = machine_memory();
        let fits = (memory / u64::from(repo.config().container_size)) as usize;
        for cache_containers in [0, fits + 1] {
            let options = RestoreOptions {
                cache_containers,
                ..RestoreOptions::default()
            };
            let err = restore(&repo, id, &mut std::io::sink(), &options);
            assert!(matches!(err, Err(Error::InvalidOption(_))), "{err:?}");
        }
    }
}
