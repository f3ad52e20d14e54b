//! Restoring a tree backup into a directory: the catalog is read as a
//! stream several times — to create directories, symbolic links, FIFOs and
//! devices and find the chunks of the selected files, to name the files
//! (and hard links) while those chunks are restored (and verified) in one
//! pass, with `--delete` to remove what the backup does not hold, to set
//! the directories' metadata once their contents exist, and with
//! `--verify` to read the restored files back.

use super::catalog::{Entry, Kind};
use super::meta::{make_node, unsupported, write_file_xattrs, write_xattrs};
use super::select::Selection;
use super::stream::{for_each_entry, for_each_entry_in, scope_of, tree_of, Scope};
use super::{catalog_order, relative_path};
use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions, RestoreStats};
use crossbeam_channel::{bounded, Receiver};
use filetime::FileTime;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Read, Write};
use std::ops::Range;
use std::os::unix::fs::{fchown, lchown, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What a restore does with an object already at a restored path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overwrite {
    /// The target directory must be empty (or absent): nothing is replaced.
    #[default]
    Refuse,
    /// Replace what is there.
    Always,
    /// Replace a file unless it has the entry's size and modification
    /// time, and a symbolic link unless it has the entry's target.
    IfChanged,
    /// Keep what is there; restore only what is missing.
    Never,
}

/// Options of a tree restore.
#[derive(Default)]
pub struct TreeRestoreOptions<'a> {
    /// Which paths to restore.
    pub selection: Selection,
    /// What to do with objects already in the target directory.
    pub overwrite: Overwrite,
    /// Remove what is in the target directory, among the selected paths,
    /// but not in the backup.
    pub delete: bool,
    /// Read every restored file back and check each chunk's fingerprint.
    pub verify: bool,
    /// Cache and progress of the restore of the files' chunks.
    pub restore: RestoreOptions<'a>,
}

/// Metadata a restore could not apply, counted by kind (one line each, not one per object).
#[derive(Default)]
struct Notes(RefCell<BTreeMap<&'static str, (u64, PathBuf)>>);

impl Notes {
    fn add(&self, what: &'static str, path: &Path) {
        let mut m = self.0.borrow_mut();
        let e = m.entry(what).or_insert_with(|| (0, path.to_path_buf()));
        e.0 += 1;
    }

    fn lines(&self) -> Vec<String> {
        self.0
            .borrow()
            .iter()
            .map(|(what, (n, first))| format!("{what}: {n} object(s), e.g. {}", first.display()))
            .collect()
    }
}

/// Metrics of a tree restore.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TreeRestoreStats {
    /// The backup restored.
    pub id: BackupId,
    /// Directories restored.
    pub dirs: u64,
    /// Regular files restored.
    pub files: u64,
    /// Symbolic links restored.
    pub symlinks: u64,
    /// Hard links restored (paths linked to a file restored before).
    pub hardlinks: u64,
    /// FIFOs and device nodes restored.
    pub nodes: u64,
    /// Objects already there and kept (`--overwrite never|if-changed`).
    pub kept: u64,
    /// Objects removed because the backup does not hold them (`--delete`).
    pub deleted: u64,
    /// Files read back and checked (`--verify`).
    pub verified: u64,
    /// What could not be applied, one line per kind (e.g. owners when not root).
    pub notes: Vec<String>,
    /// Bytes of the files restored.
    pub bytes_restored: u64,
    /// Containers (lifecycle layout: objects) read, for the files and the catalog.
    pub containers_read: u64,
    /// Of which for reading the catalog (three passes) and its index.
    pub catalog_containers_read: u64,
    /// Ranged reads of containers (in other layouts: extents) for the catalog and its index.
    pub catalog_extents_read: u64,
    /// Bytes read from the backend.
    pub bytes_read: u64,
    /// Wall time.
    pub seconds: f64,
    /// Salvage restore (`skip_damaged`): files left out because some of
    /// their bytes are lost (empty when the backup is whole).
    pub lost_files: Vec<LostFile>,
}

