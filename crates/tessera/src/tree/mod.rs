//! Directory trees: backing up, listing and restoring real file systems.
//!
//! A tree backup is one chunk stream — the bytes of its regular files, each
//! chunked on its own, then its [`catalog`] — so every layout and policy
//! handles it like any other backup (docs/FORMAT.md §24). The snapshot's
//! [`crate::format::snapshot::TreeRef`] says where the catalog starts.

mod beneath;
pub mod catalog;
mod cursor;
pub mod diff;
pub mod dump;
pub mod find;
pub mod index;
pub mod list;
pub(crate) mod meta;
pub mod record;
pub mod restore;
pub mod scan;
pub mod select;
pub mod stream;
pub mod tar;
pub(crate) mod walk;
pub mod zipfile;

pub use diff::{diff, Change, ChangeKind, DiffStats};
pub use dump::{dump, Dumped};
pub use find::{find, FindStats};
pub use list::list_tree;
pub use record::{shown_path, ChangeRecord, EntryRecord};
pub use restore::{
    restore_tree, FailedEntry, LostFile, Overwrite, TreeRestoreOptions, TreeRestoreStats,
};
pub use tar::{write_tar, TarScope};
pub use zipfile::write_zip;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The catalog path of an absolute `path`: its bytes without the leading `/`.
pub(crate) fn catalog_path(path: &Path) -> Vec<u8> {
    let bytes = path.as_os_str().as_bytes();
    bytes.strip_prefix(b"/").unwrap_or(bytes).to_vec()
}

/// The catalog's order of two catalog paths (FORMAT.md §24.2: component
/// by component, each by its bytes) — `Path`'s order of the same relative
/// paths, computed on the bytes: at the first difference, `/` (the end of
/// a component) sorts before any other byte.
pub(crate) fn catalog_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let key = |c: u8| if c == b'/' { 0 } else { u16::from(c) + 1 };
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => key(a[i]).cmp(&key(b[i])),
        None => a.len().cmp(&b.len()),
    }
}

/// A catalog path as a relative path of the file system.
pub fn relative_path(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The byte comparison orders catalog paths as `Path` does.
        #[test]
        fn catalog_order_is_the_order_of_paths(
            a in proptest::collection::vec("[a./-]{1,3}", 1..4),
            b in proptest::collection::vec("[a./-]{1,3}", 1..4),
        ) {
            let clean = |v: &Vec<String>| {
                // Catalog paths have no empty, `.` or `..` components.
                let names: Vec<String> = v
                    .iter()
                    .map(|c| c.replace('/', ""))
                    .filter(|c| !c.is_empty() && c != "." && c != "..")
                    .collect();
                names.join("/")
            };
            let (a, b) = (clean(&a), clean(&b));
            prop_assert_eq!(
                catalog_order(a.as_bytes(), b.as_bytes()),
                relative_path(a.as_bytes()).cmp(relative_path(b.as_bytes()))
            );
        }
    }
}
