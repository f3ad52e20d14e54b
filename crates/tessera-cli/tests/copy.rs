//! `tessera copy` end to end: stream and tree backups copied from an
//! unencrypted container-layout repository into an encrypted lifecycle
//! repository and back into a third one of other chunking; every copy
//! restores identically, keeps its source, label and time, and a re-run
//! copies nothing.

mod common;

use common::{
    backup_tree, cmd, init_layout, init_plain, json, ok, ok_with_input, random_bytes, sorted_names,
    write_random_file, TEST_PASSWORD,
};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Stdio;

/// A tree of files of 0 bytes to a few hundred KiB in nested directories,
/// with a symbolic link.
fn make_tree(root: &Path, seed: u64) {
    for (i, rel) in ["a/one", "a/b/two", "a/b/c/three", "four", "a/empty"]
        .iter()
        .enumerate()
    {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let len = if rel.ends_with("empty") {
            0
        } else {
            (seed * 7 + i as u64 * 91_123) % 400_000
        };
        write_random_file(&p, seed + i as u64, len);
    }
    fs::create_dir_all(root.join("d/empty-dir")).unwrap();
    let _ = symlink("../a/one", root.join("d/link"));
}

/// Asserts the trees hold the same names, kinds, contents and link targets.
fn assert_same(a: &Path, b: &Path) {
    let ma = fs::symlink_metadata(a).unwrap();
    let mb = fs::symlink_metadata(b).unwrap_or_else(|e| panic!("{}: {e}", b.display()));
    assert_eq!(ma.file_type(), mb.file_type(), "{}", b.display());
    if ma.is_dir() {
        assert_eq!(sorted_names(a), sorted_names(b), "{}", b.display());
        for n in sorted_names(a) {
            assert_same(&a.join(&n), &b.join(&n));
        }
    } else if ma.is_symlink() {
        assert_eq!(fs::read_link(a).unwrap(), fs::read_link(b).unwrap());
    } else {
        assert!(
            fs::read(a).unwrap() == fs::read(b).unwrap(),
            "{}",
            b.display()
        );
    }
}

/// `tessera copy --json SRC DST`, the destination's password in `TESSERA_TO_PASSWORD`.
fn copy(src: &Path, dst: &Path) -> serde_json::Value {
    let out = cmd([
        "copy".as_ref(),
        "--json".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])
    .env("TESSERA_TO_PASSWORD", TEST_PASSWORD)
    .stdin(Stdio::null())
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "copy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&String::from_utf8_lossy(&out.stdout))
}

fn list(repo: &Path) -> Vec<serde_json::Value> {
    json(&ok(["list".as_ref(), "--json".as_ref(), repo.as_os_str()]))
        .as_array()
        .unwrap()
        .clone()
}

/// Restores backup `id` of `repo` into `out` (a directory for a tree, a file for a stream).
fn restore(repo: &Path, id: u64, out: &Path) {
    ok([
        "restore".as_ref(),
        repo.as_os_str(),
        id.to_string().as_ref(),
        out.as_os_str(),
    ]);
}

/// Every backup of `from` has a copy in `to` of the same source, time and
/// label, restoring to the same tree or bytes.
fn assert_copies_restore_identically(from: &Path, to: &Path, work: &Path) {
    let originals = list(from);
    let copies = list(to);
    assert_eq!(originals.len(), copies.len());
    // Copies are made in id order into repositories that held nothing.
    for (o, c) in originals.iter().zip(&copies) {
        assert_eq!(c["source"], o["source"]);
        assert_eq!(c["time"], o["time"]);
        assert_eq!(c["label"], o["label"]);
        assert_eq!(c["logical_bytes"], o["logical_bytes"]);
        let (oid, cid) = (o["id"].as_u64().unwrap(), c["id"].as_u64().unwrap());
        let a = work.join(format!("orig-{oid}"));
        let b = work.join(format!("copy-{cid}"));
        restore(from, oid, &a);
        restore(to, cid, &b);
        assert_same(&a, &b);
        fs::remove_dir_all(&a)
            .or_else(|_| fs::remove_file(&a))
            .unwrap();
        fs::remove_dir_all(&b)
            .or_else(|_| fs::remove_file(&b))
            .unwrap();
    }
}

#[test]
fn copy_round_trip_between_layouts_and_keys_restores_identically() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, lifecycle, back) = (
        dir.path().join("plain"),
        dir.path().join("lifecycle"),
        dir.path().join("back"),
    );
    init_plain(&plain);
    init_layout(&lifecycle, "lifecycle");
    ok([
        "init".as_ref(),
        back.as_os_str(),
        "--encryption".as_ref(),
        "none".as_ref(),
        "--chunker".as_ref(),
        "rabin".as_ref(),
        "--avg-size".as_ref(),
        "16KiB".as_ref(),
    ]);
    // Two versions of a tree (the second reuses unchanged files) and a stream.
    let src = dir.path().join("src");
    make_tree(&src, 1);
    backup_tree(&plain, &src);
    let stream = dir.path().join("stream.bin");
    fs::write(&stream, random_bytes(9, 700_000)).unwrap();
    ok_with_input(
        [
            "backup".as_ref(),
            plain.as_os_str(),
            "-".as_ref(),
            "--label".as_ref(),
            "a stream".as_ref(),
        ],
        &stream,
    );
    write_random_file(&src.join("a/b/two"), 77, 123_456);
    fs::write(src.join("new"), b"new file").unwrap();
    backup_tree(&plain, &src);

    let first = copy(&plain, &lifecycle);
    let records = first.as_array().unwrap();
    assert_eq!(records.len(), 3, "{first}");
    assert!(records.iter().all(|r| r["skipped"] == false), "{first}");
    // The second tree version shares most bytes with the first: the
    // lifecycle layout deduplicates it against the previous version.
    let v2 = &records[2];
    assert!(
        v2["stored_bytes"].as_u64().unwrap() < v2["logical_bytes"].as_u64().unwrap() / 2,
        "{v2}"
    );
    assert_copies_restore_identically(&plain, &lifecycle, dir.path());

    // A re-run copies nothing.
    let again = copy(&plain, &lifecycle);
    assert!(
        again
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["skipped"] == true),
        "{again}"
    );
    assert_eq!(list(&lifecycle).len(), 3);

    // And back, into a repository of other chunking.
    copy(&lifecycle, &back);
    assert_copies_restore_identically(&lifecycle, &back, dir.path());
    assert_copies_restore_identically(&plain, &back, dir.path());
    ok(["check".as_ref(), back.as_os_str(), "--read-data".as_ref()]);
    ok([
        "check".as_ref(),
        lifecycle.as_os_str(),
        "--read-data".as_ref(),
    ]);

    // One backup by id; copying a repository into itself is refused.
    let one = dir.path().join("one");
    init_plain(&one);
    let r = copy_ids(&plain, &one, &["2"]);
    assert_eq!(r.as_array().unwrap().len(), 1);
    assert_eq!(list(&one)[0]["label"], "a stream");
    let out = cmd(["copy".as_ref(), plain.as_os_str(), plain.as_os_str()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("same repository"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn copy_ids(src: &Path, dst: &Path, ids: &[&str]) -> serde_json::Value {
    let mut args = vec!["copy".into(), "--json".into(), src.into(), dst.into()];
    args.extend(ids.iter().map(std::ffi::OsString::from));
    json(&ok(args))
}
