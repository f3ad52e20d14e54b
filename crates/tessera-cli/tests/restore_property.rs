//! The property of issue 38, end to end: random trees (files, directories,
//! symbolic links, hard links, FIFOs, long names, a path longer than
//! PATH_MAX once restored) are backed up, then restored with every
//! `--overwrite` mode and random `--include` selections into targets
//! pre-filled with random conflicting entries — files, directories,
//! FIFOs, and symbolic links to a directory outside the target and to `/`.
//! Asserted: nothing outside the target changes (a snapshot of the source
//! and of an outside directory, bytes, entries and metadata, before and
//! after); every selected entry that can be restored is, exactly; every
//! one that cannot is reported (itself or a directory above it); exit
//! status 3 exactly when something was reported; no partial file is left.

mod common;

use common::{init, ok, run};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A node of a random tree, below a directory chosen among those before it.
#[derive(Clone, Debug)]
enum Node {
    Dir(u32),
    /// Bytes made from a seed, their length, the mode.
    File(u64, u16, u32),
    /// A link to one of four targets (relative, outside, `/`, upwards).
    Symlink(u8),
    /// Another name of one of the files before it.
    Hardlink(usize),
    Fifo,
}

/// What a target holds, before the restore, at a path the backup has.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Conflict {
    File,
    Dir,
    LinkOutside,
    LinkRoot,
    Fifo,
}

#[derive(Clone, Debug)]
struct Case {
    nodes: Vec<(usize, String, Node)>,
    deep: bool,
    /// Include patterns: an entry (by number), written relative or absolute.
    includes: Vec<(usize, bool)>,
    /// An include pattern matching nothing besides.
    missing: bool,
    conflicts: Vec<(usize, Conflict)>,
}

fn node() -> impl Strategy<Value = Node> {
    prop_oneof![
        3 => prop::sample::select(vec![0o755u32, 0o700, 0o750]).prop_map(Node::Dir),
        4 => (
            any::<u64>(),
            0u16..2000,
            prop::sample::select(vec![0o644u32, 0o600, 0o755, 0o444]),
        )
            .prop_map(|(seed, len, m)| Node::File(seed, len, m)),
        2 => (0u8..4).prop_map(Node::Symlink),
        2 => any::<usize>().prop_map(Node::Hardlink),
        1 => Just(Node::Fifo),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let name = prop_oneof![
        5 => "[a-d]{1,2}",
        1 => (200usize..=255).prop_map(|n| "L".repeat(n)),
    ];
    let conflict = prop::sample::select(vec![
        Conflict::File,
        Conflict::Dir,
        Conflict::LinkOutside,
        Conflict::LinkRoot,
        Conflict::Fifo,
    ]);
    (
        prop::collection::vec((any::<usize>(), name, node()), 1..14),
        prop::bool::weighted(0.3),
        prop::collection::vec((any::<usize>(), any::<bool>()), 0..3),
        prop::bool::weighted(0.15),
        prop::collection::vec((any::<usize>(), conflict), 0..6),
    )
        .prop_map(|(nodes, deep, includes, missing, conflicts)| Case {
            nodes,
            deep,
            includes,
            missing,
            conflicts,
        })
}

/// A catalog path (no leading `/`) of an absolute path.
fn cat(p: &Path) -> String {
    p.to_str().unwrap().trim_start_matches('/').to_string()
}

fn mkfifo(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o640) },
        0,
        "{}",
        p.display()
    );
}

