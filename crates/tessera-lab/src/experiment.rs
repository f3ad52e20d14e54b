//! The experiment runner: one dataset, several system configurations, a
//! retention policy; each configuration runs in a fresh repository and every
//! version's backup, restore and GC metrics are recorded (DESIGN.md,
//! "Metrics") to JSON and CSV and rendered as an HTML report.

use crate::gen::{generate, GenOptions};
use crate::report;
use crate::trace::TraceFile;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tessera::backup::{run as run_backup, BackupOptions, Source};
use tessera::chunker::{ChunkerKind, ChunkerParams};
use tessera::fingerprint::Fingerprint;
use tessera::fingerprint::FingerprintAlgo;
use tessera::gc::{forget_keep_last, gc, GcOptions};
use tessera::repo::config::Layout;
use tessera::repo::config::{Compression, Config};
use tessera::restore::plan::CachePolicy;
use tessera::restore::{restore, RestoreOptions, RestoreStats};
use tessera::tree::{backup_tree, TreeBackupOptions};
use tessera::util::units::parse_size;
use tessera::Repository;

/// Errors of an experiment.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// The configuration file is invalid.
    #[error("{path}: {detail}")]
    Config {
        /// The configuration file.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// The file or directory.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The engine failed.
    #[error("system {system}, version {version}: {source}")]
    Engine {
        /// The system configuration.
        system: String,
        /// The version (1-based).
        version: usize,
        /// The engine's error.
        #[source]
        source: tessera::Error,
    },
    /// Generating the dataset failed.
    #[error("generating the dataset: {0}")]
    Generate(String),
    /// A trace could not be read.
    #[error("{0}")]
    Trace(String),
    /// The configuration handed to [`run`] is invalid.
    #[error("experiment {name:?}: {detail}")]
    Invalid {
        /// The experiment's name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The output directory is not this experiment's to write into.
    #[error("{dir}: {detail}")]
    Output {
        /// The output directory.
        dir: String,
        /// Why it is refused.
        detail: String,
    },
}

/// The file marking an experiment's output directory; it holds the
/// experiment's name. The runner writes into (and replaces repositories
/// under) only a directory it created or marked for the same experiment.
pub const OUTPUT_MARKER: &str = ".tessera-experiment";

fn io_err(what: &Path) -> impl Fn(io::Error) -> ExperimentError + '_ {
    move |source| ExperimentError::Io {
        what: what.display().to_string(),
        source,
    }
}

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
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep_last: None,
            gc_every: 1,
            gc_threshold: 0.0,
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

/// `value` percent as a fraction, if it is within 0..=100.
fn percent(field: &str, value: f64) -> Result<f64, String> {
    if !(0.0..=100.0).contains(&value) {
        return Err(format!(
            "{field} = {value}: must be a percentage within 0..=100"
        ));
    }
    Ok(value / 100.0)
}

impl SystemSpec {
    /// The repository configuration this system describes.
    pub fn repo_config(&self) -> Result<Config, String> {
        let size = |what: &str, s: &str| -> Result<u32, String> {
            tessera::util::units::parse_size_u32(s).map_err(|e| format!("{what}: {e}"))
        };
        let mut c = Config::new(format!("lab-{}", self.name));
        c.chunker = ChunkerParams {
            kind: self.chunker.parse::<ChunkerKind>()?,
            min_size: size("min_size", &self.min_size)?,
            avg_size: size("avg_size", &self.avg_size)?,
            max_size: size("max_size", &self.max_size)?,
        };
        c.fingerprint = self.fingerprint.parse::<FingerprintAlgo>()?;
        c.container_size = size("container_size", &self.container_size)?;
        c.index = self.index.parse()?;
        if let Some(v) = &self.index_memory {
            c.index_cache_bytes = parse_size(v).map_err(|e| format!("index_memory: {e}"))?;
        }
        if let Some(v) = &self.bloom_size {
            c.bloom_bytes = parse_size(v).map_err(|e| format!("bloom_size: {e}"))?;
        }
        if let Some(v) = self.bloom_fpr {
            c.bloom_fpr = v;
        }
        if let Some(v) = self.bft {
            c.lazy_bft = v;
        }
        if let Some(v) = self.prefetch {
            c.lazy_prefetch = v;
        }
        if let Some(v) = self.buffer_share {
            c.lazy_buffer_pct = v;
        }
        if let Some(v) = self.sparse_threshold {
            c.ehid_sparse_pct = v;
        }
        if let Some(v) = self.consult_cold {
            c.ehid_consult_cold = v;
        }
        if let Some(v) = &self.delta {
            c.delta.kind = v.parse()?;
        }
        if let Some(v) = &self.delta_features {
            c.delta.features = v.parse()?;
        }
        if let Some(v) = self.base_cache {
            c.delta.base_cache_containers = v;
        }
        if let Some(v) = &self.base_prefetch {
            c.delta.prefetch = v.parse()?;
        }
        if let Some(v) = &self.base_scope {
            c.delta.scope = v.parse()?;
        }
        if let Some(v) = &self.compression {
            let setting: Compression = v.parse().map_err(|e| format!("compression: {e}"))?;
            c.set_protection(c.encryption, setting);
        }
        c.rewrite.kind = self.rewrite.parse()?;
        c.rewrite.limit = self.rewrite_limit;
        if let Some(v) = &self.rewrite_segment {
            c.rewrite.segment_bytes = parse_size(v).map_err(|e| format!("rewrite_segment: {e}"))?;
        }
        if let Some(n) = self.rewrite_segment_chunks {
            if self.rewrite_segment.is_some() {
                return Err(
                    "rewrite_segment and rewrite_segment_chunks: give the segment in bytes or in chunks, not both"
                        .into(),
                );
            }
            if n == 0 {
                return Err("rewrite_segment_chunks must be at least 1 chunk".into());
            }
            c.rewrite.segment_chunks = Some(n);
        }
        if let Some(v) = self.cbr_min_utility {
            c.rewrite.cbr_min_utility = percent("cbr_min_utility", v)?;
        }
        if let Some(v) = self.har_utilization {
            c.rewrite.har_utilization = percent("har_utilization", v)?;
        }
        if let Some(v) = &self.cbr_stream_context {
            c.rewrite.cbr_stream_context =
                parse_size(v).map_err(|e| format!("cbr_stream_context: {e}"))?;
        }
        if let Some(v) = self.capping_level {
            c.rewrite.capping_level = v;
        }
        if let Some(v) = self.smr_level {
            c.rewrite.smr_level = v;
        }
        c.layout = match self.layout.as_str() {
            "container" => Layout::Container,
            "lifecycle" => Layout::Lifecycle,
            other => {
                return Err(format!(
                    "unknown layout {other:?} (expected container or lifecycle)"
                ))
            }
        };
        self.cache.parse::<CachePolicy>()?;
        c.validate().map_err(|e| e.to_string())?;
        if self.cache_size == 0 {
            return Err("cache_size must be at least 1 container".into());
        }
        self.gc_options(0.0)?;
        Ok(c)
    }

