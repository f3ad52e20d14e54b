//! Encrypted repositories through the command line: where the password
//! comes from, wrong passwords, `tessera key`, and what `stats` says.

mod common;

use common::*;
use std::path::Path;
use std::process::Stdio;

/// Runs `tessera` with `args` and the environment changed by `env`.
fn run_with(args: &[&str], env: &[(&str, Option<&str>)]) -> std::process::Output {
    let mut c = cmd(args);
    for (k, v) in env {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.stdin(Stdio::null()).output().unwrap()
}

fn repo_with_backup(dir: &Path) -> String {
    let repo = dir.join("repo");
    init(&repo);
    let input = dir.join("input");
    std::fs::write(&input, random_bytes(5, 300_000)).unwrap();
    backup_json(&repo, &input);
    repo.to_str().unwrap().to_string()
}

#[test]
fn password_from_file_command_and_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo_with_backup(tmp.path());
    let file = tmp.path().join("pw");
    std::fs::write(&file, format!("{TEST_PASSWORD}\n")).unwrap();
    let no_env = [("TESSERA_PASSWORD", None)];
    let f = file.to_str().unwrap();
    let by_file = run_with(&["list", &r, "--password-file", f], &no_env);
    assert!(by_file.status.success(), "{by_file:?}");
    let by_command = run_with(
        &["list", &r, "--password-command", &format!("cat {f}")],
        &no_env,
    );
    assert!(by_command.status.success(), "{by_command:?}");
    assert!(ok(["list", &r]).contains('1'), "environment");
    // Without any source and without a terminal: a clear one-line error.
    let args: Vec<String> = ["list", &r].map(String::from).to_vec();
    let none = run_with(&["list", &r], &no_env);
    let line = assert_one_line_error(&args, &none);
    assert!(line.contains("TESSERA_PASSWORD"), "{line}");
    let failing = run_with(&["list", &r, "--password-command", "false"], &no_env);
    assert!(assert_one_line_error(&args, &failing).contains("password command"));
}

/// A command, what its error says is missing, the options it names and
/// those it must not name.
type Case<'a> = (&'a [&'a str], &'a str, &'a [&'a str], &'a [&'a str]);

/// Without a password and without a terminal, each command names the
/// options and the variable that give the password it lacks — not those
/// of another password.
#[test]
fn a_missing_password_names_its_own_options() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo_with_backup(tmp.path());
    let to = tmp.path().join("to");
    init(&to);
    let to = to.to_str().unwrap();
    let cases: [Case; 4] = [
        (
            &["list", &r],
            "no repository password",
            &[
                "--password-file FILE",
                "--password-command CMD",
                "TESSERA_PASSWORD",
            ],
            &["--to-", "--new-"],
        ),
        (
            &["key", "add", &r],
            "no new password",
            &["--new-password-file FILE", "TESSERA_NEW_PASSWORD"],
            &["--password-file", "--password-command", "--to-"],
        ),
        (
            &["key", "passwd", &r],
            "no new password",
            &["--new-password-file FILE", "TESSERA_NEW_PASSWORD"],
            &["--password-file", "--password-command", "--to-"],
        ),
        (
            &["copy", &r, to],
            "no destination repository password",
            &[
                "--to-password-file FILE",
                "--to-password-command CMD",
                "TESSERA_TO_PASSWORD",
            ],
            &[" --password-file", " --password-command", "--new-"],
        ),
    ];
    for (args, what, named, not_named) in cases {
        // The repository's own password is there, except for the case of its lack.
        let own = (args[0] != "list").then_some(TEST_PASSWORD);
        let out = run_with(
            args,
            &[("TESSERA_TO_PASSWORD", None), ("TESSERA_PASSWORD", own)],
        );
        let strings: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let line = assert_one_line_error(&strings, &out);
        assert!(line.contains(what), "{args:?}: {line}");
        for option in named {
            assert!(
                line.contains(option),
                "{args:?} does not name {option}: {line}"
            );
        }
        for option in not_named {
            assert!(!line.contains(option), "{args:?} names {option}: {line}");
        }
    }
}

