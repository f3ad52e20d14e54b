//! End-to-end throughput of backup and restore against plain baselines.
//!
//! Run with `cargo bench -p tessera --bench throughput`. Every run uses a
//! fresh repository (unencrypted, uncompressed, with the DDFS index that
//! `tessera init` gives new repositories) and measures:
//!
//! * **baseline**: the repository's chunker over the in-memory input on one
//!   thread, BLAKE3 fingerprints of each block's chunks in parallel (rayon),
//!   nothing else — the pipeline's shape without index, containers or I/O;
//! * **write baseline**: the baseline while the same bytes are written
//!   durably, as container-sized objects, by the repository's local backend
//!   on [`WRITERS`] threads (copied into aligned buffers, written with the
//!   backend's direct I/O, synced, linked into place): the least a backup of
//!   new data must do beyond chunking and hashing;
//! * **(a)** a backup of fresh random data, / baseline, and / write baseline;
//! * **(b)** a backup of the same data again (every chunk a duplicate), / baseline;
//! * **(c)** a restore of the first backup to a sink (every chunk still
//!   verified), / reading all its container files sequentially with `std::fs`.
//!   When run as root the page cache is dropped before both, so both are cold;
//!   otherwise both are warm and the output says so.
//!
//! Options (arguments override the environment):
//! `--size-mib N` / `TESSERA_BENCH_MIB` (default 512),
//! `--runs N` / `TESSERA_BENCH_RUNS` (default 7),
//! `--dir PATH` / `TESSERA_BENCH_DIR` (where the temporary repositories go;
//! default: cargo's target tmp dir, on the same disk as `target/`),
//! `--quiet` (no per-run lines).

#[path = "util/mod.rs"]
mod util;
use crossbeam_channel::bounded;
use rayon::prelude::*;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tessera::backend::{AlignedBuf, Local, ObjectStore};
use tessera::backup::{backup, BackupOptions};
use tessera::chunker::{cut_all, Chunker};
use tessera::format::snapshot::Snapshot;
use tessera::repo::config::{Config, IndexKind};
use tessera::restore::{restore, RestoreOptions};
use tessera::Repository;
use tessera::{Fingerprint, FingerprintAlgo};
use util::{cpu_seconds, median, random_bytes};

/// Block size of the baseline's chunking thread: the backup pipeline's
/// (override with `TESSERA_BENCH_BASELINE_BLOCK_KIB` to compare).
const BASELINE_BLOCK: usize = 1024 * 1024;

struct Options {
    size_mib: usize,
    runs: usize,
    dir: PathBuf,
    quiet: bool,
}

fn options() -> Options {
    let env_num = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default)
    };
    let mut o = Options {
        size_mib: env_num("TESSERA_BENCH_MIB", 512),
        runs: env_num("TESSERA_BENCH_RUNS", 7),
        dir: std::env::var_os("TESSERA_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR"))),
        quiet: false,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1);
        match args[i].as_str() {
            "--size-mib" => {
                o.size_mib = value.and_then(|v| v.parse().ok()).expect("--size-mib N");
                i += 1;
            }
            "--runs" => {
                o.runs = value.and_then(|v| v.parse().ok()).expect("--runs N");
                i += 1;
            }
            "--dir" => {
                o.dir = PathBuf::from(value.expect("--dir PATH"));
                i += 1;
            }
            "--quiet" => o.quiet = true,
            // `cargo bench` passes `--bench`; ignore it and any filter.
            _ => {}
        }
        i += 1;
    }
    o.size_mib = o.size_mib.max(1);
    o.runs = o.runs.max(1);
    o
}

