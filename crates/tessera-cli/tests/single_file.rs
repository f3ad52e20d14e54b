//! A single file is a backup of a path (issue #38, item 4): `backup R FILE`
//! records the file at its absolute path with its metadata, as a tree
//! backup of one file; standard input stays a stream (or, named with
//! `--stdin-name`, one file); retention groups by host, paths and source
//! and `forget --dry-run` shows the groups.

mod common;

use common::{fail, init, json, ok, random_bytes, run};
use std::ffi::OsStr;
use std::fs::{self, File, FileTimes};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

/// Writes `data` to `path` with `mode` and a modification time of `secs`
/// seconds and `nanos` nanoseconds after the epoch.
fn write(path: &Path, data: &[u8], mode: u32, secs: u64, nanos: u32) {
    fs::write(path, data).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    let t = UNIX_EPOCH + Duration::new(secs, nanos);
    File::open(path)
        .unwrap()
        .set_times(FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

/// `backup --json REPO ARGS...`, parsed.
fn backup(repo: &Path, args: &[&OsStr]) -> serde_json::Value {
    let mut all = vec!["backup".as_ref(), "--json".as_ref(), repo.as_os_str()];
    all.extend_from_slice(args);
    json(&ok(all))
}

/// `backup --json REPO - ARGS...` with `data` on standard input, parsed.
fn backup_stdin(repo: &Path, data: &[u8], args: &[&str]) -> serde_json::Value {
    let mut child = common::spawn_stream_backup(repo, args);
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    json(&String::from_utf8_lossy(&out.stdout))
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect()
}

/// The canonical absolute path of `path` (the temporary directory may be
/// reached through a symbolic link): what a backup records.
fn absolute(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap()
}

/// A repository and two files standing for `/etc/passwd` and `/etc/group`.
fn passwd_and_group() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let etc = dir.path().join("etc");
    fs::create_dir(&etc).unwrap();
    let passwd = etc.join("passwd");
    let group = etc.join("group");
    write(
        &passwd,
        b"root:x:0:0:root:/root:/bin/sh\n",
        0o644,
        1_500_000_000,
        0,
    );
    write(&group, b"root:x:0:\n", 0o644, 1_500_000_001, 0);
    let repo = dir.path().join("repo");
    init(&repo);
    (dir, repo, absolute(&passwd), absolute(&group))
}

#[test]
fn keep_last_keeps_the_latest_backup_of_each_file() {
    let (_dir, repo, passwd, group) = passwd_and_group();
    let a = backup(&repo, &[passwd.as_os_str()]);
    let b = backup(&repo, &[group.as_os_str()]);
    assert_ne!(a["source"], b["source"], "{a} {b}");
    let r = repo.as_os_str();
    let forget = || {
        json(&ok([
            "forget".as_ref(),
            r,
            "--keep-last".as_ref(),
            "1".as_ref(),
            "--json".as_ref(),
        ]))
    };
    let v = forget();
    assert_eq!(v["removed"], serde_json::json!([]), "{v}");
    assert_eq!(common::list_ids(&repo), vec![1, 2]);
    // A second backup of /etc/passwd makes its first one the one to go.
    backup(&repo, &[passwd.as_os_str()]);
    let v = forget();
    assert_eq!(ids(&v["removed"]), vec![1], "{v}");
    assert_eq!(common::list_ids(&repo), vec![2, 3]);
}

#[test]
fn list_shows_the_files_path() {
    let (_dir, repo, passwd, _) = passwd_and_group();
    let b = backup(&repo, &[passwd.as_os_str()]);
    assert_eq!(b["tree"]["files"], 1, "{b}");
    assert_eq!(b["tree"]["paths"], serde_json::json!([passwd]), "{b}");
    let listed = json(&ok(["list".as_ref(), repo.as_os_str(), "--json".as_ref()]));
    assert_eq!(listed[0]["paths"], serde_json::json!([passwd]), "{listed}");
    assert_eq!(listed[0]["files"], 1, "{listed}");
    let text = ok(["list".as_ref(), repo.as_os_str()]);
    assert!(text.contains(passwd.to_str().unwrap()), "{text}");
    assert!(!text.contains("(default)"), "{text}");
    // `list --path` finds it by its path.
    let only = json(&ok([
        "list".as_ref(),
        repo.as_os_str(),
        "--path".as_ref(),
        passwd.as_os_str(),
        "--json".as_ref(),
    ]));
    assert_eq!(only.as_array().unwrap().len(), 1, "{only}");
}

#[test]
fn ls_find_dump_and_diff_see_a_one_file_backup() {
    let (_dir, repo, passwd, _) = passwd_and_group();
    let r = repo.as_os_str();
    backup(&repo, &[passwd.as_os_str()]);
    // ls: the file, below its ancestors.
    let listed = ok(["ls".as_ref(), r, "1".as_ref(), "-R".as_ref()]);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.last(), Some(&passwd.to_str().unwrap()), "{listed}");
    assert!(
        lines.contains(&passwd.parent().unwrap().to_str().unwrap()),
        "{listed}"
    );
    let long = ok([
        "ls".as_ref(),
        r,
        "1".as_ref(),
        "-l".as_ref(),
        passwd.as_os_str(),
    ]);
    assert!(long.starts_with("-rw-r--r--"), "{long}");
    // find: by name, at any depth.
    let found = json(&ok([
        "find".as_ref(),
        r,
        "passwd".as_ref(),
        "--json".as_ref(),
    ]));
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["path"], passwd.to_str().unwrap(), "{found}");
    // dump: its bytes.
    let dumped = run(["dump".as_ref(), r, "1".as_ref(), passwd.as_os_str()]);
    assert!(dumped.status.success(), "{dumped:?}");
    assert_eq!(dumped.stdout, fs::read(&passwd).unwrap());
    // diff: a change of contents, then one of metadata only.
    let data = b"root:x:0:0:root:/root:/bin/bash\n";
    write(&passwd, data, 0o644, 1_600_000_000, 0);
    backup(&repo, &[passwd.as_os_str()]);
    // The parent is the previous backup of the same file: unchanged, it is
    // not read again.
    let b = backup(&repo, &[passwd.as_os_str()]);
    assert_eq!(b["tree"]["parent"], 2, "{b}");
    assert_eq!(b["tree"]["files_unmodified"], 1, "{b}");
    fs::set_permissions(&passwd, fs::Permissions::from_mode(0o600)).unwrap();
    backup(&repo, &[passwd.as_os_str()]);
    // The changes of the file (its ancestors, such as /tmp, may change
    // meanwhile: other tests create directories there).
    let path = passwd.to_str().unwrap().to_string();
    let changes = |a: &str, b: &str| {
        let v = json(&ok([
            "diff".as_ref(),
            r,
            a.as_ref(),
            b.as_ref(),
            "--json".as_ref(),
        ]));
        v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["change"].as_str().unwrap().to_string(),
                    c["path"].as_str().unwrap().to_string(),
                )
            })
            .filter(|(_, p)| *p == path)
            .collect::<Vec<_>>()
    };
    assert_eq!(changes("1", "2"), vec![("changed".into(), path.clone())]);
    assert!(changes("2", "3").is_empty());
    assert_eq!(changes("3", "4"), vec![("metadata".into(), path.clone())]);
}

