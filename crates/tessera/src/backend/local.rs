//! A repository in a local directory.

use super::{private, Hints, LockGuard, LockMode, Locks, ObjectStore, WriteMode, CONFIG_KEY};
use crate::error::{Error, Result};
use bytes::Bytes;
use memmap2::Mmap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Objects of at least this many bytes are written with direct I/O where
/// the file system supports it.
const DIRECT_MIN: usize = 256 * 1024;
/// Alignment direct I/O needs of memory, file offsets and lengths.
const DIRECT_ALIGN: usize = 4096;

/// Numbers the temporary files of this process's writes: unique across
/// every [`Local`] of the process, so that two handles on one repository
/// never share a temporary file.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Objects as files below a root directory. Writes go to a temporary file
/// that is synced and renamed into place, then the directory is synced.
pub struct Local {
    root: PathBuf,
}

impl Local {
    /// Writes `key` atomically and durably: `fill` writes a new temporary
    /// file (named in its errors by the path it is given), which is synced
    /// and moved into place — renamed over any old object
    /// ([`WriteMode::Replace`]), or linked, which fails with
    /// [`Error::ObjectExists`] if `key` exists ([`WriteMode::CreateNew`]) —
    /// then the directory is synced.
    fn write_atomic(
        &self,
        key: &str,
        mode: WriteMode,
        fill: &mut dyn FnMut(&mut File, &Path) -> Result<()>,
    ) -> Result<()> {
        let path = self.path(key)?;
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        let io_err = |e| Error::io(format!("writing {}", path.display()), e);
        // New directories are the owner's alone (`0700`), as every file (`0600`).
        if private::create_dirs(&dir).map_err(io_err)? {
            // Make the new directory's entry durable too.
            if let Some(parent) = dir.parent() {
                sync_dir(parent).map_err(io_err)?;
            }
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".tmp.{name}.{}.{n}", std::process::id()));
        let mut f = private::create_new_file(&tmp).map_err(io_err)?;
        let result = fill(&mut f, &tmp).and_then(|()| {
            f.sync_all().map_err(io_err)?;
            drop(f);
            move_into_place(&tmp, &path, mode).map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => Error::ObjectExists(key.to_string()),
                _ => io_err(e),
            })?;
            sync_dir(&dir).map_err(io_err)
        });
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// A backend rooted at `root` (which need not exist yet).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Local { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        super::check_key(key)?;
        Ok(self.root.join(key))
    }

    fn not_found_or(&self, key: &str, what: &str, e: io::Error) -> Error {
        if e.kind() == io::ErrorKind::NotFound {
            Error::NotFound(key.to_string())
        } else {
            Error::io(format!("{what} {}", self.root.join(key).display()), e)
        }
    }
}

/// Writes all of `parts` with as few system calls as the OS allows.
fn write_all_vectored(f: &mut File, parts: &[&[u8]]) -> io::Result<()> {
    // Empty parts would make a write of nothing look like a failed one.
    let mut slices: Vec<io::IoSlice> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| io::IoSlice::new(p))
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        // The OS takes at most IOV_MAX (1024) slices per call.
        let take = rest.len().min(1024);
        let n = f.write_vectored(&rest[..take])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"));
        }
        io::IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// Writes `parts` in order into the new, empty file `f` at `path`. Runs
/// that start aligned in memory and in the file go with direct I/O, which
/// spares the kernel copying them into the page cache (a large share of a
/// backup's CPU time); the rest, and everything on a file system without
/// direct I/O, the ordinary way.
fn write_parts_to(f: &mut File, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let aligned =
        |p: &[u8]| (p.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) && p.len() >= DIRECT_ALIGN;
    let mut direct = match total >= DIRECT_MIN && parts.iter().any(|p| aligned(p)) {
        true => open_direct(path),
        false => None,
    };
    if direct.is_none() {
        return write_all_vectored(f, parts);
    }
    let mut offset = 0u64;
    for part in parts {
        let mut rest: &[u8] = part;
        if let Some(d) = &direct {
            if offset.is_multiple_of(DIRECT_ALIGN as u64) && aligned(rest) {
                let n = rest.len() / DIRECT_ALIGN * DIRECT_ALIGN;
                match d.write_all_at(&rest[..n], offset) {
                    Ok(()) => {
                        offset += n as u64;
                        rest = &rest[n..];
                    }
                    // Alignment this device does not accept: write ordinarily from here on.
                    Err(e) if e.kind() == io::ErrorKind::InvalidInput => direct = None,
                    Err(e) => return Err(e),
                }
            }
        }
        f.write_all_at(rest, offset)?;
        offset += rest.len() as u64;
    }
    Ok(())
}

