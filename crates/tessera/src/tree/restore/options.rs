//! What a tree restore is asked (options) and what it reports (statistics,
//! failed entries).

use crate::error::Error;
use crate::format::snapshot::BackupId;
use crate::restore::{RestoreOptions, RestoreStats};
use crate::tree::select::Selection;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

/// What a restore does with an object already at a restored path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overwrite {
    /// Replace nothing: each object in the way is reported (a directory
    /// where the backup has one is merged into, left as it is).
    #[default]
    Refuse,
    /// Replace what is there (the backup's kind wins: a directory in the
    /// way of a file is removed with its contents).
    Always,
    /// Replace a file unless it has the entry's size and modification
    /// time, and a symbolic link unless it has the entry's target.
    IfChanged,
    /// Keep what is there; restore only what is missing.
    Never,
}

impl Overwrite {
    /// Whether this mode replaces objects in the way (and restores the
    /// metadata of directories that were there).
    pub(in crate::tree) fn replaces(self) -> bool {
        matches!(self, Overwrite::Always | Overwrite::IfChanged)
    }
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

/// An entry a restore could not restore, reported while the restore goes on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedEntry {
    /// The entry's path as `ls` shows it (`/home/ann/a.txt`), or the
    /// directory on the way that could not be used.
    pub path: String,
    /// Why.
    pub reason: String,
    /// Selected entries below it not restored because of it.
    pub below: u64,
}

/// What a restore reports besides its counts: metadata it could not apply,
/// counted by kind (one line each, not one per object), and the entries it
/// could not restore.
#[derive(Default)]
pub(in crate::tree) struct Report {
    notes: RefCell<BTreeMap<&'static str, (u64, PathBuf)>>,
    pub(in crate::tree) failed: RefCell<Vec<FailedEntry>>,
    /// The catalog paths of the failed entries (files among them are not verified).
    failed_paths: RefCell<HashSet<Vec<u8>>>,
}

impl Report {
    /// Notes metadata `what` not applied to the object shown as `path`.
    pub(in crate::tree) fn note(&self, what: &'static str, path: &Path) {
        let mut m = self.notes.borrow_mut();
        let e = m.entry(what).or_insert_with(|| (0, path.to_path_buf()));
        e.0 += 1;
    }

    /// Reports that the entry (or directory) at catalog path `path` could
    /// not be restored; returns its number, for [`Report::below`].
    pub(in crate::tree) fn fail(&self, path: &[u8], reason: impl Into<String>) -> usize {
        self.failed_paths.borrow_mut().insert(path.to_vec());
        let mut f = self.failed.borrow_mut();
        f.push(FailedEntry {
            path: format!("/{}", String::from_utf8_lossy(path)),
            reason: reason.into(),
            below: 0,
        });
        f.len() - 1
    }

    /// Counts one more entry below failed entry `n`, not restored with it.
    pub(in crate::tree) fn below(&self, n: usize) {
        if let Some(f) = self.failed.borrow_mut().get_mut(n) {
            f.below += 1;
        }
    }

    /// Whether the entry at catalog path `path` was reported as not restored.
    pub(in crate::tree) fn has_failed(&self, path: &[u8]) -> bool {
        self.failed_paths.borrow().contains(path)
    }

    pub(in crate::tree) fn lines(&self) -> Vec<String> {
        self.notes
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
    /// Entries that could not be restored (each with the entries below it
    /// left out with it); the restore went on with the others.
    pub failed: Vec<FailedEntry>,
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
    pub(in crate::tree) fn add_catalog(&mut self, s: &RestoreStats) {
        self.containers_read += s.containers_read;
        self.catalog_containers_read += s.containers_read;
        self.catalog_extents_read += s.extents;
        self.bytes_read += s.bytes_read;
    }

    /// Counts the reads of a restore of files' chunks.
    pub(in crate::tree) fn add_data(&mut self, s: &RestoreStats) {
        self.bytes_restored += s.bytes_restored;
        self.containers_read += s.containers_read;
        self.bytes_read += s.bytes_read;
    }
}

pub(in crate::tree) fn out_err(path: &Path) -> impl Fn(io::Error) -> Error + '_ {
    move |e| Error::Output {
        what: path.display().to_string(),
        source: e,
    }
}
