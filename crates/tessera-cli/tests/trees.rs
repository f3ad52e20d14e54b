//! Tree backups end to end: `backup` of directories, `restore` into a
//! directory (metadata-exact), `ls`, selections and incomplete backups.

mod common;

use common::{backup_tree, fail, init, init_layout, json, ok, random_bytes, run};
use std::ffi::OsStr;
use std::fs::{self, File, FileTimes};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn at(secs: u64, nanos: u32) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs, nanos)
}

fn set_mtime(path: &Path, t: SystemTime) {
    File::open(path)
        .unwrap()
        .set_times(FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

fn write(path: &Path, data: &[u8], mode: u32, mtime: SystemTime) {
    fs::write(path, data).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    set_mtime(path, mtime);
}

/// A tree with nested and empty directories of odd modes and old times,
/// symbolic links (one dangling), a file whose name is not UTF-8, and files
/// of 0 bytes and of exactly the maximum chunk size (64 KiB).
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    write(
        &root.join("a/b/c/deep.bin"),
        &random_bytes(1, 300_000),
        0o640,
        at(1_000_000_000, 123_456_789),
    );
    write(
        &root.join("a/max"),
        &random_bytes(2, 65536),
        0o755,
        at(1_600_000_000, 1),
    );
    write(&root.join("a/zero"), b"", 0o600, at(86_400, 999_999_999));
    let odd = root.join(OsStr::from_bytes(b"caf\xe9 \xff.txt"));
    write(&odd, b"latin-1 name", 0o644, at(1_234_567_890, 42));
    symlink("b/c/deep.bin", root.join("a/link")).unwrap();
    symlink("../nowhere", root.join("a/dangling")).unwrap();
    let empty = root.join("empty");
    fs::create_dir(&empty).unwrap();
    fs::create_dir(root.join("a/b/locked")).unwrap();
    write(&root.join("a/b/locked/inside"), b"x", 0o444, at(5, 5));
    for (dir, mode, t) in [
        ("empty", 0o705, at(315_532_800, 7)),
        ("a/b/locked", 0o500, at(100, 100)),
        ("a/b/c", 0o2775, at(1_000_000_001, 0)),
        ("a/b", 0o711, at(1_100_000_000, 5)),
        ("a", 0o755, at(1_200_000_000, 6)),
    ] {
        set_mtime(&root.join(dir), t);
        fs::set_permissions(root.join(dir), fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// Asserts that `restored` is `original`: the same names, kinds, modes,
/// owners, modification times (ns), link targets and contents.
fn assert_same_tree(original: &Path, restored: &Path) {
    let a = fs::symlink_metadata(original).unwrap();
    let b =
        fs::symlink_metadata(restored).unwrap_or_else(|e| panic!("{}: {e}", restored.display()));
    let what = restored.display();
    assert_eq!(a.file_type(), b.file_type(), "{what}");
    assert_eq!(
        (a.mtime(), a.mtime_nsec()),
        (b.mtime(), b.mtime_nsec()),
        "mtime of {what}"
    );
    assert_eq!((a.uid(), a.gid()), (b.uid(), b.gid()), "owner of {what}");
    if a.file_type().is_symlink() {
        assert_eq!(
            fs::read_link(original).unwrap(),
            fs::read_link(restored).unwrap(),
            "{what}"
        );
        return;
    }
    assert_eq!(a.mode() & 0o7777, b.mode() & 0o7777, "mode of {what}");
    if a.is_file() {
        assert!(
            fs::read(original).unwrap() == fs::read(restored).unwrap(),
            "contents of {what}"
        );
        return;
    }
    if !a.is_dir() {
        // A FIFO or device: its kind, mode, owner and time are compared.
        return;
    }
    let names = |d: &Path| {
        let mut n: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        n.sort();
        n
    };
    let (na, nb) = (names(original), names(restored));
    assert_eq!(na, nb, "entries of {what}");
    for n in na {
        assert_same_tree(&original.join(&n), &restored.join(&n));
    }
}

/// Where a backed-up path is restored below `target`.
fn restored(target: &Path, original: &Path) -> PathBuf {
    target.join(original.strip_prefix("/").unwrap())
}

/// `tessera ls -l REPO 1 PATH`.
fn ls_long(repo: &Path, path: &Path) -> String {
    ok([
        "ls".as_ref(),
        "-l".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        path.as_os_str(),
    ])
}

#[test]
fn tree_round_trip_is_metadata_exact_in_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    for layout in ["container", "lifecycle"] {
        let repo = dir.path().join(format!("repo-{layout}"));
        init_layout(&repo, layout);
        let b = json(&ok([
            "backup".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            src.as_os_str(),
        ]));
        assert_eq!(b["tree"]["files"], 5, "{b}");
        assert_eq!(b["tree"]["skipped"], 0, "{b}");
        let host_source = b["source"].as_str().unwrap();
        assert!(
            host_source.ends_with(&format!(":{}", src.display())),
            "{host_source}"
        );
        let target = dir.path().join(format!("out-{layout}"));
        let r = json(&ok([
            "restore".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            "1".as_ref(),
            target.as_os_str(),
        ]));
        assert_eq!(r["files"], 5, "{r}");
        assert_same_tree(&src, &restored(&target, &src));
        // An unchanged tree backed up again stores no file bytes.
        let again = json(&ok([
            "backup".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            src.as_os_str(),
        ]));
        // (Only the catalog and its index may change: they record the
        // parent directories, which the restore's target was just created in.)
        let catalog = again["tree"]["catalog_bytes"].as_u64().unwrap();
        let index = again["tree"]["index_bytes"].as_u64().unwrap();
        assert!(
            again["unique"]["bytes"].as_u64() <= Some(catalog + index),
            "{again}"
        );
        // The target is no longer empty: without --overwrite nothing is
        // replaced, each file and link in the way is reported (exit
        // status 3), the directories merged into.
        let out = run([
            "restore".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            "2".as_ref(),
            target.as_os_str(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        let r = json(&String::from_utf8_lossy(&out.stdout));
        let failed = r["failed"].as_array().unwrap();
        assert_eq!(failed.len(), 7, "{r}");
        assert!(
            failed.iter().all(|f| f["reason"]
                .as_str()
                .unwrap()
                .ends_with("is there (--overwrite replaces it)")),
            "{r}"
        );
        assert!(err.contains("incomplete: 7 entries"), "{err}");
        assert_same_tree(&src, &restored(&target, &src));
        ok([
            "restore".as_ref(),
            "--overwrite".as_ref(),
            repo.as_os_str(),
            "2".as_ref(),
            target.as_os_str(),
        ]);
        assert_same_tree(&src, &restored(&target, &src));
    }
}

#[test]
fn stdin_is_still_a_stream_and_a_single_file_a_tree() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    let file = dir.path().join("f");
    fs::write(&file, random_bytes(3, 10_000)).unwrap();
    let b = json(&common::ok_with_input(
        [
            "backup".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            "-".as_ref(),
        ],
        &file,
    ));
    assert!(b.get("tree").is_none(), "{b}");
    assert_eq!(b["source"], "default");
    let err = fail(["ls".as_ref(), repo.as_os_str(), "1".as_ref()]);
    assert!(err.contains("not a tree backup"), "{err}");
    // A file given by its path is a tree backup of that path
    // (tests/single_file.rs).
    let b = json(&ok([
        "backup".as_ref(),
        "--json".as_ref(),
        repo.as_os_str(),
        file.as_os_str(),
    ]));
    assert_eq!(b["tree"]["files"], 1, "{b}");
    let missing = dir.path().join("missing");
    let err = fail([
        "backup".as_ref(),
        repo.as_os_str(),
        dir.path().as_os_str(),
        missing.as_os_str(),
    ]);
    assert!(err.contains(&*missing.to_string_lossy()), "{err}");
}

#[test]
fn ls_lists_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let top = ok(["ls".as_ref(), repo.as_os_str(), "1".as_ref()]);
    assert_eq!(top.trim(), src.display().to_string());
    let children = ok([
        "ls".as_ref(),
        repo.as_os_str(),
        "latest".as_ref(),
        src.as_os_str(),
    ]);
    let names: Vec<&str> = children.lines().collect();
    let s = src.display();
    assert_eq!(
        names,
        [
            format!("{s}/a"),
            format!("{s}/caf\u{fffd} \u{fffd}.txt"),
            format!("{s}/empty")
        ]
    );
    let long = ls_long(&repo, &src.join("a"));
    assert!(
        long.lines()
            .any(|l| l.starts_with("lrwxrwxrwx") && l.ends_with("a/dangling -> ../nowhere")),
        "{long}"
    );
    assert!(
        long.lines()
            .any(|l| l.starts_with("-rwxr-xr-x") && l.contains(" 65536 2020-09-13T12:26:40Z ")),
        "{long}"
    );
    let all = json(&ok([
        "ls".as_ref(),
        "-R".as_ref(),
        "--json".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        src.as_os_str(),
    ]));
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 12, "{all:?}");
    let odd = all.iter().find(|e| e.get("path_hex").is_some()).unwrap();
    assert!(odd["path_hex"].as_str().unwrap().ends_with(
        &"caf\u{e9} \u{ff}.txt"
            .chars()
            .map(|c| format!("{:02x}", c as u32))
            .collect::<String>()
    ));
    assert_eq!(odd["size"], 12);
}

#[test]
fn restoring_one_file_reads_only_its_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..4 {
        fs::write(src.join(format!("big{i}")), random_bytes(10 + i, 3 << 20)).unwrap();
    }
    fs::write(src.join("small"), b"just this").unwrap();
    for layout in ["container", "lifecycle"] {
        let repo = dir.path().join(format!("repo-{layout}"));
        ok([
            "init".as_ref(),
            repo.as_os_str(),
            "--layout".as_ref(),
            layout.as_ref(),
            "--container-size".as_ref(),
            "1MiB".as_ref(),
        ]);
        backup_tree(&repo, &src);
        let full = json(&ok([
            "restore".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            "1".as_ref(),
            dir.path().join(format!("full-{layout}")).as_os_str(),
        ]));
        let one_dir = dir.path().join(format!("one-{layout}"));
        let one = json(&ok([
            "restore".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            "1".as_ref(),
            one_dir.as_os_str(),
            "--include".as_ref(),
            src.join("small").as_os_str(),
        ]));
        assert_eq!(one["files"], 1, "{one}");
        assert_eq!(
            fs::read(restored(&one_dir, &src.join("small"))).unwrap(),
            b"just this"
        );
        assert!(!restored(&one_dir, &src.join("big0")).exists());
        assert!(
            one["bytes_read"].as_u64() < full["bytes_read"].as_u64(),
            "{one} vs {full}"
        );
        if layout == "container" {
            assert!(
                one["containers_read"].as_u64() < full["containers_read"].as_u64(),
                "{one} vs {full}"
            );
            // For one file, the catalog's index and one region of the catalog
            // are read (and the region once more to verify).
            let verified = json(&ok([
                "restore".as_ref(),
                "--json".as_ref(),
                "--verify".as_ref(),
                repo.as_os_str(),
                "1".as_ref(),
                dir.path().join("verified").as_os_str(),
                "--include".as_ref(),
                src.join("small").as_os_str(),
            ]));
            let once = one["catalog_containers_read"].as_u64().unwrap();
            assert!(once >= 1, "{one}");
            // One file: the catalog's index and one region of it.
            assert!(one["catalog_extents_read"].as_u64() <= Some(2), "{one}");
            // (Kept in memory: --verify reads it no more.)
            assert_eq!(verified["catalog_containers_read"], once, "{verified}");
        }
        // --exclude leaves the big files out.
        let some_dir = dir.path().join(format!("some-{layout}"));
        let some = json(&ok([
            "restore".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            "1".as_ref(),
            some_dir.as_os_str(),
            "--exclude".as_ref(),
            "big[0-2]".as_ref(),
        ]));
        assert_eq!(some["files"], 2, "{some}");
        assert!(restored(&some_dir, &src.join("big3")).exists());
    }
}

/// A single-file restore of a large catalog (many regions, several index
/// pages, spread over many containers) reads at most two catalog extents:
/// one index page and one region, each one chunk (docs/FORMAT.md §24.4),
/// never a delta (whose base would be read too); an unchanged tree backed
/// up again stores no new catalog bytes.
#[test]
fn restoring_one_file_of_a_large_catalog_reads_two_catalog_extents() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mut files = Vec::new();
    for d in 0..30 {
        let sub = src.join(format!("directory-{d:02}-{}", "d".repeat(30)));
        fs::create_dir_all(&sub).unwrap();
        for f in 0..50 {
            let path = sub.join(format!("file-{f:03}-{}", "f".repeat(40)));
            fs::write(&path, format!("file {d} {f}")).unwrap();
            files.push(path);
        }
    }
    settle_directory_atimes(&src);
    let back_up = |repo: &Path| {
        json(&ok([
            "backup".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            src.as_os_str(),
        ]))
    };
    // The catalog records the times of the source's parent directories
    // too, and the temporary directory's change whenever a test running
    // beside this one makes or removes its own: compare two backups made
    // while they stayed as they were (in a new repository each try).
    let (repo, first, again) = (0..20)
        .find_map(|attempt| {
            let repo = dir.path().join(format!("repo-{attempt}"));
            ok([
                "init".as_ref(),
                repo.as_os_str(),
                "--min-size".as_ref(),
                "512B".as_ref(),
                "--avg-size".as_ref(),
                "2KiB".as_ref(),
                "--max-size".as_ref(),
                "8KiB".as_ref(),
                "--container-size".as_ref(),
                "64KiB".as_ref(),
                "--delta".as_ref(),
                "greedy".as_ref(),
            ]);
            let parents = parents_state(&src);
            let first = back_up(&repo);
            // Unchanged: the catalog and its index are stored already.
            let again = back_up(&repo);
            (parents_state(&src) == parents).then_some((repo, first, again))
        })
        .expect("the source's parent directories kept changing");
    let pages = first["tree"]["index_pages"].as_array().unwrap().len();
    assert!(pages > 1, "{first}");
    assert!(first["containers_written"].as_u64() > Some(4), "{first}");
    assert_eq!(again["tree"]["files_unmodified"], files.len(), "{again}");
    assert_eq!(again["unique"]["bytes"], 0, "{again}");
    // Every 20th file changes: most regions change a little (similar
    // chunks, which the delta policy would encode against the old ones).
    for f in files.iter().step_by(20) {
        fs::write(f, "changed").unwrap();
    }
    let changed = json(&ok([
        "backup".as_ref(),
        "--json".as_ref(),
        repo.as_os_str(),
        src.as_os_str(),
    ]));
    assert_eq!(changed["id"], 3, "{changed}");
    let n = files.len();
    for (k, &i) in [0, 1, n / 3, n / 2, n / 2 + 7, 2 * n / 3, n - 2, n - 1]
        .iter()
        .enumerate()
    {
        let target = dir.path().join(format!("one-{k}"));
        let one = json(&ok([
            "restore".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            "3".as_ref(),
            target.as_os_str(),
            "--include".as_ref(),
            files[i].as_os_str(),
        ]));
        assert_eq!(one["files"], 1, "{one}");
        assert!(
            one["catalog_extents_read"].as_u64() <= Some(2),
            "{i}: {one}"
        );
        assert_eq!(
            fs::read(restored(&target, &files[i])).unwrap(),
            fs::read(&files[i]).unwrap()
        );
    }
}

#[test]
fn backup_excludes_patterns() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("cache/deep")).unwrap();
    fs::write(src.join("cache/deep/x"), b"x").unwrap();
    fs::write(src.join("keep.txt"), b"k").unwrap();
    fs::write(src.join("drop.tmp"), b"d").unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    ok([
        "backup".as_ref(),
        repo.as_os_str(),
        src.as_os_str(),
        "--exclude".as_ref(),
        "*.tmp".as_ref(),
        "--exclude".as_ref(),
        "cache/".as_ref(),
        "--one-file-system".as_ref(),
    ]);
    let all = ok([
        "ls".as_ref(),
        "-R".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        src.as_os_str(),
    ]);
    assert_eq!(all.trim(), src.join("keep.txt").display().to_string());
}

