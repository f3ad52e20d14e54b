//! A fault-injecting backend layer for tests and fault campaigns: a seeded
//! share of requests fails before reaching the store, fails after the
//! store did the work (a lost response), or, for reads, returns a
//! truncated object — what an unreliable network does to object storage.

use crate::backend::{Backend, Layer, ObjectImage, WriteMode};
use crate::error::{Error, Result};
use bytes::Bytes;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a request suffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// Fails without reaching the store.
    Drop,
    /// Reaches the store, then fails (writes and deletes: the change is
    /// made; reads: the bytes are cut short and returned).
    After,
}

/// Wraps a backend and injects faults into a seeded share of its requests.
pub struct Faulty {
    inner: Box<dyn Backend>,
    /// SplitMix64 state: the sequence of faults is a function of the seed
    /// and the order of requests.
    state: Mutex<u64>,
    /// Faults per million requests, for each of the two kinds.
    per_million: u64,
    injected: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
}

impl Faulty {
    /// Injects into `inner` about `percent` % dropped requests and as many
    /// lost responses or truncated reads, chosen by `seed`.
    pub fn new(inner: Box<dyn Backend>, seed: u64, percent: f64) -> Faulty {
        Faulty {
            inner,
            state: Mutex::new(seed),
            per_million: (percent.clamp(0.0, 50.0) * 10_000.0) as u64,
            injected: Arc::new(AtomicU64::new(0)),
            requests: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The count of faults injected, shared (it stays readable once the
    /// layer is moved into a repository).
    pub fn injected(&self) -> Arc<AtomicU64> {
        self.injected.clone()
    }

    /// The count of requests that went through the layer (faulty or not), shared.
    pub fn requests(&self) -> Arc<AtomicU64> {
        self.requests.clone()
    }

    fn next(&self) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn roll(&self) -> Fault {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let fault = match self.next() % 1_000_000 {
            r if r < self.per_million => Fault::Drop,
            r if r < 2 * self.per_million => Fault::After,
            _ => Fault::None,
        };
        if fault != Fault::None {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        fault
    }

    fn error(&self, doing: &str, key: &str) -> Error {
        Error::io(
            format!("{doing} {}/{key}", self.inner.location()),
            io::Error::other("injected fault"),
        )
    }

    /// A change (`op`) under a roll: dropped, made, or made and reported failed.
    fn change<T>(&self, doing: &str, key: &str, op: impl FnOnce() -> Result<T>) -> Result<T> {
        match self.roll() {
            Fault::Drop => Err(self.error(doing, key)),
            Fault::After => op().and_then(|_| Err(self.error(doing, key))),
            Fault::None => op(),
        }
    }

    /// A read (`op`) under a roll: dropped, cut short, or whole.
    fn fetch<T: Truncate>(&self, key: &str, op: impl FnOnce() -> Result<T>) -> Result<T> {
        match self.roll() {
            Fault::Drop => Err(self.error("reading", key)),
            Fault::After => op().map(|data| {
                let len = data.len();
                let keep = (self.next() % (len as u64 + 1)) as usize;
                data.truncated(keep.min(len.saturating_sub(1)))
            }),
            Fault::None => op(),
        }
    }

    /// A query (`op`) under a roll: dropped or answered.
    fn query<T>(&self, doing: &str, key: &str, op: impl FnOnce() -> Result<T>) -> Result<T> {
        match self.roll() {
            Fault::None => op(),
            _ => Err(self.error(doing, key)),
        }
    }
}

/// Bytes a read returned, which a fault may cut short.
trait Truncate {
    fn len(&self) -> usize;
    /// The first `len` bytes.
    fn truncated(self, len: usize) -> Self;
}

impl Truncate for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn truncated(mut self, len: usize) -> Self {
        self.truncate(len);
        self
    }
}

impl Truncate for Bytes {
    fn len(&self) -> usize {
        Bytes::len(self)
    }
    fn truncated(self, len: usize) -> Self {
        self.slice(..len)
    }
}

/// Every request (reads, writes, deletes, listings, sizes, existence
/// checks) rolls for a fault; locks and hints (read-ahead,
/// `--connections`, the metadata cache) go to the inner backend untouched.
impl Layer for Faulty {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
    fn read(&self, key: &str) -> Result<Vec<u8>> {
        self.fetch(key, || self.inner.read(key))
    }
    fn read_shared(&self, key: &str) -> Result<Bytes> {
        self.fetch(key, || self.inner.read_shared(key))
    }
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.fetch(key, || self.inner.read_range(key, offset, len))
    }
    fn read_range_cached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.fetch(key, || self.inner.read_range_cached(key, offset, len))
    }
    fn size(&self, key: &str) -> Result<u64> {
        self.query("inspecting", key, || self.inner.size(key))
    }
    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        self.change("writing", key, || self.inner.write(key, data))
    }
    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.change("writing", key, || self.inner.write_parts(key, parts))
    }
    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.change("writing", key, || self.inner.write_new(key, parts))
    }
    fn write_new_filled(
        &self,
        key: &str,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut dyn ObjectImage) -> Result<()>,
    ) -> Result<()> {
        self.change("writing", key, || {
            self.inner.write_new_filled(key, len_hint, fill)
        })
    }
    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        self.change("writing", key, || {
            self.inner.write_streamed(key, mode, produce)
        })
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.change("deleting", key, || self.inner.delete(key))
    }
    fn list(&self, dir: &str) -> Result<Vec<String>> {
        self.query("listing", dir, || self.inner.list(dir))
    }
    fn exists(&self, key: &str) -> Result<bool> {
        self.query("inspecting", key, || self.inner.exists(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testing::assert_forwards_locks_and_hints;
    use crate::backend::{Local, Location, LockMode};
    use crate::backup::{self, BackupOptions, Source};
    use crate::commands::check::{check, CheckOptions};
    use crate::repo::config::Config;
    use crate::restore::{restore, RestoreOptions};
    use crate::Repository;

    /// Seeded incompressible bytes (a SplitMix64 stream).
    fn data(seed: u64, len: usize) -> Vec<u8> {
        let f = Faulty::new(Box::new(Local::new("/nonexistent")), seed, 0.0);
        (0..len.div_ceil(8))
            .flat_map(|_| f.next().to_le_bytes())
            .take(len)
            .collect()
    }

    /// At the highest rate every request suffers a fault: whichever way an
    /// object is read it fails or comes back short, whichever way it is
    /// changed the caller sees a failure, and each counts as one request.
    #[test]
    fn every_request_rolls_for_a_fault() {
        let dir = tempfile::tempdir().unwrap();
        let local: &dyn Backend = &Local::new(dir.path());
        local.write("data/a", &[7; 100]).unwrap();
        let faulty = Faulty::new(Box::new(Local::new(dir.path())), 3, 50.0);
        let (injected, requests) = (faulty.injected(), faulty.requests());
        let b: &dyn Backend = &faulty;
        let short = |read: Result<Vec<u8>>, len| read.map_or(true, |d| d.len() < len);
        let mut fill = |image: &mut dyn ObjectImage| {
            image.append(b"filled");
            Ok(())
        };
        let mut produce =
            |out: &mut dyn Write| out.write_all(b"streamed").map_err(|e| Error::io("b", e));
        for i in 0..10 {
            assert!(short(b.read("data/a"), 100));
            assert!(b.read_shared("data/a").map_or(true, |d| d.len() < 100));
            assert!(short(b.read_range("data/a", 10, 50), 50));
            assert!(short(b.read_range_cached("data/a", 10, 50), 50));
            assert!(b.size("data/a").is_err() && b.exists("data/a").is_err());
            assert!(b.list("data").is_err());
            let key = format!("data/b{i}");
            assert!(b.write(&key, b"x").is_err());
            assert!(b.write_parts(&key, &[b"x", b"y"]).is_err());
            assert!(b.write_new(&format!("data/c{i}"), &[b"x"]).is_err());
            assert!(b
                .write_new_filled(&format!("data/d{i}"), 8, &mut fill)
                .is_err());
            let streamed =
                b.write_streamed(&format!("data/e{i}"), WriteMode::CreateNew, &mut produce);
            assert!(streamed.is_err());
            assert!(b.delete(&key).is_err());
        }
        assert_eq!(requests.load(Ordering::Relaxed), 10 * 13);
        assert_eq!(injected.load(Ordering::Relaxed), 10 * 13);
        // Untouched: the faults were in transit.
        assert_eq!(local.read("data/a").unwrap(), [7u8; 100]);
    }

    /// Locks and hints (read-ahead, `--connections`, the metadata cache)
    /// are not requests: they reach the store even when every request fails.
    #[test]
    fn locks_and_hints_reach_the_inner_backend() {
        assert_forwards_locks_and_hints(|inner| Box::new(Faulty::new(inner, 3, 50.0)));
    }

    /// Where the campaign's repository lives: a local directory, or the
    /// S3 location `TESSERA_FAULT_S3` names (scripts/fault-campaign.sh).
    enum Store {
        Local(std::path::PathBuf),
        S3(Location),
    }

    impl Store {
        fn backend(&self) -> Box<dyn Backend> {
            match self {
                Store::Local(root) => Box::new(Local::new(root)),
                Store::S3(location) => location.backend().unwrap(),
            }
        }
    }

    /// The repository through a faulty layer seeded `seed`, opened for a
    /// backup (`None` if opening failed), and its fault and request counts.
    fn faulty(store: &Store, seed: u64) -> (Option<Repository>, Arc<AtomicU64>, Arc<AtomicU64>) {
        let backend = Faulty::new(store.backend(), seed, 1.5);
        let (count, requests) = (backend.injected(), backend.requests());
        let repo = Repository::open_with_backend(Box::new(backend), LockMode::Backup).ok();
        (repo, count, requests)
    }

    /// A bounded campaign: every backup through a layer failing ~3 % of
    /// requests either commits (and then restores identically, also read
    /// back through faults: identical or a clean error) or fails, leaving
    /// the repository checking clean with every earlier backup intact.
    /// `TESSERA_FAULT_ROUNDS` sets the rounds (default 24) and
    /// `TESSERA_FAULT_S3` an S3 location to run on instead of a local
    /// directory (scripts/fault-campaign.sh runs 100 rounds on both).
    #[test]
    fn backups_through_faults_commit_whole_or_fail_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let rounds: u64 = env("TESSERA_FAULT_ROUNDS").map_or(24, |r| r.parse().unwrap());
        let store = match env("TESSERA_FAULT_S3") {
            Some(url) => Store::S3(url.parse().unwrap()),
            None => Store::Local(dir.path().to_path_buf()),
        };
        let config = Config::new("faults".into());
        drop(Repository::init_with_backend(store.backend(), config).unwrap());
        let mut committed: Vec<(u64, Vec<u8>)> = Vec::new();
        let (mut failed, mut restore_failures, mut faults, mut requests) = (0, 0, 0, 0);
        let mut restores = 0;
        for round in 0..rounds {
            let input = data(round, 300_000 + (round as usize % 5) * 150_000);
            // Part of each input repeats an earlier one: duplicates too.
            let input = [&input[..], &data(round / 2, 200_000)].concat();
            let (repo, injected, made) = faulty(&store, 1000 + round);
            if let Some(repo) = repo {
                let mut reader: &[u8] = &input;
                let source = Source::Data {
                    input: &mut reader,
                    name: "input",
                };
                match backup::run(&repo, source, &BackupOptions::default()) {
                    Ok(outcome) => committed.push((outcome.snapshot.id, input)),
                    Err(_) => failed += 1,
                }
                for (id, expected) in &committed {
                    let mut out = Vec::new();
                    restores += 1;
                    match restore(&repo, *id, &mut out, &RestoreOptions::default()) {
                        Ok(_) => assert_eq!(&out, expected, "backup {id} restored wrong bytes"),
                        Err(_) => restore_failures += 1,
                    }
                }
            } else {
                failed += 1;
            }
            faults += injected.load(Ordering::Relaxed);
            requests += made.load(Ordering::Relaxed);
            let clean = Repository::open_with_backend(store.backend(), LockMode::Read).unwrap();
            let report = check(
                &clean,
                CheckOptions {
                    read_data: true,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(report.problems.is_empty(), "round {round}: {report:?}");
            for (id, expected) in &committed {
                let mut out = Vec::new();
                restore(&clean, *id, &mut out, &RestoreOptions::default()).unwrap();
                assert_eq!(&out, expected, "backup {id} lost or changed");
            }
        }
        eprintln!(
            "fault campaign: {rounds} rounds, {faults} faults injected in {requests} requests \
             ({:.2} %); {} backups committed, {failed} failed cleanly (none lost: every \
             committed backup restored byte-identically after every round, check clean); \
             of {restores} restores through faults {restore_failures} failed cleanly, none \
             restored wrong bytes",
            faults as f64 * 100.0 / requests.max(1) as f64,
            committed.len()
        );
        assert!(!committed.is_empty() && failed > 0 && faults > 0);
    }
}
