//! `forget` end to end: retention rules grouped by source, dry runs and
//! their JSON, the lifecycle layout freeing space at once, `--prune`, and
//! refusing a forget without rules.

mod common;

use common::*;
use std::path::Path;

fn forget_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["forget", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(all)).expect("forget --json prints JSON")
}

/// A stream backup of `file`'s bytes (on standard input) as lineage `source`.
fn backup_as(repo: &Path, file: &Path, source: &str) -> u64 {
    let out = ok_with_input(
        [
            "backup",
            repo.to_str().unwrap(),
            "-",
            "--source",
            source,
            "--json",
        ],
        file,
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    num(&v, "id")
}

#[test]
fn keep_last_is_per_source_so_a_rare_source_keeps_its_history() {
    for layout in ["container", "lifecycle"] {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        init_with(&repo, &["--layout", layout, "--encryption", "none"]);
        let file = tmp.path().join("f");
        // The busy source is backed up 6 times, the rare one twice, interleaved.
        let mut rare = Vec::new();
        let mut busy = Vec::new();
        for round in 0..6u64 {
            std::fs::write(&file, random_bytes(round, 50_000 + round as usize)).unwrap();
            busy.push(backup_as(&repo, &file, "busy"));
            if round % 3 == 0 {
                rare.push(backup_as(&repo, &file, "rare"));
            }
        }
        let r = repo.to_str().unwrap();
        let dry = forget_json(&[r, "--keep-last", "2", "--dry-run"]);
        assert_eq!(dry["dry_run"], true);
        let removed: Vec<u64> = dry["removed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(removed, busy[..4].to_vec(), "{layout}: {dry}");
        // Every decision names its group and, when kept, its rules.
        for d in dry["decisions"].as_array().unwrap() {
            // Streams have no paths: the source tells them apart.
            let group = d["group"].as_str().unwrap();
            assert!(
                group.ends_with(" paths= source=busy") || group.ends_with(" paths= source=rare"),
                "{d}"
            );
            let reasons = d["reasons"].as_array().unwrap();
            let id = d["id"].as_u64().unwrap();
            assert_eq!(reasons.is_empty(), removed.contains(&id), "{d}");
        }
        // The dry run deleted nothing.
        assert_eq!(list_ids(&repo).len(), busy.len() + rare.len());

        let done = forget_json(&[r, "--keep-last", "2"]);
        assert_eq!(done["removed"], dry["removed"]);
        let mut left = list_ids(&repo);
        left.sort_unstable();
        let mut expect: Vec<u64> = busy[4..].iter().chain(&rare).copied().collect();
        expect.sort_unstable();
        assert_eq!(left, expect, "{layout}");
        if layout == "lifecycle" {
            assert!(num(&done["freed"], "bytes_freed") > 0, "{done}");
        } else {
            assert!(done["freed"].is_null(), "{done}");
        }
        for id in left {
            let out = restore_to_file(&repo, id, tmp.path());
            assert!(out.exists());
            std::fs::remove_file(out).unwrap();
        }
        ok(["check", r, "--read-data"]);
    }
}

#[test]
fn the_newest_backup_of_a_group_survives_unless_keep_last_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);
    let r = repo.to_str().unwrap();
    let file = tmp.path().join("f");
    std::fs::write(&file, random_bytes(1, 10_000)).unwrap();
    let a = backup_as(&repo, &file, "s");
    let b = backup_as(&repo, &file, "s");
    // Only a tag rule no backup matches: the newest is still kept.
    let v = forget_json(&[r, "--keep-tag", "nothing-has-this"]);
    assert_eq!(v["removed"], serde_json::json!([a]));
    assert_eq!(list_ids(&repo), vec![b]);
    let v = forget_json(&[r, "--keep-last", "0", "--prune"]);
    assert_eq!(v["removed"], serde_json::json!([b]));
    assert!(num(&v["gc"], "containers_reclaimed") > 0, "{v}");
    assert!(list_ids(&repo).is_empty());
}

#[test]
fn forget_needs_a_rule_and_valid_values() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);
    let r = repo.to_str().unwrap();
    let out = run(["forget", r]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--keep-last") && err.contains("--keep-daily"),
        "{err}"
    );
    let err = fail(["forget", r, "--keep-daily", "many"]);
    assert!(err.contains("many"), "{err}");
    let err = fail(["forget", r, "--keep-within", "soon"]);
    assert!(err.contains("soon"), "{err}");
    let err = fail(["forget", r, "--keep-last", "1", "--group-by", "colour"]);
    assert!(err.contains("colour"), "{err}");
}

