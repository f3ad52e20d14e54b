//! The corruption campaign (issue 20, "Must show"): on small repositories
//! of each layout and of several index kinds, every kind of object is
//! damaged in turn — a flipped byte, a truncation, an emptied file, a
//! deletion — and then the repository goes through what a user would do:
//! `check --read-data`, one backup of every source, `repair`, one more
//! backup of every source, `repair` again, and a restore of every backup.
//!
//! Required outcome, asserted case by case:
//!
//! * **detected**: `check --read-data` reports a problem whose `object` is
//!   the damaged object. Exemptions, by contract: a damaged `config` or key
//!   file stops every command (check included) with one error line naming
//!   the object and what to do; a deleted object whose absence is a normal
//!   state of a healthy repository ([`absence_is_normal`]: a commit mark or
//!   the second copy of a state, which a crash leaves missing; policy
//!   state, a quarantine record, HID/EHID's cold table) cannot be told from
//!   one never written, and it is derived: it is rebuilt, and nothing else
//!   changes (the rest of the outcome proves it).
//! * **no spreading**: every backup taken after the damage restores
//!   byte-identically.
//! * **recovered**: after the repairs every backup restores byte-identically
//!   except where its bytes exist nowhere any more: its recipe was the
//!   damaged object, or the byte ranges (stream) or files (tree) a salvage
//!   restore reports lost hold data that no backup taken after the damage
//!   stored again (the sources changed since).
//! * **no wrong byte**: a restore that succeeds writes exactly the backed-up
//!   bytes; a failed one leaves no file with wrong contents; a salvage
//!   restore writes verified bytes and zeros in the ranges it lists.
//!
//! Bounded and seeded: one seed (`TESSERA_CAMPAIGN_SEED`, default 1), one
//! object of each kind per case. `scripts/corruption-campaign.sh` runs the
//! unbounded version (more seeds, every object of each kind).
//! Run with `--nocapture` to see the table.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One repository configuration of the campaign.
struct Variant {
    name: &'static str,
    init: &'static [&'static str],
    lifecycle: bool,
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "container/exact",
        init: &["--index", "exact"],
        lifecycle: false,
    },
    Variant {
        name: "container/exact/plain+har+greedy",
        init: &[
            "--index",
            "exact",
            "--encryption",
            "none",
            "--rewrite",
            "har",
            "--delta",
            "greedy",
        ],
        lifecycle: false,
    },
    Variant {
        name: "container/ddfs/plain",
        init: &["--index", "ddfs", "--encryption", "none"],
        lifecycle: false,
    },
    Variant {
        name: "container/lazy",
        init: &["--index", "lazy"],
        lifecycle: false,
    },
    Variant {
        name: "container/ehid/plain",
        init: &["--index", "ehid", "--encryption", "none"],
        lifecycle: false,
    },
    Variant {
        name: "lifecycle",
        init: &["--layout", "lifecycle"],
        lifecycle: true,
    },
    Variant {
        name: "lifecycle/plain",
        init: &["--layout", "lifecycle", "--encryption", "none"],
        lifecycle: true,
    },
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Damage {
    Flip,
    Truncate,
    Empty,
    Delete,
}

const DAMAGES: [Damage; 4] = [
    Damage::Flip,
    Damage::Truncate,
    Damage::Empty,
    Damage::Delete,
];

