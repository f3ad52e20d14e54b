//! Dataset analysis: the four chunk classes of the MFDedup paper (§3.3) per
//! version, the exact deduplication ratio, and the ratio obtained when skip
//! duplicates are stored again (MFDedup's NDF index).
//!
//! A chunk of version B_i is an *internal* duplicate if it occurred earlier
//! in B_i, else *adjacent* if it occurred in B_{i-1}, else *skip* if it
//! occurred in any older version, else *unique*.

use crate::chunks::for_each_chunk;
use crate::trace::{TraceError, TraceFile};
use serde::Serialize;
use std::path::{Path, PathBuf};
use tessera::chunker::ChunkerParams;
use tessera::{Fingerprint, FingerprintAlgo, FingerprintMap};

/// What the analysed files are.
#[derive(Clone, Copy, Debug)]
pub enum Input {
    /// Backup images, chunked and fingerprinted here.
    Data {
        /// Chunking.
        chunker: ChunkerParams,
        /// Fingerprint hash.
        fingerprint: FingerprintAlgo,
    },
    /// Fingerprint traces (Destor text or FSL hashfiles, detected per file).
    Trace,
}

/// Errors of an analysis.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    /// A version file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A trace is malformed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The chunking parameters are invalid.
    #[error(transparent)]
    Engine(#[from] tessera::Error),
}

/// Classifies the versions in `paths` (in order); `progress` is called after each version.
pub fn analyze_paths(
    paths: &[PathBuf],
    input: Input,
    progress: &mut dyn FnMut(&VersionRow),
) -> Result<Analysis, AnalyzeError> {
    let mut c = Classifier::new();
    for path in paths {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        c.start_version(&name);
        match input {
            Input::Data {
                chunker,
                fingerprint,
            } => classify_data(&mut c, path, chunker, fingerprint)?,
            Input::Trace => classify_trace(&mut c, path)?,
        }
        if let Some(row) = c.current_row() {
            progress(&row);
        }
    }
    Ok(c.finish())
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> AnalyzeError + '_ {
    move |e| AnalyzeError::Io {
        path: path.display().to_string(),
        source: e,
    }
}

fn classify_data(
    c: &mut Classifier,
    path: &Path,
    params: ChunkerParams,
    algo: FingerprintAlgo,
) -> Result<(), AnalyzeError> {
    let chunker = params.build()?;
    for_each_chunk(path, chunker.as_ref(), algo, &mut |fp, len| {
        c.chunk(fp, len);
        Ok(())
    })
    .map_err(io_err(path))
}

fn classify_trace(c: &mut Classifier, path: &Path) -> Result<(), AnalyzeError> {
    let mut r = TraceFile::open(path)?;
    while let Some(chunk) = r.next_chunk()? {
        c.chunk(Fingerprint(chunk.fp), chunk.size);
    }
    Ok(())
}

/// Bytes and chunks of one version by class.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VersionClasses {
    /// The version's name (file name).
    pub version: String,
    /// Logical bytes.
    pub bytes: u64,
    /// Chunks.
    pub chunks: u64,
    /// Bytes of internal duplicates.
    pub internal: u64,
    /// Bytes of adjacent duplicates.
    pub adjacent: u64,
    /// Bytes of skip duplicates.
    pub skip: u64,
    /// Bytes of unique chunks.
    pub unique: u64,
}

impl VersionClasses {
    fn frac(&self, part: u64) -> f64 {
        if self.bytes == 0 {
            0.0
        } else {
            part as f64 / self.bytes as f64
        }
    }
}

/// Totals over all versions.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Analysis {
    /// Per version, in order.
    pub versions: Vec<VersionRow>,
    /// Logical bytes of all versions.
    pub logical_bytes: u64,
    /// Chunks of all versions.
    pub chunks: u64,
    /// Distinct chunks.
    pub distinct_chunks: u64,
    /// Bytes of distinct chunks (what exact deduplication stores).
    pub distinct_bytes: u64,
    /// logical / distinct bytes.
    pub exact_dedup_ratio: f64,
    /// Bytes stored when skip duplicates are stored again (unique + skip).
    pub ndf_stored_bytes: u64,
    /// logical / NDF-stored bytes.
    pub ndf_ratio: f64,
    /// Byte fractions over all versions.
    pub frac_internal: f64,
    /// Adjacent duplicates' byte fraction.
    pub frac_adjacent: f64,
    /// Skip duplicates' byte fraction.
    pub frac_skip: f64,
    /// Unique chunks' byte fraction.
    pub frac_unique: f64,
}

/// One version's classes with byte fractions, as reported.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VersionRow {
    /// Counts.
    #[serde(flatten)]
    pub classes: VersionClasses,
    /// Internal duplicates' byte fraction.
    pub frac_internal: f64,
    /// Adjacent duplicates' byte fraction.
    pub frac_adjacent: f64,
    /// Skip duplicates' byte fraction.
    pub frac_skip: f64,
    /// Unique chunks' byte fraction.
    pub frac_unique: f64,
}

impl From<VersionClasses> for VersionRow {
    fn from(v: VersionClasses) -> Self {
        VersionRow {
            frac_internal: v.frac(v.internal),
            frac_adjacent: v.frac(v.adjacent),
            frac_skip: v.frac(v.skip),
            frac_unique: v.frac(v.unique),
            classes: v,
        }
    }
}

/// Classifies the chunks of a sequence of versions, fed one chunk at a time.
#[derive(Default)]
pub struct Classifier {
    /// Fingerprint → 1-based number of the last version it occurred in.
    last_seen: FingerprintMap<u32>,
    current: Option<VersionClasses>,
    number: u32,
    done: Vec<VersionClasses>,
    distinct_bytes: u64,
}

