//! Browsing tree backups end to end: `dump`, `restore --tar`, `diff`,
//! `find`, `ls` errors, and `list` with hosts, tags and filters, `tag`.

mod common;

use common::{backup_tree, cmd, fail, init, json, ok, random_bytes, run};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File, FileTimes};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

fn write(path: &Path, data: &[u8], mode: u32, mtime: u64) {
    fs::write(path, data).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    set_mtime(path, mtime);
}

fn set_mtime(path: &Path, secs: u64) {
    let t = UNIX_EPOCH + Duration::from_secs(secs);
    File::open(path)
        .unwrap()
        .set_times(FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

/// A long directory name: paths below it exceed ustar's 100-byte name field.
const LONG: &str = "a-directory-name-long-enough-that-paths-below-it-need-gnu-long-name-records-in-tar-streams-0123456789";

fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("docs/sub")).unwrap();
    fs::create_dir_all(root.join(LONG)).unwrap();
    write(&root.join("docs/a.txt"), b"alpha\n", 0o640, 1_500_000_000);
    write(
        &root.join("docs/sub/big.bin"),
        &random_bytes(7, 700_000),
        0o600,
        1_600_000_000,
    );
    write(&root.join("docs/empty"), b"", 0o644, 1_000);
    write(
        &root.join(LONG).join("file-with-a-long-name-too.txt"),
        &random_bytes(8, 5000),
        0o755,
        1_700_000_000,
    );
    write(
        &root.join(OsStr::from_bytes(b"caf\xe9.txt")),
        b"latin-1",
        0o644,
        1_234_567_890,
    );
    symlink(format!("{LONG}/../docs/a.txt"), root.join("link")).unwrap();
}

/// One tar entry as read back: kind, mode, mtime, uid, contents or link target.
#[derive(Debug, PartialEq, Eq)]
struct TarItem {
    kind: char,
    mode: u32,
    mtime: u64,
    uid: u64,
    data: Vec<u8>,
}

fn read_tar(bytes: &[u8]) -> BTreeMap<Vec<u8>, TarItem> {
    let mut archive = tar::Archive::new(bytes);
    let mut items = BTreeMap::new();
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let h = e.header().clone();
        let name = e.path_bytes().into_owned();
        let kind = match h.entry_type() {
            tar::EntryType::Directory => 'd',
            tar::EntryType::Symlink => 'l',
            tar::EntryType::Regular => 'f',
            other => panic!("unexpected entry type {other:?}"),
        };
        let mut data = Vec::new();
        if kind == 'l' {
            data = e.link_name_bytes().unwrap().into_owned();
        } else {
            e.read_to_end(&mut data).unwrap();
        }
        items.insert(
            name,
            TarItem {
                kind,
                mode: h.mode().unwrap(),
                mtime: h.mtime().unwrap(),
                uid: h.uid().unwrap(),
                data,
            },
        );
    }
    items
}

/// What `root` holds, as a tar of it named `prefix/…` should.
fn expected_items(root: &Path, prefix: &[u8]) -> BTreeMap<Vec<u8>, TarItem> {
    let mut items = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), prefix.to_vec())];
    while let Some((path, name)) = stack.pop() {
        let m = fs::symlink_metadata(&path).unwrap();
        let (kind, data, key) = if m.is_dir() {
            for e in fs::read_dir(&path).unwrap() {
                let e = e.unwrap();
                let mut n = name.clone();
                n.push(b'/');
                n.extend_from_slice(e.file_name().as_bytes());
                stack.push((e.path(), n));
            }
            let mut key = name.clone();
            key.push(b'/');
            ('d', Vec::new(), key)
        } else if m.file_type().is_symlink() {
            let t = fs::read_link(&path).unwrap();
            ('l', t.as_os_str().as_bytes().to_vec(), name.clone())
        } else {
            ('f', fs::read(&path).unwrap(), name.clone())
        };
        items.insert(
            key,
            TarItem {
                kind,
                mode: m.mode() & 0o7777,
                mtime: m.mtime() as u64,
                uid: u64::from(m.uid()),
                data,
            },
        );
    }
    items
}

fn stdout_of(args: &[&OsStr]) -> Vec<u8> {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A repository with one tree backup of `src` (made by [`make_tree`]).
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    (dir, repo, src)
}

