//! Round trips through the command line: many edited versions in one
//! repository, edge-case sizes, a 1 GiB stream, and restore to stdout.

mod common;

use common::*;
use std::io::Write;
use std::path::Path;

/// 24 successive versions of a random file, each made from the previous one
/// by random insertions, deletions and overwrites, all backed up into one
/// repository; every version restores byte-identically (to a file and to
/// stdout) and `check --read-data` passes.
#[test]
fn successive_edited_versions_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);
    let input = tmp.path().join("input");
    let mut rng = rng(42);
    let mut data = random_bytes(1, 3 << 20);
    let mut versions = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    for v in 0..24 {
        if v > 0 {
            // A few small edits and, now and then, a large one.
            for _ in 0..1 + v % 7 {
                kinds.insert(random_edit(&mut rng, &mut data, 4096));
            }
            if v % 5 == 0 {
                kinds.insert(random_edit(&mut rng, &mut data, 300_000));
            }
        }
        std::fs::write(&input, &data).unwrap();
        let r = backup_json(&repo, &input);
        assert_eq!(num(&r, "id"), v + 1, "backup ids are consecutive");
        assert_eq!(num(&r, "logical_bytes"), data.len() as u64);
        if v > 0 {
            // Deduplication works between versions: most of each version is old.
            assert!(
                num(&r, "stored_bytes") < data.len() as u64 / 2,
                "version {v} stored {} of {} bytes",
                num(&r, "stored_bytes"),
                data.len()
            );
        }
        versions.push(data.clone());
    }
    assert_eq!(kinds.len(), 3, "all edit kinds exercised: {kinds:?}");
    assert_eq!(list_ids(&repo), (1..=24).collect::<Vec<u64>>());

    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    for (i, expected) in versions.iter().enumerate() {
        let id = i as u64 + 1;
        let path = restore_to_file(&repo, id, &out_dir);
        assert_file_eq(&path, expected);
        std::fs::remove_file(&path).unwrap();
    }
    // Every fifth version, and `latest`, to stdout as well.
    for (i, expected) in versions.iter().enumerate().step_by(5) {
        assert_restore_stdout_matches(&repo, &(i + 1).to_string(), &mut &expected[..]);
    }
    assert_restore_stdout_matches(&repo, "latest", &mut &versions[23][..]);
    let report = ok(["check".as_ref(), repo.as_os_str(), "--read-data".as_ref()]);
    assert!(report.contains("no problems"), "{report}");
}

fn backup_stdin(repo: &Path, data: &[u8]) -> serde_json::Value {
    let mut child = spawn_stream_backup(repo, &[]);
    let mut stdin = child.stdin.take().unwrap();
    let owned = data.to_vec();
    let feeder = std::thread::spawn(move || {
        stdin.write_all(&owned).unwrap();
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(
        out.status.success(),
        "backup from stdin failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_panic(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Empty, 1-byte, exactly-maximum-chunk-size (65536) and just-over inputs,
/// from files and from stdin, restored to files and to stdout.
#[test]
fn edge_sizes_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let input = tmp.path().join("input");
    // (content, expected chunk count or None when content-defined)
    let cases: Vec<(&str, Vec<u8>, Option<u64>)> = vec![
        ("empty", Vec::new(), Some(0)),
        ("one byte", vec![0x5a], Some(1)),
        ("65536 random bytes", random_bytes(7, 65536), None),
        // Zeros have no content-defined boundary: exactly one maximum-size chunk.
        ("65536 zeros", vec![0u8; 65536], Some(1)),
        ("65537 zeros", vec![0u8; 65537], Some(2)),
        ("65535 random bytes", random_bytes(8, 65535), None),
    ];
    let mut ids = Vec::new();
    for (name, data, chunks) in &cases {
        std::fs::write(&input, data).unwrap();
        let r = backup_json(&repo, &input);
        assert_eq!(num(&r, "logical_bytes"), data.len() as u64, "{name}");
        if let Some(c) = chunks {
            assert_eq!(num(&r, "chunks"), *c, "{name}: chunk count");
        }
        ids.push(num(&r, "id"));
        // The same content from stdin is a second backup, fully deduplicated.
        let s = backup_stdin(&repo, data);
        assert_eq!(
            num(&s, "logical_bytes"),
            data.len() as u64,
            "{name} via stdin"
        );
        assert_eq!(
            num(&s, "stored_bytes"),
            0,
            "{name} via stdin is all duplicate"
        );
        ids.push(num(&s, "id"));
    }
    for (i, (name, data, _)) in cases.iter().enumerate() {
        for id in [ids[2 * i], ids[2 * i + 1]] {
            let path = restore_to_file(&repo, id, &out_dir);
            assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                data.len() as u64,
                "{name}: restored size"
            );
            assert_file_eq(&path, data);
            assert_restore_stdout_matches(&repo, &id.to_string(), &mut &data[..]);
        }
    }
    let report = ok(["check".as_ref(), repo.as_os_str(), "--read-data".as_ref()]);
    assert!(report.contains("no problems"), "{report}");
}

/// A 1 GiB pseudo-random stream backed up from stdin, restored to stdout
/// and to a file, compared as streams; `check --read-data` passes.
#[test]
fn one_gib_round_trip() {
    const SEED: u64 = 0x1_6000_0000;
    const LEN: u64 = 1 << 30;
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);

    let mut child = spawn_stream_backup(&repo, &[]);
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut stdin);
        let n = std::io::copy(&mut PrngReader::new(SEED, LEN), &mut w).unwrap();
        w.flush().unwrap();
        n
    });
    let out = child.wait_with_output().unwrap();
    assert_eq!(feeder.join().unwrap(), LEN);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(num(&r, "logical_bytes"), LEN);
    assert_eq!(
        num(&r, "stored_bytes"),
        LEN,
        "random data does not deduplicate"
    );
    let id = num(&r, "id").to_string();

    assert_restore_stdout_matches(&repo, &id, &mut PrngReader::new(SEED, LEN));
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let path = restore_to_file(&repo, id.parse().unwrap(), &out_dir);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), LEN);
    assert_file_matches(&path, &mut PrngReader::new(SEED, LEN));
    std::fs::remove_file(&path).unwrap();

    let report = ok(["check".as_ref(), repo.as_os_str(), "--read-data".as_ref()]);
    assert!(report.contains("no problems"), "{report}");
}

/// A backup prints its delta-compression line only in a repository with a
/// delta policy: never in the lifecycle layout, which has none.
#[test]
fn backup_prints_the_delta_line_only_with_a_delta_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("input");
    std::fs::write(&input, random_bytes(3, 200_000)).unwrap();
    for (layout, delta, printed) in [
        ("lifecycle", "none", false),
        ("container", "none", false),
        ("container", "greedy", true),
    ] {
        let repo = tmp.path().join(format!("{layout}-{delta}"));
        ok([
            "init".as_ref(),
            repo.as_os_str(),
            "--layout".as_ref(),
            layout.as_ref(),
            "--delta".as_ref(),
            delta.as_ref(),
        ]);
        let out = backup_tree(&repo, &input);
        assert!(out.contains("committed"), "{out}");
        assert_eq!(
            out.lines().any(|l| l.starts_with("delta (")),
            printed,
            "{layout}, delta {delta}: {out}"
        );
    }
}
