//! Replay at scale (issue 25's scale benchmark): a generated workload
//! streamed straight from the generator into `backup::run` with the index
//! under test (default `ddfs`, the default for new repositories). Trace
//! mode (default: 1 TB logical in 100 versions) replays a fingerprint trace
//! into a trace repository, with no trace files and no data; data mode
//! (`TESSERA_SCALE_MODE=data`, default 64 GiB in 20 versions) backs up
//! each version's tar archive as the generator writes it into a pipe, so
//! only what the repository stores takes disk. Prints per version: index
//! memory, peak RSS of that backup (VmHWM, reset before each), on-disk
//! lookups, deduplication ratio against the exact index (the same trace
//! replayed through `exact` in a second pass of this run), backup time per
//! GiB and its ratio to version 1; then deletes the oldest half of the
//! backups and runs GC, with its peak RSS and bytes moved, then a check.
//!
//! ```text
//! cargo bench -p tessera-lab --bench trace_scale                       # 1 TB, 100 versions
//! TESSERA_SCALE_SIZE=10GB TESSERA_SCALE_VERSIONS=10 \
//!     cargo bench -p tessera-lab --bench trace_scale                   # quick run
//! ```
//!
//! Environment: `TESSERA_SCALE_MODE` (`trace` or `data`),
//! `TESSERA_SCALE_SIZE` total logical size (`1TB`, `500GB`, `10GiB`,
//! bytes; default 1TB, data mode 64GiB), `TESSERA_SCALE_VERSIONS`
//! (default 100, data mode 20),
//! `TESSERA_SCALE_CHANGE_RATE` (generator default when unset),
//! `TESSERA_SCALE_DIR` parent of the temporary repository (default the
//! system temporary directory), `TESSERA_SCALE_KEEP=1` keeps the repository,
//! `TESSERA_SCALE_INDEX` the index under test (default ddfs),
//! `TESSERA_SCALE_REFERENCE=0` skips the exact pass (no ratio printed),
//! `TESSERA_SCALE_GC=0` deletes the oldest half but leaves GC and check to
//! separate processes (`scripts/scale-maintenance.sh` measures their peak
//! RSS with `/usr/bin/time`) and keeps the repository.

use std::error::Error;
use std::time::Instant;
use tessera::commands::check::{check, CheckOptions};
use tessera::gc::{gc, GcOptions};
use tessera::repo::config::{Config, IndexKind};
use tessera_lab::gen::GenOptions;
use tessera_lab::scale::{gib, peak_rss, replay, reset_peak_rss, VersionRun};

