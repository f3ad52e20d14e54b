//! The walk of a tree backup: the objects under each root in catalog order
//! (depth first, each directory's entries sorted by their name bytes),
//! found through directory file descriptors. Each directory is opened once
//! (`openat`), its entries read from it (`getdents64`) and examined with one
//! `statx` each relative to it, so that the kernel never resolves a full
//! path per object; files are opened relative to it as well ([`At`]),
//! without updating access times where allowed (`O_NOATIME`).

use crate::error::{Error, Result};
use crossbeam_channel::Sender;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RawDir, StatxFlags, CWD};
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read};
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The first bytes of a cache directory's `CACHEDIR.TAG`
/// (<https://bford.info/cachedir/>).
const CACHEDIR_SIGNATURE: &[u8] = b"Signature: 8a477f597d28d172789f06886806bc55";

/// Directories kept open at most while walking deeper: an ancestor beyond
/// these is closed and opened again (by its path) when the walk returns to it.
const MAX_OPEN: usize = 128;

/// Bytes of directory entries read at once.
const DIRENT_BUFFER: usize = 64 << 10;

/// Objects the walk thread sends at once ([`Walk::send_all`]).
const STEP_BATCH: usize = 256;

/// What the exclude options leave out.
#[derive(Clone)]
pub(crate) struct Excludes {
    exact: Gitignore,
    nocase: Gitignore,
    if_present: Vec<String>,
    caches: bool,
}

impl Excludes {
    /// The exclusions of gitignore-style `patterns` and `ipatterns` (matched
    /// regardless of case; a leading `/` anchors at the file-system root),
    /// of directories holding a file named one of `if_present`, and (with
    /// `caches`) of cache directories.
    pub(crate) fn new(
        patterns: &[String],
        ipatterns: &[String],
        if_present: &[String],
        caches: bool,
    ) -> Result<Excludes> {
        Ok(Excludes {
            exact: gitignore(patterns, false)?,
            nocase: gitignore(ipatterns, true)?,
            if_present: if_present.to_vec(),
            caches,
        })
    }

    /// Whether the object at `path` (a directory if `is_dir`) is left out.
    pub(crate) fn excluded(&self, path: &Path, is_dir: bool) -> bool {
        let by = |g: &Gitignore| g.matched_path_or_any_parents(path, is_dir).is_ignore();
        if by(&self.exact) || by(&self.nocase) {
            return true;
        }
        if !is_dir {
            return false;
        }
        self.if_present
            .iter()
            .any(|name| std::fs::symlink_metadata(path.join(name)).is_ok())
            || (self.caches && is_cache_dir(path))
    }
}

/// Gitignore-style patterns (a leading `/` anchors at the file-system root).
fn gitignore(lines: &[String], case_insensitive: bool) -> Result<Gitignore> {
    let mut b = GitignoreBuilder::new("/");
    b.case_insensitive(case_insensitive)
        .map_err(|e| Error::InvalidConfig(format!("exclude patterns: {e}")))?;
    for pattern in lines {
        b.add_line(None, pattern)
            .map_err(|e| Error::InvalidConfig(format!("exclude pattern {pattern:?}: {e}")))?;
    }
    b.build()
        .map_err(|e| Error::InvalidConfig(format!("exclude patterns: {e}")))
}

/// Whether `dir` holds a `CACHEDIR.TAG` starting with the standard signature.
fn is_cache_dir(dir: &Path) -> bool {
    let mut head = [0u8; CACHEDIR_SIGNATURE.len()];
    File::open(dir.join("CACHEDIR.TAG"))
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| head == CACHEDIR_SIGNATURE)
}

/// The status of an object (`statx`): what its catalog entry records and
/// what change detection compares.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Status {
    /// Type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u64,
    pub dev: u64,
    pub ino: u64,
    pub rdev: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub atime: (i64, u32),
}

