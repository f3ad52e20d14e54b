//! Storage backends: every read and write of a repository goes through a
//! [`Backend`], which is three narrow traits in one object: object I/O
//! ([`ObjectStore`]), the repository lock ([`Locks`]), and hints and
//! statistics ([`Hints`]).
//!
//! A store implements the three itself ([`Local`], [`S3`], the in-memory
//! [`testing::Mem`]). A layer over another backend implements [`Layer`]
//! instead: it overrides what it changes and everything else goes to the
//! backend below, so that a hint or a specialised write path is never lost
//! on the way down. [`Counting`] counts requests and bytes so that I/O
//! metrics are exact for every policy; `crypto::Encrypting` seals objects;
//! [`testing::Faulty`] and [`testing::Gated`] inject faults for tests.

pub(crate) mod buffers;
mod cache;
mod counting;
mod layer;
mod local;
mod location;
pub mod object_lock;
pub(crate) mod private;
mod s3;
#[doc(hidden)]
pub mod testing;
mod throttle;

pub use buffers::AlignedBuf;
pub use cache::{cache_dir_name, default_root as cache_root};
pub use counting::{Counting, IoStats};
pub use layer::Layer;
pub use local::Local;
pub use location::{Location, S3Location};
pub use s3::{S3Options, S3};

use crate::error::Result;
use bytes::Bytes;
use std::fs::File;
use std::io::{self, Write};

/// The bytes of an object being written by [`ObjectStore::write_new_filled`],
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

/// Object I/O: a flat store of named objects. Keys are `/`-separated
/// relative paths.
///
/// `write` is atomic: after a crash an object holds either its old content
/// (or is absent) or the complete new content, never a mix.
pub trait ObjectStore: Send + Sync {
    /// Where the objects live, for messages.
    fn location(&self) -> String;
    /// The whole object `key`; [`crate::Error::NotFound`] if absent.
    fn read(&self, key: &str) -> Result<Vec<u8>>;
    /// The whole object `key` as shared bytes, like [`ObjectStore::read`],
    /// for a caller that may use only some of them: a backend may map the
    /// object instead of copying it (local: a read-only memory map, whose
    /// pages the caller's accesses fault in from the page cache).
    fn read_shared(&self, key: &str) -> Result<Bytes> {
        self.read(key).map(Bytes::from)
    }
    /// `len` bytes of `key` from `offset`; fewer only if the object ends first.
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>>;
    /// Like [`ObjectStore::read_range`], for bytes of container data that
    /// are read again and again (a tree backup's catalog chunks): a
    /// backend with a local metadata cache keeps the range there as it
    /// keeps metadata ranges (FORMAT.md §13.2).
    fn read_range_cached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.read_range(key, offset, len)
    }
    /// Size of `key` in bytes.
    fn size(&self, key: &str) -> Result<u64>;
    /// Stores `data` as `key` atomically and durably, replacing any old object.
    fn write(&self, key: &str, data: &[u8]) -> Result<()>;
    /// Stores the concatenation of `parts` as `key`, like
    /// [`ObjectStore::write`] (backends that can, write the parts without
    /// concatenating them).
    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.write(key, &parts.concat())
    }
    /// Stores the concatenation of `parts` as the new object `key`, like
    /// [`ObjectStore::write_parts`], but only if `key` does not exist yet:
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
    /// [`ObjectStore::write_new`]. A backend that stores objects
    /// transformed ([`ObjectStore::transforms_objects`]: encryption) lays
    /// the image out as it stores the object, so the bytes are copied
    /// once, where they are stored; this default fills a buffer kept by
    /// the thread and writes it.
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
    /// [`ObjectStore::write_new_filled`] saves the copy
    /// [`ObjectStore::write_new`] makes of its parts.
    fn transforms_objects(&self) -> bool {
        false
    }
    /// Stores the bytes `produce` writes as `key`, like
    /// [`ObjectStore::write`] (`mode` [`WriteMode::Replace`]) or
    /// [`ObjectStore::write_new`] ([`WriteMode::CreateNew`]), for objects
    /// built piece by piece that should not be held in memory whole
    /// (local: streamed into the temporary file that is then moved into
    /// place). Returns the object's size. This default collects the bytes
    /// and writes them ([`write_collected`]).
    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        write_collected(produce, |data| match mode {
            WriteMode::Replace => self.write(key, data),
            WriteMode::CreateNew => self.write_new(key, &[data]),
        })
    }
    /// Removes `key`; absent keys are not an error.
    fn delete(&self, key: &str) -> Result<()>;
    /// Names of the objects directly under `dir` (without the `dir/` prefix), sorted.
    fn list(&self, dir: &str) -> Result<Vec<String>>;
    /// Whether `key` exists.
    fn exists(&self, key: &str) -> Result<bool>;
}

