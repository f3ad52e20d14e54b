//! Deduplication through the command line: a second version of a 100 MiB
//! input with 100 scattered 1 KiB edits stores at most 3% of its size.

mod common;

use common::*;
use rand::{Rng, RngCore};

#[test]
fn scattered_edits_store_at_most_three_percent() {
    const LEN: usize = 100 << 20;
    const EDITS: usize = 100;
    const EDIT: usize = 1024;
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);

    let v1 = random_bytes(100, LEN);
    // One edit per 1/100th of the input, at a random place in it; kinds mixed.
    let mut rng = rng(101);
    let segment = LEN / EDITS;
    let mut edits: Vec<(usize, usize)> = (0..EDITS)
        .map(|i| (i * segment + rng.random_range(0..segment - EDIT), i % 3))
        .collect();
    // Apply from the end so that earlier positions stay valid.
    edits.reverse();
    let mut v2 = v1.clone();
    for &(pos, kind) in &edits {
        let mut new = vec![0u8; EDIT];
        rng.fill_bytes(&mut new);
        match kind {
            0 => v2[pos..pos + EDIT].copy_from_slice(&new),
            1 => {
                v2.splice(pos..pos, new);
            }
            _ => {
                v2.drain(pos..pos + EDIT);
            }
        }
    }
    assert_ne!(v1, v2);

    let input = tmp.path().join("input");
    std::fs::write(&input, &v1).unwrap();
    let first = backup_json(&repo, &input);
    assert_eq!(num(&first, "logical_bytes"), LEN as u64);
    assert_eq!(num(&first, "stored_bytes"), LEN as u64);

    std::fs::write(&input, &v2).unwrap();
    let second = backup_json(&repo, &input);
    let logical = num(&second, "logical_bytes");
    let stored = num(&second, "stored_bytes");
    assert_eq!(logical, v2.len() as u64);
    eprintln!(
        "second version: {stored} of {logical} bytes stored ({:.2}%)",
        stored as f64 * 100.0 / logical as f64
    );
    assert!(stored > 0, "the edits must be stored");
    assert!(
        stored * 100 <= logical * 3,
        "second version stored {stored} of {logical} bytes ({:.2}%), more than 3%",
        stored as f64 * 100.0 / logical as f64
    );
    // What was not stored again is counted as duplicate of the first version.
    assert_eq!(
        second["duplicates"]["bytes"].as_u64().unwrap()
            + second["internal_duplicates"]["bytes"].as_u64().unwrap()
            + stored,
        logical
    );

    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    drop(v1);
    let path = restore_to_file(&repo, num(&second, "id"), &out_dir);
    assert_file_eq(&path, &v2);
    std::fs::remove_file(&path).unwrap();
    assert_restore_stdout_matches(&repo, "1", &mut PrngReader::new(100, LEN as u64));
    let report = ok(["check".as_ref(), repo.as_os_str(), "--read-data".as_ref()]);
    assert!(report.contains("no problems"), "{report}");
}