/// The kind of the repository object at `key` (a path relative to the
/// repository, `/`-separated).
fn kind_of(key: &str) -> &'static str {
    let parts: Vec<&str> = key.split('/').collect();
    match parts.as_slice() {
        ["config"] => "config",
        ["keys", _] => "key",
        ["snapshots", _] => "snapshot",
        ["recipes", _] => "recipe",
        ["commits", _] => "commit mark",
        ["containers", _] => "container",
        ["state"] => "state",
        ["state-copy"] => "state copy",
        ["quarantine", _] => "quarantine record",
        ["index", "exact"] => "index: exact",
        ["index", _, "manifest"] => "index: manifest",
        ["index", _, f] if f.starts_with('b') => "index: Bloom filter",
        ["index", _, f] if f.starts_with('t') => "index: table part",
        ["index", _, f] if f.starts_with('l') => "index: metadata log",
        ["rewrite", _] | ["delta", _] => "policy state",
        ["delta-index", _] => "delta feature index",
        ["lifecycle", "state", _] => "lineage state",
        ["lifecycle", "state-copy", _] => "lineage state copy",
        ["lifecycle", _, "cat", _] => "lifecycle category",
        ["lifecycle", _, "vol", _] => "lifecycle volume",
        ["lifecycle", _, "ndf", _] => "NDF table",
        ["lifecycle", _, "journal"] => "arranging journal",
        _ => "other",
    }
}

/// Objects whose deletion leaves a state a healthy repository can be in,
/// so that `check` cannot tell it from damage: the second copy of a state
/// and a commit mark (a crash between the two writes leaves them missing;
/// repair or the next backup rewrites them), HID/EHID's cold index table
/// (written only once entries turn cold), policy state and the greedy
/// feature index (written only by some backups of some sources), a
/// quarantine record (there is none until damage is found) and the
/// arranging journal (deleted by `arrange`). The rest of the outcome
/// proves the absence harmless.
fn absence_is_normal(key: &str) -> bool {
    key.starts_with("index/ehid-cold/")
        || matches!(
            kind_of(key),
            "commit mark"
                | "state copy"
                | "lineage state copy"
                | "policy state"
                | "delta feature index"
                | "quarantine record"
                | "arranging journal"
        )
}

/// What a backed-up source looked like: one stream, or a tree of files.
#[derive(Clone)]
enum Content {
    Stream(Vec<u8>),
    Tree(BTreeMap<String, Vec<u8>>),
}

/// The sources, as they are on disk during the campaign (their last
/// version), and the way each is backed up.
struct Sources {
    dir: PathBuf,
    /// (backup arguments before the repository, path, current content)
    list: Vec<(Vec<String>, PathBuf, Content)>,
}

fn write_tree(root: &Path, files: &BTreeMap<String, Vec<u8>>) {
    let _ = fs::remove_dir_all(root);
    for (name, data) in files {
        let p = root.join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, data).unwrap();
    }
}

fn tree_v1(seed: u64) -> BTreeMap<String, Vec<u8>> {
    let mut t = BTreeMap::new();
    t.insert("a.bin".into(), random_bytes(seed * 100 + 1, 70_000));
    t.insert("b.bin".into(), random_bytes(seed * 100 + 2, 30_000));
    t.insert("sub/c.bin".into(), random_bytes(seed * 100 + 3, 20_000));
    t.insert("sub/d.txt".into(), b"small file\n".to_vec());
    t
}

/// One variant's healthy repository, built once and copied for each case.
struct Template {
    repo: PathBuf,
    /// What every backup holds, by id.
    expected: BTreeMap<u64, Content>,
}

/// `backup --json PRE... REPO` of `path`: a tree backup of a directory, a
/// stream backup of a file's bytes (on standard input).
fn run_backup(repo: &str, pre: &[String], path: &Path) -> std::process::Output {
    let mut args = vec!["backup".to_string(), "--json".into()];
    args.extend(pre.iter().cloned());
    args.push(repo.into());
    if path.is_dir() {
        args.push(path.display().to_string());
        run(&args)
    } else {
        args.push("-".into());
        run_with_input(&args, path)
    }
}

