//! The checks both layouts share: the backups' records (snapshots against
//! commit marks and recipes) and the derived objects (`state`, index
//! manifests, policy state), which are reported but affect no backup.

use super::{CheckReport, Problem, ProblemKind};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::format::snapshot::{self, BackupId};
use crate::repo::commit::{self, CommitMark};
use crate::repo::Repository;
use std::collections::BTreeSet;

/// A backup whose data a check verifies: committed, or recoverable (commit
/// mark and recipe without a snapshot).
#[derive(Clone, Debug)]
pub(crate) struct Retained {
    /// The backup.
    pub id: BackupId,
    /// The snapshot's `logical_bytes`, when the snapshot is readable.
    pub logical_bytes: Option<u64>,
    /// The backup's source: from its snapshot, or else its commit mark.
    pub source: Option<String>,
}

/// Checks every snapshot and commit mark: damaged snapshots, committed
/// backups whose snapshot is missing (recoverable when the recipe is
/// intact, lost otherwise) and damaged marks are problems. Returns the
/// backups whose data the layout's check must verify.
pub(crate) fn check_records(repo: &Repository, report: &mut CheckReport) -> Result<Vec<Retained>> {
    let backend = repo.backend().as_ref();
    let snapshots: BTreeSet<BackupId> = repo.backups()?.into_iter().collect();
    let recipes: BTreeSet<BackupId> = repo.recipes()?.into_iter().collect();
    let marks: BTreeSet<BackupId> = repo.commit_marks()?.into_iter().collect();
    let mut retained = Vec::new();
    for &id in &snapshots {
        let (logical_bytes, source) = match repo.snapshot(id) {
            Ok(s) => (Some(s.logical_bytes), Some(s.source)),
            Err(e) => {
                report
                    .problems
                    .push(Problem::damaged(snapshot::snapshot_key(id), &e, vec![id]));
                (None, mark_source(backend, id))
            }
        };
        retained.push(Retained {
            id,
            logical_bytes,
            source,
        });
    }
    for &id in marks.difference(&snapshots) {
        let key = snapshot::snapshot_key(id);
        if recipes.contains(&id) {
            report.problems.push(Problem::new(
                ProblemKind::SnapshotMissing,
                key,
                format!(
                    "backup {id}: snapshot missing (recipe intact: `tessera repair` can recover it)"
                ),
                vec![id],
            ));
            retained.push(Retained {
                id,
                logical_bytes: None,
                source: mark_source(backend, id),
            });
        } else {
            report.problems.push(Problem::new(
                ProblemKind::BackupLost,
                key,
                format!("backup {id}: snapshot and recipe missing: the backup is lost"),
                vec![id],
            ));
        }
    }
    for &id in &marks {
        let key = commit::mark_key(id);
        if let Err(e) = backend.read(&key).and_then(|b| CommitMark::decode(id, &b)) {
            report.problems.push(Problem::new(
                ProblemKind::Damaged,
                key,
                format!("{e} (the redundant record that backup {id} was committed; `tessera repair` rewrites it)"),
                Vec::new(),
            ));
        }
    }
    retained.sort_unstable_by_key(|r| r.id);
    report.backups = retained.len() as u64;
    report.uncommitted_recipes = recipes
        .iter()
        .filter(|id| !snapshots.contains(id) && !marks.contains(id))
        .count() as u64;
    Ok(retained)
}

/// The source backup `id`'s commit mark records, if it is readable.
fn mark_source(backend: &dyn Backend, id: BackupId) -> Option<String> {
    let bytes = backend.read(&commit::mark_key(id)).ok()?;
    CommitMark::decode(id, &bytes).ok().map(|m| m.source)
}

/// A derived object and the envelope it must have.
struct DerivedKind {
    /// The object, or the directory holding such objects.
    key: &'static str,
    /// Whether `key` is a directory of such objects.
    dir: bool,
    kind: &'static [u8; 4],
    /// When it is rebuilt.
    rebuilt: &'static str,
}

/// How a damaged index object is rebuilt.
const INDEX_REBUILT: &str =
    "rebuilt from the containers by `tessera repair` (a backup that meets the damage rebuilds it too)";

const DERIVED: &[DerivedKind] = &[
    DerivedKind {
        key: crate::repo::STATE_KEY,
        dir: false,
        kind: b"STAT",
        rebuilt: "the other copy is used (or, without one, the counters are recomputed from the listings); both are rewritten by the next delete or gc",
    },
    DerivedKind {
        key: crate::repo::STATE_COPY_KEY,
        dir: false,
        kind: b"STAT",
        rebuilt: "the other copy is used; both are rewritten by the next delete or gc",
    },
    DerivedKind {
        key: "index/exact",
        dir: false,
        kind: b"IDXE",
        rebuilt: INDEX_REBUILT,
    },
    DerivedKind {
        key: "index/ddfs/manifest",
        dir: false,
        kind: b"IDXD",
        rebuilt: INDEX_REBUILT,
    },
    DerivedKind {
        key: "index/ehid-hot/manifest",
        dir: false,
        kind: b"IDXD",
        rebuilt: INDEX_REBUILT,
    },
    DerivedKind {
        key: "index/ehid-cold/manifest",
        dir: false,
        kind: b"IDXD",
        rebuilt: INDEX_REBUILT,
    },
    DerivedKind {
        key: "index/lazy/manifest",
        dir: false,
        kind: b"IDXL",
        rebuilt: INDEX_REBUILT,
    },
    DerivedKind {
        key: "rewrite",
        dir: true,
        kind: b"RWHI",
        rebuilt: "treated as empty and rewritten by the source's next backup",
    },
    DerivedKind {
        key: "delta",
        dir: true,
        kind: b"DPFC",
        rebuilt: "treated as empty and rewritten by the source's next backup",
    },
    DerivedKind {
        key: "delta-index/features",
        dir: false,
        kind: b"DSFI",
        rebuilt: "treated as empty and rewritten by the next backup",
    },
];

