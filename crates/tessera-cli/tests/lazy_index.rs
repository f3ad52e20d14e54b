//! The lazy and eager indexes through the command line: edited versions
//! back up and restore byte for byte with the index far smaller than memory
//! would need, their counters appear in `backup --json`, and the index
//! survives a rebuild and garbage collection.

mod common;

use common::*;
use rand::Rng;

fn versions_round_trip(index: &str, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let mut args = vec![
        "init",
        repo.to_str().unwrap(),
        "--index",
        index,
        "--index-memory",
        "512KiB",
        "--bloom-size",
        "2KiB",
        "--bft",
        "8",
        "--prefetch",
        "256",
    ];
    args.extend_from_slice(extra);
    ok(args);
    let input = tmp.path().join("input");
    let mut data = random_bytes(7, 6 << 20);
    let mut rng = rng(8);
    let mut kept = Vec::new();
    for v in 0..5 {
        if v > 0 {
            for _ in 0..20 {
                random_edit(&mut rng, &mut data, 16 << 10);
            }
            // Move a block, as when files are reordered in an archive.
            let at = rng.random_range(0..data.len() / 2);
            let block: Vec<u8> = data.drain(at..at + (1 << 20)).collect();
            let to = rng.random_range(0..data.len());
            data.splice(to..to, block);
        }
        std::fs::write(&input, &data).unwrap();
        let r = backup_json(&repo, &input);
        let idx = &r["index"];
        assert_eq!(idx["policy"], index, "{r}");
        for field in [
            "disk_lookups",
            "prefetches",
            "cache_lookups",
            "prelookup_hits",
        ] {
            assert!(idx[field].is_u64(), "index.{field} missing in {r}");
        }
        if v > 0 {
            assert!(num(idx, "disk_lookups") > 0, "{r}");
            assert!(num(idx, "prefetches") > 0, "{r}");
            assert!(
                num(&r, "stored_bytes") < num(&r, "logical_bytes") / 2,
                "{r}"
            );
        }
        kept.push((num(&r, "id"), data.clone()));
    }
    for (id, bytes) in &kept {
        let out = restore_to_file(&repo, *id, tmp.path());
        assert_file_eq(&out, bytes);
        std::fs::remove_file(out).unwrap();
    }
    ok(["check", "--read-data", repo.to_str().unwrap()]);

    // A rebuilt index and a garbage-collected repository still deduplicate.
    ok(["index", "rebuild", repo.to_str().unwrap()]);
    ok(["forget", "--keep-last", "2", repo.to_str().unwrap()]);
    ok(["gc", repo.to_str().unwrap()]);
    let r = backup_json(&repo, &input);
    assert!(
        num(&r, "stored_bytes") < num(&r, "logical_bytes") / 10,
        "{r}"
    );
    let out = restore_to_file(&repo, num(&r, "id"), tmp.path());
    assert_file_eq(&out, &data);
    ok(["check", "--read-data", repo.to_str().unwrap()]);
}

#[test]
fn lazy_index_round_trips_versions() {
    versions_round_trip("lazy", &[]);
}

#[test]
fn eager_index_round_trips_versions() {
    versions_round_trip("eager", &[]);
}

/// With a rewriting policy the pipeline keeps duplicates' bytes while they
/// wait (they may be stored again): the lazy buffer accounts for them.
#[test]
fn lazy_index_with_har_rewriting_round_trips_versions() {
    versions_round_trip("lazy", &["--rewrite", "har", "--container-size", "256KiB"]);
}

#[test]
fn bad_lazy_parameters_are_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let err = fail([
        "init",
        repo.to_str().unwrap(),
        "--index",
        "lazy",
        "--bft",
        "0",
    ]);
    assert!(err.contains("threshold"), "{err}");
    assert!(!repo.join("config").exists());
}
