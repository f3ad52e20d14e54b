//! `tessera key`: managing the key files of an open encrypted repository
//! (list, add, remove, change the password).

use crate::backend::LockMode;
use crate::crypto::{keyfile, KeyInfo, NewKey, Unlocked};
use crate::error::{Error, Result};
use crate::repo::Repository;

/// The unlocked master key of `repo`, or an error if it is not encrypted.
fn unlocked(repo: &Repository) -> Result<&Unlocked> {
    repo.unlocked().ok_or_else(|| {
        Error::InvalidConfig(format!(
            "{}: the repository is not encrypted: it has no keys",
            repo.backend().location()
        ))
    })
}

/// The key files of `repo`.
pub fn list_keys(repo: &Repository) -> Result<Vec<KeyInfo>> {
    unlocked(repo)?;
    keyfile::list(repo.backend().as_ref())
}

/// The id of the key file `repo` was opened with.
pub fn current_key(repo: &Repository) -> Option<&str> {
    repo.unlocked().map(Unlocked::key_id)
}

/// Adds a key file for `key` to `repo` (opened for a backup or more, so
/// that key changes do not race); returns its id.
pub fn add_key(repo: &Repository, key: &NewKey) -> Result<String> {
    repo.require(LockMode::Backup, "adding a key")?;
    let u = unlocked(repo)?;
    let kdf = key.checked_kdf()?;
    keyfile::add(
        repo.backend().as_ref(),
        u.master(),
        key.password.as_bytes(),
        kdf,
    )
}

/// Removes key file `id` of `repo`; the last key is never removed.
pub fn remove_key(repo: &Repository, id: &str) -> Result<()> {
    repo.require(LockMode::Backup, "removing a key")?;
    unlocked(repo)?;
    keyfile::remove(repo.backend().as_ref(), id)
}

/// Replaces the key file `repo` was opened with by one for `key`: the new
/// file is written before the old one is removed. Returns the new id.
pub fn change_password(repo: &Repository, key: &NewKey) -> Result<String> {
    let old = unlocked(repo)?.key_id().to_string();
    let new = add_key(repo, key)?;
    repo.backend()
        .delete(&format!("{}/{old}", keyfile::KEYS_DIR))?;
    Ok(new)
}

/// Keeps the key that opened `repo` for `lifetime` in the user's session
/// directory (`tessera login`, crypto::session), so that later commands
/// open it without deriving the key from the password.
pub fn login(
    repo: &Repository,
    lifetime: std::time::Duration,
) -> Result<crate::crypto::session::Session> {
    crate::crypto::session::login(unlocked(repo)?, lifetime)
}

/// Ends the sessions of every key file of `repo` (`tessera logout`);
/// returns how many there were.
pub fn logout(repo: &Repository) -> Result<usize> {
    unlocked(repo)?;
    crate::crypto::session::logout(repo.backend().as_ref())
}