    /// GC options of this system at the experiment's threshold.
    pub fn gc_options(&self, threshold_pct: f64) -> Result<GcOptions, String> {
        if self.gc_segment == 0 {
            return Err("gc_segment must be at least 1 container".into());
        }
        Ok(GcOptions {
            threshold_pct,
            defrag: self.defrag.parse()?,
            segment: self.gc_segment,
            split_threshold: parse_size(&self.gc_split_threshold)
                .map_err(|e| format!("gc_split_threshold: {e}"))?,
            fill: self.gc_fill,
            ..GcOptions::default()
        })
    }
}

impl ExperimentConfig {
    /// Reads and checks an experiment file.
    pub fn load(path: &Path) -> Result<ExperimentConfig, ExperimentError> {
        let text = fs::read_to_string(path).map_err(io_err(path))?;
        let bad = |detail: String| ExperimentError::Config {
            path: path.display().to_string(),
            detail,
        };
        let mut config: ExperimentConfig = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        // Relative dataset paths are relative to the experiment file.
        let base = path.parent().unwrap_or(Path::new("."));
        for f in &mut config.dataset.files {
            if f.is_relative() {
                *f = base.join(&*f);
            }
        }
        for d in [&mut config.dataset.dir, &mut config.dataset.trees]
            .into_iter()
            .flatten()
        {
            if d.is_relative() {
                *d = base.join(&*d);
            }
        }
        config.validate().map_err(bad)?;
        Ok(config)
    }

    /// Checks the parts fit together.
    pub fn validate(&self) -> Result<(), String> {
        let d = &self.dataset;
        let sources = usize::from(!d.files.is_empty())
            + usize::from(d.dir.is_some())
            + usize::from(d.trees.is_some())
            + usize::from(d.generate.is_some());
        if sources != 1 {
            return Err(
                "dataset needs exactly one of `files`, `dir`, `trees` or `generate`".into(),
            );
        }
        if let Some(g) = &d.generate {
            parse_size(&g.size).map_err(|e| format!("dataset.generate.size: {e}"))?;
        }
        plain_name(&self.name).map_err(|rule| {
            format!(
                "name {:?}: {rule} (it names the default output directory results/<name>)",
                self.name
            )
        })?;
        if self.systems.is_empty() {
            return Err("no [[systems]] to compare".into());
        }
        // Case-insensitive file systems would give names differing only in
        // case one repository directory.
        let mut names = std::collections::BTreeMap::new();
        for s in &self.systems {
            plain_name(&s.name).map_err(|rule| {
                format!(
                    "system {:?}: name {rule} (it names the repository directory repos/<name>)",
                    s.name
                )
            })?;
            if let Some(other) = names.insert(s.name.to_ascii_lowercase(), &s.name) {
                return Err(format!(
                    "systems {other:?} and {:?}: names must differ (ignoring case), each names a repository directory",
                    s.name
                ));
            }
            s.repo_config()
                .map_err(|e| format!("system {:?}: {e}", s.name))?;
        }
        self.disk.validate()?;
        if self.retention.gc_every == 0 {
            return Err("retention.gc_every must be at least 1".into());
        }
        if self.repeat == 0 {
            return Err("repeat must be at least 1".into());
        }
        for key in &self.report.log_scale {
            if key != "all" && !crate::report::METRICS.iter().any(|m| m.key == key) {
                let keys: Vec<&str> = crate::report::METRICS.iter().map(|m| m.key).collect();
                return Err(format!(
                    "report.log_scale: unknown metric {key:?} (expected \"all\" or one of {})",
                    keys.join(", ")
                ));
            }
        }
        if !(0.0..=100.0).contains(&self.retention.gc_threshold) {
            return Err("retention.gc_threshold must be within 0..=100".into());
        }
        Ok(())
    }
}

/// Checks that `name` can name a directory inside another without leaving
/// it: only ASCII letters, digits, `-`, `_` and `.`, and neither empty, `.`
/// nor `..`. Returns the rule broken.
fn plain_name(name: &str) -> Result<(), &'static str> {
    const RULE: &str =
        "must be plain: only letters, digits, '-', '_' and '.', not empty, '.' or '..'";
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !plain || name.is_empty() || name == "." || name == ".." {
        return Err(RULE);
    }
    Ok(())
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
}

/// Metrics of one GC round in an experiment.
#[derive(Clone, Debug, Serialize)]
pub struct GcRecord {
    /// Backups deleted by retention before the GC.
    pub forgotten: usize,
    /// The engine's metrics.
    #[serde(flatten)]
    pub stats: tessera::gc::GcStats,
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
    /// Mean read amplification over them.
    pub mean_read_amplification: f64,
    /// Mean speed factor (per container or object read) over them.
    pub mean_speed_factor: f64,
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
    pub repository_configs: Vec<(String, Config)>,
    /// The dataset's versions.
    pub versions: Vec<Version>,
    /// All records, system by system, version by version.
    pub records: Vec<VersionRecord>,
    /// Restores of all retained backups after the last version (if asked).
    pub final_restores: Vec<FinalRestores>,
    /// Wall time of the whole experiment.
    pub seconds: f64,
}

/// Resolves the dataset into version files (generating it under `out` if asked).
pub fn dataset_versions(spec: &DatasetSpec, out: &Path) -> Result<Vec<Version>, ExperimentError> {
    if let Some(g) = &spec.generate {
        let dir = out.join("dataset");
        let mut opts = GenOptions {
            versions: g.versions,
            size: parse_size(&g.size).map_err(ExperimentError::Generate)?,
            seed: g.seed,
            sources: g.sources,
            trace: g.trace,
            tree: g.tree,
            ..GenOptions::default()
        };
        if let Some(r) = g.touch_rate {
            opts.touch_rate = r;
        }
        if let Some(r) = g.change_rate {
            opts.change_rate = r;
        }
        let summary =
            generate(&dir, &opts).map_err(|e| ExperimentError::Generate(e.to_string()))?;
        return Ok(summary
            .versions
            .into_iter()
            .map(|v| Version {
                path: v.path,
                source: v.info.source,
                tree: g.tree,
                warmed_bytes: 0,
            })
            .collect());
    }
    if let Some(dir) = &spec.trees {
        let mut trees: Vec<PathBuf> = fs::read_dir(dir)
            .map_err(io_err(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('v'))
            })
            .collect();
        trees.sort();
        return Ok(trees
            .into_iter()
            .map(|path| Version {
                path,
                source: "default".into(),
                tree: true,
                warmed_bytes: 0,
            })
            .collect());
    }
    let files = if let Some(dir) = &spec.dir {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .map_err(io_err(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('v'))
            })
            .collect();
        files.sort();
        files
    } else {
        spec.files.clone()
    };
    Ok(files
        .into_iter()
        .map(|path| Version {
            path,
            source: "default".into(),
            tree: false,
            warmed_bytes: 0,
        })
        .collect())
}

