//! Restoring a tree backup into a directory: the catalog is read as a
//! stream (or, while its entries fit in [`KEPT_BYTES`], once and kept) —
//! to check that every `--include` pattern matches, to create directories,
//! symbolic links, FIFOs and devices and find the chunks of the selected
//! files ([`entries`]), to name the files (and hard links)
//! while those chunks are restored (and verified) in one pass
//! ([`files`]), with `--delete` to remove what the backup
//! does not hold, to set the directories' metadata once their contents
//! exist, and with `--verify` to read the restored files back.
//!
//! Everything is written beneath the target by construction
//! ([`super::beneath`]); an entry that cannot be restored is reported
//! ([`TreeRestoreStats::failed`]) and the restore goes on.

mod entries;
mod files;
mod options;

use super::beneath::{remove_at, set_metadata_fd, Dirs, Root};
use super::catalog::{Entry, Kind};
use super::cursor::{split_path, Catalog, Cursor};
use super::select::Selection;
use super::stream::{for_each_entry, for_each_entry_in, scope_of, tree_of};
use super::{catalog_order, relative_path};
use crate::error::{Error, Result};
use crate::format::snapshot::BackupId;
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreStats};
use crossbeam_channel::{bounded, Receiver};
use entries::Plan;
use files::{restore_orphans, Files};
pub(super) use options::out_err;
use options::Report;
pub use options::{FailedEntry, LostFile, Overwrite, TreeRestoreOptions, TreeRestoreStats};
use rustix::fs::{FileType, OFlags};
use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, ErrorKind, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::Instant;

