//! Many writers at once (issue 40, FORMAT.md §13.3): four `tessera backup`
//! processes started together into one repository, none given `--wait`,
//! with a `gc` started beside them; a small backup started while a long one
//! runs commits before it ends. Every backup must commit under its own id
//! and restore byte for byte, data committed before the clients started
//! must not be stored again, and `check --read-data` must stay clean.
//!
//! Run against a local directory always, and against the S3 server named
//! by `TESSERA_TEST_S3` when it is set (otherwise that test says SKIPPED).

mod common;

use common::*;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

/// Bytes of the data every client shares with the backup made before them.
const BASE_LEN: u64 = 600_000;

/// Writes client `client`'s source tree under `root`: the base file (the
/// same bytes for everyone, committed before the clients start), files
/// shared by all clients (new to the repository), and files of its own.
fn make_tree(root: &Path, client: u64) -> PathBuf {
    let dir = root.join(format!("client{client}"));
    std::fs::create_dir_all(dir.join("os")).unwrap();
    std::fs::create_dir_all(dir.join("home")).unwrap();
    write_random_file(&dir.join("os/base.bin"), 7, BASE_LEN);
    for k in 0..3 {
        write_random_file(&dir.join(format!("os/shared{k}.bin")), 100 + k, 200_000);
    }
    for k in 0..2 {
        let seed = 1000 + client * 10 + k;
        write_random_file(
            &dir.join(format!("home/own{k}.bin")),
            seed,
            150_000 + client * 7,
        );
    }
    dir
}

