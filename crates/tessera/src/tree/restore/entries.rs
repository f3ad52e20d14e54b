//! Pass 1 of a tree restore: the selected directories, symbolic links,
//! FIFOs and devices are made (beneath the target: [`crate::tree::beneath`]),
//! the missing ancestors of selected entries created, and what pass 2 (the
//! files and hard links) and pass 3 (the directories' metadata) will do is
//! decided entry by entry. What is in the way is replaced, kept or
//! reported as the `--overwrite` mode says; a directory that cannot be
//! made or used is reported once, with the count of the selected entries
//! below it.

use super::options::{Overwrite, Report, TreeRestoreOptions};
use crate::error::Result;
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::tree::beneath::{
    a_kind, components, kind_at, make_node_at, remove_at, set_metadata_at, stat_at, Dirs, Root,
};
use crate::tree::catalog::{is_ancestor, Entry, Kind};
use crate::tree::cursor::{push_range, split_path, Cursor};
use crate::tree::relative_path;
use crate::tree::select::Selection;
use rustix::fs::{FileType, Mode};
use std::io;
use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::path::Path;

/// What pass 1 decided, for the passes after it.
#[derive(Default)]
pub(super) struct Planned {
    /// By selected file, in catalog order: whether pass 2 writes it.
    pub(super) write: Vec<bool>,
    /// By selected hard link: whether pass 2 links it.
    pub(super) link: Vec<bool>,
    /// By directory of the catalog's part: whether pass 3 sets its metadata
    /// (made by this restore, or selected and `--overwrite` replaces).
    pub(super) dir_meta: Vec<bool>,
    /// The chunks of the files to write, in order.
    pub(super) ranges: Vec<Range<usize>>,
    /// Salvage restore: the files with bytes written, in order (catalog path, size).
    pub(super) with_bytes: Vec<(Vec<u8>, u64)>,
    /// Hard links selected without their file's first path (that path, the link's).
    pub(super) orphans: Vec<(Vec<u8>, Vec<u8>)>,
    pub(super) dirs: u64,
    pub(super) symlinks: u64,
    pub(super) nodes: u64,
    pub(super) kept: u64,
}

/// What to do with an entry's place.
pub(super) enum Decision {
    /// Nothing is there.
    Free,
    /// Something is there and is replaced.
    Replace,
    /// Something is there and is kept.
    Keep,
    /// Something is there that may not be replaced: reported, why.
    Conflict(String),
}

/// What `mode` does with what is at `name` in `dir` when entry `e` is
/// restored there (`e` not a directory).
pub(super) fn decide(mode: Overwrite, e: &Entry, dir: BorrowedFd<'_>, name: &[u8]) -> Decision {
    let st = match stat_at(dir, name) {
        Ok(None) => return Decision::Free,
        Ok(Some(st)) => st,
        Err(err) => return Decision::Conflict(err.to_string()),
    };
    let t = FileType::from_raw_mode(st.st_mode);
    let same = || match e.kind {
        Kind::File => {
            t == FileType::RegularFile
                && st.st_size as u64 == e.size
                && (st.st_mtime as i64, st.st_mtime_nsec as i64) == (e.mtime, i64::from(e.mtime_ns))
        }
        Kind::Symlink => {
            t == FileType::Symlink
                && rustix::fs::readlinkat(dir, name, Vec::new())
                    .is_ok_and(|l| l.as_bytes() == e.target.as_slice())
        }
        _ => false,
    };
    match mode {
        Overwrite::Refuse => Decision::Conflict(in_the_way(t, mode)),
        Overwrite::Never => Decision::Keep,
        Overwrite::Always => Decision::Replace,
        Overwrite::IfChanged if same() => Decision::Keep,
        Overwrite::IfChanged => Decision::Replace,
    }
}

/// Why an object of kind `t` in an entry's way stays there.
pub(super) fn in_the_way(t: FileType, mode: Overwrite) -> String {
    match mode {
        Overwrite::Never => format!("{} is there, kept (--overwrite=never)", a_kind(t)),
        _ => format!("{} is there (--overwrite replaces it)", a_kind(t)),
    }
}

/// Pass 1, fed the entries of the catalog's part in order ([`Plan::visit`]).
pub(super) struct Plan<'a> {
    dirs: Dirs<'a>,
    target: &'a Path,
    mode: Overwrite,
    select: &'a Selection,
    skip_damaged: bool,
    report: &'a Report,
    cursor: Cursor<'a>,
    /// The directory entries along the current path: catalog path and number.
    ancestors: Vec<(Vec<u8>, usize)>,
    /// A path below which selected entries are not restored, and its report.
    blocked: Option<(Vec<u8>, usize)>,
    out: Planned,
}