/// Makes the tree of `case` in `src`; the paths of its nodes (not the deep chain).
fn make_tree(case: &Case, src: &Path, outside: &Path) -> Vec<PathBuf> {
    fs::create_dir(src).unwrap();
    let mut dirs = vec![(src.to_path_buf(), 0o755)];
    let mut files: Vec<PathBuf> = Vec::new();
    let mut made = Vec::new();
    for (i, (parent, name, node)) in case.nodes.iter().enumerate() {
        let path = dirs[parent % dirs.len()].0.join(name);
        if fs::symlink_metadata(&path).is_ok() || path.as_os_str().len() > 3000 {
            continue;
        }
        match node {
            Node::Dir(mode) => {
                fs::create_dir(&path).unwrap();
                dirs.push((path.clone(), *mode));
            }
            Node::File(seed, len, mode) => {
                let mut x = *seed | 1;
                let data: Vec<u8> = (0..*len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                fs::write(&path, data).unwrap();
                fs::set_permissions(&path, fs::Permissions::from_mode(*mode)).unwrap();
                let t =
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i as u64);
                fs::File::options()
                    .write(true)
                    .open(&path)
                    .or_else(|_| fs::File::open(&path))
                    .unwrap()
                    .set_modified(t)
                    .unwrap();
                files.push(path.clone());
            }
            Node::Symlink(t) => {
                let target = match t {
                    0 => PathBuf::from("x"),
                    1 => outside.to_path_buf(),
                    2 => PathBuf::from("/"),
                    _ => PathBuf::from("../../.."),
                };
                symlink(target, &path).unwrap();
            }
            Node::Hardlink(k) => {
                if files.is_empty() {
                    continue;
                }
                fs::hard_link(&files[k % files.len()], &path).unwrap();
            }
            Node::Fifo => mkfifo(&path),
        }
        made.push(path);
    }
    for (d, mode) in dirs.iter().skip(1) {
        fs::set_permissions(d, fs::Permissions::from_mode(*mode)).unwrap();
    }
    if case.deep {
        // Restored below a target, longer than PATH_MAX.
        let mut deep = src.join("deep");
        while deep.as_os_str().len() < 3800 {
            deep.push("D".repeat(200));
        }
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("leaf"), b"deep leaf").unwrap();
    }
    made
}

/// Everything observable about the tree at `root`, by path: kind, mode,
/// owner, size, times (modification and change), inode, links, and the
/// bytes or link target. Missing: an empty map.
fn snapshot(root: &Path, out: &mut BTreeMap<String, String>) {
    let Ok(m) = fs::symlink_metadata(root) else {
        return;
    };
    let what = if m.file_type().is_symlink() {
        format!("-> {:?}", fs::read_link(root).unwrap())
    } else if m.is_file() {
        format!("{:?}", fs::read(root).unwrap())
    } else {
        String::new()
    };
    out.insert(
        root.display().to_string(),
        format!(
            "{:?} {:o} {}:{} {} {}.{} {}.{} {} {} {what}",
            m.file_type(),
            m.mode(),
            m.uid(),
            m.gid(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
            m.ino(),
            m.nlink()
        ),
    );
    if m.is_dir() {
        for e in fs::read_dir(root).unwrap() {
            snapshot(&e.unwrap().path(), out);
        }
    }
}

/// Everything outside the targets: the source, the outside directory, the
/// base directory's own metadata and its ancestors' modes and owners.
fn outside_state(base: &Path) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    snapshot(&base.join("src"), &mut s);
    snapshot(&base.join("outside"), &mut s);
    let m = fs::metadata(base).unwrap();
    s.insert(
        "base".into(),
        format!("{:o} {} {}", m.mode(), m.uid(), m.mtime()),
    );
    for a in base.ancestors().skip(1) {
        let m = fs::metadata(a).unwrap();
        s.insert(
            a.display().to_string(),
            format!("{:o} {}:{}", m.mode(), m.uid(), m.gid()),
        );
    }
    s
}

/// A backup's entry, from `ls -R --json`.
#[derive(Clone, Debug)]
struct Backed {
    kind: String,
    /// A hard link's file (catalog path), a link's target.
    target: String,
}

fn listing(repo: &Path, id: u64) -> BTreeMap<String, Backed> {
    let out = ok([
        "ls".as_ref(),
        "-R".as_ref(),
        "--json".as_ref(),
        repo.as_os_str(),
        id.to_string().as_ref(),
        "/".as_ref(),
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let path = e["path"]
                .as_str()
                .unwrap()
                .trim_start_matches('/')
                .to_string();
            let b = Backed {
                kind: e["kind"].as_str().unwrap().to_string(),
                target: e["target"].as_str().unwrap_or_default().to_string(),
            };
            (path, b)
        })
        .collect()
}

/// The proper ancestors of catalog path `p`, outermost first.
fn ancestors(p: &str) -> Vec<&str> {
    p.match_indices('/').map(|(i, _)| &p[..i]).collect()
}