/// Whether two trees hold the same names and the same file contents.
fn assert_same_contents(original: &Path, restored: &Path) {
    let meta = std::fs::metadata(original).unwrap();
    if meta.is_file() {
        assert!(
            std::fs::read(original).unwrap() == std::fs::read(restored).unwrap(),
            "contents of {}",
            restored.display()
        );
        return;
    }
    let names = |d: &Path| -> BTreeSet<String> {
        std::fs::read_dir(d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let (a, b) = (names(original), names(restored));
    assert_eq!(a, b, "entries of {}", restored.display());
    for n in a {
        assert_same_contents(&original.join(&n), &restored.join(&n));
    }
}

/// `tessera backup --json REPO DIR` started in the background.
fn spawn_backup(repo: &str, dir: &Path) -> Child {
    cmd(["backup", "--json", repo, &dir.display().to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tessera backup")
}

/// Waits for `child` and returns its JSON output, failing with its errors.
fn finish(child: Child, what: &str) -> serde_json::Value {
    let out = child.wait_with_output().expect("waiting for tessera");
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Ids of the committed backups of `repo`.
/// Runs `tessera ARGS < INPUT` until it fails (for two minutes at most): its output.
fn refused(args: &[String], input: &Path) -> std::process::Output {
    let started = std::time::Instant::now();
    loop {
        let o = run_with_input(args, input);
        if !o.status.success() {
            return o;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(120));
    }
}

/// Restores backup `id` of `repo` below `target` and compares it with `src`.
fn assert_restores(repo: &str, id: u64, src: &Path, target: &Path) {
    ok([
        "restore",
        repo,
        &id.to_string(),
        &target.display().to_string(),
    ]);
    let restored = target.join(src.strip_prefix("/").unwrap());
    assert_same_contents(src, &restored);
}

/// The scenario of this file against the repository `repo` (created here),
/// with scratch space in `tmp`.
fn four_clients_and_a_gc(repo: &str, tmp: &Path, index: &str) {
    ok(["init", repo, "--index", index]);
    // Data committed before the clients start.
    let before = tmp.join("before");
    std::fs::create_dir_all(&before).unwrap();
    write_random_file(&before.join("base.bin"), 7, BASE_LEN);
    let first = num(
        &json_ok(["backup", "--json", repo, &before.display().to_string()]),
        "id",
    );

    let trees: Vec<PathBuf> = (0..4).map(|c| make_tree(tmp, c)).collect();
    let clients: Vec<Child> = trees.iter().map(|t| spawn_backup(repo, t)).collect();
    // A gc beside them: it waits for the running backups (no --wait).
    std::thread::sleep(std::time::Duration::from_millis(150));
    let gc = cmd(["gc", "--json", repo])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tessera gc");
    let done: Vec<serde_json::Value> = clients
        .into_iter()
        .enumerate()
        .map(|(c, child)| finish(child, &format!("backup of client {c}")))
        .collect();
    finish(gc, "gc");

    let committed: Vec<u64> = done.iter().map(|v| num(v, "id")).collect();
    let distinct: BTreeSet<u64> = committed.iter().copied().collect();
    assert_eq!(distinct.len(), 4, "ids {committed:?}");
    assert!(!distinct.contains(&first), "ids {committed:?}");
    let mut all = distinct.clone();
    all.insert(first);
    assert_eq!(list_ids(repo), all.into_iter().collect::<Vec<_>>());
    // The base file was committed before: every client deduplicated it
    // instead of storing it again.
    for (c, v) in done.iter().enumerate() {
        let dup = v["duplicates"]["bytes"].as_u64().unwrap_or(0);
        assert!(dup >= BASE_LEN, "client {c} stored the base again: {v}");
    }
    for (c, (tree, id)) in trees.iter().zip(&committed).enumerate() {
        assert_restores(repo, *id, tree, &tmp.join(format!("out{c}")));
    }
    ok(["check", "--read-data", repo]);

    // A small backup started while a long one runs commits before it ends.
    let mut long = cmd(["backup", "--json", repo, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the long backup");
    let head = random_bytes(42, 700_000);
    let tail = random_bytes(43, 300_000);
    {
        let stdin = long.stdin.as_mut().expect("piped stdin");
        stdin.write_all(&head).unwrap();
        stdin.flush().unwrap();
    }
    let small = json_ok(["backup", "--json", repo, &trees[0].display().to_string()]);
    let small_id = num(&small, "id");
    let mut stdin = long.stdin.take().unwrap();
    stdin.write_all(&tail).unwrap();
    drop(stdin);
    let long_id = num(&finish(long, "the long backup"), "id");
    assert!(small_id < long_id, "small {small_id}, long {long_id}");
    let expected: Vec<u8> = [head, tail].concat();
    let restored = cmd(["restore", repo, &long_id.to_string(), "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(restored.status.success());
    assert!(restored.stdout == expected, "the long backup differs");
    ok(["check", "--read-data", repo]);
}

/// `tessera ARGS` that must succeed, its output parsed as JSON.
fn json_ok<const N: usize>(args: [&str; N]) -> serde_json::Value {
    serde_json::from_str(ok(args).trim()).expect("JSON output")
}

#[test]
fn four_backups_at_once_and_a_gc_beside_them_locally() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    four_clients_and_a_gc(&repo.display().to_string(), tmp.path(), "exact");
}

#[test]
fn four_backups_at_once_and_a_gc_beside_them_with_the_ddfs_index() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    four_clients_and_a_gc(&repo.display().to_string(), tmp.path(), "ddfs");
    // The index runs shared backups left for each other (FORMAT.md §13.3)
    // are deleted by the next gc: what remains is a compacted table of a
    // few runs (tier 0 holds fewer than 4), each with its Bloom filter.
    ok(["gc", &repo.display().to_string()]);
    let names = dir_names(&repo.join("index/ddfs"));
    let runs: BTreeSet<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix('t').and_then(|t| t.split('.').next()))
        .collect();
    let blooms = names.iter().filter(|n| n.starts_with('b')).count();
    assert_eq!(runs.len(), blooms, "{names:?}");
    assert!(runs.len() <= 3, "{names:?}");
    ok(["check", "--read-data", &repo.display().to_string()]);
}

#[test]
fn four_backups_at_once_and_a_gc_beside_them_on_s3() {
    let base = match std::env::var("TESSERA_TEST_S3") {
        Ok(b) if !b.is_empty() => b,
        _ => {
            eprintln!("SKIPPED four_backups_at_once_and_a_gc_beside_them_on_s3: TESSERA_TEST_S3 is not set");
            return;
        }
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let repo = format!(
        "{}/concurrent-{}-{nanos}",
        base.trim_end_matches('/'),
        std::process::id()
    );
    let tmp = tempfile::tempdir().unwrap();
    four_clients_and_a_gc(&repo, tmp.path(), "exact");
}

/// A stream of `len` bytes for round `round`, client `client`: a part all
/// clients share, one shared with earlier rounds and one of its own.
fn campaign_input(round: u64, client: u64, len: usize) -> Vec<u8> {
    let third = len / 3;
    [
        random_bytes(5, third),
        random_bytes(10 + round % 3, third),
        random_bytes(1000 + round * 16 + client, len - 2 * third),
    ]
    .concat()
}

/// Backups `forget --keep-last` keeps.
const KEEP_LAST: usize = 4;

/// A bounded seeded kill campaign (issue 40): rounds of 2 to 5 concurrent
/// backups with a `gc`, `prune` or `forget --keep-last 4` beside them,
/// random processes killed with SIGKILL at random moments. Every backup
/// that reported its commit must stay listed — unless a `forget` ran and at
/// least 4 newer backups are listed — and restore byte for byte, and
/// `check --read-data` must be clean after the survivors' next gc. `TESSERA_KILL_ROUNDS` sets the
/// number of rounds (default 6).
#[test]
fn killed_writers_never_lose_a_committed_backup() {
    use rand::Rng;
    let rounds: u64 = std::env::var("TESSERA_KILL_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(6);
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo").display().to_string();
    ok(["init", &repo]);
    let mut rng = rng(40);
    let mut committed: Vec<(u64, Vec<u8>)> = Vec::new();
    let (mut kills, mut started, mut commits, mut forgotten) = (0, 0, 0, 0);
    // Processes the SIGKILL ended (a kill sent to one that had already
    // exited is sent, not landed).
    let mut landed = 0;
    let mut verified = BTreeSet::new();
    for round in 0..rounds {
        let n = rng.random_range(2..=5u64);
        let mut children = Vec::new();
        for client in 0..n {
            let len = rng.random_range(50_000..600_000);
            let data = campaign_input(round, client, len);
            let input = tmp.path().join(format!("in-{round}-{client}"));
            std::fs::write(&input, &data).unwrap();
            let child = cmd(["backup", "--json", &repo, "-"])
                .stdin(std::fs::File::open(&input).unwrap())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            children.push((Some(data), child));
        }
        let keep = KEEP_LAST.to_string();
        let maintenance: Vec<&str> = match rng.random_range(0..3) {
            0 => vec!["gc", "--json", &repo],
            1 => vec!["prune", "--json", &repo],
            _ => vec!["forget", "--json", "--keep-last", &keep, &repo],
        };
        let forgets = maintenance[0] == "forget";
        let m = cmd(&maintenance)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        children.push((None, m));
        started += children.len();
        std::thread::sleep(std::time::Duration::from_millis(rng.random_range(0..400)));
        for (_, child) in children.iter_mut() {
            if rng.random_bool(0.4) {
                // Already ended is fine: the kill is then a no-op.
                if child.kill().is_ok() {
                    kills += 1;
                }
            }
        }
        for (data, child) in children {
            let out = child.wait_with_output().unwrap();
            {
                use std::os::unix::process::ExitStatusExt;
                landed += usize::from(out.status.signal() == Some(9));
            }
            let Some(data) = data else {
                // Maintenance is killed or succeeds, never fails on its own.
                assert!(
                    out.status.success() || out.status.code().is_none(),
                    "round {round}: {maintenance:?} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            };
            if out.status.success() {
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                committed.push((num(&v, "id"), data));
                commits += 1;
            } else {
                // Killed (no exit code), never failed on its own.
                assert!(
                    out.status.code().is_none(),
                    "round {round}: a backup failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        // Every committed backup stays listed; those of this round (and,
        // every 10th round and at the end, all) restore byte for byte.
        let listed: BTreeSet<u64> = list_ids(&repo).into_iter().collect();
        // A forget keeps the newest KEEP_LAST backups (one group: every
        // backup here has the same host, paths and source); those stay
        // listed, as nothing else deletes backups.
        committed.retain(|(id, _)| {
            let forgotten = forgets
                && !listed.contains(id)
                && listed.iter().filter(|&&l| l > *id).count() >= KEEP_LAST;
            !forgotten
        });
        forgotten = commits - committed.len();
        let verify_all = round % 10 == 9 || round + 1 == rounds;
        for (id, data) in &committed {
            assert!(listed.contains(id), "round {round}: backup {id} lost");
            if !verify_all && verified.contains(id) {
                continue;
            }
            let out = cmd(["restore", &repo, &id.to_string(), "-"])
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                out.status.success() && out.stdout == *data,
                "round {round}: backup {id} differs"
            );
        }
        verified.extend(committed.iter().map(|(id, _)| *id));
    }
    ok(["gc", &repo]);
    ok(["check", "--read-data", &repo]);
    eprintln!(
        "campaign: {rounds} rounds, {started} processes, {kills} SIGKILLs sent, {landed} \
         processes ended by one, {commits} backups committed, {forgotten} of them forgotten, \
         {} verified at the end, 0 lost, check --read-data clean",
        committed.len()
    );
}

/// Backup `A` of `shared` + `own` and backup `B` of `shared` overlap so
/// that neither can see the other's chunks (FORMAT.md §13.3): `A` starts
/// and opens its index (it has reserved its container ids once `state`
/// changed), `B` runs whole, then `A` reads its input. Both store the
/// shared chunks: duplicates by construction, not by timing luck. Returns
/// (A's id, B's id).
fn overlapping_backups(repo: &str, tmp: &Path, shared: &[u8], own: &[u8]) -> (u64, u64) {
    let state = Path::new(repo).join("state");
    let before = std::fs::read(&state).unwrap_or_default();
    let mut a = cmd(["backup", "--json", repo, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting backup A");
    let started = std::time::Instant::now();
    while std::fs::read(&state).unwrap_or_default() == before {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "backup A never reserved its container ids"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let input = tmp.join("input-b");
    std::fs::write(&input, shared).unwrap();
    let b = ok_with_input(["backup", "--json", repo, "-"], &input);
    let b: serde_json::Value = serde_json::from_str(b.trim()).unwrap();
    let mut stdin = a.stdin.take().unwrap();
    stdin.write_all(shared).unwrap();
    stdin.write_all(own).unwrap();
    drop(stdin);
    let a = finish(a, "backup A");
    assert!(
        a["unique"]["bytes"].as_u64().unwrap() >= shared.len() as u64 / 2,
        "A did not store the shared bytes again: {a}"
    );
    (num(&a, "id"), num(&b, "id"))
}

/// Restores backup `id` of `repo` to standard output and compares it with `expected`.
fn assert_stream_restores(repo: &str, id: u64, expected: &[u8]) {
    let o = cmd(["restore", repo, &id.to_string(), "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(o.stdout == expected, "backup {id} differs");
}

/// Two writers that both stored the same new chunks leave duplicate copies
/// (`check` counts them); `gc` — or `prune` — folds them to one copy:
/// `check` then counts none, the stored size falls by at least the
/// duplicates' bytes, and both backups restore byte for byte.
#[test]
fn duplicates_of_overlapping_backups_are_folded_by_gc_and_prune() {
    for (index, maintenance) in [("exact", "gc"), ("ddfs", "gc"), ("exact", "prune")] {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo").display().to_string();
        ok(["init", &repo, "--index", index]);
        let shared = random_bytes(5, 900_000);
        let own = random_bytes(6, 300_000);
        let (a, b) = overlapping_backups(&repo, tmp.path(), &shared, &own);
        let check = json_ok(["check", "--json", &repo]);
        let (dup_chunks, dup_bytes) = (
            num(&check, "duplicate_chunks"),
            num(&check, "duplicate_bytes"),
        );
        assert!(
            dup_chunks > 0 && dup_bytes >= shared.len() as u64 / 2,
            "{check}"
        );
        let stored = |r: &str| num(&json_ok(["stats", "--json", r]), "physical_bytes");
        let before = stored(&repo);
        let args: Vec<&str> = match maintenance {
            "gc" => vec!["gc", "--json", &repo],
            _ => vec!["prune", "--json", &repo],
        };
        let out: serde_json::Value = serde_json::from_str(ok(&args).trim()).unwrap();
        let check = json_ok(["check", "--read-data", "--json", &repo]);
        assert_eq!(
            num(&check, "duplicate_chunks"),
            0,
            "{index} {maintenance}: {check} {out}"
        );
        assert_eq!(num(&check, "duplicate_bytes"), 0, "{check}");
        let after = stored(&repo);
        assert!(
            after + dup_bytes <= before,
            "{index} {maintenance}: stored {before} -> {after}, duplicates {dup_bytes}: {out}"
        );
        assert_stream_restores(&repo, a, &[shared.clone(), own].concat());
        assert_stream_restores(&repo, b, &shared);
        // A later backup of the shared bytes deduplicates them all.
        let input = tmp.path().join("input-c");
        std::fs::write(&input, &shared).unwrap();
        let c = backup_json(Path::new(&repo), &input);
        assert_eq!(c["unique"]["chunks"], 0, "{c}");
    }
}

/// A repository made before backups could share one (format version 1
/// to 4, FORMAT.md §13.3) keeps one writer at a time: a second backup
/// that may not wait fails with one line that names the running backup,
/// the reason and what to do (a new repository and `tessera copy`); the
/// first commits, and with `--wait` the second queues and commits after it.
#[test]
fn a_second_writer_of_an_old_repository_is_told_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let repo_path = tmp.path().join("repo");
    init_plain(&repo_path);
    let config_path = repo_path.join("config");
    let mut config =
        tessera::repo::config::Config::decode(&std::fs::read(&config_path).unwrap()).unwrap();
    config.set_single_writer();
    std::fs::write(&config_path, config.encode()).unwrap();
    let repo = repo_path.display().to_string();
    let mut first = cmd(["backup", "--json", &repo, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the first backup");
    let data = random_bytes(11, 300_000);
    first
        .stdin
        .as_mut()
        .unwrap()
        .write_all(&data[..1000])
        .unwrap();
    // The first backup holds the writers' lock until it ends: a second
    // one given no time to wait fails at once (until the first has the
    // lock, the second may take it; then the roles are swapped).
    let input = tmp.path().join("second");
    std::fs::write(&input, random_bytes(12, 100_000)).unwrap();
    let args: Vec<String> = ["--wait", "0s", "backup", "--json", &repo, "-"]
        .map(String::from)
        .to_vec();
    let refused = refused(&args, &input);
    let line = assert_one_line_error(&args, &refused);
    for want in [
        "locked",
        "format version 1 to 4",
        "tessera init",
        "tessera copy",
    ] {
        assert!(line.contains(want), "{want}: {line}");
    }
    let mut stdin = first.stdin.take().unwrap();
    stdin.write_all(&data[1000..]).unwrap();
    drop(stdin);
    let first_id = num(&finish(first, "the first backup"), "id");
    assert_stream_restores(&repo, first_id, &data);
    let second = ok_with_input(["backup", "--json", &repo, "-"], &input);
    let second: serde_json::Value = serde_json::from_str(second.trim()).unwrap();
    assert!(num(&second, "id") > first_id);
}

/// Waits up to `limit` for `child` to exit; kills it and fails with `what` if it does not.
fn wait_or_fail(mut child: Child, limit: std::time::Duration, what: &str) -> std::process::Output {
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("{what}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A maintenance command waiting for running backups is not starved by
/// backups that keep starting (FORMAT.md §13.3, the queue lock): once a
/// `gc` waits, a backup given no time to wait fails naming it, and one
/// that waits is held off until the `gc` has run — shown by a backup that
/// would hold the writers' lock for ever (its input stays open until the
/// `gc` ends): if it had started, the `gc` could not finish.
#[test]
fn a_waiting_gc_is_not_starved_by_backups_that_keep_starting() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo").display().to_string();
    ok(["init", &repo]);
    let piped_backup = || {
        cmd(["backup", "--json", &repo, "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting a backup")
    };
    let mut running = piped_backup();
    let first = random_bytes(21, 200_000);
    running.stdin.as_mut().unwrap().write_all(&first).unwrap();
    // Wait until the running backup holds the writers' lock: a gc that may
    // not wait fails then.
    let started = std::time::Instant::now();
    while run(["--wait", "0s", "gc", &repo]).status.success() {
        assert!(started.elapsed() < std::time::Duration::from_secs(120));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let gc = cmd(["gc", "--json", &repo])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting gc");
    // Until the gc is queued, short backups still run beside the running
    // one; then a backup that may not wait fails, naming the queue.
    let input = tmp.path().join("short");
    std::fs::write(&input, random_bytes(22, 50_000)).unwrap();
    let args: Vec<String> = ["--wait", "0s", "backup", "--json", &repo, "-"]
        .map(String::from)
        .to_vec();
    let refused = refused(&args, &input);
    let line = assert_one_line_error(&args, &refused);
    assert!(line.contains("maintenance is queued"), "{line}");
    // A backup that waits (the default) and would never end by itself.
    // (Its input is written after the gc: until it has its lock it reads
    // nothing, and a full pipe would block this test.)
    let mut late = piped_backup();
    let late_data = random_bytes(23, 100_000);
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(running.stdin.take());
    let first_id = num(&finish(running, "the running backup"), "id");
    let gc = wait_or_fail(
        gc,
        std::time::Duration::from_secs(300),
        "the gc was starved by a backup that started after it",
    );
    assert!(gc.status.success(), "{gc:?}");
    let mut stdin = late.stdin.take().unwrap();
    stdin.write_all(&late_data).unwrap();
    drop(stdin);
    let late_id = num(&finish(late, "the late backup"), "id");
    assert!(late_id > first_id);
    assert_stream_restores(&repo, first_id, &first);
    assert_stream_restores(&repo, late_id, &late_data);
    ok(["check", "--read-data", &repo]);
}