/// Collects the bytes `produce` writes and hands them to `write`, for
/// [`ObjectStore::write_streamed`] where the object is stored whole:
/// returns their number.
pub(crate) fn write_collected(
    produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    write: impl FnOnce(&[u8]) -> Result<()>,
) -> Result<u64> {
    let mut data = Vec::new();
    produce(&mut data)?;
    write(&data)?;
    Ok(data.len() as u64)
}

/// The repository lock, and cleaning up after writers that died.
pub trait Locks: Send + Sync {
    /// Takes the repository lock in `mode` without waiting, held until the
    /// guard drops; [`crate::Error::Locked`] if a conflicting holder has it.
    /// Backends without locking return an empty guard.
    fn lock(&self, mode: LockMode) -> Result<LockGuard>;
    /// Removes lock objects (`tessera unlock`): the stale ones, or all of
    /// them with `all`, and returns a line describing each removed.
    /// Backends whose locks cannot outlive their holder (local: OS locks)
    /// have none and keep this default.
    fn unlock(&self, all: bool) -> Result<Vec<String>> {
        let _ = all;
        Ok(Vec::new())
    }
    /// Deletes the temporary objects that interrupted writes left behind and
    /// returns how many. Only safe while holding the exclusive lock (no
    /// write in progress); backends whose writes leave nothing behind keep
    /// this default.
    fn remove_temporaries(&self) -> Result<u64> {
        Ok(0)
    }
    /// How often a process waiting for a lock of this backend tries again
    /// at most (FORMAT.md §13): a lock object costs requests to try, so the
    /// default backs off to 100 ms; an OS lock costs a system call.
    fn lock_retry(&self) -> std::time::Duration {
        std::time::Duration::from_millis(100)
    }
}

/// Hints and statistics: what a caller may tell a backend to make it
/// faster, and what the backend reports of its work beside requests. Every
/// method has a default that does nothing or reports nothing, for
/// backends without the feature; none changes what a read returns.
pub trait Hints: Send + Sync {
    /// Hints that the objects `keys` will be read whole soon, so that the
    /// backend may start fetching them while the caller works (local: the
    /// kernel's readahead; S3: background reads, up to `--connections`).
    /// Not a request: it reads nothing the caller sees, is not counted,
    /// and fails silently (absent keys included).
    fn will_read(&self, keys: &[String]) {
        let _ = keys;
    }
    /// Hints that the first `len` bytes of each of the objects `keys` will
    /// be read soon (local: the kernel's readahead of that range; other
    /// backends ignore it). Like [`Hints::will_read`], not a request.
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
    /// Lets a remote backend keep a local cache of the metadata objects of
    /// the repository whose configuration has the id `id` (FORMAT.md
    /// §13.2), once the repository is opened. Backends without a cache
    /// (local directories) ignore it.
    fn cache_metadata(&self, id: &str) {
        let _ = id;
    }
    /// Requests retried so far after a transient failure (remote stores;
    /// local writes are not retried).
    fn retries(&self) -> u64 {
        0
    }
    /// What the local metadata cache saved and cost so far.
    fn cache_stats(&self) -> CacheStats {
        CacheStats::default()
    }
    /// Whether users other than the owner can read the object `key`
    /// (local: its group or everybody may), for `check`'s warning about
    /// key files. Not counted as a request; backends without file
    /// permissions (object stores) keep this default, `false`.
    fn readable_by_others(&self, key: &str) -> Result<bool> {
        let _ = key;
        Ok(false)
    }
}

/// A repository's storage: objects, locks and hints in one object. Every
/// type with the three has it; layers ([`Layer`]) get all three by
/// forwarding what they do not change to the backend they are over.
pub trait Backend: ObjectStore + Locks + Hints {}

