//! A repository: its backend, configuration and lock, and the listing and
//! loading of its objects.

pub mod commit;
pub mod config;
pub mod quarantine;

use crate::backend::{Backend, Counting, IoStats, Local, Location, LockGuard, LockMode, S3};
use crate::crypto::{self, Credentials, Encrypting, NewKey, Unlocked};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprinter;
use crate::format::dictionary::{self, Dictionary};
use crate::format::envelope;
use crate::format::snapshot::{self, BackupId, Recipe, Snapshot, RECIPE_DIR, SNAPSHOT_DIR};
use crate::index::{Ddfs, DedupIndex, Ehid, Exact, IndexStats, Lazy, LazyMode, LazyParams};
use crate::layout::container::{self, ContainerId, CONTAINER_DIR};
use crate::repo::config::{Config, Encryption, IndexKind, Stored, CONFIG_KEY};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Key of the id counters object.
pub const STATE_KEY: &str = "state";
/// Key of the second copy of the id counters.
pub const STATE_COPY_KEY: &str = "state-copy";
const STATE_KIND: &[u8; 4] = b"STAT";
const STATE_VERSION: u32 = 1;

/// Counters that must survive deletions (so that ids are never reused).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct State {
    last_backup_id: BackupId,
    /// Lowest container id never used (garbage collection may delete the newest containers).
    #[serde(default)]
    next_container: ContainerId,
}

/// Bytes of the stored chunks the retained backups use: their own
/// lengths, and the lengths of their stored entries (compressed, or a
/// delta), each stored copy once ([`crate::commands::stats`] counts them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoredBytes {
    /// The chunks' own bytes.
    pub plain: u64,
    /// The bytes of their stored entries.
    pub stored: u64,
}

/// Totals over a repository.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RepoTotals {
    /// Committed backups.
    pub backups: u64,
    /// Sum of the backups' logical sizes.
    pub logical_bytes: u64,
    /// Bytes of all containers (data, metadata and headers; in a trace
    /// repository, the size the containers would have with their data).
    pub physical_bytes: u64,
    /// Containers.
    pub containers: u64,
    /// Deduplication alone: logical bytes / the bytes stored before
    /// compression (`physical_bytes` × `compression_ratio`); `None` when
    /// nothing is stored.
    pub dedup_ratio: Option<f64>,
    /// Compression alone: the bytes of the stored chunks the retained
    /// backups use, before / after compression (deltas included), each
    /// stored copy once ([`crate::commands::stats`]); `None` when nothing is stored
    /// (1.0 in a repository that does not compress).
    pub compression_ratio: Option<f64>,
    /// Both: logical_bytes / physical_bytes.
    pub total_ratio: Option<f64>,
}

impl RepoTotals {
    /// The totals of `snapshots` (the retained backups) stored in
    /// `physical_bytes` of `containers` objects.
    pub fn new(snapshots: &[Snapshot], physical_bytes: u64, containers: u64) -> RepoTotals {
        let logical_bytes = snapshots.iter().map(|s| s.logical_bytes).sum();
        let (before, after) = snapshots.iter().fold((0u64, 0u64), |(b, a), s| {
            let c = &s.stats.compression;
            // Backups written before compression existed count as raw.
            match c.bytes_after {
                0 => (b + s.stats.stored_bytes, a + s.stats.stored_bytes),
                n => (b + c.bytes_before, a + n),
            }
        });
        let compression_ratio = crate::util::units::ratio(before, after);
        let total_ratio = crate::util::units::ratio(logical_bytes, physical_bytes);
        RepoTotals {
            backups: snapshots.len() as u64,
            logical_bytes,
            physical_bytes,
            containers,
            dedup_ratio: total_ratio.map(|t| t / compression_ratio.unwrap_or(1.0)),
            compression_ratio,
            total_ratio,
        }
    }

    /// These totals with the compression ratio of what is stored:
    /// `stored`'s chunks, before and after compression (and the
    /// deduplication ratio that follows from it).
    pub fn with_compression(self, stored: StoredBytes) -> RepoTotals {
        let compression_ratio = crate::util::units::ratio(stored.plain, stored.stored);
        RepoTotals {
            dedup_ratio: self
                .total_ratio
                .map(|t| t / compression_ratio.unwrap_or(1.0)),
            compression_ratio,
            ..self
        }
    }
}

/// One backup as listed: its snapshot, or what is wrong with it.
#[derive(Clone, Debug)]
pub struct Listed {
    /// The backup id.
    pub id: BackupId,
    /// The snapshot, or why it cannot be read.
    pub snapshot: std::result::Result<Snapshot, String>,
}

/// An open repository.
pub struct Repository {
    /// The backend, counted: `counting` as a trait object.
    backend: Arc<dyn Backend>,
    counting: Arc<Counting>,
    config: Config,
    mode: LockMode,
    /// Whether this handle's backups share the repository with other
    /// backups (docs/FORMAT.md §13.3): its backups commit under the commit lock.
    shared: bool,
    /// How long this handle waits for a lock (the commit lock: at least
    /// [`COMMIT_WAIT`]).
    wait: Duration,
    /// The locks held: the one `mode` took, and the readers' lock a backup
    /// may add for maintenance ([`Repository::exclude_readers`]).
    locks: Mutex<Vec<LockGuard>>,
    /// The master key and the key file it came from (encrypted repositories).
    unlocked: Option<Unlocked>,
    /// Computes the repository's (keyed, if encrypted) fingerprints.
    fingerprinter: Fingerprinter,
    /// The compression dictionary writers use (docs/FORMAT.md §7.8): the
    /// newest the repository holds, or the one this handle trained; `None`
    /// until a writer first asks ([`Repository::dictionary`]: only then are
    /// the dictionary objects read).
    dictionary: Mutex<Option<Option<Arc<Dictionary>>>>,
    /// How many dictionaries the repository listed when it was opened.
    dictionaries_listed: usize,
    /// Nanoseconds this handle waited for the commit lock, summed
    /// ([`Repository::commit_lock_waited`]).
    commit_waited: std::sync::atomic::AtomicU64,
}

