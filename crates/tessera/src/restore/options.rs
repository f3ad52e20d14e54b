//! The options and metrics of a restore, and the progress and metric
//! helpers both layouts' restore paths share.

use crate::format::snapshot::{BackupId, ChunkRef};
use crate::progress::ByteProgress;
use crate::restore::plan::CachePolicy;
use serde::Serialize;
use std::time::Instant;

/// Default container cache size, in containers.
pub const DEFAULT_CACHE_CONTAINERS: usize = 32;

/// Options of one restore (with the `cli` feature, the restore options of
/// `tessera restore`: their help is the command line's).
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct RestoreOptions<'a> {
    /// Cache policy.
    #[cfg_attr(
        feature = "cli",
        arg(
            id = "cache",
            long = "cache",
            value_name = "CACHE",
            default_value = "lru",
            help = "Restore cache policy: lru, opt (Belady, using the recipe) or faa (forward assembly area of --cache-size containers)"
        )
    )]
    pub policy: CachePolicy,
    /// Containers the cache holds (forward assembly: its area is this many containers' size).
    #[cfg_attr(feature = "cli", arg(
        id = "cache_size",
        long = "cache-size",
        value_name = "CACHE_SIZE",
        default_value_t = DEFAULT_CACHE_CONTAINERS,
        help = "Containers held by the restore cache (at least 1; at most as many as the machine's memory holds)"
    ))]
    pub cache_containers: usize,
    /// Told the number of bytes the restore will write, then the number
    /// restored so far (a closure `Fn(u64)` gets the latter alone).
    #[cfg_attr(feature = "cli", arg(skip))]
    pub progress: Option<&'a dyn ByteProgress>,
    /// Salvage: write zeros for the bytes of chunks that are missing or
    /// damaged (listed in [`RestoreStats::lost`]) instead of failing.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            help = "Salvage a damaged backup: write every chunk that verifies, zeros in place of missing or damaged chunks, list the lost byte ranges and exit with status 3 when any were lost"
        )
    )]
    pub skip_damaged: bool,
}

impl Default for RestoreOptions<'_> {
    fn default() -> Self {
        RestoreOptions {
            cache_containers: DEFAULT_CACHE_CONTAINERS,
            policy: CachePolicy::Lru,
            progress: None,
            skip_damaged: false,
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
    /// Containers read (cache misses and base reads), or objects read in the lifecycle layout.
    pub containers_read: u64,
    /// Containers read only for the base of a delta-encoded chunk (included in `containers_read`).
    pub base_reads: u64,
    /// Distinct read extents (seeks): one per container read; in the lifecycle
    /// layout, per contiguous range of a volume or category read.
    pub extents: u64,
    /// MiB restored per container read.
    pub speed_factor: f64,
    /// Wall time.
    pub seconds: f64,
    /// MB (10^6 bytes) restored per second.
    pub throughput_mb_s: f64,
    /// Containers the cache held.
    pub cache_containers: usize,
    /// The cache policy (`lru`, `opt`, `faa`; `lifecycle` for that layout).
    pub policy: String,
    /// Computed from metadata only (trace repositories): nothing was restored.
    pub plan_only: bool,
    /// Salvage restores: the output ranges written as zeros because their
    /// chunks are missing or damaged (empty: the restore is complete).
    pub lost: Vec<crate::restore::salvage::LostRange>,
}

/// The chunks `select` picks of backup `id` (all without), read after its
/// snapshot (so that a backup that does not exist is named as such), their
/// total announced to the caller's progress.
pub(crate) fn selected_chunks(
    repo: &crate::repo::Repository,
    id: crate::format::snapshot::BackupId,
    select: Option<&[std::ops::Range<usize>]>,
    options: &RestoreOptions,
) -> crate::error::Result<Vec<ChunkRef>> {
    repo.snapshot(id)?;
    let chunks = repo.recipe(id)?.selected(select)?;
    announce_total(options, &chunks);
    Ok(chunks)
}

/// Tells the progress of `options` the bytes of `chunks`: what the restore will write.
pub(crate) fn announce_total(options: &RestoreOptions, chunks: &[ChunkRef]) {
    if let Some(p) = options.progress {
        p.total(chunks.iter().map(|c| u64::from(c.len)).sum());
    }
}

/// Tells the progress of `options` that `bytes` are restored so far.
pub(crate) fn report_done(options: &RestoreOptions, bytes: u64) {
    if let Some(p) = options.progress {
        p.done(bytes);
    }
}

/// Derived metrics: read amplification, speed factor, throughput.
pub(crate) fn finish_stats(stats: &mut RestoreStats, started: Instant) {
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
}