#[test]
fn restore_puts_the_file_at_its_path_with_its_mtime_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.bin");
    let data = random_bytes(3, 300_000);
    write(&file, &data, 0o640, 1_234_567_890, 123_456_789);
    let file = absolute(&file);
    let repo = dir.path().join("repo");
    init(&repo);
    backup(&repo, &[file.as_os_str()]);
    let target = dir.path().join("target");
    ok([
        "restore".as_ref(),
        repo.as_os_str(),
        "latest".as_ref(),
        target.as_os_str(),
    ]);
    let back = target.join(file.strip_prefix("/").unwrap());
    assert!(fs::read(&back).unwrap() == data, "contents differ");
    let m = fs::metadata(&back).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_234_567_890, 123_456_789));
    // Nothing else but the file and its ancestors.
    let top: Vec<_> = fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(top.len(), 1, "{top:?}");
}

#[test]
fn several_files_and_a_directory_make_one_backup_of_their_paths() {
    let (dir, repo, passwd, group) = passwd_and_group();
    let docs = absolute(dir.path()).join("docs");
    fs::create_dir(&docs).unwrap();
    write(&docs.join("a.txt"), b"a", 0o644, 1_000, 0);
    let b = backup(
        &repo,
        &[passwd.as_os_str(), group.as_os_str(), docs.as_os_str()],
    );
    let mut paths = vec![
        docs.display().to_string(),
        group.display().to_string(),
        passwd.display().to_string(),
    ];
    paths.sort();
    assert_eq!(b["tree"]["paths"], serde_json::json!(paths), "{b}");
    assert_eq!(b["tree"]["files"], 3, "{b}");
    // Another set of paths is another group: keep-last 1 keeps both.
    backup(&repo, &[group.as_os_str(), passwd.as_os_str()]);
    let v = json(&ok([
        "forget".as_ref(),
        repo.as_os_str(),
        "--keep-last".as_ref(),
        "1".as_ref(),
        "--json".as_ref(),
    ]));
    assert_eq!(v["removed"], serde_json::json!([]), "{v}");
    // Standard input is backed up alone.
    let e = fail([
        "backup".as_ref(),
        repo.as_os_str(),
        "-".as_ref(),
        passwd.as_os_str(),
    ]);
    assert!(e.contains("standard input"), "{e}");
}