/// Pre-fills `target` with `conflicts` at paths of `positions` (each made
/// only where its parents are real directories of the target: never
/// through a link); what is where, real parent directories included.
fn prefill(
    target: &Path,
    positions: &[String],
    conflicts: &[(usize, Conflict)],
    outside: &Path,
) -> BTreeMap<String, Conflict> {
    let mut at: BTreeMap<String, Conflict> = BTreeMap::new();
    let mut wanted: Vec<(String, Conflict)> = conflicts
        .iter()
        .map(|(k, c)| (positions[k % positions.len()].clone(), *c))
        .collect();
    wanted.sort_by_key(|(p, _)| p.len());
    'next: for (p, c) in wanted {
        if at.contains_key(&p) {
            continue;
        }
        for a in ancestors(&p) {
            match at.get(a) {
                Some(Conflict::Dir) => {}
                Some(_) => continue 'next,
                None => {
                    fs::create_dir(target.join(a)).unwrap();
                    at.insert(a.to_string(), Conflict::Dir);
                }
            }
        }
        let path = target.join(&p);
        match c {
            Conflict::File => fs::write(&path, b"was here").unwrap(),
            Conflict::Dir => {
                fs::create_dir(&path).unwrap();
                fs::write(path.join("inner"), b"was here").unwrap();
            }
            Conflict::LinkOutside => symlink(outside, &path).unwrap(),
            Conflict::LinkRoot => symlink("/", &path).unwrap(),
            Conflict::Fifo => mkfifo(&path),
        }
        at.insert(p, c);
    }
    at
}

/// What must become of a selected entry.
#[derive(Debug, PartialEq)]
enum Expect {
    Restored,
    Kept,
    Reported,
    /// A hard link whose file was not restored: reported, or linked to what is there.
    Either,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Refuse,
    Always,
    IfChanged,
    Never,
}

impl Mode {
    fn replaces(self) -> bool {
        matches!(self, Mode::Always | Mode::IfChanged)
    }

    fn arg(self) -> Option<&'static str> {
        match self {
            Mode::Refuse => None,
            Mode::Always => Some("--overwrite"),
            Mode::IfChanged => Some("--overwrite=if-changed"),
            Mode::Never => Some("--overwrite=never"),
        }
    }
}

/// The expected outcome of restoring the selected entry `p`.
fn expect(
    p: &str,
    backed: &BTreeMap<String, Backed>,
    selected: &dyn Fn(&str) -> bool,
    there: &BTreeMap<String, Conflict>,
    mode: Mode,
) -> Expect {
    for a in ancestors(p) {
        match there.get(a) {
            None | Some(Conflict::Dir) => {}
            Some(_) if selected(a) && mode.replaces() => {}
            Some(_) => return Expect::Reported,
        }
    }
    let b = &backed[p];
    let own = match (there.get(p), b.kind.as_str()) {
        (None, _) | (Some(Conflict::Dir), "dir") => Expect::Restored,
        (Some(_), "dir") if mode.replaces() => Expect::Restored,
        (Some(_), "dir") => Expect::Reported,
        (Some(_), _) => match mode {
            Mode::Refuse => Expect::Reported,
            Mode::Never => Expect::Kept,
            _ => Expect::Restored,
        },
    };
    // A hard link is linked to its file's first restored name: to the
    // first path when selected, else to the first selected link (which
    // carries the file). When that one was not restored, the link is
    // reported or linked to what is kept there.
    if b.kind == "hardlink" && own == Expect::Restored {
        let carrier = match selected(&b.target) {
            true => b.target.as_str(),
            false => backed
                .iter()
                .find(|(q, c)| c.kind == "hardlink" && c.target == b.target && selected(q))
                .map_or(p, |(q, _)| q.as_str()),
        };
        if carrier != p && expect(carrier, backed, selected, there, mode) != Expect::Restored {
            return Expect::Either;
        }
    }
    own
}