/// An unreadable file (mode 000, backed up by an unprivileged user: as
/// root the test runs the backup as `nobody`) is skipped with a warning;
/// the backup commits and exits with status 3.
#[test]
fn an_unreadable_file_makes_an_incomplete_backup() {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("fine"), b"fine").unwrap();
    let secret = src.join("secret");
    fs::write(&secret, b"secret").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o000)).unwrap();
    let repo = dir.path().join("repo");
    // Root reads any file: back up as `nobody`, with a link to (or copy of)
    // the binary in the test's directory, which `nobody` can reach even when
    // the build directory is private.
    let root = fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) == 0;
    let exe = dir.path().join("tessera");
    if root && fs::hard_link(common::bin(), &exe).is_err() {
        fs::copy(common::bin(), &exe).unwrap();
    }
    let as_user = |args: &[&OsStr]| {
        let mut c = match root {
            true => common::cmd_of(&exe, args),
            false => common::cmd(args),
        };
        if root {
            c.uid(65534).gid(65534);
        }
        c.output().unwrap()
    };
    let init = as_user(&["init".as_ref(), repo.as_os_str()]);
    assert!(init.status.success(), "{init:?}");
    let out = as_user(&["backup".as_ref(), repo.as_os_str(), src.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("tessera: warning: ") && l.contains(&*secret.to_string_lossy())),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 skipped"));
    let listed = run([
        "ls".as_ref(),
        "-R".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        src.as_os_str(),
    ]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(listed.trim(), src.join("fine").display().to_string());
}

/// `backup --json` of `src` (with `extra` arguments) into `repo`.
fn backup_json(repo: &Path, src: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args: Vec<&OsStr> = vec!["backup".as_ref(), "--json".as_ref()];
    args.extend(extra.iter().map(|a| OsStr::new(*a)));
    args.extend([repo.as_os_str(), src.as_os_str()]);
    json(&ok(args))
}

/// Restores backup `id` of `repo` into a fresh directory and compares it
/// with `src` (metadata-exact).
fn assert_restores(dir: &Path, repo: &Path, id: u64, src: &Path) {
    let target = dir.join(format!(
        "out-{}-{id}",
        repo.file_name().unwrap().to_string_lossy()
    ));
    ok([
        "restore".as_ref(),
        repo.as_os_str(),
        id.to_string().as_ref(),
        target.as_os_str(),
    ]);
    assert_same_tree(src, &restored(&target, src));
}

/// Settles the access times of the directories under `root` (and its own):
/// with `relatime`, a directory read in the clock tick of its last change
/// has its access time updated again by the next read, so the first
/// backup's reads would change what an unchanged re-backup records.
/// The times of `path`'s parent directories (but the root's), which a
/// tree backup of `path` records.
fn parents_state(path: &Path) -> Vec<[i64; 6]> {
    path.ancestors()
        .skip(1)
        .filter(|p| p.parent().is_some())
        .map(|p| {
            let m = fs::symlink_metadata(p).unwrap();
            [
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
                m.atime(),
                m.atime_nsec(),
            ]
        })
        .collect()
}

fn settle_directory_atimes(root: &Path) {
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                dirs.push(e.path());
            }
        }
    }
}

