//! `--quiet` and `--verbose`, and the cleanliness of `--json` output of
//! the commands that report progress (check, gc, prune, arrange, repair).

mod common;
use common::*;
use std::path::Path;

/// A repository with two backups, one of them deleted (GC has work).
fn repo_with_garbage(dir: &Path, layout: &str) -> String {
    let repo = dir.join(format!("r-{layout}"));
    let r = repo.to_str().unwrap().to_string();
    ok(["init", &r, "--layout", layout]);
    for seed in [1, 2] {
        let input = dir.join(format!("in{seed}"));
        write_random_file(&input, seed, 300_000);
        ok(["backup", &r, input.to_str().unwrap()]);
    }
    ok(["delete", &r, "1"]);
    r
}

#[test]
fn json_stays_clean_and_verbose_times_phases_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let r = repo_with_garbage(dir.path(), "container");
    for args in [
        vec!["-v", "check", &r, "--read-data", "--json"],
        vec!["-v", "prune", &r, "--json"],
        vec!["-v", "gc", &r, "--json"],
        vec!["-v", "repair", &r, "--json"],
    ] {
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        serde_json::from_str::<serde_json::Value>(&stdout)
            .unwrap_or_else(|e| panic!("{args:?}: stdout is not one JSON value ({e}): {stdout}"));
        let stderr = String::from_utf8(out.stderr).unwrap();
        // Standard error is not a terminal here: no bar, only the timings.
        assert!(
            !stderr.is_empty()
                && stderr
                    .lines()
                    .all(|l| l.contains(" in ") && l.ends_with(" s")),
            "{args:?}: {stderr}"
        );
    }
    let l = repo_with_garbage(dir.path(), "lifecycle");
    let out = run(["-v", "arrange", &l, "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
}

#[test]
fn quiet_says_nothing_on_success_and_default_summarizes() {
    let dir = tempfile::tempdir().unwrap();
    let r = repo_with_garbage(dir.path(), "container");
    for cmd in ["check", "gc", "prune", "repair"] {
        let out = run(["-q", cmd, &r]);
        assert!(out.status.success(), "{cmd}: {out:?}");
        assert!(
            out.stdout.is_empty() && out.stderr.is_empty(),
            "{cmd}: {out:?}"
        );
    }
    assert!(ok(["check", &r]).contains("no problems"));
    let line = fail(["-q", "-v", "check", &r]);
    assert!(line.contains("cannot be used with"), "{line}");
}