impl<'a> Plan<'a> {
    pub(super) fn new(
        root: &'a Root,
        target: &'a Path,
        options: &'a TreeRestoreOptions,
        report: &'a Report,
        chunks: &'a [ChunkRef],
        id: BackupId,
        data_offset: u64,
    ) -> Result<Self> {
        Ok(Plan {
            dirs: Dirs::new(root),
            target,
            mode: options.overwrite,
            select: &options.selection,
            skip_damaged: options.restore.skip_damaged,
            report,
            cursor: Cursor::at(chunks, id, data_offset)?,
            ancestors: Vec::new(),
            blocked: None,
            out: Planned::default(),
        })
    }

    /// The decisions, once every entry was visited.
    pub(super) fn finish(self) -> Planned {
        self.out
    }

    /// Restores entry `e` (if selected) or records what the passes after
    /// this one do with it; fails only on a damaged catalog.
    pub(super) fn visit(&mut self, e: &Entry) -> Result<bool> {
        let extent = match e.has_bytes() {
            true => self.cursor.extent(e.size)?,
            false => 0..0,
        };
        if e.kind == Kind::Dir {
            while self
                .ancestors
                .last()
                .is_some_and(|(p, _)| !is_ancestor(p, &e.path))
            {
                self.ancestors.pop();
            }
            self.ancestors
                .push((e.path.clone(), self.out.dir_meta.len()));
            self.out.dir_meta.push(false);
        }
        if e.kind == Kind::Gap || !self.select.matches(&e.path) {
            return Ok(true);
        }
        match e.kind {
            Kind::File => self.out.write.push(false),
            Kind::Hardlink => self.out.link.push(false),
            _ => {}
        }
        if self.is_blocked(&e.path) {
            return Ok(true);
        }
        if let Err(reason) = components(&e.path) {
            self.report.fail(&e.path, reason);
            return Ok(true);
        }
        match e.kind {
            Kind::Dir => self.dir(e),
            Kind::File => self.file(e, extent),
            Kind::Hardlink => self.hardlink(e),
            Kind::Symlink | Kind::Fifo | Kind::CharDevice | Kind::BlockDevice => self.object(e),
            Kind::Gap => {}
        }
        Ok(true)
    }

    /// Whether `path` is below a directory that could not be restored (counted there).
    fn is_blocked(&mut self, path: &[u8]) -> bool {
        match &self.blocked {
            Some((p, n)) if is_ancestor(p, path) => {
                self.report.below(*n);
                true
            }
            Some(_) => {
                self.blocked = None;
                false
            }
            None => false,
        }
    }

    /// Reports directory `dir` (of entry `path`, or `path` itself) as not
    /// usable: the selected entries below it are counted there.
    fn block(&mut self, dir: &[u8], path: &[u8], reason: String) {
        let n = self.report.fail(dir, reason);
        if dir != path {
            self.report.below(n);
        }
        self.blocked = Some((dir.to_vec(), n));
    }