impl Status {
    fn of(x: &rustix::fs::Statx) -> Status {
        Status {
            mode: u32::from(x.stx_mode),
            uid: x.stx_uid,
            gid: x.stx_gid,
            size: x.stx_size,
            nlink: u64::from(x.stx_nlink),
            dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor),
            ino: x.stx_ino,
            rdev: rustix::fs::makedev(x.stx_rdev_major, x.stx_rdev_minor),
            blocks: x.stx_blocks,
            mtime: (x.stx_mtime.tv_sec, x.stx_mtime.tv_nsec),
            ctime: (x.stx_ctime.tv_sec, x.stx_ctime.tv_nsec),
            atime: (x.stx_atime.tv_sec, x.stx_atime.tv_nsec),
        }
    }

    /// Its type.
    pub fn file_type(&self) -> FileType {
        FileType::from_raw_mode(self.mode)
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == FileType::Directory
    }
}

/// Where an object is: a name in an open directory, or (a root and its
/// ancestors) an absolute path.
#[derive(Clone)]
pub(crate) struct At {
    dir: Option<Arc<File>>,
    name: CString,
}

impl At {
    /// The object at the absolute `path`.
    pub(crate) fn path(path: &Path) -> io::Result<At> {
        let name = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
        Ok(At { dir: None, name })
    }

    /// Its status: of what it points to when `follow` (a dangling link's own).
    pub(crate) fn status(&self, follow: bool) -> io::Result<Status> {
        let stat = |flags| {
            let x = match &self.dir {
                Some(dir) => rustix::fs::statx(&**dir, &self.name, flags, StatxFlags::BASIC_STATS),
                None => rustix::fs::statx(CWD, &self.name, flags, StatxFlags::BASIC_STATS),
            };
            x.map(|x| Status::of(&x)).map_err(io::Error::from)
        };
        match follow {
            true => stat(AtFlags::empty()).or_else(|_| stat(AtFlags::SYMLINK_NOFOLLOW)),
            false => stat(AtFlags::SYMLINK_NOFOLLOW),
        }
    }

    /// Opens it with `flags`, without updating its access time when this
    /// process may (it owns the object, or is privileged): reading the
    /// source does not change it, and the next backup finds it unchanged.
    fn open(&self, flags: OFlags, follow: bool) -> io::Result<File> {
        let flags = match follow {
            true => flags | OFlags::CLOEXEC,
            false => flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        };
        let open = |flags| match &self.dir {
            Some(dir) => rustix::fs::openat(&**dir, &self.name, flags, Mode::empty()),
            None => rustix::fs::openat(CWD, &self.name, flags, Mode::empty()),
        };
        let fd = match open(flags | OFlags::NOATIME) {
            Err(rustix::io::Errno::PERM) => open(flags),
            fd => fd,
        };
        fd.map(File::from).map_err(io::Error::from)
    }

    /// Opens the regular file for reading (a symbolic link only when `follow`).
    pub(crate) fn open_file(&self, follow: bool) -> io::Result<File> {
        self.open(OFlags::RDONLY, follow)
    }

    /// The target of the symbolic link.
    pub(crate) fn read_link(&self) -> io::Result<Vec<u8>> {
        let target = match &self.dir {
            Some(dir) => rustix::fs::readlinkat(&**dir, &self.name, Vec::new()),
            None => rustix::fs::readlinkat(CWD, &self.name, Vec::new()),
        };
        target.map(CString::into_bytes).map_err(io::Error::from)
    }
}

/// An object found by the walk.
pub(crate) struct Found {
    pub path: PathBuf,
    pub at: At,
    pub status: Status,
    /// A directory walked into: its open descriptor.
    pub dir: Option<Arc<File>>,
}

/// What the walk yields: an object, or one it could not examine or read
/// (a directory whose entries cannot be read comes first as an object).
pub(crate) type Walked = std::result::Result<Found, (PathBuf, io::Error)>;

