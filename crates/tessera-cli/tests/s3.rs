//! The command line against a real S3 server: the main scenarios (both
//! layouts, several indexes, encrypted and not), lock objects (a holder
//! excludes, a dead holder's lock is stale, `unlock`), and several clients
//! backing up into one repository at once with `gc` and deletions in
//! between.
//!
//! The server is named by `TESSERA_TEST_S3` (`s3:http://HOST:PORT/BUCKET`,
//! with `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` set): `.ci/run` starts
//! one; locally `eval "$(scripts/s3-server.sh start)"`. Without it every
//! test here but the stalled-server one (which needs no server) is
//! reported as ignored, its name saying SKIPPED and why (this file has its
//! own `main`, libtest-mimic, so the verdict can depend on the server).

mod common;

use common::*;
use libtest_mimic::{Arguments, Trial};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A fresh repository location on the test server (a prefix no other test
/// or run uses), or `None` (the test is skipped, saying so) without one.
fn s3_repo(test: &str) -> Option<String> {
    match std::env::var("TESSERA_TEST_S3") {
        Ok(base) if !base.is_empty() => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            Some(format!(
                "{}/{test}-{}-{nanos}",
                base.trim_end_matches('/'),
                std::process::id()
            ))
        }
        _ => {
            eprintln!(
                "SKIPPED {test}: TESSERA_TEST_S3 is not set (start a server with \
                 `eval \"$(scripts/s3-server.sh start)\"`; CI always sets it)"
            );
            None
        }
    }
}

/// `tessera backup --json` of `inputs` with extra `args`, parsed: one
/// regular file is a stream backup of its bytes (on standard input).
fn backup(repo: &str, inputs: &[&Path], args: &[&str]) -> serde_json::Value {
    let mut all: Vec<String> = vec!["backup".into(), "--json".into(), repo.into()];
    let out = match inputs {
        [file] if file.is_file() => {
            all.push("-".into());
            all.extend(args.iter().map(|a| a.to_string()));
            ok_with_input(all, file)
        }
        _ => {
            all.extend(inputs.iter().map(|p| p.display().to_string()));
            all.extend(args.iter().map(|a| a.to_string()));
            ok(all)
        }
    };
    serde_json::from_str(out.trim()).expect("backup --json prints JSON")
}