impl Classifier {
    /// A classifier with no version seen.
    pub fn new() -> Self {
        Classifier::default()
    }

    /// Starts the next version.
    pub fn start_version(&mut self, name: &str) {
        self.end_version();
        self.number += 1;
        self.current = Some(VersionClasses {
            version: name.to_string(),
            ..VersionClasses::default()
        });
    }

    /// The current version's classes so far.
    pub fn current_row(&self) -> Option<VersionRow> {
        self.current.clone().map(VersionRow::from)
    }

    fn end_version(&mut self) {
        if let Some(v) = self.current.take() {
            self.done.push(v);
        }
    }

    /// Adds a chunk to the current version (starting an unnamed one if none).
    pub fn chunk(&mut self, fp: Fingerprint, size: u32) {
        if self.current.is_none() {
            self.start_version("");
        }
        let n = self.number;
        let size64 = u64::from(size);
        let previous = self.last_seen.insert(fp, n);
        let Some(v) = self.current.as_mut() else {
            return;
        };
        v.bytes += size64;
        v.chunks += 1;
        match previous {
            Some(last) if last == n => v.internal += size64,
            Some(last) if last + 1 == n => v.adjacent += size64,
            Some(_) => v.skip += size64,
            None => {
                v.unique += size64;
                self.distinct_bytes += size64;
            }
        }
    }

    /// Ends the last version and computes the totals.
    pub fn finish(mut self) -> Analysis {
        self.end_version();
        let mut a = Analysis {
            distinct_chunks: self.last_seen.len() as u64,
            distinct_bytes: self.distinct_bytes,
            ..Analysis::default()
        };
        let (mut internal, mut adjacent, mut skip, mut unique) = (0, 0, 0, 0);
        for v in self.done {
            a.logical_bytes += v.bytes;
            a.chunks += v.chunks;
            internal += v.internal;
            adjacent += v.adjacent;
            skip += v.skip;
            unique += v.unique;
            a.versions.push(VersionRow::from(v));
        }
        let total = VersionClasses {
            bytes: a.logical_bytes,
            ..VersionClasses::default()
        };
        a.frac_internal = total.frac(internal);
        a.frac_adjacent = total.frac(adjacent);
        a.frac_skip = total.frac(skip);
        a.frac_unique = total.frac(unique);
        a.ndf_stored_bytes = unique + skip;
        a.exact_dedup_ratio = ratio(a.logical_bytes, a.distinct_bytes);
        a.ndf_ratio = ratio(a.logical_bytes, a.ndf_stored_bytes);
        a
    }
}

fn ratio(logical: u64, stored: u64) -> f64 {
    if stored == 0 {
        1.0
    } else {
        logical as f64 / stored as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint([n; 32])
    }

    #[test]
    fn classes_follow_the_definitions() {
        let mut c = Classifier::new();
        c.start_version("v1");
        for (n, s) in [(1, 10), (2, 20), (1, 10)] {
            c.chunk(fp(n), s);
        }
        c.start_version("v2");
        for (n, s) in [(2, 20), (3, 30), (3, 30)] {
            c.chunk(fp(n), s);
        }
        c.start_version("v3");
        for (n, s) in [(1, 10), (3, 30), (4, 40)] {
            c.chunk(fp(n), s);
        }
        let a = c.finish();
        let v: Vec<_> = a
            .versions
            .iter()
            .map(|r| {
                (
                    r.classes.internal,
                    r.classes.adjacent,
                    r.classes.skip,
                    r.classes.unique,
                )
            })
            .collect();
        assert_eq!(v, vec![(10, 0, 0, 30), (30, 20, 0, 30), (0, 30, 10, 40)]);
        assert_eq!(a.distinct_bytes, 100);
        assert_eq!(a.logical_bytes, 40 + 80 + 80);
        assert_eq!(a.ndf_stored_bytes, 110);
        assert!((a.exact_dedup_ratio - 2.0).abs() < 1e-12);
    }

    proptest! {
        /// Against a straightforward reference: sets of earlier chunks per version.
        #[test]
        fn matches_a_reference_computation(
            versions in prop::collection::vec(prop::collection::vec(0u8..12, 0..30), 1..8)
        ) {
            let mut c = Classifier::new();
            for (i, v) in versions.iter().enumerate() {
                c.start_version(&format!("v{i}"));
                for &n in v {
                    // A chunk's size is a function of its content, as in real data.
                    c.chunk(fp(n), u32::from(n) + 1);
                }
            }
            let a = c.finish();
            let mut seen_before: std::collections::HashSet<u8> = Default::default();
            let mut prev: std::collections::HashSet<u8> = Default::default();
            for (i, v) in versions.iter().enumerate() {
                let mut here: std::collections::HashSet<u8> = Default::default();
                let (mut int, mut adj, mut skp, mut uni) = (0u64, 0u64, 0u64, 0u64);
                for &n in v {
                    let s = u64::from(n) + 1;
                    if here.contains(&n) { int += s }
                    else if prev.contains(&n) { adj += s }
                    else if seen_before.contains(&n) { skp += s }
                    else { uni += s }
                    here.insert(n);
                }
                let r = &a.versions[i].classes;
                prop_assert_eq!((r.internal, r.adjacent, r.skip, r.unique), (int, adj, skp, uni));
                seen_before.extend(here.iter().copied());
                prev = here;
            }
        }
    }
}
