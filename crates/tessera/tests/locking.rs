//! Repository locking: maintenance excludes everybody, a backup excludes
//! other writers but not readers, readers share; and commits are exclusive
//! by construction, so that even two writers that both believe they hold
//! the lock never replace each other's objects.

mod common;

use common::{backup_bytes, full_check, Rng};
use std::path::Path;
use tessera::backend::{Backend, Layer, Local, LockGuard, LockMode};
use tessera::backup::BackupOptions;
use tessera::repo::config::{Config, Layout};
use tessera::restore::{restore, RestoreOptions};
use tessera::{Error, Repository};

fn new_repo(layout: Layout) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new("locking-test".into());
    // The single-writer protocol (format versions 1 to 4, FORMAT.md §13);
    // shared writers are tested below.
    config.set_single_writer();
    config.layout = layout;
    let repo = Repository::init(dir.path(), config).unwrap();
    let input = vec![7u8; 100_000];
    backup_bytes(&repo, &input[..], "input", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap();
    dir
}

fn assert_locked(result: tessera::Result<Repository>) {
    match result {
        Err(e @ Error::Locked(_)) => {
            let message = e.to_string();
            assert!(message.contains("locked"), "{message}");
        }
        Err(e) => panic!("expected a locked error, got {e:?}"),
        Ok(_) => panic!("a second opener got the repository while a conflicting lock is held"),
    }
}

