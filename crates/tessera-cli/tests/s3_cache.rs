//! The local metadata cache of an S3 repository (FORMAT.md §13.2): a second
//! `list`, index load and restore plan make far fewer requests than the
//! first; a second `ls` of a tree backup reads nothing from the store (its
//! catalog's container ranges are cached); entries follow objects that are
//! replaced (`tag`); damaged entries are read again from the store;
//! `--no-cache` makes every request.
//!
//! One test in its own process: it points `XDG_CACHE_HOME` at a temporary
//! directory. Needs `TESSERA_TEST_S3` (see tests/s3.rs); skipped without it.

mod common;

use common::*;
use std::path::Path;
use tessera::backend::{IoStats, Location, LockMode};
use tessera::crypto::Credentials;
use tessera::restore::{restore, RestoreOptions};
use tessera::Repository;

/// Opens `location` for reading, with a cache of `cache_limit` bytes (0: none).
fn open(location: &str, cache_limit: u64) -> Repository {
    let mut location: Location = location.parse().expect("an S3 location");
    if let Location::S3(s3) = &mut location {
        s3.options.cache_limit = cache_limit;
    }
    let unlock = || {
        Ok(Credentials::new(
            zeroize::Zeroizing::new(TEST_PASSWORD.to_string()),
            None,
        ))
    };
    Repository::open_at(
        &location,
        LockMode::Read,
        std::time::Duration::ZERO,
        &unlock,
    )
    .expect("opening the repository")
}

/// Each backup's id and tags.
type Listing = Vec<(u64, Vec<String>)>;

/// What `list`, a backup's index loading and a restore read: the
/// snapshots (with their tags), every recipe, the index, and the latest
/// backup's bytes; and the I/O it took.
fn survey(location: &str, cache_limit: u64) -> (Listing, Vec<u8>, IoStats) {
    let repo = open(location, cache_limit);
    let before = repo.io_stats();
    let snaps: Listing = repo
        .snapshots()
        .expect("reading the snapshots")
        .into_iter()
        .map(|s| (s.id, s.tags))
        .collect();
    for (id, _) in &snaps {
        repo.recipe(*id).expect("reading a recipe");
    }
    drop(repo.open_index().expect("loading the index"));
    let mut out = Vec::new();
    let last = snaps.last().expect("a backup").0;
    restore(&repo, last, &mut out, &RestoreOptions::default()).expect("restoring");
    (snaps, out, repo.io_stats().since(&before))
}

/// The paths of the latest backup's catalog (`ls -r`), and the I/O of
/// listing them (the repository opened and its snapshots read before).
fn listing(location: &str, cache_limit: u64) -> (Vec<Vec<u8>>, IoStats) {
    let repo = open(location, cache_limit);
    let last = repo
        .snapshots()
        .expect("reading the snapshots")
        .last()
        .expect("a backup")
        .id;
    let before = repo.io_stats();
    let mut paths = Vec::new();
    tessera::tree::list_tree(&repo, last, None, true, |e| {
        paths.push(e.path.clone());
        Ok(())
    })
    .expect("listing the backup");
    (paths, repo.io_stats().since(&before))
}

