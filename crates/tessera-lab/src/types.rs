//! The experiment's data: the configuration as its TOML file gives it and
//! the records the runner measures. The runner ([`crate::experiment`])
//! fills them and the report ([`crate::report`]) reads them; both import
//! them from here, so the report does not depend on the runner.

use serde::{Deserialize, Serialize};
use std::fs;
use std::path::PathBuf;
use tessera::restore::RestoreStats;

/// An experiment, as written in its TOML file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// Name, used in the report's title.
    pub name: String,
    /// How long the experiment is expected to run, as its file states it
    /// (shown in the report beside the actual time).
    pub expected_run_time: Option<String>,
    /// Runs of the whole experiment (each in fresh repositories); the
    /// report shows the median and spread of every metric over them.
    #[serde(default = "one_usize")]
    pub repeat: usize,
    /// The backup versions.
    pub dataset: DatasetSpec,
    /// Which backups are kept, and when GC runs.
    #[serde(default)]
    pub retention: Retention,
    /// Which versions are restored.
    #[serde(default)]
    pub restore: RestoreSpec,
    /// Disk cost model for the modelled restore and backup I/O times.
    #[serde(default)]
    pub disk: DiskModel,
    /// How the report draws its plots.
    #[serde(default)]
    pub report: ReportSpec,
    /// The compression axis: the settings (`off`, `auto`, `fastest`,
    /// `default`, `max` or a zstd level 1..=22) each system runs with,
    /// unless it sets its own `compression`. Such a system runs once per
    /// setting, named `NAME` with `off` and `NAME.SETTING` with the others.
    /// Absent: `["off", "auto"]` (plain, and the compression of the default
    /// repository), `["off"]` for fingerprint traces (no bytes to compress).
    pub compression: Option<Vec<String>>,
    /// The system configurations compared, one line each in every plot.
    pub systems: Vec<SystemSpec>,
}

/// Report settings.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpec {
    /// Metrics plotted on a logarithmic y axis, by key (see
    /// [`crate::report::METRICS`]), or `["all"]`.
    #[serde(default)]
    pub log_scale: Vec<String>,
}

/// Where the versions come from: exactly one of `files`, `dir`, `trees`, `generate`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    /// Version files in backup order.
    #[serde(default)]
    pub files: Vec<PathBuf>,
    /// A directory whose `v*` files (e.g. `v0001.tar`) are the versions in name order.
    pub dir: Option<PathBuf>,
    /// A directory whose `v*` subdirectories (e.g. `v0001/`) are the
    /// versions in name order, each backed up as a directory tree.
    pub trees: Option<PathBuf>,
    /// A generated dataset (written once under the output directory).
    pub generate: Option<GenSpec>,
}

/// Generator settings of a dataset (see `tessera gen`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GenSpec {
    /// Versions to generate.
    pub versions: u32,
    /// Approximate size of one version, e.g. "20MB".
    pub size: String,
    /// Fraction of files changed per version.
    pub change_rate: Option<f64>,
    /// Fraction of files whose mtime (in their packed header) changes
    /// without a content change, per version (1.0: every header changes
    /// every backup, as backup products that stamp per-file metadata).
    pub touch_rate: Option<f64>,
    /// Seed.
    #[serde(default)]
    pub seed: u64,
    /// Independent source lineages interleaved (1 = single source).
    #[serde(default = "one")]
    pub sources: u32,
    /// Generate fingerprint traces instead of data (trace repositories).
    #[serde(default)]
    pub trace: bool,
    /// Generate directory trees instead of packed archives (tree backups).
    #[serde(default)]
    pub tree: bool,
}

fn one() -> u32 {
    1
}

/// Retention: keep the newest `keep_last` backups, GC every `gc_every` backups.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Backups kept (none deleted when absent).
    pub keep_last: Option<usize>,
    /// Run forget + GC after every this many backups.
    #[serde(default = "one_usize")]
    pub gc_every: usize,
    /// GC utilization threshold in percent (0 = perfect GC).
    #[serde(default)]
    pub gc_threshold: f64,
    /// Count, before and after each GC, how the retained backups' chunks
    /// share containers ([`Ownership`]; one pass over the retained recipes
    /// each time).
    #[serde(default)]
    pub ownership: bool,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep_last: None,
            gc_every: 1,
            gc_threshold: 0.0,
            ownership: false,
        }
    }
}

