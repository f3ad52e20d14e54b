//! Private files: every file and directory Tessera creates in a local
//! repository (and in the local metadata cache) is its owner's alone —
//! files `0600`, directories `0700` — whatever the process's umask, as
//! restic's local backend does. Key files hold the master key wrapped with
//! a password: readable by others, they could be attacked offline.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every file created.
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory created.
pub const DIR_MODE: u32 = 0o700;
/// Permission bits that let users other than the owner read.
const OTHERS_READ: u32 = 0o044;

/// Creates the new file `path` (failing if it exists), open for writing,
/// with mode [`FILE_MODE`]: set again after creation, as a umask can only
/// clear bits the owner needs (`0600` under umask `0277` would be `0400`).
pub fn create_new_file(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)?;
    f.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
    Ok(f)
}

/// Creates `dir` and its missing ancestors with mode [`DIR_MODE`]
/// (existing directories are left as they are). Returns whether it
/// created any.
pub fn create_dirs(dir: &Path) -> io::Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dirs(parent)?;
    }
    match fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => {}
        // Created meanwhile by another process: as good.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(false),
        Err(e) => return Err(e),
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))?;
    Ok(true)
}

/// Whether the file at `path` can be read by users other than its owner
/// (its group or everybody).
pub fn readable_by_others(path: &Path) -> io::Result<bool> {
    Ok(fs::metadata(path)?.permissions().mode() & OTHERS_READ != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn files_and_directories_are_the_owners_alone() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/c");
        assert!(create_dirs(&dir).unwrap());
        assert!(!create_dirs(&dir).unwrap());
        for d in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&root.path().join(d)), DIR_MODE, "{d}");
        }
        let file = dir.join("f");
        drop(create_new_file(&file).unwrap());
        assert_eq!(mode(&file), FILE_MODE);
        assert!(!readable_by_others(&file).unwrap());
        assert!(
            create_new_file(&file).is_err(),
            "an existing file is never replaced"
        );
        fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(readable_by_others(&file).unwrap());
    }

    #[test]
    fn existing_directories_keep_their_mode() {
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(create_dirs(&shared.join("new")).unwrap());
        assert_eq!(mode(&shared), 0o755);
        assert_eq!(mode(&shared.join("new")), DIR_MODE);
    }
}