/// A second, direct-I/O handle on the file at `path`, if the file system allows it.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Direct I/O is used on Linux only.
#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}

/// Starts the kernel's readahead of the whole file `f` (Linux; elsewhere nothing).
#[cfg(target_os = "linux")]
fn start_readahead(f: &File, len: u64) {
    use std::os::unix::io::AsRawFd;
    let len = libc::off_t::try_from(len).unwrap_or(libc::off_t::MAX);
    // SAFETY: the descriptor stays open for the call, and posix_fadvise only
    // advises the kernel: it reads or writes none of our memory. A failure
    // only means no readahead.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, len, libc::POSIX_FADV_WILLNEED);
    }
}

/// Readahead hints are used on Linux only.
#[cfg(not(target_os = "linux"))]
fn start_readahead(_f: &File, _len: u64) {}

/// Moves the synced temporary file `tmp` to `path`: by renaming over any
/// old file, or by linking (failing with `AlreadyExists` if `path` exists)
/// and unlinking the temporary name.
fn move_into_place(tmp: &Path, path: &Path, mode: WriteMode) -> io::Result<()> {
    match mode {
        WriteMode::Replace => fs::rename(tmp, path),
        WriteMode::CreateNew => {
            fs::hard_link(tmp, path)?;
            fs::remove_file(tmp)
        }
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Local {
    /// Starts the kernel's readahead of the first `len` bytes (0: all) of
    /// each of the objects `keys` that exists.
    fn read_ahead(&self, keys: &[String], len: u64) {
        for key in keys {
            let file = self.path(key).ok().and_then(|p| File::open(p).ok());
            if let Some(f) = file {
                start_readahead(&f, len);
            }
        }
    }
}

impl ObjectStore for Local {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn read(&self, key: &str) -> Result<Vec<u8>> {
        let path = self.path(key)?;
        fs::read(&path).map_err(|e| self.not_found_or(key, "reading", e))
    }

    fn read_shared(&self, key: &str) -> Result<Bytes> {
        let path = self.path(key)?;
        let file = File::open(&path).map_err(|e| self.not_found_or(key, "opening", e))?;
        // SAFETY: the map is read-only and objects are never modified in
        // place: every write makes a new file that is renamed over the old
        // one, and deletion unlinks, so an existing map keeps the bytes it
        // was made from. (A file truncated by something else while mapped
        // would fault on access, as with any memory map.)
        match unsafe { Mmap::map(&file) } {
            Ok(map) => Ok(Bytes::from_owner(map)),
            // Not mappable (an empty file, a file system without mmap): copy.
            Err(_) => self.read(key).map(Bytes::from),
        }
    }

    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let path = self.path(key)?;
        let mut f = File::open(&path).map_err(|e| self.not_found_or(key, "opening", e))?;
        let io_err = |e| Error::io(format!("reading {}", path.display()), e);
        f.seek(SeekFrom::Start(offset)).map_err(io_err)?;
        let mut buf = Vec::with_capacity(len.min(1 << 30) as usize);
        f.take(len).read_to_end(&mut buf).map_err(io_err)?;
        Ok(buf)
    }

    fn size(&self, key: &str) -> Result<u64> {
        let path = self.path(key)?;
        fs::metadata(&path)
            .map(|m| m.len())
            .map_err(|e| self.not_found_or(key, "inspecting", e))
    }

    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        self.write_parts(key, &[data])
    }

    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.write_atomic(key, WriteMode::Replace, &mut |f, tmp| {
            write_parts_to(f, tmp, parts)
                .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))
        })
    }

    /// Links the synced temporary file into place, which fails if `key`
    /// exists: creation is atomic and never replaces.
    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.write_atomic(key, WriteMode::CreateNew, &mut |f, tmp| {
            write_parts_to(f, tmp, parts)
                .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))
        })
    }

    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        let mut written = 0;
        self.write_atomic(key, mode, &mut |f, tmp| {
            let io_err = |e| Error::io(format!("writing {}", tmp.display()), e);
            let mut w = io::BufWriter::with_capacity(1 << 20, f);
            produce(&mut w)?;
            w.flush().map_err(io_err)?;
            written = w.get_mut().stream_position().map_err(io_err)?;
            Ok(())
        })?;
        Ok(written)
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        match fs::remove_file(&path) {
            Ok(()) => {
                let dir = path.parent().unwrap_or(&self.root);
                sync_dir(dir).map_err(|e| Error::io(format!("syncing {}", dir.display()), e))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("deleting {}", path.display()), e)),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let path = self.path(dir)?;
        let entries = match fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("listing {}", path.display()), e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(format!("listing {}", path.display()), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn exists(&self, key: &str) -> Result<bool> {
        let path = self.path(key)?;
        path.try_exists()
            .map_err(|e| Error::io(format!("inspecting {}", path.display()), e))
    }
}