/// What [`Walk::send_all`] sends, in walk order.
pub(crate) enum Step {
    /// A root is walked next: its object and everything below it follow.
    Root(PathBuf),
    /// An object of the root being walked (or one it could not examine).
    Object(Walked),
    /// An object that is not a directory (its directory entry says so),
    /// whose status is left to a stat thread ([`examine_batches`]): it
    /// becomes an [`Step::Object`] before the batch is used.
    Unexamined(PathBuf, At),
    /// Every root is walked: the last step. A walk whose steps end without
    /// it was cut short.
    End,
}

/// A batch of steps on its way to the backup, in walk order: ready, or
/// being examined by a stat thread.
pub(crate) type StepBatch = crossbeam_channel::Receiver<Vec<Step>>;

/// The receiving end of [`Walk::send_all`]: its steps one by one, in walk
/// order.
pub(crate) struct Steps {
    /// Batches from the walk thread (none once the walk ended)...
    rx: Option<crossbeam_channel::Receiver<StepBatch>>,
    /// ...and the rest of the last one.
    batch: std::vec::IntoIter<Step>,
}

impl Steps {
    /// The steps arriving on `rx`.
    pub(crate) fn new(rx: crossbeam_channel::Receiver<StepBatch>) -> Steps {
        Steps {
            rx: Some(rx),
            batch: Vec::new().into_iter(),
        }
    }

    /// The next step, `None` after [`Step::End`] (or once stopped). Steps
    /// that end without it mean that the walk thread or a stat thread died:
    /// an error, so that no backup commits a tree cut short.
    pub(crate) fn next(&mut self) -> Result<Option<Step>, CutShort> {
        loop {
            if let Some(step) = self.batch.next() {
                if matches!(step, Step::End) {
                    self.stop();
                    return Ok(None);
                }
                return Ok(Some(step));
            }
            let Some(rx) = self.rx.as_ref() else {
                return Ok(None);
            };
            let next = rx.recv().map_err(|_| CutShort("thread"))?;
            self.batch = next
                .recv()
                .map_err(|_| CutShort("stat threads"))?
                .into_iter();
        }
    }

    /// Stops receiving: the walk thread ends when it next sends.
    pub(crate) fn stop(&mut self) {
        self.rx = None;
        self.batch = Vec::new().into_iter();
    }
}

/// The walk's steps ended before [`Step::End`]: its named part stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CutShort(pub &'static str);

impl std::fmt::Display for CutShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the tree walk's {} stopped before the walk's end",
            self.0
        )
    }
}

/// A batch of steps for a stat thread, and where to send it once examined.
pub(crate) type ToExamine = (Vec<Step>, Sender<Vec<Step>>);

/// A stat thread of a backup: turns the [`Step::Unexamined`] objects of
/// each batch it receives into [`Step::Object`]s (one `statx` each,
/// following symbolic links if `follow`) and sends the batch on, until its
/// queue closes. Several run at once, so that the `statx` calls of the
/// files spread over the cores while the walk reads directories; each
/// batch keeps its order and the batches are used in the walk's order.
pub(crate) fn examine_batches(queue: crossbeam_channel::Receiver<ToExamine>, follow: bool) {
    for (mut batch, done) in queue {
        for step in &mut batch {
            if let Step::Unexamined(..) = step {
                let Step::Unexamined(path, at) =
                    std::mem::replace(step, Step::Root(PathBuf::new()))
                else {
                    continue;
                };
                *step = Step::Object(match at.status(follow) {
                    Ok(status) => Ok(Found {
                        path,
                        at,
                        status,
                        dir: None,
                    }),
                    Err(e) => Err((path, e)),
                });
            }
        }
        // The backup stopped waiting: its error is reported, not ours.
        let _ = done.send(batch);
    }
}