/// Runs `config`, writing `results.json`, `results.csv` and `report.html`
/// into `out`. `progress` receives one line per system and version.
///
/// Versions are backed up in turn on every system (version 1 on each, then
/// version 2, ...), so that load from elsewhere on a shared machine falls on
/// every system alike and the systems' throughputs compare version by version.
/// Each version is read once ([`warm_up`]) before its first backup, so that
/// no system pays the cold read for the others, and version `i` starts with
/// system `i mod n`, so that no system is always first or last. With `repeat = N` the whole
/// experiment runs N times, each time in fresh repositories.
pub fn run(
    config: &ExperimentConfig,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Results, ExperimentError> {
    let started = Instant::now();
    config
        .validate()
        .map_err(|detail| ExperimentError::Invalid {
            name: config.name.clone(),
            detail,
        })?;
    let provenance = Provenance::now();
    claim_output(out, &config.name)?;
    let mut versions = dataset_versions(&config.dataset, out)?;
    let mut records = Vec::new();
    let mut final_restores = Vec::new();
    let mut repository_configs = Vec::new();
    for repeat in 1..=config.repeat {
        let mut runs = config
            .systems
            .iter()
            .map(|system| SystemRun::start(system, &versions, out, repeat))
            .collect::<Result<Vec<_>, _>>()?;
        let total = versions.len();
        let n = runs.len();
        for (i, v) in versions.iter_mut().enumerate() {
            v.warmed_bytes = warm_up(v)?;
            // Each version starts with the next system, so that no system
            // is always first (after a quiet spell) or last.
            for k in 0..n {
                let record = runs[(i + k) % n].version(config, i + 1, v)?;
                progress(&progress_line(record, total, config.repeat));
            }
        }
        for run in runs {
            if repeat == 1 {
                repository_configs.push((run.system.name.clone(), run.repo.config().clone()));
            }
            let (r, f) = run.finish(config, progress)?;
            records.extend(r);
            final_restores.extend(f);
        }
    }
    let results = Results {
        provenance,
        config: config.clone(),
        repository_configs,
        versions,
        records,
        final_restores,
        seconds: started.elapsed().as_secs_f64(),
    };
    write_results(&results, out)?;
    Ok(results)
}

/// Reads version `v` (its file, or every file of its tree) once into the
/// page cache; returns the bytes read. The runner calls it before a
/// version's first backup so that the first system listed does not pay the
/// cold read for the others.
pub fn warm_up(v: &Version) -> Result<u64, ExperimentError> {
    fn read_all(path: &Path) -> Result<u64, ExperimentError> {
        let meta = fs::symlink_metadata(path).map_err(io_err(path))?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = fs::read_dir(path)
                .map_err(io_err(path))?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()
                .map_err(io_err(path))?;
            entries.sort();
            let mut total = 0;
            for e in entries {
                total += read_all(&e)?;
            }
            Ok(total)
        } else if meta.is_file() {
            let mut f = File::open(path).map_err(io_err(path))?;
            io::copy(&mut f, &mut io::sink()).map_err(io_err(path))
        } else {
            Ok(0)
        }
    }
    read_all(&v.path)
}

/// Makes `out` the output directory of experiment `name`: a missing or empty
/// directory is created and marked ([`OUTPUT_MARKER`]), one marked for the
/// same experiment (an earlier run) is reused. Anything else is refused, so
/// that the runner never replaces what it did not create.
pub fn claim_output(out: &Path, name: &str) -> Result<(), ExperimentError> {
    let refuse = |detail: String| ExperimentError::Output {
        dir: out.display().to_string(),
        detail,
    };
    let marker = out.join(OUTPUT_MARKER);
    match fs::metadata(out) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(out).map_err(io_err(out))?;
        }
        Err(e) => return Err(io_err(out)(e)),
        Ok(m) if !m.is_dir() => {
            return Err(refuse("exists and is not a directory".into()));
        }
        Ok(_) => match fs::read_to_string(&marker) {
            Ok(text) => {
                let owner = text.trim_end_matches('\n');
                if owner == name {
                    return Ok(());
                }
                return Err(refuse(format!(
                    "holds the output of experiment {owner:?}, not {name:?} (per its {OUTPUT_MARKER}); choose another --out"
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut entries = fs::read_dir(out).map_err(io_err(out))?;
                if entries.next().is_some() {
                    return Err(refuse(format!(
                        "not empty and not an experiment output directory (no {OUTPUT_MARKER}); choose a new or empty --out"
                    )));
                }
            }
            Err(e) => return Err(io_err(&marker)(e)),
        },
    }
    fs::write(&marker, format!("{name}\n")).map_err(io_err(&marker))
}

/// One system of an experiment: its repository and the records so far.
struct SystemRun<'a> {
    system: &'a SystemSpec,
    repeat: usize,
    repo: Repository,
    policy: CachePolicy,
    lifecycle: bool,
    trace: bool,
    records: Vec<VersionRecord>,
}

impl<'a> SystemRun<'a> {
    /// Creates the system's repository (replacing one left by an earlier run
    /// of the experiment: `out` is claimed and the name is plain).
    fn start(
        system: &'a SystemSpec,
        versions: &[Version],
        out: &Path,
        repeat: usize,
    ) -> Result<Self, ExperimentError> {
        let repo_dir = out.join("repos").join(&system.name);
        if repo_dir.exists() {
            fs::remove_dir_all(&repo_dir).map_err(io_err(&repo_dir))?;
        }
        let config_error = |detail| ExperimentError::Config {
            path: system.name.clone(),
            detail,
        };
        let mut repo_config = system.repo_config().map_err(config_error)?;
        let lifecycle = repo_config.layout == Layout::Lifecycle;
        let trace = versions.iter().any(|v| is_trace(&v.path));
        repo_config.trace = trace;
        if lifecycle {
            // Arrange after retention has deleted what it deletes, so that a
            // round never arranges categories of a version about to go.
            repo_config.arrange = tessera::repo::config::Arrange::Manual;
        }
        let policy: CachePolicy = system.cache.parse().map_err(config_error)?;
        let repo =
            Repository::init(&repo_dir, repo_config).map_err(|source| ExperimentError::Engine {
                system: system.name.clone(),
                version: 0,
                source,
            })?;
        Ok(SystemRun {
            system,
            repeat,
            repo,
            policy,
            lifecycle,
            trace,
            records: Vec::new(),
        })
    }

