//! Opening the repository a command names, and the backup ids it names.

use anyhow::{bail, Context, Result};
use tessera::backend::{Location, LockMode};
use tessera::format::snapshot::BackupId;
use tessera::Repository;

use crate::secrets::{open_repo, Access};

/// Opens the repository at `path` for `mode`, waiting as `access` says
/// for a conflicting holder of its lock, with its password if encrypted.
pub fn open(location: &Location, mode: LockMode, access: &Access) -> Result<Repository> {
    match open_repo(location, mode, access) {
        Err(e @ tessera::Error::Locked(_)) => {
            let doing = match mode {
                LockMode::Read => "a maintenance command (gc, delete, forget, arrange) is running",
                _ => "a backup or a maintenance command is running",
            };
            bail!("{e}: {doing}; retry later, or pass --wait DURATION to wait longer for it")
        }
        other => Ok(other?),
    }
}

/// Parses a backup id or `latest`.
pub fn backup_id(repo: &Repository, text: &str) -> Result<BackupId> {
    if text == "latest" {
        return match repo.backups()?.last() {
            Some(&id) => Ok(id),
            None => bail!(
                "{}: the repository holds no backup",
                repo.backend().location()
            ),
        };
    }
    text.parse()
        .with_context(|| format!("{text:?} is not a backup id (a number or `latest`)"))
}
