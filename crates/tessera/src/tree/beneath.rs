//! Writing beneath a restore's target, by construction (DESIGN rule 13,
//! docs/SECURITY.md): the target directory is opened once, and every path
//! below it is resolved from that descriptor one component at a time,
//! never through a symbolic link (`openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS` where the kernel has it, `O_NOFOLLOW` otherwise).
//! Objects are created, replaced, linked and given their metadata with the
//! `*at` calls relative to their directory's descriptor, or through their
//! own descriptor — never by a path through the target.

use super::catalog::{Entry, Kind};
use rustix::fs::{
    self as rfs, AtFlags, FileType, Gid, Mode, OFlags, ResolveFlags, Timestamps, Uid, XattrFlags,
    CWD,
};
use rustix::io::Errno;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// The target directory of a restore, open.
pub(crate) struct Root {
    fd: OwnedFd,
    /// Whether `openat2` is used (cleared when the kernel or a seccomp
    /// filter refuses it: then `O_NOFOLLOW`, component by component).
    openat2: AtomicBool,
}

/// Flags of every lookup: nothing is followed, and the descriptor does not
/// leak into child processes.
const LOOKUP: OFlags = OFlags::NOFOLLOW.union(OFlags::CLOEXEC);

impl Root {
    /// Opens the directory `target` (the path given by the user: resolved as given).
    pub(crate) fn open(target: &Path) -> io::Result<Root> {
        let fd = rfs::open(
            target,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root {
            fd,
            openat2: AtomicBool::new(true),
        })
    }

    /// The target's descriptor.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens `name` (one component, or with `whole` a relative path whose
    /// components were checked) below `dir` with `flags`, never following a
    /// symbolic link, never leaving `dir`.
    fn open_in(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        flags: OFlags,
        mode: Mode,
    ) -> io::Result<OwnedFd> {
        if self.openat2.load(Ordering::Relaxed) {
            let resolve =
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
            // EAGAIN: a rename raced the lookup; tried again, then by components.
            for _ in 0..3 {
                match rfs::openat2(dir, name, flags | LOOKUP, mode, resolve) {
                    Err(Errno::NOSYS | Errno::PERM | Errno::TOOBIG | Errno::INVAL) => {
                        self.openat2.store(false, Ordering::Relaxed);
                        break;
                    }
                    Err(Errno::AGAIN) => continue,
                    r => return r.map_err(io::Error::from),
                }
            }
        }
        Ok(rfs::openat(dir, name, flags | LOOKUP, mode)?)
    }

    /// Opens the object at catalog path `path` (below the target) with
    /// `flags`: in one `openat2` where the kernel has it, else component by
    /// component; a symbolic link on the way (or at the end) is an error.
    pub(crate) fn open_path(&self, path: &[u8], flags: OFlags) -> io::Result<OwnedFd> {
        let comps = components(path).map_err(io::Error::other)?;
        let Some((last, parents)) = comps.split_last() else {
            return Ok(rfs::openat(self.fd(), ".", flags | LOOKUP, Mode::empty())?);
        };
        if self.openat2.load(Ordering::Relaxed) && path.len() < 4000 {
            match self.open_in(self.fd(), path, flags, Mode::empty()) {
                Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {}
                r if self.openat2.load(Ordering::Relaxed) => return r,
                _ => {}
            }
        }
        let mut dir: Option<OwnedFd> = None;
        for c in parents {
            let at = dir.as_ref().map_or(self.fd(), |d| d.as_fd());
            let next = self.open_in(at, c, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            dir = Some(next);
        }
        let at = dir.as_ref().map_or(self.fd(), |d| d.as_fd());
        self.open_in(at, last, flags, Mode::empty())
    }
}

/// The components of catalog path `path` (none for the target itself), or
/// why it cannot be restored: a catalog path has no empty, `.` or `..`
/// component and no NUL byte.
pub(crate) fn components(path: &[u8]) -> Result<Vec<&[u8]>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    path.split(|&b| b == b'/')
        .map(|c| match c {
            b"" | b"." | b".." => Err(format!(
                "not restored: the catalog names it with a `{}` component",
                String::from_utf8_lossy(c)
            )),
            c if c.contains(&0) => Err("not restored: its name holds a NUL byte".into()),
            c => Ok(c),
        })
        .collect()
}

/// A directory on the way to an entry that cannot be used: the length of
/// its catalog path (a prefix of the entry's), and why.
#[derive(Debug)]
pub(crate) struct Blocked {
    pub(crate) prefix: usize,
    pub(crate) reason: String,
}

/// One directory of a [`Dirs`] stack.
struct Level<T> {
    name: Vec<u8>,
    fd: OwnedFd,
    data: T,
}