/// New, changed and unmodified files and the bytes read of a tree backup.
fn file_counts(b: &serde_json::Value) -> (u64, u64, u64, u64) {
    let t = &b["tree"];
    let n = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {b}"));
    (
        n("files_new"),
        n("files_changed"),
        n("files_unmodified"),
        n("bytes_read"),
    )
}

#[test]
fn unchanged_files_are_not_read_in_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    for (layout, extra) in [
        ("container", &[][..]),
        ("lifecycle", &[][..]),
        // Rewriting stores duplicates again: reused chunks get their bytes
        // from the repository.
        (
            "container",
            &[
                "--rewrite",
                "capping",
                "--capping-level",
                "1",
                "--segment-size",
                "64KiB",
            ][..],
        ),
    ] {
        let repo = dir.path().join(format!("repo-{layout}-{}", extra.len()));
        // A tree of its own: the steps below change it.
        let src = dir.path().join(format!("src-{layout}-{}", extra.len()));
        fs::create_dir(&src).unwrap();
        make_tree(&src);
        let total = 300_000 + 65536 + 12 + 1;
        let mut args: Vec<&OsStr> = vec![
            "init".as_ref(),
            repo.as_os_str(),
            "--layout".as_ref(),
            layout.as_ref(),
            "--container-size".as_ref(),
            "128KiB".as_ref(),
        ];
        args.extend(extra.iter().map(|a| OsStr::new(*a)));
        ok(args);
        let first = backup_json(&repo, &src, &[]);
        assert_eq!(file_counts(&first), (5, 0, 0, total), "{first}");
        assert!(first["tree"].get("parent").is_none(), "{first}");

        // Unchanged: nothing is read, the parent's chunks are reused.
        let again = backup_json(&repo, &src, &[]);
        assert_eq!(file_counts(&again), (0, 0, 5, 0), "{again}");
        assert_eq!(again["tree"]["parent"], 1, "{again}");
        assert_eq!(again["tree"]["bytes_reused"], total, "{again}");
        assert_eq!(again["tree"]["catalog_offset"], total, "{again}");
        assert_eq!(again["chunks"], first["chunks"], "{again}");
        if !extra.is_empty() {
            // Capping rewrote some reused chunks: their bytes were fetched back.
            assert!(again["rewritten"]["chunks"].as_u64() > Some(0), "{again}");
        }
        assert_restores(dir.path(), &repo, 2, &src);

        // One file changed (content and mtime): only it is read.
        let changed = random_bytes(7, 70_000);
        write(&src.join("a/max"), &changed, 0o755, at(1_700_000_000, 3));
        let third = backup_json(&repo, &src, &[]);
        assert_eq!(file_counts(&third), (0, 1, 4, 70_000), "{third}");
        assert_eq!(third["tree"]["parent"], 2, "{third}");
        assert_restores(dir.path(), &repo, 3, &src);

        // Same size, new contents and mtime: read again.
        let deep = src.join("a/b/c/deep.bin");
        write(
            &deep,
            &random_bytes(8, 300_000),
            0o640,
            at(1_000_000_002, 0),
        );
        let fourth = backup_json(&repo, &src, &[]);
        assert_eq!(file_counts(&fourth), (0, 1, 4, 300_000), "{fourth}");
        assert_restores(dir.path(), &repo, 4, &src);

        // Only the mtime changed: read again too.
        set_mtime(&deep, at(1_000_000_003, 0));
        let fifth = backup_json(&repo, &src, &[]);
        assert_eq!(file_counts(&fifth), (0, 1, 4, 300_000), "{fifth}");

        // --force reads everything.
        let total = 300_000 + 70_000 + 12 + 1;
        let forced = backup_json(&repo, &src, &["--force"]);
        assert_eq!(file_counts(&forced), (5, 0, 0, total), "{forced}");
        assert!(forced["tree"].get("parent").is_none(), "{forced}");
        assert_eq!(forced["chunks"], fifth["chunks"], "{forced}");
        assert_restores(dir.path(), &repo, 6, &src);

        // --parent: an older backup; in another lineage (lifecycle: none of
        // the reused chunks is in its previous version, all are fetched back).
        let older = backup_json(&repo, &src, &["--parent", "2", "--source", "elsewhere"]);
        assert_eq!(file_counts(&older), (0, 2, 3, 370_000), "{older}");
        assert_eq!(older["tree"]["parent"], 2, "{older}");
        if layout == "lifecycle" {
            // A new lineage stores every chunk, reused ones fetched back.
            assert_eq!(older["unique"]["bytes"], older["logical_bytes"], "{older}");
        }
        assert_restores(dir.path(), &repo, 7, &src);
        let human = backup_tree(&repo, &src);
        assert!(
            human.contains("files: 0 new, 0 changed, 5 unmodified (parent backup 6); 0 B read"),
            "{human}"
        );
    }
}

