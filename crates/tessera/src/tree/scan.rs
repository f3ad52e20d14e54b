//! The bytes a tree backup will read, counted by a walk of its own beside
//! the backup (restic's scanner), so that a progress bar can show a
//! percentage and an estimated time long before the backup's walk, which
//! runs only a few batches ahead of its stream, reaches the end.
//!
//! The scan walks what the backup walks — the same roots, exclude options,
//! links followed or not, file systems crossed or not — and sums the sizes
//! of the regular files the backup would store: those within
//! `--exclude-larger-than`, a file of several links once. Objects it
//! cannot read are skipped: the backup reports them.

use super::walk::{Excludes, Walk, Walked};
use crate::backup::tree::roots;
use crate::backup::TreeBackupOptions;
use crate::error::Result;
use rustix::fs::FileType;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// Sums the sizes of the regular files a tree backup of `paths` with
/// `options` reads; `None` if `stop` was set before the walk ended (the
/// backup finished first), or for a backup of standard input (no tree:
/// its size is not known beforehand).
pub fn scan(
    paths: &[PathBuf],
    options: &TreeBackupOptions,
    stop: &AtomicBool,
) -> Result<Option<u64>> {
    if options.stdin_name.is_some() {
        return Ok(None);
    }
    let excludes = Excludes::new(
        &options.excludes,
        &options.iexcludes,
        &options.exclude_if_present,
        options.exclude_caches,
    )?;
    let mut walk = Walk::new(excludes, options.follow_symlinks, options.one_file_system);
    let mut total = Total {
        bytes: 0,
        larger_than: options.exclude_larger_than,
        linked: HashSet::new(),
    };
    for root in roots(paths)? {
        total.add(walk.start(&root));
        while let Some(walked) = walk.next() {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            total.add(walked);
        }
    }
    Ok(Some(total.bytes))
}

/// The count of a scan.
struct Total {
    bytes: u64,
    larger_than: Option<u64>,
    /// Device and inode of the files of several links counted.
    linked: HashSet<(u64, u64)>,
}

impl Total {
    fn add(&mut self, walked: Walked) {
        let Ok(found) = walked else {
            return;
        };
        let s = &found.status;
        let counted = s.file_type() == FileType::RegularFile
            && self.larger_than.is_none_or(|max| s.size <= max)
            && (s.nlink <= 1 || self.linked.insert((s.dev, s.ino)));
        if counted {
            self.bytes += s.size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn counts_what_the_backup_reads() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        fs::create_dir_all(root.join("sub/skipped")).unwrap();
        fs::write(root.join("a"), vec![1; 1000]).unwrap();
        fs::write(root.join("sub/b"), vec![2; 300]).unwrap();
        fs::write(root.join("sub/big"), vec![3; 5000]).unwrap();
        fs::write(root.join("sub/skipped/c"), vec![4; 77]).unwrap();
        fs::hard_link(root.join("a"), root.join("a2")).unwrap();
        std::os::unix::fs::symlink("a", root.join("link")).unwrap();
        let stop = AtomicBool::new(false);
        let all = TreeBackupOptions::default();
        let one = std::slice::from_ref(&root);
        assert_eq!(scan(one, &all, &stop).unwrap(), Some(6377));
        let some = TreeBackupOptions {
            excludes: vec!["skipped".into()],
            exclude_larger_than: Some(4096),
            ..TreeBackupOptions::default()
        };
        assert_eq!(scan(one, &some, &stop).unwrap(), Some(1300));
        // A root inside another counts once; a file root counts itself.
        let nested = [root.clone(), root.join("sub")];
        assert_eq!(scan(&nested, &all, &stop).unwrap(), Some(6377));
        assert_eq!(scan(&[root.join("sub/b")], &all, &stop).unwrap(), Some(300));
        stop.store(true, Ordering::Relaxed);
        assert_eq!(scan(&[root], &all, &stop).unwrap(), None);
        assert!(scan(&[dir.path().join("absent")], &all, &stop).is_err());
        let stdin = TreeBackupOptions {
            stdin_name: Some("x".into()),
            ..TreeBackupOptions::default()
        };
        assert_eq!(scan(&[], &stdin, &AtomicBool::new(false)).unwrap(), None);
    }
}