fn backup_id(repo: &Path, pre: &[String], path: &Path) -> u64 {
    let o = run_backup(&repo.display().to_string(), pre, path);
    assert!(o.status.success(), "{o:?}");
    assert_no_panic(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    num(&v, "id")
}

/// Builds the sources (shared by every variant) in `dir`; returns them and
/// the backups to take: (source index, content at that time), in order,
/// with the on-disk edits applied between them by `build_template`.
fn sources(dir: &Path, seed: u64) -> (Sources, Vec<Content>, Vec<Content>) {
    let stream_a = dir.join("stream-a");
    let tree = dir.join("tree");
    let stream_b = dir.join("stream-b");
    let a1 = random_bytes(seed * 100 + 10, 300_000);
    let mut a2 = a1.clone();
    a2[100_000..120_000].copy_from_slice(&random_bytes(seed * 100 + 11, 20_000));
    a2.extend_from_slice(&random_bytes(seed * 100 + 12, 40_000));
    let t1 = tree_v1(seed);
    let mut t2 = t1.clone();
    t2.get_mut("b.bin").unwrap()[5_000..9_000].fill(7);
    t2.insert("sub/e.bin".into(), random_bytes(seed * 100 + 4, 25_000));
    let b = random_bytes(seed * 100 + 20, 150_000);
    fs::write(&stream_b, &b).unwrap();
    let list = vec![
        (vec![], stream_a, Content::Stream(a2.clone())),
        (vec![], tree, Content::Tree(t2.clone())),
        (
            vec!["--source".into(), "other".into()],
            stream_b,
            Content::Stream(b.clone()),
        ),
    ];
    (
        Sources {
            dir: dir.to_path_buf(),
            list,
        },
        vec![
            Content::Stream(a1),
            Content::Tree(t1),
            Content::Stream(b.clone()),
        ],
        vec![Content::Stream(a2), Content::Tree(t2), Content::Stream(b)],
    )
}

fn put(path: &Path, c: &Content) {
    match c {
        Content::Stream(d) => fs::write(path, d).unwrap(),
        Content::Tree(t) => write_tree(path, t),
    }
}

/// The variant's repository: a first version of every source, a second
/// version of each, a backup deleted again (so `state` exists) and, in the
/// container layout, a `gc`, and a quarantine record left by a
/// `check --read-data` that found a damaged container since collected.
fn build_template(
    dir: &Path,
    v: &Variant,
    src: &Sources,
    first: &[Content],
    second: &[Content],
) -> Template {
    let repo = dir.join(format!("template-{}", v.name.replace('/', "-")));
    let mut args = vec!["init".to_string(), repo.display().to_string()];
    args.extend(v.init.iter().map(|s| s.to_string()));
    ok(&args);
    let mut expected = BTreeMap::new();
    for version in [first, second] {
        for ((pre, path, _), content) in src.list.iter().zip(version) {
            put(path, content);
            let id = backup_id(&repo, pre, path);
            expected.insert(id, content.clone());
        }
    }
    // A short-lived backup of its own data: damaged, found by check
    // (which quarantines it), then deleted.
    let tmp = src.dir.join("stream-tmp");
    fs::write(&tmp, random_bytes(999, 90_000)).unwrap();
    let before = files(&repo);
    let id = backup_id(&repo, &["--source".into(), "tmp".into()], &tmp);
    let created: Vec<String> = files(&repo)
        .into_iter()
        .filter(|k| !before.contains(k) && kind_of(k) == "container")
        .collect();
    let damaged = created.first().filter(|_| !v.lifecycle);
    if let Some(c) = damaged {
        flip(&repo.join(c), 40);
        let _ = run(["check", "--read-data", repo.to_str().unwrap()]);
    }
    ok(["delete", repo.to_str().unwrap(), &id.to_string()]);
    if !v.lifecycle {
        ok(["gc", repo.to_str().unwrap()]);
    }
    if let Some(c) = damaged {
        // What gc cannot read it leaves: the operator removes it.
        let _ = fs::remove_file(repo.join(c));
    }
    let _ = fs::remove_file(&tmp);
    Template { repo, expected }
}

/// Every object of the repository at `root` (relative `/` keys), without
/// temporary files and without the lock files of `locks/` (the queue
/// lock's file, FORMAT.md §13.3: an empty file only locked, never read).
fn files(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_name().to_string_lossy().starts_with('.') || p == root.join("locks") {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap();
                out.insert(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            fs::copy(e.path(), &target).unwrap();
        }
    }
}

fn flip(path: &Path, at: usize) {
    let mut b = fs::read(path).unwrap();
    if b.is_empty() {
        return;
    }
    let i = at % b.len();
    b[i] ^= 0x5a;
    fs::write(path, b).unwrap();
}

fn apply(path: &Path, damage: Damage, rng: &mut StdRng) {
    let len = fs::metadata(path).unwrap().len();
    match damage {
        Damage::Flip => flip(path, rng.random_range(0..len.max(1)) as usize),
        Damage::Truncate => {
            let f = fs::OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(rng.random_range(0..len.max(1))).unwrap();
        }
        Damage::Empty => fs::write(path, b"").unwrap(),
        Damage::Delete => fs::remove_file(path).unwrap(),
    }
}

/// The outcome of one case.
#[derive(Default)]
struct Outcome {
    detected: bool,
    /// Not detected, by one of the exemptions of the contract.
    exempt: bool,
    /// Every backup restores byte-identically at the end.
    repaired: bool,
    /// Backups lost with a justification (their bytes exist nowhere).
    unrecoverable: usize,
    /// Violations of the required outcome.
    failures: Vec<String>,
}

/// Every chunk any backup taken after the damage stored: the sources'
/// current contents cut as the repositories cut them (the default FastCDC
/// sizes; a tree's files each cut on their own).
fn stored_again(src: &Sources) -> BTreeSet<Vec<u8>> {
    use tessera::chunker::{Chunker, FastCdc};
    let cdc = FastCdc::new(2048, 8192, 65536);
    let mut out = BTreeSet::new();
    let mut cut = |mut d: &[u8]| {
        while !d.is_empty() {
            let n = cdc.cut(d).clamp(1, d.len());
            out.insert(d[..n].to_vec());
            d = &d[n..];
        }
    };
    for (_, _, c) in &src.list {
        match c {
            Content::Stream(d) => cut(d),
            Content::Tree(t) => t.values().for_each(|v| cut(v)),
        }
    }
    out
}

/// Whether every chunk of `data` was stored again.
fn all_stored_again(again: &BTreeSet<Vec<u8>>, data: &[u8]) -> bool {
    use tessera::chunker::{Chunker, FastCdc};
    let cdc = FastCdc::new(2048, 8192, 65536);
    let mut d = data;
    while !d.is_empty() {
        let n = cdc.cut(d).clamp(1, d.len());
        if !again.contains(&d[..n]) {
            return false;
        }
        d = &d[n..];
    }
    true
}

fn read_tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    if root.is_dir() {
        for k in files(root) {
            out.insert(k.clone(), fs::read(root.join(&k)).unwrap());
        }
    }
    out
}

