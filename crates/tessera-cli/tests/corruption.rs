//! Corruption through the command line: a flipped byte in a container is
//! reported by `check --read-data` with the container and the backups that
//! use it; restoring an affected backup fails cleanly without output and
//! never yields wrong bytes; unaffected backups still restore.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tessera::layout::container::{HEADER_LEN, META_ENTRY_LEN};

/// A repository with three backups: 1 = A, 2 = B (unrelated to A), 3 = A
/// edited (shares most chunks with A). Returns the containers each backup
/// created.
struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    repo: PathBuf,
    data: Vec<Vec<u8>>,
    created: Vec<BTreeSet<String>>,
}

fn fixture() -> Fixture {
    fixture_made_by(init)
}

/// The fixture in a repository that `make` creates.
fn fixture_made_by(make: fn(&Path)) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let repo = dir.join("repo");
    make(&repo);
    let a = random_bytes(11, 6 << 20);
    let b = random_bytes(12, 6 << 20);
    let mut c = a.clone();
    c[3 << 20..(3 << 20) + 1000].fill(0xee);
    c.extend_from_slice(&random_bytes(13, 100_000));
    let input = dir.join("input");
    let mut created: Vec<BTreeSet<String>> = Vec::new();
    for (i, data) in [&a, &b, &c].into_iter().enumerate() {
        let before = containers(&repo);
        std::fs::write(&input, data).unwrap();
        let r = backup_json(&repo, &input);
        assert_eq!(num(&r, "id"), i as u64 + 1);
        created.push(containers(&repo).difference(&before).cloned().collect());
    }
    assert!(created[0].len() >= 2, "A fills more than one container");
    Fixture {
        _tmp: tmp,
        dir,
        repo,
        data: vec![a, b, c],
        created,
    }
}

/// Parses `(affects backups: 1, 3)` from the check line naming `object`.
fn affected(check_stdout: &str, object: &str) -> BTreeSet<u64> {
    let line = check_stdout
        .lines()
        .find(|l| l.contains(object))
        .unwrap_or_else(|| panic!("check output does not name {object}: {check_stdout}"));
    let list = line
        .split("affects backups: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no affected backups in {line:?}"))
        .trim_end_matches(')');
    list.split(", ").map(|s| s.parse().unwrap()).collect()
}