    /// Opens the directory of the entry at `path` (making missing ones),
    /// leaving it at the top of the stack; its name in it, or `None` when
    /// the way is blocked (reported).
    fn parent<'p>(&mut self, path: &'p [u8]) -> Option<&'p [u8]> {
        let (dir, name) = split_path(path);
        let Plan {
            dirs,
            ancestors,
            out,
            ..
        } = self;
        let mut created = |p: &[u8], fd: BorrowedFd<'_>| mark_created(ancestors, out, p, fd);
        match dirs.open(dir, true, &mut created, &mut |_, _| {}) {
            Ok(_) => Some(name),
            Err(b) => {
                self.block(&path[..b.prefix], path, b.reason);
                None
            }
        }
    }

    /// A selected directory: made (a non-directory in its way replaced
    /// when `--overwrite` replaces, else reported with what is below it),
    /// or merged into when there.
    fn dir(&mut self, e: &Entry) {
        let Some(name) = self.parent(&e.path) else {
            return;
        };
        let number = self.out.dir_meta.len() - 1;
        let at = self.dirs.top();
        match kind_at(at, name) {
            Ok(Some(FileType::Directory)) => {
                self.out.dir_meta[number] = self.mode.replaces();
                self.out.dirs += 1;
                return;
            }
            Ok(Some(t)) if !self.mode.replaces() => {
                return self.block(&e.path, &e.path, in_the_way(t, self.mode));
            }
            Ok(Some(t)) => {
                if let Err(err) = remove_at(at, name) {
                    let why = format!("{} is there and could not be removed: {err}", a_kind(t));
                    return self.block(&e.path, &e.path, why);
                }
            }
            Ok(None) => {}
            Err(err) => return self.block(&e.path, &e.path, err.to_string()),
        }
        let Plan {
            dirs,
            ancestors,
            out,
            ..
        } = self;
        let mut created = |p: &[u8], fd: BorrowedFd<'_>| mark_created(ancestors, out, p, fd);
        match dirs.open(&e.path, true, &mut created, &mut |_, _| {}) {
            Ok(_) => self.out.dirs += 1,
            Err(b) => self.block(&e.path[..b.prefix], &e.path, b.reason),
        }
    }

    /// A selected file: whether pass 2 writes it, and its chunks.
    fn file(&mut self, e: &Entry, extent: Range<usize>) {
        let Some(name) = self.parent(&e.path) else {
            return;
        };
        match decide(self.mode, e, self.dirs.top(), name) {
            Decision::Free | Decision::Replace => {
                if let Some(w) = self.out.write.last_mut() {
                    *w = true;
                }
                if self.skip_damaged && !extent.is_empty() {
                    self.out.with_bytes.push((e.path.clone(), e.size));
                }
                push_range(&mut self.out.ranges, extent);
            }
            Decision::Keep => self.out.kept += 1,
            Decision::Conflict(why) => {
                self.report.fail(&e.path, why);
            }
        }
    }

    /// A selected hard link: linked in pass 2 when its file's first path
    /// is selected too; else it carries the file itself (or links to the
    /// first of its names that does), after pass 2.
    fn hardlink(&mut self, e: &Entry) {
        if self.parent(&e.path).is_none() {
            return;
        }
        if self.select.matches(&e.target) {
            if let Some(l) = self.out.link.last_mut() {
                *l = true;
            }
        } else {
            self.out.orphans.push((e.target.clone(), e.path.clone()));
        }
    }

    /// A selected symbolic link, FIFO or device node.
    fn object(&mut self, e: &Entry) {
        let Some(name) = self.parent(&e.path) else {
            return;
        };
        let at = self.dirs.top();
        match decide(self.mode, e, at, name) {
            Decision::Free => {}
            Decision::Replace => {
                if let Err(err) = remove_at(at, name) {
                    self.report.fail(
                        &e.path,
                        format!("what is there could not be removed: {err}"),
                    );
                    return;
                }
            }
            Decision::Keep => {
                self.out.kept += 1;
                return;
            }
            Decision::Conflict(why) => {
                self.report.fail(&e.path, why);
                return;
            }
        }
        let shown = self.target.join(relative_path(&e.path));
        let made = match e.kind {
            Kind::Symlink => {
                rustix::fs::symlinkat(e.target.as_slice(), at, name).map_err(io::Error::from)
            }
            _ => make_node_at(at, name, e),
        };
        match made {
            Err(err)
                if e.kind != Kind::Symlink && err.kind() == io::ErrorKind::PermissionDenied =>
            {
                self.report
                    .note("device node not created (not permitted)", &shown);
                return;
            }
            Err(err) => {
                self.report.fail(&e.path, err.to_string());
                return;
            }
            Ok(()) => {}
        }
        let report = self.report;
        if let Err(err) = set_metadata_at(e, at, name, &|what| report.note(what, &shown)) {
            self.report
                .fail(&e.path, format!("metadata not restored: {err}"));
        }
        match e.kind {
            Kind::Symlink => self.out.symlinks += 1,
            _ => self.out.nodes += 1,
        }
    }
}

/// Directory `path` was made by this restore: pass 3 sets the metadata
/// of its catalog entry (one with none gets mode 0755).
fn mark_created(
    ancestors: &[(Vec<u8>, usize)],
    out: &mut Planned,
    path: &[u8],
    fd: BorrowedFd<'_>,
) {
    match ancestors.iter().rev().find(|(p, _)| p == path) {
        Some(&(_, n)) => {
            if let Some(m) = out.dir_meta.get_mut(n) {
                *m = true;
            }
        }
        None => {
            let _ = rustix::fs::fchmod(fd, Mode::from_raw_mode(0o755));
        }
    }
}
