//! Lifecycle layout (MFDedup) measurements, in one run:
//!
//! * **delete**: deleting the oldest backup of a lineage with 10 and with 100
//!   versions stored (small versions), the median over several runs each:
//!   MFDedup deletes whole volumes, so the time should not grow with the
//!   number of versions (±20 %). Each run deletes the oldest backup with
//!   `lifecycle::delete_backups` (timed), then backs up one more version
//!   (not timed) so the count stays the same; runs alternate between the
//!   two lineages.
//! * **restore**: after 30 versions of about `--version-mib` MiB each
//!   (keeping the newest 20), the oldest and the newest retained version are
//!   restored to a sink (every chunk verified) and, separately, the volume
//!   and category files under `lifecycle/` that the restore reads are read
//!   sequentially with `std::fs` (MFDedup's *fread()*): restore MB/s
//!   (restored bytes) against read MB/s, median over several runs. As root
//!   the page cache is dropped before each, so both are cold; otherwise
//!   both are warm and the output says so.
//! * **generated** (only with `LIFECYCLE_GEN_DIR` set to a `tessera gen`
//!   directory): every version of the dataset (as listed in MANIFEST.tsv)
//!   into a lifecycle and a container repository: stored bytes, per-version
//!   restores (read amplification, extents), forget keep-last 20, deleting
//!   a middle backup, every live version restored byte-identical and
//!   `check --read-data` clean. (`LIFECYCLE_ONE_LINEAGE=1` puts every source
//!   into one lineage, MFDedup's own assumption.)
//!
//! Run: `cargo bench -p tessera --bench lifecycle`. Options (environment):
//! `LIFECYCLE_BENCH_RUNS` (default 31), `LIFECYCLE_BENCH_VERSION_MIB`
//! (default 24), `LIFECYCLE_BENCH_WARM=1` (never drop the page cache: both
//! warm, the restore's CPU ceiling), `LIFECYCLE_BENCH_DIR` (where the temporary repositories go;
//! default: cargo's target tmp dir). Exits non-zero if a criterion fails.

#[path = "util/mod.rs"]
mod util;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tessera::backup::{backup as run_backup, BackupOptions, Input, Outcome};
use tessera::commands::check::CheckOptions;
use tessera::layout::lifecycle::{self, LifecycleRestoreOptions, LifecycleRestoreStats};
use tessera::repo::config::{Config, Layout};
use tessera::Repository;
use util::median;

#[path = "../tests/common/mod.rs"]
mod common;
use common::{edit, Rng};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn lifecycle_config() -> Config {
    let mut c = Config::new("lifecycle-bench".into());
    c.layout = Layout::Lifecycle;
    c
}

fn backup(repo: &Repository, source: &str, data: &[u8]) -> Outcome {
    let options = BackupOptions {
        label: String::new(),
        source: source.into(),
        progress: None,
        ..Default::default()
    };
    let mut input = data;
    run_backup(
        repo,
        Input::Stream {
            input: &mut input,
            name: "bench",
        },
        &options,
    )
    .expect("backup")
}

fn drop_caches() -> bool {
    if std::env::var_os("LIFECYCLE_BENCH_WARM").is_some() {
        return false;
    }
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

/// A lineage with a fixed number of versions stored, for deletion timing.
struct DeleteBench {
    _dir: tempfile::TempDir,
    repo: Repository,
    data: Vec<u8>,
    seed: u64,
    stored: usize,
    secs: Vec<f64>,
}

impl DeleteBench {
    fn new(base: &Path, stored: usize) -> DeleteBench {
        let dir = tempfile::tempdir_in(base).expect("tempdir");
        let repo = Repository::init(&dir.path().join("repo"), lifecycle_config()).expect("init");
        let mut b = DeleteBench {
            _dir: dir,
            repo,
            data: Rng(stored as u64).bytes(512 * 1024),
            seed: 1000,
            stored,
            secs: Vec::new(),
        };
        for _ in 0..stored {
            b.next_version();
        }
        b
    }

    fn next_version(&mut self) {
        self.seed += 1;
        self.data = edit(&self.data, 4, 4096, self.seed);
        backup(&self.repo, "delete-bench", &self.data);
    }

    /// Deletes the oldest backup (timed), then backs up one more version.
    fn run(&mut self) {
        let ids = self.repo.backups().expect("backups");
        assert_eq!(ids.len(), self.stored);
        let t = Instant::now();
        let d = lifecycle::delete_backups(&self.repo, &ids[..1]).expect("delete");
        self.secs.push(t.elapsed().as_secs_f64());
        assert_eq!(
            (d.volumes_deleted, d.volumes_truncated),
            (1, 0),
            "deleting the oldest deletes one volume: {d:?}"
        );
        self.next_version();
    }

    /// (median, min, max) seconds.
    fn summary(&mut self) -> (f64, f64, f64) {
        let (min, max) = self
            .secs
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &s| (a.min(s), b.max(s)));
        (median(self.secs.clone()), min, max)
    }
}