    /// Maps an engine error at version `version` to an experiment error.
    fn engine(&self, version: usize) -> impl Fn(tessera::Error) -> ExperimentError {
        let system = self.system.name.clone();
        move |source| ExperimentError::Engine {
            system: system.clone(),
            version,
            source,
        }
    }

    /// Backs up version `n` (`v`), then applies retention, GC and restores;
    /// returns (and keeps) its record.
    fn version(
        &mut self,
        config: &ExperimentConfig,
        n: usize,
        v: &Version,
    ) -> Result<&VersionRecord, ExperimentError> {
        let (repo, system) = (&self.repo, self.system);
        let engine = self.engine(n);
        let options = BackupOptions {
            label: format!("v{n}"),
            source: v.source.clone(),
            progress: None,
            ..Default::default()
        };
        let outcome = if v.tree {
            let paths = [v.path.clone()];
            backup_tree(repo, &paths, &TreeBackupOptions::default(), &options).map(|t| t.outcome)
        } else if self.trace {
            let mut reader =
                TraceFile::open(&v.path).map_err(|e| ExperimentError::Trace(e.to_string()))?;
            let mut chunks = std::iter::from_fn(|| match reader.next_chunk() {
                Ok(Some(c)) => Some(Ok((Fingerprint(c.fp), c.size))),
                Ok(None) => None,
                Err(e) => Some(Err(tessera::Error::InvalidConfig(e.to_string()))),
            });
            run_backup(repo, Source::Trace(&mut chunks), &options)
        } else {
            let mut input = File::open(&v.path).map_err(io_err(&v.path))?;
            let name = v.path.display().to_string();
            run_backup(
                repo,
                Source::Data {
                    input: &mut input,
                    name: &name,
                },
                &options,
            )
        }
        .map_err(&engine)?;
        let snap = outcome.snapshot;

        let mut gc_record = None;
        if let Some(keep) = config.retention.keep_last {
            if n.is_multiple_of(config.retention.gc_every) {
                let t = std::time::Instant::now();
                let forgotten = forget_keep_last(repo, keep, false).map_err(&engine)?;
                let stats = if self.lifecycle {
                    // Deleting frees the space: no GC pass; its cost is the deletion.
                    tessera::gc::GcStats {
                        seconds: t.elapsed().as_secs_f64(),
                        ..Default::default()
                    }
                } else {
                    let options =
                        system
                            .gc_options(config.retention.gc_threshold)
                            .map_err(|detail| ExperimentError::Config {
                                path: system.name.clone(),
                                detail,
                            })?;
                    gc(repo, options).map_err(&engine)?
                };
                gc_record = Some(GcRecord {
                    forgotten: forgotten.len(),
                    stats,
                });
            }
        }

        let arrange = if self.lifecycle {
            Some(tessera::layout::lifecycle::arrange(repo).map_err(&engine)?)
        } else {
            outcome.arrange
        };

        let mut restores = Vec::new();
        if config.restore.every > 0 && n.is_multiple_of(config.restore.every) {
            let retained = repo.backups().map_err(&engine)?;
            let mut targets = vec![snap.id];
            if config.restore.oldest {
                if let Some(&oldest) = retained.first() {
                    if oldest != snap.id {
                        targets.insert(0, oldest);
                    }
                }
            }
            for id in targets {
                restores.push(
                    restore_one(repo, id, system, self.policy, config.disk).map_err(&engine)?,
                );
            }
        }

        let totals = tessera::commands::stats::totals(repo).map_err(&engine)?;
        let record = VersionRecord {
            system: system.name.clone(),
            repeat: self.repeat,
            version: n,
            source: v.source.clone(),
            logical_bytes: snap.logical_bytes,
            stored_bytes: snap.stats.stored_bytes,
            backup_seconds: snap.stats.seconds,
            backup_mb_s: snap.stats.throughput_mb_s,
            modelled_backup_seconds: config.disk.seconds(
                snap.stats.reads,
                snap.stats.bytes_read + snap.stats.bytes_written,
            ),
            backup_stage_seconds: snap.stats.stage_seconds.clone(),
            index_memory_bytes: snap.stats.index.memory_bytes,
            index_entries: snap.stats.index.entries,
            index_disk_lookups: snap.stats.index.disk_lookups,
            index: snap.stats.index.clone(),
            delta: snap.stats.delta.clone(),
            compression: snap.stats.compression.clone(),
            retained_logical_bytes: totals.logical_bytes,
            physical_bytes: totals.physical_bytes,
            actual_dedup_ratio: totals.dedup_ratio.unwrap_or(1.0),
            compression_ratio: totals.compression_ratio.unwrap_or(1.0),
            total_ratio: totals.total_ratio.unwrap_or(1.0),
            restores,
            gc: gc_record,
            arrange,
        };
        self.records.push(record);
        Ok(&self.records[self.records.len() - 1])
    }