/// A directory being walked.
struct Frame {
    /// Closed (`None`) while deeper directories hold the open descriptors.
    dir: Option<Arc<File>>,
    path: PathBuf,
    /// Device and inode (to find loops when following links).
    id: (u64, u64),
    /// Its entries, sorted by name, and the next one.
    entries: Vec<(CString, FileType)>,
    next: usize,
}

/// A depth-first walk of one root after another.
pub(crate) struct Walk {
    excludes: Excludes,
    follow: bool,
    one_file_system: bool,
    root_dev: u64,
    /// Device and inode of the root's ancestors (to find loops).
    ancestors: Vec<(u64, u64)>,
    stack: Vec<Frame>,
    /// The directory just found could not be read: reported next.
    failed: Option<(PathBuf, io::Error)>,
    buf: Vec<MaybeUninit<u8>>,
}

impl Walk {
    /// A walk leaving out `excludes`, following symbolic links if `follow`,
    /// staying on each root's file system if `one_file_system`.
    pub(crate) fn new(excludes: Excludes, follow: bool, one_file_system: bool) -> Walk {
        Walk {
            excludes,
            follow,
            one_file_system,
            root_dev: 0,
            ancestors: Vec::new(),
            stack: Vec::new(),
            failed: None,
            buf: Vec::new(),
        }
    }

    /// Starts walking the absolute path `root` (never excluded; a symbolic
    /// link is walked into only when following links): its own object.
    pub(crate) fn start(&mut self, root: &Path) -> Walked {
        self.stack.clear();
        let fail = |e| (root.to_path_buf(), e);
        let at = At::path(root).map_err(fail)?;
        let status = at.status(self.follow).map_err(fail)?;
        self.root_dev = status.dev;
        self.ancestors = match self.follow {
            true => root
                .ancestors()
                .skip(1)
                .filter_map(|a| At::path(a).and_then(|a| a.status(true)).ok())
                .map(|s| (s.dev, s.ino))
                .collect(),
            false => Vec::new(),
        };
        Ok(self.found(root.to_path_buf(), at, status))
    }

    /// Walks `roots` one after another on this thread (the walk thread of
    /// a backup), sending its steps to `tx` in batches of [`STEP_BATCH`],
    /// so that the system calls of the walk (directory reads, a `statx`
    /// per directory) run beside the work on the objects they find. The
    /// other objects' `statx` calls are left to the stat threads reading
    /// `examine` ([`examine_batches`]; a batch goes through them when it
    /// holds such an object). Stops when every root is done or `tx`'s
    /// receiver is gone.
    pub(crate) fn send_all(
        mut self,
        roots: Vec<PathBuf>,
        tx: Sender<StepBatch>,
        examine: Sender<ToExamine>,
    ) {
        let mut batch = Vec::with_capacity(STEP_BATCH);
        let flush = |batch: &mut Vec<Step>| {
            let batch = std::mem::replace(batch, Vec::with_capacity(STEP_BATCH));
            let (done, ready) = crossbeam_channel::bounded(1);
            let sent = match batch.iter().any(|s| matches!(s, Step::Unexamined(..))) {
                true => examine.send((batch, done)).is_ok(),
                false => done.send(batch).is_ok(),
            };
            sent && tx.send(ready).is_ok()
        };
        let send = |batch: &mut Vec<Step>, step: Step| {
            batch.push(step);
            batch.len() < STEP_BATCH || flush(batch)
        };
        for root in roots {
            let first = self.start(&root);
            if !send(&mut batch, Step::Root(root)) || !send(&mut batch, Step::Object(first)) {
                return;
            }
            while let Some(step) = self.next_step(true) {
                if !send(&mut batch, step) {
                    return;
                }
            }
        }
        batch.push(Step::End);
        flush(&mut batch);
    }

    /// The next object of the root started, `None` when it is done (each
    /// examined on this thread: the walk of a scan, [`super::scan`]).
    pub(crate) fn next(&mut self) -> Option<Walked> {
        match self.next_step(false)? {
            Step::Object(walked) => Some(walked),
            _ => Some(Err((PathBuf::new(), io::Error::other("not examined")))),
        }
    }

