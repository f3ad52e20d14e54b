//! Backing up directory trees: a walk of the given paths feeds their files'
//! bytes, then the catalog, to the backup pipeline as one segmented stream.

use super::catalog::{CatalogWriter, Entry, Kind};
use super::catalog_path;
use crate::backup::{self, BackupOptions, Outcome, SegmentRead, Segments, Source};
use crate::error::{Error, Result};
use crate::repo::Repository;
use crate::snapshot::{TreeRef, CATALOG_VERSION};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::collections::HashSet;
use std::fs::{self, File, Metadata};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What to back up of the given paths.
#[derive(Clone, Debug, Default)]
pub struct TreeBackupOptions {
    /// Gitignore-style patterns of paths to leave out (`*.tmp`, `cache/`,
    /// `/home/ann/big`: a leading `/` anchors at the file-system root).
    pub excludes: Vec<String>,
    /// Do not descend into directories on other file systems.
    pub one_file_system: bool,
}

/// A committed tree backup and what it left out.
#[derive(Debug)]
pub struct TreeOutcome {
    /// The committed backup.
    pub outcome: Outcome,
    /// One line per object that could not be read (the backup is incomplete).
    pub warnings: Vec<String>,
    /// One line per object left out on purpose (FIFOs, sockets, devices).
    pub notes: Vec<String>,
}

/// The default source lineage of a backup of `paths`: the host name and the
/// absolute paths, e.g. `host:/home/ann,/etc`.
pub fn default_source(paths: &[PathBuf]) -> Result<String> {
    let host = fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let roots = roots(paths)?;
    let list: Vec<String> = roots.iter().map(|p| p.display().to_string()).collect();
    Ok(format!("{host}:{}", list.join(",")))
}

/// Backs up the directory trees (or files, or symbolic links) at `paths`
/// into `repo` (opened for a backup) as one tree backup.
///
/// Objects that cannot be read are left out with a warning each; a path
/// that does not exist fails the backup before anything is written.
pub fn backup_tree(
    repo: &Repository,
    paths: &[PathBuf],
    tree_options: &TreeBackupOptions,
    options: &BackupOptions,
) -> Result<TreeOutcome> {
    let roots = roots(paths)?;
    let mut excludes = GitignoreBuilder::new("/");
    for pattern in &tree_options.excludes {
        excludes
            .add_line(None, pattern)
            .map_err(|e| Error::InvalidConfig(format!("exclude pattern {pattern:?}: {e}")))?;
    }
    let excludes = excludes
        .build()
        .map_err(|e| Error::InvalidConfig(format!("exclude patterns: {e}")))?;
    let mut feed = TreeFeed {
        roots: roots.clone().into_iter(),
        excludes,
        one_file_system: tree_options.one_file_system,
        walk: None,
        recorded: HashSet::new(),
        state: State::Walking,
        catalog: CatalogWriter::default(),
        offset: 0,
        files: 0,
        warnings: Vec::new(),
        notes: Vec::new(),
        tree: TreeRef {
            catalog_version: CATALOG_VERSION,
            paths: roots.iter().map(|p| p.display().to_string()).collect(),
            ..TreeRef::default()
        },
    };
    let outcome = backup::run(repo, Source::Segments(&mut feed), options)?;
    Ok(TreeOutcome {
        outcome,
        warnings: feed.warnings,
        notes: feed.notes,
    })
}

/// The given paths made absolute (their parent directories resolved, the
/// paths themselves not followed), sorted, without those inside another.
fn roots(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut roots = Vec::with_capacity(paths.len());
    for path in paths {
        let input_err = |e| Error::Input {
            what: path.display().to_string(),
            source: e,
        };
        fs::symlink_metadata(path).map_err(input_err)?;
        let root = match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => {
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                fs::canonicalize(parent).map_err(input_err)?.join(name)
            }
            _ => fs::canonicalize(path).map_err(input_err)?,
        };
        roots.push(root);
    }
    roots.sort();
    let mut kept: Vec<PathBuf> = Vec::with_capacity(roots.len());
    for root in roots {
        if !kept.iter().any(|k| root.starts_with(k)) {
            kept.push(root);
        }
    }
    Ok(kept)
}

enum State {
    /// Between files: the next read walks on.
    Walking,
    /// Feeding a file's bytes; its entry is recorded when it ends.
    Reading {
        file: File,
        entry: Entry,
        path: PathBuf,
    },
    /// Feeding the catalog from `at`.
    Catalog {
        bytes: Vec<u8>,
        at: usize,
    },
    Done,
}

/// The segmented stream of a tree backup.
struct TreeFeed {
    roots: std::vec::IntoIter<PathBuf>,
    excludes: Gitignore,
    one_file_system: bool,
    walk: Option<ignore::Walk>,
    /// Parent directories of the roots already recorded.
    recorded: HashSet<PathBuf>,
    state: State,
    catalog: CatalogWriter,
    /// Bytes of files fed so far.
    offset: u64,
    files: u64,
    warnings: Vec<String>,
    notes: Vec<String>,
    tree: TreeRef,
}