fn name_of(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes()[1..].to_vec()
}

#[test]
fn dump_and_tar_streams_match_the_original_files() {
    let (dir, repo, src) = setup();
    let r = repo.as_os_str();
    // One file: its bytes.
    let big = src.join("docs/sub/big.bin");
    let got = stdout_of(&["dump".as_ref(), r, "1".as_ref(), big.as_os_str()]);
    assert!(got == fs::read(&big).unwrap(), "dump of a file differs");
    let odd = src.join(OsStr::from_bytes(b"caf\xe9.txt"));
    assert_eq!(
        stdout_of(&["dump".as_ref(), r, "latest".as_ref(), odd.as_os_str()]),
        b"latin-1"
    );
    let empty = src.join("docs/empty");
    assert!(stdout_of(&["dump".as_ref(), r, "1".as_ref(), empty.as_os_str()]).is_empty());

    // A directory: a tar of it, named from the directory's own name.
    let docs = src.join("docs");
    let tar = stdout_of(&["dump".as_ref(), r, "1".as_ref(), docs.as_os_str()]);
    assert_eq!(read_tar(&tar), expected_items(&docs, b"docs"));

    // The whole tree, to stdout: every entry below the source, long names,
    // the symbolic link and the non-UTF-8 name included.
    let tar = stdout_of(&[
        "restore".as_ref(),
        r,
        "1".as_ref(),
        "-".as_ref(),
        "--tar".as_ref(),
    ]);
    let items = read_tar(&tar);
    let expected = expected_items(&src, &name_of(&src));
    for (name, item) in &expected {
        assert_eq!(
            items.get(name),
            Some(item),
            "{}",
            String::from_utf8_lossy(name)
        );
    }
    let long = src.join(LONG).join("file-with-a-long-name-too.txt");
    assert!(name_of(&long).len() > 100);
    assert!(items.contains_key(&name_of(&long)));
    let link = &items[&name_of(&src.join("link"))];
    assert_eq!(link.kind, 'l');
    assert_eq!(link.data, format!("{LONG}/../docs/a.txt").as_bytes());

    // With --include, to a new file (refused when it exists).
    let out = dir.path().join("out.tar");
    let text = ok([
        "restore".as_ref(),
        r,
        "1".as_ref(),
        out.as_os_str(),
        "--tar".as_ref(),
        "--include".as_ref(),
        "*.txt".as_ref(),
    ]);
    assert!(text.contains("3 files"), "{text}");
    let items = read_tar(&fs::read(&out).unwrap());
    let names: Vec<String> = items
        .keys()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| n.ends_with(".txt")), "{names:?}");
    let again = fail([
        "restore".as_ref(),
        r,
        "1".as_ref(),
        out.as_os_str(),
        "--tar".as_ref(),
    ]);
    assert!(again.contains("exists"), "{again}");

    // Bad input: a path not in the backup, an unknown backup, a link.
    let e = fail(["dump".as_ref(), r, "1".as_ref(), "/no/such/path".as_ref()]);
    assert!(e.contains("backup 1: no /no/such/path in it"), "{e}");
    let e = fail(["dump".as_ref(), r, "9".as_ref(), big.as_os_str()]);
    assert!(e.contains("backup 9: no such backup"), "{e}");
    let e = fail([
        "dump".as_ref(),
        r,
        "1".as_ref(),
        src.join("link").as_os_str(),
    ]);
    assert!(e.contains("symbolic link"), "{e}");
    let e = fail(["ls".as_ref(), r, "1".as_ref(), "/no/such/path".as_ref()]);
    assert!(e.contains("no /no/such/path in it"), "{e}");
    let e = fail([
        "restore".as_ref(),
        r,
        "1".as_ref(),
        "-".as_ref(),
        "--tar".as_ref(),
        "--include".as_ref(),
        "[".as_ref(),
    ]);
    assert!(e.contains("pattern"), "{e}");
    // A stream backup has no tree to tar.
    let file = dir.path().join("plain");
    fs::write(&file, b"plain bytes").unwrap();
    common::ok_with_input(["backup".as_ref(), r, "-".as_ref()], &file);
    let e = fail([
        "restore".as_ref(),
        r,
        "2".as_ref(),
        "-".as_ref(),
        "--tar".as_ref(),
    ]);
    assert!(e.contains("--tar applies to tree backups only"), "{e}");
    let e = fail(["dump".as_ref(), r, "2".as_ref(), "/x".as_ref()]);
    assert!(e.contains("not a tree backup"), "{e}");
}