/// The binary value of a POSIX access ACL (`system.posix_acl_access`):
/// owner rw, user `uid` r, group r, mask r, other none.
fn acl_value(uid: u32) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 4, uid),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// What of the richer entry kinds this machine lets a test make.
struct Extras {
    xattrs: bool,
    acl: bool,
    device: bool,
}

/// Adds to a `make_tree` tree: hard links (three paths of one file, one in
/// another directory), a FIFO, a character device (as root), a socket, a
/// sparse file, extended attributes and a POSIX ACL (where supported).
fn make_rich_tree(root: &Path) -> Extras {
    make_tree(root);
    write(
        &root.join("a/hard1"),
        b"linked",
        0o640,
        at(1_500_000_000, 3),
    );
    fs::hard_link(root.join("a/hard1"), root.join("a/hard2")).unwrap();
    fs::hard_link(root.join("a/hard1"), root.join("empty2-hard3")).unwrap();
    let fifo = root.join("a/fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o620) }, 0);
    let dev = root.join("a/null");
    let c = std::ffi::CString::new(dev.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; fails unless root.
    let device =
        unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) } == 0;
    let _socket = std::os::unix::net::UnixListener::bind(root.join("a/sock")).unwrap();
    // A 4 MiB file with 8 KiB of data in the middle and holes around it.
    let sparse = root.join("a/sparse");
    let f = File::create(&sparse).unwrap();
    f.set_len(4 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &random_bytes(9, 8192), 1 << 20).unwrap();
    drop(f);
    set_mtime(&sparse, at(1_400_000_000, 77));
    let xattrs = xattr::set(root.join("a/max"), "user.tessera", b"\x00binary\xff").is_ok();
    if xattrs {
        xattr::set(root.join("a/b"), "user.dir", b"on a directory").unwrap();
        xattr::set(&fifo, "user.empty", b"").unwrap_or(());
    }
    let acl = xattr::set(
        root.join("a/zero"),
        "system.posix_acl_access",
        &acl_value(1234),
    )
    .is_ok();
    // Setting attributes changed the directories' times: set them again.
    for (d, t) in [("a/b", at(1_100_000_000, 5)), ("a", at(1_200_000_000, 6))] {
        set_mtime(&root.join(d), t);
    }
    Extras {
        xattrs,
        acl,
        device,
    }
}

