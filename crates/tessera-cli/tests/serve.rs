//! `tessera serve` as a process: it prints its URL first, answers with the
//! token, and on SIGTERM or Ctrl-C (SIGINT) stops cleanly — exit status 0,
//! a line saying so, the repository's lock released.

mod common;

use common::{backup_tree, cmd, init, ok};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A GET of `path_and_query` on `host:port`; the answer's status line.
fn status_of(addr: &str, path_and_query: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer.lines().next().unwrap_or_default().to_string()
}

#[test]
fn serve_prints_its_url_and_stops_cleanly_on_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.txt"), b"served\n").unwrap();
    init(&repo);
    backup_tree(&repo, &src);
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let (mut child, first) =
            spawn_serve(cmd(["serve".as_ref(), repo.as_os_str()]).stderr(Stdio::piped()));
        let url = first.trim();
        let rest = url.strip_prefix("http://").expect(url);
        let (addr, query) = rest.split_once('/').unwrap();
        assert!(query.starts_with("?token="), "{url}");
        assert!(status_of(addr, "/api/backups").contains("401"));
        let with_token = format!("/api/backups{query}");
        assert!(status_of(addr, &with_token).contains("200"));
        // While it serves, maintenance waits for its read lock.
        let busy = cmd([
            "delete".as_ref(),
            repo.as_os_str(),
            "1".as_ref(),
            "--wait=0s".as_ref(),
        ])
        .output()
        .unwrap();
        assert!(!busy.status.success());
        let pid = i32::try_from(child.id()).unwrap();
        // SAFETY: kill(2) of the child this test started.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let started = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "serve did not stop"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "signal {signal}: {status:?} {err}");
        assert!(err.contains("repository released"), "{err}");
    }
    // The lock is gone with the server.
    ok(["delete".as_ref(), repo.as_os_str(), "1".as_ref()]);
}

/// A GET of `path_and_query` on `host:port`: the status line and the body.
fn get(addr: &str, path_and_query: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// Spawns `command` (a `tessera serve`) with standard input closed and
/// standard output piped: the child and the first line it prints (its URL).
fn spawn_serve(command: &mut std::process::Command) -> (std::process::Child, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    (child, first)
}

/// `tessera serve ARGS` started; the child, its address and `?token=…`.
fn start_serve(
    args: &[&std::ffi::OsStr],
    cache: &std::path::Path,
) -> (std::process::Child, String, String) {
    let mut all = vec!["serve".as_ref()];
    all.extend_from_slice(args);
    let (child, first) = spawn_serve(cmd(all).env("XDG_CACHE_HOME", cache).stderr(Stdio::null()));
    let rest = first.trim().strip_prefix("http://").unwrap().to_string();
    let (addr, query) = rest.split_once('/').unwrap();
    (child, addr.to_string(), query.to_string())
}

#[test]
fn the_last_check_is_kept_private_and_shown_by_serve() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (repo, cache) = (dir.path().join("repo"), dir.path().join("cache"));
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.txt"), b"checked\n").unwrap();
    init(&repo);
    backup_tree(&repo, &src);
    let before = dir_listing(&repo);
    // --no-cache: nothing kept.
    let out = cmd(["check".as_ref(), repo.as_os_str(), "--no-cache".as_ref()])
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!cache.exists());
    let out = cmd(["check".as_ref(), repo.as_os_str()])
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // Kept beside the metadata caches, the owner's alone; the repository
    // (a read-only command's) unchanged.
    let kept: Vec<_> = std::fs::read_dir(cache.join("tessera"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].to_string_lossy().ends_with(".last-check"));
    let mode = std::fs::metadata(&kept[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(dir_listing(&repo), before);
    let (mut child, addr, query) = start_serve(&[repo.as_os_str()], &cache);
    let (status, body) = get(&addr, &format!("/api/health{query}"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(status.contains("200"), "{status}");
    assert!(body.contains(r#""by":"check""#), "{body}");
    assert!(body.contains(r#""ok":true"#), "{body}");
}

/// The files below `dir` (relative) with their sizes.
fn dir_listing(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().unwrap() != "lock" && !p.to_string_lossy().contains("/locks/") {
                let len = std::fs::metadata(&p).unwrap().len();
                out.push((p.strip_prefix(dir).unwrap().display().to_string(), len));
            }
        }
    }
    out.sort();
    out
}

#[cfg(feature = "lab")]
#[test]
fn a_lab_repository_serves_its_experiment_reports() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(
        &config,
        "name = \"tiny\"\n[dataset.generate]\nversions = 2\nsize = \"200KB\"\n[[systems]]\nname = \"exact\"\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    ok([
        "experiment".as_ref(),
        config.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    let repos: Vec<_> = std::fs::read_dir(out.join("repos"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let cache = dir.path().join("cache");
    let (mut child, addr, query) = start_serve(&[repos[0].as_os_str()], &cache);
    let (status, list) = get(&addr, &format!("/api/reports{query}"));
    let (html_status, html) = get(&addr, &format!("/api/reports/report.html{query}"));
    let (outside, _) = get(&addr, &format!("/api/reports/..%2Fexperiment.toml{query}"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(status.contains("200"), "{status} {list}");
    for name in ["report.html", "results.csv", "results.json"] {
        assert!(list.contains(&format!(r#""name":"{name}""#)), "{list}");
    }
    assert!(html_status.contains("200"), "{html_status}");
    assert!(html.contains("<svg"), "the report's plots");
    assert!(outside.contains("404"), "{outside}");
}
