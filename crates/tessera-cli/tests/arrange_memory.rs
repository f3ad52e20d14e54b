//! `--sort-memory` of `tessera arrange`, of backups that arrange and of
//! `check` of a lifecycle repository: a budget too small for a single run
//! spills every sort and arranges (checks) exactly as the default budget
//! does.

mod common;
use common::*;
use std::path::Path;

/// `tessera arrange --json REPO ARGS…`, without its I/O and time.
fn arrange(repo: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["arrange", repo.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let mut v: serde_json::Value = serde_json::from_str(ok(all).trim()).unwrap();
    for field in ["bytes_read", "bytes_written", "seconds"] {
        v.as_object_mut().unwrap().remove(field);
    }
    v
}

#[test]
fn arranging_with_a_tiny_sort_memory_arranges_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let repo = |name: &str, when: &str| {
        let r = dir.path().join(name);
        let s = r.to_str().unwrap().to_string();
        ok(["init", &s, "--layout", "lifecycle", "--arrange", when]);
        r
    };
    let (manual, auto) = (repo("manual", "manual"), repo("auto", "auto"));
    let mut data = random_bytes(1, 400_000);
    let mut rng = rng(2);
    let mut inputs = Vec::new();
    for v in 0..4 {
        random_edit(&mut rng, &mut data, 20_000);
        let input = dir.path().join(format!("v{v}"));
        std::fs::write(&input, &data).unwrap();
        ok_with_input(
            ["backup".as_ref(), manual.as_os_str(), "-".as_ref()],
            &input,
        );
        let out = ok_with_input(
            [
                "backup".as_ref(),
                auto.as_os_str(),
                "-".as_ref(),
                "--sort-memory".as_ref(),
                "1KiB".as_ref(),
                "--json".as_ref(),
            ],
            &input,
        );
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert!(v["arrange"].is_object(), "{v}");
        inputs.push(input);
    }
    let copy = dir.path().join("manual-copy");
    std::fs::create_dir(&copy).unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(manual.join("."))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let spilled = arrange(&manual, &["--sort-memory", "0"]);
    assert_eq!(spilled, arrange(&copy, &[]));
    assert_eq!(num(&spilled, "rounds"), 4);
    assert!(num(&spilled, "chunks_archived") > 0, "{spilled}");
    for r in [&manual, &copy, &auto] {
        for (id, input) in (1..).zip(&inputs) {
            let out = restore_to_file(r, id, dir.path());
            assert_file_eq(&out, &std::fs::read(input).unwrap());
        }
        assert!(ok(["check".as_ref(), r.as_os_str()]).contains("no problems"));
        // `check` of the lifecycle layout, every sort spilled, reports the same.
        let check = |args: &[&str]| {
            let mut all = vec!["check", r.to_str().unwrap(), "--json"];
            all.extend_from_slice(args);
            ok(all)
        };
        assert_eq!(check(&["--sort-memory", "0"]), check(&[]));
    }
}
