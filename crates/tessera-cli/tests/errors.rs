//! Bad input through the command line: each case prints exactly one
//! `tessera: error:` line on stderr, exits non-zero and never panics.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use tessera::backend::LockMode;

/// A repository with one backup (id 1) of a small file.
fn repo_with_backup(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    init_plain(&repo); // opened through the library (no password) and crafted below
    let input = dir.join("input");
    std::fs::write(&input, random_bytes(5, 100_000)).unwrap();
    assert_eq!(num(&backup_json(&repo, &input), "id"), 1);
    repo
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn missing_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-repo");
    let input = tmp.path().join("input");
    std::fs::write(&input, b"data").unwrap();
    for args in [
        vec!["backup".to_string(), s(&missing), s(&input)],
        vec![
            "restore".to_string(),
            s(&missing),
            "1".into(),
            s(&tmp.path().join("out")),
        ],
        vec!["list".to_string(), s(&missing)],
        vec!["check".to_string(), s(&missing), "--read-data".into()],
        vec!["stats".to_string(), s(&missing)],
        vec!["delete".to_string(), s(&missing), "1".into()],
    ] {
        let line = fail(&args);
        assert!(line.contains("no-such-repo"), "{args:?}: {line}");
        assert!(
            line.contains("not a Tessera repository"),
            "{args:?}: {line}"
        );
    }
    assert!(!missing.exists(), "no command creates a missing repository");
    assert!(!tmp.path().join("out").exists());
}

#[test]
fn directory_that_is_not_a_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("plain");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("some-file"), b"x").unwrap();
    let input = tmp.path().join("input");
    std::fs::write(&input, b"data").unwrap();
    for args in [
        vec!["backup".to_string(), s(&dir), s(&input)],
        vec!["restore".to_string(), s(&dir), "1".into(), "-".into()],
        vec!["list".to_string(), s(&dir)],
        vec!["check".to_string(), s(&dir)],
    ] {
        let line = fail(&args);
        assert!(
            line.contains("not a Tessera repository"),
            "{args:?}: {line}"
        );
    }
    // A plain file is not a repository either.
    let line = fail(["list".to_string(), s(&input)]);
    assert!(line.contains("not a Tessera repository"), "{line}");
    assert_eq!(
        dir_names(&dir).len(),
        1,
        "nothing was written into the directory"
    );
}

#[test]
fn init_on_non_empty_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("full");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("precious"), b"keep me").unwrap();
    let line = fail(["init".to_string(), s(&dir)]);
    assert!(line.contains("not empty"), "{line}");
    assert_eq!(std::fs::read(dir.join("precious")).unwrap(), b"keep me");
    assert_eq!(dir_names(&dir).len(), 1);

    // An existing repository is non-empty too: init must not overwrite it.
    let repo = repo_with_backup(tmp.path());
    let config = std::fs::read(repo.join("config")).unwrap();
    let line = fail(["init".to_string(), s(&repo)]);
    assert!(line.contains("not empty"), "{line}");
    assert_eq!(std::fs::read(repo.join("config")).unwrap(), config);
    assert_eq!(list_ids(&repo), vec![1]);
}

#[test]
fn wrong_and_non_numeric_backup_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = repo_with_backup(tmp.path());
    let out = tmp.path().join("out");
    for id in ["2", "999", "0", "18446744073709551615"] {
        let line = fail(["restore".to_string(), s(&repo), id.into(), s(&out)]);
        assert!(line.contains(&format!("backup {id}")), "{line}");
        assert!(line.contains("no such backup"), "{line}");
        let line = fail(["restore".to_string(), s(&repo), id.into(), "-".into()]);
        assert!(line.contains("no such backup"), "{line}");
        let line = fail(["stats".to_string(), s(&repo), id.into()]);
        assert!(line.contains("no such backup"), "{line}");
        let line = fail(["delete".to_string(), s(&repo), id.into()]);
        assert!(line.contains("no such backup"), "{line}");
    }
    for id in ["abc", "-1", "1.5", "", "1x", "99999999999999999999999"] {
        // `--` so that clap takes `-1` as the id rather than as an option.
        let line = fail([
            "restore".to_string(),
            "--".into(),
            s(&repo),
            id.into(),
            s(&out),
        ]);
        assert!(line.contains("not a backup id"), "{id:?}: {line}");
        let line = fail(["delete".to_string(), "--".into(), s(&repo), id.into()]);
        assert!(line.contains("not a backup id"), "{id:?}: {line}");
    }
    assert!(!out.exists(), "no output file from a failed restore");
    assert_eq!(list_ids(&repo), vec![1], "nothing was deleted");

    // `latest` of an empty repository.
    let empty = tmp.path().join("empty");
    init_plain(&empty); // opened through the library (no password) and crafted below
    let line = fail(["restore".to_string(), s(&empty), "latest".into(), s(&out)]);
    assert!(line.contains("no backup"), "{line}");
}

