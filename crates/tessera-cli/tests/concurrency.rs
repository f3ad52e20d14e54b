//! Processes at once, end to end: a backup in progress holds off a second
//! writer even when files of the repository are removed meanwhile (the lock
//! is not tied to a path), a writer told to `--wait` gets in afterwards
//! with its own id, and `list` and `restore` read committed backups while
//! a backup runs.

mod common;

use common::*;
use rand::Rng;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};

/// Starts `tessera backup --json REPO -` and feeds it `first` bytes, keeping
/// its standard input open: a backup in progress.
fn start_backup(repo: &Path, first: &[u8]) -> Child {
    start_backup_with(&[], &repo.display().to_string(), first)
}

/// Feeds `rest`, closes standard input and returns the committed id.
fn finish_backup(mut child: Child, rest: &[u8]) -> u64 {
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(rest).expect("feeding the backup");
    drop(stdin);
    let out = child.wait_with_output().expect("waiting for the backup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    num(&v, "id")
}

/// Waits until the backup process has taken its lock: deleting a backup
/// that does not exist fails for the lock rather than for the id. (A
/// process needs a moment to start and open the repository.)
fn wait_until_locked(repo: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let out = run(["delete", "--wait", "0s", &repo.display().to_string(), "999"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "deleted a backup that does not exist"
        );
        if err.contains("locked") {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "never locked: {err}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_second_writer_waits_or_fails_even_with_repository_files_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = rng(19);
    for trial in 0..20 {
        let repo = tmp.path().join(format!("repo{trial}"));
        // An index whose backups take one at a time (FORMAT.md §13.3);
        // concurrent_backups.rs tests backups that share.
        ok([
            "init".as_ref(),
            repo.as_os_str(),
            "--index".as_ref(),
            "lazy".as_ref(),
        ]);
        let base = tmp.path().join(format!("base{trial}"));
        write_random_file(&base, 1000 + trial, 300_000);
        assert_eq!(num(&backup_json(&repo, &base), "id"), 1);

        let first = random_bytes(2000 + trial, rng.random_range(1..600_000));
        let rest = random_bytes(3000 + trial, rng.random_range(0..600_000));
        let running = start_backup(&repo, &first);
        wait_until_locked(&repo);
        // What a user cleaning up, or a sync tool, may remove meanwhile:
        // the lock file of earlier versions, temporary files.
        for entry in std::fs::read_dir(&repo).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "lock" || name.starts_with('.') {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        // Readers read committed state while the backup runs.
        assert_eq!(list_ids(&repo), vec![1]);
        assert_restore_stdout_matches(&repo, "1", &mut std::fs::File::open(&base).unwrap());

        let second = tmp.path().join(format!("second{trial}"));
        write_random_file(&second, 4000 + trial, rng.random_range(1..400_000));
        let repo_s = repo.display().to_string();
        let second_s = second.display().to_string();
        let waits = rng.random_bool(0.5);
        let expected: Vec<u8> = [first.as_slice(), rest.as_slice()].concat();
        if waits {
            let waiter = cmd(["backup", "--json", "--wait", "60s", &repo_s, "-"])
                .stdin(std::fs::File::open(&second).unwrap())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(rng.random_range(0..200)));
            assert_eq!(finish_backup(running, &rest), 2, "trial {trial}");
            let out = waiter.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "trial {trial}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(num(&v, "id"), 3, "trial {trial}");
            assert_restore_stdout_matches(&repo, "3", &mut std::fs::File::open(&second).unwrap());
        } else {
            let line = fail([
                "backup".to_string(),
                "--wait".into(),
                "0s".into(),
                repo_s.clone(),
                second_s,
            ]);
            assert!(line.contains("locked"), "trial {trial}: {line}");
            assert_eq!(finish_backup(running, &rest), 2, "trial {trial}");
        }
        assert_restore_stdout_matches(&repo, "2", &mut &expected[..]);
        assert_restore_stdout_matches(&repo, "1", &mut std::fs::File::open(&base).unwrap());
        ok(["check".to_string(), repo_s, "--read-data".into()]);
        std::fs::remove_dir_all(&repo).unwrap();
    }
}