impl Hints for Local {
    fn will_read(&self, keys: &[String]) {
        self.read_ahead(keys, 0);
    }

    fn will_read_heads(&self, keys: &[String], len: u64) {
        if len > 0 {
            self.read_ahead(keys, len);
        }
    }

    fn readable_by_others(&self, key: &str) -> Result<bool> {
        let path = self.path(key)?;
        private::readable_by_others(&path).map_err(|e| self.not_found_or(key, "inspecting", e))
    }
}

/// The directory whose OS lock is the commit lock of shared backups.
const COMMIT_LOCK_DIR: &str = "locks";
/// The file of the queue lock (FORMAT.md §13.3), in [`COMMIT_LOCK_DIR`].
const QUEUE_LOCK_FILE: &str = "queue";

impl Locks for Local {
    fn remove_temporaries(&self) -> Result<u64> {
        remove_temporaries_in(&self.root)
    }

    /// An OS lock costs a system call to try: waiters try every few
    /// milliseconds, so that one that has waited long is not passed, time
    /// after time, by newcomers trying sooner (a commit section lasts
    /// milliseconds; FORMAT.md §13.3).
    fn lock_retry(&self) -> std::time::Duration {
        std::time::Duration::from_millis(5)
    }

    /// Writers lock the repository directory itself, readers and
    /// maintenance its configuration file (written once at `init`, never
    /// replaced): neither can be unlinked or replaced while the repository
    /// exists, so a lock cannot silently stop excluding (see [`LockMode`]).
    /// Shared backups take turns committing by locking the directory
    /// `locks/` (created on first use, never removed; FORMAT.md §13.3).
    fn lock(&self, mode: LockMode) -> Result<LockGuard> {
        let mut files = Vec::with_capacity(2);
        if let Some(exclusive) = mode.writers_lock() {
            files.push(self.flock(&self.root, exclusive, true)?);
        }
        if let Some(exclusive) = mode.readers_lock() {
            let config = self.root.join(CONFIG_KEY);
            files.push(self.flock(&config, exclusive, false)?);
        }
        if mode.commit_lock() {
            let dir = self.root.join(COMMIT_LOCK_DIR);
            private::create_dirs(&dir)
                .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
            files.push(self.flock(&dir, true, true)?);
        }
        if let Some(exclusive) = mode.queue_lock() {
            let dir = self.root.join(COMMIT_LOCK_DIR);
            private::create_dirs(&dir)
                .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
            let path = dir.join(QUEUE_LOCK_FILE);
            // Created once (mode 0600), never removed or replaced.
            if !path.exists() {
                use std::os::unix::fs::OpenOptionsExt;
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o600)
                    .open(&path)
                    .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
            }
            files.push(self.flock(&path, exclusive, false)?);
        }
        Ok(LockGuard::from_files(files))
    }
}

impl Local {
    /// Opens `path` (a directory or the configuration file) and takes an
    /// OS lock on it without waiting: exclusive or shared.
    fn flock(&self, path: &Path, exclusive: bool, directory: bool) -> Result<File> {
        let io_err = |e| Error::io(format!("locking {}", path.display()), e);
        let opened = if directory {
            File::open(path)
        } else {
            // Read access suffices for an OS lock: read-only repositories can be read.
            OpenOptions::new().read(true).open(path)
        };
        let file = opened.map_err(io_err)?;
        let taken = if exclusive {
            file.try_lock()
        } else {
            file.try_lock_shared()
        };
        match taken {
            Ok(()) => Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::Locked(self.location())),
            Err(std::fs::TryLockError::Error(e)) => Err(io_err(e)),
        }
    }
}

