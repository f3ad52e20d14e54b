//! Storage backends: every read and write of a repository goes through
//! [`Backend`], and [`Counting`] counts requests and bytes so that I/O metrics
//! are exact for every policy.

pub(crate) mod buffers;
mod cache;
mod faulty;
mod local;
mod location;
pub mod object_lock;
pub(crate) mod private;
mod s3;
mod throttle;

pub use buffers::AlignedBuf;
pub use faulty::Faulty;
pub use local::Local;
pub use location::{Location, S3Location};
pub use s3::{S3Options, S3};

use crate::error::Result;
use bytes::Bytes;
use serde::Serialize;
use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

/// The bytes of an object being written by [`Backend::write_new_filled`],
/// appended in order where the backend stores them.
pub trait ObjectImage {
    /// Appends `bytes` to the object.
    fn append(&mut self, bytes: &[u8]);
    /// Overwrites bytes from `offset`, which were appended already, with
    /// `bytes` (a header completed once what follows it is known).
    fn overwrite(&mut self, offset: usize, bytes: &[u8]);
    /// Bytes appended so far.
    fn len(&self) -> usize;
    /// Whether nothing was appended yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ObjectImage for AlignedBuf {
    fn append(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn overwrite(&mut self, offset: usize, bytes: &[u8]) {
        self.as_mut_slice()[offset..offset + bytes.len()].copy_from_slice(bytes);
    }
    fn len(&self) -> usize {
        AlignedBuf::len(self)
    }
}

/// Objects of up to this many bytes keep the buffer they were filled in
/// for the thread's next one (a container writer writes one after another).
const KEEP_FILL_BUFFER: usize = 32 << 20;

thread_local! {
    /// The buffer this thread fills objects in ([`with_fill_buffer`]), reused.
    static FILL_BUF: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::default());
}

/// Runs `work` on this thread's object buffer, emptied, with room for
/// `capacity` bytes and aligned in memory (so that a local backend writes
/// it with direct I/O, and no page is faulted in again for every object).
pub(crate) fn with_fill_buffer(
    capacity: usize,
    work: impl FnOnce(&mut AlignedBuf) -> Result<()>,
) -> Result<()> {
    let mut buf = FILL_BUF.take();
    buf.clear();
    // Grown by whole MiB: objects of about the same size (containers a few
    // tag bytes over their capacity) reuse the buffer instead of each
    // allocating (and faulting in) a slightly larger one.
    buf.reserve_total(capacity.next_multiple_of(1 << 20));
    let done = work(&mut buf);
    if buf.capacity() <= KEEP_FILL_BUFFER {
        FILL_BUF.set(buf);
    }
    done
}

/// Key of the repository's configuration object. Written once, when the
/// repository is created, and never replaced: backends may lock it.
pub const CONFIG_KEY: &str = "config";