/// A file a salvage restore left out: some of its chunks are missing or damaged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LostFile {
    /// The file's path as backed up.
    pub path: String,
    /// `missing` or `damaged` (of its first lost range).
    pub reason: String,
    /// The first error met.
    pub detail: String,
}

impl TreeRestoreStats {
    /// Counts the reads of a pass over the catalog.
    pub(super) fn add_catalog(&mut self, s: &RestoreStats) {
        self.containers_read += s.containers_read;
        self.catalog_containers_read += s.containers_read;
        self.catalog_extents_read += s.extents;
        self.bytes_read += s.bytes_read;
    }
}

/// Restores the selected entries of tree backup `id` of `repo` below
/// `target` (created if missing; it must be empty unless `overwrite` says
/// otherwise), with their modes, times, extended attributes, hard links
/// and — when permitted (root) — owners and device nodes. Every chunk is
/// verified before a byte of it is written; each file is written beside its
/// place and renamed into it when complete, and the file system is flushed
/// (`syncfs`) once at the end, before the restore reports success.
pub fn restore_tree(
    repo: &Repository,
    id: BackupId,
    target: &Path,
    options: &TreeRestoreOptions,
) -> Result<TreeRestoreStats> {
    let started = Instant::now();
    let tree = tree_of(repo, id)?;
    let recipe = repo.recipe(id)?;
    let chunks = &recipe.chunks[..];
    let mode = options.overwrite;
    prepare_target(target, mode)?;
    let mut stats = TreeRestoreStats {
        id,
        ..TreeRestoreStats::default()
    };
    let select = &options.selection;
    let notes = Notes::default();

    // Pass 1: directories, symbolic links, FIFOs and devices; which files
    // to write and their chunks.
    let mut ranges: Vec<Range<usize>> = Vec::new();
    // The files with bytes, in order: (path, where restored, size).
    let mut with_bytes: Vec<(Vec<u8>, PathBuf, u64)> = Vec::new();
    let mut write: Vec<bool> = Vec::new();
    // A single path (`--include home/ann/a.txt`): with an index, only the
    // catalog's regions that can hold it are read.
    let scope = scope_of(
        repo,
        id,
        &tree,
        chunks,
        &select.literal().unwrap_or_default(),
    )?;
    stats.add_catalog(&scope.index);
    let scope = &scope;
    let mut cursor = Cursor::at(&recipe.chunks, id, scope.data_offset)?;
    // The entries passes 2 and 3 need, while they fit in KEPT_BYTES (as
    // for a few files): the catalog is then read once, not three times.
    let mut kept = Some(Kept::default());
    let s = for_each_entry_in(repo, id, &tree, chunks, scope, |e| {
        let extent = if e.has_bytes() {
            Some(cursor.extent(e.size)?)
        } else {
            None
        };
        if e.kind == Kind::Dir {
            // Pass 3 sets the metadata of every directory there, selected or not.
            Kept::keep(&mut kept, &e, false);
        }
        if e.kind == Kind::Gap || !select.matches(&e.path) {
            return Ok(true);
        }
        if e.kind == Kind::Hardlink {
            Kept::keep(&mut kept, &e, true);
        }
        let dest = target.join(relative_path(&e.path));
        match e.kind {
            Kind::Dir => {
                fs::create_dir_all(&dest).map_err(out_err(&dest))?;
                stats.dirs += 1;
            }
            Kind::Symlink | Kind::Fifo | Kind::CharDevice | Kind::BlockDevice => {
                make_parent(&dest)?;
                if !replace(&e, &dest, mode)? {
                    stats.kept += 1;
                } else if e.kind == Kind::Symlink {
                    std::os::unix::fs::symlink(relative_path(&e.target), &dest)
                        .map_err(out_err(&dest))?;
                    set_metadata(&e, &dest, None, &notes)?;
                    stats.symlinks += 1;
                } else {
                    match make_node(&dest, e.kind, e.mode, e.rdev) {
                        Ok(()) => {
                            set_metadata(&e, &dest, None, &notes)?;
                            stats.nodes += 1;
                        }
                        Err(err) if err.kind() == ErrorKind::PermissionDenied => {
                            notes.add("device node not created (not permitted)", &dest)
                        }
                        Err(err) => return Err(out_err(&dest)(err)),
                    }
                }
            }
            Kind::File => {
                make_parent(&dest)?;
                let wanted = keep(&e, &dest, mode)?.is_none();
                write.push(wanted);
                if wanted {
                    Kept::keep(&mut kept, &e, true);
                }
                if !wanted {
                    stats.kept += 1;
                } else if let Some(r) = extent.filter(|r| !r.is_empty()) {
                    if options.restore.skip_damaged {
                        with_bytes.push((e.path.clone(), dest.clone(), e.size));
                    }
                    push_range(&mut ranges, r);
                }
            }
            Kind::Hardlink | Kind::Gap => {}
        }
        Ok(true)
    })?;
    stats.add_catalog(&s);

    // Pass 2: the files' chunks, in one restore, cut into files as named by
    // a second reading of the catalog; hard links made as they come.
    let (tx, rx) = bounded::<Entry>(64);
    let tree = &tree;
    let write = &write;
    let (kept_names, kept_dirs) = match kept {
        Some(k) => (Some(k.names), Some(k.dirs)),
        None => (None, None),
    };
    let data = std::thread::scope(|sc| -> Result<RestoreStats> {
        let names = sc.spawn(move || {
            if let Some(names) = kept_names {
                for e in names {
                    if tx.send(e).is_err() {
                        break;
                    }
                }
                return Ok(RestoreStats::default());
            }
            let mut file = 0usize;
            for_each_entry_in(repo, id, tree, chunks, scope, |e| {
                if !select.matches(&e.path) {
                    return Ok(true);
                }
                let send = match e.kind {
                    Kind::File => {
                        file += 1;
                        write.get(file - 1).copied().unwrap_or(false)
                    }
                    Kind::Hardlink => true,
                    _ => false,
                };
                Ok(!send || tx.send(e).is_ok())
            })
        });
        let mut files = Files {
            target,
            mode,
            select,
            names: rx,
            open: None,
            files: 0,
            hardlinks: 0,
            kept: 0,
            notes: &notes,
        };
        let restored = restore_selection(repo, id, &ranges, &mut files, &options.restore)
            .and_then(|s| files.finish().map(|()| s));
        stats.files = files.files;
        stats.hardlinks = files.hardlinks;
        stats.kept += files.kept;
        drop(files);
        let named = names
            .join()
            .map_err(|_| Error::Pipeline("catalog reader thread panicked".into()))?;
        let restored = restored?;
        stats.add_catalog(&named?);
        Ok(restored)
    })?;
    stats.lost_files = drop_lost_files(&with_bytes, &data.lost)?;
    stats.files -= stats.lost_files.len() as u64;
    stats.bytes_restored = data.bytes_restored;
    stats.containers_read += data.containers_read;
    stats.bytes_read += data.bytes_read;

    if options.delete {
        let (deleted, s) = delete_extra(repo, id, tree, chunks, target, select)?;
        stats.deleted = deleted;
        stats.add_catalog(&s);
    }

    // Pass 3: directories' metadata, now that their contents exist.
    // Every directory of the catalog that is there now was restored,
    // selected or as the parent of a selected entry.
    let set_dir = |e: &Entry| -> Result<bool> {
        if e.kind == Kind::Dir {
            let dest = target.join(relative_path(&e.path));
            if fs::symlink_metadata(&dest).is_ok_and(|m| m.is_dir()) {
                set_metadata(e, &dest, None, &notes)?;
            }
        }
        Ok(true)
    };
    match kept_dirs {
        Some(dirs) => {
            for e in &dirs {
                set_dir(e)?;
            }
        }
        None => {
            let s = for_each_entry_in(repo, id, tree, chunks, scope, |e| set_dir(&e))?;
            stats.add_catalog(&s);
        }
    }

    // One flush of the whole file system at the end, not one per file.
    sync_target(target)?;

    if options.verify {
        let (verified, s) = verify(
            repo,
            id,
            (tree, scope),
            &recipe.chunks,
            target,
            select,
            write,
        )?;
        stats.verified = verified;
        stats.add_catalog(&s);
    }
    stats.notes = notes.lines();
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// Bytes of catalog entries a restore keeps from its first reading of the
/// catalog at most (beyond, it reads the catalog again for each pass).
const KEPT_BYTES: usize = 16 << 20;

/// Catalog entries kept from the first pass: the selected files to write
/// and hard links (pass 2's names), and the directories (pass 3).
#[derive(Default)]
struct Kept {
    names: Vec<Entry>,
    dirs: Vec<Entry>,
    bytes: usize,
}

impl Kept {
    /// Keeps `e` (as a name of pass 2 if `name`, else as a directory), or
    /// gives up keeping when the entries outgrow [`KEPT_BYTES`].
    fn keep(kept: &mut Option<Kept>, e: &Entry, name: bool) {
        let Some(k) = kept else {
            return;
        };
        let xattrs: usize = e
            .xattrs
            .iter()
            .map(|x| x.name.len() + x.value.len() + 48)
            .sum();
        k.bytes += std::mem::size_of::<Entry>()
            + e.path.len()
            + e.target.len()
            + e.user.len()
            + e.group.len()
            + xattrs;
        if k.bytes > KEPT_BYTES {
            *kept = None;
        } else if name {
            k.names.push(e.clone());
        } else {
            k.dirs.push(e.clone());
        }
    }
}

/// Salvage restore: removes each restored file (of `files`, in stream
/// order) that overlaps a `lost` range (written with zeros there), and
/// returns them.
fn drop_lost_files(
    files: &[(Vec<u8>, PathBuf, u64)],
    lost: &[crate::restore::salvage::LostRange],
) -> Result<Vec<LostFile>> {
    let mut out = Vec::new();
    let mut start = 0u64;
    let mut ranges = lost.iter().peekable();
    for (path, dest, size) in files {
        let end = start + size;
        let mut first = None;
        while let Some(r) = ranges.peek() {
            if r.offset >= end {
                break;
            }
            if r.offset + r.len > start {
                first.get_or_insert((*r).clone());
            }
            if r.offset + r.len <= end {
                ranges.next();
            } else {
                break;
            }
        }
        if let Some(r) = first {
            match fs::remove_file(dest) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(out_err(dest)(e)),
            }
            out.push(LostFile {
                path: String::from_utf8_lossy(path).into_owned(),
                reason: r.reason,
                detail: r.detail,
            });
        }
        start = end;
    }
    Ok(out)
}