/// Asserts what `assert_same_tree` does, and for every object its extended
/// attributes, link count and device number, for every sparse file that it
/// is no more allocated than the original, and that paths sharing an inode
/// in `original` share one in `restored`.
fn assert_exact_tree(original: &Path, restored: &Path) {
    assert_same_tree(original, restored);
    let mut inodes: std::collections::HashMap<u64, u64> = Default::default();
    let mut stack = vec![(original.to_path_buf(), restored.to_path_buf())];
    while let Some((a, b)) = stack.pop() {
        let (ma, mb) = (
            fs::symlink_metadata(&a).unwrap(),
            fs::symlink_metadata(&b).unwrap(),
        );
        let what = b.display();
        let names = |p: &Path| {
            let mut n: Vec<_> = xattr::list(p).map(|l| l.collect()).unwrap_or_default();
            n.sort();
            n
        };
        assert_eq!(names(&a), names(&b), "xattrs of {what}");
        for n in names(&a) {
            assert_eq!(
                xattr::get(&a, &n).unwrap(),
                xattr::get(&b, &n).unwrap(),
                "{what} {n:?}"
            );
        }
        assert_eq!(ma.nlink(), mb.nlink(), "links of {what}");
        assert_eq!(ma.rdev(), mb.rdev(), "device of {what}");
        if ma.is_file() {
            assert!(
                mb.blocks() <= ma.blocks() + 8,
                "allocation of {what}: {} > {}",
                mb.blocks(),
                ma.blocks()
            );
            let shared = *inodes.entry(ma.ino()).or_insert(mb.ino());
            assert_eq!(shared, mb.ino(), "hard link {what}");
        }
        if ma.is_dir() {
            for e in fs::read_dir(&a).unwrap() {
                let n = e.unwrap().file_name();
                stack.push((a.join(&n), b.join(&n)));
            }
        }
    }
}

