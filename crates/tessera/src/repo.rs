//! A repository: its backend, configuration and lock, and the listing and
//! loading of its objects.

use crate::backend::{Backend, Counting, IoStats, Local, LockGuard};
use crate::config::{Config, IndexKind, CONFIG_KEY};
use crate::container::{self, ContainerId, CONTAINER_DIR};
use crate::envelope;
use crate::error::{Error, Result};
use crate::index::{
    Ddfs, DdfsParams, DedupIndex, Ehid, EhidParams, Exact, IndexStats, Lazy, LazyMode, LazyParams,
};
use crate::snapshot::{self, BackupId, Recipe, Snapshot, RECIPE_DIR, SNAPSHOT_DIR};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

const STATE_KEY: &str = "state";
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
    /// logical_bytes / physical_bytes (`None` when nothing is stored).
    pub dedup_ratio: Option<f64>,
}

/// An open repository.
pub struct Repository {
    backend: Arc<Counting>,
    config: Config,
    exclusive: bool,
    _lock: LockGuard,
}

impl Repository {
    /// Creates a repository in the local directory `path` (absent or empty).
    pub fn init(path: &Path, config: Config) -> Result<Repository> {
        config.validate_new()?;
        if path.exists() {
            let mut entries = std::fs::read_dir(path)
                .map_err(|e| Error::io(format!("reading directory {}", path.display()), e))?;
            if entries.next().is_some() {
                return Err(Error::AlreadyExists(path.display().to_string()));
            }
        }
        std::fs::create_dir_all(path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        Repository::init_with_backend(Box::new(Local::new(path)), config)
    }

    /// Creates a repository on `backend`, which must hold no configuration yet.
    pub fn init_with_backend(backend: Box<dyn Backend>, config: Config) -> Result<Repository> {
        config.validate_new()?;
        let backend = Arc::new(Counting::new(backend));
        if backend.exists(CONFIG_KEY)? {
            return Err(Error::AlreadyExists(backend.location()));
        }
        let lock = backend.lock(true)?;
        backend.write(CONFIG_KEY, &config.encode())?;
        Ok(Repository {
            backend,
            config,
            exclusive: true,
            _lock: lock,
        })
    }

    /// Opens the repository in the local directory `path`, with a shared
    /// lock (readers) or an exclusive one (writers).
    pub fn open(path: &Path, exclusive: bool) -> Result<Repository> {
        if !path.join(CONFIG_KEY).is_file() {
            return Err(Error::NotARepository(path.display().to_string()));
        }
        Repository::open_with_backend(Box::new(Local::new(path)), exclusive)
    }

    /// Opens the repository on `backend`.
    pub fn open_with_backend(backend: Box<dyn Backend>, exclusive: bool) -> Result<Repository> {
        let backend = Arc::new(Counting::new(backend));
        let bytes = match backend.read(CONFIG_KEY) {
            Ok(b) => b,
            Err(Error::NotFound(_)) => return Err(Error::NotARepository(backend.location())),
            Err(e) => return Err(e),
        };
        let config = Config::decode(&bytes)?;
        let lock = backend.lock(exclusive)?;
        Ok(Repository {
            backend,
            config,
            exclusive,
            _lock: lock,
        })
    }

    /// Whether this handle holds the exclusive lock.
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The counting backend.
    pub fn backend(&self) -> &Arc<Counting> {
        &self.backend
    }

    /// The backend as a shareable trait object.
    pub fn shared_backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    /// I/O counted so far.
    pub fn io_stats(&self) -> IoStats {
        self.backend.stats()
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

    /// The recipe of backup `id`.
    pub fn recipe(&self, id: BackupId) -> Result<Recipe> {
        match self.backend.read(&snapshot::recipe_key(id)) {
            Ok(bytes) => Recipe::decode(id, &bytes),
            Err(Error::NotFound(_)) => Err(Error::NotFound(snapshot::recipe_key(id))),
            Err(e) => Err(e),
        }
    }

    fn state(&self) -> Result<State> {
        match self.backend.read(STATE_KEY) {
            Ok(bytes) => {
                let payload = envelope::open(STATE_KEY, STATE_KIND, STATE_VERSION, &bytes)?;
                serde_json::from_slice(payload)
                    .map_err(|e| Error::corrupt(STATE_KEY, format!("invalid JSON: {e}")))
            }
            Err(Error::NotFound(_)) => Ok(State::default()),
            Err(e) => Err(e),
        }
    }

    fn save_state(&self, state: State) -> Result<()> {
        let json = serde_json::to_vec(&state).unwrap_or_default();
        self.backend
            .write(STATE_KEY, &envelope::seal(STATE_KIND, STATE_VERSION, &json))
    }

    /// The id the next backup gets: above every id ever committed or recorded.
    pub fn next_backup_id(&self) -> Result<BackupId> {
        let listed = self.recipes()?.last().copied().unwrap_or(0);
        let committed = self.backups()?.last().copied().unwrap_or(0);
        Ok(listed.max(committed).max(self.state()?.last_backup_id) + 1)
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
            IndexKind::Ddfs => Ok(Box::new(Ddfs::open(
                self.shared_backend(),
                &containers,
                DdfsParams::from_config(&self.config),
            )?)),
            IndexKind::Hid | IndexKind::Ehid => Ok(Box::new(Ehid::open(
                self.shared_backend(),
                &containers,
                EhidParams::from_config(&self.config, self.config.index == IndexKind::Ehid),
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
        let containers = self.containers()?;
        let next = self.next_container_id()?;
        match self.config.index {
            IndexKind::Exact => {
                let mut index = Exact::rebuild(self.shared_backend(), &containers)?;
                index.commit(next)?;
                Ok(index.stats())
            }
            IndexKind::Ddfs => {
                let params = DdfsParams::from_config(&self.config);
                let mut index = Ddfs::rebuild(self.shared_backend(), &containers, params)?;
                index.commit(next)?;
                Ok(index.stats())
            }
            IndexKind::Hid | IndexKind::Ehid => {
                let params =
                    EhidParams::from_config(&self.config, self.config.index == IndexKind::Ehid);
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
        LazyParams::from_config(&self.config, mode)
    }

    /// Totals over the whole repository.
    pub fn totals(&self) -> Result<RepoTotals> {
        if self.config.layout == crate::config::Layout::Lifecycle {
            return crate::lifecycle::totals(self);
        }
        let snapshots = self.snapshots()?;
        let containers = self.containers()?;
        let mut physical_bytes = 0;
        for &c in &containers {
            physical_bytes += if self.config.trace {
                // Trace containers store no data: count the size they stand for.
                let head =
                    self.backend
                        .read_range(&container::key(c), 0, container::HEADER_LEN as u64)?;
                container::Header::parse(c, &head)?.total_len() as u64
            } else {
                self.backend.size(&container::key(c))?
            };
        }
        let logical_bytes = snapshots.iter().map(|s| s.logical_bytes).sum();
        Ok(RepoTotals {
            backups: snapshots.len() as u64,
            logical_bytes,
            physical_bytes,
            containers: containers.len() as u64,
            dedup_ratio: crate::backup::ratio(logical_bytes, physical_bytes),
        })
    }

    /// Deletes backup `id`. In the container layout, space is reclaimed by
    /// garbage collection; the lifecycle layout frees it at once.
    pub fn delete_backup(&self, id: BackupId) -> Result<()> {
        match self.config.layout {
            crate::config::Layout::Container => self.remove_snapshot(id),
            crate::config::Layout::Lifecycle => {
                crate::lifecycle::delete_backups(self, &[id]).map(|_| ())
            }
        }
    }

    /// Removes backup `id`'s snapshot, then its recipe (layouts free the space).
    pub(crate) fn remove_snapshot(&self, id: BackupId) -> Result<()> {
        let snap = self.snapshot(id)?;
        let last = self.backups()?.last().copied().unwrap_or(0);
        let state = self.state()?;
        if state.last_backup_id < last {
            self.save_state(State {
                last_backup_id: last,
                ..state
            })?;
        }
        self.backend.delete(&snapshot::snapshot_key(snap.id))?;
        self.backend.delete(&snapshot::recipe_key(snap.id))
    }
}