/// Chunks `data` on one thread and fingerprints each block's chunks in
/// parallel with rayon: the same structure as the backup pipeline, and nothing else.
fn baseline(data: &[u8], chunker: &dyn Chunker, algo: FingerprintAlgo) -> (Duration, usize) {
    let block = std::env::var("TESSERA_BENCH_BASELINE_BLOCK_KIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(BASELINE_BLOCK, |kib| kib * 1024)
        .max(4 * chunker.max_size());
    let started = Instant::now();
    let (tx, rx) = bounded::<(usize, Vec<u32>)>(2);
    let chunks = std::thread::scope(|s| {
        s.spawn(move || {
            let mut pos = 0;
            while pos < data.len() {
                let end = (pos + block).min(data.len());
                let eof = end == data.len();
                let mut lengths = Vec::with_capacity((end - pos) / 4096 + 1);
                let used = cut_all(chunker, &data[pos..end], eof, &mut lengths);
                if tx.send((pos, lengths)).is_err() {
                    return;
                }
                pos += used;
            }
        });
        let mut chunks = 0;
        for (start, lengths) in rx {
            let mut offsets = Vec::with_capacity(lengths.len());
            let mut off = start;
            for &len in &lengths {
                offsets.push(off);
                off += len as usize;
            }
            let fps: Vec<Fingerprint> = offsets
                .par_iter()
                .zip(lengths.par_iter())
                .map(|(&off, &len)| algo.hash(&data[off..off + len as usize]))
                .collect();
            chunks += std::hint::black_box(fps).len();
        }
        chunks
    });
    (started.elapsed(), chunks)
}

/// Threads of the write baseline: as many as a backup's container writers.
const WRITERS: usize = 4;

/// The baseline while [`WRITERS`] threads write `data` durably into `dir`
/// as new objects of `object_size` bytes through the local backend (each
/// copied into an aligned buffer first, as a container is filled): both
/// start together; the time is that of the later to finish.
fn baseline_written(
    data: &[u8],
    chunker: &dyn Chunker,
    algo: FingerprintAlgo,
    dir: &Path,
    object_size: usize,
) -> Duration {
    let backend = Local::new(dir);
    let next = AtomicUsize::new(0);
    let pieces = data.len().div_ceil(object_size);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..WRITERS {
            s.spawn(|| {
                let mut buf = AlignedBuf::with_capacity(object_size);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= pieces {
                        break;
                    }
                    let piece = &data[i * object_size..((i + 1) * object_size).min(data.len())];
                    buf.clear();
                    buf.extend_from_slice(piece);
                    backend
                        .write_new(&format!("w/{i:08}"), &[buf.as_slice()])
                        .expect("writing the write baseline's object");
                }
            });
        }
        baseline(data, chunker, algo);
    });
    started.elapsed()
}

/// Writes dirty pages and drops the page cache; false if not permitted.
fn drop_caches() -> bool {
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

/// Reads every container file of the repository at `root` sequentially.
fn read_containers(root: &Path) -> (Duration, u64) {
    let dir = root.join(tessera::layout::container::CONTAINER_DIR);
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("listing containers")
        .map(|e| e.expect("listing containers").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| !n.to_string_lossy().starts_with('.'))
        })
        .collect();
    names.sort();
    let started = Instant::now();
    let mut bytes = 0u64;
    for path in &names {
        bytes += std::hint::black_box(std::fs::read(path).expect("reading container")).len() as u64;
    }
    (started.elapsed(), bytes)
}

/// Wall time and CPU seconds of `f`.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration, f64) {
    let cpu = cpu_seconds();
    let t = Instant::now();
    let out = f();
    (out, t.elapsed(), cpu_seconds() - cpu)
}

fn mb_s(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / 1e6 / t.as_secs_f64().max(1e-9)
}

/// Measurements of one run: MB/s and CPU seconds.
struct Run {
    /// Baseline bracketing (a): mean time of the runs just before and after.
    base_a: f64,
    /// Baseline bracketing (b).
    base_b: f64,
    /// Write baseline bracketing (a).
    base_w: f64,
    fresh: f64,
    dup: f64,
    read: f64,
    restore: f64,
    cpu_base: f64,
    cpu_base_w: f64,
    cpu_fresh: f64,
    cpu_dup: f64,
    cpu_read: f64,
    cpu_restore: f64,
    /// Stage seconds of (a) and (b), in [`STAGES`] order.
    stages_fresh: [f64; 6],
    stages_dup: [f64; 6],
}

/// The backup stages the snapshot times (docs/ARCHITECTURE.md, the pipeline).
const STAGES: [&str; 6] = ["chunk", "fp", "index", "store", "write", "commit"];

fn stage_array(s: &Snapshot) -> [f64; 6] {
    let st = &s.stats.stage_seconds;
    [
        st.chunk,
        st.fingerprint,
        st.index,
        st.store,
        st.write,
        st.commit,
    ]
}

impl Run {
    fn ratio_a(&self) -> f64 {
        self.fresh / self.base_a
    }
    fn ratio_w(&self) -> f64 {
        self.fresh / self.base_w
    }
    fn ratio_b(&self) -> f64 {
        self.dup / self.base_b
    }
    fn ratio_c(&self) -> f64 {
        self.restore / self.read
    }
}