impl TreeFeed {
    /// The next object of the walk, or `None` when every root is done.
    fn next_path(&mut self) -> Result<Option<std::result::Result<PathBuf, ignore::Error>>> {
        loop {
            if let Some(walk) = &mut self.walk {
                match walk.next() {
                    Some(Ok(entry)) => return Ok(Some(Ok(entry.into_path()))),
                    Some(Err(e)) => return Ok(Some(Err(e))),
                    None => self.walk = None,
                }
            }
            let Some(root) = self.roots.next() else {
                return Ok(None);
            };
            for parent in root
                .ancestors()
                .skip(1)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
            {
                if parent.parent().is_some() && self.recorded.insert(parent.to_path_buf()) {
                    match fs::symlink_metadata(parent) {
                        Ok(meta) => self.record(parent, &meta, Kind::Dir, Vec::new())?,
                        Err(e) => self.warn(parent, &e),
                    }
                }
            }
            let excludes = self.excludes.clone();
            let walk = ignore::WalkBuilder::new(&root)
                .standard_filters(false)
                .follow_links(false)
                .same_file_system(self.one_file_system)
                .sort_by_file_name(|a, b| a.cmp(b))
                .filter_entry(move |e| {
                    let is_dir = e.file_type().is_some_and(|t| t.is_dir());
                    !excludes
                        .matched_path_or_any_parents(e.path(), is_dir)
                        .is_ignore()
                })
                .build();
            self.walk = Some(walk);
        }
    }

    fn warn(&mut self, path: &Path, e: &dyn std::fmt::Display) {
        self.tree.skipped += 1;
        self.warnings
            .push(format!("{}: skipped: {e}", path.display()));
    }

    fn record(&mut self, path: &Path, meta: &Metadata, kind: Kind, target: Vec<u8>) -> Result<()> {
        self.catalog.push(&entry_of(path, meta, kind, target))
    }

    /// Walks on to the next regular file (recording everything before it),
    /// or to the catalog when the walk is done.
    fn advance(&mut self) -> Result<()> {
        while let Some(next) = self.next_path()? {
            let path = match next {
                Ok(p) => p,
                Err(e) => {
                    self.tree.skipped += 1;
                    self.warnings.push(format!("skipped: {e}"));
                    continue;
                }
            };
            let meta = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    self.warn(&path, &e);
                    continue;
                }
            };
            let t = meta.file_type();
            if t.is_dir() {
                self.record(&path, &meta, Kind::Dir, Vec::new())?;
            } else if t.is_symlink() {
                match fs::read_link(&path) {
                    Ok(target) => {
                        use std::os::unix::ffi::OsStrExt;
                        let target = target.as_os_str().as_bytes().to_vec();
                        self.record(&path, &meta, Kind::Symlink, target)?;
                    }
                    Err(e) => self.warn(&path, &e),
                }
            } else if t.is_file() {
                match File::open(&path) {
                    Ok(file) => {
                        let entry = entry_of(&path, &meta, Kind::File, Vec::new());
                        self.state = State::Reading { file, entry, path };
                        return Ok(());
                    }
                    Err(e) => self.warn(&path, &e),
                }
            } else {
                let what = if t.is_fifo() {
                    "FIFO"
                } else if t.is_socket() {
                    "socket"
                } else {
                    "device"
                };
                self.notes
                    .push(format!("{}: {what} not backed up", path.display()));
            }
        }
        self.tree.catalog_offset = self.offset;
        self.tree.files = self.files;
        self.tree.entries = self.catalog.count();
        let bytes = std::mem::take(&mut self.catalog).finish();
        self.tree.catalog_bytes = bytes.len() as u64;
        self.state = State::Catalog { bytes, at: 0 };
        Ok(())
    }
}

impl Segments for TreeFeed {
    fn read(&mut self, buf: &mut [u8]) -> Result<SegmentRead> {
        loop {
            match &mut self.state {
                State::Walking => self.advance()?,
                State::Reading { file, entry, path } => match file.read(buf) {
                    Ok(0) => {
                        let entry = entry.clone();
                        self.state = State::Walking;
                        self.files += 1;
                        self.catalog.push(&entry)?;
                        return Ok(SegmentRead::SegmentEnd);
                    }
                    Ok(n) => {
                        entry.size += n as u64;
                        self.offset += n as u64;
                        return Ok(SegmentRead::Data(n));
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        let mut gap = entry.clone();
                        let path = path.clone();
                        self.state = State::Walking;
                        self.warn(&path, &e);
                        if gap.size == 0 {
                            continue;
                        }
                        // Its bytes so far are in the stream: a gap accounts for them.
                        gap.kind = Kind::Gap;
                        self.catalog.push(&gap)?;
                        return Ok(SegmentRead::SegmentEnd);
                    }
                },
                State::Catalog { bytes, at } => {
                    if *at == bytes.len() {
                        self.state = State::Done;
                        continue;
                    }
                    let n = buf.len().min(bytes.len() - *at);
                    buf[..n].copy_from_slice(&bytes[*at..*at + n]);
                    *at += n;
                    return Ok(SegmentRead::Data(n));
                }
                State::Done => return Ok(SegmentRead::End),
            }
        }
    }

    fn tree(&mut self) -> Option<TreeRef> {
        Some(self.tree.clone())
    }
}

/// The catalog entry of `path` (not yet counting a file's bytes).
fn entry_of(path: &Path, meta: &Metadata, kind: Kind, target: Vec<u8>) -> Entry {
    Entry {
        path: catalog_path(path),
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime: meta.mtime(),
        mtime_ns: meta.mtime_nsec() as u32,
        ctime: meta.ctime(),
        ctime_ns: meta.ctime_nsec() as u32,
        dev: meta.dev(),
        ino: meta.ino(),
        size: 0,
        target,
    }
}