#[test]
fn unreadable_input() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = repo_with_backup(tmp.path());
    let missing = tmp.path().join("missing-input");
    let line = fail(["backup".to_string(), s(&repo), s(&missing)]);
    assert!(line.contains("missing-input"), "{line}");
    // (A directory is a tree backup now: tests/trees.rs.)
    // Nothing was committed, and the repository is still healthy and usable.
    assert_eq!(list_ids(&repo), vec![1]);
    ok(["check".to_string(), s(&repo), "--read-data".into()]);
    let input = tmp.path().join("input2");
    std::fs::write(&input, random_bytes(6, 50_000)).unwrap();
    assert_eq!(num(&backup_json(&repo, &input), "id"), 2);
}

#[test]
fn invalid_init_options() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--min-size", "16KiB", "--avg-size", "8KiB"],
            "min <= avg <= max",
        ),
        (vec!["--avg-size", "128KiB"], "min <= avg <= max"),
        (
            vec!["--max-size", "32MiB", "--avg-size", "8KiB"],
            "exceeds 16 MiB",
        ),
        (vec!["--container-size", "1000"], "container size"),
        (vec!["--container-size", "2GiB"], "container size"),
        (vec!["--min-size", "3001", "--avg-size", "8KiB"], "even"),
        (
            vec!["--chunker", "rabin", "--avg-size", "5000"],
            "power-of-two",
        ),
        (
            vec!["--chunker", "fixed", "--min-size", "0", "--avg-size", "0"],
            "positive",
        ),
    ];
    for (i, (opts, expect)) in cases.iter().enumerate() {
        let repo = tmp.path().join(format!("repo{i}"));
        let mut args = vec!["init".to_string(), s(&repo)];
        args.extend(opts.iter().map(|o| o.to_string()));
        let line = fail(&args);
        assert!(line.contains(expect), "{args:?}: {line}");
        assert!(
            !repo.join("config").exists(),
            "{args:?} created a repository"
        );
    }
    // Values that do not parse at all are rejected too (clap may print usage
    // lines, but it must fail without a panic).
    for opts in [["--min-size", "lots"], ["--chunker", "magic"]] {
        let repo = tmp.path().join("repo-bad");
        let mut args = vec!["init".to_string(), s(&repo)];
        args.extend(opts.iter().map(|o| o.to_string()));
        let out = run(&args);
        assert!(!out.status.success(), "{args:?}");
        assert_no_panic(&out);
        assert!(!repo.join("config").exists());
    }
}

/// Rewrites the repository's `config` object as an envelope of `CONF` with
/// format `envelope_version` around the current JSON with `"version"` set
/// to `json_version`.
fn craft_config(repo: &Path, envelope_version: u32, json_version: u32) {
    let sealed = std::fs::read(repo.join("config")).unwrap();
    // Envelope: magic, kind, version, payload length (u64), payload, CRC-32C.
    let payload = &sealed[20..sealed.len() - 4];
    let mut config: serde_json::Value = serde_json::from_slice(payload).unwrap();
    assert_eq!(config["version"], 5);
    config["version"] = json_version.into();
    let json = serde_json::to_vec(&config).unwrap();
    let crafted = tessera::format::envelope::seal(b"CONF", envelope_version, &json);
    std::fs::write(repo.join("config"), crafted).unwrap();
}