/// The directories along the path of the last entry, open: a restore
/// meets entries in catalog order (depth first), so each directory is
/// looked up once, and each lookup is one component beneath an open one.
/// Each level carries a `T` (for pass 3: the metadata to set when the
/// directory is left).
pub(crate) struct Dirs<'r, T = ()> {
    root: &'r Root,
    stack: Vec<Level<T>>,
}

impl<'r, T: Default> Dirs<'r, T> {
    pub(crate) fn new(root: &'r Root) -> Self {
        Dirs {
            root,
            stack: Vec::new(),
        }
    }

    /// The root the stack starts from.
    pub(crate) fn root(&self) -> &'r Root {
        self.root
    }

    /// Opens the directory at catalog path `dir` (`""`: the target),
    /// reusing the open levels it shares with the last one; the levels left
    /// are handed to `done` (deepest first). With `create`, a missing
    /// directory is made (mode 0700) and handed to `created` with its
    /// catalog path. A component that is not a directory (a symbolic link
    /// included: never followed) blocks the way.
    pub(crate) fn open(
        &mut self,
        dir: &[u8],
        create: bool,
        created: &mut dyn FnMut(&[u8], BorrowedFd<'_>),
        done: &mut dyn FnMut(BorrowedFd<'_>, T),
    ) -> Result<BorrowedFd<'_>, Blocked> {
        let comps = components(dir).map_err(|reason| Blocked {
            prefix: dir.len(),
            reason,
        })?;
        let common = self
            .stack
            .iter()
            .zip(&comps)
            .take_while(|(l, c)| l.name == **c)
            .count();
        self.unwind(common, done);
        let mut prefix = comps[..common].iter().map(|c| c.len() + 1).sum::<usize>();
        for c in &comps[common..] {
            prefix += c.len() + 1;
            let end = (prefix - 1).min(dir.len());
            let at = self.stack.last().map_or(self.root.fd(), |l| l.fd.as_fd());
            let fd = open_dir(self.root, at, c, create).map_err(|e| Blocked {
                prefix: end,
                reason: describe(at, c, &e),
            })?;
            if fd.1 {
                created(&dir[..end], fd.0.as_fd());
            }
            self.stack.push(Level {
                name: c.to_vec(),
                fd: fd.0,
                data: T::default(),
            });
        }
        Ok(self.stack.last().map_or(self.root.fd(), |l| l.fd.as_fd()))
    }

    /// The deepest open directory (the target when none is open).
    pub(crate) fn top(&self) -> BorrowedFd<'_> {
        self.stack.last().map_or(self.root.fd(), |l| l.fd.as_fd())
    }

    /// Sets the data of the deepest open level.
    pub(crate) fn set_top(&mut self, data: T) {
        if let Some(l) = self.stack.last_mut() {
            l.data = data;
        }
    }

    /// Leaves the open levels deeper than `depth`, deepest first.
    fn unwind(&mut self, depth: usize, done: &mut dyn FnMut(BorrowedFd<'_>, T)) {
        while self.stack.len() > depth {
            if let Some(l) = self.stack.pop() {
                done(l.fd.as_fd(), l.data);
            }
        }
    }

    /// Leaves every open level, deepest first.
    pub(crate) fn finish(&mut self, done: &mut dyn FnMut(BorrowedFd<'_>, T)) {
        self.unwind(0, done);
    }
}

/// Opens directory `name` in `at`; with `create`, makes it when missing.
/// The descriptor, and whether the directory was made now.
fn open_dir(
    root: &Root,
    at: BorrowedFd<'_>,
    name: &[u8],
    create: bool,
) -> io::Result<(OwnedFd, bool)> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY;
    match root.open_in(at, name, flags, Mode::empty()) {
        Ok(fd) => Ok((fd, false)),
        Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
            let made = match rfs::mkdirat(at, name, Mode::from_raw_mode(0o700)) {
                Ok(()) => true,
                // Made meanwhile by someone else: used as it is.
                Err(Errno::EXIST) => false,
                Err(e) => return Err(e.into()),
            };
            Ok((root.open_in(at, name, flags, Mode::empty())?, made))
        }
        Err(e) => Err(e),
    }
}

/// What an error opening `name` in `dir` means, in words: what is there
/// when it is not a directory.
pub(crate) fn describe(dir: BorrowedFd<'_>, name: &[u8], e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV) => match kind_at(dir, name) {
            Ok(Some(t)) if t != FileType::Directory => {
                format!("{} is there, not a directory (never followed)", a_kind(t))
            }
            _ => e.to_string(),
        },
        _ => e.to_string(),
    }
}

