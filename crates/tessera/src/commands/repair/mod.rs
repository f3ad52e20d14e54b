//! `tessera repair` (issue 20, docs/RECOVERY.md): puts back what can be
//! proven, never deletes primary data it cannot prove dead.
//!
//! In order:
//! 1. derived state: the `state` copies and lifecycle lineage state copies
//!    (one intact copy is rewritten to both);
//! 2. snapshots: a backup whose snapshot is missing or damaged but whose
//!    commit mark and recipe are intact gets its snapshot back from the
//!    mark (id, time, label, source, logical bytes, a tree backup's tree
//!    record; statistics are not recorded there and come back as zeros); a damaged commit mark of an
//!    intact snapshot is rewritten;
//! 3. container layout: every container is read and every chunk verified;
//!    each recipe reference to a chunk that is missing or damaged is
//!    re-pointed to an intact copy of the same fingerprint in another
//!    container (stored again by a later backup), the recipe rewritten
//!    atomically as garbage collection rewrites recipes; the index is
//!    rebuilt and forgets every damaged chunk, so that the next backup
//!    stores it again;
//! 4. lifecycle layout: every category and volume part is read and every
//!    chunk verified; a damaged part, or one the lineage state lists but
//!    that is missing, is rewritten in place with its intact chunks and an
//!    intact copy (from elsewhere in the lineage) of every chunk its readers
//!    lost; the lineage's quarantine record keeps only what is still lost
//!    ([`crate::layout::lifecycle::repair_lineage`]);
//! 5. container layout: an index with a damaged or missing object is
//!    rebuilt from the containers;
//! 6. with `forget_damaged`, backups still holding unrecoverable chunks are
//!    deleted (their snapshots; space goes with the next `gc`); otherwise
//!    they are kept and listed.
//!
//! Every action writes a complete new object or replaces one atomically
//! (write-then-rename): an interrupted repair leaves the repository as
//! good as before or better, and running it again finishes the job.

pub(crate) mod report;

pub use report::{RepairAction, RepairOptions, RepairReport, Unrepaired};

use crate::backend::LockMode;
use crate::error::{Error, Result};
use crate::format::snapshot::{self, BackupId, Snapshot};
use crate::progress::{Phase, Progress, Silent, Unit};
use crate::repo::commit::{self, CommitMark};
use crate::repo::Repository;
use std::collections::BTreeSet;

/// Repairs `repo`, which must be open with [`LockMode::Exclusive`].
pub fn repair(repo: &Repository, options: RepairOptions) -> Result<RepairReport> {
    repair_with_progress(repo, options, &Silent)
}

/// Repairs `repo`, reporting progress to `progress`: snapshots (objects),
/// then in the container layout scan (containers) and recipes (backups).
pub fn repair_with_progress(
    repo: &Repository,
    options: RepairOptions,
    progress: &dyn Progress,
) -> Result<RepairReport> {
    repo.require(LockMode::Exclusive, "repairing the repository")?;
    let dry = options.dry_run;
    let backend = repo.backend().as_ref();
    let mut report = RepairReport {
        dry_run: dry,
        ..RepairReport::default()
    };
    if repo.repair_state(dry)? {
        report.act(
            "state_rewritten",
            "state".into(),
            "a copy of the id counters was damaged or missing: both copies rewritten".into(),
            vec![],
        );
    }
    for name in crate::layout::lifecycle::lineage_names(backend)? {
        if crate::layout::lifecycle::repair_lineage_state(backend, &name, dry)? {
            report.act(
                "lineage_state_rewritten",
                crate::layout::lifecycle::state_key(&name),
                "one copy of the lineage state was damaged or missing: both rewritten from the intact one".into(),
                vec![],
            );
        }
    }
    recover_snapshots(repo, dry, &mut report, progress)?;
    crate::layout::repair(repo, dry, &mut report, progress)?;
    if options.forget_damaged {
        for u in &mut report.unrepaired {
            // Only a backup whose snapshot reads (delete needs it); others stay listed.
            if repo.snapshot(u.backup).is_ok() {
                if !dry {
                    crate::commands::delete::delete_backup(repo, u.backup)?;
                }
                u.forgotten = true;
                report.actions.push(RepairAction {
                    kind: "backup_forgotten".into(),
                    object: snapshot::snapshot_key(u.backup),
                    detail: format!(
                        "backup {} still had {} unrecoverable chunk(s): deleted (--forget-damaged)",
                        u.backup, u.lost_chunks
                    ),
                    backups: vec![u.backup],
                });
            }
        }
    }
    Ok(report)
}