impl<T: ObjectStore + Locks + Hints + ?Sized> Backend for T {}

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
/// A repository has three locks (docs/FORMAT.md §13, §13.3): the writers'
/// lock, the readers' lock and the commit lock; each mode holds some of
/// them, shared or exclusively, and two holders conflict when they hold one
/// lock and at least one of them holds it exclusively:
///
/// | mode | writers' | readers' | commit |
/// | --- | --- | --- | --- |
/// | `Read` | — | shared | — |
/// | `SharedBackup` | shared | — | — |
/// | `Backup` | exclusive | — | — |
/// | `Commit` | — | — | exclusive |
/// | `Exclusive` | exclusive | exclusive | — |
/// | `ExcludeReaders` | — | exclusive | — |
///
/// Readers read committed state only, which a backup never changes (it
/// only adds objects and commits by writing its snapshot last), so a
/// running backup never blocks `list`, `restore` or `check`. Maintenance
/// (GC, deleting, arranging, rebuilding indexes) changes or removes
/// committed objects and so excludes readers and backups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Reading committed state (list, restore, check, stats).
    Read,
    /// Adding a backup, one at a time (repositories of format versions 1
    /// to 4, and backups of the kinds that cannot share).
    Backup,
    /// Adding a backup beside other such backups (a shared-writers
    /// repository, docs/FORMAT.md §13.3). Callers open repositories for
    /// [`LockMode::Backup`]; the repository takes this mode when its
    /// backups share.
    SharedBackup,
    /// The short commit section of a shared backup (taken on top of
    /// `SharedBackup`): shared backups take turns in it.
    Commit,
    /// Changing or deleting committed state (and creating a repository).
    Exclusive,
    /// The part of `Exclusive` that `Backup` lacks: taken on top of a
    /// `Backup` lock by a backup that goes on to maintenance (a lifecycle
    /// backup arranging), making the two together `Exclusive`.
    ExcludeReaders,
    /// The queue lock, held exclusively by a maintenance command from
    /// before it waits for the exclusive lock until it ends
    /// (docs/FORMAT.md §13.3): new backups wait while it is held, so a
    /// stream of overlapping backups cannot starve maintenance.
    Queue,
    /// The queue lock taken shared and let go at once by a backup before
    /// it takes the writers' lock: it waits while maintenance is queued.
    QueueCheck,
}

impl LockMode {
    /// How this mode holds the writers' lock: `Some(true)` exclusively,
    /// `Some(false)` shared, `None` not at all.
    pub fn writers_lock(self) -> Option<bool> {
        match self {
            LockMode::Backup | LockMode::Exclusive => Some(true),
            LockMode::SharedBackup => Some(false),
            _ => None,
        }
    }

    /// How this mode holds the readers' lock (as [`LockMode::writers_lock`]).
    pub fn readers_lock(self) -> Option<bool> {
        match self {
            LockMode::Read => Some(false),
            LockMode::Exclusive | LockMode::ExcludeReaders => Some(true),
            _ => None,
        }
    }

    /// How this mode holds the queue lock (as [`LockMode::writers_lock`]).
    pub fn queue_lock(self) -> Option<bool> {
        match self {
            LockMode::Queue => Some(true),
            LockMode::QueueCheck => Some(false),
            _ => None,
        }
    }

    /// Whether this mode holds the commit lock (always exclusively).
    pub fn commit_lock(self) -> bool {
        self == LockMode::Commit
    }

    /// Whether this mode excludes backups (other writers).
    pub fn excludes_writers(self) -> bool {
        self.writers_lock() == Some(true)
    }

    /// Whether this mode excludes readers.
    pub fn excludes_readers(self) -> bool {
        self.readers_lock() == Some(true)
    }

    /// Whether this mode waits for readers to leave or holds them off.
    pub fn involves_readers(self) -> bool {
        self.readers_lock().is_some()
    }

    /// Whether a holder in this mode and one in `other` exclude each other:
    /// they hold one of the four locks and one of them holds it
    /// exclusively (the OS locks of a local repository, FORMAT.md §13, and
    /// the lock objects of an object store, §13.1).
    pub fn conflicts_with(self, other: LockMode) -> bool {
        let clash =
            |a: Option<bool>, b: Option<bool>| matches!((a, b), (Some(x), Some(y)) if x || y);
        clash(self.writers_lock(), other.writers_lock())
            || clash(self.readers_lock(), other.readers_lock())
            || (self.commit_lock() && other.commit_lock())
            || clash(self.queue_lock(), other.queue_lock())
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
