//! Trace replay equals the real-data run on the same chunk sequence.
//!
//! A small generated dataset is backed up into a data repository; a Destor
//! trace of each version, cut with the repository's chunker and hashed with
//! its fingerprint, is replayed into a trace repository of the same
//! configuration. Every metric that depends on metadata only must then be
//! identical version by version: backup classes and counts, containers,
//! index counters, recipes, repository totals, restore reads for every cache
//! policy, and GC selection and copy-forward.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use tessera::backup::{backup, BackupOptions, Input};
use tessera::format::snapshot::{BackupStats, Snapshot};
use tessera::gc::{forget_keep_last, gc, Defrag, GcOptions, GcStats};
use tessera::layout::container;
use tessera::repo::config::{Config, IndexKind};
use tessera::restore::plan::CachePolicy;
use tessera::restore::{restore, RestoreOptions, RestoreStats};
use tessera::rewrite::RewriteKind;
use tessera::Repository;
use tessera::{Fingerprint, FingerprintAlgo};
use tessera_lab::gen::{generate, GenOptions};
use tessera_lab::trace::{write_data_trace, TraceFile};

const VERSIONS: u32 = 8;

/// One system configuration compared.
struct Case {
    name: &'static str,
    config: Config,
    /// Forget all but the newest `keep` backups and GC after every backup.
    gc: Option<(usize, GcOptions)>,
    /// Restore cache size in containers.
    cache: usize,
    /// Compare the index's peak memory too (see
    /// `ddfs_index_memory_peak_equals_data_run`: DDFS samples it per batch).
    memory: bool,
}

/// The 8 × 3 MiB dataset, generated once per test process.
fn dataset() -> &'static (tempfile::TempDir, Vec<PathBuf>) {
    static DATA: std::sync::OnceLock<(tempfile::TempDir, Vec<PathBuf>)> =
        std::sync::OnceLock::new();
    DATA.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let opts = GenOptions {
            versions: VERSIONS,
            size: 3 << 20,
            // More change than the default, so that rewriting and GC have work.
            change_rate: 0.15,
            seed: 7,
            ..GenOptions::default()
        };
        let summary = generate(&dir.path().join("ds"), &opts).unwrap();
        let paths = summary.versions.into_iter().map(|v| v.path).collect();
        (dir, paths)
    })
}

fn base(name: &str, algo: FingerprintAlgo) -> Config {
    let mut c = Config::new(format!("replay-{name}"));
    c.fingerprint = algo;
    // Small containers: many of them, so restore caches, rewriting and GC
    // make real choices on a 3 MiB version.
    c.container_size = 256 << 10;
    c
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();

    let exact = base("exact", FingerprintAlgo::Sha1);
    cases.push(Case {
        name: "exact-sha1",
        config: exact,
        gc: None,
        cache: 4,
        memory: true,
    });

    let mut ddfs = base("ddfs", FingerprintAlgo::Blake3);
    ddfs.index = IndexKind::Ddfs;
    // A metadata cache of a few containers: lookups go to the on-disk table.
    ddfs.index_cache_bytes = 64 << 10;
    cases.push(Case {
        name: "ddfs-blake3",
        config: ddfs,
        gc: None,
        cache: 4,
        memory: false,
    });

    let mut lazy = base("lazy", FingerprintAlgo::Blake3);
    lazy.index = IndexKind::Lazy;
    // Index memory far below the index: buffered searches, prefetches,
    // forced flushes; GC makes the commit rebuild the index.
    lazy.index_cache_bytes = 512 << 10;
    lazy.lazy_bft = 8;
    lazy.lazy_prefetch = 256;
    cases.push(Case {
        name: "lazy-gc",
        config: lazy,
        gc: Some((3, GcOptions::default())),
        cache: 4,
        memory: false,
    });

    let mut capping = base("capping", FingerprintAlgo::Sha1);
    capping.rewrite.kind = RewriteKind::Capping;
    capping.rewrite.segment_bytes = 512 << 10;
    capping.rewrite.capping_level = 2;
    cases.push(Case {
        name: "capping",
        config: capping,
        gc: None,
        cache: 4,
        memory: true,
    });

    let mut har = base("har", FingerprintAlgo::Sha256);
    har.rewrite.kind = RewriteKind::Har;
    har.rewrite.har_utilization = 0.7;
    cases.push(Case {
        name: "har",
        config: har,
        gc: None,
        cache: 4,
        memory: true,
    });

    cases.push(Case {
        name: "gc-keep3",
        config: base("gc", FingerprintAlgo::Sha1),
        gc: Some((3, GcOptions::default())),
        cache: 4,
        memory: true,
    });

    cases.push(Case {
        name: "gc-keep3-random",
        config: base("gc-random", FingerprintAlgo::Sha1),
        gc: Some((
            3,
            GcOptions {
                threshold_pct: 20.0,
                defrag: Defrag::Random,
                segment: 4,
                split_threshold: 16 << 10,
                fill: true,
                ..GcOptions::default()
            },
        )),
        cache: 4,
        memory: true,
    });

    cases.push(Case {
        name: "gc-keep3-gccdf",
        config: base("gccdf", FingerprintAlgo::Blake3),
        gc: Some((
            3,
            GcOptions {
                threshold_pct: 20.0,
                defrag: Defrag::Gccdf,
                segment: 4,
                split_threshold: 16 << 10,
                fill: true,
                ..GcOptions::default()
            },
        )),
        cache: 4,
        memory: true,
    });
    cases
}

