//! Trace replay at scale (issue 25): a generated fingerprint trace streamed
//! straight from the generator into `backup::run` on a trace repository,
//! version after version, with no trace files and no data, measuring each
//! backup. Shared by the scale benchmark (`benches/trace_scale.rs`) and its
//! bounded, seeded version in the tests (`tests/scale.rs`).

use crate::gen::{Dataset, GenOptions, TraceEvent};
use std::error::Error;
use std::path::Path;
use std::time::Instant;
use tessera::backup::{run, BackupOptions, Source};
use tessera::config::Config;
use tessera::fingerprint::{Fingerprint, FingerprintAlgo};
use tessera::index::IndexStats;
use tessera::Repository;

/// What one version's backup measured.
#[derive(Clone, Debug)]
pub struct VersionRun {
    /// The version's number (from 1).
    pub version: u64,
    /// Logical bytes of the version.
    pub logical: u64,
    /// Bytes this backup stored.
    pub stored: u64,
    /// Peak resident set size of the process during the backup (VmHWM,
    /// reset before it; 0 where it cannot be read).
    pub peak_rss: u64,
    /// Wall time of the backup, in seconds.
    pub seconds: f64,
    /// The index's counters for this backup.
    pub index: IndexStats,
}

impl VersionRun {
    /// Seconds of backup per GiB of the version.
    pub fn seconds_per_gib(&self) -> f64 {
        self.seconds / gib(self.logical).max(1e-9)
    }

    /// `count` (of some event of this backup) per GiB of the version.
    pub fn per_gib(&self, count: u64) -> f64 {
        count as f64 / gib(self.logical).max(1e-9)
    }
}

/// GiB in `bytes`.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// Peak resident set size (VmHWM) of this process, in bytes.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resets the peak resident set size (VmHWM) to the current one.
pub fn reset_peak_rss() {
    // Best effort: where it cannot be reset, the peak covers the process so far.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The configuration of a trace repository for the replay: `config`'s
/// settings with `trace` on and SHA-1 fingerprints (those of the trace).
pub fn trace_config(mut config: Config) -> Config {
    config.trace = true;
    config.fingerprint = FingerprintAlgo::Sha1;
    config
}

/// Replays the generated trace of `gen` into a new trace repository made
/// at `path` with `config` (see [`trace_config`]), one backup per version;
/// calls `each` after each version's backup. Returns every version's
/// measures and the repository.
pub fn replay(
    gen: &GenOptions,
    config: Config,
    path: &Path,
    mut each: impl FnMut(&VersionRun),
) -> Result<(Vec<VersionRun>, Repository), Box<dyn Error>> {
    let repo = Repository::init(path, trace_config(config))?;
    let mut ds = Dataset::new(gen)?;
    let mut runs = Vec::new();
    while let Some((info, lineage)) = ds.next_version() {
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
            ..Default::default()
        };
        reset_peak_rss();
        let t = Instant::now();
        let outcome = run(&repo, Source::Trace(&mut trace), &options)?;
        let seconds = t.elapsed().as_secs_f64();
        let s = outcome.snapshot.stats;
        let r = VersionRun {
            version: info.index,
            logical: s.logical_bytes,
            stored: s.stored_bytes,
            peak_rss: peak_rss().unwrap_or(0),
            seconds,
            index: s.index,
        };
        each(&r);
        runs.push(r);
    }
    Ok((runs, repo))
}
