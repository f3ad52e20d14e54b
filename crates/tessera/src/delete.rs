//! Deleting one backup, whatever the layout (`tessera delete`).

use crate::config::Layout;
use crate::error::Result;
use crate::repo::Repository;
use crate::snapshot::BackupId;

/// Deletes backup `id`. In the container layout, space is reclaimed by
/// garbage collection; the lifecycle layout frees it at once.
pub fn delete_backup(repo: &Repository, id: BackupId) -> Result<()> {
    match repo.config().layout {
        Layout::Container => repo.remove_snapshot(id),
        Layout::Lifecycle => crate::lifecycle::delete_backups(repo, &[id]).map(|_| ()),
    }
}