/// Writes the Destor trace of one version, as the repository would chunk and hash it.
fn trace_of(version: &Path, config: &Config, out: &Path) -> PathBuf {
    let path = out.join(format!(
        "{}.trace",
        version.file_stem().unwrap().to_string_lossy()
    ));
    let file = BufWriter::new(File::create(&path).unwrap());
    write_data_trace(
        &[version.to_path_buf()],
        config.chunker,
        config.fingerprint,
        file,
    )
    .unwrap();
    path
}

fn replay(repo: &Repository, trace: &Path, label: &str) -> Snapshot {
    let mut reader = TraceFile::open(trace).unwrap();
    let mut chunks = std::iter::from_fn(|| match reader.next_chunk() {
        Ok(Some(c)) => Some(Ok((Fingerprint(c.fp), c.size))),
        Ok(None) => None,
        Err(e) => Some(Err(tessera::Error::InvalidConfig(e.to_string()))),
    });
    let options = BackupOptions {
        label: label.into(),
        source: "syn".into(),
        progress: None,
        ..Default::default()
    };
    backup(repo, Input::Trace(&mut chunks), &options)
        .unwrap()
        .snapshot
}

fn backup_data(repo: &Repository, version: &Path, label: &str) -> Snapshot {
    let mut input = File::open(version).unwrap();
    let name = version.display().to_string();
    let options = BackupOptions {
        label: label.into(),
        source: "syn".into(),
        progress: None,
        ..Default::default()
    };
    backup(
        repo,
        Input::Stream {
            input: &mut input,
            name: &name,
        },
        &options,
    )
    .unwrap()
    .snapshot
}

/// The metadata-only part of a backup's statistics (no timings, no bytes
/// written: trace containers have no data section).
fn backup_metrics(s: &BackupStats, memory: bool) -> impl PartialEq + std::fmt::Debug {
    let i = &s.index;
    (
        (s.logical_bytes, s.stored_bytes, s.chunks, s.unique_chunks),
        (
            s.unique,
            s.internal_duplicates,
            s.duplicates,
            s.rewritten,
            s.containers_written,
        ),
        s.dedup_ratio,
        (
            i.policy.clone(),
            i.entries,
            memory.then_some(i.memory_bytes),
            i.lookups,
            i.disk_lookups,
            i.rebuilt,
            i.containers_scanned,
        ),
        (
            i.cache_hits,
            i.bloom_negatives,
            i.bloom_false_positives,
            i.container_loads,
            i.bloom_bytes,
            i.cache_peak_bytes,
            i.table_bytes,
        ),
        (
            i.prefetches,
            i.log_reads,
            i.cache_lookups,
            i.prelookup_hits,
            i.postlookup_hits,
            i.forced_flushes,
            i.buffer_peak_bytes,
        ),
    )
}