/// Whether the object at `dest` is kept rather than replaced by entry `e`
/// (`Some(())`), or `dest` is free to be written (`None`); fails when
/// something is there and the restore may not replace it.
fn keep(e: &Entry, dest: &Path, mode: Overwrite) -> Result<Option<()>> {
    let Ok(there) = fs::symlink_metadata(dest) else {
        return Ok(None);
    };
    let same = match e.kind {
        Kind::File => {
            there.is_file()
                && there.len() == e.size
                && (there.mtime(), there.mtime_nsec() as u32) == (e.mtime, e.mtime_ns)
        }
        Kind::Symlink => {
            fs::read_link(dest).is_ok_and(|t| t.as_os_str() == relative_path(&e.target).as_os_str())
        }
        _ => false,
    };
    match mode {
        Overwrite::Refuse => Err(exists(dest)),
        Overwrite::Always => Ok(None),
        Overwrite::IfChanged if same => Ok(Some(())),
        Overwrite::IfChanged => Ok(None),
        Overwrite::Never => Ok(Some(())),
    }
}

/// Clears `dest` for a symbolic link, FIFO or device (removing what is
/// there when `mode` allows); `false` if what is there is kept.
fn replace(e: &Entry, dest: &Path, mode: Overwrite) -> Result<bool> {
    if !occupied(dest) {
        return Ok(true);
    }
    if keep(e, dest, mode)?.is_some() {
        return Ok(false);
    }
    fs::remove_file(dest).map_err(out_err(dest))?;
    Ok(true)
}