/// Parses sizes with the engine's units plus TB / TiB.
fn parse_total(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    for (unit, mult) in [("tib", 1u64 << 40), ("tb", 1_000_000_000_000)] {
        if let Some(n) = t.strip_suffix(unit) {
            let n: u64 = n.trim().parse().map_err(|_| format!("bad size {text:?}"))?;
            return n
                .checked_mul(mult)
                .ok_or_else(|| format!("size {text:?} is too large"));
        }
    }
    tessera::parse_size(&t)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// A repository configuration with `index` (defaults otherwise).
fn config_with(index: IndexKind) -> Config {
    let mut config = Config::new("trace-scale".into());
    config.index = index;
    config
}

/// Prints one version's line.
fn print_version(r: &VersionRun) {
    println!(
        "  v{:>4}: {:>7.2} GiB, stored {:>8.4} GiB, {:>6.2} s, index {:>7.1} MiB (Bloom {:.1}), peak RSS {:>7.1} MiB, {} disk lookups, index commit wrote {:.2} MiB",
        r.version,
        gib(r.logical),
        gib(r.stored),
        r.seconds,
        mib(r.index.memory_bytes),
        mib(r.index.bloom_bytes),
        mib(r.peak_rss),
        r.index.disk_lookups,
        mib(r.index.commit_write_bytes),
    );
}

/// Prints the per-version table and the totals against the targets;
/// returns the bytes stored.
fn print_summary(name: &str, runs: &[VersionRun], exact: Option<&[VersionRun]>, secs: f64) -> u64 {
    println!("---");
    println!(
        "| version | GiB | index MiB | peak RSS MiB | disk lookups | dedup | vs exact | s/GiB | vs v1 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (mut logical, mut stored, mut exact_stored) = (0u64, 0u64, 0u64);
    let per_gib = VersionRun::seconds_per_gib;
    let first = runs.first().map(per_gib).unwrap_or(0.0);
    let (mut worst_rss, mut worst_vs_exact, mut worst_slowdown) = (0u64, f64::MAX, 0f64);
    for (v, r) in runs.iter().enumerate() {
        logical += r.logical;
        stored += r.stored;
        let dedup = logical as f64 / stored.max(1) as f64;
        let vs_exact = exact.and_then(|e| e.get(v)).map(|e| {
            exact_stored += e.stored;
            exact_stored.max(1) as f64 / stored.max(1) as f64
        });
        let slowdown = per_gib(r) / first.max(1e-12);
        worst_rss = worst_rss.max(r.peak_rss);
        worst_vs_exact = worst_vs_exact.min(vs_exact.unwrap_or(f64::MAX));
        worst_slowdown = worst_slowdown.max(slowdown);
        println!(
            "| {} | {:.2} | {:.1} | {:.1} | {} | {:.2} | {} | {:.3} | {:.2} |",
            v + 1,
            gib(r.logical),
            mib(r.index.memory_bytes),
            mib(r.peak_rss),
            r.index.disk_lookups,
            dedup,
            vs_exact.map_or("-".into(), |x| format!("{x:.4}")),
            per_gib(r),
            slowdown,
        );
    }
    println!("---");
    println!(
        "index {name}: logical {:.3} TB, stored {:.2} GiB, dedup {:.2}x, backups {secs:.1} s ({:.2} GB/s logical)",
        logical as f64 / 1e12,
        gib(stored),
        logical as f64 / stored.max(1) as f64,
        logical as f64 / secs / 1e9,
    );
    println!(
        "worst: peak RSS {:.1} MiB (target <= 512), dedup vs exact {} (target >= 0.98), s/GiB vs version 1 {:.2} (target <= 1.2)",
        mib(worst_rss),
        if worst_vs_exact == f64::MAX { "-".into() } else { format!("{worst_vs_exact:.4}") },
        worst_slowdown,
    );
    stored
}

/// What GC and check after deleting the oldest half measured: GC's
/// statistics and peak RSS, check's report, seconds and peak RSS.
type Maintenance = (
    tessera::gc::GcStats,
    u64,
    tessera::commands::check::CheckReport,
    f64,
    u64,
);

/// Prints what GC and check after deleting the oldest half of `backups` cost.
fn print_maintenance(backups: usize, stored: u64, maintenance: Option<Maintenance>) {
    let Some((g, gc_rss, c, check_secs, check_rss)) = maintenance else {
        println!(
            "deleted the oldest {} of {} backups; gc and check left to separate processes",
            backups / 2,
            backups
        );
        return;
    };
    println!(
        "gc after deleting the oldest {} of {} backups: peak RSS {:.1} MiB, {:.3} GiB moved ({} chunks), {} containers reclaimed, {:.1} s ({:.2} s per GiB of repository before, {:.2} GiB stored)",
        backups / 2,
        backups,
        mib(gc_rss),
        gib(g.bytes_moved),
        g.chunks_moved,
        g.containers_reclaimed,
        g.seconds,
        g.seconds / gib(stored).max(1e-9),
        gib(stored),
    );
    println!(
        "check after gc: peak RSS {:.1} MiB, {} containers, {} stored chunks, {} references, {} problems, {:.1} s ({:.2} s per GiB of repository before gc)",
        mib(check_rss),
        c.containers,
        c.stored_chunks,
        c.references,
        c.problems.len(),
        check_secs,
        check_secs / gib(stored).max(1e-9),
    );
}

fn main() -> Result<(), Box<dyn Error>> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let trace = match env("TESSERA_SCALE_MODE").as_deref() {
        None | Some("trace") => true,
        Some("data") => false,
        Some(other) => return Err(format!("TESSERA_SCALE_MODE {other:?}: trace or data").into()),
    };
    let (size, count) = if trace { ("1TB", 100) } else { ("64GiB", 20) };
    let total = parse_total(&env("TESSERA_SCALE_SIZE").unwrap_or_else(|| size.into()))?;
    let versions: u32 = env("TESSERA_SCALE_VERSIONS").map_or(Ok(count), |v| v.parse())?;
    if versions == 0 {
        return Err("TESSERA_SCALE_VERSIONS must be at least 1".into());
    }
    let index: IndexKind = env("TESSERA_SCALE_INDEX").map_or(Ok(IndexKind::Ddfs), |v| v.parse())?;
    let reference = env("TESSERA_SCALE_REFERENCE").is_none_or(|v| v != "0");
    let collect = env("TESSERA_SCALE_GC").is_none_or(|v| v != "0");
    let mut gen = GenOptions {
        versions,
        size: (total / u64::from(versions)).max(1),
        trace,
        ..GenOptions::default()
    };
    if let Some(r) = env("TESSERA_SCALE_CHANGE_RATE") {
        gen.change_rate = r.parse()?;
    }
    let parent = env("TESSERA_SCALE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let name = format!("{index:?}").to_lowercase();
    println!(
        "{} replay: {versions} versions x {:.2} GiB = {:.1} GB logical (change rate {}), index {name}",
        if trace { "trace" } else { "data" },
        gib(gen.size),
        (gen.size * u64::from(versions)) as f64 / 1e9,
        gen.change_rate,
    );
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load().trim());
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("tessera-trace-scale-")
        .tempdir_in(&parent)?;
    let (runs, repo) = replay(
        &gen,
        config_with(index),
        &dir.path().join("repo"),
        print_version,
    )?;
    let secs = started.elapsed().as_secs_f64();

    // GC after deleting the oldest half of the backups.
    let backups = repo.backups()?;
    for id in &backups[..backups.len() / 2] {
        tessera::commands::delete::delete_backup(&repo, *id)?;
    }
    let maintenance = if collect {
        reset_peak_rss();
        let g = gc(&repo, GcOptions::default())?;
        let gc_rss = peak_rss().unwrap_or(0);
        // Then a check of what is left (metadata only).
        reset_peak_rss();
        let t = Instant::now();
        let c = check(&repo, CheckOptions::default())?;
        let check_secs = t.elapsed().as_secs_f64();
        Some((g, gc_rss, c, check_secs, peak_rss().unwrap_or(0)))
    } else {
        None
    };
    drop(repo);
    let kept = !collect || env("TESSERA_SCALE_KEEP").is_some_and(|v| v == "1");
    if kept {
        println!("repository kept at {}", dir.keep().join("repo").display());
    } else {
        drop(dir);
    }

    let exact = if reference {
        println!("reference pass: the same trace through the exact index");
        let dir = tempfile::Builder::new()
            .prefix("tessera-trace-scale-")
            .tempdir_in(&parent)?;
        let (exact, _repo) = replay(
            &gen,
            config_with(IndexKind::Exact),
            &dir.path().join("repo"),
            |_| {},
        )?;
        Some(exact)
    } else {
        None
    };

    println!("load average at end: {}", load().trim());
    let stored = print_summary(&name, &runs, exact.as_deref(), secs);
    print_maintenance(backups.len(), stored, maintenance);
    Ok(())
}
