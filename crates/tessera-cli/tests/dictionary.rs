//! Compression dictionaries (docs/FORMAT.md §7.8): a backup of many small
//! files alike trains one, stores less than per-chunk compression, restores
//! identically, checks clean with `--read-data`, copies into another
//! repository that restores identically; a damaged dictionary is reported
//! by name, never a panic.

mod common;

use common::*;
use std::path::Path;
use std::process::Stdio;

/// `n` small source files alike (a licence header, the same imports and
/// idioms), in a few directories.
fn write_tree(root: &Path, n: usize) {
    for i in 0..n {
        let dir = root.join(format!("pkg{}", i % 7));
        std::fs::create_dir_all(&dir).unwrap();
        let body = format!(
            "# Copyright (c) the project authors.\n# Licensed under the Apache License, \
             Version 2.0 (the \"License\"); you may not use this file except in compliance \
             with the License.\n\nimport os\nimport sys\nimport logging\nfrom typing import \
             Any, Dict, List, Optional\n\nlog = logging.getLogger(__name__)\n\n\
             class Handler{i}(object):\n    \"\"\"Handles the requests of kind {i}.\"\"\"\n\n    \
             def __init__(self, config: Optional[Dict[str, Any]] = None) -> None:\n        \
             self.config = config or {{}}\n        self.count = {}\n\n    \
             def handle(self, request: Dict[str, Any]) -> List[str]:\n        \
             value = request.get(\"field_{}\", {})\n        log.debug(\"handling %s\", value)\n        \
             return [os.path.join(sys.prefix, str(value)) for _ in range(self.count)]\n",
            i % 5,
            i % 11,
            i * 37 % 1000
        );
        std::fs::write(dir.join(format!("module_{i}.py")), body).unwrap();
    }
}

/// Bytes of all files below `dir`, recursively.
fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            match m.is_dir() {
                true => du(&e.path()),
                false => m.len(),
            }
        })
        .sum()
}

/// Whether the trees `a` and `b` hold the same files with the same bytes.
fn assert_same_tree(a: &Path, b: &Path) {
    let (na, nb) = (sorted_names(a), sorted_names(b));
    assert_eq!(na, nb, "{}", b.display());
    for n in na {
        let (pa, pb) = (a.join(&n), b.join(&n));
        match pa.is_dir() {
            true => assert_same_tree(&pa, &pb),
            false => assert!(
                std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap(),
                "{}",
                pb.display()
            ),
        }
    }
}

fn dictionaries(repo: &Path) -> Vec<String> {
    match std::fs::read_dir(repo.join("dictionaries")) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with('.'))
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn small_files_train_a_dictionary_that_restores_checks_and_copies() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_tree(&src, 3000);
    let (with, without) = (dir.path().join("with"), dir.path().join("without"));
    init(&with);
    ok([
        "init".as_ref(),
        without.as_os_str(),
        "--compression-dictionary".as_ref(),
        "off".as_ref(),
    ]);
    for repo in [&with, &without] {
        backup_tree(repo, &src);
    }
    assert_eq!(dictionaries(&with).len(), 1, "the first backup trains one");
    assert!(dictionaries(&without).is_empty());
    let (a, b) = (
        du(&with.join("containers")),
        du(&without.join("containers")),
    );
    assert!(a < b, "containers with a dictionary {a} bytes, without {b}");
    // A second backup uses the same dictionary, adds none.
    std::fs::write(src.join("pkg0/new.py"), b"import os\nprint(os.getcwd())\n").unwrap();
    backup_tree(&with, &src);
    assert_eq!(dictionaries(&with).len(), 1);

    let out = dir.path().join("out");
    ok([
        "restore".as_ref(),
        with.as_os_str(),
        "latest".as_ref(),
        out.as_os_str(),
    ]);
    assert_same_tree(&src, &out.join(src.strip_prefix("/").unwrap()));
    ok(["check".as_ref(), with.as_os_str(), "--read-data".as_ref()]);

    // Copy into a new repository: it restores identically (and compresses
    // with a dictionary of its own).
    let dst = dir.path().join("dst");
    init(&dst);
    let copied = cmd(["copy".as_ref(), with.as_os_str(), dst.as_os_str()])
        .env("TESSERA_TO_PASSWORD", TEST_PASSWORD)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    assert_eq!(dictionaries(&dst).len(), 1);
    let out2 = dir.path().join("out2");
    ok([
        "restore".as_ref(),
        dst.as_os_str(),
        "latest".as_ref(),
        out2.as_os_str(),
    ]);
    assert_same_tree(&out, &out2);
    ok(["check".as_ref(), dst.as_os_str(), "--read-data".as_ref()]);
}

#[test]
fn a_damaged_dictionary_is_named_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_tree(&src, 2000);
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let names = dictionaries(&repo);
    assert_eq!(names.len(), 1);
    let path = repo.join("dictionaries").join(&names[0]);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    let out = dir.path().join("out");
    // A restore fails (its catalog cannot be read), without a panic.
    let o = run([
        "restore".as_ref(),
        repo.as_os_str(),
        "latest".as_ref(),
        out.as_os_str(),
    ]);
    assert_no_panic(&o);
    assert!(!o.status.success());
    // check names the dictionary object.
    for args in [
        vec!["check".as_ref(), repo.as_os_str()],
        vec!["check".as_ref(), repo.as_os_str(), "--read-data".as_ref()],
    ] {
        let o = run(args);
        assert_no_panic(&o);
        assert!(!o.status.success());
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            text.contains(&format!("dictionaries/{}", names[0])),
            "names the dictionary: {text}"
        );
    }
}