fn one_usize() -> usize {
    1
}

/// Which versions are restored: the newest after every `every` backups, and
/// optionally the oldest retained one too.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreSpec {
    /// Restore the newest backup after every this many backups (0 = never).
    #[serde(default = "one_usize")]
    pub every: usize,
    /// Also restore the oldest retained backup at those times.
    #[serde(default)]
    pub oldest: bool,
    /// After the last version, restore every retained backup (the mean
    /// read amplification and restore speed over them are reported).
    #[serde(default)]
    pub retained_at_end: bool,
}

impl Default for RestoreSpec {
    fn default() -> Self {
        RestoreSpec {
            every: 1,
            oldest: false,
            retained_at_end: false,
        }
    }
}

/// A disk cost model: each distinct read extent (or read request) costs a
/// seek, bytes cost bandwidth. A field left out of `[disk]` keeps its
/// default.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiskModel {
    /// Average seek plus rotational latency, in milliseconds.
    pub seek_ms: f64,
    /// Sequential bandwidth in MB/s (10^6 bytes).
    pub bandwidth_mb_s: f64,
}

impl Default for DiskModel {
    /// A 7200 rpm HDD: 8.5 ms average seek + 4.2 ms half rotation, 150 MB/s.
    fn default() -> Self {
        DiskModel {
            seek_ms: 12.7,
            bandwidth_mb_s: 150.0,
        }
    }
}

impl DiskModel {
    /// Checks that both values are positive and finite (the model divides
    /// by the bandwidth).
    pub fn validate(&self) -> Result<(), String> {
        for (field, value) in [
            ("seek_ms", self.seek_ms),
            ("bandwidth_mb_s", self.bandwidth_mb_s),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(format!(
                    "disk.{field} = {value}: must be finite and greater than 0"
                ));
            }
        }
        Ok(())
    }

    /// Modelled seconds for `extents` seeks and `bytes` transferred.
    pub fn seconds(&self, extents: u64, bytes: u64) -> f64 {
        extents as f64 * self.seek_ms / 1000.0 + bytes as f64 / 1e6 / self.bandwidth_mb_s
    }
}

