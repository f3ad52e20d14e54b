//! `tessera stats`: the ratios describe what is stored, so a repository
//! after `forget --prune` and a copy of the backups it kept agree.

mod common;
use common::*;
use std::path::Path;

/// `len` bytes of text-like data (words of a small vocabulary): compressible.
fn text(seed: u64, len: usize) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "tessera ",
        "backup ",
        "chunk ",
        "container ",
        "restore ",
        "index ",
        "the ",
        "of ",
        "repository ",
        "deduplication ",
        "recipe ",
        "snapshot\n",
    ];
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(WORDS[(x % WORDS.len() as u64) as usize].as_bytes());
        if x.is_multiple_of(7) {
            out.extend_from_slice(format!("{} ", x % 100_000).as_bytes());
        }
    }
    out.truncate(len);
    out
}

fn stats_json(repo: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(["stats".as_ref(), repo.as_os_str(), "--json".as_ref()])).unwrap()
}

fn ratio(v: &serde_json::Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("no {field}: {v}"))
}

#[test]
fn ratios_after_forget_and_prune_are_those_of_a_copy() {
    for layout in ["container", "lifecycle"] {
        let dir = tempfile::tempdir().unwrap();
        let (repo, copy) = (dir.path().join("repo"), dir.path().join("copy"));
        // Without compression dictionaries: a copy trains its own, so the
        // same chunks would compress (slightly) differently there, and this
        // test is about what stats counts, not about the compressor.
        for r in [&repo, &copy] {
            init_with(r, &["--layout", layout, "--compression-dictionary", "off"]);
        }
        // The first backup stores compressible text; the second keeps it
        // and adds incompressible bytes, all it stores itself.
        let input = dir.path().join("input");
        let first = text(1, 3_000_000);
        std::fs::write(&input, &first).unwrap();
        backup_json(&repo, &input);
        let mut second = first.clone();
        second.extend_from_slice(&random_bytes(2, 400_000));
        std::fs::write(&input, &second).unwrap();
        backup_json(&repo, &input);
        let r = repo.to_str().unwrap();
        ok(["forget", r, "--keep-last", "1", "--prune"]);
        assert_eq!(list_ids(&repo).len(), 1, "{layout}");
        let copied = cmd(["copy", r, copy.to_str().unwrap()])
            .env("TESSERA_TO_PASSWORD", TEST_PASSWORD)
            .output()
            .unwrap();
        assert!(copied.status.success(), "{layout}: {copied:?}");
        let (kept, copied) = (stats_json(&repo), stats_json(&copy));
        assert_eq!(kept["logical_bytes"], copied["logical_bytes"]);
        let (c_kept, c_copy) = (
            ratio(&kept, "compression_ratio"),
            ratio(&copied, "compression_ratio"),
        );
        assert!(
            (c_kept - c_copy).abs() < 1e-9 * c_copy,
            "{layout}: compression {c_kept} after forget, {c_copy} in a copy"
        );
        // The text compresses: well above what the second backup's own
        // (incompressible) chunks would say.
        assert!(c_kept > 2.0, "{layout}: compression {c_kept}");
        let (d_kept, d_copy) = (ratio(&kept, "dedup_ratio"), ratio(&copied, "dedup_ratio"));
        assert!(
            (d_kept - d_copy).abs() < 0.05 * d_copy,
            "{layout}: dedup {d_kept} after forget, {d_copy} in a copy"
        );
        // The product is the total ratio.
        let total = ratio(&kept, "total_ratio");
        assert!((c_kept * d_kept - total).abs() < 1e-9 * total, "{kept}");
    }
}