/// A flat store of named objects. Keys are `/`-separated relative paths.
///
/// `write` is atomic: after a crash an object holds either its old content
/// (or is absent) or the complete new content, never a mix.
pub trait Backend: Send + Sync {
    /// Where the objects live, for messages.
    fn location(&self) -> String;
    /// The whole object `key`; [`crate::Error::NotFound`] if absent.
    fn read(&self, key: &str) -> Result<Vec<u8>>;
    /// The whole object `key` as shared bytes, like [`Backend::read`], for
    /// a caller that may use only some of them: a backend may map the
    /// object instead of copying it (local: a read-only memory map, whose
    /// pages the caller's accesses fault in from the page cache).
    fn read_shared(&self, key: &str) -> Result<Bytes> {
        self.read(key).map(Bytes::from)
    }
    /// `len` bytes of `key` from `offset`; fewer only if the object ends first.
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>>;
    /// Like [`Backend::read_range`], for bytes of container data that are
    /// read again and again (a tree backup's catalog chunks): a backend
    /// with a local metadata cache keeps the range there as it keeps
    /// metadata ranges (FORMAT.md §13.2).
    fn read_range_cached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.read_range(key, offset, len)
    }
    /// Size of `key` in bytes.
    fn size(&self, key: &str) -> Result<u64>;
    /// Stores `data` as `key` atomically and durably, replacing any old object.
    fn write(&self, key: &str, data: &[u8]) -> Result<()>;
    /// Stores the concatenation of `parts` as `key`, like [`Backend::write`]
    /// (backends that can, write the parts without concatenating them).
    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.write(key, &parts.concat())
    }
    /// Stores the concatenation of `parts` as the new object `key`, like
    /// [`Backend::write_parts`], but only if `key` does not exist yet:
    /// otherwise fails with [`crate::Error::ObjectExists`] and changes
    /// nothing. Objects that commit a backup (containers, recipes,
    /// snapshots) are written this way, so that two writers can never
    /// replace each other's. This default checks, then writes; backends
    /// that can create atomically (local: a hard link) do so.
    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        if self.exists(key)? {
            return Err(crate::Error::ObjectExists(key.to_string()));
        }
        self.write_parts(key, parts)
    }
    /// Stores the bytes `fill` appends to an [`ObjectImage`] (about
    /// `len_hint` of them, at most) as the new object `key`, like
    /// [`Backend::write_new`]. A backend that stores
    /// objects transformed ([`Backend::transforms_objects`]: encryption)
    /// lays the image out as it stores the object, so the bytes are copied
    /// once, where they are stored; this default fills a buffer kept by the
    /// thread and writes it.
    fn write_new_filled(
        &self,
        key: &str,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut dyn ObjectImage) -> Result<()>,
    ) -> Result<()> {
        with_fill_buffer(len_hint, |buf| {
            fill(buf)?;
            self.write_new(key, &[buf.as_slice()])
        })
    }
    /// Whether objects are stored transformed (encrypted), so that
    /// [`Backend::write_new_filled`] saves the copy [`Backend::write_new`]
    /// makes of its parts.
    fn transforms_objects(&self) -> bool {
        false
    }
    /// Stores the bytes `produce` writes as `key`, like [`Backend::write`]
    /// (`mode` [`WriteMode::Replace`]) or [`Backend::write_new`]
    /// ([`WriteMode::CreateNew`]), for objects built piece by piece that
    /// should not be held in memory whole (local: streamed into the
    /// temporary file that is then moved into place). Returns the object's
    /// size.
    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        let mut data = Vec::new();
        produce(&mut data)?;
        match mode {
            WriteMode::Replace => self.write(key, &data)?,
            WriteMode::CreateNew => self.write_new(key, &[&data])?,
        }
        Ok(data.len() as u64)
    }
    /// Hints that the objects `keys` will be read whole soon, so that the
    /// backend may start fetching them while the caller works (local: the
    /// kernel's readahead). Not a request: it reads nothing the caller
    /// sees, is not counted, and fails silently (absent keys included).
    fn will_read(&self, keys: &[String]) {
        let _ = keys;
    }
    /// Hints that the first `len` bytes of each of the objects `keys` will
    /// be read soon (local: the kernel's readahead of that range; other
    /// backends ignore it). Like [`Backend::will_read`], not a request.
    fn will_read_heads(&self, keys: &[String], len: u64) {
        let _ = (keys, len);
    }
    /// Requests a bulk transfer (a restore's container reads, a backup's
    /// container writes) should keep in flight at once: an object store's
    /// `--connections`; `None` for backends without such a setting (local
    /// directories), whose callers keep their own defaults.
    fn connections(&self) -> Option<usize> {
        None
    }
    /// Removes `key`; absent keys are not an error.
    fn delete(&self, key: &str) -> Result<()>;
    /// Names of the objects directly under `dir` (without the `dir/` prefix), sorted.
    fn list(&self, dir: &str) -> Result<Vec<String>>;
    /// Whether `key` exists.
    fn exists(&self, key: &str) -> Result<bool>;
    /// Takes the repository lock in `mode` without waiting, held until the
    /// guard drops; [`crate::Error::Locked`] if a conflicting holder has it.
    /// Backends without locking return an empty guard.
    fn lock(&self, mode: LockMode) -> Result<LockGuard>;
    /// Deletes the temporary objects that interrupted writes left behind and
    /// returns how many. Only safe while holding the exclusive lock (no
    /// write in progress); backends whose writes leave nothing behind keep
    /// this default.
    fn remove_temporaries(&self) -> Result<u64> {
        Ok(0)
    }
    /// Whether users other than the owner can read the object `key`
    /// (local: its group or everybody may), for `check`'s warning about
    /// key files. Not counted as a request; backends without file
    /// permissions (object stores) keep this default, `false`.
    fn readable_by_others(&self, key: &str) -> Result<bool> {
        let _ = key;
        Ok(false)
    }
    /// Removes lock objects (`tessera unlock`): the stale ones, or all of
    /// them with `all`, and returns a line describing each removed.
    /// Backends whose locks cannot outlive their holder (local: OS locks)
    /// have none and keep this default.
    fn unlock(&self, all: bool) -> Result<Vec<String>> {
        let _ = all;
        Ok(Vec::new())
    }
    /// Requests retried so far after a transient failure (remote stores;
    /// local writes are not retried).
    fn retries(&self) -> u64 {
        0
    }
    /// Lets a remote backend keep a local cache of the metadata objects of
    /// the repository whose configuration has the id `id` (FORMAT.md
    /// §13.2), once the repository is opened. Backends without a cache
    /// (local directories) ignore it.
    fn cache_metadata(&self, id: &str) {
        let _ = id;
    }
    /// What the local metadata cache saved and cost so far.
    fn cache_stats(&self) -> CacheStats {
        CacheStats::default()
    }
}