    /// Restores every retained backup (when configured) and returns the
    /// system's records and final restores.
    fn finish(
        self,
        config: &ExperimentConfig,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(Vec<VersionRecord>, Option<FinalRestores>), ExperimentError> {
        if !config.restore.retained_at_end {
            return Ok((self.records, None));
        }
        let (repo, system) = (&self.repo, self.system);
        let engine = self.engine(self.records.len());
        let mut restores = Vec::new();
        for id in repo.backups().map_err(&engine)? {
            restores
                .push(restore_one(repo, id, system, self.policy, config.disk).map_err(&engine)?);
        }
        let mean = |f: &dyn Fn(&RestoreRecord) -> f64| {
            restores.iter().map(f).sum::<f64>() / restores.len().max(1) as f64
        };
        let gcs = self.records.iter().filter_map(|r| r.gc.as_ref());
        let arranges = self.records.iter().filter_map(|r| r.arrange.as_ref());
        let f = FinalRestores {
            system: system.name.clone(),
            repeat: self.repeat,
            mean_read_amplification: mean(&|r| r.stats.read_amplification),
            mean_speed_factor: mean(&|r| r.stats.speed_factor),
            mean_speed_factor_per_extent: mean(&|r| r.speed_factor_per_extent),
            mean_restore_mb_s: mean(&|r| r.stats.throughput_mb_s),
            mean_modelled_seconds: mean(&|r| r.modelled_seconds),
            gc_containers_produced: gcs.clone().map(|g| g.stats.containers_produced).sum(),
            gc_bytes_moved: gcs
                .clone()
                .map(|g| g.stats.bytes_read + g.stats.bytes_written)
                .sum(),
            gc_seconds: gcs.map(|g| g.stats.seconds).sum(),
            arrange_bytes_moved: arranges
                .clone()
                .map(|a| a.bytes_read + a.bytes_written)
                .sum(),
            arrange_seconds: arranges.map(|a| a.seconds).sum(),
            restores,
        };
        progress(&format!(
            "[{}{}] all {} retained backups restored: mean read amplification {:.3}, speed factor {:.3} per container, {:.3} per extent, {:.0} MB/s",
            f.system,
            repeat_tag(f.repeat, config.repeat),
            f.restores.len(),
            f.mean_read_amplification,
            f.mean_speed_factor,
            f.mean_speed_factor_per_extent,
            f.mean_restore_mb_s
        ));
        Ok((self.records, Some(f)))
    }
}

/// Restores backup `id` to a sink (every chunk verified) and models its time on `disk`.
fn restore_one(
    repo: &Repository,
    id: u64,
    system: &SystemSpec,
    policy: CachePolicy,
    disk: DiskModel,
) -> tessera::Result<RestoreRecord> {
    let options = RestoreOptions {
        cache_containers: system.cache_size,
        policy,
        progress: None,
        skip_damaged: false,
    };
    let stats = restore(repo, id, &mut io::sink(), &options)?;
    Ok(RestoreRecord {
        version: id as usize,
        modelled_seconds: disk.seconds(stats.extents, stats.bytes_read),
        speed_factor_per_extent: per_extent(&stats),
        stats,
    })
}

/// MiB restored per read extent (0 when nothing was read).
fn per_extent(stats: &RestoreStats) -> f64 {
    if stats.extents == 0 {
        0.0
    } else {
        stats.bytes_restored as f64 / 1048576.0 / stats.extents as f64
    }
}

/// " repeat r/N" when the experiment runs more than once.
fn repeat_tag(repeat: usize, of: usize) -> String {
    if of > 1 {
        format!(" repeat {repeat}/{of}")
    } else {
        String::new()
    }
}

/// Whether a version file is a fingerprint trace (by its extension).
fn is_trace(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "trace")
}

fn progress_line(r: &VersionRecord, total: usize, repeats: usize) -> String {
    let restore = r
        .restores
        .last()
        .map(|x| {
            format!(
                ", restore {:.0} MB/s, read amp {:.2}, speed factor {:.2} ({:.2} per extent)",
                x.stats.throughput_mb_s,
                x.stats.read_amplification,
                x.stats.speed_factor,
                x.speed_factor_per_extent
            )
        })
        .unwrap_or_default();
    let gc = match (r.data_moved_seconds(), r.data_moved_bytes()) {
        (Some(s), Some(b)) => format!(
            ", {} {:.2} s, {:.1} MiB moved",
            if r.arrange.is_some() {
                "arranging"
            } else {
                "gc"
            },
            s,
            b as f64 / 1048576.0
        ),
        _ => String::new(),
    };
    format!(
        "[{}{}] version {}/{}: backup {:.0} MB/s, actual dedup {:.2}{}{}",
        r.system,
        repeat_tag(r.repeat, repeats),
        r.version,
        total,
        r.backup_mb_s,
        r.actual_dedup_ratio,
        restore,
        gc
    )
}