#[test]
fn a_symbolic_link_given_is_backed_up_as_the_link_with_a_note() {
    let (dir, repo, passwd, _) = passwd_and_group();
    let link = absolute(dir.path()).join("current");
    std::os::unix::fs::symlink(&passwd, &link).unwrap();
    let out = run(["backup".as_ref(), repo.as_os_str(), link.as_os_str()]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("note: {}: a symbolic link", link.display()))
            && err.contains("--follow-symlinks"),
        "{err}"
    );
    let long = ok([
        "ls".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        "-l".as_ref(),
        link.as_os_str(),
    ]);
    assert!(long.starts_with('l'), "{long}");
    // Followed, it is the file's bytes, under the link's name.
    let out = run([
        "backup".as_ref(),
        repo.as_os_str(),
        link.as_os_str(),
        "--follow-symlinks".as_ref(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note:"));
    let dumped = run([
        "dump".as_ref(),
        repo.as_os_str(),
        "2".as_ref(),
        link.as_os_str(),
    ]);
    assert_eq!(dumped.stdout, fs::read(&passwd).unwrap());
}

#[test]
fn stdin_stays_a_stream_and_stdin_name_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    let data = random_bytes(5, 100_000);
    // `-` alone: a stream, as before (and as backups of files used to be).
    let s = backup_stdin(&repo, &data, &[]);
    assert!(s["tree"].is_null(), "{s}");
    assert_eq!(s["source"], "default");
    let listed = json(&ok(["list".as_ref(), repo.as_os_str(), "--json".as_ref()]));
    assert!(listed[0].get("paths").is_none(), "{listed}");
    let out = dir.path().join("stream.out");
    ok([
        "restore".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        out.as_os_str(),
    ]);
    assert!(fs::read(&out).unwrap() == data);
    // Named: one file at that path, in a group of its own.
    let named = backup_stdin(&repo, &data, &["--stdin-name", "dumps/db.sql"]);
    assert_eq!(named["tree"]["paths"], serde_json::json!(["/dumps/db.sql"]));
    let other = backup_stdin(&repo, &data, &["--stdin-name", "dumps/other.sql"]);
    let dumped = run([
        "dump".as_ref(),
        repo.as_os_str(),
        "2".as_ref(),
        "/dumps/db.sql".as_ref(),
    ]);
    assert!(dumped.stdout == data, "{:?}", dumped.status);
    let v = json(&ok([
        "forget".as_ref(),
        repo.as_os_str(),
        "--keep-last".as_ref(),
        "1".as_ref(),
        "--dry-run".as_ref(),
        "--json".as_ref(),
    ]));
    assert_eq!(v["removed"], serde_json::json!([]), "{v}");
    let groups = v["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 3, "{v}");
    assert!(
        groups
            .iter()
            .any(|g| g["paths"] == serde_json::json!(["/dumps/other.sql"])
                && g["keep"] == serde_json::json!([other["id"]])),
        "{v}"
    );
    // A stream's group has no paths: its source names it.
    assert!(
        groups
            .iter()
            .any(|g| g["paths"] == serde_json::json!([]) && g["source"] == "default"),
        "{v}"
    );
    let e = fail([
        "backup".as_ref(),
        repo.as_os_str(),
        dir.path().as_os_str(),
        "--stdin-name".as_ref(),
        "x".as_ref(),
    ]);
    assert!(e.contains("--stdin-name"), "{e}");
}

#[test]
fn forget_dry_run_prints_the_groups() {
    let (_dir, repo, passwd, group) = passwd_and_group();
    for file in [&passwd, &group, &passwd] {
        backup(&repo, &[file.as_os_str()]);
    }
    let r = repo.as_os_str();
    let v = json(&ok([
        "forget".as_ref(),
        r,
        "--keep-last".as_ref(),
        "1".as_ref(),
        "--dry-run".as_ref(),
        "--json".as_ref(),
    ]));
    assert_eq!(
        v["group_by"],
        serde_json::json!(["host", "paths", "source"])
    );
    let groups = v["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{v}");
    let host = &groups[0]["host"];
    assert!(host.is_string(), "{v}");
    let of = |file: &Path| {
        groups
            .iter()
            .find(|g| g["paths"] == serde_json::json!([file]))
            .unwrap_or_else(|| panic!("no group of {}: {v}", file.display()))
    };
    assert_eq!(of(&passwd)["keep"], serde_json::json!([3]), "{v}");
    assert_eq!(of(&passwd)["remove"], serde_json::json!([1]), "{v}");
    assert_eq!(of(&group)["keep"], serde_json::json!([2]), "{v}");
    assert_eq!(of(&group)["remove"], serde_json::json!([]), "{v}");
    let name = of(&passwd)["group"].as_str().unwrap();
    assert!(
        name.starts_with(&format!(
            "host={} paths={} source=",
            host.as_str().unwrap(),
            passwd.display()
        )),
        "{name}"
    );
    // The decisions carry the same group names.
    for d in v["decisions"].as_array().unwrap() {
        assert!(groups.iter().any(|g| g["group"] == d["group"]), "{d}");
    }
    // Text: the grouping, then each group with its counts and decisions.
    let text = ok([
        "forget".as_ref(),
        r,
        "--keep-last".as_ref(),
        "1".as_ref(),
        "--dry-run".as_ref(),
    ]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "2 group(s) by host,paths,source", "{text}");
    assert!(
        lines.contains(&format!("group {name}: keep 1, remove 1").as_str()),
        "{text}"
    );
    // Another grouping is named as such; an empty one puts all together.
    let text = ok([
        "forget".as_ref(),
        r,
        "--keep-last".as_ref(),
        "1".as_ref(),
        "--dry-run".as_ref(),
        "--group-by".as_ref(),
        "".as_ref(),
    ]);
    assert!(text.starts_with("1 group(s) by nothing"), "{text}");
    assert!(text.contains("group (all): keep 1, remove 2"), "{text}");
    assert_eq!(common::list_ids(&repo), vec![1, 2, 3]);
}
