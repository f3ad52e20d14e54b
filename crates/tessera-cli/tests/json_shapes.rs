//! Snapshot tests of the shape of every `--json` output the README and
//! docs/CLI.md promise as stable (fields are added, never renamed): each
//! output is reduced to its skeleton — object keys, and the type of each
//! value; an array's first element stands for all — and compared with
//! `tests/snapshots/`. A renamed, removed or retyped field shows as a diff
//! to review (`cargo insta review`, or `INSTA_UPDATE=always` to accept).

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;

/// The skeleton of `v`: types instead of values, arrays as their first element.
fn shape(v: &Value) -> Value {
    match v {
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(_) => json!("number"),
        Value::String(_) => json!("string"),
        Value::Array(a) => match a.first() {
            Some(first) => json!([shape(first)]),
            None => json!([]),
        },
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
    }
}

/// Runs `args` (which must include `--json`) and returns the shape of its output.
fn json_shape(args: &[&str]) -> Value {
    let out = ok(args.iter().copied());
    let v: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {out}"));
    shape(&v)
}

/// A small tree with a file, a subdirectory and a symbolic link.
fn tree(root: &Path, version: u64) {
    std::fs::create_dir_all(root.join("sub")).unwrap();
    write_random_file(&root.join("a.bin"), version, 200_000);
    write_random_file(&root.join("sub/b.bin"), 7, 50_000);
    let link = root.join("link");
    if !link.exists() {
        std::os::unix::fs::symlink("a.bin", link).unwrap();
    }
}

#[test]
fn container_layout_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    let src = tmp.path().join("src");
    init(&repo);
    tree(&src, 1);
    let s = src.to_str().unwrap();
    insta::assert_json_snapshot!("backup_tree", json_shape(&["backup", r, s, "--json"]));
    tree(&src, 2);
    ok(["backup", r, s]);
    let input = tmp.path().join("stream.bin");
    write_random_file(&input, 3, 100_000);
    let stream = ok_with_input(["backup", r, "-", "--json"], &input);
    insta::assert_json_snapshot!(
        "backup_stream",
        shape(&serde_json::from_str(&stream).unwrap())
    );
    insta::assert_json_snapshot!("list", json_shape(&["list", r, "--json"]));
    insta::assert_json_snapshot!("ls", json_shape(&["ls", r, "1", "--json"]));
    insta::assert_json_snapshot!("find", json_shape(&["find", r, "*.bin", "--json"]));
    insta::assert_json_snapshot!("diff", json_shape(&["diff", r, "1", "2", "--json"]));
    insta::assert_json_snapshot!("stats", json_shape(&["stats", r, "--json"]));
    insta::assert_json_snapshot!("stats_backup", json_shape(&["stats", r, "1", "--json"]));
    let target = tmp.path().join("restored");
    let t = target.to_str().unwrap();
    insta::assert_json_snapshot!(
        "restore_tree",
        json_shape(&["restore", r, "2", t, "--json"])
    );
    let out = tmp.path().join("stream.out");
    let o = out.to_str().unwrap();
    insta::assert_json_snapshot!(
        "restore_stream",
        json_shape(&["restore", r, "3", o, "--json"])
    );
    insta::assert_json_snapshot!("check", json_shape(&["check", r, "--read-data", "--json"]));
    insta::assert_json_snapshot!(
        "forget",
        json_shape(&["forget", r, "--keep-last", "1", "--dry-run", "--json"])
    );
    ok(["forget", r, "--keep-last", "1"]);
    insta::assert_json_snapshot!("prune", json_shape(&["prune", r, "--dry-run", "--json"]));
    insta::assert_json_snapshot!("gc", json_shape(&["gc", r, "--json"]));
    let copy = tmp.path().join("copy");
    init_plain(&copy);
    insta::assert_json_snapshot!(
        "copy",
        json_shape(&["copy", r, copy.to_str().unwrap(), "--json"])
    );
}

#[test]
fn lifecycle_layout_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    ok(["init", r, "--layout", "lifecycle"]);
    let src = tmp.path().join("src");
    tree(&src, 1);
    let s = src.to_str().unwrap();
    insta::assert_json_snapshot!("lifecycle_backup", json_shape(&["backup", r, s, "--json"]));
    tree(&src, 2);
    ok(["backup", r, s]);
    insta::assert_json_snapshot!("space", json_shape(&["space", r, "1", "--json"]));
    insta::assert_json_snapshot!("arrange", json_shape(&["arrange", r, "--json"]));
    let target = tmp.path().join("restored");
    insta::assert_json_snapshot!(
        "lifecycle_restore",
        json_shape(&["restore", r, "2", target.to_str().unwrap(), "--json"])
    );
}