fn restore_metrics(s: &RestoreStats) -> impl PartialEq + std::fmt::Debug {
    (
        s.bytes_restored,
        s.chunks,
        s.containers_read,
        s.extents,
        s.bytes_read,
        s.read_amplification,
        s.speed_factor,
        s.cache_containers,
        s.policy.clone(),
    )
}

/// GC metrics that depend on metadata only (bytes read and written differ:
/// a trace repository's containers have no data section).
fn gc_metrics(s: &GcStats) -> impl PartialEq + std::fmt::Debug {
    (
        (
            s.containers_total,
            s.containers_involved,
            s.containers_reclaimed,
            s.containers_produced,
        ),
        (s.chunks_moved, s.bytes_moved, s.bytes_freed),
        (s.recipes_rewritten, s.uncommitted_recipes_removed),
        (s.segments, s.tree_leaves, s.tree_nodes),
    )
}

/// Sum of the containers' nominal sizes (header + metadata + data section,
/// as if the data were present), read from their headers.
fn nominal_physical_bytes(repo: &Repository) -> u64 {
    repo.containers()
        .unwrap()
        .into_iter()
        .map(|cid| {
            let head = repo
                .backend()
                .read_range(&container::key(cid), 0, container::HEADER_LEN as u64)
                .unwrap();
            container::Header::parse(cid, &head).unwrap().total_len() as u64
        })
        .sum()
}

/// Runs one case; returns how many metric groups it compared.
fn check_case(case: &Case, paths: &[PathBuf]) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let data_repo = Repository::init(&dir.path().join("data"), case.config.clone()).unwrap();
    let mut trace_config = case.config.clone();
    trace_config.trace = true;
    let trace_repo = Repository::init(&dir.path().join("trace"), trace_config).unwrap();
    let traces = dir.path().join("traces");
    std::fs::create_dir_all(&traces).unwrap();
    let policies = [CachePolicy::Lru, CachePolicy::Opt, CachePolicy::Faa];
    let mut compared = 0;
    let mut rewritten = 0;
    let mut gc_produced = 0;
    for (i, version) in paths.iter().enumerate() {
        let n = i + 1;
        let at = format!("{} v{n}", case.name);
        let label = format!("v{n}");
        let d = backup_data(&data_repo, version, &label);
        let trace = trace_of(version, &case.config, &traces);
        let t = replay(&trace_repo, &trace, &label);
        assert!(t.stats.logical_bytes > 0);
        assert_eq!(d.id, t.id, "{at}: backup id");
        assert_eq!(
            backup_metrics(&d.stats, case.memory),
            backup_metrics(&t.stats, case.memory),
            "{at}: backup metrics (data vs trace)"
        );
        // The recipes name the same chunks in the same containers.
        assert!(
            data_repo.recipe(d.id).unwrap() == trace_repo.recipe(t.id).unwrap(),
            "{at}: recipes differ"
        );
        rewritten += d.stats.rewritten.chunks;
        compared += 2;

        if let Some((keep, options)) = case.gc {
            let fd = forget_keep_last(&data_repo, keep, false).unwrap();
            let ft = forget_keep_last(&trace_repo, keep, false).unwrap();
            assert_eq!(fd, ft, "{at}: forgotten backups");
            let gd = gc(&data_repo, options).unwrap();
            let gt = gc(&trace_repo, options).unwrap();
            assert_eq!(gc_metrics(&gd), gc_metrics(&gt), "{at}: GC metrics");
            gc_produced += gd.containers_produced;
            compared += 1;
        }

        assert_eq!(
            data_repo.containers().unwrap(),
            trace_repo.containers().unwrap(),
            "{at}: container ids"
        );
        assert_eq!(
            nominal_physical_bytes(&data_repo),
            nominal_physical_bytes(&trace_repo),
            "{at}: nominal container bytes"
        );
        let td = tessera::commands::stats::totals(&data_repo).unwrap();
        let tt = tessera::commands::stats::totals(&trace_repo).unwrap();
        assert_eq!(
            (td.backups, td.logical_bytes, td.containers),
            (tt.backups, tt.logical_bytes, tt.containers),
            "{at}: repository totals"
        );
        compared += 2;

        // Restore the newest backup (and, with retention, the oldest kept one).
        let mut targets = vec![d.id];
        let oldest = data_repo.backups().unwrap()[0];
        if oldest != d.id {
            targets.push(oldest);
        }
        for id in targets {
            for policy in policies {
                let options = RestoreOptions {
                    cache_containers: case.cache,
                    policy,
                    progress: None,
                    skip_damaged: false,
                };
                let rd = restore(&data_repo, id, &mut io::sink(), &options).unwrap();
                let rt = restore(&trace_repo, id, &mut io::sink(), &options).unwrap();
                assert!(!rd.plan_only && rt.plan_only);
                assert_eq!(
                    restore_metrics(&rd),
                    restore_metrics(&rt),
                    "{at}: restore of backup {id} with {}",
                    policy.name()
                );
                compared += 1;
            }
        }
    }
    if case.config.rewrite.kind != RewriteKind::None {
        assert!(
            rewritten > 0,
            "{}: the rewrite policy never acted",
            case.name
        );
    }
    if case.gc.is_some() {
        assert!(gc_produced > 0, "{}: GC never copied forward", case.name);
    }
    compared
}

