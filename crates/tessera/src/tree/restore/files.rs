//! Pass 2 of a tree restore: the restored bytes cut into the selected
//! files, in catalog order, each written to a temporary file beside its
//! place (created, never reused) and renamed into place only when
//! complete, with its metadata; hard links made as they come. Everything
//! through directory descriptors beneath the target ([`crate::tree::beneath`]).
//! A file that cannot be created or written is reported, its bytes
//! skipped, and the restore goes on.

use super::entries::{decide, in_the_way, Decision};
use super::options::TreeRestoreOptions;
use super::options::{Overwrite, Report};
use crate::error::{Error, Result};
use crate::restore::{restore_selection, RestoreStats};
use crate::tree::beneath::{a_kind, remove_at, set_metadata_fd, stat_at, Dirs, Root};
use crate::tree::catalog::{Entry, Kind};
use crate::tree::cursor::{push_range, split_path, Catalog, Cursor};
use crate::tree::relative_path;
use crate::tree::stream::{for_each_entry_in, scope_of, Scope};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Blocks of zeros a sparse file's restore leaves as holes.
const HOLE_BLOCK: u64 = 4096;

/// A file being written: its directory, temporary name and file (none
/// when it failed: its bytes are skipped).
struct OpenFile {
    entry: Entry,
    out: Option<(OwnedFd, Vec<u8>, File)>,
    left: u64,
    /// Where the next bytes go (a sparse file skips blocks of zeros).
    at: u64,
}

/// The output of the files' restore: cuts the restored bytes into the
/// selected files, in catalog order, as named by `names`.
pub(super) struct Files<'a> {
    dirs: Dirs<'a>,
    target: &'a Path,
    mode: Overwrite,
    names: crossbeam_channel::Receiver<Entry>,
    open: Option<OpenFile>,
    pub(super) files: u64,
    pub(super) hardlinks: u64,
    pub(super) kept: u64,
    report: &'a Report,
    /// Whether what is at a file's place is to be checked here (pass 1
    /// did not: the hard links restored by other names).
    check: bool,
    /// Temporary files made.
    made: u64,
}

impl<'a> Files<'a> {
    pub(super) fn new(
        root: &'a Root,
        target: &'a Path,
        mode: Overwrite,
        names: crossbeam_channel::Receiver<Entry>,
        report: &'a Report,
        check: bool,
    ) -> Self {
        Files {
            dirs: Dirs::new(root),
            target,
            mode,
            names,
            open: None,
            files: 0,
            hardlinks: 0,
            kept: 0,
            report,
            check,
            made: 0,
        }
    }

    /// Opens the next file with bytes left to write, completing empty files on the way.
    fn next_file(&mut self) -> Option<OpenFile> {
        while let Ok(entry) = self.names.recv() {
            if entry.kind == Kind::Hardlink {
                self.link(&entry);
                continue;
            }
            let f = self.create(entry);
            if f.left > 0 {
                return Some(f);
            }
            self.complete(f);
        }
        None
    }

    /// Links hard link `e` to its file (`e.target`), restored before it.
    fn link(&mut self, e: &Entry) {
        if let Err(why) = self.try_link(e) {
            self.report.fail(&e.path, why);
        }
    }

    fn try_link(&mut self, e: &Entry) -> Result<(), String> {
        let (dir, name) = split_path(&e.path);
        let at = self
            .dirs
            .open(dir, false, &mut |_, _| {}, &mut |_, _| {})
            .map_err(|b| b.reason)?
            .try_clone_to_owned()
            .map_err(|err| err.to_string())?;
        let there = stat_at(at.as_fd(), name).map_err(|err| err.to_string())?;
        if let Some(st) = &there {
            match self.mode {
                Overwrite::Never => {
                    self.kept += 1;
                    return Ok(());
                }
                Overwrite::Refuse => {
                    return Err(in_the_way(FileType::from_raw_mode(st.st_mode), self.mode))
                }
                Overwrite::Always | Overwrite::IfChanged => {}
            }
        }
        let not_there = |why: String| {
            format!(
                "its file /{} is not restored: {why}",
                String::from_utf8_lossy(&e.target)
            )
        };
        if self.report.has_failed(&e.target) {
            return Err(not_there("it could not be restored".into()));
        }
        let (first_dir, first_name) = split_path(&e.target);
        let first_dir = self
            .dirs
            .root()
            .open_path(first_dir, OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(|err| not_there(err.to_string()))?;
        let first = stat_at(first_dir.as_fd(), first_name)
            .map_err(|err| not_there(err.to_string()))?
            .ok_or_else(|| not_there("not there".into()))?;
        let kind = FileType::from_raw_mode(first.st_mode);
        if kind != FileType::RegularFile {
            return Err(not_there(format!("{} is there", a_kind(kind))));
        }
        if let Some(st) = there {
            if (st.st_dev, st.st_ino) == (first.st_dev, first.st_ino) {
                self.kept += 1;
                return Ok(());
            }
            let t = a_kind(FileType::from_raw_mode(st.st_mode));
            remove_at(at.as_fd(), name)
                .map_err(|err| format!("{t} is there and could not be removed: {err}"))?;
        }
        rustix::fs::linkat(first_dir.as_fd(), first_name, &at, name, AtFlags::empty())
            .map_err(|err| io::Error::from(err).to_string())?;
        self.hardlinks += 1;
        Ok(())
    }

    /// Creates the temporary file of `entry` beside its place (or, when it
    /// cannot be written, one whose bytes are skipped).
    fn create(&mut self, entry: Entry) -> OpenFile {
        let left = entry.size;
        match self.open_tmp(&entry) {
            Ok(out) => OpenFile {
                entry,
                out,
                left,
                at: 0,
            },
            Err(why) => {
                self.report.fail(&entry.path, why);
                OpenFile {
                    entry,
                    out: None,
                    left,
                    at: 0,
                }
            }
        }
    }

    /// The directory, temporary name and file for `entry`; `None` when it
    /// is not written (kept, with `check`).
    fn open_tmp(&mut self, entry: &Entry) -> Result<Option<(OwnedFd, Vec<u8>, File)>, String> {
        let (dir, name) = split_path(&entry.path);
        let at = self
            .dirs
            .open(dir, false, &mut |_, _| {}, &mut |_, _| {})
            .map_err(|b| b.reason)?;
        if self.check {
            match decide(self.mode, entry, at, name) {
                Decision::Free | Decision::Replace => {}
                Decision::Keep => {
                    self.kept += 1;
                    return Ok(None);
                }
                Decision::Conflict(why) => return Err(why),
            }
        }
        let dir = at.try_clone_to_owned().map_err(|e| e.to_string())?;
        self.made += 1;
        let tmp = format!(".tessera-partial.{}.{}", std::process::id(), self.made).into_bytes();
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&dir, tmp.as_slice(), flags, Mode::from_raw_mode(0o600))
            .map_err(|e| io::Error::from(e).to_string())?;
        Ok(Some((dir, tmp, File::from(fd))))
    }