/// Removes what is below `target` among the selected paths but not in the
/// backup's catalog: the directory is walked in catalog order (depth
/// first, names sorted by their bytes) beside a reading of the catalog.
fn delete_extra(
    repo: &Repository,
    id: BackupId,
    tree: &crate::format::snapshot::TreeRef,
    chunks: &[ChunkRef],
    target: &Path,
    select: &Selection,
) -> Result<(u64, RestoreStats)> {
    let (tx, rx) = bounded::<Vec<u8>>(256);
    std::thread::scope(|sc| {
        let reader = sc.spawn(move || {
            for_each_entry(repo, id, tree, chunks, |e| {
                Ok(e.kind == Kind::Gap || tx.send(e.path).is_ok())
            })
        });
        let mut merge = Merge { rx, next: None };
        let mut deleted = 0u64;
        let walked = walk_delete(target, target, select, &mut merge, &mut deleted);
        drop(merge);
        let read = reader
            .join()
            .map_err(|_| Error::Pipeline("catalog reader thread panicked".into()))?;
        walked?;
        let read = read.or_else(|e| match e {
            Error::Output { .. } => Ok(RestoreStats::default()),
            e => Err(e),
        })?;
        Ok((deleted, read))
    })
}

/// The catalog's paths, in order, matched against a walk.
struct Merge {
    rx: Receiver<Vec<u8>>,
    next: Option<Vec<u8>>,
}