/// The object at catalog path `p` below `target`, looked up without
/// following links and by descriptors (paths longer than PATH_MAX too):
/// its `lstat`, and its bytes when it is a regular file.
fn look(target: &Path, p: &str) -> Option<(libc::stat, Option<Vec<u8>>)> {
    let c = |s: &[u8]| CString::new(s).unwrap();
    let mut dir = unsafe {
        libc::open(
            c(target.as_os_str().as_bytes()).as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )
    };
    assert!(dir >= 0);
    let comps: Vec<&str> = p.split('/').collect();
    let mut result = None;
    for (i, comp) in comps.iter().enumerate() {
        let name = c(comp.as_bytes());
        if i + 1 < comps.len() {
            let next = unsafe {
                libc::openat(
                    dir,
                    name.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                )
            };
            unsafe { libc::close(dir) };
            if next < 0 {
                return None;
            }
            dir = next;
            continue;
        }
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
            break;
        }
        let bytes = if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            let fd = unsafe { libc::openat(dir, name.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW) };
            assert!(fd >= 0);
            let mut f = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut v).unwrap();
            Some(v)
        } else {
            None
        };
        result = Some((st, bytes));
    }
    unsafe { libc::close(dir) };
    result
}

/// Checks that the selected entry `p` was restored exactly as in `src`
/// (the source is unchanged: it is what was backed up).
fn assert_restored(target: &Path, p: &str, b: &Backed, what: &str) {
    let (st, bytes) = look(target, p).unwrap_or_else(|| panic!("{what}: /{p} missing"));
    let fmt = st.st_mode & libc::S_IFMT;
    let src = Path::new("/").join(p);
    match b.kind.as_str() {
        "dir" => assert_eq!(fmt, libc::S_IFDIR, "{what}: /{p}"),
        "symlink" => {
            assert_eq!(fmt, libc::S_IFLNK, "{what}: /{p}");
        }
        "fifo" => assert_eq!(fmt, libc::S_IFIFO, "{what}: /{p}"),
        "file" | "hardlink" => {
            assert_eq!(fmt, libc::S_IFREG, "{what}: /{p}");
            let want = match src.as_os_str().len() < 4000 {
                true => fs::read(&src).unwrap(),
                false => b"deep leaf".to_vec(),
            };
            assert!(
                bytes.as_deref() == Some(&want[..]),
                "{what}: contents of /{p}"
            );
            if src.as_os_str().len() < 4000 {
                let m = fs::symlink_metadata(&src).unwrap();
                assert_eq!(
                    st.st_mode & 0o7777,
                    m.mode() & 0o7777,
                    "{what}: mode of /{p}"
                );
                assert_eq!(st.st_mtime, m.mtime(), "{what}: mtime of /{p}");
            }
        }
        k => panic!("{what}: unexpected kind {k}"),
    }
}

/// `restore --json REPO ID TARGET`, with `includes` and `mode`.
fn restore_args(
    repo: &Path,
    id: u64,
    target: &Path,
    includes: &[String],
    mode: Mode,
) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "restore".into(),
        "--json".into(),
        repo.display().to_string(),
        id.to_string(),
        target.display().to_string(),
    ];
    for i in includes {
        args.extend(["--include".to_string(), i.clone()]);
    }
    if let Some(a) = mode.arg() {
        args.push(a.into());
    }
    args
}

/// A restore with an include pattern matching nothing besides `args`'
/// fails (exit status 1) naming it, and writes nothing.
fn check_missing(args: &[String], target: &Path) -> Result<(), TestCaseError> {
    let mut missing = args.to_vec();
    missing.extend(["--include".to_string(), "./no/such/entry".to_string()]);
    let mut was = BTreeMap::new();
    snapshot(target, &mut was);
    let out = run(&missing);
    prop_assert_eq!(out.status.code(), Some(1), "{:?}", out);
    prop_assert!(String::from_utf8_lossy(&out.stderr).contains("./no/such/entry"));
    let mut now = BTreeMap::new();
    snapshot(target, &mut now);
    prop_assert_eq!(was, now, "a pattern matching nothing writes nothing");
    Ok(())
}

fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let base = tempfile::tempdir().unwrap();
    let base = base.path();
    let (src, outside) = (base.join("src"), base.join("outside"));
    fs::create_dir_all(outside.join("d")).unwrap();
    fs::write(outside.join("d/f"), b"outside").unwrap();
    let made = make_tree(case, &src, &outside);
    let repo = base.join("repo");
    init(&repo);
    let b: serde_json::Value = serde_json::from_str(
        ok([
            "backup".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            src.as_os_str(),
        ])
        .trim(),
    )
    .unwrap();
    let id = b["id"].as_u64().unwrap();
    prop_assert_eq!(&b["tree"]["skipped"], 0, "{}", b);
    let backed = listing(&repo, id);
    // Include patterns, by entry: absolute, or relative to the backed-up path.
    let mut includes: Vec<String> = Vec::new();
    let mut inc_paths: Vec<String> = Vec::new();
    for (k, relative) in &case.includes {
        if made.is_empty() {
            break;
        }
        let p = &made[k % made.len()];
        inc_paths.push(cat(p));
        includes.push(match relative {
            true => format!("./{}", p.strip_prefix(&src).unwrap().display()),
            false => p.display().to_string(),
        });
    }
    let selected = |p: &str| {
        inc_paths.is_empty()
            || inc_paths
                .iter()
                .any(|i| p == i || p.starts_with(&format!("{i}/")))
    };
    // Conflict positions: every entry of the backup that is no deeper than the source's nodes.
    let positions: Vec<String> = backed.keys().filter(|p| p.len() < 3000).cloned().collect();
    let targets = base.join("T".repeat(150));
    fs::create_dir(&targets).unwrap();
    let modes = [Mode::Refuse, Mode::Always, Mode::IfChanged, Mode::Never];
    let mut theres = Vec::new();
    for (k, _) in modes.iter().enumerate() {
        let t = targets.join(k.to_string());
        fs::create_dir(&t).unwrap();
        theres.push(prefill(&t, &positions, &case.conflicts, &outside));
    }
    let before = outside_state(base);
    for (k, &mode) in modes.iter().enumerate() {
        let target = targets.join(k.to_string());
        let args = restore_args(&repo, id, &target, &includes, mode);
        if case.missing {
            check_missing(&args, &target)?;
        }
        let out = run(&args);
        let what = format!("{mode:?}, {includes:?}");
        prop_assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "{}: {:?}",
            what,
            out
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let failed: Vec<String> = v["failed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                f["path"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches('/')
                    .to_string()
            })
            .collect();
        prop_assert_eq!(
            out.status.code() == Some(3),
            !failed.is_empty(),
            "{}: {}",
            what,
            v
        );
        prop_assert_eq!(
            &outside_state(base),
            &before,
            "{}: something outside the target changed",
            what
        );
        let reported = |p: &str| {
            failed
                .iter()
                .any(|f| f == p || p.starts_with(&format!("{f}/")))
        };
        let mut must_fail = false;
        let mut either = false;
        for (p, b) in backed.iter().filter(|(p, _)| selected(p)) {
            match expect(p, &backed, &selected, &theres[k], mode) {
                Expect::Restored => {
                    prop_assert!(!reported(p), "{}: /{} reported: {}", what, p, v);
                    assert_restored(&target, p, b, &what);
                }
                Expect::Kept => {
                    let (st, _) = look(&target, p).unwrap();
                    let kept = match theres[k][p.as_str()] {
                        Conflict::File => libc::S_IFREG,
                        Conflict::Dir => libc::S_IFDIR,
                        Conflict::Fifo => libc::S_IFIFO,
                        _ => libc::S_IFLNK,
                    };
                    prop_assert_eq!(st.st_mode & libc::S_IFMT, kept, "{}: /{} kept", what, p);
                }
                Expect::Reported => {
                    must_fail = true;
                    prop_assert!(reported(p), "{}: /{} not reported: {}", what, p, v);
                }
                Expect::Either => either = true,
            }
        }
        if !must_fail && !either {
            prop_assert!(failed.is_empty(), "{}: nothing to report, yet: {}", what, v);
        }
        let partial = std::process::Command::new("find")
            .arg(&target)
            .args(["-name", ".tessera-partial*"])
            .output()
            .unwrap();
        prop_assert!(
            partial.stdout.is_empty(),
            "{}: partial files left: {:?}",
            what,
            partial
        );
    }
    Ok(())
}

proptest! {
    // Each case backs up one tree and restores it four times (and four
    // more with a pattern matching nothing): a few seconds at most.
    #![proptest_config(ProptestConfig {
        cases: 12,
        max_shrink_iters: 64,
        ..ProptestConfig::default()
    })]

    #[test]
    fn restores_stay_beneath_their_target_and_report_what_they_cannot_restore(case in case()) {
        run_case(&case)?;
    }
}