#[test]
fn every_entry_kind_round_trips_exactly_in_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    let extras = make_rich_tree(&src);
    if !extras.xattrs {
        eprintln!(
            "note: {} has no user extended attributes: not tested",
            dir.path().display()
        );
    }
    if !extras.acl {
        eprintln!("note: POSIX ACLs not supported here: not tested");
    }
    if !extras.device {
        eprintln!("note: not root: device nodes not tested");
    }
    let sparse = fs::metadata(src.join("a/sparse")).unwrap();
    assert!(sparse.blocks() * 512 < sparse.len());
    for layout in ["container", "lifecycle"] {
        let repo = dir.path().join(format!("repo-{layout}"));
        init_layout(&repo, layout);
        let out = run([
            "backup".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            src.as_os_str(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("a/sock: socket not backed up"), "{stderr}");
        let b = json(&String::from_utf8_lossy(&out.stdout));
        // deep.bin, max, zero, the odd name, inside, hard1 (once), sparse.
        assert_eq!(b["tree"]["files"], 7, "{b}");
        let target = dir.path().join(format!("out-{layout}"));
        let r = json(&ok([
            "restore".as_ref(),
            "--json".as_ref(),
            "--verify".as_ref(),
            repo.as_os_str(),
            "1".as_ref(),
            target.as_os_str(),
        ]));
        assert_eq!(r["files"], 7, "{r}");
        assert_eq!(r["verified"], 7, "{r}");
        assert_eq!(r["hardlinks"], 2, "{r}");
        assert_eq!(r["nodes"], if extras.device { 2 } else { 1 }, "{r}");
        // The socket was not restored: compare without it (and put it back,
        // resetting the time of its directory each time).
        let back = restored(&target, &src);
        let a_dir = src.join("a");
        fs::remove_file(a_dir.join("sock")).unwrap();
        set_mtime(&a_dir, at(1_200_000_000, 6));
        assert_exact_tree(&src, &back);
        drop(std::os::unix::net::UnixListener::bind(a_dir.join("sock")).unwrap());
        set_mtime(&a_dir, at(1_200_000_000, 6));
        let listed = ls_long(&repo, &src.join("a"));
        assert!(
            listed
                .lines()
                .any(|l| l.starts_with('p') && l.ends_with("/a/fifo")),
            "{listed}"
        );
        assert!(listed.contains("/a/hard2 link to /"), "{listed}");
    }
}

/// The paths `ls -R` lists of backup `id` below `src`, relative to it.
fn listed_below(repo: &Path, id: &str, src: &Path) -> Vec<String> {
    let out = ok([
        "ls".as_ref(),
        "-R".as_ref(),
        repo.as_os_str(),
        id.as_ref(),
        src.as_os_str(),
    ]);
    let prefix = format!("{}/", src.display());
    out.lines()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .collect()
}

#[test]
fn selection_flags_leave_out_what_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for d in ["cache", "fakecache", "nobackup", "notes", "other"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    fs::write(src.join("keep.txt"), b"keep").unwrap();
    fs::write(src.join("Big.BIN"), b"binary").unwrap();
    fs::write(src.join("large.dat"), vec![7u8; 8192]).unwrap();
    let tag = b"Signature: 8a477f597d28d172789f06886806bc55\n# a cache\n";
    fs::write(src.join("cache/CACHEDIR.TAG"), tag).unwrap();
    fs::write(src.join("cache/x"), b"x").unwrap();
    fs::write(src.join("fakecache/CACHEDIR.TAG"), b"Signature: wrong").unwrap();
    fs::write(src.join("nobackup/.nobackup"), b"").unwrap();
    fs::write(src.join("nobackup/z"), b"z").unwrap();
    fs::write(src.join("notes/TODO.tmp"), b"t").unwrap();
    fs::write(src.join("notes/a.md"), b"a").unwrap();
    fs::write(src.join("other/o"), b"o").unwrap();
    let list = dir.path().join("excludes");
    fs::write(&list, b"# comment\n\n*.tmp\n").unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    ok([
        "backup".as_ref(),
        repo.as_os_str(),
        src.as_os_str(),
        "--exclude-file".as_ref(),
        list.as_os_str(),
        "--iexclude".as_ref(),
        "*.bin".as_ref(),
        "--exclude-if-present".as_ref(),
        ".nobackup".as_ref(),
        "--exclude-caches".as_ref(),
        "--exclude-larger-than".as_ref(),
        "4KiB".as_ref(),
    ]);
    let mut got = listed_below(&repo, "1", &src);
    got.sort();
    let want = [
        "fakecache",
        "fakecache/CACHEDIR.TAG",
        "keep.txt",
        "notes",
        "notes/a.md",
        "other",
        "other/o",
    ];
    assert_eq!(got, want);

    // --files-from: the listed paths (and their parents) only.
    let from = dir.path().join("files");
    let mut text = format!(
        "{}\n# not this\n{}\n",
        src.join("keep.txt").display(),
        src.join("notes").display()
    )
    .into_bytes();
    text.extend_from_slice(b"\n");
    fs::write(&from, text).unwrap();
    ok([
        "backup".as_ref(),
        repo.as_os_str(),
        "--files-from".as_ref(),
        from.as_os_str(),
    ]);
    let mut got = listed_below(&repo, "2", &src);
    got.sort();
    assert_eq!(got, ["keep.txt", "notes", "notes/TODO.tmp", "notes/a.md"]);

    // --follow-symlinks: a link to a directory is backed up as the directory.
    let linked = dir.path().join("linked");
    fs::create_dir(&linked).unwrap();
    symlink(src.join("other"), linked.join("to-other")).unwrap();
    backup_tree(&repo, &linked);
    assert_eq!(listed_below(&repo, "3", &linked), ["to-other"]);
    ok([
        "backup".as_ref(),
        "--follow-symlinks".as_ref(),
        repo.as_os_str(),
        linked.as_os_str(),
    ]);
    assert_eq!(
        listed_below(&repo, "4", &linked),
        ["to-other", "to-other/o"]
    );
    let out = dir.path().join("out");
    ok([
        "restore".as_ref(),
        repo.as_os_str(),
        "4".as_ref(),
        out.as_os_str(),
    ]);
    let back = restored(&out, &linked).join("to-other");
    assert!(fs::symlink_metadata(&back).unwrap().is_dir());
    assert_eq!(fs::read(back.join("o")).unwrap(), b"o");
}

#[test]
fn bad_input_is_refused_clearly_and_changes_are_noted() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("a"), b"a").unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    let missing = dir.path().join("missing");
    let err = fail([
        "backup".as_ref(),
        repo.as_os_str(),
        src.as_os_str(),
        missing.as_os_str(),
    ]);
    assert!(
        err.contains(&*missing.to_string_lossy()) && err.contains("No such file"),
        "{err}"
    );
    let err = fail([
        "backup".as_ref(),
        repo.as_os_str(),
        src.as_os_str(),
        "--exclude".as_ref(),
        "*".as_ref(),
    ]);
    assert!(
        err.contains("excluded") && err.contains(&*src.to_string_lossy()),
        "{err}"
    );
    assert!(common::list_ids(&repo).is_empty(), "nothing committed");
    let err = fail([
        "backup".as_ref(),
        repo.as_os_str(),
        "--files-from".as_ref(),
        missing.as_os_str(),
    ]);
    assert!(err.contains(&*missing.to_string_lossy()), "{err}");
    // A file whose length is not what it was when opened (a procfs file
    // reports 0 bytes and reads more): noted, backed up as read.
    let out = run([
        "backup".as_ref(),
        repo.as_os_str(),
        src.as_os_str(),
        "/proc/self/stat".as_ref(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("tessera: note: /proc/")
                && l.contains("/stat: changed while it was read (0 bytes when opened")),
        "{stderr}"
    );
}