#[test]
fn unknown_config_format_version() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = repo_with_backup(tmp.path());
    let original = std::fs::read(repo.join("config")).unwrap();
    for (envelope_version, json_version) in [(99, 99), (99, 1), (1, 99)] {
        craft_config(&repo, envelope_version, json_version);
        for args in [
            vec!["list".to_string(), s(&repo)],
            vec!["check".to_string(), s(&repo)],
            vec!["restore".to_string(), s(&repo), "1".into(), "-".into()],
            vec!["backup".to_string(), s(&repo), s(&tmp.path().join("input"))],
        ] {
            let line = fail(&args);
            assert!(line.contains("config"), "{args:?}: {line}");
            assert!(line.contains("version 99"), "{args:?}: {line}");
        }
        std::fs::write(repo.join("config"), &original).unwrap();
    }
    // Back to the real config, everything works and nothing was changed.
    assert_eq!(list_ids(&repo), vec![1]);
    ok(["check".to_string(), s(&repo), "--read-data".into()]);
}

#[test]
fn locks_exclude_what_they_must_and_nothing_more() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = repo_with_backup(tmp.path());
    let input = tmp.path().join("input");
    let now = |args: &[&str]| -> Vec<String> {
        let mut all = vec![args[0].to_string(), "--wait".into(), "0s".into()];
        all.extend(args[1..].iter().map(|a| a.to_string()));
        all
    };
    // Maintenance excludes everybody.
    let holder = tessera::Repository::open(&repo, LockMode::Exclusive).unwrap();
    let line = fail(now(&["backup", &s(&repo), &s(&input)]));
    assert!(line.contains("locked"), "{line}");
    let line = fail(now(&["delete", &s(&repo), "1"]));
    assert!(line.contains("locked"), "{line}");
    let line = fail(["restore".to_string(), s(&repo), "1".into(), "-".into()]);
    assert!(line.contains("locked"), "{line}");
    drop(holder);
    // A running backup holds off maintenance, but readers read committed
    // state and other backups run beside it (FORMAT.md §13.3).
    let backup = open_when_released(&repo, LockMode::Backup);
    assert_eq!(list_ids(&repo), vec![1]);
    let out = run(["restore".to_string(), s(&repo), "1".into(), "-".into()]);
    assert!(out.status.success() && !out.stdout.is_empty());
    ok(["check".to_string(), s(&repo), "--read-data".into()]);
    let out = run(["backup", "--json", "--wait", "0s", &s(&repo), &s(&input)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = fail(now(&["gc", &s(&repo)]));
    assert!(line.contains("locked") && line.contains("--wait"), "{line}");
    drop(backup);
    // A reader does not hold off a backup, but does hold off maintenance.
    let reader = open_when_released(&repo, LockMode::Read);
    let line = fail(now(&["delete", &s(&repo), "1"]));
    assert!(line.contains("locked"), "{line}");
    let out = run(["backup", "--json", &s(&repo), &s(&input)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(num(&r, "id"), 3);
    drop(reader);
}

#[test]
fn a_writer_waits_for_the_lock_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = repo_with_backup(tmp.path());
    let input = tmp.path().join("input");
    let holder = open_when_released(&repo, LockMode::Exclusive);
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(700));
        drop(holder);
    });
    let out = run(["backup", "--wait", "30s", "--json", &s(&repo), &s(&input)]);
    release.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(num(&r, "id"), 2);
    // A wait that runs out fails with the locked error.
    let _holder = open_when_released(&repo, LockMode::Exclusive);
    let line = fail([
        "backup".to_string(),
        "--wait".into(),
        "300ms".into(),
        s(&repo),
        s(&input),
    ]);
    assert!(line.contains("locked"), "{line}");
    let line = fail([
        "backup".to_string(),
        "--wait".into(),
        "soon".into(),
        s(&repo),
        s(&input),
    ]);
    assert!(line.contains("--wait"), "{line}");
}

