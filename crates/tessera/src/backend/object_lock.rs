//! Repository locks as objects, for stores without OS locks (object
//! storage): each holder writes `locks/<random>` naming its mode, owner,
//! host, process and time, refreshes it while it works and deletes it when
//! done (FORMAT.md §13.1).

use super::{Backend, LockGuard, LockMode};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Directory of the lock objects.
pub const LOCKS_DIR: &str = "locks";
/// A holder rewrites its lock object this often.
pub const REFRESH: Duration = Duration::from_secs(5 * 60);
/// A lock object not refreshed for this long is stale: its holder died
/// (or lost the store) and it no longer excludes anybody.
pub const STALE: Duration = Duration::from_secs(30 * 60);
/// Version of the lock object's JSON.
const LOCK_VERSION: u32 = 1;

/// The content of a lock object.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LockRecord {
    /// Format version (1).
    pub version: u32,
    /// `read`, `backup`, `exclusive` or `exclude-readers`.
    pub mode: String,
    /// The user running the holder.
    pub user: String,
    /// The holder's host name.
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// When the lock was taken (seconds since the Unix epoch).
    pub created: u64,
    /// When it was last refreshed (seconds since the Unix epoch).
    pub refreshed: u64,
}

impl LockRecord {
    fn new(mode: LockMode) -> LockRecord {
        let now = now_secs();
        LockRecord {
            version: LOCK_VERSION,
            mode: mode_name(mode).to_string(),
            user: std::env::var("USER").unwrap_or_default(),
            host: host_name(),
            pid: std::process::id(),
            created: now,
            refreshed: now,
        }
    }

    fn lock_mode(&self) -> Option<LockMode> {
        [
            LockMode::Read,
            LockMode::Backup,
            LockMode::SharedBackup,
            LockMode::Commit,
            LockMode::Exclusive,
            LockMode::ExcludeReaders,
            LockMode::Queue,
            LockMode::QueueCheck,
        ]
        .into_iter()
        .find(|m| mode_name(*m) == self.mode)
    }

    /// Whether the lock no longer excludes anybody: not refreshed for
    /// [`STALE`], or held by a process of this host that no longer runs.
    pub fn is_stale(&self) -> bool {
        let old = now_secs().saturating_sub(self.refreshed) > STALE.as_secs();
        old || (self.host == host_name() && !process_runs(self.pid))
    }

    fn describe(&self, key: &str) -> String {
        format!(
            "{key}: {} lock of {}@{} pid {}, taken {}s ago, refreshed {}s ago",
            self.mode,
            self.user,
            self.host,
            self.pid,
            now_secs().saturating_sub(self.created),
            now_secs().saturating_sub(self.refreshed)
        )
    }
}