#[test]
fn restore_overwrite_modes_delete_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    for (name, data) in [("same", "same"), ("edited", "edited"), ("gone", "gone")] {
        write(
            &src.join(name),
            data.as_bytes(),
            0o644,
            at(1_000_000_000, 1),
        );
    }
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let out = dir.path().join("out");
    let restore = |extra: &[&str]| {
        let mut args: Vec<&OsStr> = vec!["restore".as_ref(), "--json".as_ref()];
        args.extend(extra.iter().map(|a| OsStr::new(*a)));
        args.extend([repo.as_os_str(), "1".as_ref(), out.as_os_str()]);
        json(&ok(args))
    };
    restore(&[]);
    let back = restored(&out, &src);
    // Local changes: one file edited (same size, other time), one removed, one added.
    write(&back.join("edited"), b"EDITED", 0o644, at(2_000_000_000, 2));
    fs::remove_file(back.join("gone")).unwrap();
    fs::write(back.join("extra"), b"not in the backup").unwrap();
    let r = restore(&["--overwrite=never"]);
    assert_eq!(
        (r["files"].as_u64(), r["kept"].as_u64()),
        (Some(1), Some(2)),
        "{r}"
    );
    assert_eq!(fs::read(back.join("edited")).unwrap(), b"EDITED");
    assert_eq!(fs::read(back.join("gone")).unwrap(), b"gone");
    let r = restore(&["--overwrite=if-changed", "--verify"]);
    assert_eq!(
        (r["files"].as_u64(), r["kept"].as_u64()),
        (Some(1), Some(2)),
        "{r}"
    );
    assert_eq!(r["verified"], 1, "{r}");
    assert_eq!(fs::read(back.join("edited")).unwrap(), b"edited");
    assert!(back.join("extra").exists());
    let r = restore(&["--overwrite", "--delete", "--verify"]);
    assert_eq!(
        (r["files"].as_u64(), r["deleted"].as_u64()),
        (Some(3), Some(1)),
        "{r}"
    );
    assert_eq!(r["verified"], 3, "{r}");
    assert!(!back.join("extra").exists());
    assert_same_tree(&src, &back);
    let r = restore(&["--overwrite=always", "--verify"]);
    assert_eq!(r["verified"], 3, "{r}");
}

