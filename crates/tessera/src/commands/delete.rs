//! Deleting one backup, whatever the layout (`tessera delete`).

use crate::error::Result;
use crate::format::snapshot::BackupId;
use crate::repo::Repository;

/// Deletes backup `id`. In the container layout, space is reclaimed by
/// garbage collection; the lifecycle layout frees it at once.
pub fn delete_backup(repo: &Repository, id: BackupId) -> Result<()> {
    crate::layout::delete_backups(repo, &[id]).map(|_| ())
}