/// Recovers missing or damaged snapshots from commit marks and recipes;
/// rewrites damaged commit marks of intact snapshots.
fn recover_snapshots(
    repo: &Repository,
    dry: bool,
    report: &mut RepairReport,
    progress: &dyn Progress,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    let snapshots: BTreeSet<BackupId> = repo.backups()?.into_iter().collect();
    let marks: BTreeSet<BackupId> = repo.commit_marks()?.into_iter().collect();
    let phase = Phase::begin(
        progress,
        "snapshots",
        Unit::Objects,
        Some(snapshots.union(&marks).count() as u64),
    );
    for &id in snapshots.union(&marks) {
        phase.add(1);
        let snap = match repo.snapshot(id) {
            Ok(s) => Some(s),
            Err(Error::NoSuchBackup(_)) => None,
            Err(e) if e.is_damage() || matches!(e, Error::UnsupportedVersion { .. }) => None,
            Err(e) => return Err(e),
        };
        let mark = if marks.contains(&id) {
            match backend.read(&commit::mark_key(id)) {
                Ok(b) => CommitMark::decode(id, &b).ok(),
                Err(Error::NotFound(_)) => None,
                Err(e) if e.is_damage() => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        match (snap, mark) {
            (Some(snap), None) => {
                if !dry {
                    backend.write(&commit::mark_key(id), &CommitMark::of(&snap).encode()?)?;
                }
                let what = if marks.contains(&id) {
                    "damaged"
                } else {
                    "missing"
                };
                report.act(
                    "commit_mark_rewritten",
                    commit::mark_key(id),
                    format!("{what} commit mark of backup {id} rewritten from its snapshot"),
                    vec![id],
                );
            }
            (Some(_), _) => {}
            (None, Some(mark)) => {
                let recipe = match repo.recipe(id) {
                    Ok(r) => r,
                    Err(e) => {
                        report.unrepaired.push(Unrepaired {
                            backup: id,
                            reason: format!("snapshot and recipe lost: {e}"),
                            lost_chunks: 0,
                            lost_bytes: mark.logical_bytes,
                            forgotten: false,
                        });
                        continue;
                    }
                };
                if recipe.logical_bytes() != mark.logical_bytes {
                    report.unrepaired.push(Unrepaired {
                        backup: id,
                        reason: format!(
                            "snapshot lost; its recipe holds {} bytes, its commit mark says {}: not recovered",
                            recipe.logical_bytes(),
                            mark.logical_bytes
                        ),
                        lost_chunks: 0,
                        lost_bytes: mark.logical_bytes,
                        forgotten: false,
                    });
                    continue;
                }
                let snap = Snapshot {
                    id,
                    time: mark.time,
                    label: mark.label.clone(),
                    source: mark.source.clone(),
                    host: String::new(),
                    tags: Vec::new(),
                    logical_bytes: mark.logical_bytes,
                    stats: Default::default(),
                    tree: mark.tree.clone(),
                };
                if !dry {
                    // Atomic replacement of a damaged snapshot, or a new one.
                    backend.write(&snapshot::snapshot_key(id), &snap.encode()?)?;
                }
                report.act(
                    "snapshot_recovered",
                    snapshot::snapshot_key(id),
                    format!(
                        "snapshot of backup {id} ({} bytes, label {:?}, source {:?}) rewritten from its commit mark and recipe (run statistics are not recorded there)",
                        mark.logical_bytes, mark.label, mark.source
                    ),
                    vec![id],
                );
            }
            (None, None) => {
                report.unrepaired.push(Unrepaired {
                    backup: id,
                    reason: "snapshot damaged and no readable commit mark to rebuild it from"
                        .into(),
                    lost_chunks: 0,
                    lost_bytes: 0,
                    forgotten: false,
                });
            }
        }
    }
    phase.end();
    Ok(())
}
