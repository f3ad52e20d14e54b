//! Damage can be repaired, and what cannot be is salvaged (issue 20):
//! `restore --skip-damaged` writes every intact byte and zeros exactly
//! where damaged chunks were, listing the lost ranges; `tessera repair`
//! recovers lost snapshots and re-points references to intact copies.

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// An unencrypted repository of `layout` with small containers, and a
/// 2 MB input file backed up once.
fn setup(layout: &str) -> (tempfile::TempDir, PathBuf, PathBuf, Vec<u8>) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init_with(
        &repo,
        &[
            "--encryption",
            "none",
            "--layout",
            layout,
            "--container-size",
            "256KiB",
        ],
    );
    let data = random_bytes(7, 2_000_000);
    let input = tmp.path().join("input");
    std::fs::write(&input, &data).unwrap();
    backup_json(&repo, &input);
    (tmp, repo, input, data)
}

/// Flips one byte in the middle of the file at `path`.
fn flip(path: &Path) {
    let mut b = std::fs::read(path).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x20;
    std::fs::write(path, b).unwrap();
}

/// Every regular file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Every file under `dir` with its bytes.
fn snapshot_dir(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    files(dir)
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

/// `restore --skip-damaged --json` of backup `id` into `out`: exit code and the lost ranges.
fn salvage(repo: &Path, id: u64, out: &Path) -> (i32, Vec<(u64, u64, String)>) {
    let o = run([
        "restore",
        repo.to_str().unwrap(),
        &id.to_string(),
        out.to_str().unwrap(),
        "--skip-damaged",
        "--json",
    ]);
    assert_no_panic(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let lost = v["lost"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                num(l, "offset"),
                num(l, "len"),
                l["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (o.status.code().unwrap(), lost)
}

/// Asserts `got` is `want` outside the `lost` ranges and zeros inside them.
fn assert_salvaged(got: &[u8], want: &[u8], lost: &[(u64, u64, String)]) {
    assert_eq!(got.len(), want.len());
    let mut expected = want.to_vec();
    for (off, len, _) in lost {
        expected[*off as usize..(*off + *len) as usize].fill(0);
    }
    assert!(got == expected.as_slice(), "salvaged bytes differ");
    // The lost ranges really held data (random bytes are not all zero).
    for (off, len, _) in lost {
        assert!(want[*off as usize..(*off + *len) as usize]
            .iter()
            .any(|&b| b != 0));
    }
}

#[test]
fn salvage_restore_writes_zeros_exactly_where_damaged_chunks_were() {
    for layout in ["container", "lifecycle"] {
        let (tmp, repo, _, data) = setup(layout);
        let id = list_ids(&repo)[0];
        // The largest data object: a container or a lifecycle volume/category.
        let dir = repo.join(if layout == "container" {
            "containers"
        } else {
            "lifecycle"
        });
        let victim = files(&dir)
            .into_iter()
            .filter(|p| !p.to_string_lossy().contains("state"))
            .max_by_key(|p| std::fs::metadata(p).unwrap().len())
            .unwrap();
        flip(&victim);
        // Without the flag the restore fails and writes nothing.
        let plain = tmp.path().join("plain");
        let o = run([
            "restore",
            repo.to_str().unwrap(),
            &id.to_string(),
            plain.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(1), "{layout}");
        assert!(!plain.exists());
        let out = tmp.path().join("out");
        let (code, lost) = salvage(&repo, id, &out);
        assert_eq!(code, 3, "{layout}: incomplete");
        assert!(!lost.is_empty(), "{layout}");
        let total: u64 = lost.iter().map(|l| l.1).sum();
        assert!(total < data.len() as u64 / 2, "{layout}: lost {total}");
        assert!(lost.iter().all(|l| l.2 == "damaged"), "{lost:?}");
        assert_salvaged(&std::fs::read(&out).unwrap(), &data, &lost);
        // The human output lists the ranges.
        let human = run([
            "restore",
            repo.to_str().unwrap(),
            &id.to_string(),
            tmp.path().join("out2").to_str().unwrap(),
            "--skip-damaged",
        ]);
        assert_eq!(human.status.code(), Some(3));
        let text = String::from_utf8_lossy(&human.stdout);
        let (off, len, _) = &lost[0];
        assert!(
            text.contains(&format!("lost: bytes {off}..{}", off + len)),
            "{text}"
        );
    }
}

#[test]
fn salvage_of_a_missing_container_reports_it_missing() {
    let (tmp, repo, _, data) = setup("container");
    let id = list_ids(&repo)[0];
    let victim = files(&repo.join("containers"))[1].clone();
    std::fs::remove_file(&victim).unwrap();
    let out = tmp.path().join("out");
    let (code, lost) = salvage(&repo, id, &out);
    assert_eq!(code, 3);
    assert!(!lost.is_empty() && lost.iter().all(|l| l.2 == "missing"));
    assert_salvaged(&std::fs::read(&out).unwrap(), &data, &lost);
    // An intact backup salvages completely, with exit status 0.
    let other = tmp.path().join("other");
    std::fs::write(&other, random_bytes(9, 100_000)).unwrap();
    backup_json(&repo, &other);
    let id2 = list_ids(&repo)[1];
    let (code, lost) = salvage(&repo, id2, &tmp.path().join("out2"));
    assert_eq!((code, lost.len()), (0, 0));
    let _ = snapshot_dir(&repo);
}

/// `repair --json REPO [extra]`: exit code and report.
fn repair(repo: &Path, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec!["repair", repo.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert_no_panic(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    (o.status.code().unwrap(), v)
}

fn action_kinds(report: &serde_json::Value) -> Vec<String> {
    report["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap().to_string())
        .collect()
}

/// Restores backup `id` (plainly) and returns its bytes.
fn restored(repo: &Path, id: u64, dir: &Path) -> Vec<u8> {
    std::fs::read(restore_to_file(repo, id, dir)).unwrap()
}

#[test]
fn repair_recovers_a_deleted_snapshot() {
    for layout in ["container", "lifecycle"] {
        let (tmp, repo, input, data) = setup(layout);
        let mut second = data.clone();
        second[..1000].fill(9);
        std::fs::write(&input, &second).unwrap();
        backup_json(&repo, &input);
        let ids = list_ids(&repo);
        let snap = repo.join(format!("snapshots/{:016x}", ids[0]));
        assert!(snap.exists(), "{}", snap.display());
        std::fs::remove_file(&snap).unwrap();
        let (code, report) = repair(&repo, &[]);
        assert_eq!(code, 0, "{layout}: {report}");
        assert_eq!(action_kinds(&report), ["snapshot_recovered"], "{report}");
        assert_eq!(report["actions"][0]["backups"][0], ids[0]);
        // list shows it again, undamaged, and it restores.
        let out = ok(["list", "--json", repo.to_str().unwrap()]);
        let listed: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(listed.as_array().unwrap().len(), 2);
        assert!(!out.contains("damaged"), "{out}");
        let dir = tmp.path().join("r");
        std::fs::create_dir(&dir).unwrap();
        assert!(restored(&repo, ids[0], &dir) == data, "{layout}");
        // A second repair finds nothing to do.
        let (code, report) = repair(&repo, &[]);
        assert_eq!((code, action_kinds(&report).len()), (0, 0), "{report}");
    }
}

/// The largest container of `repo`.
fn largest_container(repo: &Path) -> PathBuf {
    files(&repo.join("containers"))
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap()
}

#[test]
fn repair_repoints_a_damaged_chunk_to_a_copy_a_later_backup_stored() {
    let (tmp, repo, input, data) = setup("container");
    let id = list_ids(&repo)[0];
    flip(&largest_container(&repo));
    // Nothing to re-point to yet: the backup is listed as unrepaired, and
    // the index forgets the damaged chunks.
    let (code, report) = repair(&repo, &[]);
    assert_eq!(code, 3, "{report}");
    assert_eq!(
        action_kinds(&report),
        ["chunks_quarantined", "index_rebuilt"],
        "{report}"
    );
    assert_eq!(report["unrepaired"][0]["backup"], id);
    assert!(num(&report["unrepaired"][0], "lost_chunks") > 0);
    // The quarantine outlives an index rebuild from the containers.
    ok(["index", "rebuild", repo.to_str().unwrap()]);
    // The next backup of the same data stores the damaged chunks again.
    let b = backup_json(&repo, &input);
    assert!(num(&b, "unique_chunks") > 0, "{b}");
    let (code, report) = repair(&repo, &[]);
    assert_eq!(code, 0, "{report}");
    assert!(action_kinds(&report).contains(&"recipe_repointed".to_string()));
    assert_eq!(report["unrepaired"].as_array().unwrap().len(), 0);
    let dir = tmp.path().join("r");
    std::fs::create_dir(&dir).unwrap();
    assert!(restored(&repo, id, &dir) == data);
    let o = run(["check", repo.to_str().unwrap(), "--read-data", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Only the damaged container itself remains a problem (its chunks are
    // no longer needed by any backup's recipe).
    for p in v["problems"].as_array().unwrap() {
        assert_eq!(p["affected_backups"].as_array().unwrap().len(), 0, "{p}");
    }
}

#[test]
fn repair_dry_run_changes_nothing() {
    let (tmp, repo, input, _) = setup("container");
    let mut second = random_bytes(8, 500_000);
    second.extend_from_slice(&std::fs::read(&input).unwrap()[..300_000]);
    std::fs::write(&input, &second).unwrap();
    backup_json(&repo, &input);
    let ids = list_ids(&repo);
    std::fs::remove_file(repo.join(format!("snapshots/{:016x}", ids[1]))).unwrap();
    flip(&largest_container(&repo));
    std::fs::remove_file(repo.join("state-copy")).ok();
    let before = snapshot_dir(&repo);
    let (code, report) = repair(&repo, &["--dry-run"]);
    assert_eq!(code, 3, "{report}");
    assert_eq!(report["dry_run"], true);
    let kinds = action_kinds(&report);
    assert!(
        kinds.contains(&"snapshot_recovered".to_string()),
        "{report}"
    );
    assert!(kinds.contains(&"index_rebuilt".to_string()), "{report}");
    let after = snapshot_dir(&repo);
    let names = |v: &[(PathBuf, Vec<u8>)]| v.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(names(&before), names(&after));
    assert!(before == after, "a dry run changed bytes");
    // The real run does what the dry run said.
    let (_, real) = repair(&repo, &[]);
    assert_eq!(action_kinds(&real), kinds);
    let _ = tmp;
}

#[test]
fn repair_recovers_the_snapshot_of_a_tree_backup_in_an_encrypted_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("a"), random_bytes(3, 300_000)).unwrap();
    std::fs::write(src.join("d/b"), b"hello").unwrap();
    ok(["backup", repo.to_str().unwrap(), src.to_str().unwrap()]);
    let id = list_ids(&repo)[0];
    std::fs::remove_file(repo.join(format!("snapshots/{id:016x}"))).unwrap();
    let (code, report) = repair(&repo, &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(action_kinds(&report), ["snapshot_recovered"], "{report}");
    let out = tmp.path().join("out");
    ok([
        "restore",
        repo.to_str().unwrap(),
        &id.to_string(),
        out.to_str().unwrap(),
    ]);
    let found: Vec<PathBuf> = files(&out);
    let a = found.iter().find(|p| p.ends_with("a")).expect("a restored");
    assert_eq!(std::fs::read(a).unwrap(), random_bytes(3, 300_000));
    let b = found
        .iter()
        .find(|p| p.ends_with("d/b"))
        .expect("d/b restored");
    assert_eq!(std::fs::read(b).unwrap(), b"hello");
}

#[test]
fn repair_forget_damaged_deletes_only_backups_with_unrecoverable_chunks() {
    let (_tmp, repo, input, _) = setup("container");
    std::fs::write(&input, random_bytes(11, 100_000)).unwrap();
    backup_json(&repo, &input);
    let ids = list_ids(&repo);
    flip(&largest_container(&repo));
    let (code, report) = repair(&repo, &["--forget-damaged"]);
    assert_eq!(code, 0, "{report}");
    assert!(action_kinds(&report).contains(&"backup_forgotten".to_string()));
    assert_eq!(report["unrepaired"][0]["backup"], ids[0]);
    assert_eq!(report["unrepaired"][0]["forgotten"], true);
    assert_eq!(list_ids(&repo), [ids[1]]);
}

/// Lifecycle layout: a category part that is deleted (or damaged) is
/// reported by `check`, naming it; the next backup stores its chunks again
/// and restores; `repair` rewrites the part with intact copies, after
/// which the first backup restores and `check` is clean.
#[test]
fn lifecycle_part_deleted_or_damaged_is_reported_and_repaired_from_a_later_copy() {
    for delete in [true, false] {
        let (tmp, repo, input, data) = setup("lifecycle");
        let id = list_ids(&repo)[0];
        let part = files(&repo.join("lifecycle"))
            .into_iter()
            .find(|p| p.parent().is_some_and(|d| d.ends_with("cat")))
            .unwrap();
        let key = part
            .strip_prefix(&repo)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        if delete {
            std::fs::remove_file(&part).unwrap();
        } else {
            flip(&part);
        }
        let o = run(["check", repo.to_str().unwrap(), "--read-data", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let named: Vec<&serde_json::Value> = v["problems"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["object"] == key.as_str())
            .collect();
        assert_eq!(named.len(), 1, "{v}");
        let kind = if delete { "missing" } else { "damaged" };
        assert_eq!(named[0]["kind"], kind, "{v}");
        assert_eq!(named[0]["affected_backups"][0], id, "{v}");
        // Damage does not spread: the next backup stores the chunks again.
        let b = backup_json(&repo, &input);
        assert!(num(&b, "unique_chunks") > 0, "{b}");
        let dir = tmp.path().join("r");
        std::fs::create_dir(&dir).unwrap();
        assert!(restored(&repo, num(&b, "id"), &dir) == data);
        let (code, report) = repair(&repo, &[]);
        assert_eq!(code, 0, "{report}");
        assert!(
            action_kinds(&report).contains(&"part_rewritten".to_string()),
            "{report}"
        );
        let dir = tmp.path().join("r2");
        std::fs::create_dir(&dir).unwrap();
        assert!(restored(&repo, id, &dir) == data);
        let o = run(["check", repo.to_str().unwrap(), "--read-data", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{v}");
    }
}

/// Flips the byte at `at` of the file at `path`.
fn flip_at(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x20;
    std::fs::write(path, b).unwrap();
}

/// After `repair` re-points every backup away from a damaged container,
/// the damage is no backup's: `repair` says that `gc` clears it, `check`
/// names `gc` with the problem, and `repair --gc` clears it — whether the
/// container lost one chunk (its intact ones are copied forward) or its
/// metadata (it is deleted) — as does `gc` itself, whatever its threshold;
/// after which `check` passes.
#[test]
fn repair_names_and_runs_the_gc_that_clears_damage_no_backup_uses() {
    for (what, at) in [("a chunk", None), ("the metadata", Some(100))] {
        let (tmp, repo, input, data) = setup("container");
        let r = repo.to_str().unwrap();
        let id = list_ids(&repo)[0];
        let damaged = largest_container(&repo);
        match at {
            Some(at) => flip_at(&damaged, at),
            None => flip(&damaged),
        }
        // Quarantined, then stored again by the next backup, then re-pointed.
        repair(&repo, &[]);
        backup_json(&repo, &input);
        let out = run(["repair", r]);
        assert!(out.status.success(), "{what}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("no backup uses the damage")
                && stderr.contains(&format!("`tessera gc {r}`"))
                && stderr.contains("repair --gc"),
            "{what}: {stderr}"
        );
        let (_, report) = repair(&repo, &["--dry-run"]);
        let unused = report["unused_damage"].as_array().unwrap();
        assert_eq!(unused.len(), 1, "{what}: {report}");
        let check = run(["check", r, "--read-data"]);
        assert!(!check.status.success(), "{what}: {check:?}");
        let text = String::from_utf8_lossy(&check.stdout);
        assert!(
            text.contains("no backup uses its damage; `tessera gc"),
            "{what}: {text}"
        );
        if at.is_none() {
            // Even a GC that copies forward only wholly dead containers by
            // utilization takes the one holding damage no backup uses.
            ok(["gc", r, "--threshold", "100"]);
        } else {
            let fixed = run(["repair", r, "--gc"]);
            assert!(fixed.status.success(), "{what}: {fixed:?}");
        }
        assert!(
            !damaged.exists(),
            "{what}: the damaged container is still there"
        );
        assert!(
            ok(["check", r, "--read-data"]).contains("no problems"),
            "{what}"
        );
        let dir = tmp.path().join("r");
        std::fs::create_dir(&dir).unwrap();
        assert!(restored(&repo, id, &dir) == data, "{what}");
        assert!(restored(&repo, id + 1, &dir) == data, "{what}");
    }
}
