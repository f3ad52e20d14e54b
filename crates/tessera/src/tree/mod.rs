//! Directory trees: backing up, listing and restoring real file systems.
//!
//! A tree backup is one chunk stream — the bytes of its regular files, each
//! chunked on its own, then its [`catalog`] — so every layout and policy
//! handles it like any other backup (docs/FORMAT.md §24). The snapshot's
//! [`crate::snapshot::TreeRef`] says where the catalog starts.

pub mod backup;
pub mod catalog;
mod catalog_read;
pub mod diff;
pub mod dump;
pub mod find;
pub mod index;
pub mod list;
mod meta;
pub mod restore;
pub mod select;
pub mod stream;
pub mod tar;
mod walk;

pub use backup::{backup_tree, default_source, host_name, TreeBackupOptions, TreeOutcome};
pub use diff::{diff, Change, ChangeKind, DiffStats};
pub use dump::{dump, Dumped};
pub use find::{find, FindStats};
pub use list::list_tree;
pub use restore::{restore_tree, LostFile, Overwrite, TreeRestoreOptions, TreeRestoreStats};
pub use tar::{write_tar, TarScope};

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The catalog path of an absolute `path`: its bytes without the leading `/`.
pub(crate) fn catalog_path(path: &Path) -> Vec<u8> {
    let bytes = path.as_os_str().as_bytes();
    bytes.strip_prefix(b"/").unwrap_or(bytes).to_vec()
}

/// A catalog path as a relative path of the file system.
pub fn relative_path(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}