macro_rules! replay_case {
    ($test:ident, $name:literal) => {
        #[test]
        fn $test() {
            let (_, paths) = dataset();
            let case = cases().into_iter().find(|c| c.name == $name).unwrap();
            assert!(check_case(&case, paths) > 0);
        }
    };
}

replay_case!(trace_replay_equals_data_exact_index, "exact-sha1");
replay_case!(trace_replay_equals_data_ddfs_index, "ddfs-blake3");
replay_case!(trace_replay_equals_data_lazy_index_with_gc, "lazy-gc");
replay_case!(trace_replay_equals_data_capping_rewrite, "capping");
replay_case!(trace_replay_equals_data_har_rewrite, "har");
replay_case!(trace_replay_equals_data_gc_keep_last_3, "gc-keep3");
replay_case!(
    trace_replay_equals_data_gc_random_order_keep_last_3,
    "gc-keep3-random"
);

/// GCCDF's plan (ownership tree, migration order) depends only on the
/// recipes: its reference filters are seeded, so trace and data runs (and
/// two data runs) produce the same tree, containers and later restores.
#[test]
fn trace_replay_equals_data_gc_gccdf_keep_last_3() {
    let (_, paths) = dataset();
    let case = cases()
        .into_iter()
        .find(|c| c.name == "gc-keep3-gccdf")
        .unwrap();
    for _ in 0..10 {
        check_case(&case, paths);
    }
}

/// Repository totals as the engine reports them: physical bytes and the
/// actual dedup ratio of a trace repository count its containers at their
/// nominal size (with the data section they stand for), as in the data run.
#[test]
fn trace_repository_totals_equal_data_totals() {
    let (_, paths) = dataset();
    let case = cases().into_iter().next().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data_repo = Repository::init(&dir.path().join("data"), case.config.clone()).unwrap();
    let mut trace_config = case.config.clone();
    trace_config.trace = true;
    let trace_repo = Repository::init(&dir.path().join("trace"), trace_config).unwrap();
    for (i, version) in paths.iter().take(2).enumerate() {
        let label = format!("v{}", i + 1);
        backup_data(&data_repo, version, &label);
        let trace = trace_of(version, &case.config, dir.path());
        replay(&trace_repo, &trace, &label);
        assert_eq!(
            tessera::commands::stats::totals(&data_repo).unwrap(),
            tessera::commands::stats::totals(&trace_repo).unwrap(),
            "v{}: repository totals (physical bytes, dedup ratio)",
            i + 1
        );
    }
}
