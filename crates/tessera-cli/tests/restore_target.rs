//! Restore never replaces what is at its output path: devices and FIFOs are
//! written in place, symbolic links followed, an existing file replaced
//! only with `--overwrite`, and a directory refused.

mod common;

use common::*;
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A repository with one backup (id 1) of 300 000 bytes; returns the repository and the data.
fn repo_with_backup(dir: &Path) -> (PathBuf, Vec<u8>) {
    let repo = dir.join("repo");
    init(&repo);
    let data = random_bytes(11, 300_000);
    let input = dir.join("input");
    fs::write(&input, &data).unwrap();
    assert_eq!(num(&backup_json(&repo, &input), "id"), 1);
    (repo, data)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `tessera restore REPO 1 OUT` plus `extra`; returns the run's output.
fn restore(repo: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["restore".to_string(), s(repo), "1".into(), s(out)];
    args.extend(extra.iter().map(|a| a.to_string()));
    run(&args)
}

fn assert_restored(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "restore failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_panic(out);
}

#[test]
fn restore_to_a_fifo_streams_into_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, data) = repo_with_backup(tmp.path());
    let fifo = tmp.path().join("fifo");
    assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) }, 0);
    // Held open (read-write never blocks) so that the reader's open returns
    // at once and its read ends only when this is closed too, after the
    // restore: the test cannot hang on a restore that never opens the FIFO.
    let keep = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            fs::File::open(&fifo)
                .unwrap()
                .read_to_end(&mut got)
                .unwrap();
            got
        })
    };
    let out = restore(&repo, &fifo, &[]);
    drop(keep);
    let got = reader.join().unwrap();
    assert_restored(&out);
    assert!(got == data, "the FIFO got {} bytes", got.len());
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(
        dir_names(tmp.path()).len(),
        3,
        "{:?}",
        dir_names(tmp.path())
    );
}

#[test]
fn restore_to_a_character_device_writes_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, _) = repo_with_backup(tmp.path());
    let null = tmp.path().join("null");
    let mode = libc::S_IFCHR | 0o666;
    if unsafe { libc::mknod(c_path(&null).as_ptr(), mode, libc::makedev(1, 3)) } != 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "mknod: {e}");
        eprintln!("note: skipping the device test: mknod is not permitted here ({e})");
        return;
    }
    if let Err(e) = fs::write(&null, b"x") {
        eprintln!("note: skipping the device test: the device node cannot be opened ({e})");
        return;
    }
    let out = restore(&repo, &null, &[]);
    assert_restored(&out);
    let meta = fs::symlink_metadata(&null).unwrap();
    assert!(meta.file_type().is_char_device(), "{meta:?}");
    assert_eq!(meta.rdev(), libc::makedev(1, 3));
}

#[test]
fn restore_through_a_symlink_keeps_the_link() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, data) = repo_with_backup(tmp.path());
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink("target", &link).unwrap();
    assert_restored(&restore(&repo, &link, &[]));
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("target"));
    assert_file_eq(&tmp.path().join("target"), &data);

    // Now the link points to an existing file: the rules of a file apply.
    let line = fail(["restore".to_string(), s(&repo), "1".into(), s(&link)]);
    assert!(line.contains("--overwrite"), "{line}");
    fs::write(tmp.path().join("target"), b"old").unwrap();
    assert_restored(&restore(&repo, &link, &["--overwrite"]));
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_file_eq(&tmp.path().join("target"), &data);
}

#[test]
fn restore_onto_an_existing_file_needs_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, data) = repo_with_backup(tmp.path());
    let out = tmp.path().join("out");
    fs::write(&out, b"precious").unwrap();
    let names = dir_names(tmp.path());
    let line = fail(["restore".to_string(), s(&repo), "1".into(), s(&out)]);
    assert!(
        line.contains(&format!("{}: exists: pass --overwrite", s(&out))),
        "{line}"
    );
    assert_eq!(fs::read(&out).unwrap(), b"precious");
    assert_eq!(dir_names(tmp.path()), names, "no temporary file left");

    // A failed restore with --overwrite leaves the old file as it was.
    let container = containers(&repo).into_iter().next().unwrap();
    let cpath = repo.join("containers").join(&container);
    let good = fs::read(&cpath).unwrap();
    let mut bad = good.clone();
    *bad.last_mut().unwrap() ^= 1;
    fs::write(&cpath, &bad).unwrap();
    let line = fail([
        "restore".to_string(),
        s(&repo),
        "1".into(),
        s(&out),
        "--overwrite".into(),
    ]);
    assert!(
        line.contains("corrupt") || line.contains("authentication failed"),
        "{line}"
    );
    assert_eq!(fs::read(&out).unwrap(), b"precious");
    assert_eq!(dir_names(tmp.path()), names, "no temporary file left");

    fs::write(&cpath, &good).unwrap();
    assert_restored(&restore(&repo, &out, &["--overwrite"]));
    assert_file_eq(&out, &data);
    assert_eq!(dir_names(tmp.path()), names);
}

#[test]
fn restore_onto_a_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, _) = repo_with_backup(tmp.path());
    let dir = tmp.path().join("dir");
    fs::create_dir(&dir).unwrap();
    let absent = tmp.path().join("absent-dir/");
    for (out, overwrite) in [(&dir, false), (&dir, true), (&absent, false)] {
        let mut args = vec!["restore".to_string(), s(&repo), "1".into(), s(out)];
        if overwrite {
            args.push("--overwrite".into());
        }
        let line = fail(&args);
        assert!(
            line.contains("directory-tree restores are not supported"),
            "{line}"
        );
        assert!(
            !line.contains("Is a directory") && !line.contains("Not a directory"),
            "{line}"
        );
    }
    assert!(dir_names(&dir).is_empty());
    assert!(!tmp.path().join("absent-dir").exists());
}