fn mode_name(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Read => "read",
        LockMode::Backup => "backup",
        LockMode::SharedBackup => "shared-backup",
        LockMode::Commit => "commit",
        LockMode::Exclusive => "exclusive",
        LockMode::ExcludeReaders => "exclude-readers",
        LockMode::Queue => "queue",
        LockMode::QueueCheck => "queue-check",
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// This machine's host name (empty if unknown).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Whether process `pid` of this host runs (Linux: it has a `/proc` entry;
/// elsewhere assumed).
fn process_runs(pid: u32) -> bool {
    !cfg!(target_os = "linux") || std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// A lock object as found: its record, or why it cannot be read (then it
/// conflicts with every mode until `tessera unlock` removes it).
struct Found {
    key: String,
    record: std::result::Result<LockRecord, String>,
}

impl Found {
    fn conflicts_with(&self, mode: LockMode) -> bool {
        match &self.record {
            Ok(r) => !r.is_stale() && r.lock_mode().is_none_or(|m| m.conflicts_with(mode)),
            Err(_) => true,
        }
    }

    fn describe(&self) -> String {
        match &self.record {
            Ok(r) => r.describe(&self.key),
            Err(why) => format!("{}: unreadable lock object ({why})", self.key),
        }
    }
}

/// Every lock object in `store` (objects that vanish while listed are skipped).
fn found(store: &dyn Backend) -> Result<Vec<Found>> {
    let mut all = Vec::new();
    for name in store.list(LOCKS_DIR)? {
        let key = format!("{LOCKS_DIR}/{name}");
        let record = match store.read(&key) {
            Ok(bytes) => serde_json::from_slice::<LockRecord>(&bytes).map_err(|e| e.to_string()),
            Err(Error::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        all.push(Found { key, record });
    }
    Ok(all)
}

/// Lock records this process read, by store location and key: a lock
/// object's name is random and never reused, and its holder rewrites it
/// only to raise `refreshed`, so a record read once still tells the mode,
/// host and process, and — while its `refreshed` is less than [`STALE`]
/// old — that it is not stale by age (the object's own `refreshed` is at
/// least as recent). Waiting for a lock then costs a listing and a read of
/// each new lock object per try, not a read of every one: with many
/// clients, tries that each read every lock object last long enough to
/// overlap, and racing tries all back off (FORMAT.md §13.1).
static SEEN: std::sync::Mutex<BTreeMap<(String, String), LockRecord>> =
    std::sync::Mutex::new(BTreeMap::new());

/// The record of lock object `key`, from [`SEEN`] while that is younger
/// than [`STALE`], otherwise read (and remembered); `None` if the object
/// vanished meanwhile.
fn record_of(
    store: &dyn Backend,
    location: &str,
    key: &str,
) -> Result<Option<std::result::Result<LockRecord, String>>> {
    let id = (location.to_string(), key.to_string());
    let young = |r: &LockRecord| now_secs().saturating_sub(r.refreshed) < STALE.as_secs();
    if let Ok(seen) = SEEN.lock() {
        if let Some(r) = seen.get(&id).filter(|r| young(r)) {
            return Ok(Some(Ok(r.clone())));
        }
    }
    let record = match store.read(key) {
        Ok(bytes) => serde_json::from_slice::<LockRecord>(&bytes).map_err(|e| e.to_string()),
        Err(Error::NotFound(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    if let (Ok(r), Ok(mut seen)) = (&record, SEEN.lock()) {
        seen.insert(id, r.clone());
    }
    Ok(Some(record))
}

/// The first lock object other than `own` that conflicts with `mode`
/// (records as [`record_of`] gives them).
fn conflict(store: &dyn Backend, mode: LockMode, own: Option<&str>) -> Result<Option<String>> {
    let location = store.location();
    let names = store.list(LOCKS_DIR)?;
    let keys: BTreeSet<String> = names.iter().map(|n| format!("{LOCKS_DIR}/{n}")).collect();
    if let Ok(mut seen) = SEEN.lock() {
        // Only listed objects are remembered: the others are gone for good.
        seen.retain(|(l, k), _| *l != location || keys.contains(k));
    }
    for key in keys {
        if Some(key.as_str()) == own {
            continue;
        }
        let Some(record) = record_of(store, &location, &key)? else {
            continue;
        };
        let f = Found { key, record };
        if f.conflicts_with(mode) {
            return Ok(Some(f.describe()));
        }
    }
    Ok(None)
}

/// Takes the lock `mode` on `store` without waiting: fails with
/// [`Error::Locked`] naming a conflicting holder if one is listed before
/// this lock object is written or after it (then it is deleted again: of
/// two processes racing for conflicting locks, neither or one gets it).
/// The returned guard refreshes the object every [`REFRESH`] and deletes
/// it when dropped.
pub fn acquire(store: Arc<dyn Backend>, mode: LockMode) -> Result<LockGuard> {
    let locked = |holder: String| Error::Locked(format!("{} ({holder})", store.location()));
    if let Some(holder) = conflict(store.as_ref(), mode, None)? {
        return Err(locked(holder));
    }
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| {
        Error::io(
            "choosing a lock object name",
            std::io::Error::other(e.to_string()),
        )
    })?;
    let key = format!("{LOCKS_DIR}/{}", hex::encode(id));
    let record = LockRecord::new(mode);
    let bytes = serde_json::to_vec(&record).unwrap_or_default();
    store.write_new(&key, &[&bytes])?;
    match conflict(store.as_ref(), mode, Some(&key)) {
        Ok(None) => {}
        Ok(Some(holder)) => {
            store.delete(&key).ok();
            return Err(locked(holder));
        }
        Err(e) => {
            store.delete(&key).ok();
            return Err(e);
        }
    }
    let (stop, stopped) = mpsc::channel::<()>();
    let refresher = {
        let store = store.clone();
        let key = key.clone();
        std::thread::spawn(move || loop {
            match stopped.recv_timeout(REFRESH) {
                Err(RecvTimeoutError::Timeout) => {
                    let record = LockRecord {
                        refreshed: now_secs(),
                        ..record.clone()
                    };
                    let bytes = serde_json::to_vec(&record).unwrap_or_default();
                    // A failed refresh is retried at the next period; the
                    // lock goes stale only after STALE without one.
                    let _ = store.write(&key, &bytes);
                }
                _ => {
                    store.delete(&key).ok();
                    return;
                }
            }
        })
    };
    Ok(LockGuard::from_holder(Box::new(Held {
        stop: Some(stop),
        refresher: Some(refresher),
    })))
}

/// A held lock object: dropping it stops the refresher, which deletes it.
struct Held {
    stop: Option<Sender<()>>,
    refresher: Option<JoinHandle<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.refresher.take() {
            let _ = t.join();
        }
    }
}

/// Removes the stale (and unreadable) lock objects of `store`, or all of
/// them with `all`; returns a description of each removed.
pub fn remove(store: &dyn Backend, all: bool) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for f in found(store)? {
        let stale = f.record.as_ref().map_or(true, LockRecord::is_stale);
        if all || stale {
            store.delete(&f.key)?;
            removed.push(f.describe());
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Local;

    fn store() -> (tempfile::TempDir, Arc<dyn Backend>) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Backend> = Arc::new(Local::new(dir.path()));
        (dir, store)
    }

    #[test]
    fn lock_objects_exclude_as_the_os_locks_do() {
        let (_dir, s) = store();
        let backup = acquire(s.clone(), LockMode::Backup).unwrap();
        let read = acquire(s.clone(), LockMode::Read).unwrap();
        for mode in [LockMode::Backup, LockMode::Exclusive] {
            assert!(matches!(acquire(s.clone(), mode), Err(Error::Locked(_))));
        }
        assert!(matches!(
            acquire(s.clone(), LockMode::ExcludeReaders),
            Err(Error::Locked(_))
        ));
        drop(read);
        let maint = acquire(s.clone(), LockMode::ExcludeReaders).unwrap();
        assert!(matches!(
            acquire(s.clone(), LockMode::Read),
            Err(Error::Locked(_))
        ));
        drop((backup, maint));
        // Released locks leave no object behind.
        assert!(s.list(LOCKS_DIR).unwrap().is_empty());
        let _x = acquire(s.clone(), LockMode::Exclusive).unwrap();
        match acquire(s.clone(), LockMode::Read) {
            Err(Error::Locked(msg)) => assert!(msg.contains("exclusive lock of"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stale_and_unreadable_locks_are_removed_by_unlock() {
        let (_dir, s) = store();
        let dead = LockRecord {
            refreshed: now_secs() - STALE.as_secs() - 10,
            ..LockRecord::new(LockMode::Exclusive)
        };
        s.write("locks/dead", &serde_json::to_vec(&dead).unwrap())
            .unwrap();
        // A stale lock excludes nobody.
        let held = acquire(s.clone(), LockMode::Backup).unwrap();
        s.write("locks/garbage", b"not json").unwrap();
        assert!(matches!(
            acquire(s.clone(), LockMode::Read),
            Err(Error::Locked(_))
        ));
        let removed = remove(s.as_ref(), false).unwrap();
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert_eq!(s.list(LOCKS_DIR).unwrap().len(), 1);
        let _r = acquire(s.clone(), LockMode::Read).unwrap();
        assert_eq!(remove(s.as_ref(), true).unwrap().len(), 2);
        drop(held);
        assert!(s.list(LOCKS_DIR).unwrap().is_empty());
    }

    #[test]
    fn remembered_records_answer_only_while_young() {
        let (_dir, s) = store();
        let put = |key: &str, r: &LockRecord| s.write(key, &serde_json::to_vec(r).unwrap());
        // A young record read once answers from memory: its object is not
        // read again (a holder rewrites it only to raise `refreshed`).
        put("locks/live", &LockRecord::new(LockMode::Read)).unwrap();
        assert!(conflict(s.as_ref(), LockMode::Exclusive, None)
            .unwrap()
            .is_some());
        s.write("locks/live", b"not json").unwrap();
        assert_eq!(conflict(s.as_ref(), LockMode::Backup, None).unwrap(), None);
        // An old one is read again: a holder that refreshed it meanwhile
        // must not be taken for stale.
        let old = LockRecord {
            refreshed: now_secs() - STALE.as_secs() - 10,
            ..LockRecord::new(LockMode::Exclusive)
        };
        put("locks/old", &old).unwrap();
        assert_eq!(conflict(s.as_ref(), LockMode::Backup, None).unwrap(), None);
        put("locks/old", &LockRecord::new(LockMode::Exclusive)).unwrap();
        let holder = conflict(s.as_ref(), LockMode::Backup, None).unwrap();
        assert!(
            holder
                .as_deref()
                .is_some_and(|h| h.contains("exclusive lock of")),
            "{holder:?}"
        );
        // Objects no longer listed are forgotten.
        s.delete("locks/live").unwrap();
        conflict(s.as_ref(), LockMode::Read, None).unwrap();
        let location = s.location();
        let remembered = SEEN.lock().unwrap();
        assert!(!remembered.contains_key(&(location.clone(), "locks/live".to_string())));
        assert!(remembered.contains_key(&(location, "locks/old".to_string())));
    }

    #[test]
    fn a_lock_of_a_process_that_no_longer_runs_is_stale() {
        let r = LockRecord {
            pid: u32::MAX - 1,
            ..LockRecord::new(LockMode::Backup)
        };
        assert_eq!(r.is_stale(), cfg!(target_os = "linux"));
        assert!(!LockRecord::new(LockMode::Backup).is_stale());
    }
}
