//! `tessera serve` as a process: it prints its URL first, answers with the
//! token, and on SIGTERM or Ctrl-C (SIGINT) stops cleanly — exit status 0,
//! a line saying so, the repository's lock released.

mod common;

use common::{cmd, init, ok};
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
    ok(["backup".as_ref(), repo.as_os_str(), src.as_os_str()]);
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut child = cmd(["serve".as_ref(), repo.as_os_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
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
