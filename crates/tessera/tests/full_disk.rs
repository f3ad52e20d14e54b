//! A full disk during a backup: a backend that fails writes with
//! `StorageFull` once a byte budget is spent. The backup must return a typed
//! error (never panic), and the repository must stay consistent: it checks
//! clean, earlier backups restore byte-identically, and a new backup works.

mod common;

use common::{backup_bytes, full_check, restored};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tessera::backend::testing::{Gate, Gated, Mutation};
use tessera::backend::LockMode;
use tessera::backup::BackupOptions;
use tessera::repo::config::Config;
use tessera::{Error, Repository, Result};

/// The writes a backend was asked to make: key and size, in order.
type WriteLog = Arc<Mutex<Vec<(String, usize)>>>;

/// Writes succeed while their bytes fit in the budget; the first write that
/// does not fit fails with `StorageFull` and so does every write after it
/// (the disk stays full). Records every write attempted; deletes pass.
struct FullDisk {
    budget: AtomicU64,
    writes: WriteLog,
}

impl FullDisk {
    fn new(root: &Path, budget: u64) -> (Gated<FullDisk>, WriteLog) {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let gate = FullDisk {
            budget: AtomicU64::new(budget),
            writes: writes.clone(),
        };
        (Gated::local(root, gate), writes)
    }
}

impl Gate for FullDisk {
    fn check(&self, request: Mutation) -> Result<()> {
        let Mutation::Write { key, len } = request else {
            return Ok(());
        };
        self.writes.lock().unwrap().push((key.to_string(), len));
        let fits = self
            .budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(len as u64)
            })
            .is_ok();
        if !fits {
            self.budget.store(0, Ordering::SeqCst);
            return Err(Error::io(
                format!("writing {key}"),
                io::Error::new(
                    io::ErrorKind::StorageFull,
                    "no space left on device (simulated)",
                ),
            ));
        }
        Ok(())
    }
}

/// Deterministic pseudo-random bytes (xorshift64*).
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn config() -> Config {
    let mut c = Config::new("full-disk-test".into());
    // Small containers, so that one backup writes many of them.
    c.container_size = 512 * 1024;
    c
}

/// The inputs: two earlier backups, then the one that meets the full disk
/// (half of it new data, half shared with the first backup).
fn inputs() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let first = data(1, 3 << 20);
    let second = data(2, 1 << 20);
    let mut third = data(3, 3 << 20);
    third.extend_from_slice(&first[..2 << 20]);
    (first, second, third)
}

/// A repository holding the two earlier backups (ids 1 and 2).
fn prepare(root: &Path) {
    let (first, second, _) = inputs();
    let repo = Repository::init(root, config()).unwrap();
    for (i, input) in [first, second].iter().enumerate() {
        let snap = backup_bytes(&repo, &input[..], "input", &BackupOptions::default())
            .map(|o| o.snapshot)
            .unwrap();
        assert_eq!(snap.id, i as u64 + 1);
    }
}

/// Runs the third backup with `budget` bytes of free space; returns the
/// error and the writes attempted.
fn backup_with_budget(root: &Path, budget: u64) -> (Result<u64>, Vec<(String, usize)>) {
    let (_, _, third) = inputs();
    let (disk, writes) = FullDisk::new(root, budget);
    let repo = Repository::open_with_backend(Box::new(disk), LockMode::Exclusive).unwrap();
    let result = backup_bytes(&repo, &third[..], "third", &BackupOptions::default())
        .map(|o| o.snapshot)
        .map(|s| s.id);
    let writes = writes.lock().unwrap().clone();
    (result, writes)
}

/// Whether `e` is (or is caused by) a `StorageFull` I/O error.
fn is_storage_full(e: &Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::StorageFull {
                return true;
            }
        }
        source = s.source();
    }
    false
}