impl Merge {
    /// Whether the catalog holds `path` (paths before it are passed).
    fn holds(&mut self, path: &[u8]) -> bool {
        loop {
            if self.next.is_none() {
                match self.rx.recv() {
                    Ok(p) => self.next = Some(p),
                    Err(_) => return false,
                }
            }
            let Some(next) = &self.next else {
                return false;
            };
            match catalog_order(next, path) {
                std::cmp::Ordering::Less => self.next = None,
                std::cmp::Ordering::Equal => return true,
                std::cmp::Ordering::Greater => return false,
            }
        }
    }
}

fn walk_delete(
    target: &Path,
    dir: &Path,
    select: &Selection,
    merge: &mut Merge,
    deleted: &mut u64,
) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut names: Vec<_> = fs::read_dir(dir)
        .map_err(out_err(dir))?
        .map(|d| d.map(|d| d.file_name()))
        .collect::<io::Result<_>>()
        .map_err(out_err(dir))?;
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        let path = dir.join(&name);
        let rel = path.strip_prefix(target).unwrap_or(&path);
        let rel = rel.as_os_str().as_bytes();
        let is_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if merge.holds(rel) {
            if is_dir {
                walk_delete(target, &path, select, merge, deleted)?;
            }
        } else if select.matches(rel) {
            if is_dir {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            }
            .map_err(out_err(&path))?;
            *deleted += 1;
        } else if is_dir {
            walk_delete(target, &path, select, merge, deleted)?;
        }
    }
    Ok(())
}

/// Reads every file written by this restore back and checks each of its
/// chunks against the recipe's fingerprint; the number of files checked
/// (those of the part `scope` of the catalog of `tree`).
fn verify(
    repo: &Repository,
    id: BackupId,
    (tree, scope): (&crate::format::snapshot::TreeRef, &Scope),
    chunks: &[ChunkRef],
    target: &Path,
    select: &Selection,
    write: &[bool],
) -> Result<(u64, RestoreStats)> {
    let mut cursor = Cursor::at(chunks, id, scope.data_offset)?;
    let fp = repo.fingerprinter();
    let mut file = 0usize;
    let mut verified = 0u64;
    let mut buf = Vec::new();
    let s = for_each_entry_in(repo, id, tree, chunks, scope, |e| {
        let extent = if e.has_bytes() {
            cursor.extent(e.size)?
        } else {
            0..0
        };
        if e.kind != Kind::File || !select.matches(&e.path) {
            return Ok(true);
        }
        file += 1;
        if !write.get(file - 1).copied().unwrap_or(false) {
            return Ok(true);
        }
        let dest = target.join(relative_path(&e.path));
        let mismatch = |what: String| Error::Output {
            what: dest.display().to_string(),
            source: io::Error::other(format!("verification failed: {what}")),
        };
        let mut f = File::open(&dest).map_err(out_err(&dest))?;
        for (i, c) in chunks[extent].iter().enumerate() {
            buf.resize(c.len as usize, 0);
            f.read_exact(&mut buf)
                .map_err(|e| mismatch(format!("chunk {i}: {e}")))?;
            if fp.hash(&buf) != c.fp {
                return Err(mismatch(format!("chunk {i} differs from the backup")));
            }
        }
        if f.read(&mut [0u8; 1]).map_err(out_err(&dest))? != 0 {
            return Err(mismatch("longer than in the backup".into()));
        }
        verified += 1;
        Ok(true)
    })?;
    Ok((verified, s))
}