/// A kind of file-system object, in words.
pub(crate) fn a_kind(t: FileType) -> &'static str {
    match t {
        FileType::Directory => "a directory",
        FileType::RegularFile => "a file",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice | FileType::BlockDevice => "a device",
        _ => "an object",
    }
}

/// The kind of what is at `name` in `dir` (not following a link), if anything.
pub(crate) fn kind_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<FileType>> {
    Ok(stat_at(dir, name)?.map(|s| FileType::from_raw_mode(s.st_mode)))
}

/// `lstat` of `name` in `dir`, if anything is there.
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<rfs::Stat>> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(s) => Ok(Some(s)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Removes what is at `name` in `dir`: a directory with everything below
/// it (walked by descriptors, links removed, never followed).
pub(crate) fn remove_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    match rfs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => return Ok(()),
        Err(Errno::ISDIR | Errno::PERM) if kind_at(dir, name)? == Some(FileType::Directory) => {}
        Err(e) => return Err(e.into()),
    }
    let sub = rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | LOOKUP,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    for d in rfs::Dir::read_from(&sub)? {
        let n = d?.file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            names.push(n);
        }
    }
    for n in names {
        remove_at(sub.as_fd(), &n)?;
    }
    rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    Ok(())
}

/// Creates the FIFO or device node of `e` at `name` in `dir`.
pub(crate) fn make_node_at(dir: BorrowedFd<'_>, name: &[u8], e: &Entry) -> io::Result<()> {
    let t = match e.kind {
        Kind::Fifo => FileType::Fifo,
        Kind::CharDevice => FileType::CharacterDevice,
        Kind::BlockDevice => FileType::BlockDevice,
        _ => return Err(io::Error::other("not a FIFO or device")),
    };
    let mode = Mode::from_raw_mode(e.mode & 0o7777);
    Ok(rfs::mknodat(dir, name, t, mode, e.rdev)?)
}

/// Owner and group ids for `chown` (-1, "unchanged", is never passed as an id).
fn ids(e: &Entry) -> (Option<Uid>, Option<Gid>) {
    (
        (e.uid != u32::MAX).then(|| Uid::from_raw_unchecked(e.uid)),
        (e.gid != u32::MAX).then(|| Gid::from_raw_unchecked(e.gid)),
    )
}

fn times(e: &Entry) -> Timestamps {
    let ts = |s: i64, ns: u32| rfs::Timespec {
        tv_sec: s,
        tv_nsec: i64::from(ns.min(999_999_999)),
    };
    Timestamps {
        last_access: ts(e.atime, e.atime_ns),
        last_modification: ts(e.mtime, e.mtime_ns),
    }
}