/// One system configuration: repository options and restore settings.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SystemSpec {
    /// Name shown in the legend.
    pub name: String,
    /// Chunker: fastcdc, rabin or fixed.
    #[serde(default = "default_chunker")]
    pub chunker: String,
    /// Minimum chunk size.
    #[serde(default = "default_min")]
    pub min_size: String,
    /// Average chunk size.
    #[serde(default = "default_avg")]
    pub avg_size: String,
    /// Maximum chunk size.
    #[serde(default = "default_max")]
    pub max_size: String,
    /// Fingerprint: blake3, sha256 or sha1.
    #[serde(default = "default_fingerprint")]
    pub fingerprint: String,
    /// Container capacity.
    #[serde(default = "default_container")]
    pub container_size: String,
    /// Restore cache size in containers.
    #[serde(default = "default_cache")]
    pub cache_size: usize,
    /// Deduplication index: exact or ddfs.
    #[serde(default = "default_index")]
    pub index: String,
    /// Rewriting policy: none, cbr, capping, har or smr.
    #[serde(default = "default_none")]
    pub rewrite: String,
    /// Optional rewrite limit (fraction of bytes, e.g. 0.05).
    pub rewrite_limit: Option<f64>,
    /// Capping and SMR segment size (default 20 MiB).
    pub rewrite_segment: Option<String>,
    /// Capping and SMR segment size in chunks instead (Destor and the
    /// Capping paper: 1024 chunks).
    #[serde(alias = "capping_segment_chunks")]
    pub rewrite_segment_chunks: Option<u32>,
    /// Capping level: old containers per segment (default 20).
    pub capping_level: Option<u32>,
    /// SMR level: containers selected per segment (default 20).
    pub smr_level: Option<u32>,
    /// CBR stream context (default 5 MiB).
    pub cbr_stream_context: Option<String>,
    /// CBR minimal rewrite utility in percent (default 70, as `init --cbr-min-utility`).
    pub cbr_min_utility: Option<f64>,
    /// HAR: containers below this utilization in percent are sparse
    /// (default 50, as `init --har-utilization`).
    pub har_utilization: Option<f64>,
    /// GC chunk ordering: none, gccdf or random.
    #[serde(default = "default_none")]
    pub defrag: String,
    /// GC segment size in containers (GCCDF).
    #[serde(default = "default_segment")]
    pub gc_segment: usize,
    /// GCCDF: clusters smaller than this are not split further (e.g. "64KiB").
    #[serde(default = "default_split")]
    pub gc_split_threshold: String,
    /// GCCDF and random: container fill (as `gc` without `--no-fill`).
    #[serde(default = "default_fill")]
    pub gc_fill: bool,
    /// Restore cache policy: lru, opt or faa.
    #[serde(default = "default_cache_policy")]
    pub cache: String,
    /// Repository layout: container or lifecycle (MFDedup).
    #[serde(default = "default_layout")]
    pub layout: String,
    /// Memory budget of the index's cache (ddfs, eager, lazy), e.g. "16MiB".
    pub index_memory: Option<String>,
    /// Size of the eager/lazy Bloom filter (default: sized for `bloom_fpr`).
    pub bloom_size: Option<String>,
    /// Target false-positive rate of the Bloom filter.
    pub bloom_fpr: Option<f64>,
    /// Lazy: buffer fingerprint threshold.
    pub bft: Option<u32>,
    /// Eager, lazy: metadata-log entries prefetched per on-disk hit (`init --prefetch`).
    pub prefetch: Option<u32>,
    /// Lazy: percent of the index memory given to the buffer (`init --buffer-share`).
    pub buffer_share: Option<u32>,
    /// HID/EHID: sparse-container threshold in percent.
    pub sparse_threshold: Option<u32>,
    /// HID/EHID: also look up hot misses in the cold index (`init --consult-cold`).
    pub consult_cold: Option<bool>,
    /// Delta compression: none, pfc or greedy.
    pub delta: Option<String>,
    /// Delta: super-features, odess or ntransform.
    pub delta_features: Option<String>,
    /// Delta: base chunk cache size in containers.
    pub base_cache: Option<u32>,
    /// PFC-delta: containers read whole for bases, pfc or fc.
    pub base_prefetch: Option<String>,
    /// PFC-delta: which cached chunks may be bases, any or referenced.
    pub base_scope: Option<String>,
    /// Compression of stored chunks (zstd per chunk, after deduplication
    /// and delta compression): off (default), auto, fastest, default, max
    /// or a level 1..=22.
    pub compression: Option<String>,
}

fn default_cache_policy() -> String {
    "lru".into()
}
fn default_layout() -> String {
    "container".into()
}

fn default_split() -> String {
    "64KiB".into()
}

fn default_fill() -> bool {
    true
}

fn default_index() -> String {
    "exact".into()
}
fn default_none() -> String {
    "none".into()
}
fn default_segment() -> usize {
    100
}

fn default_chunker() -> String {
    "fastcdc".into()
}
fn default_min() -> String {
    "2KiB".into()
}
fn default_avg() -> String {
    "8KiB".into()
}
fn default_max() -> String {
    "64KiB".into()
}
fn default_fingerprint() -> String {
    "blake3".into()
}
fn default_container() -> String {
    "4MiB".into()
}
fn default_cache() -> usize {
    tessera::restore::DEFAULT_CACHE_CONTAINERS
}

/// One version of the dataset.
#[derive(Clone, Debug, Serialize)]
pub struct Version {
    /// File holding the version, or the directory tree that is the version.
    pub path: PathBuf,
    /// Source lineage.
    pub source: String,
    /// Whether the version is a directory tree (backed up as a tree backup).
    pub tree: bool,
    /// Bytes read to warm the page cache before the version's first backup
    /// (of the last repeat): every system then reads it from memory alike.
    pub warmed_bytes: u64,
}