/// Walks the recipe along the files' bytes: the chunks of each extent.
pub(super) struct Cursor<'a> {
    chunks: &'a [ChunkRef],
    index: usize,
    offset: u64,
    backup: BackupId,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of backup `backup`'s stream of `chunks`.
    pub(super) fn new(chunks: &'a [ChunkRef], backup: BackupId) -> Self {
        Cursor {
            chunks,
            index: 0,
            offset: 0,
            backup,
        }
    }

    /// A cursor at byte `offset` of backup `backup`'s stream of `chunks`
    /// (a chunk boundary: where a part of its catalog starts,
    /// [`crate::tree::stream::Scope`]).
    pub(super) fn at(chunks: &'a [ChunkRef], backup: BackupId, offset: u64) -> Result<Self> {
        let mut c = Cursor::new(chunks, backup);
        c.extent(offset)?;
        Ok(c)
    }

    /// The chunks of the next `size` bytes, which must start and end at chunk boundaries.
    pub(super) fn extent(&mut self, size: u64) -> Result<Range<usize>> {
        let start = self.index;
        let end_offset = self.offset + size;
        while self.offset < end_offset {
            let c = self.chunks.get(self.index).ok_or_else(|| self.corrupt())?;
            self.offset += u64::from(c.len);
            self.index += 1;
        }
        if self.offset != end_offset {
            return Err(self.corrupt());
        }
        Ok(start..self.index)
    }

    fn corrupt(&self) -> Error {
        Error::corrupt(
            format!("catalog of backup {}", self.backup),
            format!(
                "a file's extent does not end at a chunk boundary (byte {})",
                self.offset
            ),
        )
    }
}

/// Adds the chunks `r` to `ranges`, merged with the last range when adjacent.
pub(super) fn push_range(ranges: &mut Vec<Range<usize>>, r: Range<usize>) {
    if r.is_empty() {
        return;
    }
    match ranges.last_mut() {
        Some(last) if last.end == r.start => last.end = r.end,
        _ => ranges.push(r),
    }
}

fn out_err(path: &Path) -> impl Fn(io::Error) -> Error + '_ {
    move |e| Error::Output {
        what: path.display().to_string(),
        source: e,
    }
}

