//! Standard input backed up as one regular file of a tree (`backup -
//! --stdin-name NAME`).

use crate::error::{Error, Result};
use crate::tree::catalog::{Entry, Kind};
use crate::tree::meta::Names;
use std::fs::File;

/// Standard input as a file to read, and its catalog entry at `name`:
/// mode 0644, the user's ids, the current time.
pub(super) fn stdin_file(name: &str) -> Result<(File, Entry)> {
    let path = name.trim_start_matches('/');
    if path.is_empty()
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(Error::InvalidConfig(format!(
            "--stdin-name {name:?}: give a file name or a path of names"
        )));
    }
    use std::os::fd::AsFd;
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::io("reading standard input", e))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut names = Names::default();
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let entry = Entry {
        path: path.as_bytes().to_vec(),
        kind: Kind::File,
        mode: 0o644,
        uid,
        gid,
        mtime: secs,
        mtime_ns: now.subsec_nanos(),
        ctime: secs,
        ctime_ns: now.subsec_nanos(),
        atime: secs,
        atime_ns: now.subsec_nanos(),
        user: names.user(uid),
        group: names.group(gid),
        ..Entry::default()
    };
    Ok((File::from(fd), entry))
}