/// How an opener gets the credentials of an encrypted repository: called
/// only if the repository is encrypted.
pub type Unlock<'a> = &'a dyn Fn() -> Result<Credentials>;

impl Repository {
    /// Creates an unencrypted repository in the local directory `path`
    /// (absent or empty).
    pub fn init(path: &Path, config: Config) -> Result<Repository> {
        Repository::init_local(path, config, None)
    }

    /// Creates an encrypted repository in the local directory `path`
    /// (absent or empty), with one key file for `key`; `config`'s
    /// encryption and format version are set.
    pub fn init_encrypted(path: &Path, config: Config, key: &NewKey) -> Result<Repository> {
        Repository::init_local(path, config, Some(key))
    }

    fn init_local(path: &Path, config: Config, key: Option<&NewKey>) -> Result<Repository> {
        let config = prepare(config, key)?;
        if path.exists() {
            let mut entries = std::fs::read_dir(path)
                .map_err(|e| Error::io(format!("reading directory {}", path.display()), e))?;
            if entries.next().is_some() {
                return Err(Error::AlreadyExists(path.display().to_string()));
            }
        }
        // A new repository directory (and its new ancestors) is the owner's
        // alone; an existing empty one keeps its mode, and what is created
        // in it is private (`backend::private`).
        crate::backend::private::create_dirs(path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        Repository::create(Box::new(Local::new(path)), config, key)
    }

    /// Creates a repository at `location` (a local directory absent or
    /// empty, or an S3 prefix holding no object): encrypted with one key
    /// file for `key` if given.
    pub fn init_at(
        location: &Location,
        config: Config,
        key: Option<&NewKey>,
    ) -> Result<Repository> {
        match location {
            Location::Local(path) => Repository::init_local(path, config, key),
            Location::S3(s3) => {
                let config = prepare(config, key)?;
                let backend = S3::connect(s3)?;
                if !backend.is_empty()? {
                    return Err(Error::AlreadyExists(location.to_string()));
                }
                Repository::create(Box::new(backend), config, key)
            }
        }
    }

    /// Creates an unencrypted repository on `backend`, which must hold no
    /// configuration yet.
    pub fn init_with_backend(backend: Box<dyn Backend>, config: Config) -> Result<Repository> {
        Repository::create(backend, config, None)
    }

    /// Creates a repository on `backend`: encrypted with a new master key
    /// wrapped for `key` if given. The `config` object is written last.
    pub fn create(
        backend: Box<dyn Backend>,
        config: Config,
        key: Option<&NewKey>,
    ) -> Result<Repository> {
        let config = prepare(config, key)?;
        if backend.exists(CONFIG_KEY)? {
            return Err(Error::AlreadyExists(backend.location()));
        }
        // Writers are held off while the configuration is written; readers
        // cannot open a repository without one.
        let writers = backend.lock(LockMode::Backup)?;
        let (backend, unlocked, stored): (Box<dyn Backend>, _, _) = match key {
            None => (backend, None, config.encode()),
            Some(key) => {
                let unlocked = crypto::create_key(backend.as_ref(), key)?;
                let cipher = unlocked.cipher(config.encryption)?;
                let sealed = cipher.seal(CONFIG_KEY, &[&config.encode()])?;
                let backend = Box::new(Encrypting::new(backend, cipher));
                (
                    backend,
                    Some(unlocked),
                    Stored::encode_sealed(config.version, config.encryption, &sealed),
                )
            }
        };
        let counting = Arc::new(Counting::new(backend));
        let backend: &dyn Backend = counting.as_ref();
        backend.write_new(CONFIG_KEY, &[&stored])?;
        let readers = backend.lock(LockMode::ExcludeReaders)?;
        Ok(Repository::assemble(
            counting,
            config,
            LockMode::Exclusive,
            vec![writers, readers],
            unlocked,
        ))
    }

    fn assemble(
        counting: Arc<Counting>,
        config: Config,
        mode: LockMode,
        locks: Vec<LockGuard>,
        unlocked: Option<Unlocked>,
    ) -> Repository {
        let fingerprinter = match &unlocked {
            Some(u) => Fingerprinter::keyed(config.fingerprint, u.fingerprint_key()),
            None => Fingerprinter::plain(config.fingerprint),
        };
        Repository {
            backend: counting.clone(),
            counting,
            config,
            mode,
            shared: false,
            wait: Duration::ZERO,
            locks: Mutex::new(locks),
            unlocked,
            fingerprinter,
            dictionary: Mutex::new(None),
            dictionaries_listed: 0,
            commit_waited: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Registers the repository's compression dictionaries by name
    /// (docs/FORMAT.md §7.8), so that every entry naming one decodes: each
    /// is read when an entry first names it; a damaged one fails only the
    /// entries naming it (`check` reports it).
    fn list_dictionaries(&mut self) -> Result<()> {
        if !self.config.dictionaries() {
            return Ok(());
        }
        self.dictionaries_listed = dictionary::announce(&self.backend)?;
        Ok(())
    }

    /// The compression dictionary a backup compresses with, if the
    /// repository holds one: the newest, read (all of them, once per
    /// handle) when first asked for.
    pub fn dictionary(&self) -> Result<Option<Arc<Dictionary>>> {
        let mut d = self
            .dictionary
            .lock()
            .map_err(|_| Error::Pipeline("the dictionary handle was poisoned".into()))?;
        if let Some(known) = d.as_ref() {
            return Ok(known.clone());
        }
        let newest = match self.config.dictionaries() && self.dictionaries_listed > 0 {
            true => dictionary::load_all(self.backend.as_ref())?.newest,
            false => None,
        };
        *d = Some(newest.clone());
        Ok(newest)
    }

    /// Whether a backup compressing under `encoding` should train a
    /// dictionary: the repository may hold them and held none when it was
    /// opened (nor has this handle trained one). Reads no dictionary.
    pub fn wants_dictionary(&self, encoding: Option<crate::repo::config::Compression>) -> bool {
        let known = self.dictionary.lock().ok().and_then(|d| d.clone());
        let none = match known {
            Some(d) => d.is_none(),
            None => self.dictionaries_listed == 0,
        };
        self.config.dictionaries() && encoding.is_some_and(|c| c.is_on()) && none
    }

    /// Trains a compression dictionary from `samples` and stores it
    /// (docs/FORMAT.md §7.8), unless the repository holds one by now
    /// (another writer's, which is then used): the dictionary to compress
    /// with, `None` when the samples teach nothing.
    pub fn train_dictionary(&self, samples: &[&[u8]]) -> Result<Option<Arc<Dictionary>>> {
        self.require(LockMode::Backup, "adding a compression dictionary")?;
        if !self.config.dictionaries() {
            return Ok(None);
        }
        let found = dictionary::load_all(self.backend.as_ref())?.newest;
        let dict = match found {
            Some(d) => Some(d),
            None => dictionary::create(self.backend.as_ref(), samples)?,
        };
        if let Ok(mut d) = self.dictionary.lock() {
            *d = Some(dict.clone());
        }
        Ok(dict)
    }

    /// Opens the unencrypted repository in the local directory `path` for
    /// `mode` (see [`LockMode`]); fails with [`Error::Locked`] at once if a
    /// conflicting process holds it.
    pub fn open(path: &Path, mode: LockMode) -> Result<Repository> {
        Repository::open_waiting(path, mode, Duration::ZERO)
    }

    /// Like [`Repository::open`], but waits up to `wait` for a conflicting
    /// holder to release the repository.
    pub fn open_waiting(path: &Path, mode: LockMode, wait: Duration) -> Result<Repository> {
        let location = path.display().to_string();
        Repository::open_unlocking(path, mode, wait, &|| {
            Err(Error::PasswordRequired(location.clone()))
        })
    }

    /// Opens the repository in the local directory `path` for `mode`,
    /// waiting up to `wait` for the lock; if it is encrypted, with the
    /// credentials `unlock` returns.
    pub fn open_unlocking(
        path: &Path,
        mode: LockMode,
        wait: Duration,
        unlock: Unlock,
    ) -> Result<Repository> {
        if !path.join(CONFIG_KEY).is_file() {
            return Err(Error::NotARepository(path.display().to_string()));
        }
        Repository::open_backend_unlocking(Box::new(Local::new(path)), mode, wait, unlock)
    }

    /// Opens the repository at `location` for `mode`, waiting up to `wait`
    /// for the lock; if it is encrypted, with the credentials `unlock` returns.
    pub fn open_at(
        location: &Location,
        mode: LockMode,
        wait: Duration,
        unlock: Unlock,
    ) -> Result<Repository> {
        match location {
            Location::Local(path) => Repository::open_unlocking(path, mode, wait, unlock),
            Location::S3(_) => {
                Repository::open_backend_unlocking(location.backend()?, mode, wait, unlock)
            }
        }
    }

    /// `tessera unlock`: removes the stale lock objects of the repository
    /// at `location` (all of them with `all`) and describes each removed.
    /// Needs no password: lock objects are not encrypted (FORMAT.md §13.1).
    pub fn unlock_at(location: &Location, all: bool) -> Result<Vec<String>> {
        let backend = location.backend()?;
        if !backend.exists(CONFIG_KEY)? {
            return Err(Error::NotARepository(backend.location()));
        }
        backend.unlock(all)
    }

    /// Opens the unencrypted repository on `backend` for `mode`, without waiting.
    pub fn open_with_backend(backend: Box<dyn Backend>, mode: LockMode) -> Result<Repository> {
        Repository::open_backend_waiting(backend, mode, Duration::ZERO)
    }

    /// Opens the unencrypted repository on `backend` for `mode`, waiting up
    /// to `wait` for the lock.
    pub fn open_backend_waiting(
        backend: Box<dyn Backend>,
        mode: LockMode,
        wait: Duration,
    ) -> Result<Repository> {
        let location = backend.location();
        Repository::open_backend_unlocking(backend, mode, wait, &|| {
            Err(Error::PasswordRequired(location.clone()))
        })
    }

    /// Opens the repository on `backend` for `mode`, waiting up to `wait`
    /// for the lock; if it is encrypted, with the credentials `unlock`
    /// returns (a wrong password fails with [`Error::WrongPassword`]).
    pub fn open_backend_unlocking(
        backend: Box<dyn Backend>,
        mode: LockMode,
        wait: Duration,
        unlock: Unlock,
    ) -> Result<Repository> {
        let bytes = match backend.read(CONFIG_KEY) {
            Ok(b) => b,
            Err(Error::NotFound(_)) => return Err(Error::NotARepository(backend.location())),
            Err(e) => return Err(e),
        };
        let (backend, config, unlocked): (Box<dyn Backend>, _, _) =
            match decode_stored(backend.location(), &bytes)? {
                Stored::Plain(config) => (backend, config, None),
                Stored::Sealed(encryption, sealed) => {
                    // A session (`tessera login`) spares the key derivation.
                    let unlocked = match crypto::session::unlock(backend.as_ref()) {
                        Some(u) => u,
                        None => crypto::unlock(backend.as_ref(), &unlock()?)?,
                    };
                    let cipher = unlocked.cipher(encryption)?;
                    let config = Config::decode(&cipher.open(CONFIG_KEY, &sealed)?)?;
                    if config.encryption != encryption {
                        return Err(Error::corrupt(
                            CONFIG_KEY,
                            format!(
                                "sealed configuration says encryption {}, its header {encryption}",
                                config.encryption
                            ),
                        ));
                    }
                    let backend = Box::new(Encrypting::new(backend, cipher));
                    (backend, config, Some(unlocked))
                }
            };
        backend.cache_metadata(&config.id);
        let counting = Arc::new(Counting::new(backend));
        // A backup shares the repository with other backups when its kind
        // can (FORMAT.md §13.3); otherwise it takes the writers' lock alone.
        let (mode, shared, why) = match (mode, config.backups_share()) {
            (LockMode::Backup | LockMode::SharedBackup, Ok(())) => (LockMode::Backup, true, None),
            (LockMode::Backup | LockMode::SharedBackup, Err(why)) => {
                (LockMode::Backup, false, Some(why))
            }
            (other, _) => (other, false, None),
        };
        let taken = if shared { LockMode::SharedBackup } else { mode };
        let queued = queue(counting.as_ref(), taken, wait)?;
        let lock = lock_waiting(counting.as_ref(), taken, wait, why)?;
        let locks = queued.into_iter().chain([lock]).collect();
        let mut repo = Repository::assemble(counting, config, mode, locks, unlocked);
        repo.shared = shared;
        repo.wait = wait;
        repo.list_dictionaries()?;
        Ok(repo)
    }

    /// What this handle was opened for.
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// Fails unless this handle was opened for `needed` or more: adding a
    /// backup needs [`LockMode::Backup`] (or `Exclusive`), changing or
    /// deleting committed state [`LockMode::Exclusive`].
    pub(crate) fn require(&self, needed: LockMode, operation: &str) -> Result<()> {
        let enough = match needed {
            LockMode::Read => true,
            LockMode::Backup | LockMode::SharedBackup | LockMode::Commit => {
                self.mode.writers_lock().is_some()
            }
            LockMode::Exclusive | LockMode::ExcludeReaders => self.mode == LockMode::Exclusive,
            LockMode::Queue | LockMode::QueueCheck => false,
        };
        match enough {
            true => Ok(()),
            false => Err(Error::NotOpenFor {
                location: self.backend.location(),
                operation: operation.to_string(),
                needed: format!("{needed:?}").to_lowercase(),
            }),
        }
    }

    /// Makes a handle opened for a backup exclusive, so that it may go on
    /// to maintenance (a lifecycle backup arranging): true if readers are
    /// now excluded, false if some are reading (nothing changed then). An
    /// exclusive handle is already; a reader's never can be.
    pub fn exclude_readers(&self) -> Result<bool> {
        let mut locks = self.locks.lock().map_err(|_| {
            Error::Pipeline("the repository's lock list was poisoned by a panic".into())
        })?;
        match self.mode {
            LockMode::Exclusive => Ok(true),
            LockMode::Read
            | LockMode::ExcludeReaders
            | LockMode::SharedBackup
            | LockMode::Commit
            | LockMode::Queue
            | LockMode::QueueCheck => Ok(false),
            LockMode::Backup if self.shared => Ok(false),
            LockMode::Backup if locks.len() > 1 => Ok(true),
            LockMode::Backup => match self.backend.lock(LockMode::ExcludeReaders) {
                Ok(guard) => {
                    locks.push(guard);
                    Ok(true)
                }
                Err(Error::Locked(_)) => Ok(false),
                Err(e) => Err(e),
            },
        }
    }

    /// Changes what a long-lived handle is opened for, between
    /// [`LockMode::Read`] and [`LockMode::Exclusive`] (`tessera serve`
    /// deleting backups on request): releases its lock, then takes
    /// `mode`'s, waiting up to `wait`. When that fails it takes its former
    /// lock back (waiting as long) and returns the error; the handle is as
    /// it was unless that fails too. Not atomic: between the two, another
    /// process may take the repository.
    pub fn relock(&mut self, mode: LockMode, wait: Duration) -> Result<()> {
        let allowed = |m| matches!(m, LockMode::Read | LockMode::Exclusive);
        if !allowed(mode) || !allowed(self.mode) || self.shared {
            return Err(Error::InvalidOption(format!(
                "a handle opened for {:?} cannot be relocked for {mode:?}",
                self.mode
            )));
        }
        if mode == self.mode {
            return Ok(());
        }
        let locks = self.locks.get_mut().map_err(|_| {
            Error::Pipeline("the repository's lock list was poisoned by a panic".into())
        })?;
        locks.clear();
        let backend = self.counting.as_ref();
        match lock_waiting(backend, mode, wait, None) {
            Ok(guard) => {
                locks.push(guard);
                self.mode = mode;
                Ok(())
            }
            Err(e) => {
                locks.push(lock_waiting(backend, self.mode, wait, None)?);
                Err(e)
            }
        }
    }

    /// Whether this handle's backups share the repository with other
    /// backups (a shared-writers repository, FORMAT.md §13.3).
    pub fn shares_backups(&self) -> bool {
        self.shared
    }

    /// Enters the commit section of a shared backup (FORMAT.md §13.3):
    /// the commit lock, held until the guard drops, waited for as long as
    /// this handle waits for locks but at least [`COMMIT_WAIT`]. `None`
    /// for a handle whose backups do not share (its lock is exclusive
    /// among writers already).
    pub fn commit_section(&self) -> Result<Option<LockGuard>> {
        if !self.shared {
            return Ok(None);
        }
        let wait = self.wait.max(COMMIT_WAIT);
        let started = Instant::now();
        let taken = lock_waiting(self.backend.as_ref(), LockMode::Commit, wait, None);
        let waited = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.commit_waited
            .fetch_add(waited, std::sync::atomic::Ordering::Relaxed);
        taken.map(Some)
    }

    /// How long this handle waited for the commit lock in all, taking it
    /// included (a shared backup's `stage_seconds.commit_lock`).
    pub fn commit_lock_waited(&self) -> Duration {
        Duration::from_nanos(
            self.commit_waited
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Reserves `count` consecutive container ids for a shared backup, in
    /// its commit section (FORMAT.md §13.3): `state.next_container` rises
    /// past them, so no other writer takes them.
    pub fn reserve_containers(&self, count: u64) -> Result<std::ops::Range<ContainerId>> {
        self.require(LockMode::Backup, "reserving container ids")?;
        let first = self.next_container_id()?;
        let end = first.saturating_add(count);
        let state = self.state()?;
        self.save_state(State {
            next_container: end.max(state.next_container),
            ..state
        })?;
        Ok(first..end)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether the repository is encrypted.
    pub fn is_encrypted(&self) -> bool {
        self.unlocked.is_some()
    }

    /// The master key and key file this handle was opened with (encrypted
    /// repositories only).
    pub(crate) fn unlocked(&self) -> Option<&Unlocked> {
        self.unlocked.as_ref()
    }

    /// Computes this repository's fingerprints (keyed if it is encrypted).
    pub fn fingerprinter(&self) -> &Fingerprinter {
        &self.fingerprinter
    }

    /// The backend, counted ([`Repository::io_stats`]).
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The backend as a shareable trait object.
    pub fn shared_backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    /// I/O counted so far.
    pub fn io_stats(&self) -> IoStats {
        self.counting.stats()
    }

    /// Ids of all containers, ascending.
    pub fn containers(&self) -> Result<Vec<ContainerId>> {
        let mut ids: Vec<_> = self
            .backend
            .list(CONTAINER_DIR)?
            .iter()
            .filter_map(|n| container::parse_key_name(n))
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Ids of all committed backups, ascending.
    pub fn backups(&self) -> Result<Vec<BackupId>> {
        self.list_ids(SNAPSHOT_DIR)
    }

    /// Ids of all recipe objects (committed or left by an interrupted backup), ascending.
    pub fn recipes(&self) -> Result<Vec<BackupId>> {
        self.list_ids(RECIPE_DIR)
    }

    fn list_ids(&self, dir: &str) -> Result<Vec<BackupId>> {
        let mut ids: Vec<_> = self
            .backend
            .list(dir)?
            .iter()
            .filter_map(|n| snapshot::parse_key_name(n))
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Ids of all commit marks (backups known to have been committed), ascending.
    pub fn commit_marks(&self) -> Result<Vec<BackupId>> {
        crate::repo::commit::marked(self.backend.as_ref())
    }

    /// Backups whose data must be kept: the committed ones, and those whose
    /// snapshot is lost but whose commit mark and recipe remain (they can
    /// still be recovered, so neither GC nor reclamation may drop them).
    pub fn retained_backups(&self) -> Result<BTreeSet<BackupId>> {
        let recipes: BTreeSet<BackupId> = self.recipes()?.into_iter().collect();
        let mut kept: BTreeSet<BackupId> = self.backups()?.into_iter().collect();
        kept.extend(
            self.commit_marks()?
                .into_iter()
                .filter(|id| recipes.contains(id)),
        );
        Ok(kept)
    }

    /// Writes the commit mark of every committed backup that has none
    /// (backups of repositories written before marks existed, or whose
    /// mark write failed); snapshots that cannot be read are left to
    /// `check`. Needs a handle opened for a backup.
    pub fn write_missing_commit_marks(&self) -> Result<u64> {
        self.require(LockMode::Backup, "writing commit marks")?;
        let marked: BTreeSet<BackupId> = self.commit_marks()?.into_iter().collect();
        let mut written = 0;
        for id in self.backups()? {
            if marked.contains(&id) {
                continue;
            }
            if let Ok(snap) = self.snapshot(id) {
                crate::repo::commit::write_mark(self.backend.as_ref(), &snap)?;
                written += 1;
            }
        }
        Ok(written)
    }

    /// Commits backup `snap`: creates its snapshot (the commit point), then
    /// its commit mark. The backup is committed once the snapshot exists, so
    /// a failure to write the mark does not fail it: the next backup writes
    /// missing marks ([`Repository::write_missing_commit_marks`]).
    pub(crate) fn commit_snapshot(&self, snap: &Snapshot) -> Result<()> {
        let backend = self.backend.as_ref();
        backend.write_new(&snapshot::snapshot_key(snap.id), &[&snap.encode()?])?;
        // A missing mark is rewritten by the next backup; see above.
        crate::repo::commit::write_mark(backend, snap).ok();
        Ok(())
    }

    /// The snapshot of backup `id`.
    pub fn snapshot(&self, id: BackupId) -> Result<Snapshot> {
        match self.backend.read(&snapshot::snapshot_key(id)) {
            Ok(bytes) => Snapshot::decode(id, &bytes),
            Err(Error::NotFound(_)) => Err(Error::NoSuchBackup(id)),
            Err(e) => Err(e),
        }
    }

    /// All committed snapshots, by id.
    pub fn snapshots(&self) -> Result<Vec<Snapshot>> {
        self.backups()?
            .into_iter()
            .map(|id| self.snapshot(id))
            .collect()
    }

    /// Every backup for listing: each committed one with its snapshot, or
    /// why the snapshot cannot be read (damaged), and each backup known
    /// committed (by its commit mark) whose snapshot is missing. Never
    /// fails because of one backup.
    pub fn listing(&self) -> Result<Vec<Listed>> {
        let snapshots: BTreeSet<BackupId> = self.backups()?.into_iter().collect();
        let recipes: BTreeSet<BackupId> = self.recipes()?.into_iter().collect();
        let mut ids = snapshots.clone();
        ids.extend(self.commit_marks()?);
        Ok(ids
            .into_iter()
            .map(|id| {
                let snapshot = match (snapshots.contains(&id), recipes.contains(&id)) {
                    (true, _) => self.snapshot(id).map_err(|e| e.to_string()),
                    (false, true) => Err(format!(
                        "{}: snapshot missing (recipe intact: `tessera repair` can recover it)",
                        snapshot::snapshot_key(id)
                    )),
                    (false, false) => Err(format!(
                        "{}: snapshot and recipe missing: the backup is lost",
                        snapshot::snapshot_key(id)
                    )),
                };
                Listed { id, snapshot }
            })
            .collect())
    }

    /// The recipe of backup `id`.
    pub fn recipe(&self, id: BackupId) -> Result<Recipe> {
        match self.backend.read(&snapshot::recipe_key(id)) {
            Ok(bytes) => Recipe::decode(id, &bytes),
            Err(Error::NotFound(_)) => Err(Error::NotFound(snapshot::recipe_key(id))),
            Err(e) => Err(e),
        }
    }

    /// The id counters: the stored `state` (the larger counters of its two
    /// copies) or, when no copy is readable, a conservative recomputation
    /// ([`Repository::recomputed_state`]) — `state` is derived data and
    /// never the reason an operation fails.
    fn state(&self) -> Result<State> {
        let mut found: Option<State> = None;
        let mut damaged = false;
        for key in [STATE_KEY, STATE_COPY_KEY] {
            match self.backend.read(key).and_then(|b| decode_state(key, &b)) {
                Ok(s) => found = Some(found.map_or(s, |f| f.max(s))),
                Err(Error::NotFound(_)) => {}
                // A flipped version field reads as an unknown version.
                Err(e) if e.is_damage() || matches!(e, Error::UnsupportedVersion { .. }) => {
                    damaged = true
                }
                Err(e) => return Err(e),
            }
        }
        Ok(match (found, damaged) {
            (Some(s), _) => s,
            (None, true) => self.recomputed_state(),
            (None, false) => State::default(),
        })
    }

    /// The counters a damaged `state` stood for, as far as they can be
    /// known (the listings of recipes, snapshots, commit marks and
    /// containers are consulted by the callers anyway): the numbers its
    /// payload still parses to despite the failed checksum (only ever
    /// raising ids, which is safe), and the backup ids lifecycle lineage
    /// states record (deleted versions included).
    fn recomputed_state(&self) -> State {
        let salvaged = [STATE_KEY, STATE_COPY_KEY]
            .iter()
            .filter_map(|key| self.backend.read(key).ok())
            .filter_map(|b| salvage_state(&b))
            .fold(State::default(), State::max);
        let lineages =
            crate::layout::lifecycle::lineage_state::highest_recorded_backup(self.backend.as_ref());
        State {
            last_backup_id: salvaged.last_backup_id.max(lineages),
            ..salvaged
        }
    }

    /// Repair: when one copy of `state` is damaged or missing while the
    /// other exists (or both are damaged), rewrites both from the
    /// counters known (the larger of the readable copy, the recomputation
    /// and the listings). Returns whether it did (or, `dry_run`, would).
    pub(crate) fn repair_state(&self, dry_run: bool) -> Result<bool> {
        let mut good = 0;
        let mut bad = 0;
        for key in [STATE_KEY, STATE_COPY_KEY] {
            match self.backend.read(key).and_then(|b| decode_state(key, &b)) {
                Ok(_) => good += 1,
                Err(Error::NotFound(_)) => {}
                Err(e) if e.is_damage() || matches!(e, Error::UnsupportedVersion { .. }) => {
                    bad += 1
                }
                Err(e) => return Err(e),
            }
        }
        if bad == 0 && good != 1 {
            return Ok(false);
        }
        if !dry_run {
            let state = self.state()?;
            let last = self.next_backup_id()? - 1;
            let next = self.next_container_id()?;
            self.save_state(State {
                last_backup_id: state.last_backup_id.max(last),
                next_container: state.next_container.max(next),
            })?;
        }
        Ok(true)
    }

    /// Writes both copies of `state`.
    fn save_state(&self, state: State) -> Result<()> {
        let json = serde_json::to_vec(&state).unwrap_or_default();
        let bytes = envelope::seal(STATE_KIND, STATE_VERSION, &json);
        self.backend.write(STATE_KEY, &bytes)?;
        self.backend.write(STATE_COPY_KEY, &bytes)
    }

    /// The id the next backup gets: above every id ever committed or recorded.
    pub fn next_backup_id(&self) -> Result<BackupId> {
        let listed = self.recipes()?.last().copied().unwrap_or(0);
        let committed = self.backups()?.last().copied().unwrap_or(0);
        let marked = self.commit_marks()?.last().copied().unwrap_or(0);
        Ok(listed
            .max(committed)
            .max(marked)
            .max(self.state()?.last_backup_id)
            + 1)
    }

    /// The id the next container gets: above every existing container and
    /// every container id garbage collection recorded as used.
    pub fn next_container_id(&self) -> Result<ContainerId> {
        let listed = self.containers()?.last().map_or(1, |id| id + 1);
        Ok(listed.max(self.state()?.next_container))
    }

    /// Records that container ids below `next` are used, before containers are deleted.
    pub fn reserve_container_ids(&self, next: ContainerId) -> Result<()> {
        let state = self.state()?;
        if state.next_container < next {
            self.save_state(State {
                next_container: next,
                ..state
            })?;
        }
        Ok(())
    }

    /// Opens the repository's deduplication index.
    pub fn open_index(&self) -> Result<Box<dyn DedupIndex>> {
        let containers = self.containers()?;
        match self.config.index {
            IndexKind::Exact => Ok(Box::new(Exact::open(self.shared_backend(), &containers)?)),
            IndexKind::Ddfs if self.shared => Ok(Box::new(Ddfs::open_shared(
                self.shared_backend(),
                &containers,
                self.config.ddfs_params(),
            )?)),
            IndexKind::Ddfs => Ok(Box::new(Ddfs::open(
                self.shared_backend(),
                &containers,
                self.config.ddfs_params(),
            )?)),
            IndexKind::Hid | IndexKind::Ehid => Ok(Box::new(Ehid::open(
                self.shared_backend(),
                &containers,
                self.config
                    .ehid_params(self.config.index == IndexKind::Ehid),
            )?)),
            IndexKind::Eager | IndexKind::Lazy => Ok(Box::new(Lazy::open(
                self.shared_backend(),
                &containers,
                self.lazy_params(),
            )?)),
        }
    }

    /// Rebuilds the index from the containers' metadata and persists it.
    pub fn rebuild_index(&self) -> Result<IndexStats> {
        self.require(LockMode::Exclusive, "rebuilding the index")?;
        let containers = self.containers()?;
        let next = self.next_container_id()?;
        match self.config.index {
            IndexKind::Exact => {
                let mut index = Exact::rebuild(self.shared_backend(), &containers)?;
                index.commit(next)?;
                Ok(index.stats())
            }
            IndexKind::Ddfs => {
                let params = self.config.ddfs_params();
                let mut index = Ddfs::rebuild(self.shared_backend(), &containers, params)?;
                index.commit(next)?;
                Ok(index.stats())
            }
            IndexKind::Hid | IndexKind::Ehid => {
                let params = self
                    .config
                    .ehid_params(self.config.index == IndexKind::Ehid);
                let mut index = Ehid::rebuild(self.shared_backend(), &containers, params)?;
                index.commit(next)?;
                Ok(index.stats())
            }
            IndexKind::Eager | IndexKind::Lazy => {
                let mut index =
                    Lazy::rebuild(self.shared_backend(), &containers, self.lazy_params())?;
                index.commit(next)?;
                Ok(index.stats())
            }
        }
    }

    fn lazy_params(&self) -> LazyParams {
        let mode = if self.config.index == IndexKind::Lazy {
            LazyMode::Lazy
        } else {
            LazyMode::Eager
        };
        self.config.lazy_params(mode)
    }

    /// Removes backup `id`'s commit mark, then its snapshot, then its
    /// recipe (layouts free the space). An interruption after the mark
    /// leaves the backup committed without a mark (as in repositories
    /// written before marks existed; the next backup writes it again), one
    /// after the snapshot an uncommitted recipe: never a backup that looks
    /// damaged.
    pub(crate) fn remove_snapshot(&self, id: BackupId) -> Result<()> {
        self.require(LockMode::Exclusive, "deleting a backup")?;
        let snap = self.snapshot(id)?;
        let last = self.backups()?.last().copied().unwrap_or(0);
        let state = self.state()?;
        if state.last_backup_id < last {
            self.save_state(State {
                last_backup_id: last,
                ..state
            })?;
        }
        self.backend
            .delete(&crate::repo::commit::mark_key(snap.id))?;
        self.backend.delete(&snapshot::snapshot_key(snap.id))?;
        self.backend.delete(&snapshot::recipe_key(snap.id))
    }
}

impl State {
    /// The larger of both counters (each only ever rises).
    fn max(self, other: State) -> State {
        State {
            last_backup_id: self.last_backup_id.max(other.last_backup_id),
            next_container: self.next_container.max(other.next_container),
        }
    }
}

/// Decodes a `state` object.
fn decode_state(key: &str, bytes: &[u8]) -> Result<State> {
    let payload = envelope::open(key, STATE_KIND, STATE_VERSION, bytes)?;
    serde_json::from_slice(payload).map_err(|e| Error::corrupt(key, format!("invalid JSON: {e}")))
}

/// The counters of a damaged `state` object whose payload still parses.
fn salvage_state(bytes: &[u8]) -> Option<State> {
    let payload = bytes.get(envelope::HEADER_LEN..)?;
    // The first JSON value, whatever follows it (the checksum, or nothing).
    serde_json::Deserializer::from_slice(payload)
        .into_iter::<State>()
        .next()?
        .ok()
}

/// The `config` object as stored; an undecodable one is reported as a
/// damaged configuration, which stops every command.
fn decode_stored(location: String, bytes: &[u8]) -> Result<Stored> {
    match Stored::decode(bytes) {
        Err(Error::Corrupt { detail, .. }) => Err(Error::DamagedConfig {
            location,
            cause: detail,
        }),
        decoded => decoded,
    }
}

/// `config` with the encryption (and format version) that `key` implies,
/// validated: none without a key; with one, the configuration's cipher, or
/// AES-256-GCM if it names none.
fn prepare(mut config: Config, key: Option<&NewKey>) -> Result<Config> {
    let encryption = match (key, config.encryption) {
        (None, _) => Encryption::None,
        (Some(_), Encryption::None) => Encryption::Aes256Gcm,
        (Some(_), chosen) => chosen,
    };
    config.set_protection(encryption, config.compression);
    config.validate_new()?;
    // A key derivation cost below the minimum fails before anything exists.
    key.map(NewKey::checked_kdf).transpose()?;
    Ok(config)
}

/// Takes `backend`'s lock in `mode`, retrying for up to `wait` while
/// another process holds a conflicting one: every 100 ms plus up to 50 ms
/// that depend on the process, so that processes racing for lock objects
/// (which both back off when they meet, FORMAT.md §13.1) do not keep
/// meeting.
fn lock_waiting(
    backend: &dyn Backend,
    mode: LockMode,
    wait: Duration,
    why: Option<&str>,
) -> Result<LockGuard> {
    // Polled, since a lock object cannot be waited on: first soon (the
    // commit lock is held for milliseconds, and waiters that all slept
    // 100 ms would idle a fleet of backups that start or end together),
    // then less often, the interval doubling up to the backend's retry
    // interval (an OS lock: 5 ms, so that a long waiter is not passed by
    // newcomers; a lock object: 100 ms), spread by process so that waiters
    // do not retry in step.
    let base = backend.lock_retry();
    let spread = base.as_millis().clamp(2, 100) as u64 / 2;
    let retry = base + Duration::from_millis(u64::from(std::process::id()) % spread);
    let mut interval = Duration::from_millis(2 + u64::from(std::process::id() % 3)).min(retry);
    let started = Instant::now();
    let mut reported = Duration::ZERO;
    loop {
        match backend.lock(mode) {
            Err(Error::Locked(holder)) if started.elapsed() < wait => {
                let waited = started.elapsed();
                if waited >= reported + WAIT_REPORT_EVERY {
                    reported = waited;
                    report_wait(&format!(
                        "waiting for the {} lock of {holder}{} ({}s of up to {}s)",
                        lock_name(mode),
                        why.map(|w| format!(": {w}")).unwrap_or_default(),
                        waited.as_secs(),
                        wait.as_secs()
                    ));
                }
                std::thread::sleep(interval.min(wait.saturating_sub(started.elapsed())));
                interval = (interval * 2).min(retry);
            }
            Err(Error::Locked(holder)) => {
                return Err(Error::Locked(match why {
                    Some(w) => format!("{holder} ({w})"),
                    None => holder,
                }))
            }
            taken => return taken,
        }
    }
}

/// The queue lock (FORMAT.md §13.3) before the lock of `mode`: maintenance
/// (`Exclusive`) takes it and holds it until it ends (returned), so that
/// backups starting meanwhile wait for it; a backup waits while it is held
/// and lets it go at once. Up to `wait` each.
fn queue(backend: &dyn Backend, mode: LockMode, wait: Duration) -> Result<Option<LockGuard>> {
    match mode {
        LockMode::Exclusive => lock_waiting(backend, LockMode::Queue, wait, None).map(Some),
        LockMode::Backup | LockMode::SharedBackup => {
            let why = "maintenance is queued: backups starting now wait for it";
            lock_waiting(backend, LockMode::QueueCheck, wait, Some(why))?;
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// How long a shared backup waits for the commit lock at least: the other
/// holders only commit, which is short.
pub const COMMIT_WAIT: Duration = Duration::from_secs(3600);

/// How often a process waiting for a lock says so.
const WAIT_REPORT_EVERY: Duration = Duration::from_secs(10);

/// What a lock of `mode` is called in messages.
fn lock_name(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Read => "readers'",
        LockMode::Commit => "commit",
        LockMode::Backup | LockMode::SharedBackup => "writers'",
        LockMode::Exclusive | LockMode::ExcludeReaders => "exclusive",
        LockMode::Queue | LockMode::QueueCheck => "queue",
    }
}

/// Where messages about lock waits go ([`report_lock_waits`]).
static WAIT_REPORTER: std::sync::OnceLock<WaitReporter> = std::sync::OnceLock::new();

/// Receives the messages of lock waits.
pub type WaitReporter = Box<dyn Fn(&str) + Send + Sync>;

/// Has every wait for a repository lock of this process reported to
/// `report`, every 10 seconds while it lasts (once per process; later
/// calls are ignored). Without it waits are silent.
pub fn report_lock_waits(report: WaitReporter) {
    let _ = WAIT_REPORTER.set(report);
}

fn report_wait(message: &str) {
    if let Some(report) = WAIT_REPORTER.get() {
        report(message);
    }
}