/// Metrics of one restore in an experiment.
#[derive(Clone, Debug, Serialize)]
pub struct RestoreRecord {
    /// Which backup (1-based version number) was restored.
    pub version: usize,
    /// The engine's metrics.
    #[serde(flatten)]
    pub stats: RestoreStats,
    /// Modelled restore time under the disk model (one seek per extent).
    pub modelled_seconds: f64,
    /// MiB restored per read extent: the speed factor counted in seeks,
    /// comparable across layouts (a lifecycle restore reads several
    /// extents of one volume or category object).
    pub speed_factor_per_extent: f64,
    /// The restore counted on stored bytes (container layout only).
    pub stored: Option<StoredRead>,
}

impl RestoreRecord {
    /// Read amplification on stored bytes: container bytes read / stored
    /// bytes of the chunks restored (the lifecycle layout: / bytes restored).
    pub fn read_amplification(&self) -> f64 {
        self.stored
            .as_ref()
            .map_or(self.stats.read_amplification, |s| s.read_amplification)
    }

    /// Speed factor on stored bytes: MiB of the chunks restored, at their
    /// stored size, per container read (the lifecycle layout: MiB restored).
    pub fn speed_factor(&self) -> f64 {
        self.stored
            .as_ref()
            .map_or(self.stats.speed_factor, |s| s.speed_factor)
    }
}

/// A restore counted on stored bytes: every chunk at the size its container
/// stores it (compressed, and as a delta, where it is so stored), so that
/// plain and compressed repositories compare; and the containers it
/// references, by who wrote them, for the bound on what any order of GC's
/// copy-forward could have given it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StoredRead {
    /// Stored bytes of the chunks restored, each counted as often as the
    /// backup holds it (plain repository without delta: the bytes restored).
    pub bytes: u64,
    /// Container bytes read / `bytes`.
    pub read_amplification: f64,
    /// MiB of `bytes` per container read.
    pub speed_factor: f64,
    /// Distinct containers the backup's chunks are in: every restore reads
    /// each at least once (the containers it touches).
    pub containers_referenced: u64,
    /// Of those, containers written by GC's copy-forward.
    pub containers_from_gc: u64,
    /// Stored bytes of the backup's distinct chunks in containers GC wrote.
    pub bytes_in_gc_containers: u64,
    /// Stored bytes of the containers backups wrote that it references
    /// (read whole; no copy-forward has moved their chunks).
    pub backup_container_bytes: u64,
    /// The fewest containers any order of the same copy-forward could have
    /// left this restore: the containers backups wrote, plus its chunks in
    /// GC-written containers packed into as few full containers as hold
    /// their stored bytes.
    pub containers_bound: u64,
    /// The modelled restore time of that bound: a seek per container, the
    /// backup-written containers read whole and only the backup's own
    /// chunks of the GC-written ones.
    pub modelled_bound_seconds: f64,
}

/// How the retained backups' chunks share containers: a container is of
/// mixed ownership when its retained chunks do not all have the same
/// owners (the set of retained backups referencing them). GCCDF's
/// clustering makes containers of single ownership.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Ownership {
    /// Containers holding retained chunks.
    pub containers: u64,
    /// Of those, containers of mixed ownership.
    pub mixed_containers: u64,
    /// Bytes of the retained chunks (each distinct chunk of a container once).
    pub live_bytes: u64,
    /// Of those, bytes in containers of mixed ownership.
    pub mixed_bytes: u64,
    /// Distinct owner sets (ownership clusters) of the retained chunks.
    pub owner_sets: u64,
}

impl Ownership {
    /// Share of the retained bytes in containers of mixed ownership.
    pub fn mixed_share(&self) -> f64 {
        if self.live_bytes == 0 {
            0.0
        } else {
            self.mixed_bytes as f64 / self.live_bytes as f64
        }
    }
}

