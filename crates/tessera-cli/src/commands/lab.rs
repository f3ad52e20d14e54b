//! The lab's commands: `tessera gen`, `analyze`, `trace` and `experiment`
//! (datasets, their analysis, fingerprint traces and experiment runs).

use anyhow::{Context, Result};
use clap::Args;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use tessera::parse_size;
use tessera_lab::analyze::{analyze_paths, Input, VersionRow};
use tessera_lab::experiment::{self, ExperimentConfig};
use tessera_lab::gen::{generate_with, GenOptions};
use tessera_lab::trace::write_data_trace;

use super::init::ChunkingArgs;
use crate::output::{human, print_json, Keys};
use crate::progress::{bytes_bar as progress_bar, summary};

/// The arguments of `tessera gen`.
#[derive(Args)]
pub struct GenArgs {
    /// Output directory (v0001.tar, v0002.tar, ..., MANIFEST.tsv).
    outdir: PathBuf,
    /// Versions per source lineage.
    #[arg(long, default_value_t = 10)]
    versions: u32,
    /// Size of one version (file contents).
    #[arg(long, default_value = "20MiB", value_parser = parse_size)]
    size: u64,
    /// Fraction of files modified per version.
    #[arg(long, default_value_t = 0.05)]
    change_rate: f64,
    /// Fraction of files whose mtime changes without a content change.
    #[arg(long, default_value_t = 0.01)]
    touch_rate: f64,
    /// Size growth per version (-0.5 to 0.5).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    growth: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Independent source lineages whose versions interleave.
    #[arg(long, default_value_t = 1)]
    sources: u32,
    /// Write Destor fingerprint traces of the same model instead of data.
    #[arg(long, conflicts_with = "tree")]
    trace: bool,
    /// Write each version as a directory tree (v0001/, …) instead of a tar
    /// archive, for tree backups.
    #[arg(long)]
    tree: bool,
}

/// The arguments of `tessera analyze`.
#[derive(Args)]
pub struct AnalyzeArgs {
    /// Version files in backup order.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The files are fingerprint traces (Destor text or FSL hashfile), not data.
    #[arg(long)]
    trace: bool,
    #[command(flatten)]
    chunking: ChunkingArgs,
    /// Print the analysis as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera gen`.
pub fn gen(a: GenArgs) -> Result<ExitCode> {
    let opts = GenOptions {
        versions: a.versions,
        size: a.size,
        change_rate: a.change_rate,
        touch_rate: a.touch_rate,
        growth: a.growth,
        seed: a.seed,
        sources: a.sources,
        trace: a.trace,
        tree: a.tree,
        ..GenOptions::default()
    };
    let total = u64::from(a.versions) * u64::from(a.sources);
    let bar = progress_bar(Some(total));
    let summary = generate_with(&a.outdir, &opts, |_| bar.inc(1))?;
    bar.finish_and_clear();
    let bytes: u64 = summary.versions.iter().map(|v| v.bytes).sum();
    summary!(
        "generated {} versions ({}) in {}; manifest {}",
        summary.versions.len(),
        human(bytes),
        a.outdir.display(),
        summary.manifest.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs `tessera analyze`.
pub fn analyze(args: AnalyzeArgs) -> Result<ExitCode> {
    analyze_cmd(args)?;
    Ok(ExitCode::SUCCESS)
}

fn analyze_cmd(a: AnalyzeArgs) -> Result<()> {
    let input = if a.trace {
        Input::Trace
    } else {
        Input::Data {
            chunker: a.chunking.params(),
            fingerprint: a.chunking.fingerprint,
        }
    };
    let json = a.json;
    if !json {
        println!(
            "{:<24} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "version", "bytes", "chunks", "internal", "adjacent", "skip", "unique"
        );
    }
    let mut print_row = |r: &VersionRow| {
        if !json {
            println!(
                "{:<24} {:>12} {:>9} {:>9.4} {:>9.4} {:>9.4} {:>9.4}",
                r.classes.version,
                r.classes.bytes,
                r.classes.chunks,
                r.frac_internal,
                r.frac_adjacent,
                r.frac_skip,
                r.frac_unique
            );
        }
    };
    let analysis = analyze_paths(&a.paths, input, &mut print_row)?;
    if json {
        let analyzed = Analyzed {
            analysis: &analysis,
            chunker: match a.trace {
                true => Chunker::Trace("trace"),
                false => Chunker::Params(a.chunking.params()),
            },
            fingerprint: (!a.trace).then(|| a.chunking.fingerprint.name()),
        };
        print_json(&analyzed, Keys::Sorted, false)?;
    } else {
        println!(
            "all versions: {} bytes, {} chunks ({} distinct); internal {:.4}, adjacent {:.4}, skip {:.4}, unique {:.4}; exact dedup {:.3}x, NDF (skip stored again) {:.3}x",
            analysis.logical_bytes,
            analysis.chunks,
            analysis.distinct_chunks,
            analysis.frac_internal,
            analysis.frac_adjacent,
            analysis.frac_skip,
            analysis.frac_unique,
            analysis.exact_dedup_ratio,
            analysis.ndf_ratio
        );
    }
    Ok(())
}

/// The arguments of `tessera trace`.
#[derive(Args)]
pub struct TraceArgs {
    /// Files or directories (walked in name order).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Output file (default: standard output).
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    chunking: ChunkingArgs,
}

/// Runs `tessera trace`.
pub fn trace(args: TraceArgs) -> Result<ExitCode> {
    let TraceArgs {
        paths,
        output,
        chunking,
    } = args;
    let params = chunking.params();
    match output {
        Some(path) => {
            let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            let w = io::BufWriter::with_capacity(1 << 20, f);
            write_data_trace(&paths, params, chunking.fingerprint, w)?
                .into_inner()
                .map_err(|e| e.into_error())
                .and_then(|f| f.sync_all())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        None => {
            let w = io::BufWriter::with_capacity(1 << 20, io::stdout().lock());
            write_data_trace(&paths, params, chunking.fingerprint, w)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The arguments of `tessera experiment`.
#[derive(Args)]
pub struct ExperimentArgs {
    /// The experiment file (TOML; see experiments/).
    config: PathBuf,
    /// Output directory (default: `results/<experiment name>`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `tessera experiment`.
pub fn experiment(args: ExperimentArgs) -> Result<ExitCode> {
    let ExperimentArgs { config, out } = args;
    let cfg = ExperimentConfig::load(&config)?;
    let out = out.unwrap_or_else(|| PathBuf::from("results").join(&cfg.name));
    let results = experiment::run(&cfg, &out, &mut |line| eprintln!("{line}"))?;
    summary!(
        "experiment {:?}: {} systems x {} versions in {:.1} s; report: {}",
        cfg.name,
        cfg.systems.len(),
        results.versions.len(),
        results.seconds,
        out.join("report.html").display()
    );
    Ok(ExitCode::SUCCESS)
}

/// What `tessera analyze --json` prints: the analysis, the chunker and
/// (chunked data) the fingerprint.
#[derive(serde::Serialize)]
struct Analyzed<'a, A: serde::Serialize> {
    #[serde(flatten)]
    analysis: &'a A,
    chunker: Chunker,
    #[serde(skip_serializing_if = "Option::is_none")]
    fingerprint: Option<&'static str>,
}

/// The chunker of an analysis: its parameters, or `"trace"`.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Chunker {
    Trace(&'static str),
    Params(tessera::chunker::ChunkerParams),
}
