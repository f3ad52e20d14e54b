//! Trace replay at scale: a generated fingerprint trace (default 1 TB
//! logical in 100 versions) streamed straight from the generator into
//! `backup::run` on a trace repository with the exact index: no trace files,
//! no data. Prints per-version progress, then total time, chunks/s, logical
//! GB/s and peak memory (VmHWM).
//!
//! ```text
//! cargo bench -p tessera-lab --bench trace_scale                       # 1 TB, 100 versions
//! TESSERA_SCALE_SIZE=10GB TESSERA_SCALE_VERSIONS=10 \
//!     cargo bench -p tessera-lab --bench trace_scale                   # quick run
//! ```
//!
//! Environment: `TESSERA_SCALE_SIZE` total logical size (`1TB`, `500GB`,
//! `10GiB`, bytes; default 1TB), `TESSERA_SCALE_VERSIONS` (default 100),
//! `TESSERA_SCALE_CHANGE_RATE` (generator default when unset),
//! `TESSERA_SCALE_DIR` parent of the temporary repository (default the
//! system temporary directory), `TESSERA_SCALE_KEEP=1` keeps the repository.

use std::error::Error;
use std::time::Instant;
use tessera::backup::{run, BackupOptions, Source};
use tessera::config::{Config, IndexKind};
use tessera::fingerprint::{Fingerprint, FingerprintAlgo};
use tessera::Repository;
use tessera_lab::gen::{Dataset, GenOptions, TraceEvent};

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
    tessera::units::parse_size(&t)
}

/// Peak resident set size (VmHWM) of this process, in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

fn main() -> Result<(), Box<dyn Error>> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let total = parse_total(&env("TESSERA_SCALE_SIZE").unwrap_or_else(|| "1TB".into()))?;
    let versions: u32 = env("TESSERA_SCALE_VERSIONS").map_or(Ok(100), |v| v.parse())?;
    if versions == 0 {
        return Err("TESSERA_SCALE_VERSIONS must be at least 1".into());
    }
    let mut gen = GenOptions {
        versions,
        size: (total / u64::from(versions)).max(1),
        trace: true,
        ..GenOptions::default()
    };
    if let Some(r) = env("TESSERA_SCALE_CHANGE_RATE") {
        gen.change_rate = r.parse()?;
    }
    let parent = env("TESSERA_SCALE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::Builder::new()
        .prefix("tessera-trace-scale-")
        .tempdir_in(&parent)?;
    let mut config = Config::new("trace-scale".into());
    config.trace = true;
    config.index = IndexKind::Exact;
    config.fingerprint = FingerprintAlgo::Sha1;
    let repo = Repository::init(&dir.path().join("repo"), config)?;
    println!(
        "trace replay: {versions} versions x {:.2} GiB = {:.1} GB logical (change rate {}), exact index, repository {}",
        gib(gen.size),
        (gen.size * u64::from(versions)) as f64 / 1e9,
        gen.change_rate,
        dir.path().display()
    );

    let started = Instant::now();
    let mut ds = Dataset::new(&gen)?;
    let (mut chunks, mut logical, mut stored) = (0u64, 0u64, 0u64);
    let mut gen_seconds = 0.0;
    loop {
        // Aging the tree (the generator's `advance`) is timed apart; chunk
        // iteration runs on the backup's trace-reader thread.
        let t = Instant::now();
        let Some((info, lineage)) = ds.next_version() else {
            break;
        };
        gen_seconds += t.elapsed().as_secs_f64();
        let mut events = lineage.chunks()?;
        let mut trace = std::iter::from_fn(|| loop {
            match events.next()? {
                TraceEvent::Chunk(c) => return Some(Ok((Fingerprint(c.fp), c.size))),
                TraceEvent::FileStart(_) | TraceEvent::FileEnd => {}
            }
        });
        let options = BackupOptions {
            label: info.file_name.clone(),
            source: info.source.clone(),
            progress: None,
            compression: None,
        };
        let t = Instant::now();
        let outcome = run(&repo, Source::Trace(&mut trace), &options)?;
        let s = outcome.snapshot.stats;
        let secs = t.elapsed().as_secs_f64();
        chunks += s.chunks;
        logical += s.logical_bytes;
        stored += s.stored_bytes;
        println!(
            "v{:>4}/{versions}: {:>6.2} GiB, {:>9} chunks, stored {:>7.3} GiB, {:>5.2} s ({:.2} M chunks/s, {:.2} GB/s), index {} entries, {:.0} MiB; total {:.1} GB in {:.0} s, peak RSS {:.0} MiB",
            info.index,
            gib(s.logical_bytes),
            s.chunks,
            gib(s.stored_bytes),
            secs,
            s.chunks as f64 / secs / 1e6,
            s.logical_bytes as f64 / secs / 1e9,
            s.index.entries,
            s.index.memory_bytes as f64 / f64::from(1u32 << 20),
            logical as f64 / 1e9,
            started.elapsed().as_secs_f64(),
            peak_rss().unwrap_or(0) as f64 / f64::from(1u32 << 20),
        );
    }
    let secs = started.elapsed().as_secs_f64();
    let totals = repo.totals()?;
    println!("---");
    println!(
        "versions {versions}, logical {:.3} TB ({logical} bytes), chunks {chunks}, stored {:.2} GiB, dedup {:.2}x",
        logical as f64 / 1e12,
        gib(stored),
        logical as f64 / stored.max(1) as f64
    );
    println!(
        "repository: {} containers, {:.2} GiB of container objects on disk (metadata only: a trace repository)",
        totals.containers,
        gib(totals.physical_bytes)
    );
    println!(
        "total time {secs:.1} s (generator advance {gen_seconds:.1} s), {:.2} M chunks/s, {:.2} GB/s logical",
        chunks as f64 / secs / 1e6,
        logical as f64 / secs / 1e9
    );
    match peak_rss() {
        Some(b) => println!(
            "peak memory (VmHWM) {:.0} MiB ({b} bytes)",
            b as f64 / f64::from(1u32 << 20)
        ),
        None => println!("peak memory: /proc/self/status not readable"),
    }
    if env("TESSERA_SCALE_KEEP").is_some_and(|v| v == "1") {
        let kept = dir.keep();
        println!("repository kept at {}", kept.display());
    }
    Ok(())
}