/// Metrics of one GC round in an experiment.
#[derive(Clone, Debug, Serialize)]
pub struct GcRecord {
    /// Backups deleted by retention before the GC.
    pub forgotten: usize,
    /// The engine's metrics.
    #[serde(flatten)]
    pub stats: tessera::gc::GcStats,
    /// Ownership of the retained chunks' containers before the GC (after
    /// the deletion), with `retention.ownership`.
    pub ownership_before: Option<Ownership>,
    /// The same after the GC.
    pub ownership_after: Option<Ownership>,
}

/// Everything recorded for one system after backing up one version.
#[derive(Clone, Debug, Serialize)]
pub struct VersionRecord {
    /// System name.
    pub system: String,
    /// Which run of the experiment (1-based; see `repeat`).
    pub repeat: usize,
    /// Version number (1-based).
    pub version: usize,
    /// Source lineage.
    pub source: String,
    /// Logical bytes of this backup.
    pub logical_bytes: u64,
    /// Bytes this backup stored.
    pub stored_bytes: u64,
    /// Backup wall time.
    pub backup_seconds: f64,
    /// Backup throughput, MB/s.
    pub backup_mb_s: f64,
    /// The backup's I/O time under the disk model: a seek per read request,
    /// and the bytes read and written at the sequential bandwidth (containers
    /// and index objects are written whole, one after another).
    pub modelled_backup_seconds: f64,
    /// Seconds per backup pipeline stage.
    #[serde(default)]
    pub backup_stage_seconds: tessera::format::snapshot::StageSeconds,
    /// Index memory after the backup.
    pub index_memory_bytes: u64,
    /// Index entries after the backup.
    pub index_entries: u64,
    /// On-disk index lookups of the backup.
    pub index_disk_lookups: u64,
    /// Every counter of the backup's index (lookups, prefetches, cache and
    /// Bloom filter hits, per-component seconds).
    #[serde(default)]
    pub index: tessera::index::IndexStats,
    /// The backup's delta compression counters.
    pub delta: tessera::delta::DeltaStats,
    /// The backup's compression counters (bytes it stored before and after
    /// compression; `stored_bytes` is before).
    #[serde(default)]
    pub compression: tessera::format::compression::CompressionStats,
    /// Logical bytes of all retained backups.
    pub retained_logical_bytes: u64,
    /// Physical bytes of the repository (containers).
    pub physical_bytes: u64,
    /// Deduplication alone: retained logical bytes / the bytes stored
    /// before compression (physical_bytes × compression_ratio).
    pub actual_dedup_ratio: f64,
    /// Compression alone: the retained backups' stored bytes before /
    /// after compression (1 without compression).
    #[serde(default)]
    pub compression_ratio: f64,
    /// Both: retained_logical_bytes / physical_bytes.
    #[serde(default)]
    pub total_ratio: f64,
    /// Restores made after this version.
    pub restores: Vec<RestoreRecord>,
    /// GC made after this version, if any.
    pub gc: Option<GcRecord>,
    /// Arranging after this version (lifecycle layout).
    pub arrange: Option<tessera::layout::lifecycle::ArrangeStats>,
}

/// Restores of every retained backup after the last version, per system.
#[derive(Clone, Debug, Serialize)]
pub struct FinalRestores {
    /// System name.
    pub system: String,
    /// Which run of the experiment (1-based; see `repeat`).
    pub repeat: usize,
    /// One restore per retained backup, oldest first.
    pub restores: Vec<RestoreRecord>,
    /// Mean read amplification over them, on stored bytes
    /// ([`RestoreRecord::read_amplification`]).
    pub mean_read_amplification: f64,
    /// Mean speed factor (per container or object read) over them, on
    /// stored bytes ([`RestoreRecord::speed_factor`]).
    pub mean_speed_factor: f64,
    /// Mean read amplification over bytes restored (the engine's
    /// `read_amplification`; differs from the stored one where chunks are
    /// compressed or delta-encoded).
    pub mean_read_amplification_logical: f64,
    /// Mean MiB restored per container read (the engine's `speed_factor`).
    pub mean_speed_factor_logical: f64,
    /// Mean containers read per restore.
    pub mean_containers_read: f64,
    /// Mean distinct containers referenced per restore ([`StoredRead`]).
    pub mean_containers_referenced: f64,
    /// Mean of [`StoredRead::containers_bound`].
    pub mean_containers_bound: f64,
    /// Mean of [`StoredRead::modelled_bound_seconds`].
    pub mean_modelled_bound_seconds: f64,
    /// Physical bytes of the repository after the last version (stored,
    /// after compression).
    pub physical_bytes: u64,
    /// Retained logical bytes / physical bytes after the last version.
    pub total_ratio: f64,
    /// Mean speed factor per read extent over them.
    pub mean_speed_factor_per_extent: f64,
    /// Mean restore throughput (MB/s) over them.
    pub mean_restore_mb_s: f64,
    /// Mean modelled restore time (seconds) over them.
    pub mean_modelled_seconds: f64,
    /// GC totals over the whole run: containers produced.
    pub gc_containers_produced: u64,
    /// GC totals over the whole run: bytes read plus written.
    pub gc_bytes_moved: u64,
    /// GC totals over the whole run: seconds.
    pub gc_seconds: f64,
    /// Arranging totals over the whole run (lifecycle layout): bytes read
    /// plus written, the layout's data movement in place of GC's.
    pub arrange_bytes_moved: u64,
    /// Arranging totals over the whole run: seconds.
    pub arrange_seconds: f64,
}

