//! `--repo`/`-r` and `TESSERA_REPOSITORY` instead of the REPO argument.

mod common;

use common::*;

#[test]
fn the_repository_can_be_an_option_or_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    ok(["-r", r, "init", "--encryption", "none"]);
    let file = tmp.path().join("f");
    std::fs::write(&file, random_bytes(5, 70_000)).unwrap();
    ok(["backup", "--repo", r, file.to_str().unwrap()]);
    // (Standard input: a stream backup, restored into a file below.)
    ok_with_input(["backup", "-", &format!("--repo={r}")], &file);
    assert_eq!(list_ids(&repo), vec![1, 2]);

    // From the environment; a REPO argument still wins over it.
    let env_list = |args: &[&str], env: &str| {
        let out = cmd(args)
            .env("TESSERA_REPOSITORY", env)
            .output()
            .expect("running tessera");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let listed = env_list(&["list", "--json"], r);
    let v: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    let other = tmp.path().join("other");
    let listed = env_list(&["list", "--json", r], other.to_str().unwrap());
    let v: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);

    // Nested commands and restores.
    let v: serde_json::Value =
        serde_json::from_str(&ok(["index", "rebuild", "-r", r, "--json"])).unwrap();
    assert!(num(&v, "entries") > 0, "{v}");
    let out = tmp.path().join("out");
    ok(["-r", r, "restore", "2", out.to_str().unwrap()]);
    assert_file_eq(&out, &random_bytes(5, 70_000));

    let v: serde_json::Value = serde_json::from_str(&ok(["delete", r, "1", "--json"])).unwrap();
    assert_eq!(v["deleted"], 1);

    // Commands without a repository are unaffected.
    let script = ok(["-r", r, "completion", "bash"]);
    assert!(script.contains("tessera"));
}