/// Ids of the committed backups.
/// Asserts that directories `a` and `b` hold the same files, byte for byte.
fn assert_same_tree(a: &Path, b: &Path) {
    let out = Command::new("diff")
        .arg("-r")
        .args([a, b])
        .output()
        .expect("running diff");
    assert!(
        out.status.success(),
        "{} and {} differ: {}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Restores tree backup `id` of `source` into a new directory below `work`
/// and asserts it equals `source`.
fn assert_tree_restores(repo: &str, id: u64, source: &Path, work: &Path) {
    let out = work.join(format!("restored-{id}"));
    ok(["restore", repo, &id.to_string(), &out.display().to_string()]);
    let inside = source.strip_prefix("/").expect("absolute source");
    assert_same_tree(source, &out.join(inside));
}

/// A small tree: a few files of seeded random bytes, one in a subdirectory.
fn make_tree(dir: &Path, seed: u64, len: u64) {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    write_random_file(&dir.join("a.bin"), seed, len);
    write_random_file(&dir.join("sub/b.bin"), seed + 1, len / 3 + 1);
    std::fs::write(dir.join("sub/note.txt"), format!("tree {seed}\n")).unwrap();
}

/// The main scenario on one repository: a file and a tree, restored byte
/// for byte, checked with data, one deleted and collected, checked again.
fn scenario(repo: &str, init_args: &[&str], work: &Path) {
    let mut init = vec!["init", repo];
    init.extend(init_args);
    ok(init);
    let file = work.join("file.bin");
    write_random_file(&file, 7, 3 << 20);
    let tree = work.join("tree");
    make_tree(&tree, 11, 1 << 20);

    let first = num(&backup(repo, &[&file], &[]), "id");
    let second = num(&backup(repo, &[&tree], &[]), "id");
    // The same file again: deduplicated against the first backup. (Its
    // catalog, which records the times of the file's parent directories,
    // is stored anew if a test running beside this one changed the
    // temporary directory's in between.)
    let again = backup(repo, &[&file], &[]);
    assert!(
        num(&again["duplicates"], "bytes") >= 3 << 20,
        "a repeated file stored again: {again}"
    );
    assert_eq!(list_ids(repo), vec![first, second, num(&again, "id")]);

    let restored = work.join("file.out");
    ok([
        "restore",
        repo,
        &first.to_string(),
        &restored.display().to_string(),
    ]);
    assert_file_matches(&restored, &mut std::fs::File::open(&file).unwrap());
    assert_tree_restores(repo, second, &tree, work);
    assert!(ok(["ls", repo, &second.to_string()]).contains("tree"));
    assert!(ok(["check", "--read-data", repo]).contains("no problems"));

    ok(["delete", repo, &first.to_string()]);
    // The lifecycle layout frees space at deletion and has no GC.
    if !init_args.contains(&"lifecycle") {
        ok(["gc", repo]);
    }
    assert_eq!(list_ids(repo).len(), 2);
    assert!(ok(["check", "--read-data", repo]).contains("no problems"));
    assert_tree_restores(repo, second, &tree, &work.join("after-gc"));
}

fn encrypted_container_repository_on_s3() {
    let Some(repo) = s3_repo("encrypted") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    scenario(&repo, &[], work.path());
    // A second init on the same prefix is refused; key files work remotely.
    assert!(fail(["init", &repo]).contains("already exists"));
    assert!(ok(["key", "list", &repo]).contains('*'));
}

fn unencrypted_repositories_with_other_indexes_and_the_lifecycle_layout_on_s3() {
    let setups: [&[&str]; 3] = [
        &["--encryption", "none", "--index", "ddfs"],
        &["--encryption", "none", "--index", "lazy"],
        &["--layout", "lifecycle"],
    ];
    for (n, setup) in setups.iter().enumerate() {
        let Some(repo) = s3_repo(&format!("setup{n}")) else {
            return;
        };
        let work = tempfile::tempdir().unwrap();
        scenario(&repo, setup, work.path());
        ok(["index", "rebuild", &repo]);
        assert!(ok(["check", &repo]).contains("no problems"), "{setup:?}");
    }
}

/// Starts `tessera backup --json REPO -` and feeds it `first` bytes,
/// keeping its input open: a backup in progress, holding its lock.
fn start_backup(repo: &str, first: &[u8]) -> Child {
    // It waits for the lock, which the probes of `wait_until_locked` take.
    start_backup_with(&["--wait", "1m"], repo, first)
}

/// Waits until a backup holds its lock: a second writer is refused.
fn wait_until_locked(repo: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = run(["delete", "--wait", "0s", repo, "999"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "deleted a backup that does not exist"
        );
        // (A backup holds its queue-check lock, and its commit lock, only
        // briefly on its way to its writers' lock: probed again.)
        if err.contains("locked") && err.contains("backup lock of") {
            return err;
        }
        assert!(std::time::Instant::now() < deadline, "never locked: {err}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn lock_objects_exclude_and_a_dead_holders_lock_is_stale() {
    let Some(repo) = s3_repo("locks") else {
        return;
    };
    ok(["init", &repo]);
    let data = random_bytes(3, 1 << 20);

    // A live backup's lock names its holder and keeps other writers out;
    // `unlock` leaves it alone; readers still read.
    let mut live = start_backup(&repo, &data[..1000]);
    let err = wait_until_locked(&repo);
    assert!(err.contains("backup lock of"), "{err}");
    assert!(ok(["unlock", &repo]).contains("0 lock object(s) removed"));
    assert!(list_ids(&repo).is_empty());
    let mut stdin = live.stdin.take().unwrap();
    stdin.write_all(&data[1000..]).unwrap();
    drop(stdin);
    let out = live.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(list_ids(&repo), vec![1]);

    // A killed backup leaves its lock object: stale (its process is gone),
    // so it excludes nobody, not even an exclusive `gc`, and `unlock`
    // removes it. A probe of `wait_until_locked` can see the backup's lock
    // object in the instant the backup backs off from the probe's own
    // (neither gets the lock); killed then, the backup leaves nothing, so
    // the scenario is tried until a kill leaves a lock object.
    let mut left_a_lock = false;
    for _attempt in 0..5 {
        let mut dead = start_backup(&repo, &data[..1000]);
        wait_until_locked(&repo);
        dead.kill().unwrap();
        dead.wait().unwrap();
        ok(["gc", &repo]);
        let removed = ok(["unlock", &repo]);
        // Killed in its commit section (or while it checked the queue
        // lock), a backup leaves those lock objects too: every one left
        // is one of a backup's.
        let lines: Vec<&str> = removed
            .lines()
            .filter(|l| l.starts_with("removed "))
            .collect();
        for line in &lines {
            assert!(
                ["backup lock of", "commit lock of", "queue-check lock of"]
                    .iter()
                    .any(|kind| line.contains(kind)),
                "{removed}"
            );
        }
        assert!(
            removed.contains(&format!("{} lock object(s) removed", lines.len())),
            "{removed}"
        );
        if lines.iter().any(|l| l.contains("backup lock of")) {
            left_a_lock = true;
            break;
        }
    }
    assert!(left_a_lock, "no killed backup left its lock object");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &data).unwrap();
    backup(&repo, &[file.path()], &[]);
    let none: serde_json::Value =
        serde_json::from_str(&ok(["unlock", &repo, "--remove-all", "--json"])).unwrap();
    assert_eq!(none, serde_json::json!({ "removed": [] }));
    assert!(ok(["check", &repo]).contains("no problems"));
}

/// A `gc` waiting for a running backup on S3 is not starved by backups
/// that keep starting (FORMAT.md §13.3, the queue lock: the lock object of
/// mode `queue`), as `concurrent_backups.rs` shows on a local repository:
/// once the `gc` waits, a backup given no time to wait fails naming the
/// queue, and one that waits is held off until the `gc` has run — shown by
/// a backup that would hold the writers' lock for ever (its input stays
/// open until the `gc` ends): had it started, the `gc` could not finish.
fn a_waiting_gc_holds_new_backups_off_on_s3() {
    let Some(repo) = s3_repo("queue") else {
        return;
    };
    ok(["init", &repo]);
    let first = random_bytes(21, 200_000);
    let mut running = start_backup(&repo, &first);
    wait_until_locked(&repo);
    let mut gc = cmd(["gc", "--json", &repo])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting gc");
    // Until the gc has its queue lock object, short backups still run
    // beside the running one; then one that may not wait fails, naming it.
    let input = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(input.path(), random_bytes(22, 50_000)).unwrap();
    let args: Vec<String> = ["--wait", "0s", "backup", "--json", &repo, "-"]
        .map(String::from)
        .to_vec();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let refused = loop {
        let o = run_with_input(&args, input.path());
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        // (A probe can also meet the running backup's brief commit lock,
        // or the gc's own brief probes: tried again.)
        if !o.status.success() && err.contains("maintenance is queued") {
            break o;
        }
        assert!(std::time::Instant::now() < deadline, "never queued: {err}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let line = assert_one_line_error(&args, &refused);
    assert!(line.contains("maintenance is queued"), "{line}");
    // A backup that waits (the default) and would never end by itself;
    // its input is written after the gc (until it has its lock it reads
    // nothing, and a full pipe would block this test).
    let mut late = cmd(["backup", "--json", &repo, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the late backup");
    std::thread::sleep(std::time::Duration::from_millis(500));
    drop(running.stdin.take());
    let out = finish(running, "the running backup");
    let first_id = num(&serde_json::from_str(out.trim()).unwrap(), "id");
    let started = std::time::Instant::now();
    while gc.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(300) {
            gc.kill().unwrap();
            late.kill().unwrap();
            panic!("the gc was starved by a backup that started after it");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    finish(gc, "the gc");
    let late_data = random_bytes(23, 100_000);
    let mut stdin = late.stdin.take().unwrap();
    stdin.write_all(&late_data).unwrap();
    drop(stdin);
    let out = finish(late, "the late backup");
    let late_id = num(&serde_json::from_str(out.trim()).unwrap(), "id");
    assert!(late_id > first_id, "{late_id} after {first_id}");
    for (id, data) in [(first_id, &first), (late_id, &late_data)] {
        let o = cmd(["restore", &repo, &id.to_string(), "-"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            o.status.success() && o.stdout == *data,
            "backup {id} differs"
        );
    }
    assert!(ok(["check", "--read-data", &repo]).contains("no problems"));
}

/// How many rounds the concurrency test runs (`TESSERA_S3_ROUNDS`; the
/// longer campaign is `scripts/s3-concurrency.sh`).
fn rounds() -> u64 {
    std::env::var("TESSERA_S3_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
}

/// Runs `tessera --wait 10m ARGS...` in the background.
fn spawn(args: &[String]) -> Child {
    cmd(["--wait", "10m"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tessera")
}

/// Waits for `child`, asserts success and returns its standard output.
fn finish(child: Child, what: &str) -> String {
    let out = child.wait_with_output().expect("waiting for tessera");
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_panic(&out);
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn four_clients_back_up_at_once_with_gc_in_between_and_lose_nothing() {
    const CLIENTS: u64 = 4;
    const SHARED: u64 = 2 << 20;
    let Some(repo) = s3_repo("clients") else {
        return;
    };
    ok(["init", &repo]);
    let work = tempfile::tempdir().unwrap();
    let mut rng = rng(0x5eed_c0de);
    // Every committed backup still expected: id -> its source directory.
    let mut expected: std::collections::BTreeMap<u64, std::path::PathBuf> = Default::default();
    let mut deleted = 0;
    for round in 0..rounds() {
        // Each client's source of this round: its own data, and for
        // clients 0 and 1 one shared file, the same bytes every round.
        let mut sources = Vec::new();
        for client in 0..CLIENTS {
            let dir = work.path().join(format!("r{round}/c{client}"));
            let seed = rand::Rng::random::<u64>(&mut rng) >> 8;
            make_tree(&dir, seed, 200_000 + seed % 300_000);
            if client < 2 {
                write_random_file(&dir.join("shared.bin"), 42, SHARED);
            }
            sources.push(dir);
        }
        // The clients and, from the second round on, a deletion of one
        // backup of the previous round and a gc, all started together.
        let mut running = Vec::new();
        for (client, dir) in sources.iter().enumerate() {
            let args = vec![
                "backup".to_string(),
                "--json".into(),
                repo.clone(),
                dir.display().to_string(),
                "--source".into(),
                format!("client-{client}"),
            ];
            running.push((Some(client), spawn(&args)));
        }
        if let Some(&victim) = expected.keys().next() {
            expected.remove(&victim);
            deleted += 1;
            running.push((
                None,
                spawn(&["delete".into(), repo.clone(), victim.to_string()]),
            ));
        }
        running.push((None, spawn(&["gc".into(), repo.clone()])));
        let mut shared_written = 0;
        let mut own_bytes = 0;
        for (client, child) in running {
            let out = finish(child, &format!("round {round}"));
            if let Some(client) = client {
                let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
                expected.insert(num(&v, "id"), sources[client].clone());
                if client < 2 {
                    shared_written += num(&v, "stored_bytes");
                    own_bytes += num(&v, "logical_bytes") - SHARED;
                }
            }
        }
        // In the first round the shared file is new: two writers running at
        // once may each store it (FORMAT.md §13.3 counts such duplicates,
        // see the `check` below). From then on it is committed before the
        // round starts and neither client stores it again.
        let allowed = if round == 0 { 2 * SHARED } else { SHARED / 8 };
        assert!(
            shared_written <= own_bytes + allowed,
            "round {round}: {shared_written} bytes written for {own_bytes} own bytes and {SHARED} shared"
        );
        // Nothing committed is lost, and everything restores identically.
        let listed = list_ids(&repo);
        assert_eq!(
            listed,
            expected.keys().copied().collect::<Vec<_>>(),
            "round {round}: committed backups lost or resurrected"
        );
        for (&id, source) in &expected {
            assert_tree_restores(&repo, id, source, &work.path().join(format!("out{round}")));
        }
    }
    assert!(deleted > 0 || rounds() < 2);
    assert!(ok(["check", "--read-data", &repo]).contains("no problems"));
}

/// `tessera copy` from a local repository into an S3 one and from there
/// into another S3 repository (unencrypted, other layout) and back to a
/// local one: every copy restores identically, and a re-run copies nothing.
fn copy_to_and_from_s3() {
    let Some(s3) = s3_repo("copy") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let local = work.path().join("local");
    let back = work.path().join("back");
    let s3_other = format!("{s3}-other");
    let file = work.path().join("file.bin");
    write_random_file(&file, 21, 2 << 20);
    let tree = work.path().join("tree");
    make_tree(&tree, 23, 600_000);
    init(&local);
    let local_text = local.display().to_string();
    backup(&local_text, &[&file], &[]);
    backup(&local_text, &[&tree], &[]);
    ok(["init", &s3]);
    ok([
        "init",
        "--encryption",
        "none",
        "--layout",
        "lifecycle",
        &s3_other,
    ]);
    init(&back);
    let back_text = back.display().to_string();
    let copy = |src: &str, dst: &str| -> serde_json::Value {
        let out = cmd(["copy", "--json", src, dst])
            .env("TESSERA_TO_PASSWORD", TEST_PASSWORD)
            .stdin(Stdio::null())
            .output()
            .expect("running copy");
        assert!(
            out.status.success(),
            "copy {src} {dst}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("copy --json prints JSON")
    };
    let copied = |v: &serde_json::Value| {
        v.as_array()
            .expect("an array of records")
            .iter()
            .filter(|r| r["skipped"].as_bool() == Some(false))
            .count()
    };
    for (src, dst) in [
        (local_text.as_str(), s3.as_str()),
        (s3.as_str(), s3_other.as_str()),
        (s3_other.as_str(), back_text.as_str()),
    ] {
        assert_eq!(copied(&copy(src, dst)), 2, "{src} -> {dst}");
        assert_eq!(copied(&copy(src, dst)), 0, "{src} -> {dst} again");
        assert!(ok(["check", "--read-data", dst]).contains("no problems"));
        let ids = list_ids(dst);
        assert_eq!(ids.len(), 2);
        let restored = work.path().join(format!("file-{}", dst.len()));
        ok([
            "restore",
            dst,
            &ids[0].to_string(),
            &restored.display().to_string(),
        ]);
        assert_file_matches(&restored, &mut std::fs::File::open(&file).unwrap());
        let dir = work.path().join(format!("tree-{}", dst.len()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_tree_restores(dst, ids[1], &tree, &dir);
    }
}

/// A server that accepts connections and never answers: a command fails
/// after its `--timeout` (and the retries) with an error that says so,
/// instead of hanging. Needs no S3 server.
fn a_stalled_server_times_out_instead_of_hanging() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepted connections are kept open and never answered.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            match conn {
                Ok(c) => held.push(c),
                Err(_) => return,
            }
        }
    });
    let started = std::time::Instant::now();
    let out = cmd([
        "--timeout",
        "300ms",
        "list",
        &format!("s3:http://127.0.0.1:{port}/bucket/stalled"),
    ])
    .env("AWS_ACCESS_KEY_ID", "stalled")
    .env("AWS_SECRET_ACCESS_KEY", "stalled")
    .output()
    .expect("running tessera");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("timeout"), "{err}");
    // Retried with backoff, but bounded (a hang would never return).
    assert!(
        started.elapsed() < std::time::Duration::from_secs(120),
        "{err}"
    );
    // A zero timeout is refused.
    let out = cmd(["--timeout", "0s", "list", "s3:http://127.0.0.1:1/b"])
        .output()
        .expect("running tessera");
    assert!(String::from_utf8_lossy(&out.stderr).contains("longer than 0s"));
}

/// `[(name, test)]` of the given test functions.
macro_rules! named {
    ($($test:ident),* $(,)?) => { [$((stringify!($test), $test as fn())),*] };
}

/// The tests of this file: those that need a server are ignored, their
/// names saying SKIPPED, when `TESSERA_TEST_S3` is not set.
fn main() -> std::process::ExitCode {
    let server = std::env::var("TESSERA_TEST_S3").is_ok_and(|s| !s.is_empty());
    let needs_server: [(&str, fn()); 6] = named![
        encrypted_container_repository_on_s3,
        unencrypted_repositories_with_other_indexes_and_the_lifecycle_layout_on_s3,
        lock_objects_exclude_and_a_dead_holders_lock_is_stale,
        a_waiting_gc_holds_new_backups_off_on_s3,
        four_clients_back_up_at_once_with_gc_in_between_and_lose_nothing,
        copy_to_and_from_s3,
    ];
    let mut trials: Vec<Trial> = needs_server
        .into_iter()
        .map(|(name, test)| {
            let name = if server {
                name.to_string()
            } else {
                format!("{name} (SKIPPED: TESSERA_TEST_S3 not set)")
            };
            Trial::test(name, move || {
                test();
                Ok(())
            })
            .with_ignored_flag(!server)
        })
        .collect();
    trials.push(Trial::test(
        "a_stalled_server_times_out_instead_of_hanging",
        || {
            a_stalled_server_times_out_instead_of_hanging();
            Ok(())
        },
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
