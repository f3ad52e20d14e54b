//! Damage is always detected and never spreads (issue 20, detection half):
//! one flipped, emptied or deleted object in a small repository of four
//! backups, in both layouts, is reported by `check` with the object, what
//! is wrong and the backups it affects; derived objects are rebuilt and
//! never block a backup, a restore or `list`.

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// Lineage directory name of the default source (`s` + hex of "default").
const LINEAGE: &str = "s64656661756c74";

struct Repo {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    repo: PathBuf,
    data: Vec<Vec<u8>>,
}

/// Four backups of an evolving 400 KB file, in `layout` (with `extra` init options).
fn four_backups(layout: &str, extra: &[&str]) -> Repo {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let repo = dir.join("repo");
    let mut args = vec![
        "init".to_string(),
        repo.display().to_string(),
        "--layout".into(),
        layout.into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    ok(&args);
    let mut data = Vec::new();
    let mut cur = random_bytes(1, 400_000);
    let input = dir.join("input");
    for i in 0..4u8 {
        cur[i as usize * 50_000..i as usize * 50_000 + 20_000].fill(i + 1);
        std::fs::write(&input, &cur).unwrap();
        backup_json(&repo, &input);
        data.push(cur.clone());
    }
    Repo {
        _tmp: tmp,
        dir,
        repo,
        data,
    }
}

impl Repo {
    /// The name of the largest container (the one holding most chunks).
    fn biggest_container(&self) -> String {
        containers(&self.repo)
            .into_iter()
            .max_by_key(|c| {
                std::fs::metadata(self.path(&format!("containers/{c}")))
                    .unwrap()
                    .len()
            })
            .unwrap()
    }

    fn path(&self, key: &str) -> PathBuf {
        self.repo.join(key)
    }

    fn flip(&self, key: &str) {
        let p = self.path(key);
        let mut b = std::fs::read(&p).unwrap();
        let at = b.len() / 2;
        b[at] ^= 0x20;
        std::fs::write(&p, b).unwrap();
    }

    fn remove(&self, key: &str) {
        std::fs::remove_file(self.path(key)).unwrap();
    }

    /// `check --json` (optionally `--read-data`): the problems.
    fn problems(&self, read_data: bool) -> Vec<serde_json::Value> {
        let mut args = vec!["check", "--json"];
        if read_data {
            args.push("--read-data");
        }
        let mut args: Vec<String> = args.into_iter().map(String::from).collect();
        args.insert(1, self.repo.display().to_string());
        let out = run(&args);
        assert_no_panic(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let problems = v["problems"].as_array().unwrap().clone();
        assert_eq!(out.status.success(), problems.is_empty(), "{v}");
        problems
    }

    /// The one problem naming `object`.
    fn problem(&self, read_data: bool, object: &str) -> serde_json::Value {
        let problems = self.problems(read_data);
        let found: Vec<_> = problems.iter().filter(|p| p["object"] == object).collect();
        assert_eq!(
            found.len(),
            1,
            "no single problem for {object}: {problems:?}"
        );
        found[0].clone()
    }

    fn backup(&self, seed: u64) -> u64 {
        let input = self.dir.join("input-new");
        std::fs::write(&input, random_bytes(seed, 100_000)).unwrap();
        num(&backup_json(&self.repo, &input), "id")
    }

    fn assert_restores(&self, id: u64) {
        let out = self.dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let path = restore_to_file(&self.repo, id, &out);
        assert_file_eq(&path, &self.data[id as usize - 1]);
    }

    fn restore_error(&self, id: u64) -> String {
        let out = self.dir.join(format!("out-fail-{id}"));
        fail([
            "restore".as_ref(),
            self.repo.as_os_str(),
            id.to_string().as_ref(),
            out.as_os_str(),
        ])
    }
}

fn affected(p: &serde_json::Value) -> Vec<u64> {
    p["affected_backups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

fn snap(id: u64) -> String {
    format!("snapshots/{id:016x}")
}

fn list_json(repo: &Path) -> Vec<serde_json::Value> {
    let out = ok(["list".as_ref(), "--json".as_ref(), repo.as_os_str()]);
    serde_json::from_str::<serde_json::Value>(out.trim())
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// F1: a damaged snapshot of the lifecycle layout is found by `check`
/// with and without `--read-data`, affecting only its backup.
#[test]
fn lifecycle_check_verifies_snapshots() {
    let r = four_backups("lifecycle", &[]);
    r.flip(&snap(2));
    for read_data in [false, true] {
        let p = r.problem(read_data, &snap(2));
        assert_eq!(p["kind"], "damaged");
        assert_eq!(affected(&p), vec![2]);
    }
}

/// F8: one damaged snapshot does not stop `list` (both layouts): it is
/// listed as damaged, the others normally; a damaged config stops it with
/// a message saying what to do.
#[test]
fn list_shows_damaged_snapshots_and_explains_a_damaged_config() {
    for layout in ["container", "lifecycle"] {
        let r = four_backups(layout, &[]);
        r.flip(&snap(3));
        let listed = list_json(&r.repo);
        assert_eq!(listed.len(), 4, "{layout}: {listed:?}");
        assert!(listed[2]["damaged"].as_str().unwrap().contains(&snap(3)));
        for i in [0, 1, 3] {
            assert!(listed[i]["damaged"].is_null() && listed[i]["source"] == "default");
        }
        let table = ok(["list".as_ref(), r.repo.as_os_str()]);
        assert!(table.contains("DAMAGED"), "{table}");
        r.assert_restores(4);

        r.flip("config");
        let e = fail(["list".as_ref(), r.repo.as_os_str()]);
        assert!(
            e.contains("configuration is damaged") && e.contains("copy"),
            "{e}"
        );
    }
}

/// F2: a deleted snapshot (both layouts) is reported as recoverable, and
/// neither `gc` nor the deletion of another backup drops its data; a
/// deleted backup's commit mark goes with it; an interrupted backup's
/// recipe (no mark, no snapshot) stays garbage.
#[test]
fn deleted_snapshot_is_noticed_and_its_data_kept() {
    for layout in ["container", "lifecycle"] {
        let r = four_backups(layout, &[]);
        r.remove(&snap(2));
        let p = r.problem(false, &snap(2));
        assert_eq!(p["kind"], "snapshot_missing", "{layout}");
        assert_eq!(affected(&p), vec![2]);
        assert!(p["detail"].as_str().unwrap().contains("recipe intact"));
        let listed = list_json(&r.repo);
        assert!(listed[1]["damaged"]
            .as_str()
            .unwrap()
            .contains("snapshot missing"));

        ok(["delete".as_ref(), r.repo.as_os_str(), "1".as_ref()]);
        assert!(!r.path("commits/0000000000000001").exists(), "{layout}");
        if layout == "container" {
            ok(["gc".as_ref(), r.repo.as_os_str()]);
        }
        assert!(r.path("recipes/0000000000000002").exists(), "{layout}");
        // Backup 2's data is still all there: only its snapshot is missing.
        let problems = r.problems(true);
        assert_eq!(problems.len(), 1, "{layout}: {problems:?}");
        assert_eq!(problems[0]["object"], snap(2));

        // An interrupted backup: a recipe without snapshot and mark.
        r.remove(&snap(4));
        r.remove("commits/0000000000000004");
        if layout == "container" {
            ok(["gc".as_ref(), r.repo.as_os_str()]);
            assert!(!r.path("recipes/0000000000000004").exists());
        }
        assert!(r.problems(false).iter().all(|p| p["object"] != snap(4)));
    }
}

/// F4: a missing category part is named by its key, not as a container.
#[test]
fn missing_category_part_is_named() {
    let r = four_backups("lifecycle", &["--arrange", "manual"]);
    let key = format!("lifecycle/{LINEAGE}/cat/{:016x}-{:016x}-00000000", 3, 3);
    r.remove(&key);
    let p = r.problem(false, &key);
    assert_eq!(p["kind"], "missing");
    assert!(affected(&p).contains(&3), "{p}");
    let out = run(["check".as_ref(), r.repo.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("container 0000000000000000"), "{text}");
    let e = r.restore_error(3);
    assert!(!e.contains("container 0000000000000000"), "{e}");
    assert!(e.contains(&format!("lifecycle/{LINEAGE}")), "{e}");
    r.assert_restores(2);
}

/// F5: one damaged copy of a lineage state loses nothing: every backup
/// restores, new backups work, and check reports it as derived data.
#[test]
fn damaged_lineage_state_is_survived() {
    let r = four_backups("lifecycle", &[]);
    let key = format!("lifecycle/state/{LINEAGE}");
    r.flip(&key);
    let p = r.problem(false, &key);
    assert_eq!(p["kind"], "derived");
    assert!(affected(&p).is_empty());
    for id in 1..=4 {
        r.assert_restores(id);
    }
    assert_eq!(r.backup(9), 5);
    assert!(
        r.problems(true).is_empty(),
        "the next backup rewrote both copies"
    );
}

/// F6: a damaged newest NDF table does not block the next backup, and a
/// deleted one (manual arranging) neither blocks `arrange`; both are reported.
#[test]
fn ndf_tables_are_rebuilt() {
    let r = four_backups("lifecycle", &[]);
    let key = format!("lifecycle/{LINEAGE}/ndf/{:016x}", 4);
    r.flip(&key);
    let p = r.problem(false, &key);
    assert_eq!(p["kind"], "derived");
    let out = run(["check".as_ref(), r.repo.as_os_str()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("rebuilt"));
    assert_eq!(r.backup(9), 5);
    assert!(r.problems(true).is_empty());

    let r = four_backups("lifecycle", &["--arrange", "manual"]);
    let key = format!("lifecycle/{LINEAGE}/ndf/{:016x}", 2);
    r.remove(&key);
    assert_eq!(r.problem(false, &key)["kind"], "derived");
    ok(["arrange".as_ref(), r.repo.as_os_str()]);
    for id in 1..=4 {
        r.assert_restores(id);
    }
    assert!(r.problems(true).is_empty());
}

/// F7: a damaged `state` blocks neither backups nor `index rebuild`, ids
/// are not reused, and check reports it.
#[test]
fn damaged_state_is_recomputed() {
    let r = four_backups("container", &[]);
    ok(["delete".as_ref(), r.repo.as_os_str(), "4".as_ref()]);
    assert!(r.path("state").exists());
    r.flip("state");
    assert_eq!(r.problem(true, "state")["kind"], "derived");
    ok(["index".as_ref(), "rebuild".as_ref(), r.repo.as_os_str()]);
    assert_eq!(r.backup(9), 5, "backup 4's id is not reused");
    for id in 1..=3 {
        r.assert_restores(id);
    }
}

/// F3: after a container is damaged, `check --read-data` quarantines it,
/// so the next backup of the same data stores its chunks again (it
/// restores, instead of deduplicating against the damaged copy), and
/// `repair` then re-points the older backup to the new copies.
#[test]
fn damaged_container_is_quarantined_and_not_deduplicated_against() {
    let r = four_backups("container", &[]);
    let biggest = r.biggest_container();
    let key = format!("containers/{biggest}");
    r.flip(&key);
    let p = r.problem(true, &key);
    assert!(affected(&p).contains(&4), "{p}");
    assert!(r.path(&format!("quarantine/{biggest}")).exists());
    let id = num(&backup_json(&r.repo, &r.dir.join("input")), "id");
    let out = r.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    assert_file_eq(&restore_to_file(&r.repo, id, &out), &r.data[3]);
    // Older backups may keep holes where their own data is gone (exit 3).
    let o = run(["repair".as_ref(), r.repo.as_os_str()]);
    assert!(matches!(o.status.code(), Some(0) | Some(3)), "{o:?}");
    r.assert_restores(4);
}

/// Offset in `hay` of the first 64-byte window of `data` (taken every 4 KiB)
/// that `hay` holds verbatim.
fn find_window(hay: &[u8], data: &[u8]) -> Option<usize> {
    (0..data.len().saturating_sub(64))
        .step_by(4096)
        .find_map(|o| {
            let needle = &data[o..o + 64];
            hay.windows(64).position(|w| w == needle)
        })
}

/// Damage never spreads, whatever the index (issue 20 point 3): one chunk
/// of a container is damaged. A plain restore of the backup fails, naming
/// the container, and quarantines that chunk alone; the next backup of the
/// same data — without `check` or `repair` — stores that chunk again while
/// deduplicating its intact neighbours, although the DDFS-family indexes
/// load the container's metadata into their locality cache for them, and
/// restores while the damaged copy is still there. After `check
/// --read-data` (which quarantines the whole container) and `repair`, one
/// more backup restores too, and so does the first one (re-pointed).
#[test]
fn quarantined_chunk_is_stored_again_whatever_the_index() {
    for index in ["exact", "ddfs", "lazy", "hid", "ehid", "eager"] {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        init_with(
            &repo,
            &[
                "--encryption",
                "none",
                "--compression",
                "off",
                "--index",
                index,
                "--container-size",
                "256KiB",
            ],
        );
        let data = random_bytes(21, 1_000_000);
        let input = tmp.path().join("input");
        std::fs::write(&input, &data).unwrap();
        backup_json(&repo, &input);
        let name = containers(&repo).into_iter().nth(1).unwrap();
        let key = format!("containers/{name}");
        let path = repo.join(&key);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = find_window(&bytes, &data).expect("chunk bytes stored verbatim");
        bytes[at + 32] ^= 0x5a;
        std::fs::write(&path, bytes).unwrap();
        let out = tmp.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let e = fail([
            "restore".as_ref(),
            repo.as_os_str(),
            "1".as_ref(),
            out.join("failed").as_os_str(),
        ]);
        assert!(e.contains(&name), "{index}: {e}");
        assert!(!out.join("failed").exists(), "{index}");
        assert!(repo.join(format!("quarantine/{name}")).exists(), "{index}");
        let b = backup_json(&repo, &input);
        assert_eq!(num(&b, "unique_chunks"), 1, "{index}: {b}");
        let mut new = vec![num(&b, "id")];
        assert_file_eq(&restore_to_file(&repo, new[0], &out), &data);
        let o = run(["check", "--read-data", "--json", repo.to_str().unwrap()]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let named = v["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["object"] == key.as_str());
        assert!(named, "{index}: {v}");
        let o = run(["repair", "--json", repo.to_str().unwrap()]);
        assert!(
            matches!(o.status.code(), Some(0) | Some(3)),
            "{index}: {o:?}"
        );
        new.push(num(&backup_json(&repo, &input), "id"));
        let o = run(["repair", "--json", repo.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{index}: {o:?}");
        assert!(path.exists(), "the damaged container is still there");
        for id in [1].into_iter().chain(new) {
            assert_file_eq(&restore_to_file(&repo, id, &out), &data);
        }
    }
}

/// Issue 20 point 3, encrypted repository: a damaged container fails the
/// restore, which names it and quarantines it (its authentication fails as
/// a whole); the next backup of the same data, without `check` or
/// `repair`, stores its chunks again and restores.
#[test]
fn a_failed_restore_quarantines_what_it_found() {
    let r = four_backups("container", &[]);
    let biggest = r.biggest_container();
    r.flip(&format!("containers/{biggest}"));
    let e = r.restore_error(4);
    assert!(e.contains(&biggest), "{e}");
    assert!(r.path(&format!("quarantine/{biggest}")).exists());
    let id = num(&backup_json(&r.repo, &r.dir.join("input")), "id");
    let out = r.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    assert_file_eq(&restore_to_file(&r.repo, id, &out), &r.data[3]);
}

/// The index objects of `r` whose file name starts with `first` (`t`
/// table parts, `b` Bloom filters, `l` metadata log segments).
fn index_objects(r: &Repo, first: char) -> Vec<String> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(r.path("index")).unwrap() {
        let dir = dir.unwrap();
        if !dir.file_type().unwrap().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(dir.path()).unwrap() {
            let name = f.unwrap().file_name().to_string_lossy().into_owned();
            if name.starts_with(first) {
                out.push(format!(
                    "index/{}/{name}",
                    dir.file_name().to_string_lossy()
                ));
            }
        }
    }
    out.sort();
    out
}

/// Issue 20 point 1: `check` verifies the index's table parts, Bloom
/// filters and metadata log segments; a damaged or deleted one is reported
/// as derived data naming it, blocks neither backups nor restores, and
/// `repair` rebuilds the index, after which `check` is clean.
#[test]
fn index_objects_are_checked_and_rebuilt_by_repair() {
    for (index, kinds) in [("ddfs", "tb"), ("ehid", "tb"), ("lazy", "tbl")] {
        let r = four_backups("container", &["--index", index]);
        for first in kinds.chars() {
            for delete in [false, true] {
                // The newest object of the kind: backups beside other
                // backups leave older DDFS runs for gc (FORMAT.md §13.3),
                // which no longer belong to the index.
                let mut objects = index_objects(&r, first);
                objects.sort();
                let key = objects
                    .pop()
                    .unwrap_or_else(|| panic!("{index}: no index object {first}*"));
                if delete {
                    r.remove(&key);
                } else {
                    r.flip(&key);
                }
                let p = r.problem(false, &key);
                assert_eq!(p["kind"], "derived", "{index} {key}: {p}");
                assert!(affected(&p).is_empty());
                assert!(p["detail"].as_str().unwrap().contains("repair"), "{p}");
                let o = run(["repair".as_ref(), "--json".as_ref(), r.repo.as_os_str()]);
                assert_eq!(o.status.code(), Some(0), "{index} {key}: {o:?}");
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                assert_eq!(v["actions"][0]["kind"], "index_rebuilt", "{v}");
                assert!(r.problems(true).is_empty(), "{index} {key}");
            }
        }
        // Damage that a backup meets is rebuilt by it too.
        let mut blooms = index_objects(&r, 'b');
        blooms.sort();
        let key = blooms.pop().unwrap();
        r.flip(&key);
        assert_eq!(r.backup(9), 5);
        if index == "ddfs" {
            backup_meets_a_damaged_shared_table(&r);
        }
        for id in 1..=4 {
            r.assert_restores(id);
        }
    }
}

/// A backup into a repository whose DDFS table backups share (FORMAT.md
/// §13.3) that meets the table damaged (every part gone) succeeds: it
/// looks chunks up in a table rebuilt in memory (so data stored before is
/// stored once), says once on standard error that the index is left for
/// `repair`, and leaves the index objects as they were; `repair` then
/// rebuilds it and the next backup says nothing.
fn backup_meets_a_damaged_shared_table(r: &Repo) {
    for key in index_objects(r, 't') {
        r.remove(&key);
    }
    let before = index_objects(r, 'b');
    let input = r.dir.join("input-again");
    std::fs::write(&input, &r.data[3]).unwrap();
    let args = |json: bool| {
        let mut a: Vec<std::ffi::OsString> =
            vec!["backup".into(), r.repo.clone().into_os_string(), "-".into()];
        if json {
            a.push("--json".into());
        }
        a
    };
    let o = run_with_input(args(true), &input);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("damaged")).collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(notes[0].contains("tessera repair"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(num(&v, "id"), 6);
    assert_eq!(v["unique"]["chunks"], 0, "{v}");
    assert_eq!(v["index"]["damaged_left"], true, "{v}");
    assert_eq!(index_objects(r, 'b'), before);
    let o = run(["repair".as_ref(), "--json".as_ref(), r.repo.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["actions"][0]["kind"], "index_rebuilt", "{v}");
    let o = run_with_input(args(false), &input);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("damaged"),
        "{o:?}"
    );
    assert!(r.problems(true).is_empty());
}
