//! Where a restore writes, decided by what is at its output path: a restore
//! never replaces a device node, FIFO, socket, symbolic link or directory,
//! and replaces a regular file only when asked to.
//!
//! - absent: a new regular file, written to a temporary file beside it,
//!   synced and renamed into place only when complete;
//! - a character or block device, FIFO or socket: opened and written in
//!   place, as a stream (a failed restore may have written a prefix);
//! - a regular file: refused, unless [`ExistingFile::Replace`]; then
//!   replaced like a new file, so a failed restore leaves it as it was;
//! - a directory (or a path ending in `/`): refused;
//! - a symbolic link: followed, under the rules of what it points to (a
//!   dangling link gets a new file where it points); the link itself stays.

use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// What a restore may do with a regular file already at its output path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExistingFile {
    /// Refuse to restore (the default).
    #[default]
    Refuse,
    /// Replace the file once the whole backup restored and verified.
    Replace,
}

/// Why a directory is no restore output.
const ONE_FILE: &str =
    "a backup restores into one file, not into a directory (directory-tree restores are not supported)";

/// Links followed before an output path is taken as a loop.
const MAX_LINKS: usize = 40;

/// How a restore writes its output.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A regular file at this path (links resolved), written to a
    /// temporary file beside it and renamed over it when complete.
    File(PathBuf),
    /// A device, FIFO or socket, opened and written in place.
    Stream,
}

/// Decides how a restore to `path` writes, refusing what it must not replace.
pub(crate) fn target(path: &Path, existing: ExistingFile) -> Result<Target> {
    let refuse = |reason: &str| Error::OutputRefused {
        path: path.display().to_string(),
        reason: reason.into(),
    };
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
        return Err(refuse(&format!(
            "ends in `/`, naming a directory: {ONE_FILE}"
        )));
    }
    // `metadata` follows links, including /proc's links to open pipes.
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Target::File(resolve(path)?));
        }
        Err(e) => return Err(output_error(path, e)),
    };
    if meta.is_dir() {
        Err(refuse(&format!("is a directory: {ONE_FILE}")))
    } else if !meta.is_file() {
        Ok(Target::Stream)
    } else if existing == ExistingFile::Replace {
        Ok(Target::File(resolve(path)?))
    } else {
        Err(refuse("exists: pass --overwrite to replace it"))
    }
}

/// Runs `write` with the output at `path`, by what is there (see
/// [`target`]): a new or (with [`ExistingFile::Replace`]) existing regular
/// file is written to a temporary file beside it (created, never reused),
/// synced, then moved to `path` — renamed over the old file when `existing`
/// allows replacing it, else linked, which fails rather than replace a file
/// that appeared at `path` meanwhile — and the directory synced; so a
/// failed `write` leaves no partial output and the old file intact. A
/// device, FIFO or socket is written in place; a directory, or an existing
/// file without `Replace`, is refused before `write` runs.
pub fn write_to_path<T>(
    path: &Path,
    existing: ExistingFile,
    write: impl FnOnce(&mut dyn Write) -> Result<T>,
) -> Result<T> {
    match target(path, existing)? {
        Target::Stream => {
            let file = open_stream(path)?;
            let mut writer = BufWriter::with_capacity(1 << 20, file);
            let done = write(&mut writer)?;
            writer.flush().map_err(|e| output_error(path, e))?;
            Ok(done)
        }
        Target::File(file) => write_new_file(&file, existing, write),
    }
}

/// [`write_to_path`] for a regular file.
fn write_new_file<T>(
    path: &Path,
    existing: ExistingFile,
    write: impl FnOnce(&mut dyn Write) -> Result<T>,
) -> Result<T> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "restore".into());
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    let tmp = dir.join(format!(".{name}.tessera-partial.{}", std::process::id()));
    let out_err = |e| output_error(path, e);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(out_err)?;
    let mut writer = BufWriter::with_capacity(1 << 20, file);
    let result = write(&mut writer).and_then(|done| {
        let file = writer.into_inner().map_err(|e| out_err(e.into_error()))?;
        file.sync_all().map_err(out_err)?;
        drop(file);
        match existing {
            ExistingFile::Replace => fs::rename(&tmp, path).map_err(out_err)?,
            ExistingFile::Refuse => {
                fs::hard_link(&tmp, path).map_err(|e| match e.kind() {
                    std::io::ErrorKind::AlreadyExists => Error::OutputRefused {
                        path: path.display().to_string(),
                        reason: "appeared during the restore: pass --overwrite to replace it"
                            .into(),
                    },
                    _ => out_err(e),
                })?;
                fs::remove_file(&tmp).map_err(out_err)?;
            }
        }
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(out_err)?;
        Ok(done)
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Opens a device, FIFO or socket target for writing, in place.
pub(crate) fn open_stream(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| output_error(path, e))
}

/// `path` with every symbolic link of its last component followed (the
/// last target may not exist yet).
fn resolve(path: &Path) -> Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = fs::read_link(&p).map_err(|e| output_error(path, e))?;
                p = match p.parent() {
                    Some(dir) => dir.join(to),
                    None => to,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(Error::OutputRefused {
        path: path.display().to_string(),
        reason: format!("more than {MAX_LINKS} symbolic links to follow"),
    })
}

/// An I/O error writing the output `path`.
pub(crate) fn output_error(path: &Path, source: io::Error) -> Error {
    Error::Output {
        what: path.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decides_by_what_is_at_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let new = d.join("new");
        assert_eq!(
            target(&new, ExistingFile::Refuse).unwrap(),
            Target::File(new.clone())
        );
        fs::write(&new, b"old").unwrap();
        assert!(matches!(
            target(&new, ExistingFile::Refuse),
            Err(Error::OutputRefused { .. })
        ));
        assert_eq!(
            target(&new, ExistingFile::Replace).unwrap(),
            Target::File(new.clone())
        );
        for existing in [ExistingFile::Refuse, ExistingFile::Replace] {
            assert!(matches!(
                target(d, existing),
                Err(Error::OutputRefused { .. })
            ));
            assert!(matches!(
                target(Path::new("/dev/null"), existing),
                Ok(Target::Stream)
            ));
        }
        assert!(matches!(
            target(&d.join("absent/"), ExistingFile::Replace),
            Err(Error::OutputRefused { .. })
        ));
    }

    #[test]
    fn follows_links_to_their_last_target() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::os::unix::fs::symlink("b", d.join("a")).unwrap();
        std::os::unix::fs::symlink(d.join("c"), d.join("b")).unwrap();
        assert_eq!(
            target(&d.join("a"), ExistingFile::Refuse).unwrap(),
            Target::File(d.join("c"))
        );
        std::os::unix::fs::symlink("loop", d.join("loop")).unwrap();
        assert!(matches!(
            target(&d.join("loop"), ExistingFile::Refuse),
            Err(Error::Output { .. } | Error::OutputRefused { .. })
        ));
    }
}