/// Deletes the `.tmp.*` files of interrupted writes under `dir`, recursively.
fn remove_temporaries_in(dir: &Path) -> Result<u64> {
    let io_err = |e| Error::io(format!("cleaning {}", dir.display()), e);
    let mut removed = 0;
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io_err)?;
        if kind.is_dir() {
            removed += remove_temporaries_in(&path)?;
        } else if entry.file_name().to_string_lossy().starts_with(".tmp.") {
            fs::remove_file(&path)
                .map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_hints_ignore_absent_and_invalid_keys_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let b = Local::new(dir.path());
        b.write("data/0001", b"abc").unwrap();
        let keys = ["data/0001", "data/absent", "../outside", ""].map(String::from);
        b.will_read(&keys);
        b.will_read_heads(&keys, 2);
        assert_eq!(b.read("data/0001").unwrap(), b"abc");
        assert_eq!(b.list("data").unwrap(), vec!["0001"]);
        assert!(!dir.path().join("data/absent").exists());
    }

    #[test]
    fn shared_reads_keep_their_bytes_across_replacement_and_deletion() {
        let dir = tempfile::tempdir().unwrap();
        let b = Local::new(dir.path());
        let old: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        b.write("data/0001", &old).unwrap();
        b.write("data/empty", b"").unwrap();
        let mapped = b.read_shared("data/0001").unwrap();
        assert_eq!(&mapped[..], &old[..]);
        assert!(b.read_shared("data/empty").unwrap().is_empty());
        assert!(matches!(
            b.read_shared("data/absent"),
            Err(Error::NotFound(_))
        ));
        assert!(b.read_shared("../outside").is_err());
        // A write makes a new file and a delete unlinks: the map keeps the
        // bytes it was made from.
        b.write("data/0001", b"new").unwrap();
        assert_eq!(&mapped[..], &old[..]);
        b.delete("data/0001").unwrap();
        assert_eq!(&mapped[..], &old[..]);
    }

    #[test]
    fn write_read_list_delete() {
        let dir = tempfile::tempdir().unwrap();
        let b = Local::new(dir.path());
        b.write("data/0001", b"abc").unwrap();
        b.write("data/0000", b"xyz").unwrap();
        b.write_parts("data/empty", &[b"", b""]).unwrap();
        assert_eq!(b.read("data/empty").unwrap(), b"");
        assert_eq!(b.read("data/0001").unwrap(), b"abc");
        assert_eq!(b.read_range("data/0001", 1, 10).unwrap(), b"bc");
        assert_eq!(b.list("data").unwrap(), vec!["0000", "0001", "empty"]);
        assert_eq!(b.size("data/0000").unwrap(), 3);
        b.delete("data/0000").unwrap();
        b.delete("data/0000").unwrap();
        assert!(matches!(b.read("data/0000"), Err(Error::NotFound(_))));
        assert!(b.list("nothing").unwrap().is_empty());
    }

    #[test]
    fn parts_aligned_or_not_are_written_whole() {
        use crate::layout::container::AlignedBuf;
        let dir = tempfile::tempdir().unwrap();
        let b = Local::new(dir.path());
        let filled = |len: usize, seed: u8| {
            let mut buf = AlignedBuf::with_capacity(len);
            let bytes: Vec<u8> = (0..len)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                .collect();
            buf.extend_from_slice(&bytes);
            buf
        };
        // Aligned runs go direct, their tails and what follows them ordinarily.
        let shapes: [&[usize]; 4] = [
            &[DIRECT_ALIGN, DIRECT_MIN + 123],
            &[DIRECT_MIN, 7, DIRECT_MIN],
            &[100, DIRECT_MIN * 2],
            &[DIRECT_MIN * 2 + DIRECT_ALIGN],
        ];
        for (n, shape) in shapes.iter().enumerate() {
            let bufs: Vec<AlignedBuf> = shape
                .iter()
                .enumerate()
                .map(|(i, &len)| filled(len, i as u8))
                .collect();
            let parts: Vec<&[u8]> = bufs.iter().map(|p| p.as_slice()).collect();
            let key = format!("objects/{n}");
            b.write_parts(&key, &parts).unwrap();
            assert_eq!(b.read(&key).unwrap(), parts.concat(), "shape {shape:?}");
        }
        // An unaligned slice of an aligned buffer too.
        let buf = filled(DIRECT_MIN + 1, 9);
        b.write_parts("objects/odd", &[&buf.as_slice()[1..]])
            .unwrap();
        assert_eq!(b.read("objects/odd").unwrap(), &buf.as_slice()[1..]);
    }

    #[test]
    fn rejects_keys_that_escape_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let b = Local::new(dir.path());
        for key in ["../x", "a/../../x", "", "/abs", "a//b", ".hidden"] {
            assert!(b.write(key, b"x").is_err(), "{key:?} accepted");
        }
    }

    /// A local backend with a configuration object (which readers lock).
    fn with_config() -> (tempfile::TempDir, Local) {
        let dir = tempfile::tempdir().unwrap();
        let b = Local::new(dir.path());
        b.write(CONFIG_KEY, b"c").unwrap();
        (dir, b)
    }

    #[test]
    fn exclusive_lock_excludes_everybody() {
        let (_dir, b) = with_config();
        let g = b.lock(LockMode::Exclusive).unwrap();
        for mode in [LockMode::Read, LockMode::Backup, LockMode::Exclusive] {
            assert!(matches!(b.lock(mode), Err(Error::Locked(_))), "{mode:?}");
        }
        drop(g);
        let _s1 = b.lock(LockMode::Read).unwrap();
        let _s2 = b.lock(LockMode::Read).unwrap();
        assert!(matches!(b.lock(LockMode::Exclusive), Err(Error::Locked(_))));
    }

    #[test]
    fn a_backup_excludes_writers_but_not_readers() {
        let (_dir, b) = with_config();
        let _w = b.lock(LockMode::Backup).unwrap();
        let _r = b.lock(LockMode::Read).unwrap();
        assert!(matches!(b.lock(LockMode::Backup), Err(Error::Locked(_))));
        assert!(matches!(b.lock(LockMode::Exclusive), Err(Error::Locked(_))));
        // The backup goes on to maintenance once the reader has left.
        assert!(matches!(
            b.lock(LockMode::ExcludeReaders),
            Err(Error::Locked(_))
        ));
        drop(_r);
        let _m = b.lock(LockMode::ExcludeReaders).unwrap();
        assert!(matches!(b.lock(LockMode::Read), Err(Error::Locked(_))));
    }

    /// The queue lock (FORMAT.md §13.3): maintenance holds it exclusively,
    /// backups check it shared; it is independent of the other locks.
    #[test]
    fn queued_maintenance_holds_off_backups_that_check_the_queue() {
        let (dir, b) = with_config();
        let _backup = b.lock(LockMode::SharedBackup).unwrap();
        let check = b.lock(LockMode::QueueCheck).unwrap();
        let _check2 = b.lock(LockMode::QueueCheck).unwrap();
        assert!(matches!(b.lock(LockMode::Queue), Err(Error::Locked(_))));
        drop((check, _check2));
        let queued = b.lock(LockMode::Queue).unwrap();
        assert!(matches!(
            b.lock(LockMode::QueueCheck),
            Err(Error::Locked(_))
        ));
        assert!(matches!(b.lock(LockMode::Queue), Err(Error::Locked(_))));
        // Queued, it still waits for the running backup; readers read.
        assert!(matches!(b.lock(LockMode::Exclusive), Err(Error::Locked(_))));
        let _r = b.lock(LockMode::Read).unwrap();
        let mode = std::fs::metadata(dir.path().join("locks/queue")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        drop(queued);
        let _c = b.lock(LockMode::QueueCheck).unwrap();
        for (a, c) in [
            (LockMode::Queue, LockMode::QueueCheck),
            (LockMode::Queue, LockMode::Queue),
        ] {
            assert!(a.conflicts_with(c) && c.conflicts_with(a));
        }
        assert!(!LockMode::QueueCheck.conflicts_with(LockMode::QueueCheck));
        assert!(!LockMode::Queue.conflicts_with(LockMode::Exclusive));
    }

    #[test]
    fn the_lock_holds_when_files_in_the_repository_are_removed() {
        let (dir, b) = with_config();
        let _w = b.lock(LockMode::Backup).unwrap();
        // What a user cleaning up, or a sync tool, may delete.
        std::fs::write(dir.path().join("lock"), b"").unwrap();
        std::fs::remove_file(dir.path().join("lock")).unwrap();
        assert!(matches!(b.lock(LockMode::Backup), Err(Error::Locked(_))));
    }

    #[test]
    fn new_objects_are_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let b = Local::new(dir.path());
        b.write_new("snapshots/1", &[b"first"]).unwrap();
        match b.write_new("snapshots/1", &[b"second"]) {
            Err(Error::ObjectExists(key)) => assert_eq!(key, "snapshots/1"),
            other => panic!("expected ObjectExists, got {other:?}"),
        }
        assert_eq!(b.read("snapshots/1").unwrap(), b"first");
        // No temporary file is left behind.
        assert_eq!(b.remove_temporaries().unwrap(), 0);
    }
}