impl VersionRecord {
    /// Bytes GC and arranging read plus wrote after this version.
    pub fn data_moved_bytes(&self) -> Option<u64> {
        let gc = self
            .gc
            .as_ref()
            .map(|g| g.stats.bytes_read + g.stats.bytes_written);
        let arrange = self
            .arrange
            .as_ref()
            .map(|a| a.bytes_read + a.bytes_written);
        match (gc, arrange) {
            (None, None) => None,
            (g, a) => Some(g.unwrap_or(0) + a.unwrap_or(0)),
        }
    }

    /// Seconds GC and arranging took after this version.
    pub fn data_moved_seconds(&self) -> Option<f64> {
        let gc = self.gc.as_ref().map(|g| g.stats.seconds);
        let arrange = self.arrange.as_ref().map(|a| a.seconds);
        match (gc, arrange) {
            (None, None) => None,
            (g, a) => Some(g.unwrap_or(0.0) + a.unwrap_or(0.0)),
        }
    }
}

/// Where and with what an experiment ran.
#[derive(Clone, Debug, Serialize)]
pub struct Provenance {
    /// Tessera's version.
    pub tessera_version: String,
    /// The git commit the lab was built from (`unknown` outside a checkout).
    pub git_commit: String,
    /// The CPU model (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// CPU cores available to the run.
    pub cores: usize,
    /// When the run started (UTC, RFC 3339).
    pub date: String,
}

impl Provenance {
    /// The provenance of a run starting now on this machine.
    pub fn now() -> Provenance {
        Provenance {
            tessera_version: env!("CARGO_PKG_VERSION").into(),
            git_commit: option_env!("TESSERA_GIT_COMMIT")
                .unwrap_or("unknown")
                .into(),
            cpu_model: cpu_model().unwrap_or_else(|| "unknown".into()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            date: jiff::Timestamp::now()
                .round(jiff::Unit::Second)
                .map_or_else(|_| jiff::Timestamp::now().to_string(), |t| t.to_string()),
        }
    }
}

/// The CPU's model name, from `/proc/cpuinfo`.
fn cpu_model() -> Option<String> {
    let text = fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == "model name")
        .map(|(_, v)| v.trim().to_string())
}

/// The results of a whole experiment.
#[derive(Clone, Debug, Serialize)]
pub struct Results {
    /// Tessera version, commit, machine and date of the run.
    pub provenance: Provenance,
    /// The configuration run.
    pub config: ExperimentConfig,
    /// Every system's full repository configuration (defaults filled in).
    pub repository_configs: Vec<(String, tessera::repo::config::Config)>,
    /// The dataset's versions.
    pub versions: Vec<Version>,
    /// All records, system by system, version by version.
    pub records: Vec<VersionRecord>,
    /// Restores of all retained backups after the last version (if asked).
    pub final_restores: Vec<FinalRestores>,
    /// Wall time of the whole experiment.
    pub seconds: f64,
}