/// Restores backup `id` (expected to hold `want`) into `scratch`; returns
/// `Ok(true)` when identical, `Ok(false)` when it failed cleanly and its
/// loss is justified, `Err` on a violation.
fn restore_and_compare(
    repo: &Path,
    id: u64,
    want: &Content,
    scratch: &Path,
    src: &Sources,
    damaged_key: &str,
) -> Result<bool, String> {
    let out = scratch.join(format!("r{id}"));
    let o = run([
        "restore",
        repo.to_str().unwrap(),
        &id.to_string(),
        out.to_str().unwrap(),
    ]);
    if String::from_utf8_lossy(&o.stderr).contains("panicked") {
        return Err(format!("restore {id} panicked"));
    }
    match want {
        Content::Stream(d) => {
            if o.status.success() {
                return if fs::read(&out).ok().as_deref() == Some(d.as_slice()) {
                    Ok(true)
                } else {
                    Err(format!("restore {id} succeeded with wrong bytes"))
                };
            }
            if out.exists() {
                return Err(format!("failed restore {id} left a file"));
            }
        }
        Content::Tree(t) => {
            let root = out.join(src.list[1].1.strip_prefix("/").unwrap());
            let got = read_tree(&root);
            for (name, data) in &got {
                if t.get(name) != Some(data) {
                    return Err(format!("restore {id} wrote a wrong file {name}"));
                }
            }
            if o.status.success() {
                return if &got == t {
                    Ok(true)
                } else {
                    Err(format!("restore {id} succeeded but files are missing"))
                };
            }
        }
    }
    let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
    if damaged_key == format!("recipes/{id:016x}") {
        return Ok(false); // the recipe was the only record of the order
    }
    // Salvage: every lost range or file must hold bytes no later backup
    // stored again.
    let again = stored_again(src);
    let sal = scratch.join(format!("s{id}"));
    let o = run([
        "restore",
        "--skip-damaged",
        "--json",
        repo.to_str().unwrap(),
        &id.to_string(),
        sal.to_str().unwrap(),
    ]);
    let v: serde_json::Value = match serde_json::from_slice(&o.stdout) {
        Ok(v) if o.status.code() == Some(3) => v,
        // A tree's catalog (its only list of files) is lost.
        _ if matches!(want, Content::Tree(_))
            && String::from_utf8_lossy(&o.stderr).contains("catalog of backup") =>
        {
            return Ok(false)
        }
        _ => {
            return Err(format!(
                "backup {id} unrestorable ({err}) and its salvage failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
    };
    match want {
        Content::Stream(d) => {
            let got = fs::read(&sal).unwrap_or_default();
            let mut expect = d.clone();
            for l in v["lost"].as_array().into_iter().flatten() {
                let (off, len) = (num(l, "offset") as usize, num(l, "len") as usize);
                let bytes = &d[off..off + len];
                if again.contains(bytes) {
                    return Err(format!(
                        "backup {id}: bytes {off}+{len} were stored again but it stays unrestorable ({err})"
                    ));
                }
                expect[off..off + len].fill(0);
            }
            if got != expect {
                return Err(format!("salvage of {id} wrote wrong bytes"));
            }
        }
        Content::Tree(t) => {
            let root = sal.join(src.list[1].1.strip_prefix("/").unwrap());
            let got = read_tree(&root);
            let lost: BTreeSet<String> = v["lost_files"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| l["path"].as_str())
                .map(|p| {
                    // Catalog paths are relative to `/`.
                    let root = src.list[1].1.strip_prefix("/").unwrap();
                    Path::new(p.trim_start_matches('/'))
                        .strip_prefix(root)
                        .map(|r| r.to_string_lossy().into_owned())
                        .unwrap_or_else(|_| p.to_string())
                })
                .collect();
            for (name, data) in t {
                match got.get(name) {
                    Some(g) if g == data => {}
                    Some(_) => return Err(format!("salvage of {id} wrote a wrong {name}")),
                    None if lost.contains(name) => {
                        if all_stored_again(&again, data) {
                            return Err(format!(
                                "backup {id}: file {name} was stored again but stays lost ({err})"
                            ));
                        }
                    }
                    None => return Err(format!("salvage of {id} dropped {name} unlisted")),
                }
            }
        }
    }
    Ok(false)
}

/// Runs one case: `damage` applied to `key` in a copy of the template.
fn run_case(
    t: &Template,
    src: &Sources,
    scratch: &Path,
    key: &str,
    damage: Damage,
    rng: &mut StdRng,
) -> Outcome {
    let _ = fs::remove_dir_all(scratch);
    let repo = scratch.join("repo");
    copy_dir(&t.repo, &repo);
    apply(&repo.join(key), damage, rng);
    let kind = kind_of(key);
    let r = repo.to_str().unwrap();
    let mut out = Outcome::default();

    // 1. check --read-data
    let o = run(["check", "--read-data", "--json", r]);
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    if stderr.contains("panicked") {
        out.failures.push(format!("check panicked: {stderr}"));
    }
    let v_check: Option<serde_json::Value> = serde_json::from_slice(&o.stdout).ok();
    let named = v_check
        .as_ref()
        .and_then(|c| c["problems"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .any(|p| p["object"] == key);
    let stops_everything = matches!(kind, "config" | "key");
    out.detected = if kind == "key" && damage == Damage::Delete {
        // Without its key file a repository cannot tell a deleted key from
        // a wrong password: the error says that no key file matches.
        !o.status.success() && stderr.contains("no key file matches")
    } else if stops_everything {
        let name = key.rsplit('/').next().unwrap();
        !o.status.success() && stderr.contains(name)
    } else {
        named
    };
    out.exempt = !out.detected && damage == Damage::Delete && absence_is_normal(key);
    if !out.detected && !out.exempt {
        out.failures.push(format!(
            "check --read-data does not name {key}: {} {stderr}",
            String::from_utf8_lossy(&o.stdout)
        ));
    }
    if stops_everything {
        // The contract: every command stops, saying what to do.
        let o = run(["list", r]);
        if o.status.success() && damage != Damage::Delete {
            out.failures
                .push(format!("list works with a damaged {key}"));
        }
        if !o.status.success() {
            let line = assert_one_line_error(&["list".into(), r.into()], &o);
            if !line.contains(key.rsplit('/').next().unwrap())
                && !line.contains("no key file matches")
            {
                out.failures
                    .push(format!("list's error does not name {key}: {line}"));
            }
        }
        out.repaired = o.status.success();
        return out;
    }

    // 2. one backup of every source, repair, one more backup, repair.
    let mut expected = t.expected.clone();
    let mut new_ids = Vec::new();
    for round in 0..2 {
        for (pre, path, content) in &src.list {
            let o = run_backup(r, pre, path);
            assert_no_panic(&o);
            if !o.status.success() {
                out.failures.push(format!(
                    "backup {round} of {} failed: {}",
                    path.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
                continue;
            }
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            let id = num(&v, "id");
            expected.insert(id, content.clone());
            new_ids.push(id);
        }
        let o = run(["repair", "--json", r]);
        assert_no_panic(&o);
        if !matches!(o.status.code(), Some(0) | Some(3)) {
            out.failures.push(format!(
                "repair failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
    }

    // 3. restore every backup.
    let listed: BTreeSet<u64> = match run(["list", "--json", r]) {
        o if o.status.success() => serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|s| num(s, "id"))
            .collect(),
        o => {
            out.failures.push(format!(
                "list fails: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            BTreeSet::new()
        }
    };
    let mut all_ok = true;
    for (id, want) in &expected {
        if !listed.contains(id) {
            all_ok = false;
            if damage != Damage::Delete || key != format!("snapshots/{id:016x}") {
                out.failures.push(format!("backup {id} no longer listed"));
            }
            continue;
        }
        match restore_and_compare(&repo, *id, want, scratch, src, key) {
            Ok(true) => {}
            Ok(false) => {
                all_ok = false;
                if new_ids.contains(id) {
                    out.failures
                        .push(format!("new backup {id} cannot be restored"));
                } else {
                    out.unrecoverable += 1;
                }
            }
            Err(e) => {
                all_ok = false;
                out.failures.push(e);
            }
        }
    }
    out.repaired = all_ok;
    out
}

#[derive(Default)]
struct Row {
    cases: usize,
    detected: usize,
    exempt: usize,
    repaired: usize,
    unrecoverable_cases: usize,
    lost_backups: usize,
    failures: usize,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn corruption_campaign() {
    let seed = env_u64("TESSERA_CAMPAIGN_SEED", 1);
    let every_object = std::env::var("TESSERA_CAMPAIGN_ALL_OBJECTS").is_ok();
    // Only the variants whose name contains this (for investigating one).
    let only = std::env::var("TESSERA_CAMPAIGN_VARIANTS").ok();
    let only = &only;
    let tmp = tempfile::tempdir().unwrap();
    let table: Mutex<BTreeMap<&'static str, Row>> = Mutex::new(BTreeMap::new());
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = env_u64("TESSERA_CAMPAIGN_JOBS", 2) as usize;
    std::thread::scope(|s| {
        for w in 0..workers {
            let (table, failures, next, tmp) = (&table, &failures, &next, tmp.path());
            s.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(v) = VARIANTS.get(i) else { break };
                if !only.as_ref().is_none_or(|o| v.name.contains(o.as_str())) {
                    continue;
                }
                let vdir = tmp.join(format!("v{i}"));
                let srcdir = vdir.join("src");
                fs::create_dir_all(&srcdir).unwrap();
                let (src, first, second) = sources(&srcdir, seed);
                let src = &src;
                let t = build_template(&vdir, v, src, &first, &second);
                let mut rng = StdRng::seed_from_u64(seed * 1000 + i as u64);
                let mut by_kind: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
                for k in files(&t.repo) {
                    by_kind.entry(kind_of(&k)).or_default().push(k);
                }
                for (kind, keys) in &by_kind {
                    for damage in DAMAGES {
                        let chosen: Vec<&String> = if every_object {
                            keys.iter().collect()
                        } else {
                            vec![&keys[rng.random_range(0..keys.len())]]
                        };
                        for key in chosen {
                            let scratch = vdir.join(format!("case-{w}"));
                            let o = run_case(&t, src, &scratch, key, damage, &mut rng);
                            let mut tab = table.lock().unwrap();
                            let row = tab.entry(kind).or_default();
                            row.cases += 1;
                            row.detected += o.detected as usize;
                            row.exempt += o.exempt as usize;
                            row.repaired += o.repaired as usize;
                            row.unrecoverable_cases += (o.unrecoverable > 0) as usize;
                            row.lost_backups += o.unrecoverable;
                            row.failures += !o.failures.is_empty() as usize;
                            drop(tab);
                            let mut f = failures.lock().unwrap();
                            for e in o.failures {
                                f.push(format!("FAILURE {} {key} {damage:?}: {e}", v.name));
                            }
                        }
                    }
                }
                let _ = w;
                let _ = fs::remove_dir_all(&vdir);
            });
        }
    });
    let table = table.into_inner().unwrap();
    let mut text = String::new();
    writeln!(
        text,
        "corruption campaign, seed {seed}, {} variants: {}",
        VARIANTS.len(),
        VARIANTS
            .iter()
            .map(|v| v.name)
            .collect::<Vec<_>>()
            .join(", ")
    )
    .unwrap();
    writeln!(
        text,
        "{:<22} {:>6} {:>9} {:>7} {:>9} {:>14} {:>12} {:>9}",
        "object kind",
        "cases",
        "detected",
        "exempt",
        "repaired",
        "unrecoverable",
        "lost backups",
        "failures",
    )
    .unwrap();
    let mut total = Row::default();
    for (kind, r) in &table {
        writeln!(
            text,
            "{:<22} {:>6} {:>9} {:>7} {:>9} {:>14} {:>12} {:>9}",
            kind,
            r.cases,
            r.detected,
            r.exempt,
            r.repaired,
            r.unrecoverable_cases,
            r.lost_backups,
            r.failures,
        )
        .unwrap();
        total.cases += r.cases;
        total.detected += r.detected;
        total.exempt += r.exempt;
        total.repaired += r.repaired;
        total.unrecoverable_cases += r.unrecoverable_cases;
        total.lost_backups += r.lost_backups;
        total.failures += r.failures;
    }
    writeln!(
        text,
        "{:<22} {:>6} {:>9} {:>7} {:>9} {:>14} {:>12} {:>9}",
        "total",
        total.cases,
        total.detected,
        total.exempt,
        total.repaired,
        total.unrecoverable_cases,
        total.lost_backups,
        total.failures,
    )
    .unwrap();
    println!("{text}");
    let failures = failures.into_inner().unwrap();
    for f in &failures {
        println!("{f}");
    }
    assert!(table.values().all(|r| r.cases > 0));
    assert!(!table.is_empty(), "no variant ran");
    let real = failures.iter().filter(|f| f.starts_with("FAILURE")).count();
    assert_eq!(real, 0, "{real} failure(s)");
}
