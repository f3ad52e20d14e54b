//! Restores a user can trust (issue 38): never outside the target, never
//! all-or-nothing, ancestors created but never modified, and selections
//! that mean what a user means (hard links by any name, relative
//! patterns, patterns matching nothing).

mod common;

use common::{backup_tree, init, run};
use std::ffi::OsStr;
use std::fs::{self, File, FileTimes};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, UNIX_EPOCH};

fn set_time(path: &Path, secs: u64) {
    let t = UNIX_EPOCH + Duration::from_secs(secs);
    File::open(path)
        .unwrap()
        .set_times(FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Where a backed-up path is restored below `target`.
fn under(target: &Path, original: &Path) -> PathBuf {
    target.join(original.strip_prefix("/").unwrap())
}

/// `tessera restore --json REPO latest TARGET ARGS…`.
fn restore(repo: &Path, target: &Path, args: &[&OsStr]) -> Output {
    let mut all: Vec<&OsStr> = vec![
        "restore".as_ref(),
        "--json".as_ref(),
        repo.as_os_str(),
        "latest".as_ref(),
        target.as_os_str(),
    ];
    all.extend_from_slice(args);
    run(all)
}

fn stdout_json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// (mode, mtime) of `path`.
fn mode_time(path: &Path) -> (u32, i64) {
    let m = fs::symlink_metadata(path).unwrap();
    (m.mode() & 0o7777, m.mtime())
}

/// Item 3: a restore of one file creates its missing ancestors with the
/// backup's metadata and leaves existing ones exactly as they are, in
/// every `--overwrite` mode; only the directories the selection covers
/// get their metadata restored.
#[test]
fn a_one_file_restore_creates_missing_ancestors_and_leaves_existing_ones() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("a/b/c")).unwrap();
    fs::write(src.join("a/b/c/f"), b"restored").unwrap();
    fs::write(src.join("a/other"), b"not selected").unwrap();
    for (d, mode, t) in [
        ("a/b/c", 0o711, 300),
        ("a/b", 0o750, 200),
        ("a", 0o700, 100),
    ] {
        set_mode(&src.join(d), mode);
        set_time(&src.join(d), t);
    }
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let file = src.join("a/b/c/f");
    for (k, mode) in [
        "",
        "--overwrite",
        "--overwrite=never",
        "--overwrite=if-changed",
    ]
    .iter()
    .enumerate()
    {
        let target = dir.path().join(format!("t{k}"));
        let a = under(&target, &src.join("a"));
        fs::create_dir_all(&a).unwrap();
        set_mode(&a, 0o755);
        set_time(&a, 5_000_000);
        let parent = a.parent().unwrap().to_path_buf();
        set_time(&parent, 6_000_000);
        let before = mode_time(&parent);
        let mut args: Vec<&OsStr> = vec!["--include".as_ref(), file.as_os_str()];
        if !mode.is_empty() {
            args.push(mode.as_ref());
        }
        let out = restore(&repo, &target, &args);
        assert!(out.status.success(), "{mode}: {}", stderr(&out));
        assert_eq!(
            fs::read(under(&target, &src.join("a/b/c/f"))).unwrap(),
            b"restored"
        );
        assert!(!under(&target, &src.join("a/other")).exists());
        // Existing ancestors: as they were (the one a directory was made
        // in has a new modification time, as for any new entry, not the
        // backup's).
        assert_eq!(mode_time(&parent), before, "{mode}");
        let (a_mode, a_time) = mode_time(&a);
        assert_eq!(a_mode, 0o755, "{mode}");
        assert!(a_time >= 5_000_000, "{mode}: {a_time}");
        // Missing ones: made with the backup's metadata.
        assert_eq!(mode_time(&a.join("b")), (0o750, 200), "{mode}");
        assert_eq!(mode_time(&a.join("b/c")), (0o711, 300), "{mode}");
    }
    // A selected directory that exists gets the backup's metadata only
    // when --overwrite replaces.
    let target = dir.path().join("t0");
    let c = under(&target, &src.join("a/b/c"));
    set_mode(&c, 0o777);
    let inc = src.join("a/b/c");
    let out = restore(
        &repo,
        &target,
        &[
            "--include".as_ref(),
            inc.as_os_str(),
            "--overwrite=never".as_ref(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode_time(&c).0, 0o777);
    let out = restore(
        &repo,
        &target,
        &[
            "--include".as_ref(),
            inc.as_os_str(),
            "--overwrite".as_ref(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode_time(&c), (0o711, 300));
    assert_eq!(mode_time(c.parent().unwrap()), (0o750, 200));
}

/// Item 5: a hard link restores by any of its names — the first restored
/// name carries the data, the others link to it — and `dump` of any name
/// gives the file.
#[test]
fn a_hard_link_restores_and_dumps_by_any_of_its_names() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("x")).unwrap();
    fs::write(src.join("f"), b"shared bytes").unwrap();
    set_mode(&src.join("f"), 0o640);
    set_time(&src.join("f"), 1_234_567);
    fs::hard_link(src.join("f"), src.join("g")).unwrap();
    fs::hard_link(src.join("f"), src.join("x/h")).unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    // By its second name alone.
    let t1 = dir.path().join("t1");
    let out = restore(
        &repo,
        &t1,
        &["--include".as_ref(), src.join("g").as_os_str()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let g = under(&t1, &src.join("g"));
    assert_eq!(fs::read(&g).unwrap(), b"shared bytes");
    assert_eq!(mode_time(&g), (0o640, 1_234_567));
    assert!(!under(&t1, &src.join("f")).exists());
    assert_eq!(stdout_json(&out)["files"], 1);
    // By two later names: one carries the bytes, the other links to it.
    let t2 = dir.path().join("t2");
    let out = restore(
        &repo,
        &t2,
        &[
            "--include".as_ref(),
            src.join("g").as_os_str(),
            "--include".as_ref(),
            src.join("x/h").as_os_str(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (g, h) = (under(&t2, &src.join("g")), under(&t2, &src.join("x/h")));
    assert_eq!(fs::read(&h).unwrap(), b"shared bytes");
    assert_eq!(
        fs::metadata(&g).unwrap().ino(),
        fs::metadata(&h).unwrap().ino()
    );
    let v = stdout_json(&out);
    assert_eq!(
        (v["files"].as_u64(), v["hardlinks"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    // dump by any name.
    for name in ["f", "g", "x/h"] {
        let out = run([
            "dump".as_ref(),
            repo.as_os_str(),
            "latest".as_ref(),
            src.join(name).as_os_str(),
        ]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_eq!(out.stdout, b"shared bytes", "{name}");
    }
}

/// Item 5: a relative pattern is taken relative to each backed-up path; a
/// pattern that matches nothing is an error naming it (exit status 1),
/// and nothing is written.
#[test]
fn relative_patterns_and_patterns_that_match_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("etc/apt")).unwrap();
    fs::write(src.join("etc/hostname"), b"box\n").unwrap();
    fs::write(src.join("etc/apt/sources.list"), b"deb x\n").unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let target = dir.path().join("t");
    let out = restore(
        &repo,
        &target,
        &["--include".as_ref(), "etc/hostname".as_ref()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        fs::read(under(&target, &src.join("etc/hostname"))).unwrap(),
        b"box\n"
    );
    assert!(!under(&target, &src.join("etc/apt")).exists());
    // `./etc/apt` (a relative path without `/` inside), and a relative exclude.
    let out = restore(
        &repo,
        &target,
        &[
            "--include".as_ref(),
            "./etc".as_ref(),
            "--exclude".as_ref(),
            "etc/hostname".as_ref(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(under(&target, &src.join("etc/apt/sources.list")).exists());
    for missing in ["etc/nothing", "/etc/hostname"] {
        let fresh = dir.path().join("fresh");
        let out = restore(
            &repo,
            &fresh,
            &[
                "--include".as_ref(),
                "etc/hostname".as_ref(),
                "--include".as_ref(),
                missing.as_ref(),
            ],
        );
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("--include {missing:?} matches nothing")),
            "{err}"
        );
        assert!(!fresh.exists(), "nothing is written");
        // The same with --tar.
        let tar = dir.path().join("out.tar");
        let out = run([
            "restore".as_ref(),
            "--tar".as_ref(),
            repo.as_os_str(),
            "latest".as_ref(),
            tar.as_os_str(),
            "--include".as_ref(),
            missing.as_ref(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(!tar.exists());
    }
    let err = stderr(&restore(
        &repo,
        &dir.path().join("f2"),
        &["--include".as_ref(), "etc/nothing".as_ref()],
    ));
    assert!(
        err.contains(&src.display().to_string()),
        "the hint names the backed-up path: {err}"
    );
}

/// Items 1 and 2: a symbolic link in the target where the backup has a
/// directory is never followed — reported without --overwrite, replaced
/// with it — and one entry that cannot be restored does not stop the
/// others (exit status 3, `failed` in the JSON); a path longer than
/// PATH_MAX is restored.
#[test]
fn a_link_in_the_target_is_never_followed_and_conflicts_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("etc/apt")).unwrap();
    fs::write(src.join("etc/apt/sources.list"), b"deb x\n").unwrap();
    fs::create_dir_all(src.join("data")).unwrap();
    fs::write(src.join("data/file"), b"file").unwrap();
    fs::write(src.join("zz"), b"last").unwrap();
    // A path that, restored below a target, is longer than PATH_MAX.
    let mut deep = src.join("deep");
    while deep.as_os_str().len() < 3700 {
        deep.push("d".repeat(200));
    }
    deep.push("e".repeat(4000 - deep.as_os_str().len()));
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("leaf"), b"deep").unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let target = dir.path().join("t".repeat(120));
    let etc = under(&target, &src.join("etc"));
    fs::create_dir_all(etc.parent().unwrap()).unwrap();
    symlink(&outside, &etc).unwrap();
    // A file where the backup has a directory.
    fs::write(under(&target, &src.join("data")), b"in the way").unwrap();
    let out = restore(&repo, &target, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written through the link"
    );
    assert!(fs::symlink_metadata(&etc).unwrap().file_type().is_symlink());
    let v = stdout_json(&out);
    let failed = v["failed"].as_array().unwrap();
    let paths: Vec<&str> = failed.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            src.join("data").to_str().unwrap(),
            src.join("etc").to_str().unwrap()
        ],
        "{v}"
    );
    assert!(
        failed[1]["reason"]
            .as_str()
            .unwrap()
            .contains("symbolic link"),
        "{v}"
    );
    assert_eq!(failed[1]["below"], 2, "{v}");
    assert!(stderr(&out).contains("incomplete"), "{}", stderr(&out));
    // Every other entry was restored, the long path too.
    assert_eq!(fs::read(under(&target, &src.join("zz"))).unwrap(), b"last");
    let leaf = under(&target, &deep.join("leaf"));
    assert!(leaf.as_os_str().len() > 4096);
    let found = std::process::Command::new("find")
        .arg(&target)
        .args(["-name", "leaf"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&found.stdout).contains("/leaf"),
        "{found:?}"
    );
    // With --overwrite the backup's kinds win.
    let out = restore(&repo, &target, &["--overwrite".as_ref()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert!(fs::symlink_metadata(&etc).unwrap().is_dir());
    assert_eq!(fs::read(etc.join("apt/sources.list")).unwrap(), b"deb x\n");
    assert_eq!(
        fs::read(under(&target, &src.join("data/file"))).unwrap(),
        b"file"
    );
}
