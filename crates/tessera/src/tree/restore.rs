//! Restoring a tree backup into a directory: the catalog is read three
//! times as a stream — to create directories and symbolic links and find
//! the chunks of the selected files, to name the files while those chunks
//! are restored (and verified) in one pass, and to set the directories'
//! metadata once their contents exist.

use super::catalog::{Entry, Kind};
use super::relative_path;
use super::select::Selection;
use super::stream::{for_each_entry, tree_of};
use crate::error::{Error, Result};
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions, RestoreStats};
use crate::snapshot::{BackupId, ChunkRef};
use crossbeam_channel::{bounded, Receiver};
use filetime::FileTime;
use serde::Serialize;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::ops::Range;
use std::os::unix::fs::{fchown, lchown, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Options of a tree restore.
#[derive(Default)]
pub struct TreeRestoreOptions<'a> {
    /// Which paths to restore.
    pub selection: Selection,
    /// Restore into a directory that is not empty, replacing what is there.
    pub overwrite: bool,
    /// Cache and progress of the restore of the files' chunks.
    pub restore: RestoreOptions<'a>,
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
    /// Bytes of the files restored.
    pub bytes_restored: u64,
    /// Containers (lifecycle layout: objects) read, for the files and the catalog.
    pub containers_read: u64,
    /// Of which for reading the catalog (three passes).
    pub catalog_containers_read: u64,
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
        self.bytes_read += s.bytes_read;
    }
}

