//! `tessera login` / `logout` (docs/SECURITY.md "Sessions"): after a login
//! commands open the encrypted repository without a password; the entry
//! is private (0600 in a 0700 directory) and outside the repository; a
//! changed password, a damaged entry or a logout ends the session.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `tessera ARGS` with the session directory `sessions` and no password.
fn without_password(sessions: &Path, args: &[&std::ffi::OsStr]) -> Output {
    cmd(args)
        .env("TESSERA_SESSION_DIR", sessions)
        .env_remove("TESSERA_PASSWORD")
        .env_remove("TESSERA_PASSWORD_FILE")
        .env_remove("TESSERA_PASSWORD_COMMAND")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn with_sessions(sessions: &Path, args: &[&std::ffi::OsStr]) -> Command {
    let mut c = cmd(args);
    c.env("TESSERA_SESSION_DIR", sessions).stdin(Stdio::null());
    c
}

fn entries(sessions: &Path) -> Vec<std::path::PathBuf> {
    match std::fs::read_dir(sessions) {
        Ok(d) => d.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_login_opens_without_password_until_logout() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, src) = (dir.path().join("repo"), dir.path().join("src"));
    let sessions = dir.path().join("sessions");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a.txt"), b"hello sessions\n").unwrap();
    init(&repo);
    backup_tree(&repo, &src);
    let list = ["list".as_ref(), repo.as_os_str()];

    // Without a session, no password: refused.
    let o = without_password(&sessions, &list);
    assert_no_panic(&o);
    assert!(!o.status.success(), "opened without a password");

    let o = with_sessions(
        &sessions,
        &["login".as_ref(), repo.as_os_str(), "--json".as_ref()],
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let path = std::path::PathBuf::from(v["session"].as_str().unwrap());
    assert!(path.starts_with(&sessions), "{}", path.display());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&sessions), 0o700);
    assert!(v["expires"].as_u64().unwrap() > 0);
    // Nothing of the session is in the repository.
    let needle = path.file_name().unwrap().to_str().unwrap().to_string();
    let found = ok(["ls".as_ref(), repo.as_os_str(), "latest".as_ref()]);
    assert!(!found.contains(&needle));

    // Now commands open without a password, and restore identically.
    let o = without_password(&sessions, &list);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.path().join("out");
    let o = without_password(
        &sessions,
        &[
            "restore".as_ref(),
            repo.as_os_str(),
            "latest".as_ref(),
            out.as_os_str(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let restored = out.join(src.strip_prefix("/").unwrap()).join("a.txt");
    assert_eq!(std::fs::read(restored).unwrap(), b"hello sessions\n");

    // A damaged entry is ignored: the password is needed again.
    let good = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    assert!(!without_password(&sessions, &list).status.success());
    std::fs::write(&path, &good).unwrap();
    assert!(without_password(&sessions, &list).status.success());
    // So is an entry others can read.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(!without_password(&sessions, &list).status.success());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Logout ends it.
    let o = without_password(
        &sessions,
        &["logout".as_ref(), repo.as_os_str(), "--json".as_ref()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["removed"], 1);
    assert!(entries(&sessions).is_empty());
    assert!(!without_password(&sessions, &list).status.success());
}

#[test]
fn a_changed_password_ends_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let sessions = dir.path().join("sessions");
    init(&repo);
    let o = with_sessions(&sessions, &["login".as_ref(), repo.as_os_str()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let list = ["list".as_ref(), repo.as_os_str()];
    assert!(without_password(&sessions, &list).status.success());
    let o = with_sessions(
        &sessions,
        &["key".as_ref(), "passwd".as_ref(), repo.as_os_str()],
    )
    .env("TESSERA_NEW_PASSWORD", "another password entirely")
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The old key file is gone: its session opens nothing.
    let o = without_password(&sessions, &list);
    assert_no_panic(&o);
    assert!(!o.status.success(), "the old session still opens");
    // A login without a session directory is refused with a reason.
    let o = cmd(["login".as_ref(), repo.as_os_str()])
        .env("TESSERA_PASSWORD", "another password entirely")
        .env_remove("TESSERA_SESSION_DIR")
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("XDG_RUNTIME_DIR"));
}