/// A restore into a file system that fills up reports the file that did
/// not fit, and leaves no partial file behind (as root, on a 1 MiB tmpfs; skipped
/// where mounting is not permitted).
#[test]
fn a_restore_onto_a_full_file_system_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        eprintln!("note: cannot mount a tmpfs here: full file system not tested");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _guard = Unmount(&mnt);
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("a-small"), b"fits").unwrap();
    fs::write(src.join("b-big"), random_bytes(3, 3 << 20)).unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let target = mnt.join("out");
    let out = run([
        "restore".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        target.as_os_str(),
    ]);
    // Reported, and the restore goes on (exit status 3).
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.lines().any(|l| l.starts_with("tessera: warning: ")
            && l.contains("b-big")
            && l.contains("No space left on device")),
        "{err}"
    );
    let back = restored(&target, &src);
    assert_eq!(fs::read(back.join("a-small")).unwrap(), b"fits");
    let left: Vec<_> = fs::read_dir(&back)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [OsStr::new("a-small")], "no partial file");
}

#[test]
fn stdin_is_backed_up_as_a_named_file() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    let data = random_bytes(11, 200_000);
    let mut child = common::cmd([
        "backup".as_ref(),
        "--json".as_ref(),
        repo.as_os_str(),
        "-".as_ref(),
        "--stdin-name".as_ref(),
        OsStr::new("dumps/db.sql"),
    ])
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    child.stdin.take().unwrap().write_all(&data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let b = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(b["tree"]["files"], 1, "{b}");
    assert_eq!(b["source"], "stdin:dumps/db.sql", "{b}");
    let listed = ok(["ls".as_ref(), "-R".as_ref(), repo.as_os_str(), "1".as_ref()]);
    assert_eq!(listed.trim(), "/dumps/db.sql");
    let target = dir.path().join("out");
    ok([
        "restore".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        target.as_os_str(),
    ]);
    assert!(fs::read(target.join("dumps/db.sql")).unwrap() == data);
    let err = fail([
        "backup".as_ref(),
        repo.as_os_str(),
        "-".as_ref(),
        "--stdin-name".as_ref(),
        "../x".as_ref(),
    ]);
    assert!(err.contains("--stdin-name"), "{err}");
}
