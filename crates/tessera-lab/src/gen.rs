//! Deterministic versioned datasets: a synthetic file tree aged version by
//! version, emitted as one ustar archive per version (data mode), as one
//! directory tree per version (tree mode: `vNNNN/`, for tree backups) or as
//! one Destor fingerprint trace per version (trace mode).
//!
//! The model follows the synthetic backup generator of Tarasov et al.,
//! "Generating realistic datasets for deduplication analysis" (USENIX
//! ATC'12), the papers' SYN dataset: files are created, modified, renamed,
//! touched, copied and deleted; sizes are lognormal with a Pareto tail; a
//! few hot files take most modifications, which cluster at file starts, file
//! ends and a few middle regions of each file. Files hold a mix of content
//! types (random, text, structured records, database-like pages), so
//! compression and delta encoding have something to find.
//!
//! Each version is packed like a backup product packs files (PFC-delta paper,
//! §II-C): a 512-byte header with the file's metadata before each file's
//! data. Modified and touched files carry new mtimes, so the chunks holding
//! their headers are similar to, but not the same as, last version's.
//!
//! Nothing that disappears ever comes back: new content always comes from a
//! fresh seed, deleted files and old names are never reused and mtimes only
//! grow, so cross-version duplicates are adjacent (also in the previous
//! version) and skip duplicates stay rare, as in the papers' Fig. 3.
//!
//! Memory holds the current tree only: each file is a piece table over
//! seeded streams (data mode) or chunk-id runs (trace mode), regenerated on
//! output, never its bytes.
//!
//! With several sources, independent lineages (own seeds, trees and content
//! mixes) interleave version by version, as in GCCDF's MIX dataset.
//!
//! ```no_run
//! use tessera_lab::gen::{generate, GenOptions};
//! let opts = GenOptions { versions: 5, ..GenOptions::default() };
//! let summary = generate(std::path::Path::new("/tmp/ds"), &opts)?;
//! assert_eq!(summary.versions.len(), 5);
//! # Ok::<(), tessera_lab::gen::GenError>(())
//! ```

mod content;
mod model;
mod rng;
mod tar;

pub use content::{ChunkModel, ContentKind};
pub use model::{ChunkIter, Lineage, TraceEvent};
pub use tar::{parse_tar, TarEntry};

use model::LineageParams;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// The manifest written next to the versions.
pub const MANIFEST: &str = "MANIFEST.tsv";

/// Options of a generated dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct GenOptions {
    /// Versions per source.
    pub versions: u32,
    /// Target logical bytes of each version (file contents), per source.
    pub size: u64,
    /// Fraction of files modified per version; a tenth as many are deleted
    /// (and replaced by new files) and a twentieth renamed or moved.
    pub change_rate: f64,
    /// Fraction of files whose mtime changes without a content change.
    pub touch_rate: f64,
    /// Growth of the target size per version (0.01 = 1 % per version).
    pub growth: f64,
    /// Seed: same seed and options, same bytes.
    pub seed: u64,
    /// Independent lineages whose versions interleave (1 = single source).
    pub sources: u32,
    /// Emit Destor fingerprint traces (`vNNNN.trace`) instead of archives.
    pub trace: bool,
    /// Write each version as a directory tree (`vNNNN/`) instead of an archive.
    pub tree: bool,
    /// Chunk sizes of trace mode.
    pub chunk: ChunkModel,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            versions: 10,
            size: 20 << 20,
            change_rate: 0.05,
            touch_rate: 0.01,
            growth: 0.0,
            seed: 1,
            sources: 1,
            trace: false,
            tree: false,
            chunk: ChunkModel::default(),
        }
    }
}

/// Errors of dataset generation.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    /// An option is out of range.
    #[error("invalid generator options: {0}")]
    InvalidOptions(String),
    /// A file could not be written.
    #[error("{what}: {source}")]
    Io {
        /// The file or directory.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &Path) -> impl FnOnce(io::Error) -> GenError + '_ {
    move |source| GenError::Io {
        what: what.display().to_string(),
        source,
    }
}