/// Checks the envelope (checksum, kind, version) of every derived object
/// that exists; a damaged one is a [`ProblemKind::Derived`] problem.
pub(crate) fn check_derived(repo: &Repository, report: &mut CheckReport) -> Result<()> {
    let backend = repo.backend().as_ref();
    // `state` is written in two copies, `state` first: `state-copy` alone
    // means `state` was lost (a lone `state` is what a crash between the
    // two writes leaves).
    let (primary, copy) = (crate::repo::STATE_KEY, crate::repo::STATE_COPY_KEY);
    if backend.size(primary).is_err() && backend.size(copy).is_ok() {
        report.problems.push(derived_problem(
            primary,
            &Error::NotFound(primary.to_string()),
            "the other copy is used; both are rewritten by the next delete or gc (or `tessera repair`)",
        ));
    }
    // Quarantine records: a damaged one quarantines its whole container.
    for name in backend.list(crate::repo::quarantine::QUARANTINE_DIR)? {
        let key = format!("{}/{name}", crate::repo::quarantine::QUARANTINE_DIR);
        if let Err(e) = backend.read(&key).and_then(|b| {
            crate::format::envelope::open_versions(&key, b"QRNT", &[1, 2], &b).map(|_| ())
        }) {
            report.problems.push(derived_problem(
                &key,
                &e,
                "the whole container (or lifecycle lineage) is treated as quarantined: its chunks are stored again by the next backup of their data; `tessera repair` or the next check rewrites it",
            ));
        }
    }
    report.problems.extend(index_problems(repo)?);
    for d in DERIVED.iter().filter(|d| !is_index(d.key)) {
        report.problems.extend(derived_damage(backend, d)?);
    }
    Ok(())
}

/// Whether `key` is an index object.
fn is_index(key: &str) -> bool {
    key.starts_with("index/")
}

/// The problems of the on-disk indexes (derived data, rebuilt from the
/// containers): damaged manifests, and the damaged or missing table parts,
/// Bloom filters and metadata log segments the manifests list.
/// `tessera repair` rebuilds the index when there is any.
pub(crate) fn index_problems(repo: &Repository) -> Result<Vec<Problem>> {
    let backend = repo.backend().as_ref();
    let mut out = Vec::new();
    if let Some(key) = crate::layout::expected_index(repo)? {
        if let Err(e @ Error::NotFound(_)) = backend.size(key) {
            out.push(derived_problem(key, &e, INDEX_REBUILT));
        }
    }
    for d in DERIVED.iter().filter(|d| is_index(d.key)) {
        out.extend(derived_damage(backend, d)?);
    }
    for e in crate::index::verify(backend)? {
        let key = e.object().unwrap_or("index").to_string();
        out.push(derived_problem(&key, &e, INDEX_REBUILT));
    }
    Ok(out)
}

/// The damaged objects of derived kind `d`.
fn derived_damage(backend: &dyn Backend, d: &DerivedKind) -> Result<Vec<Problem>> {
    let keys = if d.dir {
        backend
            .list(d.key)?
            .into_iter()
            .map(|n| format!("{}/{n}", d.key))
            .collect()
    } else {
        vec![d.key.to_string()]
    };
    Ok(keys
        .into_iter()
        .filter_map(|key| {
            envelope_damage(backend, &key, d.kind).map(|e| derived_problem(&key, &e, d.rebuilt))
        })
        .collect())
}

/// A problem with derived data: no backup affected.
pub(crate) fn derived_problem(key: &str, e: &Error, rebuilt: &str) -> Problem {
    Problem::new(
        ProblemKind::Derived,
        key,
        format!("{e} (derived data: {rebuilt})"),
        Vec::new(),
    )
}

/// The versions of derived objects of `kind` this code reads (the DDFS
/// manifests are at version 2 since their tables became runs, FORMAT.md §10.2).
fn versions(kind: &[u8; 4]) -> &'static [u32] {
    match kind {
        b"IDXD" => &[1, 2],
        _ => &[1],
    }
}

/// What is wrong with the envelope of object `key` (expected `kind`), if
/// it exists.
fn envelope_damage(backend: &dyn Backend, key: &str, kind: &[u8; 4]) -> Option<Error> {
    match backend.read(key) {
        Ok(bytes) => {
            crate::format::envelope::open_versions(key, kind, versions(kind), &bytes).err()
        }
        Err(Error::NotFound(_)) => None,
        Err(e) => Some(e),
    }
}