fn stages(s: &Snapshot) -> String {
    STAGES
        .iter()
        .zip(stage_array(s))
        .map(|(name, t)| format!("{name} {t:.2}s"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn one_run(o: &Options, data: &[u8], run: usize, cold: &mut bool) -> Run {
    let tmp = tempfile::tempdir_in(&o.dir).expect("creating temporary directory");
    let root = tmp.path().join("repo");
    let mut config = Config::new(format!("bench{run}"));
    // The index `tessera init` gives new repositories.
    config.index = IndexKind::Ddfs;
    let chunker = config.chunker.build().expect("chunker");
    let algo = config.fingerprint;
    let logical = data.len() as u64;
    // Each backup is bracketed by baselines, so that load from elsewhere on
    // the machine affects a measurement and its reference alike.
    let base = || timed(|| baseline(data, chunker.as_ref(), algo));
    let written = tmp.path().join("written");
    let base_w = || {
        let out = timed(|| {
            baseline_written(
                data,
                chunker.as_ref(),
                algo,
                &written,
                config.container_size as usize,
            )
        });
        std::fs::remove_dir_all(&written).expect("removing the write baseline's objects");
        out
    };

    let repo = Repository::init(&root, config.clone()).expect("init");
    let options = BackupOptions::default();
    let (w1, _, cw1) = base_w();
    let (_, b1, c1) = base();
    let (first, t, cpu_fresh) = timed(|| {
        backup(
            &repo,
            tessera::backup::Input::Stream {
                input: &mut Cursor::new(data),
                name: "input",
            },
            &options,
        )
        .map(|o| o.snapshot)
        .expect("backup")
    });
    let fresh = mb_s(logical, t);
    assert_eq!(first.logical_bytes, logical);

    let (_, b2, c2) = base();
    let (w2, _, cw2) = base_w();
    let (second, t, cpu_dup) = timed(|| {
        backup(
            &repo,
            tessera::backup::Input::Stream {
                input: &mut Cursor::new(data),
                name: "input",
            },
            &options,
        )
        .map(|o| o.snapshot)
        .expect("backup")
    });
    let dup = mb_s(logical, t);
    assert_eq!(
        second.stats.unique.bytes, 0,
        "the second backup stored new chunks"
    );
    let (_, b3, c3) = base();

    *cold &= drop_caches();
    let ((t, container_bytes), _, cpu_read) = timed(|| read_containers(&root));
    let read = mb_s(container_bytes, t);

    *cold &= drop_caches();
    let (restored, t, cpu_restore) = timed(|| {
        restore(
            &repo,
            first.id,
            &mut std::io::sink(),
            &RestoreOptions::default(),
        )
        .expect("restore")
    });
    let restore_mb_s = mb_s(restored.bytes_restored, t);
    assert_eq!(restored.bytes_restored, logical);

    let r = Run {
        base_a: mb_s(logical, (b1 + b2) / 2),
        base_b: mb_s(logical, (b2 + b3) / 2),
        base_w: mb_s(logical, (w1 + w2) / 2),
        fresh,
        dup,
        read,
        restore: restore_mb_s,
        cpu_base: (c1 + c2 + c3) / 3.0,
        cpu_base_w: (cw1 + cw2) / 2.0,
        cpu_fresh,
        cpu_dup,
        cpu_read,
        cpu_restore,
        stages_fresh: stage_array(&first),
        stages_dup: stage_array(&second),
    };
    if !o.quiet {
        println!(
            "run {run}: baselines {:.0}/{:.0}/{:.0} MB/s, write baselines {:.0}/{:.0} MB/s | (a) fresh {:.0} MB/s = {:.2}, / write baseline {:.2} | (b) dup {:.0} MB/s = {:.2} | (c) read {:.0} MB/s, restore {:.0} MB/s = {:.2}",
            mb_s(logical, b1),
            mb_s(logical, b2),
            mb_s(logical, b3),
            mb_s(logical, w1),
            mb_s(logical, w2),
            r.fresh,
            r.ratio_a(),
            r.ratio_w(),
            r.dup,
            r.ratio_b(),
            r.read,
            r.restore,
            r.ratio_c()
        );
        println!(
            "        CPU s: baseline {:.2} write baseline {:.2} fresh {:.2} dup {:.2} read {:.2} restore {:.2}",
            r.cpu_base, r.cpu_base_w, r.cpu_fresh, r.cpu_dup, r.cpu_read, r.cpu_restore
        );
        println!("        fresh stages: {}", stages(&first));
        println!("        dup   stages: {}", stages(&second));
    }
    r
}

/// The CPU model (from /proc/cpuinfo) and the load average, for the report.
fn machine() -> (String, String) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into());
    (cpu, load)
}

fn main() {
    let o = options();
    let (cpu, load) = machine();
    println!(
        "CPU: {cpu}, {} logical CPUs; load average before: {load}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    std::fs::create_dir_all(&o.dir).expect("creating the bench directory");
    let len = o.size_mib * 1024 * 1024;
    println!(
        "tessera throughput: {} MiB of random data, {} runs, {} rayon threads, repositories in {}",
        o.size_mib,
        o.runs,
        rayon::current_num_threads(),
        o.dir.display()
    );
    let data = random_bytes(len, 0x7e55e4a);
    let mut cold = true;
    let runs: Vec<Run> = (1..=o.runs)
        .map(|i| one_run(&o, &data, i, &mut cold))
        .collect();
    let cache = if cold {
        "cold page cache (dropped before the read baseline and before each restore)"
    } else {
        "WARM page cache for both (not root: cannot drop caches)"
    };
    let col = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());

    println!();
    println!(
        "Medians of {} runs, {} MiB, MB = 10^6 bytes; restore (c): {cache}",
        o.runs, o.size_mib
    );
    println!(
        "| measure                                   |    MB/s | baseline MB/s |  ratio | ratio min-max | best/best | target         | CPU s / baseline CPU s |"
    );
    println!(
        "|-------------------------------------------|--------:|--------------:|-------:|---------------|----------:|----------------|------------------------|"
    );
    type Metric = fn(&Run) -> f64;
    let rows: [(&str, Metric, Metric, f64, Metric, Metric); 4] = [
        (
            "(a) backup, fresh data / chunk+BLAKE3",
            |r| r.fresh,
            |r| r.base_a,
            0.85,
            |r| r.cpu_fresh,
            |r| r.cpu_base,
        ),
        (
            "(a') backup, fresh / chunk+BLAKE3 & write",
            |r| r.fresh,
            |r| r.base_w,
            0.85,
            |r| r.cpu_fresh,
            |r| r.cpu_base_w,
        ),
        (
            "(b) backup, all duplicate / chunk+BLAKE3",
            |r| r.dup,
            |r| r.base_b,
            0.95,
            |r| r.cpu_dup,
            |r| r.cpu_base,
        ),
        (
            "(c) restore to sink / sequential fs reads",
            |r| r.restore,
            |r| r.read,
            1.0,
            |r| r.cpu_restore,
            |r| r.cpu_read,
        ),
    ];
    let best = |f: Metric| runs.iter().map(f).fold(0.0, f64::max);
    for (name, measure, reference, target, cpu, cpu_ref) in rows {
        let ratios: Vec<f64> = runs.iter().map(|r| measure(r) / reference(r)).collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let ratio = median(ratios);
        let best_ratio = best(measure) / best(reference);
        let mark = if ratio >= target { "ok" } else { "MISSED" };
        println!(
            "| {name:<41} | {:>7.0} | {:>13.0} | {ratio:>6.3} | {lo:>5.2} - {hi:<5.2} | {best_ratio:>9.3} | >= {target:.2} {mark:<6} | {:>9.2} / {:<10.2} |",
            col(measure),
            col(reference),
            col(cpu),
            col(cpu_ref)
        );
    }
    println!(
        "ratio: median of per-run ratios; each backup is compared with the mean time of the baselines"
    );
    println!(
        "run just before and after it (this machine is shared; see the per-run lines). best/best: the"
    );
    println!(
        "fastest run of a measure over the fastest run of its baseline (the least disturbed runs)."
    );
    println!(
        "(a'): the same backup over the write baseline (chunk+BLAKE3 while {WRITERS} threads write the same"
    );
    println!(
        "bytes durably as container-sized objects through the local backend), run just before and after it."
    );
    println!();
    println!("Per-stage seconds of the backups (medians; fp is summed over the hashing threads, write is the busiest writer; stages overlap):");
    println!(
        "| backup    | {} |",
        STAGES.map(|n| format!("{n:>6}")).join(" | ")
    );
    println!("|-----------|{}", "-------:|".repeat(STAGES.len()));
    type Stages = fn(&Run) -> [f64; 6];
    let per_stage: [(&str, Stages); 2] = [
        ("(a) fresh", |r| r.stages_fresh),
        ("(b) dup", |r| r.stages_dup),
    ];
    for (name, stages) in per_stage {
        let cols: Vec<String> = (0..STAGES.len())
            .map(|i| {
                format!(
                    "{:>6.3}",
                    median(runs.iter().map(|r| stages(r)[i]).collect())
                )
            })
            .collect();
        println!("| {name:<9} | {} |", cols.join(" | "));
    }
    println!("load average after: {}", machine().1);
}