    /// The next step of the root started, `None` when it is done: an
    /// [`Step::Object`], or (if `defer`) an [`Step::Unexamined`] object
    /// whose directory entry says it is not a directory (nor, when
    /// following links, a link), which the walk needs no status of.
    fn next_step(&mut self, defer: bool) -> Option<Step> {
        loop {
            if let Some(failed) = self.failed.take() {
                return Some(Step::Object(Err(failed)));
            }
            let frame = self.stack.last_mut()?;
            // Each entry is walked once: its name is taken, not copied.
            let Some((name, d_type)) = frame
                .entries
                .get_mut(frame.next)
                .map(|(name, d_type)| (std::mem::take(name), *d_type))
            else {
                self.stack.pop();
                continue;
            };
            frame.next += 1;
            let path = frame.path.join(OsStr::from_bytes(name.to_bytes()));
            let dir = match frame.dir.clone() {
                Some(dir) => dir,
                None => match self.reopen() {
                    Ok(dir) => dir,
                    Err(e) => {
                        let failed = self.stack.pop().map(|f| f.path);
                        return Some(Step::Object(Err((failed.unwrap_or(path), e))));
                    }
                },
            };
            let at = At {
                dir: Some(dir),
                name,
            };
            // The type decides how exclude patterns match: from the entry
            // when it tells, from the object's status otherwise.
            let mut status = None;
            let is_dir = match d_type {
                FileType::Directory => true,
                FileType::Symlink if !self.follow => false,
                FileType::Symlink | FileType::Unknown => match at.status(self.follow) {
                    Ok(s) => {
                        status = Some(s);
                        s.is_dir()
                    }
                    Err(e) => return Some(Step::Object(Err((path, e)))),
                },
                _ => false,
            };
            if self.excludes.excluded(&path, is_dir) {
                continue;
            }
            // (A link is examined here when it is followed.)
            if defer && !is_dir && status.is_none() {
                return Some(Step::Unexamined(path, at));
            }
            let status = match status.map_or_else(|| at.status(self.follow), Ok) {
                Ok(s) => s,
                Err(e) => return Some(Step::Object(Err((path, e)))),
            };
            if self.follow && status.is_dir() {
                let id = (status.dev, status.ino);
                let ancestor = self
                    .stack
                    .iter()
                    .map(|f| (f.id, &f.path))
                    .find(|a| a.0 == id);
                if let Some((_, ancestor)) = ancestor {
                    let loop_error = io::Error::other(format!(
                        "file system loop: points to its ancestor {}",
                        ancestor.display()
                    ));
                    return Some(Step::Object(Err((path, loop_error))));
                }
                if self.ancestors.contains(&id) {
                    let loop_error =
                        io::Error::other("file system loop: points to an ancestor of the root");
                    return Some(Step::Object(Err((path, loop_error))));
                }
            }
            return Some(Step::Object(Ok(self.found(path, at, status))));
        }
    }

    /// The object at `path`, walked into if a directory to walk.
    fn found(&mut self, path: PathBuf, at: At, status: Status) -> Found {
        let descend = status.is_dir() && (!self.one_file_system || status.dev == self.root_dev);
        let mut found = Found {
            path,
            at,
            status,
            dir: None,
        };
        if descend {
            match self.enter(&found) {
                Ok(dir) => found.dir = Some(dir),
                Err(e) => self.failed = Some((found.path.clone(), e)),
            }
        }
        found
    }