/// Counts of a backend's local metadata cache (FORMAT.md §13.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Reads served from the cache, without a request to the store.
    pub hits: u64,
    /// Listings the cache made to learn the versions of objects.
    pub lists: u64,
}

/// Checks that `key` is a valid object key: `/`-separated components,
/// each non-empty, not `.` or `..`, and not starting with `.` (FORMAT.md
/// §13), so that no key can escape the repository or name a temporary.
pub(crate) fn check_key(key: &str) -> Result<()> {
    let valid = !key.is_empty()
        && key
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != ".." && !part.starts_with('.'));
    match valid {
        true => Ok(()),
        false => Err(crate::Error::io(
            format!("object key {key:?}"),
            io::Error::new(io::ErrorKind::InvalidInput, "invalid object key"),
        )),
    }
}

/// Whether a write may replace an existing object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Replace any old object (derived state: indexes, policy state).
    Replace,
    /// Fail with [`crate::Error::ObjectExists`] if the object exists
    /// (objects that commit a backup).
    CreateNew,
}

/// What a repository is opened for, and so which lock it takes.
///
/// | mode | shares with | excludes |
/// | --- | --- | --- |
/// | `Read` | readers, one backup | maintenance |
/// | `Backup` | readers | backups, maintenance |
/// | `Exclusive` | nobody | everybody |
///
/// Readers read committed state only, which a backup never changes (it
/// only adds objects and commits by writing its snapshot last), so a
/// running backup never blocks `list`, `restore` or `check`. Maintenance
/// (GC, deleting, arranging, rebuilding indexes) changes or removes
/// committed objects and so excludes readers too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Reading committed state (list, restore, check, stats).
    Read,
    /// Adding a backup.
    Backup,
    /// Changing or deleting committed state (and creating a repository).
    Exclusive,
    /// The part of `Exclusive` that `Backup` lacks: taken on top of a
    /// `Backup` lock by a backup that goes on to maintenance (a lifecycle
    /// backup arranging), making the two together `Exclusive`.
    ExcludeReaders,
}

impl LockMode {
    /// Whether this mode excludes backups (other writers).
    pub fn excludes_writers(self) -> bool {
        matches!(self, LockMode::Backup | LockMode::Exclusive)
    }

    /// Whether this mode excludes readers.
    pub fn excludes_readers(self) -> bool {
        matches!(self, LockMode::Exclusive | LockMode::ExcludeReaders)
    }

    /// Whether this mode waits for readers to leave or holds them off.
    /// (`Read` shares its lock with other readers; `Backup` takes none.)
    pub fn involves_readers(self) -> bool {
        self != LockMode::Backup
    }

    /// Whether a holder in this mode and one in `other` exclude each other:
    /// both exclude writers, or both involve readers and one of them
    /// excludes readers (the two OS locks of a local repository, FORMAT.md
    /// §13, and the lock objects of an object store, §13.1).
    pub fn conflicts_with(self, other: LockMode) -> bool {
        (self.excludes_writers() && other.excludes_writers())
            || (self.involves_readers()
                && other.involves_readers()
                && (self.excludes_readers() || other.excludes_readers()))
    }
}

/// Holds a repository lock until dropped.
#[derive(Default)]
pub struct LockGuard {
    _held: Vec<Box<dyn Send>>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LockGuard({} held)", self._held.len())
    }
}

impl LockGuard {
    /// A guard holding `files`, whose OS locks are released when they close.
    pub fn from_files(files: Vec<File>) -> Self {
        LockGuard {
            _held: files
                .into_iter()
                .map(|f| Box::new(f) as Box<dyn Send>)
                .collect(),
        }
    }

    /// A guard holding `held`, which releases its lock when dropped (a
    /// lock object's holder deletes it).
    pub fn from_holder(held: Box<dyn Send>) -> Self {
        LockGuard { _held: vec![held] }
    }
}

/// Request and byte counts of a backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IoStats {
    /// Read requests (whole or ranged).
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Write requests.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Delete requests.
    pub deletes: u64,
    /// List requests.
    pub lists: u64,
    /// Requests retried after a transient failure (object stores).
    pub retries: u64,
    /// Of `reads`, those served by the local metadata cache, without a
    /// request to the store (object stores; FORMAT.md §13.2).
    pub cache_hits: u64,
    /// Listings the local metadata cache made (not in `lists`).
    pub cache_lists: u64,
}

