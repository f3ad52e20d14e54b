//! The experiment runner: one dataset, several system configurations, a
//! retention policy; each configuration runs in a fresh repository and every
//! version's backup, restore and GC metrics are recorded (DESIGN.md,
//! "Metrics") to JSON and CSV and rendered as an HTML report.

use crate::gen::{generate, GenOptions};
use crate::report;
use crate::trace::TraceFile;
pub use crate::types::{
    DatasetSpec, DiskModel, ExperimentConfig, FinalRestores, GcRecord, GenSpec, Ownership,
    Provenance, ReportSpec, RestoreRecord, RestoreSpec, Results, Retention, StoredRead, SystemSpec,
    Version, VersionRecord,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tessera::backup::{backup, BackupOptions, Input, TreeBackupOptions};
use tessera::chunker::{ChunkerKind, ChunkerParams};
use tessera::gc::{forget_keep_last, gc, GcOptions};
use tessera::layout::container::ContainerId;
use tessera::parse_size;
use tessera::repo::config::Layout;
use tessera::repo::config::{Compression, Config};
use tessera::restore::plan::CachePolicy;
use tessera::restore::{restore, RestoreOptions, RestoreStats};
use tessera::Fingerprint;
use tessera::FingerprintAlgo;
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
            tessera::parse_size_u32(s).map_err(|e| format!("{what}: {e}"))
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
        c.layout = self.layout.parse::<Layout>()?;
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
        config.expand_compression().map_err(&bad)?;
        config.validate().map_err(bad)?;
        Ok(config)
    }

    /// The settings of the compression axis: as the file gives them, or
    /// the default (see [`ExperimentConfig::compression`]).
    pub fn compression_axis(&self) -> Vec<String> {
        match &self.compression {
            Some(list) => list.clone(),
            None if self.is_trace() => vec!["off".into()],
            None => vec!["off".into(), "auto".into()],
        }
    }

    /// Whether the dataset is of fingerprint traces.
    fn is_trace(&self) -> bool {
        let d = &self.dataset;
        let dir_has_traces = |dir: &PathBuf| {
            fs::read_dir(dir)
                .is_ok_and(|entries| entries.filter_map(|e| e.ok()).any(|e| is_trace(&e.path())))
        };
        d.generate.as_ref().is_some_and(|g| g.trace)
            || d.files.iter().any(|f| is_trace(f))
            || d.dir.as_ref().is_some_and(dir_has_traces)
    }

    /// Expands the compression axis: every system that sets no
    /// `compression` is replaced by one system per setting of the axis
    /// (`NAME` with `off`, `NAME.SETTING` with the others), in place.
    /// Systems that set it (among them those expanded before) stay as they
    /// are, so expanding twice changes nothing.
    pub fn expand_compression(&mut self) -> Result<(), String> {
        let axis = self.compression_axis();
        if axis.is_empty() {
            return Err("compression = []: give at least one setting (\"off\": plain)".into());
        }
        let mut seen: Vec<Compression> = Vec::new();
        for c in &axis {
            let setting: Compression = c.parse().map_err(|e| format!("compression: {e}"))?;
            if seen.contains(&setting) {
                return Err(format!(
                    "compression: {c:?} is listed twice (as another name)"
                ));
            }
            if setting.is_on() && self.is_trace() {
                return Err(format!(
                    "compression: {c:?}: a trace dataset has no chunk bytes to compress (use [\"off\"])"
                ));
            }
            seen.push(setting);
        }
        let mut systems = Vec::with_capacity(self.systems.len() * axis.len());
        for s in &self.systems {
            if s.compression.is_some() {
                systems.push(s.clone());
                continue;
            }
            for c in &axis {
                let mut v = s.clone();
                if c != "off" {
                    v.name = format!("{}.{c}", s.name);
                }
                v.compression = Some(c.clone());
                systems.push(v);
            }
        }
        self.systems = systems;
        self.compression = Some(axis);
        Ok(())
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
    let invalid = |detail| ExperimentError::Invalid {
        name: config.name.clone(),
        detail,
    };
    let mut config = config.clone();
    config.expand_compression().map_err(invalid)?;
    config.validate().map_err(invalid)?;
    let config = &config;
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
    /// Containers GC's copy-forward wrote (ids it allocated).
    gc_written: BTreeSet<ContainerId>,
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
            gc_written: BTreeSet::new(),
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
        let repo = &self.repo;
        let engine = self.engine(n);
        let options = BackupOptions {
            label: format!("v{n}"),
            source: v.source.clone(),
            progress: None,
            ..Default::default()
        };
        let outcome = if v.tree {
            let paths = [v.path.clone()];
            backup(
                repo,
                Input::Tree {
                    paths: &paths,
                    options: &TreeBackupOptions::default(),
                },
                &options,
            )
        } else if self.trace {
            let mut reader =
                TraceFile::open(&v.path).map_err(|e| ExperimentError::Trace(e.to_string()))?;
            let mut chunks = std::iter::from_fn(|| match reader.next_chunk() {
                Ok(Some(c)) => Some(Ok((Fingerprint(c.fp), c.size))),
                Ok(None) => None,
                Err(e) => Some(Err(tessera::Error::InvalidConfig(e.to_string()))),
            });
            backup(repo, Input::Trace(&mut chunks), &options)
        } else {
            let mut input = File::open(&v.path).map_err(io_err(&v.path))?;
            let name = v.path.display().to_string();
            backup(
                repo,
                Input::Stream {
                    input: &mut input,
                    name: &name,
                },
                &options,
            )
        }
        .map_err(&engine)?;
        let snap = outcome.snapshot;

        let gc_record = self.retention(config, n)?;
        let (repo, system) = (&self.repo, self.system);

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
                    restore_one(repo, id, system, self.policy, config.disk, &self.gc_written)
                        .map_err(&engine)?,
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

    /// Applies retention after version `n` when it is due: deletes all but
    /// the newest backups and collects garbage (recording which containers
    /// the copy-forward wrote and, with `retention.ownership`, the
    /// ownership of the retained chunks' containers before and after).
    fn retention(
        &mut self,
        config: &ExperimentConfig,
        n: usize,
    ) -> Result<Option<GcRecord>, ExperimentError> {
        let Some(keep) = config.retention.keep_last else {
            return Ok(None);
        };
        if !n.is_multiple_of(config.retention.gc_every) {
            return Ok(None);
        }
        let (repo, system) = (&self.repo, self.system);
        let engine = self.engine(n);
        let t = std::time::Instant::now();
        let forgotten = forget_keep_last(repo, keep, false).map_err(&engine)?;
        if self.lifecycle {
            // Deleting frees the space: no GC pass; its cost is the deletion.
            let stats = tessera::gc::GcStats {
                seconds: t.elapsed().as_secs_f64(),
                ..Default::default()
            };
            return Ok(Some(GcRecord {
                forgotten: forgotten.len(),
                stats,
                ownership_before: None,
                ownership_after: None,
            }));
        }
        let options = system
            .gc_options(config.retention.gc_threshold)
            .map_err(|detail| ExperimentError::Config {
                path: system.name.clone(),
                detail,
            })?;
        let count = config.retention.ownership;
        let ownership_before = count
            .then(|| ownership(repo))
            .transpose()
            .map_err(&engine)?;
        let first = repo.next_container_id().map_err(&engine)?;
        let stats = gc(repo, options).map_err(&engine)?;
        let end = repo.next_container_id().map_err(&engine)?;
        self.gc_written.extend(first..end);
        let ownership_after = count
            .then(|| ownership(repo))
            .transpose()
            .map_err(&engine)?;
        Ok(Some(GcRecord {
            forgotten: forgotten.len(),
            stats,
            ownership_before,
            ownership_after,
        }))
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
            restores.push(
                restore_one(repo, id, system, self.policy, config.disk, &self.gc_written)
                    .map_err(&engine)?,
            );
        }
        let mean = |f: &dyn Fn(&RestoreRecord) -> f64| {
            restores.iter().map(f).sum::<f64>() / restores.len().max(1) as f64
        };
        let gcs = self.records.iter().filter_map(|r| r.gc.as_ref());
        let arranges = self.records.iter().filter_map(|r| r.arrange.as_ref());
        let f = FinalRestores {
            system: system.name.clone(),
            repeat: self.repeat,
            mean_read_amplification: mean(&|r| r.read_amplification()),
            mean_speed_factor: mean(&|r| r.speed_factor()),
            mean_read_amplification_logical: mean(&|r| r.stats.read_amplification),
            mean_speed_factor_logical: mean(&|r| r.stats.speed_factor),
            mean_containers_read: mean(&|r| r.stats.containers_read as f64),
            mean_containers_referenced: mean(&|r| {
                r.stored
                    .as_ref()
                    .map_or(f64::NAN, |s| s.containers_referenced as f64)
            }),
            mean_containers_bound: mean(&|r| {
                r.stored
                    .as_ref()
                    .map_or(f64::NAN, |s| s.containers_bound as f64)
            }),
            mean_modelled_bound_seconds: mean(&|r| {
                r.stored
                    .as_ref()
                    .map_or(f64::NAN, |s| s.modelled_bound_seconds)
            }),
            physical_bytes: self.records.last().map_or(0, |r| r.physical_bytes),
            total_ratio: self.records.last().map_or(0.0, |r| r.total_ratio),
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
            "[{}{}] all {} retained backups restored: mean read amplification {:.3} and speed factor {:.3} per container (stored bytes), {:.3} MiB restored per extent, {:.0} MB/s",
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

/// Restores backup `id` to a sink (every chunk verified), models its time
/// on `disk` and counts it on stored bytes (`gc_written`: the containers
/// GC's copy-forward wrote).
fn restore_one(
    repo: &Repository,
    id: u64,
    system: &SystemSpec,
    policy: CachePolicy,
    disk: DiskModel,
    gc_written: &BTreeSet<ContainerId>,
) -> tessera::Result<RestoreRecord> {
    let options = RestoreOptions {
        cache_containers: system.cache_size,
        policy,
        progress: None,
        skip_damaged: false,
    };
    let stats = restore(repo, id, &mut io::sink(), &options)?;
    let stored = stored_read(repo, id, &stats, gc_written, disk)?;
    Ok(RestoreRecord {
        version: id as usize,
        modelled_seconds: disk.seconds(stats.extents, stats.bytes_read),
        speed_factor_per_extent: per_extent(&stats),
        stats,
        stored,
    })
}

/// Counts the restore of backup `id` (its `stats`) on stored bytes: reads
/// the metadata of every container the backup references for its chunks'
/// stored sizes (after the restore, outside its counters). `None` in the
/// lifecycle layout (no containers).
pub fn stored_read(
    repo: &Repository,
    id: u64,
    stats: &RestoreStats,
    gc_written: &BTreeSet<ContainerId>,
    disk: DiskModel,
) -> tessera::Result<Option<StoredRead>> {
    if repo.config().layout == Layout::Lifecycle {
        return Ok(None);
    }
    let recipe = repo.recipe(id)?;
    let mut sizes: BTreeMap<ContainerId, u64> =
        recipe.chunks.iter().map(|c| (c.container, 0)).collect();
    let mut stored: HashMap<(ContainerId, Fingerprint), u32> = HashMap::new();
    for (&cid, size) in sizes.iter_mut() {
        let (header, metas) = tessera::layout::container::read_meta(repo.backend().as_ref(), cid)?;
        *size = header.total_len() as u64;
        for m in metas {
            stored.entry((cid, m.fp)).or_insert(m.len);
        }
    }
    let stored_len = |c: &tessera::format::snapshot::ChunkRef| {
        u64::from(stored.get(&(c.container, c.fp)).copied().unwrap_or(c.len))
    };
    let bytes: u64 = recipe.chunks.iter().map(stored_len).sum();
    let mut distinct = HashSet::new();
    let bytes_in_gc_containers: u64 = recipe
        .chunks
        .iter()
        .filter(|c| gc_written.contains(&c.container) && distinct.insert((c.container, c.fp)))
        .map(stored_len)
        .sum();
    let from_gc = sizes.keys().filter(|c| gc_written.contains(c)).count() as u64;
    let backup_container_bytes: u64 = sizes
        .iter()
        .filter(|(c, _)| !gc_written.contains(c))
        .map(|(_, s)| s)
        .sum();
    let capacity = u64::from(repo.config().container_size).max(1);
    let containers_bound = sizes.len() as u64 - from_gc + bytes_in_gc_containers.div_ceil(capacity);
    let ratio = |num: f64, den: f64| if den > 0.0 { num / den } else { 0.0 };
    Ok(Some(StoredRead {
        bytes,
        read_amplification: ratio(stats.bytes_read as f64, bytes as f64),
        speed_factor: ratio(bytes as f64 / 1048576.0, stats.containers_read as f64),
        containers_referenced: sizes.len() as u64,
        containers_from_gc: from_gc,
        bytes_in_gc_containers,
        backup_container_bytes,
        containers_bound,
        modelled_bound_seconds: disk.seconds(
            containers_bound,
            backup_container_bytes + bytes_in_gc_containers,
        ),
    }))
}

/// How the retained backups' chunks share containers ([`Ownership`]):
/// one pass over the retained recipes.
pub fn ownership(repo: &Repository) -> tessera::Result<Ownership> {
    // Per (container, fingerprint): a hash of its owners, ascending, and its length.
    let mut chunks: HashMap<(ContainerId, Fingerprint), (u64, u32)> = HashMap::new();
    for id in repo.retained_backups()? {
        let recipe = repo.recipe(id)?;
        let mut seen = HashSet::new();
        for c in &recipe.chunks {
            if seen.insert((c.container, c.fp)) {
                let e = chunks
                    .entry((c.container, c.fp))
                    .or_insert((0xcbf2_9ce4_8422_2325, c.len));
                e.0 = (e.0.rotate_left(17) ^ id).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    // Per container: its first chunk's owners, whether another's differ, its live bytes.
    let mut containers: HashMap<ContainerId, (u64, bool, u64)> = HashMap::new();
    let mut sets = HashSet::new();
    for (&(cid, _), &(owners, len)) in &chunks {
        sets.insert(owners);
        let e = containers.entry(cid).or_insert((owners, false, 0));
        e.1 |= e.0 != owners;
        e.2 += u64::from(len);
    }
    let mut o = Ownership {
        containers: containers.len() as u64,
        owner_sets: sets.len() as u64,
        ..Ownership::default()
    };
    for &(_, mixed, bytes) in containers.values() {
        o.live_bytes += bytes;
        if mixed {
            o.mixed_containers += 1;
            o.mixed_bytes += bytes;
        }
    }
    Ok(o)
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
                x.read_amplification(),
                x.speed_factor(),
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
    let header = "system,version,source,logical_bytes,stored_bytes,backup_seconds,backup_mb_s,modelled_backup_seconds,index_memory_bytes,index_entries,index_disk_lookups,retained_logical_bytes,physical_bytes,actual_dedup_ratio,restore_version,restore_mb_s,read_amplification,speed_factor,containers_read,restore_bytes_read,modelled_restore_seconds,gc_seconds,gc_containers_involved,gc_containers_reclaimed,gc_containers_produced,gc_bytes_read,gc_bytes_written,restore_extents,speed_factor_per_extent,arrange_seconds,arrange_bytes_read,arrange_bytes_written,compression_ratio,total_ratio,compressed_bytes,repeat,read_amplification_stored,speed_factor_stored,containers_referenced,containers_bound,mixed_share_before_gc,mixed_share_after_gc";
    writeln!(csv, "{header}").map_err(io_err(&csv_path))?;
    for r in &results.records {
        let restore = r.restores.last();
        let stored = restore.and_then(|x| x.stored.as_ref());
        let ownership = |f: fn(&GcRecord) -> Option<Ownership>| {
            r.gc.as_ref()
                .and_then(f)
                .map(|o| format!("{:.6}", o.mixed_share()))
        };
        let opt = |v: Option<String>| v.unwrap_or_default();
        writeln!(
            csv,
            "{},{},{},{},{},{:.6},{:.3},{:.6},{},{},{},{},{},{:.6},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.6},{},{},{},{},{},{},{},{}",
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
            opt(restore.map(|x| format!("{:.6}", x.read_amplification()))),
            opt(restore.map(|x| format!("{:.6}", x.speed_factor()))),
            opt(stored.map(|s| s.containers_referenced.to_string())),
            opt(stored.map(|s| s.containers_bound.to_string())),
            opt(ownership(|g| g.ownership_before)),
            opt(ownership(|g| g.ownership_after)),
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
        let generated = format!("name = \"trees\"\ncompression = [\"off\"]\n[dataset.generate]\nversions = 3\nsize = \"300KB\"\ntree = true\n{systems}");
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
            "name = \"dir\"\ncompression = [\"off\"]\n[dataset]\ntrees = {}\n{systems}",
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
            "name = \"position\"\nrepeat = 5\ncompression = [\"off\"]\n[dataset.generate]\nversions = 3\nsize = \"6MB\"\n\
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
    fn the_compression_axis_runs_each_system_plain_and_compressed() {
        let tmp = tempfile::tempdir().unwrap();
        let t = "name = \"axis\"\n[dataset.generate]\nversions = 4\nsize = \"600KB\"\n\
                 [retention]\nkeep_last = 2\n[restore]\nretained_at_end = true\n\
                 [[systems]]\nname = \"exact\"\ncontainer_size = \"128KiB\"\n\
                 [[systems]]\nname = \"pinned\"\ncompression = \"fastest\"\n\
                 container_size = \"128KiB\"\n";
        let config = load(tmp.path(), t).unwrap();
        let names: Vec<&str> = config.systems.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["exact", "exact.auto", "pinned"]);
        assert_eq!(config.compression, Some(vec!["off".into(), "auto".into()]));
        let mut again = config.clone();
        again.expand_compression().unwrap();
        assert_eq!(again.systems.len(), 3, "expanding twice changes nothing");

        let out = tmp.path().join("out");
        let results = run(&config, &out, &mut |_| {}).unwrap();
        let last = |name: &str| results.records.iter().rfind(|r| r.system == name).unwrap();
        // The same chunks, deduplicated alike; compression shrinks what is stored.
        let (plain, zstd) = (last("exact"), last("exact.auto"));
        assert_eq!(plain.retained_logical_bytes, zstd.retained_logical_bytes);
        for v in 1..=4 {
            let stored = |name: &str| {
                let r = results
                    .records
                    .iter()
                    .find(|r| r.system == name && r.version == v);
                r.unwrap().stored_bytes
            };
            assert_eq!(stored("exact"), stored("exact.auto"), "version {v}");
        }
        assert!(zstd.compression_ratio > 1.2, "{zstd:?}");
        assert!(zstd.physical_bytes < plain.physical_bytes);
        for f in &results.final_restores {
            assert_eq!(f.restores.len(), 2);
            for x in &f.restores {
                let s = x.stored.as_ref().unwrap();
                assert_eq!(x.read_amplification(), s.read_amplification);
                assert_eq!(
                    s.read_amplification,
                    x.stats.bytes_read as f64 / s.bytes as f64
                );
                if f.system == "exact" {
                    // Plain, without delta: stored bytes are the bytes restored.
                    assert_eq!(s.bytes, x.stats.bytes_restored);
                    assert_eq!(x.read_amplification(), x.stats.read_amplification);
                    assert_eq!(x.speed_factor(), x.stats.speed_factor);
                } else {
                    assert!(s.bytes < x.stats.bytes_restored, "{f:?}");
                }
                assert!(s.containers_bound <= s.containers_referenced);
                assert!(s.containers_referenced <= x.stats.containers_read);
                assert!(s.containers_from_gc <= s.containers_referenced);
            }
        }
        let html = fs::read_to_string(out.join("report.html")).unwrap();
        let table = html.split("Plain and compressed").nth(1).unwrap();
        let table = table.split("</table>").next().unwrap();
        assert!(table.contains("<tr><th>exact</th><td>auto</td>"), "{table}");
        assert!(!table.contains("pinned"), "a pinned system has no pair");
        let csv = fs::read_to_string(out.join("results.csv")).unwrap();
        assert!(csv
            .lines()
            .next()
            .unwrap()
            .ends_with(",read_amplification_stored,speed_factor_stored,containers_referenced,containers_bound,mixed_share_before_gc,mixed_share_after_gc"));

        // Axes refused.
        for (axis, expected) in [
            ("[]", "give at least one setting"),
            ("[\"off\", \"default\", \"3\"]", "\"3\" is listed twice"),
            ("[\"zip\"]", "unknown compression \"zip\""),
        ] {
            let bad = t.replace("[dataset", &format!("compression = {axis}\n[dataset"));
            let err = load(tmp.path(), &bad).unwrap_err();
            assert!(err.contains(expected), "{axis}: {err}");
        }
        // Traces have no bytes to compress: plain by default, compression refused.
        let trace =
            "name = \"tr\"\n[dataset.generate]\nversions = 1\nsize = \"1MB\"\ntrace = true\n\
                     [[systems]]\nname = \"exact\"\n";
        assert_eq!(load(tmp.path(), trace).unwrap().systems.len(), 1);
        let err = load(tmp.path(), &format!("compression = [\"auto\"]\n{trace}")).unwrap_err();
        assert!(err.contains("a trace dataset has no chunk bytes"), "{err}");
    }

    #[test]
    fn gc_counts_ownership_and_restores_count_containers_by_writer() {
        let tmp = tempfile::tempdir().unwrap();
        let t = "name = \"own\"\ncompression = [\"off\"]\n\
                 [dataset.generate]\nversions = 6\nsize = \"800KB\"\nseed = 5\n\
                 [retention]\nkeep_last = 3\ngc_every = 2\nownership = true\n\
                 [restore]\nevery = 0\nretained_at_end = true\n\
                 [[systems]]\nname = \"naive\"\ncontainer_size = \"128KiB\"\n\
                 [[systems]]\nname = \"gccdf\"\ndefrag = \"gccdf\"\ncontainer_size = \"128KiB\"\n";
        let config = load(tmp.path(), t).unwrap();
        let out = tmp.path().join("out");
        let results = run(&config, &out, &mut |_| {}).unwrap();
        let mut rounds = 0;
        for r in &results.records {
            let Some(g) = &r.gc else { continue };
            let (b, a) = (g.ownership_before.unwrap(), g.ownership_after.unwrap());
            for o in [b, a] {
                assert!(o.mixed_containers <= o.containers && o.mixed_bytes <= o.live_bytes);
                assert!((0.0..=1.0).contains(&o.mixed_share()));
            }
            if g.forgotten > 0 {
                rounds += 1;
                // GC moves the retained chunks, it neither drops nor adds any
                // (exact deduplication: no copy to merge).
                assert_eq!(a.live_bytes, b.live_bytes, "{}: {g:?}", r.system);
                assert!(a.owner_sets == b.owner_sets);
            }
        }
        assert!(rounds >= 4, "{rounds}");
        let repo =
            Repository::open(&out.join("repos/gccdf"), tessera::backend::LockMode::Read).unwrap();
        let f = results
            .final_restores
            .iter()
            .find(|f| f.system == "gccdf")
            .unwrap();
        let mut from_gc = 0;
        for x in &f.restores {
            let s = x.stored.as_ref().unwrap();
            from_gc += s.containers_from_gc;
            // The bound: the containers backups wrote, and the chunks in GC's packed full.
            let recipe = repo.recipe(x.version as u64).unwrap();
            let referenced: BTreeSet<ContainerId> =
                recipe.chunks.iter().map(|c| c.container).collect();
            assert_eq!(s.containers_referenced, referenced.len() as u64);
            let packed = s.bytes_in_gc_containers.div_ceil(128 * 1024);
            assert_eq!(
                s.containers_bound,
                s.containers_referenced - s.containers_from_gc + packed
            );
            assert!(s.modelled_bound_seconds <= x.modelled_seconds + 1e-9);
        }
        assert!(from_gc > 0, "the retained backups read containers GC wrote");
        let html = fs::read_to_string(out.join("report.html")).unwrap();
        assert!(html.contains("Containers per restore and the copy-forward bound"));
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