/// Opens `repo` once a dropped lock is really released. A lock is an open
/// file description: a process another test thread is spawning at that
/// moment holds a copy of it until it runs its program (the descriptor is
/// close-on-exec), so the release can lag the drop by a moment.
fn open_when_released(repo: &std::path::Path, mode: LockMode) -> tessera::Repository {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match tessera::Repository::open(repo, mode) {
            Err(tessera::Error::Locked(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.unwrap(),
        }
    }
}

#[test]
fn usage_errors_name_what_is_missing_and_suggest() {
    let out = run(["forget", "/nonexistent-repo"]);
    assert_eq!(out.status.code(), Some(2));
    let line = assert_one_line_error(&["forget".into()], &out);
    assert!(
        line.contains("not provided: <--keep-last <N>|--keep-hourly"),
        "{line}"
    );
    let out = run(["lst"]);
    let line = assert_one_line_error(&["lst".into()], &out);
    assert!(
        line.contains("similar subcommand") && line.contains("'list'"),
        "{line}"
    );
    let line = fail(["restore", "/nonexistent-repo", "1"]);
    assert!(line.contains("<OUTPUT>"), "{line}");
    // A misspelt option gets a suggestion too.
    let out = run(["forget", "/nonexistent-repo", "--keep-dayly", "7"]);
    assert_eq!(out.status.code(), Some(2));
    let line = assert_one_line_error(&["forget".into()], &out);
    assert!(
        line.contains("unexpected argument '--keep-dayly'") && line.contains("'--keep-daily'"),
        "{line}"
    );
}

/// `init REPO OPTS...` fails with one line containing every part of
/// `expect`, and creates no repository.
fn init_refused(tmp: &Path, opts: &[&str], expect: &[&str]) {
    let repo = tmp.join("refused");
    let mut args = vec!["init".to_string(), s(&repo)];
    args.extend(opts.iter().map(|o| o.to_string()));
    let line = fail(&args);
    for part in expect {
        assert!(line.contains(part), "{args:?}: {line}");
    }
    assert!(
        !repo.join("config").exists(),
        "{args:?} created a repository"
    );
}

#[test]
fn init_bloom_size_zero_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    init_refused(
        tmp.path(),
        &["--index", "lazy", "--bloom-size", "0"],
        &["--bloom-size", "valid range 1 byte or more"],
    );
}

#[test]
fn init_index_memory_zero_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    init_refused(
        tmp.path(),
        &["--index", "ddfs", "--index-memory", "0"],
        &["--index-memory", "valid range 1 byte or more"],
    );
}

/// `gc REPO --defrag gccdf OPTS...` on a repository with a deleted backup
/// fails with one line containing every part of `expect`; nothing is collected.
fn gc_refused(opts: &[&str], expect: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = repo_with_backup(tmp.path());
    ok(["delete".to_string(), s(&repo), "1".into()]);
    let before = containers(&repo);
    let mut args = vec![
        "gc".to_string(),
        s(&repo),
        "--defrag".into(),
        "gccdf".into(),
    ];
    args.extend(opts.iter().map(|o| o.to_string()));
    let line = fail(&args);
    for part in expect {
        assert!(line.contains(part), "{args:?}: {line}");
    }
    assert_eq!(containers(&repo), before, "nothing was collected");
}

#[test]
fn gc_segment_zero_is_refused() {
    gc_refused(&["--segment", "0"], &["--segment", "valid range 1 or more"]);
}

#[test]
fn gc_split_threshold_zero_is_refused() {
    gc_refused(
        &["--split-threshold", "0"],
        &["--split-threshold", "valid range 1 byte or more"],
    );
}

/// The machine's memory: `MemTotal` of /proc/meminfo, in bytes.
fn mem_total() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = info.lines().find(|l| l.starts_with("MemTotal:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn restore_cache_size_beyond_memory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = repo_with_backup(tmp.path());
    let out = tmp.path().join("out");
    let max = mem_total() / (4 << 20);
    for (size, expect) in [
        (max + 1, format!("valid range 1..={max}")),
        (u64::MAX, format!("valid range 1..={max}")),
        (0, "at least 1".to_string()),
    ] {
        for target in [s(&out), "-".into()] {
            let args = [
                "restore".to_string(),
                s(&repo),
                "1".into(),
                target,
                "--cache-size".into(),
                size.to_string(),
            ];
            let line = fail(&args);
            assert!(line.contains("--cache-size"), "{args:?}: {line}");
            assert!(line.contains(&expect), "{args:?}: {line}");
        }
    }
    assert!(!out.exists(), "a refused restore wrote nothing");
    // The largest cache that fits is accepted.
    ok([
        "restore".to_string(),
        s(&repo),
        "1".into(),
        s(&out),
        "--cache-size".into(),
        max.to_string(),
    ]);
}