    /// Gives the written file its metadata and moves it into place.
    fn complete(&mut self, f: OpenFile) {
        let Some((dir, tmp, file)) = f.out else {
            return;
        };
        let (_, name) = split_path(&f.entry.path);
        let shown = self.target.join(relative_path(&f.entry.path));
        let report = self.report;
        let done = (|| -> io::Result<()> {
            if f.entry.sparse {
                // Trailing holes.
                file.set_len(f.entry.size)?;
            }
            set_metadata_fd(&f.entry, file.as_fd(), &|what| report.note(what, &shown))?;
            drop(file);
            self.place(dir.as_fd(), &tmp, name)
        })();
        match done {
            Ok(()) => self.files += 1,
            Err(err) => {
                let _ = rustix::fs::unlinkat(&dir, tmp.as_slice(), AtFlags::empty());
                self.report.fail(&f.entry.path, err.to_string());
            }
        }
    }

    /// Renames `tmp` to `name` in `dir`: over what is there when the mode
    /// replaces (a directory removed first), else only if nothing is there.
    fn place(&self, dir: BorrowedFd<'_>, tmp: &[u8], name: &[u8]) -> io::Result<()> {
        if !self.mode.replaces() {
            let appeared = || {
                io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "appeared during the restore (--overwrite replaces it)",
                )
            };
            return match rustix::fs::renameat_with(dir, tmp, dir, name, RenameFlags::NOREPLACE) {
                Ok(()) => Ok(()),
                Err(Errno::EXIST) => Err(appeared()),
                // A file system without RENAME_NOREPLACE: a link fails as well.
                Err(Errno::INVAL | Errno::NOSYS) => {
                    match rustix::fs::linkat(dir, tmp, dir, name, AtFlags::empty()) {
                        Err(Errno::EXIST) => return Err(appeared()),
                        r => r?,
                    }
                    Ok(rustix::fs::unlinkat(dir, tmp, AtFlags::empty())?)
                }
                Err(e) => Err(e.into()),
            };
        }
        match rustix::fs::renameat(dir, tmp, dir, name) {
            Ok(()) => Ok(()),
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                remove_at(dir, name)?;
                Ok(rustix::fs::renameat(dir, tmp, dir, name)?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Fails if bytes the catalog lists are missing; completes the empty
    /// files after the last bytes.
    pub(super) fn finish(&mut self) -> Result<()> {
        if let Some(f) = &self.open {
            return Err(short(&f.entry.path));
        }
        match self.next_file() {
            Some(f) => {
                let path = f.entry.path.clone();
                drop_tmp(f);
                Err(short(&path))
            }
            None => Ok(()),
        }
    }

    fn write_some(&mut self, buf: &[u8]) -> Result<usize> {
        let mut f = match self.open.take() {
            Some(f) => f,
            None => self.next_file().ok_or_else(|| {
                Error::corrupt(
                    "catalog",
                    "the backup holds more file bytes than its catalog lists",
                )
            })?,
        };
        let n = (buf.len() as u64).min(f.left) as usize;
        if let Some((dir, tmp, file)) = &mut f.out {
            if let Err(e) = write_at(file, &mut f.at, f.entry.sparse, &buf[..n]) {
                let _ = rustix::fs::unlinkat(&*dir, tmp.as_slice(), AtFlags::empty());
                self.report.fail(&f.entry.path, e.to_string());
                f.out = None;
            }
        }
        f.left -= n as u64;
        if f.left == 0 {
            self.complete(f);
        } else {
            self.open = Some(f);
        }
        Ok(n)
    }
}

/// Removes the temporary file of `f`.
fn drop_tmp(f: OpenFile) {
    if let Some((dir, tmp, _)) = f.out {
        let _ = rustix::fs::unlinkat(&dir, tmp.as_slice(), AtFlags::empty());
    }
}

/// Writes `bytes` at `at` in `file`; a sparse file's aligned blocks of
/// zeros are skipped (left as holes).
fn write_at(file: &mut File, at: &mut u64, sparse: bool, bytes: &[u8]) -> io::Result<()> {
    if !sparse {
        file.write_all(bytes)?;
        *at += bytes.len() as u64;
        return Ok(());
    }
    let mut rest = bytes;
    while !rest.is_empty() {
        let to_boundary = HOLE_BLOCK - *at % HOLE_BLOCK;
        let n = (rest.len() as u64).min(to_boundary) as usize;
        let (piece, more) = rest.split_at(n);
        let whole_block = n as u64 == HOLE_BLOCK;
        if !(whole_block && piece.iter().all(|&b| b == 0)) {
            file.write_all_at(piece, *at)?;
        }
        *at += n as u64;
        rest = more;
    }
    Ok(())
}

fn short(path: &[u8]) -> Error {
    Error::corrupt(
        "catalog",
        format!(
            "/{}: fewer bytes in the backup than the catalog lists",
            String::from_utf8_lossy(path)
        ),
    )
}

impl Drop for Files<'_> {
    fn drop(&mut self) {
        // A failed restore leaves no partial file.
        if let Some(f) = self.open.take() {
            drop_tmp(f);
        }
    }
}

impl Write for Files<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_some(buf).map_err(io::Error::other)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the restore of hard links by other names did.
#[derive(Default)]
pub(super) struct Orphans {
    pub(super) files: u64,
    pub(super) hardlinks: u64,
    pub(super) kept: u64,
    pub(super) catalog: RestoreStats,
    pub(super) data: RestoreStats,
}

/// Restores the hard links selected without their file's first path
/// (`orphans`: that path, the link's): the first selected name of each
/// file carries its bytes, the others link to it. The files' entries and
/// chunks are found in one more reading of the catalog (of the part that
/// holds the one file, with an index).
pub(super) fn restore_orphans(
    cat: &Catalog,
    root: &Root,
    target: &Path,
    options: &TreeRestoreOptions,
    report: &Report,
    orphans: &[(Vec<u8>, Vec<u8>)],
) -> Result<Orphans> {
    let mut groups: BTreeMap<&[u8], Vec<&[u8]>> = BTreeMap::new();
    for (first, link) in orphans {
        groups.entry(first).or_default().push(link);
    }
    let (repo, id, tree, chunks) = (cat.repo, cat.id, cat.tree, cat.chunks);
    let scope = match groups.keys().next() {
        Some(only) if groups.len() == 1 => scope_of(repo, id, tree, chunks, only)?,
        _ => Scope::default(),
    };
    let mut out = Orphans {
        catalog: scope.index.clone(),
        ..Orphans::default()
    };
    let mut cursor = Cursor::at(chunks, id, scope.data_offset)?;
    let mut found: Vec<(Entry, Range<usize>)> = Vec::new();
    let s = for_each_entry_in(repo, id, tree, chunks, &scope, |e| {
        let extent = match e.has_bytes() {
            true => cursor.extent(e.size)?,
            false => 0..0,
        };
        if e.kind == Kind::File && groups.contains_key(e.path.as_slice()) {
            found.push((e, extent));
        }
        Ok(true)
    })?;
    out.catalog.containers_read += s.containers_read;
    out.catalog.extents += s.extents;
    out.catalog.bytes_read += s.bytes_read;
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut ranges = Vec::new();
    for (e, extent) in found {
        let Some(links) = groups.remove(e.path.as_slice()) else {
            continue;
        };
        let carrier = links[0].to_vec();
        let _ = tx.send(Entry {
            path: carrier.clone(),
            ..e
        });
        for l in &links[1..] {
            let _ = tx.send(Entry {
                path: l.to_vec(),
                kind: Kind::Hardlink,
                target: carrier.clone(),
                ..Entry::default()
            });
        }
        push_range(&mut ranges, extent);
    }
    drop(tx);
    for (first, links) in groups {
        for l in links {
            let why = format!(
                "its file /{} is not in the backup",
                String::from_utf8_lossy(first)
            );
            report.fail(l, why);
        }
    }
    let mut files = Files::new(root, target, options.overwrite, rx, report, true);
    let data = restore_selection(repo, id, &ranges, &mut files, &options.restore)
        .and_then(|s| files.finish().map(|()| s))?;
    out.files = files.files;
    out.hardlinks = files.hardlinks;
    out.kept = files.kept;
    out.data = data;
    Ok(out)
}