fn write_results(results: &Results, out: &Path) -> Result<(), ExperimentError> {
    let json_path = out.join("results.json");
    let json = serde_json::to_vec_pretty(results).map_err(|e| ExperimentError::Io {
        what: json_path.display().to_string(),
        source: io::Error::other(e),
    })?;
    fs::write(&json_path, json).map_err(io_err(&json_path))?;

    let csv_path = out.join("results.csv");
    let mut csv = BufWriter::new(File::create(&csv_path).map_err(io_err(&csv_path))?);
    let header = "system,version,source,logical_bytes,stored_bytes,backup_seconds,backup_mb_s,modelled_backup_seconds,index_memory_bytes,index_entries,index_disk_lookups,retained_logical_bytes,physical_bytes,actual_dedup_ratio,restore_version,restore_mb_s,read_amplification,speed_factor,containers_read,restore_bytes_read,modelled_restore_seconds,gc_seconds,gc_containers_involved,gc_containers_reclaimed,gc_containers_produced,gc_bytes_read,gc_bytes_written,restore_extents,speed_factor_per_extent,arrange_seconds,arrange_bytes_read,arrange_bytes_written,compression_ratio,total_ratio,compressed_bytes,repeat";
    writeln!(csv, "{header}").map_err(io_err(&csv_path))?;
    for r in &results.records {
        let restore = r.restores.last();
        let opt = |v: Option<String>| v.unwrap_or_default();
        writeln!(
            csv,
            "{},{},{},{},{},{:.6},{:.3},{:.6},{},{},{},{},{},{:.6},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.6},{},{}",
            csv_field(&r.system),
            r.version,
            csv_field(&r.source),
            r.logical_bytes,
            r.stored_bytes,
            r.backup_seconds,
            r.backup_mb_s,
            r.modelled_backup_seconds,
            r.index_memory_bytes,
            r.index_entries,
            r.index_disk_lookups,
            r.retained_logical_bytes,
            r.physical_bytes,
            r.actual_dedup_ratio,
            opt(restore.map(|x| x.version.to_string())),
            opt(restore.map(|x| format!("{:.3}", x.stats.throughput_mb_s))),
            opt(restore.map(|x| format!("{:.6}", x.stats.read_amplification))),
            opt(restore.map(|x| format!("{:.6}", x.stats.speed_factor))),
            opt(restore.map(|x| x.stats.containers_read.to_string())),
            opt(restore.map(|x| x.stats.bytes_read.to_string())),
            opt(restore.map(|x| format!("{:.6}", x.modelled_seconds))),
            opt(r.gc.as_ref().map(|g| format!("{:.6}", g.stats.seconds))),
            opt(r.gc.as_ref().map(|g| g.stats.containers_involved.to_string())),
            opt(r.gc.as_ref().map(|g| g.stats.containers_reclaimed.to_string())),
            opt(r.gc.as_ref().map(|g| g.stats.containers_produced.to_string())),
            opt(r.gc.as_ref().map(|g| g.stats.bytes_read.to_string())),
            opt(r.gc.as_ref().map(|g| g.stats.bytes_written.to_string())),
            opt(restore.map(|x| x.stats.extents.to_string())),
            opt(restore.map(|x| format!("{:.6}", x.speed_factor_per_extent))),
            opt(r.arrange.as_ref().map(|a| format!("{:.6}", a.seconds))),
            opt(r.arrange.as_ref().map(|a| a.bytes_read.to_string())),
            opt(r.arrange.as_ref().map(|a| a.bytes_written.to_string())),
            r.compression_ratio,
            r.total_ratio,
            r.compression.bytes_after,
            r.repeat,
        )
        .map_err(io_err(&csv_path))?;
    }
    csv.flush().map_err(io_err(&csv_path))?;

    let html_path = out.join("report.html");
    fs::write(&html_path, report::render(results)).map_err(io_err(&html_path))?;
    Ok(())
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An experiment over a tiny generated dataset with systems `names`,
    /// followed by `extra` TOML.
    fn text(names: &[&str], extra: &str) -> String {
        let mut t =
            String::from("name = \"tiny\"\n[dataset.generate]\nversions = 2\nsize = \"200KB\"\n");
        t.push_str(extra);
        for n in names {
            t.push_str(&format!("[[systems]]\nname = {}\n", toml_string(n)));
        }
        t
    }

    /// `s` as a TOML basic string.
    fn toml_string(s: &str) -> String {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    }

    /// Loads `text` from a file in `dir`; the error's message on failure.
    fn load(dir: &Path, text: &str) -> Result<ExperimentConfig, String> {
        let path = dir.join("experiment.toml");
        fs::write(&path, text).unwrap();
        ExperimentConfig::load(&path).map_err(|e| e.to_string())
    }

    /// A directory holding one file, standing for someone else's data.
    fn sentinel(dir: &Path) -> PathBuf {
        let s = dir.join("sentinel");
        fs::create_dir_all(&s).unwrap();
        fs::write(s.join("notes.txt"), b"keep me").unwrap();
        s
    }

    fn assert_sentinel_intact(s: &Path) {
        assert_eq!(fs::read(s.join("notes.txt")).unwrap(), b"keep me");
        assert_eq!(fs::read_dir(s).unwrap().count(), 1, "{}", s.display());
    }

    #[test]
    fn path_like_system_names_are_refused_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let s = sentinel(tmp.path());
        let out = tmp.path().join("out");
        let abs = s.display().to_string();
        // out/repos/<name>: an absolute name replaces the path, "../../x" leaves out.
        for name in [
            abs.as_str(),
            "../../sentinel",
            "a/b",
            "..",
            ".",
            "",
            "a\\b",
            "x y",
        ] {
            let err = load(tmp.path(), &text(&["exact", name], "")).unwrap_err();
            assert!(
                err.contains(&format!("system {name:?}: name must be plain")),
                "{name:?}: {err}"
            );
            assert!(!err.contains('\n'), "{err}");

            // A configuration built in code is checked by `run` too.
            let mut config: ExperimentConfig = toml::from_str(&text(&["exact"], "")).unwrap();
            config.systems[0].name = name.into();
            let err = run(&config, &out, &mut |_| {}).unwrap_err();
            assert!(
                matches!(&err, ExperimentError::Invalid { detail, .. } if detail.contains("must be plain")),
                "{name:?}: {err}"
            );
            assert!(!out.exists(), "{name:?}: nothing is written");
            assert_sentinel_intact(&s);
        }
    }

    #[test]
    fn path_like_experiment_names_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["../x", "/abs", "a/b", "..", ""] {
            let t = text(&["exact"], "").replace("\"tiny\"", &toml_string(name));
            let err = load(tmp.path(), &t).unwrap_err();
            assert!(
                err.contains(&format!("name {name:?}: must be plain")),
                "{name:?}: {err}"
            );
        }
    }

    #[test]
    fn names_sharing_a_directory_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for pair in [["exact", "exact"], ["exact", "Exact"]] {
            let err = load(tmp.path(), &text(&pair, "")).unwrap_err();
            assert!(
                err.contains(&format!(
                    "systems {:?} and {:?}: names must differ (ignoring case)",
                    pair[0], pair[1]
                )),
                "{pair:?}: {err}"
            );
        }
        load(tmp.path(), &text(&["exact", "exact-2", "exact.v2"], "")).unwrap();
    }

    #[test]
    fn disk_values_must_be_positive_and_finite() {
        let tmp = tempfile::tempdir().unwrap();
        for field in ["seek_ms", "bandwidth_mb_s"] {
            for value in ["0.0", "-0.0", "-1.0", "-12.7", "nan", "inf", "-inf"] {
                let disk = format!("[disk]\n{field} = {value}\n");
                let err = load(tmp.path(), &text(&["exact"], &disk)).unwrap_err();
                assert!(
                    err.contains(&format!("disk.{field} = "))
                        && err.ends_with("must be finite and greater than 0"),
                    "{field} = {value}: {err}"
                );
            }
        }
        let c = load(
            tmp.path(),
            &text(
                &["exact"],
                "[disk]\nseek_ms = 0.1\nbandwidth_mb_s = 500.0\n",
            ),
        )
        .unwrap();
        assert_eq!(c.disk.seconds(10, 1_000_000), 0.001 + 0.002);
    }

    #[test]
    fn foreign_output_directories_are_refused_and_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let config: ExperimentConfig = toml::from_str(&text(&["exact"], "")).unwrap();

        // Someone's directory that happens to hold repos/<system name>.
        let out = tmp.path().join("theirs");
        let repo = out.join("repos").join("exact");
        let s = sentinel(&repo);
        let err = run(&config, &out, &mut |_| {}).unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "not empty and not an experiment output directory (no {OUTPUT_MARKER})"
            )),
            "{err}"
        );
        assert_sentinel_intact(&s);
        assert_eq!(fs::read_dir(&out).unwrap().count(), 1, "nothing added");
        assert_eq!(fs::read_dir(&repo).unwrap().count(), 1, "nothing added");

        // The output of another experiment.
        let other = tmp.path().join("other");
        let s = sentinel(&other.join("repos").join("exact"));
        fs::write(other.join(OUTPUT_MARKER), "baselines\n").unwrap();
        let err = run(&config, &other, &mut |_| {}).unwrap_err();
        assert!(
            err.to_string()
                .contains("holds the output of experiment \"baselines\", not \"tiny\""),
            "{err}"
        );
        assert_sentinel_intact(&s);
        assert_eq!(
            fs::read_to_string(other.join(OUTPUT_MARKER)).unwrap(),
            "baselines\n"
        );

        // A file.
        let file = tmp.path().join("file");
        fs::write(&file, b"data").unwrap();
        let err = run(&config, &file, &mut |_| {}).unwrap_err();
        assert!(
            err.to_string().ends_with("exists and is not a directory"),
            "{err}"
        );
        assert_eq!(fs::read(&file).unwrap(), b"data");
    }

    #[test]
    fn version_trees_are_backed_up_as_tree_backups() {
        let tmp = tempfile::tempdir().unwrap();
        let systems = "[[systems]]\nname = \"exact\"\n[[systems]]\nname = \"mfdedup\"\nlayout = \"lifecycle\"\n";
        let generated = format!("name = \"trees\"\n[dataset.generate]\nversions = 3\nsize = \"300KB\"\ntree = true\n{systems}");
        let config: ExperimentConfig = toml::from_str(&generated).unwrap();
        let out = tmp.path().join("gen");
        let results = run(&config, &out, &mut |_| {}).unwrap();
        assert!(results.versions.iter().all(|v| v.tree && v.path.is_dir()));
        assert_eq!(results.records.len(), 6);
        for r in &results.records {
            // A version's later backups store far less than it holds.
            if r.version > 1 {
                assert!(r.stored_bytes * 4 < r.logical_bytes, "{r:?}");
            }
        }
        for system in ["exact", "mfdedup"] {
            let repo = Repository::open(
                &out.join("repos").join(system),
                tessera::backend::LockMode::Read,
            )
            .unwrap();
            assert!(repo.snapshot(3).unwrap().tree.is_some(), "{system}");
        }
        // The same trees as a `trees` dataset give the same backups.
        let trees = format!(
            "name = \"dir\"\n[dataset]\ntrees = {}\n{systems}",
            toml_string(&out.join("dataset").display().to_string())
        );
        let dir = tmp.path().join("dir.toml");
        fs::write(&dir, trees).unwrap();
        let config = ExperimentConfig::load(&dir).unwrap();
        let again = run(&config, &tmp.path().join("dir"), &mut |_| {}).unwrap();
        assert_eq!(again.versions.len(), 3);
        // The same files; only the catalogs' records of the directories
        // above the trees (changed by the runs' outputs) may differ.
        for (a, b) in again.records.iter().zip(&results.records) {
            assert!(
                a.logical_bytes.abs_diff(b.logical_bytes) < 64,
                "{a:?} {b:?}"
            );
        }
    }

    #[test]
    fn own_output_directory_is_marked_and_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let config: ExperimentConfig = toml::from_str(&text(&["exact"], "")).unwrap();
        // An existing empty directory is adopted.
        let out = tmp.path().join("out");
        fs::create_dir(&out).unwrap();
        let first = run(&config, &out, &mut |_| {}).unwrap();
        assert_eq!(
            fs::read_to_string(out.join(OUTPUT_MARKER)).unwrap(),
            "tiny\n"
        );
        // The second run replaces its repository (a fresh one: version 1 is backup 1 again).
        let second = run(&config, &out, &mut |_| {}).unwrap();
        assert_eq!(second.records.len(), first.records.len());
        let repo = Repository::open(
            &out.join("repos").join("exact"),
            tessera::backend::LockMode::Read,
        )
        .unwrap();
        assert_eq!(repo.backups().unwrap(), vec![1, 2]);
    }

    #[test]
    fn arranging_is_data_movement_and_lifecycle_restores_count_extents() {
        let tmp = tempfile::tempdir().unwrap();
        let t = "name = \"lc\"\n[dataset.generate]\nversions = 5\nsize = \"400KB\"\n\
                 [retention]\nkeep_last = 2\n[restore]\noldest = true\nretained_at_end = true\n\
                 [[systems]]\nname = \"lifecycle\"\nlayout = \"lifecycle\"\n\
                 [[systems]]\nname = \"exact\"\ncontainer_size = \"128KiB\"\n";
        let config = load(tmp.path(), t).unwrap();
        let out = tmp.path().join("out");
        let results = run(&config, &out, &mut |_| {}).unwrap();
        let lifecycle: Vec<&VersionRecord> = results
            .records
            .iter()
            .filter(|r| r.system == "lifecycle")
            .collect();
        let arranged: u64 = lifecycle
            .iter()
            .filter_map(|r| r.arrange.as_ref())
            .map(|a| a.bytes_read + a.bytes_written)
            .sum();
        assert!(arranged > 0, "arranging moves data");
        let moved: u64 = lifecycle.iter().filter_map(|r| r.data_moved_bytes()).sum();
        assert_eq!(moved, arranged, "arranging counts as data movement");
        let metric = crate::report::METRICS
            .iter()
            .find(|m| m.key == "data_moved")
            .unwrap();
        let plotted: f64 = lifecycle.iter().filter_map(|r| (metric.value)(r)).sum();
        assert!((plotted - arranged as f64 / 1048576.0).abs() < 1e-9);
        let f = results
            .final_restores
            .iter()
            .find(|f| f.system == "lifecycle")
            .unwrap();
        assert_eq!(f.arrange_bytes_moved, arranged);
        let csv = fs::read_to_string(out.join("results.csv")).unwrap();
        assert!(csv.lines().next().unwrap().contains(
            "restore_extents,speed_factor_per_extent,arrange_seconds,arrange_bytes_read,arrange_bytes_written"
        ));

        // Every restore, of either layout, counts its extents; the modelled
        // time pays a seek per extent, and the speed factor is given per extent.
        let restores = results
            .records
            .iter()
            .flat_map(|r| &r.restores)
            .chain(results.final_restores.iter().flat_map(|f| &f.restores));
        let mut lifecycle_restores = 0;
        for x in restores {
            assert!(x.stats.extents >= 1, "{x:?}");
            assert_eq!(
                x.modelled_seconds,
                config.disk.seconds(x.stats.extents, x.stats.bytes_read)
            );
            let per_extent = x.stats.bytes_restored as f64 / 1048576.0 / x.stats.extents as f64;
            assert_eq!(x.speed_factor_per_extent, per_extent);
            if x.stats.policy == "lifecycle" {
                lifecycle_restores += 1;
                assert!(x.stats.extents >= x.stats.containers_read, "{x:?}");
            } else {
                assert_eq!(x.stats.extents, x.stats.containers_read, "{x:?}");
            }
        }
        assert!(lifecycle_restores > 5);
        let html = fs::read_to_string(out.join("report.html")).unwrap();
        for title in [
            "Speed factor per extent (newest backup)",
            "Speed factor per extent (oldest retained backup)",
            "Extents read (newest backup)",
            "Index entries",
        ] {
            assert!(html.contains(title), "{title}");
        }
    }

    #[test]
    fn systems_rotate_and_every_version_is_read_before_its_first_backup() {
        let tmp = tempfile::tempdir().unwrap();
        let t =
            "name = \"position\"\nrepeat = 5\n[dataset.generate]\nversions = 3\nsize = \"6MB\"\n\
                 [restore]\nevery = 0\n\
                 [[systems]]\nname = \"first\"\n\
                 [[systems]]\nname = \"middle\"\nindex = \"ddfs\"\n\
                 [[systems]]\nname = \"last\"\n";
        let config = load(tmp.path(), t).unwrap();
        let mut lines = Vec::new();
        let results = run(&config, &tmp.path().join("out"), &mut |l| {
            lines.push(l.to_string())
        })
        .unwrap();
        // What keeps a system's position from biasing its timing: every
        // version is read whole before its first backup, and version i
        // starts with system i mod 3. (Timings themselves are not asserted:
        // a shared machine's load makes any bound flaky.)
        for v in &results.versions {
            assert_eq!(
                v.warmed_bytes,
                fs::metadata(&v.path).unwrap().len(),
                "{v:?}"
            );
        }
        let names = ["first", "middle", "last"];
        for (k, line) in lines.iter().take(9).enumerate() {
            let (version, position) = (k / 3, k % 3);
            let expected = names[(version + position) % 3];
            assert!(
                line.starts_with(&format!(
                    "[{expected} repeat 1/5] version {}/3",
                    version + 1
                )),
                "{line}"
            );
        }
        // The repeats are all recorded and summarised as median and spread.
        assert_eq!(results.records.len(), 5 * 3 * 3);
        let summary = crate::report::summary(&results);
        let i = crate::report::METRICS
            .iter()
            .position(|m| m.key == "backup_mb_s")
            .unwrap();
        let s = summary[0].1[i].unwrap();
        assert!(s.min <= s.median && s.median <= s.max);
    }

    #[test]
    fn results_record_provenance_and_the_full_configuration() {
        let tmp = tempfile::tempdir().unwrap();
        let config = load(
            tmp.path(),
            &text(&["exact"], "").replace(
                "name = \"tiny\"\n",
                "name = \"tiny\"\nexpected_run_time = \"a second\"\n",
            ),
        )
        .unwrap();
        let out = tmp.path().join("out");
        run(&config, &out, &mut |_| {}).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&fs::read(out.join("results.json")).unwrap()).unwrap();
        let p = &json["provenance"];
        assert_eq!(p["tessera_version"], env!("CARGO_PKG_VERSION"));
        for field in ["git_commit", "cpu_model", "date"] {
            assert!(!p[field].as_str().unwrap().is_empty(), "{field}: {p}");
        }
        assert!(p["cores"].as_u64().unwrap() >= 1);
        assert!(p["date"]
            .as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .is_ok());
        // The experiment with every default filled in, and each system's
        // repository configuration.
        assert_eq!(json["config"]["systems"][0]["avg_size"], "8KiB");
        assert_eq!(json["config"]["expected_run_time"], "a second");
        assert_eq!(json["repository_configs"][0][0], "exact");
        assert_eq!(
            json["repository_configs"][0][1]["rewrite"]["har_utilization"],
            0.5
        );
        let html = fs::read_to_string(out.join("report.html")).unwrap();
        for field in ["git_commit", "cpu_model", "date"] {
            assert!(html.contains(p[field].as_str().unwrap()), "{field}");
        }
        assert!(html.contains("(expected: a second)"));
        assert!(
            html.contains("&quot;har_utilization&quot;") || html.contains("\"har_utilization\"")
        );
    }

    #[test]
    fn every_policy_parameter_can_be_set() {
        let tmp = tempfile::tempdir().unwrap();
        let system = "[[systems]]\nname = \"all\"\nindex = \"lazy\"\nrewrite = \"capping\"\n\
                      capping_segment_chunks = 1024\ncbr_min_utility = 60\nhar_utilization = 40\n\
                      bloom_fpr = 0.02\nbloom_size = \"1MiB\"\nbft = 8\nprefetch = 64\n\
                      buffer_share = 25\nconsult_cold = true\nsparse_threshold = 30\n";
        let t = format!("name = \"p\"\n[dataset.generate]\nversions = 1\nsize = \"1MB\"\n{system}");
        let config = load(tmp.path(), &t).unwrap();
        let c = config.systems[0].repo_config().unwrap();
        assert_eq!(c.rewrite.segment_chunks, Some(1024));
        assert_eq!(
            c.rewrite.segment(),
            tessera::rewrite::SegmentSize::Chunks(1024)
        );
        assert_eq!(c.rewrite.cbr_min_utility, 0.6);
        assert_eq!(c.rewrite.har_utilization, 0.4);
        assert_eq!(c.bloom_fpr, 0.02);
        assert_eq!(c.bloom_bytes, 1 << 20);
        assert_eq!(
            (c.lazy_bft, c.lazy_prefetch, c.lazy_buffer_pct),
            (8, 64, 25)
        );
        assert!(c.ehid_consult_cold);
        assert_eq!(c.ehid_sparse_pct, 30);
        // The chunk form's own name, and its errors.
        let alias = t.replace("capping_segment_chunks", "rewrite_segment_chunks");
        assert_eq!(
            load(tmp.path(), &alias).unwrap().systems[0]
                .repo_config()
                .unwrap()
                .rewrite
                .segment_chunks,
            Some(1024)
        );
        let err = load(tmp.path(), &format!("{t}rewrite_segment = \"20MiB\"\n")).unwrap_err();
        assert!(
            err.contains("give the segment in bytes or in chunks, not both"),
            "{err}"
        );
        for (bad, expected) in [
            (
                "har_utilization = 140",
                "har_utilization = 140: must be a percentage within 0..=100",
            ),
            (
                "cbr_min_utility = -1",
                "cbr_min_utility = -1: must be a percentage within 0..=100",
            ),
        ] {
            let field = bad.split(' ').next().unwrap();
            let good = t.lines().find(|l| l.starts_with(field)).unwrap();
            let err = load(tmp.path(), &t.replace(good, bad)).unwrap_err();
            assert!(err.contains(expected), "{bad}: {err}");
        }
        let zero = t.replace("= 1024", "= 0");
        assert!(load(tmp.path(), &zero)
            .unwrap_err()
            .contains("rewrite_segment_chunks must be at least 1 chunk"));
        // Report and repeat options.
        let err = load(tmp.path(), &format!("repeat = 0\n{t}")).unwrap_err();
        assert!(err.contains("repeat must be at least 1"), "{err}");
        let err = load(
            tmp.path(),
            &t.replace("[dataset", "[report]\nlog_scale = [\"speed\"]\n[dataset"),
        )
        .unwrap_err();
        assert!(
            err.contains("report.log_scale: unknown metric \"speed\""),
            "{err}"
        );
        let ok = t.replace(
            "[dataset",
            "[report]\nlog_scale = [\"speed_factor\", \"all\"]\n[dataset",
        );
        load(tmp.path(), &ok).unwrap();
    }

    #[test]
    fn every_example_experiment_loads_and_states_its_run_time() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
        let mut n = 0;
        for e in fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_none_or(|x| x != "toml") {
                continue;
            }
            let text = fs::read_to_string(&path).unwrap();
            let config: ExperimentConfig =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                config.expected_run_time.is_some(),
                "{}: no expected_run_time",
                path.display()
            );
            n += 1;
        }
        assert!(n >= 10);
    }
}