impl GenOptions {
    /// Checks that the options are in range.
    pub fn validate(&self) -> Result<(), GenError> {
        let bad = |m: String| Err(GenError::InvalidOptions(m));
        if self.trace && self.tree {
            return bad("trace and tree modes exclude each other".into());
        }
        if self.versions == 0 {
            return bad("versions must be at least 1".into());
        }
        if self.sources == 0 || self.sources > 1000 {
            return bad(format!("sources must be 1 to 1000 (got {})", self.sources));
        }
        if self.size == 0 || self.size > 1 << 50 {
            return bad(format!("size must be 1 byte to 1 PiB (got {})", self.size));
        }
        for (name, v) in [
            ("change rate", self.change_rate),
            ("touch rate", self.touch_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return bad(format!("{name} must be between 0 and 1 (got {v})"));
            }
        }
        if !(-0.5..=0.5).contains(&self.growth) {
            return bad(format!(
                "growth must be between -0.5 and 0.5 (got {})",
                self.growth
            ));
        }
        let c = self.chunk;
        if !(c.min >= 64 && c.min <= c.avg && c.avg <= c.max && c.max <= 16 << 20) {
            return bad(format!(
                "chunk sizes must satisfy 64 <= min <= avg <= max <= 16 MiB (got {}/{}/{})",
                c.min, c.avg, c.max
            ));
        }
        Ok(())
    }

    fn total_versions(&self) -> u64 {
        u64::from(self.versions) * u64::from(self.sources)
    }
}

/// Where a version of the interleaved stream comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionInfo {
    /// Position in the stream, from 1.
    pub index: u64,
    /// File name: `vNNNN.tar`, `vNNNN.trace`, or the directory `vNNNN` of a tree.
    pub file_name: String,
    /// Name of the source lineage (`syn`, or `syn1`… with several sources).
    pub source: String,
    /// Version number within the source, from 1.
    pub source_version: u32,
    /// Index of the lineage in [`Dataset::lineages`].
    pub lineage: usize,
}

/// The lineages of a dataset, advanced in stream order.
#[derive(Clone, Debug)]
pub struct Dataset {
    opts: GenOptions,
    lineages: Vec<Lineage>,
    next: u64,
}

impl Dataset {
    /// A dataset before its first version.
    pub fn new(opts: &GenOptions) -> Result<Dataset, GenError> {
        opts.validate()?;
        let units = if opts.trace {
            content::Units::Chunks(opts.chunk)
        } else {
            content::Units::Bytes
        };
        let params = LineageParams {
            target: opts.size,
            change_rate: opts.change_rate,
            touch_rate: opts.touch_rate,
            growth: opts.growth,
            units,
        };
        let width = opts.sources.to_string().len();
        let lineages = (0..opts.sources)
            .map(|i| {
                let name = if opts.sources == 1 {
                    "syn".to_string()
                } else {
                    format!("syn{:0width$}", i + 1)
                };
                Lineage::new(&name, rng::hash2(opts.seed, u64::from(i) + 1), params)
            })
            .collect();
        Ok(Dataset {
            opts: opts.clone(),
            lineages,
            next: 0,
        })
    }

    /// Versions in the whole stream (`versions × sources`).
    pub fn total_versions(&self) -> u64 {
        self.opts.total_versions()
    }

    /// The lineages, in source order.
    pub fn lineages(&self) -> &[Lineage] {
        &self.lineages
    }

    /// Advances the lineage whose turn it is (sources take turns) and returns
    /// the new version's place and lineage; `None` after the last version.
    pub fn next_version(&mut self) -> Option<(VersionInfo, &Lineage)> {
        if self.next >= self.total_versions() {
            return None;
        }
        let k = u64::from(self.opts.sources);
        let li = (self.next % k) as usize;
        self.next += 1;
        let width = self.total_versions().to_string().len().max(4);
        let ext = match (self.opts.trace, self.opts.tree) {
            (true, _) => ".trace",
            (false, true) => "",
            (false, false) => ".tar",
        };
        let lineage = self.lineages.get_mut(li)?;
        lineage.advance();
        let info = VersionInfo {
            index: self.next,
            file_name: format!("v{:0width$}{ext}", self.next),
            source: lineage.name().to_string(),
            source_version: lineage.version(),
            lineage: li,
        };
        Some((info, lineage))
    }
}

