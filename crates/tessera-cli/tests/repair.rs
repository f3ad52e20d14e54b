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
    ok([
        "init",
        repo.to_str().unwrap(),
        "--encryption",
        "none",
        "--layout",
        layout,
        "--container-size",
        "256KiB",
    ]);
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
