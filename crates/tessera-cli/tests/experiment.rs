//! `tessera experiment` writes only into its own output directory: names
//! from the experiment file never lead outside it, a directory it did not
//! create is never replaced, and a disk model dividing by zero is refused.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// An experiment file in `dir` named `name`, over a tiny generated dataset,
/// with systems `systems` and `extra` TOML.
fn experiment_file(dir: &Path, name: &str, systems: &[&str], extra: &str) -> PathBuf {
    let mut t =
        format!("name = {name:?}\n[dataset.generate]\nversions = 2\nsize = \"200KB\"\n{extra}");
    for s in systems {
        t.push_str(&format!("[[systems]]\nname = {s:?}\n"));
    }
    let path = dir.join("experiment.toml");
    fs::write(&path, t).unwrap();
    path
}

/// A directory holding one file, standing for someone else's data.
fn sentinel(dir: &Path) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("notes.txt"), b"keep me").unwrap();
    dir.to_path_buf()
}

fn assert_sentinel_intact(dir: &Path) {
    assert_eq!(
        dir_names(dir),
        ["notes.txt".to_string()].into(),
        "{}",
        dir.display()
    );
    assert_eq!(fs::read(dir.join("notes.txt")).unwrap(), b"keep me");
}

fn experiment(config: &Path, out: &Path) -> Vec<String> {
    vec![
        "experiment".into(),
        config.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ]
}

#[test]
fn path_like_system_names_are_refused_and_nothing_outside_out_is_touched() {
    let tmp = tempfile::tempdir().unwrap();
    let beside = sentinel(&tmp.path().join("sentinel"));
    let out = tmp.path().join("out");
    // The repository of a system is OUT/repos/<name>.
    let absolute = beside.display().to_string();
    for name in [absolute.as_str(), "../../sentinel", "a/b", ".."] {
        let config = experiment_file(tmp.path(), "tiny", &["exact", name], "");
        let line = fail(experiment(&config, &out));
        assert!(
            line.contains(&format!("system {name:?}: name must be plain")),
            "{name:?}: {line}"
        );
        assert!(!out.exists(), "{name:?}: nothing written");
        assert_sentinel_intact(&beside);
    }
}

#[test]
fn path_like_experiment_name_is_refused_without_out() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    let beside = sentinel(&tmp.path().join("sentinel"));
    // Without --out the output directory is results/<experiment name>.
    let config = experiment_file(tmp.path(), "../../sentinel", &["exact"], "");
    let args = vec!["experiment".to_string(), config.display().to_string()];
    let out = cmd(&args)
        .current_dir(&work)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let line = assert_one_line_error(&args, &out);
    assert!(
        line.contains("name \"../../sentinel\": must be plain"),
        "{line}"
    );
    assert!(dir_names(&work).is_empty(), "nothing written");
    assert_sentinel_intact(&beside);
}

#[test]
fn foreign_output_directory_is_refused_and_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let config = experiment_file(tmp.path(), "tiny", &["exact"], "");
    // Someone's directory that happens to hold repos/exact.
    let theirs = tmp.path().join("theirs");
    let repo = sentinel(&theirs.join("repos").join("exact"));
    fs::write(theirs.join("notes.txt"), b"mine").unwrap();
    let line = fail(experiment(&config, &theirs));
    assert!(
        line.contains("not empty and not an experiment output directory (no .tessera-experiment)"),
        "{line}"
    );
    assert_eq!(
        dir_names(&theirs),
        ["notes.txt".to_string(), "repos".to_string()].into()
    );
    assert_eq!(fs::read(theirs.join("notes.txt")).unwrap(), b"mine");
    assert_sentinel_intact(&repo);
}

#[test]
fn rerun_into_its_own_output_directory_works() {
    let tmp = tempfile::tempdir().unwrap();
    let config = experiment_file(tmp.path(), "tiny", &["exact", "ddfs-1.v2"], "");
    let out = tmp.path().join("out");
    for run in 1..=2 {
        let line = ok(experiment(&config, &out));
        assert!(
            // Both systems plain and compressed (the compression axis' default).
            line.contains("experiment \"tiny\": 4 systems x 2 versions"),
            "run {run}: {line}"
        );
        assert_eq!(
            fs::read_to_string(out.join(".tessera-experiment")).unwrap(),
            "tiny\n"
        );
        // A fresh repository each run: backups 1 and 2 only.
        assert_eq!(list_ids(out.join("repos").join("exact")), vec![1, 2]);
    }
    // Another experiment may not reuse it.
    let other = experiment_file(tmp.path(), "other", &["exact"], "");
    let line = fail(experiment(&other, &out));
    assert!(
        line.contains("holds the output of experiment \"tiny\", not \"other\""),
        "{line}"
    );
    assert_eq!(list_ids(out.join("repos").join("exact")), vec![1, 2]);
}

#[test]
fn disk_values_not_above_zero_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    for (field, value) in [
        ("seek_ms", "0"),
        ("seek_ms", "-1.5"),
        ("bandwidth_mb_s", "0.0"),
        ("bandwidth_mb_s", "-150"),
    ] {
        let disk = format!("[disk]\n{field} = {value}\n");
        let config = experiment_file(tmp.path(), "tiny", &["exact"], &disk);
        let line = fail(experiment(&config, &out));
        assert!(
            line.contains(&format!("disk.{field} = "))
                && line.ends_with("must be finite and greater than 0"),
            "{field} = {value}: {line}"
        );
        assert!(!out.exists());
    }
}
