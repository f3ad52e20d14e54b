//! Deleting one backup, whatever the layout (`tessera delete`).

use crate::error::Result;
use crate::format::snapshot::BackupId;
use crate::repo::Repository;

/// Deletes backup `id`. In the container layout, space is reclaimed by
/// garbage collection; the lifecycle layout frees it at once.
pub fn delete_backup(repo: &Repository, id: BackupId) -> Result<()> {
    crate::layout::delete_backups(repo, &[id]).map(|_| ())
}

/// What deleting several backups did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Deleted {
    /// The backups deleted.
    pub deleted: Vec<BackupId>,
    /// The bytes freed at once (lifecycle layout); `None` in the container
    /// layout, where garbage collection (`gc`) frees what no kept backup
    /// uses.
    pub bytes_freed: Option<u64>,
}

/// Deletes backups `ids` (each must exist) of `repo`, open exclusively:
/// the lifecycle layout reclaims their space once, after all of them.
pub fn delete_backups(repo: &Repository, ids: &[BackupId]) -> Result<Deleted> {
    for &id in ids {
        repo.snapshot(id)?;
    }
    let freed = crate::layout::delete_backups(repo, ids)?;
    Ok(Deleted {
        deleted: ids.to_vec(),
        bytes_freed: freed.map(|f| f.bytes_freed),
    })
}