/// The object files restoring lineage version `k` reads when `r` is arranged
/// (as `Lineage::required` chooses them), in reading order.
fn objects_read(root: &Path, source: &str, k: u64, r: u64) -> Vec<PathBuf> {
    let l = root
        .join(lifecycle::LIFECYCLE_DIR)
        .join(lifecycle::lineage_name(source));
    let names = |sub: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(l.join(sub))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let mut out = Vec::new();
    for n in names("vol") {
        if let Some((j, _, first)) = lifecycle::parse_vol_name(&n) {
            if k <= j && j < r && first <= k {
                out.push(l.join("vol").join(n));
            }
        }
    }
    for n in names("cat") {
        if let Some((i, j, _)) = lifecycle::parse_cat_name(&n) {
            if j == r && i <= k {
                out.push(l.join("cat").join(n));
            }
        }
    }
    out
}

/// Reads `files` sequentially, whole; returns (seconds, bytes).
fn read_files(files: &[PathBuf]) -> (f64, u64) {
    let t = Instant::now();
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0u64;
    for f in files {
        let mut file = File::open(f).expect("open");
        loop {
            let n = file.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            total += n as u64;
        }
    }
    (t.elapsed().as_secs_f64(), total)
}

fn mb_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-9)
}

/// Restore vs sequential read of the oldest and newest retained version.
fn restore_vs_read(base: &Path, version_mib: usize, runs: usize) -> bool {
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let root = dir.path().join("repo");
    let repo = Repository::init(&root, lifecycle_config()).expect("init");
    let size = version_mib << 20;
    let mut data = Rng(77).bytes(size);
    // About 2 % of the bytes change per version, in edits of up to 64 KiB.
    let edits = ((size / 50) / 32768).max(4) as u32;
    let mut originals = BTreeMap::new();
    let t = Instant::now();
    for v in 0..30u64 {
        data = edit(&data, edits, 65536, 5000 + v);
        let out = backup(&repo, "restore-bench", &data);
        originals.insert(out.snapshot.id, data.clone());
        let d = lifecycle::forget_keep_last(&repo, 20).expect("forget");
        for id in d.deleted {
            originals.remove(&id);
        }
    }
    println!(
        "restore: 30 versions of {version_mib} MiB backed up (keeping 20) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let ids: Vec<u64> = originals.keys().copied().collect();
    let mut ok = true;
    let mut all_cold = true;
    for (what, id) in [
        ("oldest", ids[0]),
        ("newest", *ids.last().expect("a backup")),
    ] {
        let (mut restore, mut read) = (Vec::new(), Vec::new());
        let mut last: Option<LifecycleRestoreStats> = None;
        let mut read_bytes = 0;
        // Once, to memory: byte-identical, and which objects it reads.
        let mut out = Vec::with_capacity(size + (1 << 20));
        let s =
            lifecycle::restore_to_writer(&repo, id, &mut out, &LifecycleRestoreOptions::default())
                .expect("restore");
        assert!(out == originals[&id], "{what} restored wrong bytes");
        drop(out);
        let files = objects_read(&root, "restore-bench", s.version, s.arranged);
        assert_eq!(files.len() as u64, s.objects_read, "objects of {what}");
        for _ in 0..runs {
            // Timed: the restore to a discarding sink.
            all_cold &= drop_caches();
            let s = lifecycle::restore_to_writer(
                &repo,
                id,
                &mut std::io::sink(),
                &LifecycleRestoreOptions::default(),
            )
            .expect("restore");
            restore.push(s.throughput_mb_s);
            all_cold &= drop_caches();
            let (secs, bytes) = read_files(&files);
            read.push(mb_s(bytes, secs));
            read_bytes = bytes;
            last = Some(s);
        }
        let s = last.expect("runs >= 1");
        let (restore, read) = (median(restore.clone()), median(read.clone()));
        let ratio = restore / read;
        let pass = ratio >= 0.8;
        ok &= pass;
        println!(
            "restore {what} (backup {id}, version {} of {} arranged): {:.1} MB restored at {restore:.0} MB/s; \
             read amplification {:.4}, {} extents, {} objects; sequential read of those {} files \
             ({:.1} MB) {read:.0} MB/s; restore/read {ratio:.2} (>= 0.80: {})",
            s.version,
            s.arranged,
            s.bytes_restored as f64 / 1e6,
            s.read_amplification,
            s.extents,
            s.objects_read,
            files.len(),
            read_bytes as f64 / 1e6,
            if pass { "yes" } else { "NO" }
        );
    }
    println!(
        "restore: page cache {} (median of {runs} runs each)",
        if all_cold {
            "dropped before every restore and every read: both cold"
        } else {
            "not dropped (not root, or LIFECYCLE_BENCH_WARM): both warm"
        }
    );
    ok
}

/// The former ignored test: a `tessera gen` dataset into both layouts.
fn generated(gen: &Path, base: &Path) {
    let manifest = std::fs::read_to_string(gen.join("MANIFEST.tsv")).expect("MANIFEST.tsv");
    let one = std::env::var_os("LIFECYCLE_ONE_LINEAGE").is_some();
    let files: Vec<(String, String)> = manifest
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let source = if one { String::new() } else { f[1].to_string() };
            (f[0].to_string(), source)
        })
        .collect();
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let lrepo = Repository::init(&dir.path().join("lifecycle"), lifecycle_config()).expect("init");
    let crepo =
        Repository::init(&dir.path().join("container"), Config::new("bench".into())).expect("init");
    let (mut logical, mut l_stored, mut c_stored) = (0u64, 0u64, 0u64);
    let (mut l_secs, mut a_secs, mut c_secs) = (0.0, 0.0, 0.0);
    let mut ids = Vec::new();
    for (file, source) in &files {
        let data = std::fs::read(gen.join(file)).expect("version file");
        let t = Instant::now();
        let out = backup(&lrepo, source, &data);
        l_secs += t.elapsed().as_secs_f64();
        a_secs += out.arrange.as_ref().map_or(0.0, |a| a.seconds);
        let t = Instant::now();
        let cs = backup(&crepo, source, &data).snapshot;
        c_secs += t.elapsed().as_secs_f64();
        logical += data.len() as u64;
        l_stored += out.snapshot.stats.stored_bytes;
        c_stored += cs.stats.stored_bytes;
        ids.push((out.snapshot.id, cs.id, file.clone()));
    }
    println!(
        "generated: {} versions, {:.1} MiB logical; stored: lifecycle (NDF) {:.1} MiB (ratio {:.2}), \
         container (exact) {:.1} MiB (ratio {:.2}); backup seconds: lifecycle {l_secs:.2} \
         (arranging {a_secs:.2}), container {c_secs:.2}",
        files.len(),
        logical as f64 / 1048576.0,
        l_stored as f64 / 1048576.0,
        logical as f64 / l_stored as f64,
        c_stored as f64 / 1048576.0,
        logical as f64 / c_stored as f64
    );
    println!("version  lc_read_amp  lc_extents  lc_objects  lc_MB/s  ct_read_amp  ct_containers  ct_MB/s");
    let out = dir.path().join("restored");
    for (lid, cid, file) in &ids {
        let s = lifecycle::restore_to_file(&lrepo, *lid, &out, &LifecycleRestoreOptions::default())
            .expect("restore");
        let c = tessera::restore::restore(
            &crepo,
            *cid,
            &mut std::io::sink(),
            &tessera::restore::RestoreOptions::default(),
        )
        .expect("restore");
        println!(
            "{file}  {:.4}  {}  {}  {:.0}  {:.4}  {}  {:.0}",
            s.read_amplification,
            s.extents,
            s.objects_read,
            s.throughput_mb_s,
            c.read_amplification,
            c.containers_read,
            c.throughput_mb_s
        );
    }
    let t = Instant::now();
    let d = lifecycle::forget_keep_last(&lrepo, 20).expect("forget");
    println!(
        "forget keep-last 20: {} backups, {:.1} MiB freed, {} volumes deleted, {} truncated, {:.3} s",
        d.deleted.len(),
        d.bytes_freed as f64 / 1048576.0,
        d.volumes_deleted,
        d.volumes_truncated,
        t.elapsed().as_secs_f64()
    );
    let live = lrepo.backups().expect("backups");
    if live.len() > 10 {
        let middle = live[live.len() - 10];
        let t = Instant::now();
        let d = lifecycle::delete_backups(&lrepo, &[middle]).expect("delete");
        println!(
            "delete middle backup {middle}: {:.1} MiB freed, {} truncated, {:.3} s",
            d.bytes_freed as f64 / 1048576.0,
            d.volumes_truncated,
            t.elapsed().as_secs_f64()
        );
    }
    let live = lrepo.backups().expect("backups");
    for (lid, _, file) in &ids {
        if live.contains(lid) {
            let s =
                lifecycle::restore_to_file(&lrepo, *lid, &out, &LifecycleRestoreOptions::default())
                    .expect("restore");
            assert!(s.read_amplification <= 1.0, "{file}: {s:?}");
            let orig = std::fs::read(gen.join(file)).expect("version file");
            assert!(std::fs::read(&out).expect("restored") == orig, "{file}");
        }
    }
    let report = tessera::commands::check::check(
        &lrepo,
        CheckOptions {
            read_data: true,
            ..Default::default()
        },
    )
    .expect("check");
    assert!(report.is_ok(), "{:?}", report.problems);
    println!("generated: every live version restored byte-identical, check --read-data clean");
}