fn check_json(repo: &Path) -> serde_json::Value {
    let out = run([
        "check".as_ref(),
        repo.as_os_str(),
        "--read-data".as_ref(),
        "--json".as_ref(),
    ]);
    assert!(
        !out.status.success(),
        "check --json must fail on a damaged repository"
    );
    assert_no_panic(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Restoring an affected backup: one-line error, non-zero exit, no output
/// file (nor partial file) left; to stdout, only a correct prefix.
fn assert_restore_fails_cleanly(f: &Fixture, id: u64, container: &str) {
    let out_dir = f.dir.join(format!("out-fail-{id}"));
    std::fs::create_dir(&out_dir).unwrap();
    let out_file = out_dir.join("restored");
    let args: Vec<String> = vec![
        "restore".into(),
        f.repo.display().to_string(),
        id.to_string(),
        out_file.display().to_string(),
    ];
    let out = run(&args);
    let line = assert_one_line_error(&args, &out);
    assert!(
        line.contains(container),
        "error does not name {container}: {line}"
    );
    assert!(
        !out_file.exists(),
        "a failed restore left {}",
        out_file.display()
    );
    assert!(
        dir_names(&out_dir).is_empty(),
        "leftovers: {:?}",
        dir_names(&out_dir)
    );

    let id_text = id.to_string();
    let out = cmd([
        "restore".as_ref(),
        f.repo.as_os_str(),
        id_text.as_ref(),
        "-".as_ref(),
    ])
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let args: Vec<String> = vec!["restore".into(), "...".into(), id.to_string(), "-".into()];
    assert_one_line_error(&args, &out);
    let expected = &f.data[id as usize - 1];
    assert!(
        out.stdout.len() < expected.len(),
        "a failed restore wrote everything"
    );
    assert!(
        expected.starts_with(&out.stdout),
        "restore to stdout wrote bytes that are not the backup's ({} bytes)",
        out.stdout.len()
    );
}

fn assert_restores(f: &Fixture, id: u64) {
    let out_dir = f.dir.join(format!("out-ok-{id}"));
    std::fs::create_dir_all(&out_dir).unwrap();
    let path = restore_to_file(&f.repo, id, &out_dir);
    assert_file_eq(&path, &f.data[id as usize - 1]);
    assert_restore_stdout_matches(&f.repo, &id.to_string(), &mut &f.data[id as usize - 1][..]);
}

/// The first container written by backup A.
fn target(f: &Fixture) -> (String, PathBuf) {
    let name = f.created[0].iter().next().unwrap().clone();
    // Backup C (an edit of A) reuses it, backup B does not.
    assert!(!f.created[2].contains(&name));
    let path = f.repo.join("containers").join(&name);
    (format!("containers/{name}"), path)
}

#[test]
fn flipped_byte_in_container_is_reported_and_contained() {
    let f = fixture();
    for id in 1..=3 {
        assert_restores(&f, id);
    }
    ok(["check".as_ref(), f.repo.as_os_str(), "--read-data".as_ref()]);

    let (object, path) = target(&f);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();

    let stdout = failed_check(&f);
    assert_eq!(
        affected(&stdout, &object),
        BTreeSet::from([1, 3]),
        "{stdout}"
    );
    for line in stdout.lines().filter(|l| l.starts_with("problem")) {
        assert!(
            line.contains(&object),
            "only the damaged container is reported: {stdout}"
        );
    }

    let report = check_json(&f.repo);
    let problems = report["problems"].as_array().unwrap();
    assert!(!problems.is_empty());
    for p in problems {
        assert_eq!(p["object"], object.as_str(), "{report}");
        let users: Vec<u64> = p["affected_backups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(users, vec![1, 3], "{report}");
    }

    assert_restore_fails_cleanly(&f, 1, &object);
    assert_restore_fails_cleanly(&f, 3, &object);
    assert_restores(&f, 2);
}

/// The report of a `check --read-data` of the fixture's repository, which
/// fails with a one-line error.
fn failed_check(f: &Fixture) -> String {
    let args = vec![
        "check".to_string(),
        f.repo.display().to_string(),
        "--read-data".to_string(),
    ];
    let out = run(&args);
    assert_one_line_error(&args, &out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// CRC-32C (Castagnoli), bitwise; enough for a few MiB in a test.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Corruption the container checksums cannot see (the data checksum is
/// recomputed after the flip): the per-chunk fingerprint verification must
/// still refuse to restore wrong bytes, and `check --read-data` must find it.
/// (Unencrypted: in an encrypted repository the same flip fails authentication.)
#[test]
fn corruption_hidden_from_checksums_is_caught_by_fingerprints() {
    let f = fixture_made_by(init_plain);
    let (object, path) = target(&f);
    let mut bytes = std::fs::read(&path).unwrap();
    let le4 = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let chunk_count = le4(&bytes[16..20]) as usize;
    let meta_end = HEADER_LEN + chunk_count * META_ENTRY_LEN;
    let at = meta_end + (bytes.len() - meta_end) / 2;
    bytes[at] ^= 0x80;
    let data_crc = crc32c(&bytes[meta_end..]);
    assert_eq!(
        le4(&bytes[36..40]),
        crc32c(&bytes[..36]),
        "header layout as expected"
    );
    bytes[28..32].copy_from_slice(&data_crc.to_le_bytes());
    let header_crc = crc32c(&bytes[..36]);
    bytes[36..40].copy_from_slice(&header_crc.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();

    let stdout = failed_check(&f);
    let users = affected(&stdout, &object);
    assert!(
        !users.is_empty() && users.is_subset(&BTreeSet::from([1, 3])),
        "{stdout}"
    );
    assert!(
        users.contains(&1),
        "backup A holds every chunk of its container: {stdout}"
    );

    // The error names the container by its id (`container <hex>`).
    let hex = object.trim_start_matches("containers/");
    for &id in &users {
        assert_restore_fails_cleanly(&f, id, hex);
    }
    assert_restores(&f, 2);
}