#[test]
fn wrong_password_fails_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo_with_backup(tmp.path());
    for command in [
        vec!["list", &r],
        vec!["restore", &r, "1", "-"],
        vec!["check", &r],
    ] {
        let args: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        let out = run_with(&command, &[("TESSERA_PASSWORD", Some("wrong"))]);
        let line = assert_one_line_error(&args, &out);
        assert!(
            line.contains("wrong password or no key file matches"),
            "{line}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn key_add_passwd_remove_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo_with_backup(tmp.path());
    let keys = |password: &str| -> serde_json::Value {
        let out = run_with(
            &["key", "list", &r, "--json"],
            &[("TESSERA_PASSWORD", Some(password))],
        );
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let first = keys(TEST_PASSWORD)["current"].as_str().unwrap().to_string();
    let added = run_with(
        &["key", "add", &r, "--json"],
        &[("TESSERA_NEW_PASSWORD", Some("second"))],
    );
    assert!(added.status.success(), "{added:?}");
    let added: serde_json::Value = serde_json::from_slice(&added.stdout).unwrap();
    let listed = keys("second");
    assert_eq!(listed["keys"].as_array().unwrap().len(), 2);
    let second = listed["current"].as_str().unwrap().to_string();
    assert_eq!(added["added"], second.as_str());
    assert_ne!(first, second);
    // passwd replaces the key used to open.
    let pw = tmp.path().join("new");
    std::fs::write(&pw, "third\n").unwrap();
    let changed = run_with(
        &[
            "key",
            "passwd",
            &r,
            "--new-password-file",
            pw.to_str().unwrap(),
            "--json",
        ],
        &[("TESSERA_PASSWORD", Some("second"))],
    );
    assert!(changed.status.success(), "{changed:?}");
    let changed: serde_json::Value = serde_json::from_slice(&changed.stdout).unwrap();
    assert_eq!(changed["replaced"], second.as_str());
    let after = run_with(&["list", &r], &[("TESSERA_PASSWORD", Some("second"))]);
    assert!(!after.status.success());
    assert_eq!(keys("third")["keys"].as_array().unwrap().len(), 2);
    // Remove the first key; then the last one is refused.
    let removed: serde_json::Value =
        serde_json::from_str(&ok(["key", "remove", &r, &first, "--json"])).unwrap();
    assert_eq!(removed["removed"], first.as_str());
    let third = keys("third")["current"].as_str().unwrap().to_string();
    assert_eq!(changed["key"], third.as_str());
    let last = run_with(
        &["key", "remove", &r, &third],
        &[("TESSERA_PASSWORD", Some("third"))],
    );
    let args: Vec<String> = ["key", "remove", &r, &third].map(String::from).to_vec();
    assert!(assert_one_line_error(&args, &last).contains("last key"));
    let out = run_with(
        &["restore", &r, "1", "-"],
        &[("TESSERA_PASSWORD", Some("third"))],
    );
    assert!(out.status.success());
}

#[test]
fn key_passwd_raises_the_kdf_cost_and_refuses_costs_below_the_minimum() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo_with_backup(tmp.path());
    let secure = [("TESSERA_INSECURE_KDF", None)];
    let kdf_of_current = || -> serde_json::Value {
        let listed: serde_json::Value =
            serde_json::from_str(&ok(["key", "list", &r, "--json"])).unwrap();
        let current = listed["current"].as_str().unwrap().to_string();
        let keys = listed["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0]["id"], current.as_str());
        keys[0]["kdf"].clone()
    };
    assert_eq!(kdf_of_current()["memory_kib"], 64);
    // Below OWASP's minimum: refused, nothing changes.
    for cost in [["16MiB", "3"], ["40MiB", "1"], ["19455", "2"]] {
        let args = [
            "key",
            "passwd",
            &r,
            "--keep-password",
            "--kdf-memory",
            cost[0],
            "--kdf-iterations",
            cost[1],
        ];
        let out = run_with(&args, &secure);
        let args: Vec<String> = args.map(String::from).to_vec();
        let line = assert_one_line_error(&args, &out);
        assert!(line.contains("below the minimum"), "{line}");
        assert!(line.contains("19456 KiB"), "{line}");
    }
    assert_eq!(kdf_of_current()["memory_kib"], 64);
    // At the minimum, keeping the password: a new key file with the new
    // cost replaces the old one, and the same password opens it.
    let out = run_with(
        &[
            "key",
            "passwd",
            &r,
            "--keep-password",
            "--kdf-memory",
            "19MiB",
            "--kdf-iterations",
            "2",
            "--json",
        ],
        &secure,
    );
    assert!(out.status.success(), "{out:?}");
    let changed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kdf = kdf_of_current();
    assert_eq!(kdf["memory_kib"], 19456);
    assert_eq!(kdf["iterations"], 2);
    let listed: serde_json::Value =
        serde_json::from_str(&ok(["key", "list", &r, "--json"])).unwrap();
    assert_eq!(listed["current"], changed["key"]);
    assert_ne!(changed["key"], changed["replaced"]);
    // A new key without cost options gets the default, 32 MiB and 3 passes.
    let added = run_with(
        &["key", "add", &r, "--json"],
        &[
            ("TESSERA_INSECURE_KDF", None),
            ("TESSERA_KDF_MEMORY", None),
            ("TESSERA_KDF_ITERATIONS", None),
            ("TESSERA_NEW_PASSWORD", Some("other")),
        ],
    );
    assert!(added.status.success(), "{added:?}");
    let listed = run_with(
        &["key", "list", &r, "--json"],
        &[("TESSERA_PASSWORD", Some("other"))],
    );
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let current = listed["current"].as_str().unwrap();
    let key = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == current)
        .unwrap();
    assert_eq!(key["kdf"]["memory_kib"], 32768);
    assert_eq!(key["kdf"]["iterations"], 3);
    // init refuses a cost below the minimum before creating anything.
    let weak = tmp.path().join("weak");
    let args = ["init", weak.to_str().unwrap(), "--kdf-memory", "8MiB"];
    let out = run_with(&args, &secure);
    let args: Vec<String> = args.map(String::from).to_vec();
    assert!(assert_one_line_error(&args, &out).contains("below the minimum"));
    assert!(!weak.exists());
    // --keep-password and --new-password-file exclude each other.
    let out = run([
        "key",
        "passwd",
        &r,
        "--keep-password",
        "--new-password-file",
        "x",
    ]);
    assert!(!out.status.success());
}

#[test]
fn stats_says_whether_encrypted_and_unencryptable_options_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo_with_backup(tmp.path());
    assert!(ok(["stats", &r]).contains("encryption aes256gcm"));
    let plain = tmp.path().join("plain");
    let created: serde_json::Value = serde_json::from_str(&ok([
        "init",
        plain.to_str().unwrap(),
        "--encryption",
        "none",
        "--json",
    ]))
    .unwrap();
    assert_eq!(created["encryption"], "none");
    assert_eq!(created["compression"], "off");
    assert_eq!(created["layout"], "container");
    assert!(created["id"].as_str().is_some_and(|id| !id.is_empty()));
    let plain_stats = run_with(
        &["stats", plain.to_str().unwrap()],
        &[("TESSERA_PASSWORD", None)],
    );
    assert!(String::from_utf8_lossy(&plain_stats.stdout).contains("encryption none"));
    let t = tmp.path().join("t");
    let t = t.to_str().unwrap();
    for extra in [["--trace"], ["--fingerprint=sha1"]] {
        let mut args = vec!["init", t, "--encryption", "aes256gcm"];
        args.extend(extra);
        let out = run_with(&args, &[]);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        assert!(assert_one_line_error(&args, &out).contains("--encryption none"));
    }
    // Without --encryption, trace repositories are created unencrypted.
    ok(["init", t, "--trace"]);
}

#[test]
fn both_ciphers_round_trip_and_say_which_they_are() {
    let tmp = tempfile::tempdir().unwrap();
    let data = random_bytes(9, 200_000);
    let input = tmp.path().join("input");
    std::fs::write(&input, &data).unwrap();
    for cipher in ["aes256gcm", "xchacha20poly1305"] {
        let repo = tmp.path().join(cipher);
        let r = repo.to_str().unwrap();
        let created = ok(["init", r, "--encryption", cipher, "--kdf-memory", "64"]);
        assert!(created.contains(cipher), "{created}");
        backup_json(&repo, &input);
        assert!(ok(["stats", r]).contains(&format!("encryption {cipher}")));
        assert_file_eq(&restore_to_file(&repo, 1, tmp.path()), &data);
        ok(["check", r, "--read-data"]);
    }
}