fn main() {
    let runs = env_num("LIFECYCLE_BENCH_RUNS", 31).max(1) as usize;
    let version_mib = env_num("LIFECYCLE_BENCH_VERSION_MIB", 24).max(1) as usize;
    let base = std::env::var_os("LIFECYCLE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).expect("bench dir");
    let mut ok = true;

    // Runs alternate between the two lineages, so that load from elsewhere
    // on the machine affects both alike.
    let mut benches = [DeleteBench::new(&base, 10), DeleteBench::new(&base, 100)];
    for _ in 0..runs {
        for b in &mut benches {
            b.run();
        }
    }
    let mut delete = Vec::new();
    for b in &mut benches {
        let (med, min, max) = b.summary();
        println!(
            "delete oldest with {:>3} versions stored: median {:.3} ms (min {:.3}, max {:.3}; {runs} runs)",
            b.stored,
            med * 1e3,
            min * 1e3,
            max * 1e3
        );
        delete.push(med);
    }
    let ratio = delete[1] / delete[0];
    let pass = (0.8..=1.2).contains(&ratio);
    ok &= pass;
    println!(
        "delete oldest: 100 versions / 10 versions = {ratio:.2} (within 0.80..=1.20: {})",
        if pass { "yes" } else { "NO" }
    );

    ok &= restore_vs_read(&base, version_mib, runs);

    if let Some(gen) = std::env::var_os("LIFECYCLE_GEN_DIR") {
        generated(Path::new(&gen), &base);
    }
    if !ok {
        eprintln!("lifecycle bench: a criterion failed");
        std::process::exit(1);
    }
}