/// After a failed backup: the repository (opened normally) checks clean,
/// holds exactly the earlier backups, they restore, and a new backup works.
fn assert_consistent(root: &Path) {
    let (first, second, third) = inputs();
    let repo = Repository::open(root, LockMode::Exclusive).unwrap();
    let report = full_check(&repo);
    assert!(
        report.is_ok(),
        "check found problems: {:?}",
        report.problems
    );
    assert_eq!(repo.backups().unwrap(), vec![1, 2]);
    assert_eq!(restored(&repo, 1), first);
    assert_eq!(restored(&repo, 2), second);
    let snap = backup_bytes(&repo, &third[..], "third", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap();
    assert_eq!(restored(&repo, snap.id), third);
    let report = full_check(&repo);
    assert!(
        report.is_ok(),
        "check found problems: {:?}",
        report.problems
    );
}

#[test]
fn full_disk_at_every_kind_of_write_fails_cleanly() {
    // A dry run with unlimited space records the writes the backup makes.
    let dry = tempfile::tempdir().unwrap();
    prepare(dry.path());
    let (result, writes) = backup_with_budget(dry.path(), u64::MAX);
    assert_eq!(result.unwrap(), 3);
    let kind = |k: &str| k.split('/').next().unwrap().to_string();
    let containers: Vec<usize> = (0..writes.len())
        .filter(|&i| kind(&writes[i].0) == "containers")
        .collect();
    assert!(
        containers.len() >= 4,
        "the backup writes several containers: {writes:?}"
    );
    let position = |k: &str| {
        writes
            .iter()
            .position(|(key, _)| kind(key) == k)
            .unwrap_or_else(|| panic!("no {k} write in {writes:?}"))
    };
    // Which write fails: the first, a middle and the last container, the
    // index, the recipe and the snapshot.
    let targets = [
        ("first container", containers[0]),
        ("middle container", containers[containers.len() / 2]),
        ("last container", *containers.last().unwrap()),
        ("index", position("index")),
        ("recipe", position("recipes")),
        ("snapshot", position("snapshots")),
    ];
    for (what, i) in targets {
        let before: u64 = writes[..i].iter().map(|(_, n)| *n as u64).sum();
        // Room for everything before, and for part of the write that fails.
        for budget in [before, before + writes[i].1 as u64 / 2] {
            let dir = tempfile::tempdir().unwrap();
            prepare(dir.path());
            let (result, attempted) = backup_with_budget(dir.path(), budget);
            let err = match result {
                Ok(id) => panic!("{what}: backup {id} succeeded with {budget} bytes free"),
                Err(e) => e,
            };
            assert!(is_storage_full(&err), "{what}: unexpected error {err:?}");
            let message = err.to_string();
            assert!(message.contains("writing"), "{what}: {message}");
            // The failing write is the one aimed at.
            let failed = attempted
                .iter()
                .scan(0u64, |sum, (k, n)| {
                    *sum += *n as u64;
                    Some((k.clone(), *sum))
                })
                .find(|(_, sum)| *sum > budget)
                .map(|(k, _)| k)
                .unwrap();
            // The index and the recipe are written at once (FORMAT.md §15),
            // as containers are by several threads: which of them meets the
            // full disk first varies, and the error names one of them.
            let concurrent = |k: &str| ["index", "recipes"].contains(&k);
            let (failed_kind, aimed_kind) = (kind(&failed), kind(&writes[i].0));
            assert!(
                failed_kind == aimed_kind || concurrent(&failed_kind) && concurrent(&aimed_kind),
                "{what}: failed at {failed}"
            );
            let named = if failed_kind == "containers" {
                message.contains("containers/")
            } else if concurrent(&failed_kind) {
                message.contains("index/") || message.contains("recipes/")
            } else {
                message.contains(&failed)
            };
            assert!(named, "{what}: {message} does not name {failed}");
            assert_consistent(dir.path());
        }
    }
}

#[test]
fn full_disk_from_the_start() {
    for budget in [0, 1000, 100_000] {
        let dir = tempfile::tempdir().unwrap();
        prepare(dir.path());
        let (result, _) = backup_with_budget(dir.path(), budget);
        let err = result.expect_err("no space at all");
        assert!(is_storage_full(&err), "{err:?}");
        assert_consistent(dir.path());
    }
}

#[test]
fn full_disk_during_init() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, _) = FullDisk::new(dir.path(), 10);
    let err = Repository::init_with_backend(Box::new(disk), config())
        .err()
        .expect("init cannot write its config");
    assert!(is_storage_full(&err), "{err:?}");
    // Nothing usable was left behind: it is not a repository, and a later
    // init with space succeeds.
    assert!(matches!(
        Repository::open(dir.path(), LockMode::Read),
        Err(Error::NotARepository(_))
    ));
    let (disk, _) = FullDisk::new(dir.path(), u64::MAX);
    let repo = Repository::init_with_backend(Box::new(disk), config()).unwrap();
    drop(repo);
    let repo = Repository::open(dir.path(), LockMode::Exclusive).unwrap();
    let input = data(9, 100_000);
    let snap = backup_bytes(&repo, &input[..], "input", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap();
    assert_eq!(restored(&repo, snap.id), input);
}