/// The changes of `diff --json` as (change, path below the source) pairs.
fn changes(
    repo: &Path,
    a: &str,
    b: &str,
    src: &Path,
) -> (Vec<(String, String)>, serde_json::Value) {
    let v = json(&ok([
        "diff".as_ref(),
        repo.as_os_str(),
        a.as_ref(),
        b.as_ref(),
        "--json".as_ref(),
    ]));
    let prefix = format!("{}/", src.display());
    let list = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let path = c["path"].as_str().unwrap();
            (
                c["change"].as_str().unwrap().to_string(),
                path.strip_prefix(&prefix).unwrap_or(path).to_string(),
            )
        })
        .collect();
    (list, v["stats"].clone())
}

#[test]
fn diff_reports_added_removed_changed_and_metadata_only() {
    let (_dir, repo, src) = setup();
    // Content changed, same size and time: found by the chunks' fingerprints.
    let big = src.join("docs/sub/big.bin");
    let mut data = fs::read(&big).unwrap();
    data[350_000] ^= 1;
    write(&big, &data, 0o600, 1_600_000_000);
    // Metadata only: a mode, a time.
    fs::set_permissions(src.join("docs/a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    set_mtime(&src.join("docs/empty"), 2_000);
    // Removed: a file; added: a directory with a file; a link's target changed.
    fs::remove_file(src.join(OsStr::from_bytes(b"caf\xe9.txt"))).unwrap();
    fs::create_dir(src.join("new")).unwrap();
    write(&src.join("new/n.txt"), b"new", 0o644, 5);
    fs::remove_file(src.join("link")).unwrap();
    symlink("docs", src.join("link")).unwrap();
    // A file replaced by a directory of the same name.
    fs::remove_file(src.join(LONG).join("file-with-a-long-name-too.txt")).unwrap();
    fs::create_dir(src.join(LONG).join("file-with-a-long-name-too.txt")).unwrap();
    backup_tree(&repo, &src);

    let (list, stats) = changes(&repo, "1", "2", &src);
    let expected: Vec<(String, String)> = [
        ("changed", format!("{LONG}/file-with-a-long-name-too.txt")),
        ("removed", "caf\u{fffd}.txt".to_string()),
        ("metadata", "docs/a.txt".into()),
        ("metadata", "docs/empty".into()),
        ("changed", "docs/sub/big.bin".into()),
        ("changed", "link".into()),
        ("added", "new".into()),
        ("added", "new/n.txt".into()),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b))
    .collect();
    // Directories whose contents changed have new times: metadata changes.
    let files: Vec<(String, String)> = list
        .iter()
        .filter(|(_, p)| {
            !["docs", "docs/sub", LONG, ""].contains(&p.as_str()) && !p.starts_with('/')
        })
        .cloned()
        .collect();
    assert_eq!(files, expected, "{list:?}");
    assert_eq!(stats["added"], 2);
    assert_eq!(stats["removed"], 1);
    assert_eq!(stats["changed"], 3);
    assert_eq!(stats["bytes_added"], 3);
    assert_eq!(stats["bytes_removed"], 7);
    // The other way round, additions are removals.
    let (back, _) = changes(&repo, "2", "1", &src);
    assert!(
        back.contains(&("removed".into(), "new/n.txt".into())),
        "{back:?}"
    );
    assert!(
        back.contains(&("added".into(), "caf\u{fffd}.txt".into())),
        "{back:?}"
    );
    // The same backup: no differences.
    let (none, stats) = changes(&repo, "2", "latest", &src);
    assert!(none.is_empty(), "{none:?}");
    let every = json(&ok([
        "ls".as_ref(),
        repo.as_os_str(),
        "2".as_ref(),
        "/".as_ref(),
        "-R".as_ref(),
        "--json".as_ref(),
    ]));
    assert_eq!(stats["unchanged"], every.as_array().unwrap().len());
    // Human output: one letter per change, then the counts.
    let text = ok([
        "diff".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        "2".as_ref(),
    ]);
    assert!(
        text.contains(&format!("+    {}/new/n.txt", src.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("U    {}/docs/a.txt", src.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("M    {}/docs/sub/big.bin", src.display())),
        "{text}"
    );
    assert!(
        text.lines().last().unwrap().starts_with("2 added"),
        "{text}"
    );
    let e = fail([
        "diff".as_ref(),
        repo.as_os_str(),
        "1".as_ref(),
        "7".as_ref(),
    ]);
    assert!(e.contains("backup 7: no such backup"), "{e}");
}

#[test]
fn find_searches_every_backup_newest_first() {
    let (_dir, repo, src) = setup();
    fs::remove_file(src.join("docs/a.txt")).unwrap();
    write(&src.join("docs/b.txt"), b"b", 0o644, 9);
    backup_tree(&repo, &src);
    let found = json(&ok([
        "find".as_ref(),
        repo.as_os_str(),
        "*.txt".as_ref(),
        "--json".as_ref(),
    ]));
    let found: Vec<(u64, String)> = found
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert!(e["backup_time"].as_str().unwrap().contains('T'));
            (
                e["backup"].as_u64().unwrap(),
                e["path"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    let long_name = "file-with-a-long-name-too.txt".to_string();
    assert_eq!(
        found,
        vec![
            (2, long_name.clone()),
            (2, "caf\u{fffd}.txt".into()),
            (2, "b.txt".into()),
            (1, long_name),
            (1, "caf\u{fffd}.txt".into()),
            (1, "a.txt".into()),
        ]
    );
    // A pattern with `/` is anchored at the root.
    let pattern = format!("{}/docs/*.txt", src.display());
    let text = ok(["find".as_ref(), repo.as_os_str(), pattern.as_ref()]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].trim_start().starts_with("2 ") && lines[0].ends_with("docs/b.txt"),
        "{text}"
    );
    assert!(
        lines[1].trim_start().starts_with("1 ") && lines[1].ends_with("docs/a.txt"),
        "{text}"
    );
    let none = json(&ok([
        "find".as_ref(),
        repo.as_os_str(),
        "*.nothing".as_ref(),
        "--json".as_ref(),
    ]));
    assert_eq!(none, serde_json::json!([]));
    let e = fail(["find".as_ref(), repo.as_os_str(), "a[".as_ref()]);
    assert!(e.contains("pattern"), "{e}");
}

fn list_json(repo: &Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec![
        "list".to_string(),
        repo.display().to_string(),
        "--json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = cmd(&args).env("TZ", "EST5").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&String::from_utf8(out.stdout).unwrap())
        .as_array()
        .unwrap()
        .clone()
}

fn ids(list: &[serde_json::Value]) -> Vec<u64> {
    list.iter().map(|v| v["id"].as_u64().unwrap()).collect()
}

#[test]
fn list_shows_hosts_tags_and_counts_and_filters_them() {
    let (dir, repo, src) = setup();
    let r = repo.as_os_str();
    let other = dir.path().join("other");
    fs::create_dir(&other).unwrap();
    write(&other.join("x"), b"xyz", 0o644, 7);
    ok([
        "backup".as_ref(),
        r,
        other.as_os_str(),
        "--host".as_ref(),
        "h2".as_ref(),
        "--tag".as_ref(),
        "weekly".as_ref(),
        "--tag".as_ref(),
        "home".as_ref(),
    ]);
    // A stream (standard input): no files, no paths.
    let file = dir.path().join("plain");
    fs::write(&file, b"plain").unwrap();
    common::ok_with_input(
        [
            "backup".as_ref(),
            r,
            "-".as_ref(),
            "--host".as_ref(),
            "h2".as_ref(),
            "--tag".as_ref(),
            "db".as_ref(),
        ],
        &file,
    );

    let all = list_json(&repo, &[]);
    assert_eq!(ids(&all), [1, 2, 3]);
    let b2 = &all[1];
    assert_eq!(b2["host"], "h2");
    assert_eq!(b2["tags"], serde_json::json!(["home", "weekly"]));
    assert_eq!(b2["files"], 1);
    assert_eq!(b2["file_bytes"], 3);
    assert_eq!(
        b2["paths"],
        serde_json::json!([other.display().to_string()])
    );
    assert_eq!(b2["source"], format!("h2:{}", other.display()));
    assert_eq!(all[0]["files"], 5);
    assert!(all[2].get("files").is_none());
    // Local time, ISO 8601 with the offset of TZ (EST5: UTC-5).
    let local = b2["local_time"].as_str().unwrap();
    assert!(local.ends_with("-05:00"), "{local}");
    let utc = b2["time"].as_u64().unwrap() - 5 * 3600;
    let (days, secs) = (utc / 86400, utc % 86400);
    let hms = format!(
        "T{:02}:{:02}:{:02}-",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    );
    assert!(local.contains(&hms), "{local} vs {days} days {hms}");

    assert_eq!(ids(&list_json(&repo, &["--host", "h2"])), [2, 3]);
    assert_eq!(ids(&list_json(&repo, &["--tag", "home,weekly"])), [2]);
    assert_eq!(
        ids(&list_json(&repo, &["--tag", "home,db"])),
        Vec::<u64>::new()
    );
    assert_eq!(
        ids(&list_json(&repo, &["--tag", "db", "--tag", "weekly"])),
        [2, 3]
    );
    let src_path = format!("{}/", src.display());
    assert_eq!(ids(&list_json(&repo, &["--path", &src_path])), [1]);
    assert_eq!(
        ids(&list_json(&repo, &["--host", "h2", "--tag", "db"])),
        [3]
    );
    let source = format!("h2:{}", other.display());
    assert_eq!(ids(&list_json(&repo, &["--source", &source])), [2]);
    let text = ok(["list".as_ref(), r, "--tag".as_ref(), "db".as_ref()]);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.lines().nth(1).unwrap().contains("db"), "{text}");

    // `tag`: add, remove, set; the rest of the snapshot is untouched.
    let before = fs::read_dir(repo.join("snapshots")).unwrap().count();
    let t = json(&ok([
        "tag".as_ref(),
        r,
        "1".as_ref(),
        "2".as_ref(),
        "--add".as_ref(),
        "keep".as_ref(),
        "--remove".as_ref(),
        "weekly".as_ref(),
        "--json".as_ref(),
    ]));
    assert_eq!(t[0]["tags"], serde_json::json!(["keep"]));
    assert_eq!(t[1]["tags"], serde_json::json!(["home", "keep"]));
    assert_eq!(t[1]["changed"], true);
    let all_after = list_json(&repo, &[]);
    assert_eq!(all_after[1]["tags"], serde_json::json!(["home", "keep"]));
    for field in [
        "time",
        "host",
        "source",
        "logical_bytes",
        "stored_bytes",
        "files",
    ] {
        assert_eq!(all_after[1][field], all[1][field], "{field}");
    }
    let text = ok([
        "tag".as_ref(),
        r,
        "latest".as_ref(),
        "--set".as_ref(),
        "x".as_ref(),
        "--set".as_ref(),
        "y".as_ref(),
    ]);
    assert!(text.contains("backup 3: tags x,y (were db)"), "{text}");
    assert_eq!(
        fs::read_dir(repo.join("snapshots")).unwrap().count(),
        before
    );
    // The repository still checks, and the tree restores.
    ok(["check".as_ref(), r]);
    ok([
        "dump".as_ref(),
        r,
        "2".as_ref(),
        other.join("x").as_os_str(),
    ]);

    // Bad input changes nothing: an unknown backup among known ones, a bad tag.
    let e = fail([
        "tag".as_ref(),
        r,
        "1".as_ref(),
        "9".as_ref(),
        "--add".as_ref(),
        "z".as_ref(),
    ]);
    assert!(e.contains("backup 9: no such backup"), "{e}");
    let e = fail([
        "tag".as_ref(),
        r,
        "1".as_ref(),
        "--add".as_ref(),
        "a,b".as_ref(),
    ]);
    assert!(e.contains("tag \"a,b\" contains `,`"), "{e}");
    let e = fail(["tag".as_ref(), r, "1".as_ref()]);
    assert!(e.contains("no change of tags"), "{e}");
    let e = fail([
        "backup".as_ref(),
        r,
        other.as_os_str(),
        "--tag".as_ref(),
        " x".as_ref(),
    ]);
    assert!(e.contains("white space"), "{e}");
    assert_eq!(
        list_json(&repo, &[])[0]["tags"],
        serde_json::json!(["keep"])
    );
    assert_eq!(ids(&list_json(&repo, &[])), [1, 2, 3]);
}