/// What was written for one version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionSummary {
    /// Its place in the stream.
    pub info: VersionInfo,
    /// The file written.
    pub path: PathBuf,
    /// Bytes of the version's stream: the archive size, or the sum of chunk
    /// sizes of a trace.
    pub bytes: u64,
    /// Bytes of file contents (archive size less headers and padding).
    pub logical_bytes: u64,
    /// Files in the version.
    pub files: usize,
}

/// What [`generate`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenSummary {
    /// Every version, in stream order.
    pub versions: Vec<VersionSummary>,
    /// The manifest.
    pub manifest: PathBuf,
}

/// Writes the dataset into `outdir` (created if needed): `v0001.tar`… (or
/// `.trace`) and `MANIFEST.tsv`.
pub fn generate(outdir: &Path, opts: &GenOptions) -> Result<GenSummary, GenError> {
    generate_with(outdir, opts, |_| {})
}

/// [`generate`], calling `progress` after each version is written.
pub fn generate_with(
    outdir: &Path,
    opts: &GenOptions,
    mut progress: impl FnMut(&VersionSummary),
) -> Result<GenSummary, GenError> {
    let mut ds = Dataset::new(opts)?;
    fs::create_dir_all(outdir).map_err(io_err(outdir))?;
    let manifest = outdir.join(MANIFEST);
    // The versions an earlier run wrote here (its trees may be replaced).
    let earlier: Vec<String> = fs::read_to_string(&manifest)
        .map(|m| {
            m.lines()
                .skip(1)
                .filter_map(|l| l.split('\t').next().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let mut done = Vec::new();
    while let Some((info, lineage)) = ds.next_version() {
        let path = outdir.join(&info.file_name);
        if opts.tree {
            let summary = write_tree_version(outdir, &earlier, info, lineage)?;
            progress(&summary);
            done.push(summary);
            write_manifest(&manifest, &done)?;
            continue;
        }
        let tmp = outdir.join(format!("{}.tmp", info.file_name));
        let file = fs::File::create(&tmp).map_err(io_err(&tmp))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let bytes = lineage
            .write(&mut w)
            .and_then(|n| w.flush().map(|_| n))
            .map_err(io_err(&tmp))?;
        drop(w);
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        let summary = VersionSummary {
            info,
            path,
            bytes,
            logical_bytes: lineage.logical_bytes(),
            files: lineage.file_count(),
        };
        progress(&summary);
        done.push(summary);
        write_manifest(&manifest, &done)?;
    }
    Ok(GenSummary {
        versions: done,
        manifest,
    })
}

/// Writes version `info` of `lineage` as the tree `outdir/vNNNN/`: built
/// in `.vNNNN.tmp/` and renamed into place when complete. A tree of that
/// name is replaced only when an `earlier` run of the generator wrote it.
fn write_tree_version(
    outdir: &Path,
    earlier: &[String],
    info: VersionInfo,
    lineage: &Lineage,
) -> Result<VersionSummary, GenError> {
    let path = outdir.join(&info.file_name);
    let tmp = outdir.join(format!(".{}.tmp", info.file_name));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    let logical = lineage.write_tree(&tmp).map_err(io_err(&tmp))?;
    if path.exists() {
        let ours = earlier.contains(&info.file_name);
        if !ours {
            let _ = fs::remove_dir_all(&tmp);
            return Err(GenError::Io {
                what: path.display().to_string(),
                source: io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists, and no earlier run of the generator listed it in MANIFEST.tsv: not replaced",
                ),
            });
        }
        fs::remove_dir_all(&path).map_err(io_err(&path))?;
    }
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    Ok(VersionSummary {
        info,
        path,
        bytes: logical,
        logical_bytes: logical,
        files: lineage.file_count(),
    })
}

/// Writes `MANIFEST.tsv`: one line per version, in stream order.
fn write_manifest(path: &Path, versions: &[VersionSummary]) -> Result<(), GenError> {
    let mut s = String::from("version_file\tsource\tsource_version\tbytes\tlogical_bytes\tfiles\n");
    for v in versions {
        s.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\n",
            v.info.file_name,
            v.info.source,
            v.info.source_version,
            v.bytes,
            v.logical_bytes,
            v.files
        ));
    }
    let tmp = path.with_extension("tsv.tmp");
    fs::write(&tmp, s).map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))
}

#[cfg(test)]
mod tests;