/// Creates `target` if missing; refuses one that is not an empty directory
/// unless `overwrite`.
fn prepare_target(target: &Path, mode: Overwrite) -> Result<()> {
    match fs::read_dir(target) {
        Ok(mut entries) => {
            if mode == Overwrite::Refuse && entries.next().is_some() {
                return Err(Error::Output {
                    what: target.display().to_string(),
                    source: io::Error::new(
                        ErrorKind::AlreadyExists,
                        "directory is not empty (--overwrite restores into it)",
                    ),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            fs::create_dir_all(target).map_err(out_err(target))
        }
        Err(e) => Err(out_err(target)(e)),
    }
}

/// Writes everything restored below `target` to stable storage (`syncfs`).
fn sync_target(target: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let dir = File::open(target).map_err(out_err(target))?;
    // SAFETY: `dir` is an open descriptor for the call's duration.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(out_err(target)(io::Error::last_os_error()));
    }
    Ok(())
}

fn make_parent(dest: &Path) -> Result<()> {
    match dest.parent() {
        Some(p) => fs::create_dir_all(p).map_err(out_err(p)),
        None => Ok(()),
    }
}

/// Whether something is at `dest` (not following a symbolic link).
fn occupied(dest: &Path) -> bool {
    fs::symlink_metadata(dest).is_ok()
}

fn exists(dest: &Path) -> Error {
    Error::Output {
        what: dest.display().to_string(),
        source: io::Error::new(
            ErrorKind::AlreadyExists,
            "already exists (--overwrite replaces it)",
        ),
    }
}

/// Owner (when permitted: the restore runs as root; else noted), extended
/// attributes (noted where the file system refuses them), mode and times of
/// the object at `dest` (not following a symbolic link), or of the open
/// `file` to be renamed to `dest`.
fn set_metadata(e: &Entry, dest: &Path, file: Option<&File>, notes: &Notes) -> Result<()> {
    let owned = match file {
        Some(f) => fchown(f, Some(e.uid), Some(e.gid)),
        None => lchown(dest, Some(e.uid), Some(e.gid)),
    };
    match owned {
        Err(err) if err.kind() == ErrorKind::PermissionDenied => {
            notes.add("owner not restored (not permitted: not root)", dest)
        }
        r => r.map_err(out_err(dest))?,
    }
    if !e.xattrs.is_empty() {
        let set = match file {
            Some(f) => write_file_xattrs(f, &e.xattrs),
            None => write_xattrs(dest, &e.xattrs),
        };
        match set {
            Err(err) if unsupported(&err) || err.kind() == ErrorKind::PermissionDenied => {
                notes.add("extended attributes not restored (refused here)", dest)
            }
            r => r.map_err(out_err(dest))?,
        }
    }
    let mtime = FileTime::from_unix_time(e.mtime, e.mtime_ns);
    let atime = FileTime::from_unix_time(e.atime, e.atime_ns);
    // A link's own mode cannot be set on Linux.
    if e.kind != Kind::Symlink {
        let mode = fs::Permissions::from_mode(e.mode);
        match file {
            Some(f) => f.set_permissions(mode),
            None => fs::set_permissions(dest, mode),
        }
        .map_err(out_err(dest))?;
    }
    // By path: `utimensat` without following a link (and without opening
    // the object, which would block on a FIFO).
    match file {
        Some(f) => filetime::set_file_handle_times(f, Some(atime), Some(mtime)),
        None => filetime::set_symlink_file_times(dest, atime, mtime),
    }
    .map_err(out_err(dest))
}

/// A file being written: its temporary path beside its place.
struct OpenFile {
    entry: Entry,
    dest: PathBuf,
    tmp: PathBuf,
    file: File,
    left: u64,
    /// Where the next bytes go (a sparse file skips blocks of zeros).
    at: u64,
}

/// Blocks of zeros a sparse file's restore leaves as holes.
const HOLE_BLOCK: u64 = 4096;

/// The output of the files' restore: cuts the restored bytes into the
/// selected files, in catalog order, as named by `names`.
struct Files<'a> {
    target: &'a Path,
    mode: Overwrite,
    select: &'a Selection,
    names: Receiver<Entry>,
    open: Option<OpenFile>,
    files: u64,
    hardlinks: u64,
    kept: u64,
    notes: &'a Notes,
}

impl Files<'_> {
    /// Opens the next file with bytes left to write, completing empty files on the way.
    fn next_file(&mut self) -> Result<Option<OpenFile>> {
        while let Ok(entry) = self.names.recv() {
            if entry.kind == Kind::Hardlink {
                self.link(&entry)?;
                continue;
            }
            let f = self.create(entry)?;
            if f.left > 0 {
                return Ok(Some(f));
            }
            self.complete(f)?;
        }
        Ok(None)
    }

    /// Links hard link `e` to its file, restored before it (in catalog order).
    fn link(&mut self, e: &Entry) -> Result<()> {
        let dest = self.target.join(relative_path(&e.path));
        let first = self.target.join(relative_path(&e.target));
        if !self.select.matches(&e.target) || !occupied(&first) {
            self.notes.add(
                "hard link not restored (its first path is not restored)",
                &dest,
            );
            return Ok(());
        }
        make_parent(&dest)?;
        if occupied(&dest) {
            let there = fs::symlink_metadata(&dest).map_err(out_err(&dest))?;
            let linked = fs::symlink_metadata(&first)
                .is_ok_and(|f| (f.dev(), f.ino()) == (there.dev(), there.ino()));
            if linked || keep(e, &dest, self.mode)?.is_some() {
                self.kept += 1;
                return Ok(());
            }
            fs::remove_file(&dest).map_err(out_err(&dest))?;
        }
        fs::hard_link(&first, &dest).map_err(out_err(&dest))?;
        self.hardlinks += 1;
        Ok(())
    }

    fn create(&self, entry: Entry) -> Result<OpenFile> {
        let dest = self.target.join(relative_path(&entry.path));
        if self.mode == Overwrite::Refuse && occupied(&dest) {
            return Err(exists(&dest));
        }
        let name = dest
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(&name);
        tmp_name.push(format!(".tessera-partial.{}", std::process::id()));
        let tmp = dest.with_file_name(tmp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(out_err(&dest))?;
        Ok(OpenFile {
            left: entry.size,
            at: 0,
            entry,
            dest,
            tmp,
            file,
        })
    }

    fn complete(&mut self, f: OpenFile) -> Result<()> {
        let done = (if f.entry.sparse {
            // Trailing holes.
            f.file.set_len(f.entry.size).map_err(out_err(&f.dest))
        } else {
            Ok(())
        })
        .and_then(|()| set_metadata(&f.entry, &f.dest, Some(&f.file), self.notes))
        .and_then(|()| fs::rename(&f.tmp, &f.dest).map_err(out_err(&f.dest)));
        if done.is_err() {
            let _ = fs::remove_file(&f.tmp);
        }
        self.files += 1;
        done
    }

    /// Completes the empty files after the last bytes; fails if bytes are missing.
    fn finish(&mut self) -> Result<()> {
        if let Some(f) = &self.open {
            return Err(short(&f.dest));
        }
        match self.next_file()? {
            Some(f) => {
                let dest = f.dest.clone();
                let _ = fs::remove_file(&f.tmp);
                Err(short(&dest))
            }
            None => Ok(()),
        }
    }

    fn write_some(&mut self, buf: &[u8]) -> Result<usize> {
        let mut f = match self.open.take() {
            Some(f) => f,
            None => self.next_file()?.ok_or_else(|| {
                Error::corrupt(
                    "catalog",
                    "the backup holds more file bytes than its catalog lists",
                )
            })?,
        };
        let n = (buf.len() as u64).min(f.left) as usize;
        if let Err(e) = write_at(&mut f, &buf[..n]) {
            let _ = fs::remove_file(&f.tmp);
            return Err(out_err(&f.dest)(e));
        }
        f.left -= n as u64;
        if f.left == 0 {
            self.complete(f)?;
        } else {
            self.open = Some(f);
        }
        Ok(n)
    }
}

/// Writes `bytes` at the file's position; a sparse file's aligned blocks of
/// zeros are skipped (left as holes).
fn write_at(f: &mut OpenFile, bytes: &[u8]) -> io::Result<()> {
    if !f.entry.sparse {
        f.file.write_all(bytes)?;
        f.at += bytes.len() as u64;
        return Ok(());
    }
    let mut rest = bytes;
    while !rest.is_empty() {
        let to_boundary = HOLE_BLOCK - f.at % HOLE_BLOCK;
        let n = (rest.len() as u64).min(to_boundary) as usize;
        let (piece, more) = rest.split_at(n);
        let whole_block = n as u64 == HOLE_BLOCK;
        if !(whole_block && piece.iter().all(|&b| b == 0)) {
            f.file.write_all_at(piece, f.at)?;
        }
        f.at += n as u64;
        rest = more;
    }
    Ok(())
}

fn short(dest: &Path) -> Error {
    Error::corrupt(
        "catalog",
        format!(
            "{}: fewer bytes in the backup than the catalog lists",
            dest.display()
        ),
    )
}

impl Drop for Files<'_> {
    fn drop(&mut self) {
        // A failed restore leaves no partial file.
        if let Some(f) = self.open.take() {
            let _ = fs::remove_file(&f.tmp);
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