#[test]
fn human_output_shows_every_decision_and_its_rule() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);
    let r = repo.to_str().unwrap();
    let file = tmp.path().join("f");
    std::fs::write(&file, random_bytes(2, 10_000)).unwrap();
    for _ in 0..3 {
        backup_as(&repo, &file, "s");
    }
    let out = ok(["forget", r, "--keep-daily", "1", "--dry-run"]);
    assert!(out.contains(" paths= source=s: keep 1, remove 2"), "{out}");
    assert_eq!(out.matches("  remove  ").count(), 2, "{out}");
    assert!(out.contains("newest of group, daily"), "{out}");
    assert!(out.contains("would remove 2 of 3 backup(s)"), "{out}");
    assert_eq!(list_ids(&repo).len(), 3);
}

fn prune_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["prune", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(all)).expect("prune --json prints JSON")
}

#[test]
fn prune_plans_then_repacks_within_its_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    ok(["init", r, "--container-size", "256KiB"]);
    let file = tmp.path().join("f");
    // Versions sharing half their bytes: deleting the old ones leaves
    // partly dead containers.
    let mut data = random_bytes(7, 1 << 20);
    let mut ids = Vec::new();
    for v in 0..4u64 {
        let edit = random_bytes(100 + v, 1 << 19);
        data[(v as usize % 2) << 19..][..1 << 19].copy_from_slice(&edit);
        std::fs::write(&file, &data).unwrap();
        ids.push(backup_as(&repo, &file, "s"));
    }
    ok(["forget", r, "--keep-last", "1"]);
    let before = containers(&repo);

    let dry = prune_json(&[r, "--dry-run"]);
    let plan = &dry["plan"];
    assert!(num(plan, "unused_before") > 0, "{dry}");
    assert!(dry["gc"].is_null());
    assert_eq!(containers(&repo), before, "a dry run changes nothing");

    // Only wholly unused containers: nothing is copied.
    let v = prune_json(&[r, "--max-unused", "unlimited"]);
    assert_eq!(num(&v["gc"], "bytes_moved"), 0, "{v}");
    assert_eq!(num(&v["plan"], "bytes_repacked"), 0, "{v}");

    // A repack limit of 0 copies nothing either; without it everything unused goes.
    let v = prune_json(&[r, "--max-unused", "0%", "--max-repack", "0"]);
    assert_eq!(num(&v["gc"], "bytes_moved"), 0, "{v}");
    let v = prune_json(&[r, "--max-unused", "0%"]);
    assert_eq!(num(&v["plan"], "unused_after"), 0, "{v}");
    let again = prune_json(&[r, "--dry-run", "--max-unused", "0%"]);
    assert_eq!(num(&again["plan"], "unused_before"), 0, "{again}");

    let out = restore_to_file(&repo, *ids.last().unwrap(), tmp.path());
    assert_file_eq(&out, &data);
    ok(["check", r, "--read-data"]);

    let err = fail(["prune", r, "--max-unused", "120%"]);
    assert!(err.contains("120%"), "{err}");
}

#[test]
fn prune_on_the_lifecycle_layout_says_nothing_needs_copying() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    ok(["init", r, "--layout", "lifecycle"]);
    let file = tmp.path().join("f");
    std::fs::write(&file, random_bytes(3, 100_000)).unwrap();
    backup_as(&repo, &file, "s");
    let out = ok(["prune", r]);
    assert!(out.contains("frees its space at once"), "{out}");
}

#[test]
fn keep_tag_and_group_by_tags_use_the_backups_tags() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);
    let r = repo.to_str().unwrap();
    let file = tmp.path().join("f");
    std::fs::write(&file, random_bytes(4, 20_000)).unwrap();
    let f = file.to_str().unwrap();
    let tagged = |tag: &str| -> u64 {
        let out = ok(["backup", r, f, "--source", "s", "--tag", tag, "--json"]);
        num(
            &serde_json::from_str::<serde_json::Value>(&out).unwrap(),
            "id",
        )
    };
    let release = tagged("release");
    let nightly: Vec<u64> = (0..3).map(|_| tagged("nightly")).collect();
    // Grouped by tags, keep-last 1 keeps the newest of each tag.
    let v = forget_json(&[r, "--keep-last", "1", "--group-by", "tags", "--dry-run"]);
    assert_eq!(
        v["removed"],
        serde_json::json!([nightly[0], nightly[1]]),
        "{v}"
    );
    // Grouped by default (the same host, path and source), --keep-tag
    // release keeps the tagged one too.
    let v = forget_json(&[r, "--keep-last", "1", "--keep-tag", "release"]);
    assert_eq!(
        v["removed"],
        serde_json::json!([nightly[0], nightly[1]]),
        "{v}"
    );
    let kept: Vec<u64> = list_ids(&repo);
    assert_eq!(kept, vec![release, nightly[2]]);
}