#[test]
fn a_warm_cache_saves_requests_and_stays_correct() {
    let Ok(base) = std::env::var("TESSERA_TEST_S3") else {
        eprintln!(
            "SKIPPED a_warm_cache_saves_requests_and_stays_correct: TESSERA_TEST_S3 is not set"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    std::env::set_var("XDG_CACHE_HOME", &cache);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let repo = format!(
        "{}/cache-{}-{nanos}",
        base.trim_end_matches('/'),
        std::process::id()
    );
    ok([
        "init",
        "--index",
        "ddfs",
        "--container-size",
        "262144",
        &repo,
    ]);
    for i in 0..6u64 {
        let input = dir.path().join(format!("in{i}"));
        std::fs::create_dir_all(&input).unwrap();
        for f in 0..4 {
            write_random_file(&input.join(format!("f{f}")), i * 10 + f, 300_000);
        }
        ok(["backup", "--no-cache", &repo, &input.display().to_string()]);
    }

    let (cold_snaps, cold_out, cold) = survey(&repo, 1 << 30);
    let (warm_snaps, warm_out, warm) = survey(&repo, 1 << 30);
    let (plain_snaps, plain_out, plain) = survey(&repo, 0);
    eprintln!(
        "requests: cold cache {} ({} reads, {} cache lists), warm cache {} ({} of {} reads from the cache), no cache {}",
        cold.requests(),
        cold.reads,
        cold.cache_lists,
        warm.requests(),
        warm.cache_hits,
        warm.reads,
        plain.requests()
    );
    assert_eq!((&cold_snaps, &cold_out), (&plain_snaps, &plain_out));
    assert_eq!((&warm_snaps, &warm_out), (&plain_snaps, &plain_out));
    assert_eq!(plain.cache_hits + plain.cache_lists, 0);
    // A cold cache serves only what the same process read twice.
    assert!(cold.cache_hits < warm.cache_hits, "{cold:?}");
    assert!(warm.cache_hits >= 6 + 6, "{warm:?}");
    assert!(
        warm.requests() * 2 < plain.requests(),
        "warm {warm:?} vs none {plain:?}"
    );

    // A replaced snapshot (new tags) and a new backup are seen at once.
    ok(["tag", &repo, "1", "--add", "kept"]);
    let input = dir.path().join("in0");
    ok(["backup", &repo, &input.display().to_string()]);
    let (snaps, out, _) = survey(&repo, 1 << 30);
    let (fresh_snaps, fresh_out, _) = survey(&repo, 0);
    assert_eq!((&snaps, &out), (&fresh_snaps, &fresh_out));
    assert_eq!(snaps[0].1, vec!["kept".to_string()]);
    assert_eq!(snaps.len(), 7);

    // A tree backup's catalog is read by cached ranges of its containers:
    // a second `ls` reads nothing from the store (in an unencrypted
    // repository each read is one request, so reads and cache hits compare
    // one to one; in an encrypted one, a range past the first segment is
    // two: the header and the segments).
    let unencrypted = format!("{repo}-plain");
    ok([
        "init",
        "--encryption",
        "none",
        "--container-size",
        "262144",
        &unencrypted,
    ]);
    let tree = dir.path().join("tree");
    for f in 0..400u64 {
        let sub = tree.join(format!("d{}", f % 7));
        std::fs::create_dir_all(&sub).unwrap();
        write_random_file(
            &sub.join(format!("file-with-a-long-name-{f}")),
            100 + f,
            3000,
        );
    }
    ok([
        "backup",
        "--no-cache",
        &unencrypted,
        &tree.display().to_string(),
    ]);
    for location in [&unencrypted, &repo] {
        let (cold_ls, cold) = listing(location, 1 << 30);
        let (warm_ls, warm) = listing(location, 1 << 30);
        let (plain_ls, plain) = listing(location, 0);
        eprintln!("ls {location}: cold {cold:?}, warm {warm:?}, no cache {plain:?}");
        assert!(!plain_ls.is_empty());
        assert_eq!(cold_ls, plain_ls);
        assert_eq!(warm_ls, plain_ls);
        assert_eq!(plain.cache_hits, 0);
        assert!(warm.cache_hits > cold.cache_hits, "{cold:?} {warm:?}");
        if *location == unencrypted {
            assert!(plain_ls.len() > 400, "{}", plain_ls.len());
            // The first listing read the catalog's data from the store...
            assert!(cold.reads > cold.cache_hits, "{cold:?}");
            // ... the second read nothing but from the cache.
            assert_eq!(warm.reads, warm.cache_hits, "{warm:?}");
        }
    }

    // Damaged entries are misses: read again from the store.
    let entries = damage_every_entry(&cache);
    assert!(entries > 0);
    let (snaps, out, io) = survey(&repo, 1 << 30);
    assert_eq!((&snaps, &out), (&fresh_snaps, &fresh_out));
    let (damaged_ls, _) = listing(&unencrypted, 1 << 30);
    assert_eq!(damaged_ls, listing(&unencrypted, 0).0);
    // Only re-reads within the process hit (entries it stored anew).
    assert!(
        io.cache_hits <= cold.cache_hits,
        "damaged entries served: {io:?}"
    );
}

/// Flips a byte of every cache entry below `dir`; returns how many.
fn damage_every_entry(dir: &Path) -> usize {
    let mut n = 0;
    for e in walk(dir) {
        let mut bytes = std::fs::read(&e).unwrap();
        if let Some(b) = bytes.last_mut() {
            *b ^= 0x55;
            std::fs::write(&e, bytes).unwrap();
            n += 1;
        }
    }
    n
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        match p.is_dir() {
            true => files.extend(walk(&p)),
            false => files.push(p),
        }
    }
    files
}