/// Restores the selected entries of tree backup `id` of `repo` below
/// `target` (created if missing; it must be empty unless `overwrite`), with
/// their modes, modification times and — when permitted (root) — owners.
/// Every chunk is verified before a byte of it is written; each file is
/// written beside its place and renamed into it when complete.
pub fn restore_tree(
    repo: &Repository,
    id: BackupId,
    target: &Path,
    options: &TreeRestoreOptions,
) -> Result<TreeRestoreStats> {
    let started = Instant::now();
    let tree = tree_of(repo, id)?;
    let recipe = repo.recipe(id)?;
    let n_chunks = recipe.chunks.len();
    prepare_target(target, options.overwrite)?;
    let mut stats = TreeRestoreStats {
        id,
        ..TreeRestoreStats::default()
    };
    let select = &options.selection;

    // Pass 1: directories, symbolic links, and the chunks of the files.
    let mut ranges: Vec<Range<usize>> = Vec::new();
    // The files with bytes, in order: (path, where restored, size).
    let mut with_bytes: Vec<(Vec<u8>, PathBuf, u64)> = Vec::new();
    let mut cursor = Cursor::new(&recipe.chunks, id);
    let s = for_each_entry(repo, id, &tree, n_chunks, |e| {
        let extent = if e.has_bytes() {
            Some(cursor.extent(e.size)?)
        } else {
            None
        };
        if e.kind == Kind::Gap || !select.matches(&e.path) {
            return Ok(true);
        }
        let dest = target.join(relative_path(&e.path));
        match e.kind {
            Kind::Dir => {
                fs::create_dir_all(&dest).map_err(out_err(&dest))?;
                stats.dirs += 1;
            }
            Kind::Symlink => {
                make_parent(&dest)?;
                restore_symlink(&e, &dest, options.overwrite)?;
                stats.symlinks += 1;
            }
            Kind::File => {
                make_parent(&dest)?;
                if options.restore.skip_damaged && extent.as_ref().is_some_and(|r| !r.is_empty()) {
                    with_bytes.push((e.path.clone(), dest.clone(), e.size));
                }
                if let Some(r) = extent {
                    push_range(&mut ranges, r);
                }
            }
            Kind::Gap => {}
        }
        Ok(true)
    })?;
    stats.add_catalog(&s);

    // Pass 2: the files' chunks, in one restore, cut into files as named by
    // a second reading of the catalog.
    let (tx, rx) = bounded::<Entry>(64);
    let tree = &tree;
    let data = std::thread::scope(|sc| -> Result<RestoreStats> {
        let names = sc.spawn(move || {
            for_each_entry(repo, id, tree, n_chunks, |e| {
                if e.kind == Kind::File && select.matches(&e.path) {
                    return Ok(tx.send(e).is_ok());
                }
                Ok(true)
            })
        });
        let mut files = Files {
            target,
            overwrite: options.overwrite,
            names: rx,
            open: None,
            files: 0,
        };
        let restored = restore_selection(repo, id, &ranges, &mut files, &options.restore)
            .and_then(|s| files.finish().map(|()| s));
        stats.files = files.files;
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

    // Pass 3: directories' metadata, now that their contents exist.
    // Every directory of the catalog that is there now was restored,
    // selected or as the parent of a selected entry.
    let s = for_each_entry(repo, id, tree, n_chunks, |e| {
        if e.kind == Kind::Dir {
            let dest = target.join(relative_path(&e.path));
            if fs::symlink_metadata(&dest).is_ok_and(|m| m.is_dir()) {
                set_metadata(&e, &dest, None)?;
            }
        }
        Ok(true)
    })?;
    stats.add_catalog(&s);
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// Salvage restore: removes each restored file (of `files`, in stream
/// order) that overlaps a `lost` range (written with zeros there), and
/// returns them.
fn drop_lost_files(
    files: &[(Vec<u8>, PathBuf, u64)],
    lost: &[crate::salvage::LostRange],
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
fn prepare_target(target: &Path, overwrite: bool) -> Result<()> {
    match fs::read_dir(target) {
        Ok(mut entries) => {
            if !overwrite && entries.next().is_some() {
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

fn restore_symlink(e: &Entry, dest: &Path, overwrite: bool) -> Result<()> {
    if occupied(dest) {
        if !overwrite {
            return Err(exists(dest));
        }
        fs::remove_file(dest).map_err(out_err(dest))?;
    }
    std::os::unix::fs::symlink(relative_path(&e.target), dest).map_err(out_err(dest))?;
    owner(e, dest, None)?;
    let mtime = FileTime::from_unix_time(e.mtime, e.mtime_ns);
    filetime::set_symlink_file_times(dest, mtime, mtime).map_err(out_err(dest))
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

/// Sets the owner of `dest` (or of the open `file` to be renamed to it)
/// when permitted (the restore runs as root).
fn owner(e: &Entry, dest: &Path, file: Option<&File>) -> Result<()> {
    let set = match file {
        Some(f) => fchown(f, Some(e.uid), Some(e.gid)),
        None => lchown(dest, Some(e.uid), Some(e.gid)),
    };
    match set {
        Err(err) if err.kind() == ErrorKind::PermissionDenied => Ok(()),
        r => r.map_err(out_err(dest)),
    }
}

/// Owner, mode and times of a directory, or of the open `file` to be renamed to `dest`.
fn set_metadata(e: &Entry, dest: &Path, file: Option<&File>) -> Result<()> {
    owner(e, dest, file)?;
    let mode = fs::Permissions::from_mode(e.mode);
    match file {
        Some(f) => f.set_permissions(mode),
        None => fs::set_permissions(dest, mode),
    }
    .map_err(out_err(dest))?;
    let mtime = FileTime::from_unix_time(e.mtime, e.mtime_ns);
    match file {
        Some(f) => filetime::set_file_handle_times(f, Some(mtime), Some(mtime)),
        None => filetime::set_file_times(dest, mtime, mtime),
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
}

/// The output of the files' restore: cuts the restored bytes into the
/// selected files, in catalog order, as named by `names`.
struct Files<'a> {
    target: &'a Path,
    overwrite: bool,
    names: Receiver<Entry>,
    open: Option<OpenFile>,
    files: u64,
}

impl Files<'_> {
    /// Opens the next file with bytes left to write, completing empty files on the way.
    fn next_file(&mut self) -> Result<Option<OpenFile>> {
        while let Ok(entry) = self.names.recv() {
            let f = self.create(entry)?;
            if f.left > 0 {
                return Ok(Some(f));
            }
            self.complete(f)?;
        }
        Ok(None)
    }

    fn create(&self, entry: Entry) -> Result<OpenFile> {
        let dest = self.target.join(relative_path(&entry.path));
        if !self.overwrite && occupied(&dest) {
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
            entry,
            dest,
            tmp,
            file,
        })
    }

    fn complete(&mut self, f: OpenFile) -> Result<()> {
        let done = set_metadata(&f.entry, &f.dest, Some(&f.file))
            .and_then(|()| f.file.sync_all().map_err(out_err(&f.dest)))
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
        if let Err(e) = f.file.write_all(&buf[..n]) {
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