impl IoStats {
    /// Counts accumulated since `earlier`.
    pub fn since(&self, earlier: &IoStats) -> IoStats {
        IoStats {
            reads: self.reads - earlier.reads,
            read_bytes: self.read_bytes - earlier.read_bytes,
            writes: self.writes - earlier.writes,
            write_bytes: self.write_bytes - earlier.write_bytes,
            deletes: self.deletes - earlier.deletes,
            lists: self.lists - earlier.lists,
            retries: self.retries - earlier.retries,
            cache_hits: self.cache_hits - earlier.cache_hits,
            cache_lists: self.cache_lists - earlier.cache_lists,
        }
    }

    /// Requests that reached the store: reads not served by the cache,
    /// writes, deletes and listings (the cache's included).
    pub fn requests(&self) -> u64 {
        self.reads - self.cache_hits + self.writes + self.deletes + self.lists + self.cache_lists
    }
}

/// Wraps a backend and counts every request and byte.
pub struct Counting {
    inner: Box<dyn Backend>,
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    deletes: AtomicU64,
    lists: AtomicU64,
}

impl Counting {
    /// Counts the requests made to `inner`.
    pub fn new(inner: Box<dyn Backend>) -> Self {
        Counting {
            inner,
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            lists: AtomicU64::new(0),
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> IoStats {
        let cache = self.inner.cache_stats();
        IoStats {
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            deletes: self.deletes.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            retries: self.inner.retries(),
            cache_hits: cache.hits,
            cache_lists: cache.lists,
        }
    }

    fn count_write(&self, bytes: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn count_read(&self, bytes: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

impl Backend for Counting {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn read(&self, key: &str) -> Result<Vec<u8>> {
        let data = self.inner.read(key)?;
        self.count_read(data.len());
        Ok(data)
    }
    fn read_shared(&self, key: &str) -> Result<Bytes> {
        let data = self.inner.read_shared(key)?;
        self.count_read(data.len());
        Ok(data)
    }
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let data = self.inner.read_range(key, offset, len)?;
        self.count_read(data.len());
        Ok(data)
    }
    fn read_range_cached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let data = self.inner.read_range_cached(key, offset, len)?;
        self.count_read(data.len());
        Ok(data)
    }
    fn size(&self, key: &str) -> Result<u64> {
        self.inner.size(key)
    }
    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        self.inner.write(key, data)?;
        self.count_write(data.len() as u64);
        Ok(())
    }
    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.inner.write_parts(key, parts)?;
        self.count_write(parts.iter().map(|p| p.len() as u64).sum());
        Ok(())
    }
    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.inner.write_new(key, parts)?;
        self.count_write(parts.iter().map(|p| p.len() as u64).sum());
        Ok(())
    }
    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        let len = self.inner.write_streamed(key, mode, produce)?;
        self.count_write(len);
        Ok(len)
    }
    fn will_read(&self, keys: &[String]) {
        self.inner.will_read(keys);
    }
    fn will_read_heads(&self, keys: &[String], len: u64) {
        self.inner.will_read_heads(keys, len);
    }
    fn write_new_filled(
        &self,
        key: &str,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut dyn ObjectImage) -> Result<()>,
    ) -> Result<()> {
        let mut len = 0;
        self.inner.write_new_filled(key, len_hint, &mut |image| {
            fill(image)?;
            len = image.len() as u64;
            Ok(())
        })?;
        self.count_write(len);
        Ok(())
    }
    fn transforms_objects(&self) -> bool {
        self.inner.transforms_objects()
    }
    fn connections(&self) -> Option<usize> {
        self.inner.connections()
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)?;
        self.deletes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn list(&self, dir: &str) -> Result<Vec<String>> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        self.inner.list(dir)
    }
    fn exists(&self, key: &str) -> Result<bool> {
        self.inner.exists(key)
    }
    fn lock(&self, mode: LockMode) -> Result<LockGuard> {
        self.inner.lock(mode)
    }
    fn remove_temporaries(&self) -> Result<u64> {
        self.inner.remove_temporaries()
    }
    fn readable_by_others(&self, key: &str) -> Result<bool> {
        self.inner.readable_by_others(key)
    }
    fn unlock(&self, all: bool) -> Result<Vec<String>> {
        self.inner.unlock(all)
    }
    fn retries(&self) -> u64 {
        self.inner.retries()
    }
    fn cache_metadata(&self, id: &str) {
        self.inner.cache_metadata(id)
    }
    fn cache_stats(&self) -> CacheStats {
        self.inner.cache_stats()
    }
}