#[test]
fn maintenance_excludes_everybody() {
    let dir = new_repo(Layout::Container);
    let holder = Repository::open(dir.path(), LockMode::Exclusive).unwrap();
    for mode in [LockMode::Read, LockMode::Backup, LockMode::Exclusive] {
        assert_locked(Repository::open(dir.path(), mode));
    }
    // The holder is unaffected and can still back up.
    let input = vec![9u8; 50_000];
    let snap = backup_bytes(&holder, &input[..], "input", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap();
    assert_eq!(snap.id, 2);
    drop(holder);
    // Released with the repository.
    let writer = Repository::open(dir.path(), LockMode::Exclusive).unwrap();
    assert_eq!(writer.backups().unwrap(), vec![1, 2]);
}

#[test]
fn a_backup_excludes_writers_but_readers_read_committed_state() {
    let dir = new_repo(Layout::Container);
    let writer = Repository::open(dir.path(), LockMode::Backup).unwrap();
    assert_locked(Repository::open(dir.path(), LockMode::Backup));
    assert_locked(Repository::open(dir.path(), LockMode::Exclusive));
    let reader = Repository::open(dir.path(), LockMode::Read).unwrap();
    let input = vec![9u8; 50_000];
    backup_bytes(&writer, &input[..], "input", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap();
    assert_eq!(reader.backups().unwrap(), vec![1, 2]);
    let mut out = Vec::new();
    restore(&reader, 2, &mut out, &RestoreOptions::default()).unwrap();
    assert_eq!(out, input);
}

#[test]
fn readers_share_and_hold_off_maintenance_only() {
    let dir = new_repo(Layout::Container);
    let r1 = Repository::open(dir.path(), LockMode::Read).unwrap();
    let r2 = Repository::open(dir.path(), LockMode::Read).unwrap();
    assert_eq!(r1.backups().unwrap(), r2.backups().unwrap());
    assert_locked(Repository::open(dir.path(), LockMode::Exclusive));
    Repository::open(dir.path(), LockMode::Backup).unwrap();
    drop(r1);
    assert_locked(Repository::open(dir.path(), LockMode::Exclusive));
    drop(r2);
    Repository::open(dir.path(), LockMode::Exclusive).unwrap();
}

#[test]
fn a_handle_does_only_what_it_was_opened_for() {
    let dir = new_repo(Layout::Container);
    let reader = Repository::open(dir.path(), LockMode::Read).unwrap();
    let input = vec![1u8; 10_000];
    let err = backup_bytes(&reader, &input[..], "input", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap_err();
    assert!(matches!(err, Error::NotOpenFor { .. }), "{err:?}");
    drop(reader);
    let writer = Repository::open(dir.path(), LockMode::Backup).unwrap();
    let err = tessera::commands::delete::delete_backup(&writer, 1).unwrap_err();
    assert!(matches!(err, Error::NotOpenFor { .. }), "{err:?}");
    assert_eq!(writer.backups().unwrap(), vec![1]);
}

#[test]
fn a_reader_relocks_to_delete_only_when_no_one_else_reads() {
    use std::time::Duration;
    let dir = new_repo(Layout::Container);
    let mut server = Repository::open(dir.path(), LockMode::Read).unwrap();
    let other = Repository::open(dir.path(), LockMode::Read).unwrap();
    // Another reader: refused, and the handle still reads (and its lock still holds off maintenance).
    assert!(matches!(
        server.relock(LockMode::Exclusive, Duration::ZERO),
        Err(Error::Locked(_))
    ));
    assert_eq!(server.mode(), LockMode::Read);
    assert_eq!(server.backups().unwrap(), vec![1]);
    drop(other);
    assert_locked(Repository::open(dir.path(), LockMode::Exclusive));
    server.relock(LockMode::Exclusive, Duration::ZERO).unwrap();
    assert_locked(Repository::open(dir.path(), LockMode::Read));
    tessera::commands::delete::delete_backup(&server, 1).unwrap();
    server.relock(LockMode::Read, Duration::ZERO).unwrap();
    // Readers share again; maintenance waits.
    drop(Repository::open(dir.path(), LockMode::Read).unwrap());
    assert_locked(Repository::open(dir.path(), LockMode::Exclusive));
    assert!(server.relock(LockMode::Backup, Duration::ZERO).is_err());
}

#[test]
fn a_lifecycle_backup_defers_arranging_while_others_read() {
    let dir = new_repo(Layout::Lifecycle);
    let reader = Repository::open(dir.path(), LockMode::Read).unwrap();
    let writer = Repository::open(dir.path(), LockMode::Backup).unwrap();
    let mut rng = Rng(5);
    let input = rng.bytes(200_000);
    let source = tessera::backup::Input::Stream {
        input: &mut &input[..],
        name: "input",
    };
    let outcome = tessera::backup::backup(&writer, source, &BackupOptions::default()).unwrap();
    assert!(outcome.arrange_deferred && outcome.arrange.is_none());
    let mut out = Vec::new();
    restore(
        &reader,
        outcome.snapshot.id,
        &mut out,
        &RestoreOptions::default(),
    )
    .unwrap();
    assert_eq!(out, input);
    drop(reader);
    // With no reader left, the next backup arranges, catching up.
    let source = tessera::backup::Input::Stream {
        input: &mut &input[..],
        name: "input",
    };
    let outcome = tessera::backup::backup(&writer, source, &BackupOptions::default()).unwrap();
    let arranged = outcome.arrange.expect("arranging ran");
    assert!(!outcome.arrange_deferred);
    assert_eq!(arranged.pending_rounds, 0);
    assert!(arranged.rounds >= 2, "{arranged:?}");
}

/// A shared-writers repository (FORMAT.md §13.3): backups share the
/// writers' lock, take turns in the commit section, and maintenance
/// excludes them; a kind that cannot share still serializes, saying why.
#[test]
fn shared_backups_share_and_take_turns_committing() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path(), Config::new("shared".into())).unwrap();
    drop(repo);
    let a = Repository::open(dir.path(), LockMode::Backup).unwrap();
    let b = Repository::open(dir.path(), LockMode::Backup).unwrap();
    assert!(a.shares_backups() && b.shares_backups());
    assert_locked(Repository::open(dir.path(), LockMode::Exclusive));
    let _reader = Repository::open(dir.path(), LockMode::Read).unwrap();
    let section = a
        .commit_section()
        .unwrap()
        .expect("a shared backup's section");
    assert!(matches!(
        b.backend().lock(LockMode::Commit),
        Err(Error::Locked(_))
    ));
    // Container ids come in disjoint blocks.
    let first = a.reserve_containers(10).unwrap();
    let second = b.reserve_containers(10).unwrap();
    assert!(first.end <= second.start, "{first:?} {second:?}");
    drop(section);
    drop(b.commit_section().unwrap());
    let input = vec![3u8; 80_000];
    let one = backup_bytes(&a, &input[..], "a", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap();
    let two = backup_bytes(&b, &input[..], "b", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap();
    assert_eq!((one.id, two.id), (1, 2));
    drop((a, b));

    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new("serial".into());
    config.layout = Layout::Lifecycle;
    drop(Repository::init(dir.path(), config).unwrap());
    let a = Repository::open(dir.path(), LockMode::Backup).unwrap();
    assert!(!a.shares_backups());
    match Repository::open(dir.path(), LockMode::Backup) {
        Err(e @ Error::Locked(_)) => assert!(e.to_string().contains("one backup at a time"), "{e}"),
        other => panic!("expected a locked error, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn init_holds_the_lock_until_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path(), Config::new("locking-test".into())).unwrap();
    assert_locked(Repository::open(dir.path(), LockMode::Read));
    assert_locked(Repository::open(dir.path(), LockMode::Backup));
    drop(repo);
    Repository::open(dir.path(), LockMode::Exclusive).unwrap();
}

#[test]
fn lock_is_taken_across_threads() {
    let dir = new_repo(Layout::Container);
    let writer = Repository::open(dir.path(), LockMode::Backup).unwrap();
    let path = dir.path().to_path_buf();
    let other = std::thread::spawn(move || Repository::open(&path, LockMode::Backup).map(|_| ()));
    match other.join().unwrap() {
        Err(Error::Locked(_)) => {}
        other => panic!("expected a locked error from another thread, got {other:?}"),
    }
    drop(writer);
}

/// A local backend whose lock excludes nobody: two writers that both
/// believe they hold the repository (a lock lost on a network file system).
struct Unlocked(Local);

/// Everything but the lock is the directory's.
impl Layer for Unlocked {
    fn inner(&self) -> &dyn Backend {
        &self.0
    }
    fn lock(&self, _mode: LockMode) -> tessera::Result<LockGuard> {
        Ok(LockGuard::default())
    }
}

/// Two writers run at once without a working lock, over randomized inputs:
/// each backup either commits or fails cleanly; nothing committed is ever
/// replaced, and every committed backup restores byte-identically.
#[test]
fn two_writers_without_a_lock_never_overwrite_each_other() {
    for layout in [Layout::Container, Layout::Lifecycle] {
        let (mut commits, mut conflicts) = (0, 0);
        for trial in 0..20u64 {
            let c = writers_race(layout, trial);
            commits += c;
            conflicts += 2 - c;
        }
        eprintln!("{layout:?}: 40 racing backups, {commits} committed, {conflicts} refused");
        // The race is real (both writers pick the same next id), and
        // some backups still get through.
        assert!(commits >= 1 && conflicts >= 1, "{commits} {conflicts}");
    }
}

/// One race; returns how many of the two backups committed.
fn writers_race(layout: Layout, trial: u64) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new("race".into());
    config.layout = layout;
    config.container_size = 256 * 1024;
    drop(Repository::init(dir.path(), config).unwrap());
    let mut rng = Rng(trial * 2 + 11);
    let inputs: Vec<Vec<u8>> = (0..2)
        .map(|_| {
            let n = 200_000 + (rng.next() % 1_500_000) as usize;
            rng.bytes(n)
        })
        .collect();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = inputs
            .iter()
            .enumerate()
            .map(|(w, input)| {
                let root = dir.path();
                s.spawn(move || race_one(root, input, &format!("writer{w}")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let repo = Repository::open(dir.path(), LockMode::Read).unwrap();
    let mut committed = Vec::new();
    for (result, input) in results.iter().zip(&inputs) {
        match result {
            Ok(id) => committed.push((*id, input)),
            Err(e) => assert!(
                matches!(e, Error::ObjectExists(_)),
                "{layout:?} trial {trial}: a writer failed otherwise than by a conflict: {e}"
            ),
        }
    }
    if committed.len() == 2 {
        assert_ne!(
            committed[0].0, committed[1].0,
            "two backups committed one id"
        );
    }
    for &(id, input) in &committed {
        let mut out = Vec::new();
        restore(&repo, id, &mut out, &RestoreOptions::default())
            .unwrap_or_else(|e| panic!("{layout:?} trial {trial}: backup {id}: {e}"));
        assert!(
            out == *input,
            "{layout:?} trial {trial}: backup {id} restored wrong bytes"
        );
    }
    // Whatever failed left only garbage: the committed state checks clean.
    let report = full_check(&repo);
    assert!(
        report.is_ok(),
        "{layout:?} trial {trial}: {:?}",
        report.problems
    );
    committed.len()
}

fn race_one(root: &Path, input: &[u8], source: &str) -> tessera::Result<u64> {
    let backend: Box<dyn Backend> = Box::new(Unlocked(Local::new(root)));
    let repo = Repository::open_with_backend(backend, LockMode::Backup)?;
    let options = BackupOptions {
        source: source.into(),
        ..BackupOptions::default()
    };
    backup_bytes(&repo, input, "input", &options)
        .map(|o| o.snapshot)
        .map(|s| s.id)
}
