//! What a user coming from restic or `ls` expects: `ls -l` shows the
//! special mode bits and device numbers as `ls -l` does, and usage errors
//! made from restic habits (`restore --target`, `snapshots`, `ls REPO`
//! without an id) point at what Tessera wants.

mod common;
use common::*;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// `ls -l` of `path` in the latest backup of `repo`: the line of each entry by its name.
fn ls_long(repo: &Path, path: &Path) -> Vec<String> {
    ok([
        "ls".as_ref(),
        "-l".as_ref(),
        repo.as_os_str(),
        "latest".as_ref(),
        path.as_os_str(),
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

fn line_of<'a>(lines: &'a [String], name: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.ends_with(&format!("/{name}")))
        .unwrap_or_else(|| panic!("no {name} in {lines:?}"))
}

#[test]
fn ls_long_shows_special_bits_and_device_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    for (name, mode) in [("setuid", 0o4755), ("setgid", 0o2750), ("odd", 0o4644)] {
        fs::write(src.join(name), name).unwrap();
        set_mode(&src.join(name), mode);
    }
    fs::create_dir(src.join("tmp")).unwrap();
    set_mode(&src.join("tmp"), 0o1777);
    let null = src.join("null");
    let c = std::ffi::CString::new(null.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; fails unless root.
    let device =
        unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0;
    if device {
        set_mode(&null, 0o666);
    }
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let lines = ls_long(&repo, &src);
    assert!(
        line_of(&lines, "setuid").starts_with("-rwsr-xr-x "),
        "{lines:?}"
    );
    assert!(
        line_of(&lines, "setgid").starts_with("-rwxr-s--- "),
        "{lines:?}"
    );
    assert!(
        line_of(&lines, "odd").starts_with("-rwSr--r-- "),
        "{lines:?}"
    );
    assert!(
        line_of(&lines, "tmp").starts_with("drwxrwxrwt "),
        "{lines:?}"
    );
    if device {
        let null = line_of(&lines, "null");
        assert!(null.starts_with("crw-rw-rw- "), "{null}");
        assert!(null.contains(" 1, 3 "), "the device's major, minor: {null}");
    } else {
        eprintln!("note: no device test: mknod is not permitted here");
    }
}

#[test]
fn restic_habits_get_a_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    let r = repo.to_str().unwrap();
    let target = dir.path().join("out");
    let t = target.to_str().unwrap();
    for args in [
        vec!["restore", r, "latest", "--target", t],
        vec!["restore", r, "latest", &format!("--target={t}")],
    ] {
        let line = fail(&args);
        assert!(!line.contains("--tar'"), "{args:?}: suggests --tar: {line}");
        assert!(
            line.contains("third argument") && line.contains("tessera restore REPO ID DIR"),
            "{args:?}: {line}"
        );
    }
    let line = fail(["snapshots", r]);
    assert!(line.contains("tessera list REPO"), "{line}");
    for args in [vec!["ls", r], vec!["restore", r], vec!["dump", r]] {
        let line = fail(&args);
        assert!(
            line.contains("tessera list REPO") && line.contains("`latest`"),
            "{args:?}: {line}"
        );
    }
    // Other usage errors keep clap's own tips.
    let line = fail(["lsit", r]);
    assert!(
        line.contains("'list'") && !line.contains("restic"),
        "{line}"
    );
}
