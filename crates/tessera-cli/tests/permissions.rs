//! Private repository files: whatever the umask, every file Tessera
//! creates in a local repository is `0600` and every directory `0700`
//! (key files above all: readable, they can be attacked offline), and
//! `check` warns about key files other users can read.

mod common;
use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Runs `tessera args` under umask 022 (files 0644 and directories 0755
/// unless the program chooses otherwise).
fn run_umask_022(args: &[&str]) -> Output {
    let mut argv = vec!["-c", "umask 022 && exec \"$0\" \"$@\"", bin()];
    argv.extend_from_slice(args);
    cmd_of(Path::new("sh"), argv)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running tessera under sh")
}

fn ok_umask_022(args: &[&str]) -> Output {
    let out = run_umask_022(args);
    assert!(out.status.success(), "{args:?}: {out:?}");
    out
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every file and directory below `root` (not `root` itself).
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

/// Asserts every file below `root` is 0600 and every directory 0700,
/// except the paths in `old` (there before).
fn assert_private(root: &Path, old: &[PathBuf]) {
    let mut seen = 0;
    for path in walk(root).iter().filter(|p| !old.contains(p)) {
        let want = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(path), want, "{}", path.display());
        seen += 1;
    }
    assert!(seen >= 3, "nothing new below {}", root.display());
}

fn input_tree(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    write_random_file(&src.join("a"), 1, 200_000);
    write_random_file(&src.join("sub/b"), 2, 50_000);
    src
}

#[test]
fn a_new_repository_is_private_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let src = input_tree(dir.path());
    for encryption in ["aes256gcm", "none"] {
        let repo = dir.path().join(format!("new/{encryption}"));
        let r = repo.to_str().unwrap();
        ok_umask_022(&["init", r, "--encryption", encryption]);
        ok_umask_022(&["backup", r, src.to_str().unwrap()]);
        ok_umask_022(&["backup", r, src.join("a").to_str().unwrap()]);
        // The repository directory and its new parent too.
        assert_eq!(mode(&repo), 0o700, "{encryption}");
        assert_eq!(mode(&dir.path().join("new")), 0o700);
        assert_private(&repo, &[]);
        if encryption != "none" {
            assert!(!walk(&repo.join("keys")).is_empty());
        }
        let out = ok_umask_022(&["check", r]);
        assert!(out.stderr.is_empty(), "{out:?}");
    }
}

#[test]
fn new_objects_in_a_world_readable_repository_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let src = input_tree(dir.path());
    // An empty directory made by the user (0755) keeps its mode; what init
    // puts in it is private.
    let repo = dir.path().join("repo");
    fs::create_dir(&repo).unwrap();
    fs::set_permissions(&repo, fs::Permissions::from_mode(0o755)).unwrap();
    let r = repo.to_str().unwrap();
    ok_umask_022(&["init", r]);
    assert_eq!(mode(&repo), 0o755);
    assert_private(&repo, &[]);
    // A repository made world-readable (an older version, a copy): new
    // objects are private all the same.
    let old = walk(&repo);
    for path in &old {
        let m = if path.is_dir() { 0o755 } else { 0o644 };
        fs::set_permissions(path, fs::Permissions::from_mode(m)).unwrap();
    }
    ok_umask_022(&["backup", r, src.to_str().unwrap()]);
    let password = dir.path().join("new-password");
    fs::write(&password, "another password\n").unwrap();
    ok_umask_022(&[
        "key",
        "add",
        r,
        "--new-password-file",
        password.to_str().unwrap(),
    ]);
    assert_eq!(walk(&repo.join("keys")).len(), 2);
    assert_private(&repo, &old);
}

#[test]
fn check_warns_about_key_files_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let r = repo.to_str().unwrap();
    init(&repo);
    let keys = walk(&repo.join("keys"));
    assert_eq!(keys.len(), 1);
    fs::set_permissions(&keys[0], fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(["check", r]);
    assert!(out.status.success(), "a warning is no failure: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let name = keys[0].file_name().unwrap().to_str().unwrap();
    assert!(
        stderr.starts_with("tessera: warning: keys/")
            && stderr.contains(name)
            && stderr.contains("other users")
            && stderr.contains("chmod 600"),
        "{stderr}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&run(["check", r, "--json"]).stdout).unwrap();
    assert_eq!(json["warnings"].as_array().map(Vec::len), Some(1), "{json}");
    // Group-readable is readable by others too; private is quiet.
    fs::set_permissions(&keys[0], fs::Permissions::from_mode(0o640)).unwrap();
    assert!(!run(["check", r]).stderr.is_empty());
    fs::set_permissions(&keys[0], fs::Permissions::from_mode(0o600)).unwrap();
    let out = run(["check", r]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
}
