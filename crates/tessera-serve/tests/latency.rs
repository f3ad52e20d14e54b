//! Request latency of `tree` on a huge directory and of `backups` on many
//! backups (ignored: a measurement, run by scripts/serve-benchmark.sh).
//! Sizes: TESSERA_BENCH_ENTRIES (default 100,000), TESSERA_BENCH_BACKUPS
//! (default 10,000, the sizes). The backups are made in-process
//! with the engine's entry point (a stream of a few bytes each, one
//! content per source), not by running the CLI. Prints figures (and the setup's progress on standard
//! error); asserts only that answers are right.

use std::io::Cursor;
use std::time::{Duration, Instant};
use tessera::backup::TreeBackupOptions;
use tessera::backup::{backup, BackupOptions, Input};
use tessera::repo::config::Config;
use tessera::Repository;
use tessera_serve::{Options, Server};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Median and slowest of `n` GETs of `url`, and the last body.
async fn time(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    n: usize,
) -> (Duration, Duration, serde_json::Value) {
    let mut times = Vec::with_capacity(n);
    let mut body = serde_json::Value::Null;
    for _ in 0..n {
        let started = Instant::now();
        let r = http.get(url).bearer_auth(token).send().await.unwrap();
        assert!(r.status().is_success(), "{url}: {}", r.status());
        body = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    (times[n / 2], times[n - 1], body)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: scripts/serve-benchmark.sh"]
async fn latency_of_tree_and_backups() {
    let (entries, backups) = (
        env("TESSERA_BENCH_ENTRIES", 100_000),
        env("TESSERA_BENCH_BACKUPS", 10_000),
    );
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let big = src.join("big");
    std::fs::create_dir_all(&big).unwrap();
    let started = Instant::now();
    for i in 0..entries {
        std::fs::write(big.join(format!("f{i:06}")), i.to_string()).unwrap();
    }
    let repo = Repository::init(&dir.path().join("repo"), Config::new("bench".into())).unwrap();
    let options = BackupOptions {
        source: "tree".into(),
        ..BackupOptions::default()
    };
    backup(
        &repo,
        Input::Tree {
            paths: std::slice::from_ref(&src),
            options: &TreeBackupOptions::default(),
        },
        &options,
    )
    .unwrap();
    let made_tree = started.elapsed();
    let started = Instant::now();
    for i in 0..backups.saturating_sub(1) {
        let options = BackupOptions {
            source: format!("stream{}", i % 10),
            ..BackupOptions::default()
        };
        // Ten contents, one per source: after the first ten, every backup
        // stores nothing new, so the exact index (loaded and saved whole by
        // each backup) stays small and the setup takes minutes, not an hour
        // (unique contents: 120-160 ms a backup, growing, in debug).
        let mut input = Cursor::new(format!("backup of source {}\n", i % 10).into_bytes());
        backup(
            &repo,
            Input::Stream {
                input: &mut input,
                name: "bench",
            },
            &options,
        )
        .unwrap();
        if (i + 1) % 1000 == 0 {
            eprintln!("setup: {} backups in {}", i + 1, ms(started.elapsed()));
        }
    }
    let made_backups = started.elapsed();
    drop(repo);
    let repo =
        Repository::open(&dir.path().join("repo"), tessera::backend::LockMode::Read).unwrap();
    let server = Server::bind(repo, &Options::default()).unwrap();
    let (base, token) = (
        format!("http://{}", server.addr()),
        server.token().to_string(),
    );
    std::thread::spawn(move || server.run());
    let http = reqwest::Client::new();
    let path = format!("{}/big", src.display());
    println!(
        "repository: a {entries}-entry directory ({} to back up), {backups} backups ({} to make)",
        ms(made_tree),
        ms(made_backups)
    );
    let n = 15;
    for (what, url, total) in [
        (
            "tree, first page of 1000",
            format!("{base}/api/backups/1/tree?path={path}&limit=1000"),
            entries,
        ),
        (
            "tree, last page of 1000",
            format!(
                "{base}/api/backups/1/tree?path={path}&limit=1000&offset={}",
                entries - 1000
            ),
            entries,
        ),
        (
            "backups, newest 100",
            format!("{base}/api/backups?limit=100&order=desc"),
            backups,
        ),
        (
            "backups, oldest 100",
            format!("{base}/api/backups?limit=100"),
            backups,
        ),
        (
            "backups, 1000 newest",
            format!("{base}/api/backups?limit=1000&order=desc"),
            backups,
        ),
    ] {
        let (median, slowest, body) = time(&http, &url, &token, n).await;
        assert_eq!(body["total"], total, "{what}");
        println!(
            "{what:<28} median {:>10}  slowest {:>10}  ({n} requests)",
            ms(median),
            ms(slowest)
        );
    }
    let (median, slowest, body) = time(&http, &format!("{base}/api/stats"), &token, 3).await;
    assert_eq!(body["backups"], backups);
    println!(
        "{:<28} median {:>10}  slowest {:>10}  (3 requests)",
        "stats",
        ms(median),
        ms(slowest)
    );
}
