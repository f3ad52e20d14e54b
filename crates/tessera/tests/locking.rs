//! Repository locking: one exclusive holder (a writer) excludes every other
//! opener with a clear "locked" error; readers share.

use tessera::backup::{backup, BackupOptions};
use tessera::config::Config;
use tessera::{Error, Repository};

fn new_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path(), Config::new("locking-test".into())).unwrap();
    let input = vec![7u8; 100_000];
    backup(&repo, &mut &input[..], "input", &BackupOptions::default()).unwrap();
    dir
}

fn assert_locked(result: tessera::Result<Repository>) {
    match result {
        Err(e @ Error::Locked(_)) => {
            let message = e.to_string();
            assert!(message.contains("locked"), "{message}");
        }
        Err(e) => panic!("expected a locked error, got {e:?}"),
        Ok(_) => panic!("a second opener got the repository while it is held exclusively"),
    }
}

#[test]
fn second_writer_is_refused_while_one_holds_the_lock() {
    let dir = new_repo();
    let writer = Repository::open(dir.path(), true).unwrap();
    assert_locked(Repository::open(dir.path(), true));
    assert_locked(Repository::open(dir.path(), false));
    // The holder is unaffected and can still back up.
    let input = vec![9u8; 50_000];
    let snap = backup(&writer, &mut &input[..], "input", &BackupOptions::default()).unwrap();
    assert_eq!(snap.id, 2);
    drop(writer);
    // Released with the repository.
    let writer = Repository::open(dir.path(), true).unwrap();
    assert_eq!(writer.backups().unwrap(), vec![1, 2]);
}

#[test]
fn readers_share_but_exclude_writers() {
    let dir = new_repo();
    let r1 = Repository::open(dir.path(), false).unwrap();
    let r2 = Repository::open(dir.path(), false).unwrap();
    assert_eq!(r1.backups().unwrap(), r2.backups().unwrap());
    assert_locked(Repository::open(dir.path(), true));
    drop(r1);
    assert_locked(Repository::open(dir.path(), true));
    drop(r2);
    Repository::open(dir.path(), true).unwrap();
}

#[test]
fn init_holds_the_lock_until_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path(), Config::new("locking-test".into())).unwrap();
    assert_locked(Repository::open(dir.path(), true));
    drop(repo);
    Repository::open(dir.path(), true).unwrap();
}

#[test]
fn lock_is_taken_across_threads() {
    let dir = new_repo();
    let writer = Repository::open(dir.path(), true).unwrap();
    let path = dir.path().to_path_buf();
    let other = std::thread::spawn(move || Repository::open(&path, true).map(|_| ()));
    match other.join().unwrap() {
        Err(Error::Locked(_)) => {}
        other => panic!("expected a locked error from another thread, got {other:?}"),
    }
    drop(writer);
}
