//! File-system metadata beyond `lstat`: owner and group names, extended
//! attributes (POSIX ACLs included).

use super::catalog::Xattr;
use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Names of user and group ids, looked up once each.
#[derive(Default)]
pub(crate) struct Names {
    users: HashMap<u32, Vec<u8>>,
    groups: HashMap<u32, Vec<u8>>,
}

impl Names {
    /// The name of user `uid` (empty if it has none).
    pub(crate) fn user(&mut self, uid: u32) -> Vec<u8> {
        self.user_ref(uid).to_vec()
    }

    /// The name of group `gid` (empty if it has none).
    pub(crate) fn group(&mut self, gid: u32) -> Vec<u8> {
        self.group_ref(gid).to_vec()
    }

    /// [`Names::user`], borrowed.
    pub(crate) fn user_ref(&mut self, uid: u32) -> &[u8] {
        self.users.entry(uid).or_insert_with(|| user_name(uid))
    }

    /// [`Names::group`], borrowed.
    pub(crate) fn group_ref(&mut self, gid: u32) -> &[u8] {
        self.groups.entry(gid).or_insert_with(|| group_name(gid))
    }
}

/// Calls a `get*_r` function with a growing buffer; the name it found, if any.
fn lookup(
    mut call: impl FnMut(&mut [libc::c_char]) -> (libc::c_int, *const libc::c_char),
) -> Vec<u8> {
    let mut buf = vec![0 as libc::c_char; 1024];
    loop {
        let (rc, name) = call(&mut buf);
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || name.is_null() {
            return Vec::new();
        }
        // SAFETY: on success the name points to a NUL-terminated string in `buf`.
        return unsafe { CStr::from_ptr(name) }.to_bytes().to_vec();
    }
}

fn user_name(uid: u32) -> Vec<u8> {
    lookup(|buf| {
        // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids).
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `buf.len()` is its size.
        let rc =
            unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
        let name = if found.is_null() {
            std::ptr::null()
        } else {
            pwd.pw_name as *const _
        };
        (rc, name)
    })
}

fn group_name(gid: u32) -> Vec<u8> {
    lookup(|buf| {
        // SAFETY: all-zero is a valid `group` (null pointers, zero ids).
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `buf.len()` is its size.
        let rc =
            unsafe { libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut found) };
        let name = if found.is_null() {
            std::ptr::null()
        } else {
            grp.gr_name as *const _
        };
        (rc, name)
    })
}

/// Whether an error says the file system has no extended attributes (or
/// not this one): nothing to record or restore, not a failure.
pub(crate) fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::ENODATA))
}

/// The extended attributes of `path` (of what it points to when `follow`), sorted by name.
pub(crate) fn read_xattrs(path: &Path, follow: bool) -> io::Result<Vec<Xattr>> {
    match follow {
        true => collect_xattrs(xattr::list_deref(path), |n| xattr::get_deref(path, n)),
        false => collect_xattrs(xattr::list(path), |n| xattr::get(path, n)),
    }
}

/// The extended attributes of the open `file` (or directory), sorted by name.
pub(crate) fn read_file_xattrs(file: &std::fs::File) -> io::Result<Vec<Xattr>> {
    use xattr::FileExt;
    collect_xattrs(file.list_xattr(), |n| file.get_xattr(n))
}

/// The attributes of the `names` listed, each read by `get`, sorted by name.
fn collect_xattrs<I: Iterator<Item = std::ffi::OsString>>(
    names: io::Result<I>,
    get: impl Fn(&OsStr) -> io::Result<Option<Vec<u8>>>,
) -> io::Result<Vec<Xattr>> {
    let names = match names {
        Ok(n) => n,
        Err(e) if unsupported(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for name in names {
        match get(&name) {
            Ok(Some(value)) => out.push(Xattr {
                name: name.as_bytes().to_vec(),
                value,
            }),
            // Removed meanwhile.
            Ok(None) => {}
            Err(e) if unsupported(&e) => {}
            Err(e) => return Err(e),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_root_and_of_nobody_known() {
        let mut n = Names::default();
        assert_eq!(n.user(0), b"root");
        assert_eq!(n.group(0), b"root");
        // An id without a name has an empty one.
        assert!(n.user(3_999_999_999).is_empty());
    }
}