    /// Opens the directory `found` and reads its entries, to walk them next.
    fn enter(&mut self, found: &Found) -> io::Result<Arc<File>> {
        let dir = Arc::new(
            found
                .at
                .open(OFlags::RDONLY | OFlags::DIRECTORY, self.follow)?,
        );
        if self.buf.is_empty() {
            self.buf.resize(DIRENT_BUFFER, MaybeUninit::uninit());
        }
        let mut entries = Vec::new();
        let mut raw = RawDir::new(&*dir, &mut self.buf);
        let mut failure = None;
        while let Some(entry) = raw.next() {
            match entry {
                Ok(e) => {
                    let name = e.file_name();
                    if name != c"." && name != c".." {
                        entries.push((name.to_owned(), e.file_type()));
                    }
                }
                Err(e) => {
                    failure = Some(io::Error::from(e));
                    break;
                }
            }
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        // Beyond MAX_OPEN open directories, the oldest still open is closed.
        let open = self.stack.iter().filter(|f| f.dir.is_some()).count();
        if open >= MAX_OPEN {
            if let Some(oldest) = self.stack.iter_mut().find(|f| f.dir.is_some()) {
                oldest.dir = None;
            }
        }
        self.stack.push(Frame {
            dir: Some(dir.clone()),
            path: found.path.clone(),
            id: (found.status.dev, found.status.ino),
            entries,
            next: 0,
        });
        if let Some(e) = failure {
            // The entries read before the failure are walked.
            self.failed = Some((found.path.clone(), e));
        }
        Ok(dir)
    }

    /// Opens the innermost directory again (closed while walking deeper).
    fn reopen(&mut self) -> io::Result<Arc<File>> {
        let follow = self.follow;
        let frame = self
            .stack
            .last_mut()
            .ok_or_else(|| io::Error::other("no directory to reopen"))?;
        let dir =
            Arc::new(At::path(&frame.path)?.open(OFlags::RDONLY | OFlags::DIRECTORY, follow)?);
        frame.dir = Some(dir.clone());
        Ok(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk_all(root: &Path, excludes: &[String], follow: bool) -> Vec<(PathBuf, bool)> {
        let excludes = Excludes::new(excludes, &[], &[], false).unwrap();
        let mut walk = Walk::new(excludes, follow, false);
        let mut out = Vec::new();
        let mut item = Some(walk.start(root));
        while let Some(w) = item {
            match w {
                Ok(f) => out.push((f.path, true)),
                Err((p, _)) => out.push((p, false)),
            }
            item = walk.next();
        }
        out
    }

    /// Every object path the steps of `send_all` over `root` carry, in
    /// order, with two stat threads; the error if they end short of
    /// [`Step::End`].
    fn steps_of(root: &Path) -> Result<Vec<PathBuf>, CutShort> {
        let excludes = Excludes::new(&[], &[], &[], false).unwrap();
        let walk = Walk::new(excludes, false, false);
        let (tx, rx) = crossbeam_channel::bounded(2);
        let (examine, queue) = crossbeam_channel::bounded(2);
        std::thread::scope(|s| {
            let roots = vec![root.to_path_buf()];
            s.spawn(move || walk.send_all(roots, tx, examine));
            for _ in 0..2 {
                let queue = queue.clone();
                s.spawn(move || examine_batches(queue, false));
            }
            drop(queue);
            let mut steps = Steps::new(rx);
            let mut paths = Vec::new();
            while let Some(step) = steps.next()? {
                if let Step::Object(Ok(found)) = step {
                    paths.push(found.path);
                }
            }
            Ok(paths)
        })
    }

    #[test]
    fn the_walk_threads_steps_end_with_end_and_cut_short_ones_fail() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        std::fs::create_dir_all(root.join("d")).unwrap();
        // More objects than one batch, so that several batches go through the stat threads.
        for f in 0..(STEP_BATCH + 10) {
            std::fs::write(root.join(format!("d/{f:04}")), b"").unwrap();
        }
        let paths = steps_of(&root).unwrap();
        assert_eq!(paths.len(), STEP_BATCH + 12);
        let mut expected = vec![root.clone(), root.join("d")];
        expected.extend((0..STEP_BATCH + 10).map(|f| root.join(format!("d/{f:04}"))));
        assert_eq!(paths, expected);

        // The walk thread gone before its end: an error, not an end.
        let (tx, rx) = crossbeam_channel::bounded::<StepBatch>(1);
        let (done, ready) = crossbeam_channel::bounded(1);
        done.send(vec![Step::Root(root.clone())]).unwrap();
        tx.send(ready).unwrap();
        drop(tx);
        let mut steps = Steps::new(rx);
        assert!(matches!(steps.next(), Ok(Some(Step::Root(_)))));
        assert_eq!(steps.next().err(), Some(CutShort("thread")));

        // A batch a stat thread never returned: an error too.
        let (tx, rx) = crossbeam_channel::bounded::<StepBatch>(1);
        let (done, ready) = crossbeam_channel::bounded::<Vec<Step>>(1);
        tx.send(ready).unwrap();
        drop(done);
        assert_eq!(Steps::new(rx).next().err(), Some(CutShort("stat threads")));

        // After the end, nothing more.
        let (tx, rx) = crossbeam_channel::bounded::<StepBatch>(1);
        let (done, ready) = crossbeam_channel::bounded(1);
        done.send(vec![Step::End]).unwrap();
        tx.send(ready).unwrap();
        let mut steps = Steps::new(rx);
        assert!(matches!(steps.next(), Ok(None)));
        assert!(matches!(steps.next(), Ok(None)));
    }

    #[test]
    fn walks_depth_first_in_name_order_and_excludes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        for d in ["b/x", "a", "a-b", "c"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in ["b/x/1", "b/2", "a/3", "a-b/4", "z.tmp"] {
            std::fs::write(root.join(f), b"").unwrap();
        }
        std::os::unix::fs::symlink("b", root.join("l")).unwrap();
        let got: Vec<_> = walk_all(&root, &["*.tmp".into(), "c/".into()], false)
            .into_iter()
            .map(|(p, ok)| (p.strip_prefix(&root).unwrap().display().to_string(), ok))
            .collect();
        let want = [
            "", "a", "a/3", "a-b", "a-b/4", "b", "b/2", "b/x", "b/x/1", "l",
        ];
        assert_eq!(got, want.map(|p| (p.to_string(), true)));
        // Following links: the link is walked into, a loop is refused.
        std::os::unix::fs::symlink("..", root.join("b/x/up")).unwrap();
        let got = walk_all(&root, &[], true);
        assert!(got.contains(&(root.join("l/x/1"), true)));
        assert!(got.contains(&(root.join("b/x/up"), false)));
    }

    #[test]
    fn reading_a_file_keeps_its_access_time() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"bytes").unwrap();
        // An access time before the modification time: reading updates it
        // (relatime) unless opened without updating it.
        let old = filetime::FileTime::from_unix_time(1_000_000, 0);
        filetime::set_file_atime(&f, old).unwrap();
        let mut bytes = Vec::new();
        At::path(&f)
            .unwrap()
            .open_file(false)
            .unwrap()
            .read_to_end(&mut bytes)
            .unwrap();
        assert_eq!(bytes, b"bytes");
        let status = At::path(&f).unwrap().status(false).unwrap();
        assert_eq!(status.atime, (1_000_000, 0));
    }

    #[test]
    fn deep_trees_reopen_their_directories() {
        let dir = tempfile::tempdir().unwrap();
        let mut deep = dir.path().join("r");
        for _ in 0..MAX_OPEN + 20 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        let mut p = dir.path().join("r");
        for _ in 0..MAX_OPEN + 20 {
            std::fs::write(p.join("f"), b"").unwrap();
            p.push("d");
        }
        let got = walk_all(&dir.path().join("r"), &[], false);
        assert_eq!(got.len(), 1 + 2 * (MAX_OPEN + 20));
        assert!(got.iter().all(|(_, ok)| *ok));
        // "d" sorts before "f": every directory's file comes after its subtree.
        assert_eq!(got.last().unwrap().0, dir.path().join("r/f"));
    }
}