/// Restores the selected entries of tree backup `id` of `repo` below
/// `target` (created if missing), with their modes, times, extended
/// attributes, hard links and — when permitted (root) — owners and device
/// nodes. Every path is resolved beneath `target` without following a
/// symbolic link found there; what is in the way is replaced as
/// `overwrite` says, or reported. Missing ancestors of the selected
/// entries are created with the backup's metadata; existing ones are left
/// as they are. Every chunk is verified before a byte of it is written;
/// each file is written beside its place and renamed into it when complete,
/// and the file system is flushed (`syncfs`) once at the end. An entry that
/// cannot be restored is listed in [`TreeRestoreStats::failed`]; an
/// `--include` pattern that matches nothing fails the restore before it
/// writes anything.
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
    let select = &options.selection;
    let mut stats = TreeRestoreStats {
        id,
        ..TreeRestoreStats::default()
    };
    // A single path (`--include home/ann/a.txt`): with an index, only the
    // catalog's regions that can hold it are read.
    let literal = select.literal().unwrap_or_default();
    let scope = scope_of(repo, id, &tree, chunks, &literal)?;
    stats.add_catalog(&scope.index);
    let mut cat = Catalog {
        repo,
        id,
        tree: &tree,
        chunks,
        scope: &scope,
        kept: None,
    };
    if select.has_include() {
        let mut hits = vec![false; select.patterns()];
        let s = cat.read_keeping(|e| {
            if e.kind != Kind::Gap {
                select.hits(&e.path, &mut hits);
            }
            Ok(true)
        })?;
        stats.add_catalog(&s);
        no_match(id, select, &hits)?;
    }
    prepare_target(target)?;
    let root = Root::open(target).map_err(out_err(target))?;
    let report = Report::default();
    let mut plan = Plan::new(
        &root,
        target,
        options,
        &report,
        chunks,
        id,
        scope.data_offset,
    )?;
    // Pass 1: directories, symbolic links, FIFOs and devices; which files
    // to write and their chunks.
    let s = match select.has_include() {
        true => cat.each(|e| plan.visit(e))?,
        false => cat.read_keeping(|e| plan.visit(e))?,
    };
    stats.add_catalog(&s);
    let planned = plan.finish();
    stats.dirs = planned.dirs;
    stats.symlinks = planned.symlinks;
    stats.nodes = planned.nodes;
    stats.kept = planned.kept;

    // Pass 2: the files' chunks, in one restore, cut into files as named by
    // a second reading of the catalog; hard links made as they come.
    let (tx, rx) = bounded::<Entry>(64);
    let (write, link) = (&planned.write, &planned.link);
    let cat_ref = &cat;
    let data = std::thread::scope(|sc| -> Result<RestoreStats> {
        let names = sc.spawn(move || send_names(cat_ref, select, write, link, tx));
        let mut files = Files::new(&root, target, options.overwrite, rx, &report, false);
        let restored = restore_selection(repo, id, &planned.ranges, &mut files, &options.restore)
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
    stats.lost_files = drop_lost_files(&root, &planned.with_bytes, &data.lost, &report)?;
    stats.files -= stats.lost_files.len() as u64;
    stats.add_data(&data);

    // Hard links selected without their first path: the first restored
    // name carries the file's bytes, the others link to it.
    if !planned.orphans.is_empty() {
        let o = restore_orphans(&cat, &root, target, options, &report, &planned.orphans)?;
        stats.files += o.files;
        stats.hardlinks += o.hardlinks;
        stats.kept += o.kept;
        stats.add_catalog(&o.catalog);
        stats.add_data(&o.data);
    }

    if options.delete {
        let (deleted, s) = delete_extra(&cat, &root, select, &report)?;
        stats.deleted = deleted;
        stats.add_catalog(&s);
    }

    // Pass 3: directories' metadata, now that their contents exist.
    let s = set_dirs(&cat, &root, target, &planned.dir_meta, &report)?;
    stats.add_catalog(&s);

    // One flush of the whole file system at the end, not one per file.
    rustix::fs::syncfs(root.fd()).map_err(|e| out_err(target)(e.into()))?;

    if options.verify {
        let skip: HashSet<&str> = stats.lost_files.iter().map(|l| l.path.as_str()).collect();
        let (verified, s) = verify(&cat, &root, target, select, write, &report, &skip)?;
        stats.verified = verified;
        stats.add_catalog(&s);
    }
    stats.notes = report.lines();
    stats.failed = report.failed.take();
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// Fails with [`Error::NoMatch`] when an include pattern of `select`
/// matches no entry of tree backup `id` (one reading of the catalog, or of
/// the part that can hold the one literal pattern).
pub fn check_includes(repo: &Repository, id: BackupId, select: &Selection) -> Result<()> {
    if !select.has_include() {
        return Ok(());
    }
    let tree = tree_of(repo, id)?;
    let recipe = repo.recipe(id)?;
    let literal = select.literal().unwrap_or_default();
    let scope = scope_of(repo, id, &tree, &recipe.chunks, &literal)?;
    let mut hits = vec![false; select.patterns()];
    for_each_entry_in(repo, id, &tree, &recipe.chunks, &scope, |e| {
        if e.kind != Kind::Gap {
            select.hits(&e.path, &mut hits);
        }
        Ok(hits.contains(&false))
    })?;
    no_match(id, select, &hits)
}

/// [`Error::NoMatch`] for the first include pattern not marked in `hits`.
fn no_match(id: BackupId, select: &Selection, hits: &[bool]) -> Result<()> {
    match select.unmatched(hits).first() {
        Some(p) => Err(Error::NoMatch {
            backup: id,
            pattern: p.to_string(),
            hint: select.hint(p),
        }),
        None => Ok(()),
    }
}

/// Sends pass 2 its names: the selected files to write (`write`, by
/// selected file) and hard links to make (`link`, by selected hard link).
fn send_names(
    cat: &Catalog,
    select: &Selection,
    write: &[bool],
    link: &[bool],
    tx: crossbeam_channel::Sender<Entry>,
) -> Result<RestoreStats> {
    let (mut file, mut hardlink) = (0usize, 0usize);
    cat.each(|e| {
        if e.kind == Kind::Gap || !select.matches(&e.path) {
            return Ok(true);
        }
        let send = match e.kind {
            Kind::File => {
                file += 1;
                write.get(file - 1).copied().unwrap_or(false)
            }
            Kind::Hardlink => {
                hardlink += 1;
                link.get(hardlink - 1).copied().unwrap_or(false)
            }
            _ => false,
        };
        Ok(!send || tx.send(e.clone()).is_ok())
    })
}

/// Pass 3: the metadata of the directories marked in `dir_meta` (by
/// directory of the catalog's part, in order), each set when the restore
/// leaves it — after what is below it, so that a read-only directory is
/// set last.
fn set_dirs(
    cat: &Catalog,
    root: &Root,
    target: &Path,
    dir_meta: &[bool],
    report: &Report,
) -> Result<RestoreStats> {
    let mut dirs: Dirs<Option<Entry>> = Dirs::new(root);
    let mut apply = |fd: BorrowedFd<'_>, e: Option<Entry>| {
        let Some(e) = e else {
            return;
        };
        let shown = target.join(relative_path(&e.path));
        if let Err(err) = set_metadata_fd(&e, fd, &|what| report.note(what, &shown)) {
            report.fail(&e.path, format!("metadata not restored: {err}"));
        }
    };
    let mut dir = 0usize;
    let s = cat.each(|e| {
        if e.kind != Kind::Dir {
            return Ok(true);
        }
        dir += 1;
        if !dir_meta.get(dir - 1).copied().unwrap_or(false) {
            return Ok(true);
        }
        match dirs.open(&e.path, false, &mut |_, _| {}, &mut apply) {
            Ok(_) => dirs.set_top(Some(e.clone())),
            Err(b) => {
                report.fail(&e.path[..b.prefix], b.reason);
            }
        }
        Ok(true)
    })?;
    dirs.finish(&mut apply);
    Ok(s)
}

/// Salvage restore: removes each restored file (of `files`, in stream
/// order: catalog path and size) that overlaps a `lost` range (written
/// with zeros there), and returns them.
fn drop_lost_files(
    root: &Root,
    files: &[(Vec<u8>, u64)],
    lost: &[crate::restore::salvage::LostRange],
    report: &Report,
) -> Result<Vec<LostFile>> {
    let mut out = Vec::new();
    let mut start = 0u64;
    let mut ranges = lost.iter().peekable();
    for (path, size) in files {
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
            if !report.has_failed(path) {
                unlink_beneath(root, path).map_err(|e| Error::Output {
                    what: format!("/{}", String::from_utf8_lossy(path)),
                    source: e,
                })?;
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

/// Removes the file at catalog path `path` below `root` (nothing there is fine).
fn unlink_beneath(root: &Root, path: &[u8]) -> io::Result<()> {
    let (dir, name) = split_path(path);
    let fd = root.open_path(dir, OFlags::RDONLY | OFlags::DIRECTORY)?;
    match rustix::fs::unlinkat(&fd, name, rustix::fs::AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes what is below the target among the selected paths but not in
/// the backup's catalog: the directory is walked in catalog order (depth
/// first, names sorted by their bytes) beside a reading of the catalog,
/// by descriptors, never through a symbolic link.
fn delete_extra(
    cat: &Catalog,
    root: &Root,
    select: &Selection,
    report: &Report,
) -> Result<(u64, RestoreStats)> {
    let (tx, rx) = bounded::<Vec<u8>>(256);
    let (repo, id, tree, chunks) = (cat.repo, cat.id, cat.tree, cat.chunks);
    std::thread::scope(|sc| {
        let reader = sc.spawn(move || {
            for_each_entry(repo, id, tree, chunks, |e| {
                Ok(e.kind == Kind::Gap || tx.send(e.path).is_ok())
            })
        });
        let mut merge = Merge { rx, next: None };
        let mut deleted = 0u64;
        let mut walk = DeleteWalk {
            select,
            merge: &mut merge,
            deleted: &mut deleted,
            report,
        };
        walk.dir(root.fd(), &mut Vec::new());
        drop(merge);
        let read = reader
            .join()
            .map_err(|_| Error::Pipeline("catalog reader thread panicked".into()))?;
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

/// The walk of `--delete`.
struct DeleteWalk<'a> {
    select: &'a Selection,
    merge: &'a mut Merge,
    deleted: &'a mut u64,
    report: &'a Report,
}

impl DeleteWalk<'_> {
    /// Walks the open directory `dir` at catalog path `rel`.
    fn dir(&mut self, dir: BorrowedFd<'_>, rel: &mut Vec<u8>) {
        let names = match list_dir(dir) {
            Ok(n) => n,
            Err(e) => {
                self.report
                    .fail(rel, format!("not listed for --delete: {e}"));
                return;
            }
        };
        for name in names {
            let len = rel.len();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(&name);
            let is_dir =
                super::beneath::kind_at(dir, &name).is_ok_and(|k| k == Some(FileType::Directory));
            if self.merge.holds(rel) {
                if is_dir {
                    self.descend(dir, &name, rel);
                }
            } else if self.select.matches(rel) {
                match remove_at(dir, &name) {
                    Ok(()) => *self.deleted += 1,
                    Err(e) => {
                        self.report.fail(rel, format!("not deleted: {e}"));
                    }
                }
            } else if is_dir {
                self.descend(dir, &name, rel);
            }
            rel.truncate(len);
        }
    }

    fn descend(&mut self, dir: BorrowedFd<'_>, name: &[u8], rel: &mut Vec<u8>) {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(dir, name, flags, rustix::fs::Mode::empty()) {
            Ok(sub) => self.dir(sub.as_fd(), rel),
            Err(e) => {
                self.report
                    .fail(rel, format!("not walked for --delete: {e}"));
            }
        }
    }
}

/// The names in directory `dir`, sorted by their bytes.
fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for d in rustix::fs::Dir::read_from(dir)? {
        let n = d?.file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            names.push(n);
        }
    }
    names.sort();
    Ok(names)
}

/// Reads every file written by this restore back (those of `write`, by
/// selected file, that did not fail, nor were `lost`) and checks each of its
/// chunks against the recipe's fingerprint; the number of files checked.
fn verify(
    cat: &Catalog,
    root: &Root,
    target: &Path,
    select: &Selection,
    write: &[bool],
    report: &Report,
    lost: &HashSet<&str>,
) -> Result<(u64, RestoreStats)> {
    let chunks = cat.chunks;
    let mut cursor = Cursor::at(chunks, cat.id, cat.scope.data_offset)?;
    let fp = cat.repo.fingerprinter();
    let mut file = 0usize;
    let mut verified = 0u64;
    let mut buf = Vec::new();
    let s = cat.each(|e| {
        let extent = if e.has_bytes() {
            cursor.extent(e.size)?
        } else {
            0..0
        };
        if e.kind != Kind::File || !select.matches(&e.path) {
            return Ok(true);
        }
        file += 1;
        let skip = report.has_failed(&e.path) || lost.contains(&*String::from_utf8_lossy(&e.path));
        if !write.get(file - 1).copied().unwrap_or(false) || skip {
            return Ok(true);
        }
        let dest = target.join(relative_path(&e.path));
        let mismatch = |what: String| Error::Output {
            what: dest.display().to_string(),
            source: io::Error::other(format!("verification failed: {what}")),
        };
        let fd = root
            .open_path(&e.path, OFlags::RDONLY)
            .map_err(out_err(&dest))?;
        let mut f = File::from(fd);
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

/// Creates `target` if missing; refuses one that is not a directory.
fn prepare_target(target: &Path) -> Result<()> {
    match fs::metadata(target) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::Output {
            what: target.display().to_string(),
            source: io::Error::new(ErrorKind::AlreadyExists, "not a directory"),
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            fs::create_dir_all(target).map_err(out_err(target))
        }
        Err(e) => Err(out_err(target)(e)),
    }
}