/// Notes metadata that could not be applied (owners when not root, …).
pub(crate) type Note<'n> = &'n dyn Fn(&'static str);

fn refused(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
}

fn xattrs_refused(e: &io::Error) -> bool {
    super::meta::unsupported(e) || refused(e) || e.raw_os_error() == Some(libc::ENOENT)
}

/// Owner (noted when not permitted), extended attributes (noted where
/// refused), mode and times of entry `e` on the open file or directory `fd`.
pub(crate) fn set_metadata_fd(e: &Entry, fd: BorrowedFd<'_>, notes: Note<'_>) -> io::Result<()> {
    let (uid, gid) = ids(e);
    match rfs::fchown(fd, uid, gid) {
        Err(err) if refused(&err.into()) => notes(NOT_OWNER),
        r => r?,
    }
    for x in &e.xattrs {
        match rfs::fsetxattr(fd, x.name.as_slice(), &x.value, XattrFlags::empty()) {
            Err(err) if xattrs_refused(&err.into()) => {
                notes(NOT_XATTRS);
                break;
            }
            r => r?,
        }
    }
    rfs::fchmod(fd, Mode::from_raw_mode(e.mode & 0o7777))?;
    Ok(rfs::futimens(fd, &times(e))?)
}

const NOT_OWNER: &str = "owner not restored (not permitted: not root)";
const NOT_XATTRS: &str = "extended attributes not restored (refused here)";

/// [`set_metadata_fd`] for the symbolic link, FIFO or device `name` in
/// `dir`, never following a link: `fchownat` and `utimensat` with
/// `AT_SYMLINK_NOFOLLOW`, `fchmodat2` with it (or, on older kernels, the
/// object's own `O_PATH` descriptor once it is known to be no link), and
/// extended attributes with `lsetxattr` through the directory's
/// descriptor in /proc.
pub(crate) fn set_metadata_at(
    e: &Entry,
    dir: BorrowedFd<'_>,
    name: &[u8],
    notes: Note<'_>,
) -> io::Result<()> {
    let (uid, gid) = ids(e);
    match rfs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW) {
        Err(err) if refused(&err.into()) => notes(NOT_OWNER),
        r => r?,
    }
    if !e.xattrs.is_empty() {
        let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        path.extend_from_slice(name);
        for x in &e.xattrs {
            match rfs::lsetxattr(
                path.as_slice(),
                x.name.as_slice(),
                &x.value,
                XattrFlags::empty(),
            ) {
                Err(err) if xattrs_refused(&err.into()) => {
                    notes(NOT_XATTRS);
                    break;
                }
                r => r?,
            }
        }
    }
    // A link's own mode cannot be set on Linux.
    if e.kind != Kind::Symlink {
        chmod_nofollow(dir, name, e.mode & 0o7777)?;
    }
    Ok(rfs::utimensat(
        dir,
        name,
        &times(e),
        AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

/// `chmod` of `name` in `dir` (a FIFO or device), never following a link.
fn chmod_nofollow(dir: BorrowedFd<'_>, name: &[u8], mode: u32) -> io::Result<()> {
    let c = std::ffi::CString::new(name).map_err(io::Error::other)?;
    // SAFETY: `c` is a NUL-terminated string and `dir` an open descriptor
    // for the call's duration.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            mode,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    // No fchmodat2 (or a filter refusing it): the way below, which meets
    // a real permission error again.
    if !matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) {
        return Err(err);
    }
    // Before Linux 6.6: the object's own descriptor, checked to be no link.
    let fd = rfs::openat(dir, name, OFlags::PATH | LOOKUP, Mode::empty())?;
    if FileType::from_raw_mode(rfs::fstat(&fd)?.st_mode) == FileType::Symlink {
        return Err(io::Error::other("a symbolic link appeared: not followed"));
    }
    let proc = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(rfs::chmodat(
        CWD,
        proc.as_str(),
        Mode::from_raw_mode(mode),
        AtFlags::empty(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn components_refuse_dot_dot_and_empty_names() {
        assert_eq!(components(b"").unwrap().len(), 0);
        assert_eq!(components(b"a/b").unwrap(), [b"a".as_slice(), b"b"]);
        for bad in [&b"a/../b"[..], b"..", b"a//b", b"./a", b"a/", b"a\0b"] {
            assert!(components(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lookups_never_follow_a_link_out_of_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("f"), b"secret").unwrap();
        symlink(&outside, root.join("abs")).unwrap();
        symlink("../outside", root.join("rel")).unwrap();
        symlink("/", root.join("slash")).unwrap();
        let r = Root::open(&root).unwrap();
        for both in [true, false] {
            r.openat2.store(both, Ordering::Relaxed);
            for link in ["abs", "rel", "slash"] {
                let p = format!("{link}/f");
                assert!(r.open_path(p.as_bytes(), OFlags::RDONLY).is_err(), "{p}");
                let mut dirs: Dirs<()> = Dirs::new(&r);
                let blocked = dirs
                    .open(p.as_bytes(), true, &mut |_, _| {}, &mut |_, _| {})
                    .unwrap_err();
                assert_eq!(blocked.prefix, link.len(), "{blocked:?}");
                assert!(
                    blocked.reason.contains("symbolic link"),
                    "{}",
                    blocked.reason
                );
            }
            assert!(r.open_path(b"real", OFlags::RDONLY).is_ok());
        }
        // Nothing was made outside.
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
    }

    #[test]
    fn dirs_make_missing_levels_and_reuse_open_ones() {
        let dir = tempfile::tempdir().unwrap();
        let r = Root::open(dir.path()).unwrap();
        let mut dirs: Dirs<u32> = Dirs::new(&r);
        let mut made = Vec::new();
        let long = "n".repeat(250);
        let deep: Vec<String> = (0..20).map(|i| format!("{i}{long}")).collect();
        let deep = deep.join("/");
        assert!(deep.len() > 4096);
        dirs.open(
            deep.as_bytes(),
            true,
            &mut |p, _| made.push(p.to_vec()),
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(made.len(), 20);
        assert_eq!(made[19], deep.as_bytes());
        dirs.set_top(7);
        let mut left = Vec::new();
        dirs.open(b"0x", true, &mut |_, _| {}, &mut |_, d| left.push(d))
            .unwrap();
        assert_eq!(left.len(), 20);
        assert_eq!(left[0], 7);
        assert!(r.open_path(deep.as_bytes(), OFlags::RDONLY).is_ok());
        remove_at(r.fd(), format!("0{long}").as_bytes()).unwrap();
        assert!(r.open_path(deep.as_bytes(), OFlags::RDONLY).is_err());
    }
}
