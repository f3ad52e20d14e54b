//! What a check is asked and what it reports.

use crate::error::Error;
use crate::format::snapshot::BackupId;
use crate::util::spill::DEFAULT_SORT_BUDGET;
use serde::{Deserialize, Serialize};

/// Options of a check (with the `cli` feature, the arguments of `tessera
/// check`: their help is the command line's).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct CheckOptions {
    /// Read every container whole and re-hash every chunk.
    #[cfg_attr(
        feature = "cli",
        arg(long, help = "Also read all data and re-hash every chunk")
    )]
    pub read_data: bool,
    /// Memory (bytes) of each of the check's structures that grow with the
    /// repository — the stored chunks, the references of the backups, the
    /// bases of deltas — beyond which they are sorted to temporary files
    /// and compared as sorted streams.
    #[cfg_attr(feature = "cli", arg(
        long = "sort-memory",
        value_name = "SIZE",
        default_value = "32MiB",
        value_parser = crate::parse_size,
        help = "Memory for each of check's structures that grow with the repository (stored chunks, references); past it they spill to temporary files"
    ))]
    pub sort_budget: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            read_data: false,
            sort_budget: DEFAULT_SORT_BUDGET,
        }
    }
}

/// The kind of a problem, so that a repair can tell what to do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// An object holding backup data (snapshot, recipe, container,
    /// category, volume) is damaged, of an unknown version, or does not
    /// hold what a recipe needs; its affected backups cannot be restored.
    Damaged,
    /// An object holding backup data is missing.
    Missing,
    /// A committed backup (it has a commit mark) lost its snapshot while
    /// its recipe is intact: `tessera repair` can recover it.
    SnapshotMissing,
    /// A committed backup (it has a commit mark) lost both its snapshot
    /// and its recipe: it cannot be recovered.
    BackupLost,
    /// Derived data (an index, `state`, a lineage state copy, an NDF
    /// table, policy state) is damaged or missing: no backup is affected,
    /// it is rebuilt automatically.
    Derived,
}

/// One problem found, with the backups it affects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// What kind of problem this is.
    pub kind: ProblemKind,
    /// The damaged or missing object (e.g. `containers/000000000000002a`).
    pub object: String,
    /// What is wrong.
    pub detail: String,
    /// Backups that cannot be restored because of it.
    pub affected_backups: Vec<BackupId>,
}

impl Problem {
    /// A problem of `kind` with `object`.
    pub fn new(
        kind: ProblemKind,
        object: impl Into<String>,
        detail: impl Into<String>,
        affected_backups: Vec<BackupId>,
    ) -> Problem {
        Problem {
            kind,
            object: object.into(),
            detail: detail.into(),
            affected_backups,
        }
    }

    /// A damaged object holding backup data.
    pub fn damaged(object: impl Into<String>, e: &Error, affected: Vec<BackupId>) -> Problem {
        let kind = match e {
            Error::NotFound(_) => ProblemKind::Missing,
            _ => ProblemKind::Damaged,
        };
        Problem::new(kind, object, e.to_string(), affected)
    }
}

/// What a check found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckReport {
    /// Containers examined.
    pub containers: u64,
    /// Chunks found in container metadata.
    pub stored_chunks: u64,
    /// Chunks re-hashed (with `read_data`).
    pub chunks_verified: u64,
    /// Committed backups examined.
    pub backups: u64,
    /// Chunk references of all recipes checked.
    pub references: u64,
    /// Containers no committed backup references (left by interrupted backups; GC reclaims them).
    pub unreferenced_containers: u64,
    /// Recipes without a snapshot (left by interrupted backups).
    pub uncommitted_recipes: u64,
    /// Copies of chunks stored in more than one container beyond the
    /// first (two backups storing one new chunk at once, FORMAT.md
    /// §13.3, or a rewriting policy's copies): not damage.
    pub duplicate_chunks: u64,
    /// The stored bytes of those copies.
    pub duplicate_bytes: u64,
    /// Problems found; the repository is healthy when empty.
    pub problems: Vec<Problem>,
    /// What is not damage but deserves attention (key files other users
    /// can read); the check passes with warnings.
    pub warnings: Vec<String>,
}

impl CheckReport {
    /// Whether no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}
