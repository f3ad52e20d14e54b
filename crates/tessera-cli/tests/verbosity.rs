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

/// Runs `tessera -q args` with `stdin` and asserts it succeeded silently.
fn quiet_ok(args: &[&str], stdin: std::process::Stdio) {
    let mut quiet = vec!["-q"];
    quiet.extend(args);
    let out = cmd(&quiet)
        .env("TESSERA_TO_PASSWORD", TEST_PASSWORD)
        .stdin(stdin)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "{args:?} is not quiet: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `-q` silences the summary of every command that did what it was asked
/// (init, backup, restore, copy, tag, key, delete, forget); `--json` is a
/// result and stays.
#[test]
fn quiet_silences_every_summary() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let r = repo.to_str().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write_random_file(&src.join("f"), 3, 100_000);
    let file = src.join("f");
    let (s, f) = (src.to_str().unwrap(), file.to_str().unwrap());
    let other = dir.path().join("other");
    let o = other.to_str().unwrap();
    let password = dir.path().join("pw");
    std::fs::write(&password, "second password\n").unwrap();
    let pw = password.to_str().unwrap();
    let out_dir = dir.path().join("restored");
    let out_file = dir.path().join("restored.bin");
    let null = std::process::Stdio::null;
    quiet_ok(&["init", r], null());
    quiet_ok(&["init", o, "--encryption", "none"], null());
    quiet_ok(&["backup", r, s], null());
    // Backup 2: a stream, from standard input.
    quiet_ok(
        &["backup", r, "-"],
        std::fs::File::open(&file).unwrap().into(),
    );
    quiet_ok(&["backup", r, f], null());
    for args in [
        vec!["restore", r, "1", out_dir.to_str().unwrap()],
        vec!["restore", r, "2", out_file.to_str().unwrap()],
        vec!["copy", r, o],
        vec!["tag", r, "1", "--add", "x"],
        vec!["key", "add", r, "--new-password-file", pw],
        vec!["delete", o, "1"],
    ] {
        quiet_ok(&args, null());
    }
    assert_eq!(std::fs::read(&out_file).unwrap().len(), 100_000);
    // A restore to standard output writes the data, and no summary on stderr.
    let out = run(["-q", "restore", r, "2", "-"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    assert_eq!(out.stdout.len(), 100_000);
    quiet_ok(&["forget", r, "--keep-last", "1"], null());
    // JSON is a result: -q leaves it.
    let out = ok(["-q", "backup", r, f, "--json"]);
    serde_json::from_str::<serde_json::Value>(&out).unwrap();
    // Without -q, the summaries are there.
    assert!(ok(["backup", r, f]).contains("committed"));
}
