//! Sessions (`tessera login`/`logout`, docs/SECURITY.md "Sessions"): the
//! key a password derives for one key file, kept for a while in the
//! user's runtime directory so that commands open an encrypted repository
//! without deriving it again (Argon2id: ~0.1 s and 32 MiB each time).
//!
//! An entry is the file `<dir>/<key id>-<salt as hex>` (0600, in a 0700
//! directory owned by the user; `<dir>` is `$TESSERA_SESSION_DIR` or else
//! `$XDG_RUNTIME_DIR/tessera`, a memory-backed per-user directory on
//! systemd machines): `TSES`, version 1 (u32 LE), the expiry in Unix
//! seconds (u64 LE), the 32-byte derived key. It is never written into
//! the repository. Opening tries the entries of the repository's key files
//! that have not expired; the key file's authenticated wrapping decides
//! whether one opens it (so a changed password or a removed key file ends
//! its sessions), else the password is asked for as without sessions.

use super::keyfile::{self, Wrapping};
use super::{MasterKey, Unlocked};
use crate::backend::Backend;
use crate::error::{Error, Result};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zeroize::Zeroizing;

const MAGIC: &[u8; 4] = b"TSES";
const VERSION: u32 = 1;
const ENTRY_LEN: usize = 4 + 4 + 8 + 32;

/// The directory of the session entries: `$TESSERA_SESSION_DIR`, else
/// `$XDG_RUNTIME_DIR/tessera`; `None` when neither is set.
pub fn dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TESSERA_SESSION_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("tessera"))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether `meta` is owned by this user and not accessible to others.
fn private(meta: &fs::Metadata) -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: geteuid has no preconditions and cannot fail.
    let owner = meta.uid() == unsafe { libc::geteuid() };
    #[cfg(not(target_os = "linux"))]
    let owner = true;
    owner && meta.mode() & 0o077 == 0
}

fn entry_name(key_id: &str, salt: &[u8]) -> String {
    format!("{key_id}-{}", hex::encode(salt))
}

/// The derived key and expiry of the entry at `path`, if it is a private,
/// well-formed file of this user.
fn read_entry(path: &Path) -> Option<(u64, Zeroizing<[u8; 32]>)> {
    let meta = fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || !private(&meta) || meta.len() != ENTRY_LEN as u64 {
        return None;
    }
    let bytes = Zeroizing::new(fs::read(path).ok()?);
    if bytes.len() != ENTRY_LEN || &bytes[..4] != MAGIC || bytes[4..8] != VERSION.to_le_bytes() {
        return None;
    }
    let expires = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
    let mut key = Zeroizing::new([0u8; 32]);
    key.copy_from_slice(&bytes[16..]);
    Some((expires, key))
}

/// The master key of the repository on `backend` from a session entry
/// that has not expired, if one opens one of its key files. Expired
/// entries of its key files are removed. Never an error: without a usable
/// session the caller asks for the password.
pub(crate) fn unlock(backend: &dyn Backend) -> Option<Unlocked> {
    let dir = dir()?;
    let meta = fs::symlink_metadata(&dir).ok()?;
    if !meta.is_dir() || !private(&meta) {
        return None;
    }
    let ids = keyfile::ids(backend).ok()?;
    let names: Vec<String> = fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    for id in ids {
        let prefix = format!("{id}-");
        for name in names.iter().filter(|n| n.starts_with(&prefix)) {
            let path = dir.join(name);
            let Some((expires, key)) = read_entry(&path) else {
                continue;
            };
            if expires <= now() {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Ok(salt) = hex::decode(&name[prefix.len()..]) else {
                continue;
            };
            if let Ok(Some(master)) = keyfile::open_with(backend, &id, &salt, &key) {
                return Some(unlocked(master, id, salt, key));
            }
        }
    }
    None
}

fn unlocked(
    master: MasterKey,
    key_id: String,
    salt: Vec<u8>,
    key: Zeroizing<[u8; 32]>,
) -> Unlocked {
    Unlocked {
        master,
        key_id,
        wrapping: Some(Wrapping { salt, key }),
    }
}

/// A session written by [`login`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Session {
    /// The entry's file.
    pub path: PathBuf,
    /// The key file it opens.
    pub key: String,
    /// When it expires (Unix seconds).
    pub expires: u64,
}

/// Keeps the key that opened `unlocked`'s key file for `lifetime` in the
/// session directory (created 0700 if absent), replacing an entry of the
/// same key file.
pub(crate) fn login(unlocked: &Unlocked, lifetime: Duration) -> Result<Session> {
    let dir = dir().ok_or_else(|| {
        Error::InvalidConfig(
            "no session directory: $XDG_RUNTIME_DIR (or $TESSERA_SESSION_DIR) is not set; \
             sessions are kept only in the user's runtime directory"
                .into(),
        )
    })?;
    let Some(wrapping) = &unlocked.wrapping else {
        return Err(Error::InvalidConfig(
            "the repository was not opened with a password".into(),
        ));
    };
    let io = |what: &str, e: std::io::Error| Error::io(format!("{what} {}", dir.display()), e);
    if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&dir) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(io("creating", e));
        }
    }
    let meta = fs::symlink_metadata(&dir).map_err(|e| io("reading", e))?;
    if !meta.is_dir() || !private(&meta) {
        return Err(Error::InvalidConfig(format!(
            "{}: the session directory must be a directory of this user that no one else can \
             read (mode 0700)",
            dir.display()
        )));
    }
    let expires = now().saturating_add(lifetime.as_secs());
    let mut bytes = Zeroizing::new(Vec::with_capacity(ENTRY_LEN));
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&expires.to_le_bytes());
    bytes.extend_from_slice(wrapping.key.as_ref());
    let path = dir.join(entry_name(&unlocked.key_id, &wrapping.salt));
    let mut tmp = tempfile::Builder::new()
        .prefix(".session")
        .permissions(fs::Permissions::from_mode(0o600))
        .tempfile_in(&dir)
        .map_err(|e| io("writing in", e))?;
    tmp.write_all(&bytes).map_err(|e| io("writing in", e))?;
    tmp.persist(&path).map_err(|e| io("writing in", e.error))?;
    Ok(Session {
        path,
        key: unlocked.key_id.clone(),
        expires,
    })
}

/// Removes the session entries of every key file of the repository on
/// `backend` (expired or not); returns how many there were.
pub fn logout(backend: &dyn Backend) -> Result<usize> {
    let Some(dir) = dir() else {
        return Ok(0);
    };
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(0);
    };
    let ids = keyfile::ids(backend)?;
    let mut removed = 0;
    for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
        let ours = ids.iter().any(|id| {
            name.len() > id.len()
                && name.starts_with(id.as_str())
                && name.as_bytes()[id.len()] == b'-'
        });
        if ours {
            fs::remove_file(dir.join(&name))
                .map_err(|e| Error::io(format!("removing {}", dir.join(&name).display()), e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_private_and_well_formed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e");
        let mut bytes = Vec::new();
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&42u64.to_le_bytes());
        bytes.extend_from_slice(&[7u8; 32]);
        fs::write(&path, &bytes).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_entry(&path).is_none(), "readable by others");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let (expires, key) = read_entry(&path).unwrap();
        assert_eq!((expires, *key), (42, [7u8; 32]));
        fs::write(&path, &bytes[..40]).unwrap();
        assert!(read_entry(&path).is_none(), "truncated");
        assert_eq!(entry_name("ab", &[1, 2]), "ab-0102");
    }
}
