//! What `tessera repair` is asked and what it reports: shared by the
//! command and by each layout's repair steps (a leaf module).

use crate::format::snapshot::BackupId;
use serde::Serialize;

/// Options of a repair.
#[derive(Clone, Copy, Debug, Default)]
pub struct RepairOptions {
    /// Report what would be done, change nothing.
    pub dry_run: bool,
    /// Delete backups that still have unrecoverable chunks after repair.
    pub forget_damaged: bool,
}

/// One thing repair did (or, in a dry run, would do).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RepairAction {
    /// `state_rewritten`, `lineage_state_rewritten`, `snapshot_recovered`,
    /// `commit_mark_rewritten`, `recipe_repointed`, `chunks_quarantined`,
    /// `index_rebuilt`, `part_rewritten`, `backup_forgotten`.
    pub kind: String,
    /// The object written (or deleted).
    pub object: String,
    /// What was done.
    pub detail: String,
    /// The backups it concerns.
    pub backups: Vec<BackupId>,
}

/// A backup that still cannot be restored completely.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unrepaired {
    /// The backup.
    pub backup: BackupId,
    /// Why.
    pub reason: String,
    /// Chunks without an intact copy (container layout; 0 when unknown).
    pub lost_chunks: u64,
    /// Their bytes.
    pub lost_bytes: u64,
    /// Whether `forget_damaged` deleted it.
    pub forgotten: bool,
}

/// What a repair did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RepairReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// Actions, in the order taken.
    pub actions: Vec<RepairAction>,
    /// Backups that still have holes (restore them with `--skip-damaged`).
    pub unrepaired: Vec<Unrepaired>,
    /// Damaged containers no backup uses any damage of (after the
    /// re-pointing): `check` still reports them until `gc` deletes them,
    /// or copies their intact chunks forward without the damage.
    pub unused_damage: Vec<String>,
}

impl RepairReport {
    pub(crate) fn act(
        &mut self,
        kind: &str,
        object: String,
        detail: String,
        backups: Vec<BackupId>,
    ) {
        self.actions.push(RepairAction {
            kind: kind.into(),
            object,
            detail,
            backups,
        });
    }
}
