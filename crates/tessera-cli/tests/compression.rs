//! Compression of stored chunks (docs/FORMAT.md §7.7): round trips in both
//! layouts and with PFC-delta, incompressible data stored raw, damage
//! detected, the flag and its bad values.

mod common;

use common::*;
use std::path::Path;

/// Text-like bytes: lines of a small vocabulary, different per `seed`.
fn text(seed: u64, len: usize) -> Vec<u8> {
    let words = [
        "static ",
        "int ",
        "return ",
        "struct ",
        "void ",
        "if (x) ",
        "{\n",
        "}\n",
        "buf",
        "len",
        "; ",
        "= ",
        "0",
        "1",
        "// comment\n",
        "#include <stdio.h>\n",
    ];
    let mut out = Vec::with_capacity(len);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(words[(x % words.len() as u64) as usize].as_bytes());
    }
    out.truncate(len);
    out
}

/// Bytes of all files below `dir`.
fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        total += match m.is_dir() {
            true => tree_bytes(&e.path()),
            false => m.len(),
        };
    }
    total
}

/// `backup REPO - --json EXTRA...` of the file `input` on standard input.
fn backup_stats(repo: &Path, input: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "backup".to_string(),
        repo.display().to_string(),
        "-".into(),
        "--json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    serde_json::from_str(&ok_with_input(args, input)).unwrap()
}

#[test]
fn compressed_round_trips_in_both_layouts_and_with_delta() {
    let dir = tempfile::tempdir().unwrap();
    let data = text(1, 3 << 20);
    let input = dir.path().join("in");
    std::fs::write(&input, &data).unwrap();
    let layouts: [&[&str]; 3] = [
        &[],
        &["--layout", "lifecycle"],
        &["--delta", "pfc", "--index", "ddfs", "--rewrite", "capping"],
    ];
    for (n, extra) in layouts.iter().enumerate() {
        let repo = dir.path().join(format!("repo{n}"));
        let mut args = vec!["init".to_string(), repo.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = ok(&args);
        assert!(out.contains("compression auto"), "{out}");
        let v = backup_stats(&repo, &input, &[]);
        let c = &v["compression"];
        assert_eq!(c["setting"], "auto", "{v}");
        let ratio = c["ratio"].as_f64().unwrap();
        assert!(ratio > 2.0, "layout {extra:?}: compression {ratio}");
        // A second, edited version (deltas, adjacent duplicates).
        let mut edited = data.clone();
        edited[1 << 20..(1 << 20) + 100].copy_from_slice(&text(2, 100));
        std::fs::write(&input, &edited).unwrap();
        backup_stats(&repo, &input, &["--compression", "max"]);
        for (id, expected) in [(1, &data), (2, &edited)] {
            let out = restore_to_file(&repo, id, dir.path());
            assert_file_eq(&out, expected);
            std::fs::remove_file(out).unwrap();
        }
        ok(["check", repo.to_str().unwrap(), "--read-data"]);
        let stats = ok(["stats", repo.to_str().unwrap()]);
        assert!(
            stats.contains("encryption aes256gcm, compression auto"),
            "{stats}"
        );
        std::fs::write(&input, &data).unwrap();
    }
}

#[test]
fn gc_copies_compressed_chunks_forward() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    let input = dir.path().join("in");
    std::fs::write(&input, text(3, 2 << 20)).unwrap();
    backup_stats(&repo, &input, &[]);
    let keep = text(4, 2 << 20);
    let mut both = text(3, 2 << 20)[..1 << 20].to_vec();
    both.extend_from_slice(&keep);
    std::fs::write(&input, &both).unwrap();
    backup_stats(&repo, &input, &[]);
    let r = repo.to_str().unwrap();
    ok(["delete", r, "1"]);
    ok(["gc", r, "--threshold", "100"]);
    ok(["check", r, "--read-data"]);
    let out = restore_to_file(&repo, 2, dir.path());
    assert_file_eq(&out, &both);
}

#[test]
fn incompressible_chunks_are_stored_raw() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    write_random_file(&input, 9, 4 << 20);
    let mut sizes = Vec::new();
    for setting in ["auto", "off"] {
        let repo = dir.path().join(setting);
        init_with(&repo, &["--encryption", "none", "--compression", setting]);
        let v = backup_stats(&repo, &input, &[]);
        sizes.push(tree_bytes(&repo.join("containers")));
        if setting == "auto" {
            let c = &v["compression"];
            assert_eq!(num(c, "compressed_chunks"), 0, "{c}");
            let raw = num(c, "raw_chunks");
            // One tag byte per chunk, nothing else.
            assert_eq!(num(c, "bytes_after"), num(c, "bytes_before") + raw);
        }
    }
    let (auto, off) = (sizes[0], sizes[1]);
    assert!(auto >= off && auto <= off + off / 1000, "{auto} vs {off}");
}

#[test]
fn a_flipped_byte_in_a_compressed_chunk_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    // Unencrypted, so that the flip reaches the zstd frame itself.
    init_with(&repo, &["--encryption", "none", "--compression", "default"]);
    let input = dir.path().join("in");
    let data = text(5, 1 << 20);
    std::fs::write(&input, &data).unwrap();
    backup_stats(&repo, &input, &[]);
    let name = containers(&repo).into_iter().next().unwrap();
    let path = repo.join("containers").join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    // A byte in the middle of the data section, then the checksums made to
    // match again: only the decoded bytes can tell.
    let data_start = 4096;
    let at = data_start + (bytes.len() - data_start) / 2;
    bytes[at] ^= 0x55;
    let crc = crc32c::crc32c(&bytes[data_start..]);
    bytes[28..32].copy_from_slice(&crc.to_le_bytes());
    let hcrc = crc32c::crc32c(&bytes[..36]);
    bytes[36..40].copy_from_slice(&hcrc.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let r = repo.to_str().unwrap();
    let check = run(["check", r, "--read-data"]);
    assert!(!check.status.success());
    let text = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(text.contains(&name), "{text}");
    let restore = run(["restore", r, "1", "-"]);
    assert!(!restore.status.success());
    assert_no_panic(&restore);
}

#[test]
fn compression_flag_values_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let r = repo.to_str().unwrap();
    for bad in ["99", "foo", "0"] {
        let e = fail(["init", r, "--compression", bad]);
        assert!(
            e.contains("expected auto, off, fastest, default, max"),
            "{e}"
        );
        assert!(!repo.join("config").exists());
    }
    let e = fail(["init", r, "--trace", "--compression", "auto"]);
    assert!(e.contains("trace repository"), "{e}");
    // A repository created without compression refuses a backup asking for it.
    init_plain(&repo);
    let stats = ok(["stats", r]);
    assert!(
        stats.contains("encryption none, compression off"),
        "{stats}"
    );
    let input = dir.path().join("in");
    std::fs::write(&input, text(6, 10_000)).unwrap();
    let e = fail([
        "backup",
        r,
        input.to_str().unwrap(),
        "--compression",
        "auto",
    ]);
    assert!(e.contains("created without compression"), "{e}");
    let e = fail(["backup", r, input.to_str().unwrap(), "--compression", "foo"]);
    assert!(e.contains("expected auto, off"), "{e}");
    assert!(list_ids(&repo).is_empty());
    ok(["backup", r, input.to_str().unwrap(), "--compression", "off"]);
}
