//! `tessera mount` end to end: a backup of a generated tree, mounted in
//! both layouts, reads back every file byte for byte as `restore` writes it
//! and as the source holds it. Skipped, with a message, where FUSE is not
//! available (no `/dev/fuse`, or mounting is not permitted).

mod common;

use common::{backup_tree, cmd, init_layout, ok, random_bytes, sorted_names, write_random_file};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A tree of files from 0 bytes to 1.5 MiB in nested directories, with
/// symbolic links and odd modes.
fn make_tree(root: &Path) {
    let mut rng = common::rng(5);
    for i in 0..24u64 {
        let rel = format!("d{}/s{}/f{i}", i % 3, i % 5);
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let len = match i {
            0 => 0,
            1 => 65536,
            2 => 1_500_000,
            _ => rand::Rng::random_range(&mut rng, 1..200_000u64),
        };
        write_random_file(&p, 100 + i, len);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600 + (i as u32 % 8))).unwrap();
    }
    fs::create_dir_all(root.join("empty")).unwrap();
    symlink("d1/s1/f1", root.join("link")).unwrap();
    symlink("nowhere", root.join("d0/dangling")).unwrap();
}

/// Whether `path` is a mount point now (`/proc/self/mounts`).
fn mounted(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let p = path.display().to_string();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(p.as_str()))
}

/// A running `tessera mount`: stopped with SIGTERM, and the mount point
/// unmounted whatever happens, when dropped (a leftover mount would break
/// later runs).
struct Mount {
    child: Child,
    at: PathBuf,
}

impl Mount {
    /// Mounts `repo` at `at`; `None` (the test skipped) if FUSE is unavailable.
    fn start(repo: &Path, at: &Path) -> Option<Mount> {
        let child = cmd(["mount".as_ref(), repo.as_os_str(), at.as_os_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut m = Mount {
            child,
            at: at.to_path_buf(),
        };
        let started = Instant::now();
        while !mounted(at) {
            if let Some(status) = m.child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = m.child.stderr.take() {
                    e.read_to_string(&mut err).unwrap();
                }
                if err.contains("Operation not permitted") || err.contains("/dev/fuse") {
                    eprintln!("SKIPPED: tessera mount cannot mount here: {err}");
                    return None;
                }
                panic!("tessera mount exited ({status}): {err}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "not mounted after a minute"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(m)
    }

    /// Stops the mount with SIGTERM; returns whether it exited successfully
    /// and unmounted.
    fn stop(&mut self) -> bool {
        // SAFETY: signalling our own child process by its id.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let started = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break Some(s);
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = self.child.kill();
                break self.child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        status.is_some_and(|s| s.success()) && !mounted(&self.at)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
        if mounted(&self.at) {
            let c = std::ffi::CString::new(self.at.display().to_string()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Every object below `src` (relative paths), sorted.
fn walk(src: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
    let mut names: Vec<_> = fs::read_dir(src.join(rel))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for n in names {
        let r = rel.join(n);
        out.push(r.clone());
        if fs::symlink_metadata(src.join(&r)).unwrap().is_dir() {
            walk(src, &r, out);
        }
    }
}

/// Reads `path` in small, odd-sized reads (as a program reading a file
/// piecewise does), not one large read.
fn read_piecewise(path: &Path) -> Vec<u8> {
    let mut f = fs::File::open(path).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 12_345];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn every_file_of_a_mounted_backup_reads_as_restored_in_both_layouts() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED: /dev/fuse is not available");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_tree(&src);
    let stream = dir.path().join("stream.bin");
    fs::write(&stream, random_bytes(3, 900_000)).unwrap();
    for layout in ["container", "lifecycle"] {
        let repo = dir.path().join(format!("repo-{layout}"));
        init_layout(&repo, layout);
        backup_tree(&repo, &src);
        common::ok_with_input(["backup".as_ref(), repo.as_os_str(), "-".as_ref()], &stream);
        let restored = dir.path().join(format!("restored-{layout}"));
        ok([
            "restore".as_ref(),
            repo.as_os_str(),
            "1".as_ref(),
            restored.as_os_str(),
        ]);
        let restored_src = restored.join(src.strip_prefix("/").unwrap());

        let at = dir.path().join(format!("mnt-{layout}"));
        fs::create_dir(&at).unwrap();
        let Some(mut m) = Mount::start(&repo, &at) else {
            return;
        };
        let mounted_src = at.join("ids/1").join(src.strip_prefix("/").unwrap());
        let mut objects = Vec::new();
        walk(&src, Path::new(""), &mut objects);
        let mut files = 0;
        for rel in &objects {
            let (s, r, v) = (src.join(rel), restored_src.join(rel), mounted_src.join(rel));
            let sm = fs::symlink_metadata(&s).unwrap();
            let vm = fs::symlink_metadata(&v).unwrap_or_else(|e| panic!("{}: {e}", v.display()));
            assert_eq!(sm.file_type(), vm.file_type(), "{}", v.display());
            assert_eq!(sm.mode() & 0o7777, vm.mode() & 0o7777, "{}", v.display());
            assert_eq!(
                (sm.mtime(), sm.mtime_nsec()),
                (vm.mtime(), vm.mtime_nsec()),
                "{}",
                v.display()
            );
            if sm.is_symlink() {
                assert_eq!(fs::read_link(&s).unwrap(), fs::read_link(&v).unwrap());
            } else if sm.is_file() {
                let via_mount = fs::read(&v).unwrap();
                assert_eq!(via_mount.len() as u64, sm.len(), "{}", v.display());
                assert!(
                    via_mount == fs::read(&r).unwrap(),
                    "{} != restore",
                    v.display()
                );
                assert!(
                    via_mount == fs::read(&s).unwrap(),
                    "{} != source",
                    v.display()
                );
                assert!(read_piecewise(&v) == via_mount, "{}", v.display());
                files += 1;
            }
        }
        assert_eq!(files, 24);
        // The listing of a mounted directory is the source's.
        assert_eq!(
            sorted_names(&src.join("d1")),
            sorted_names(&mounted_src.join("d1"))
        );
        // The stream backup is one file; `latest` and `sources/` link to it.
        assert!(fs::read(at.join("ids/2")).unwrap() == fs::read(&stream).unwrap());
        assert!(fs::read(at.join("latest")).unwrap() == fs::read(&stream).unwrap());
        assert_eq!(
            fs::read_link(at.join("latest")).unwrap(),
            Path::new("ids/2")
        );
        let sources = sorted_names(&at.join("sources"));
        assert_eq!(sources.len(), 2, "{sources:?}");
        let tree_source = sources
            .iter()
            .find(|s| {
                s.to_string_lossy()
                    .ends_with(&src.display().to_string().replace('/', "%2F"))
            })
            .unwrap();
        let via_source = at.join("sources").join(tree_source).join("latest");
        assert_eq!(
            sorted_names(&via_source.join(src.strip_prefix("/").unwrap())),
            sorted_names(&src)
        );
        // Read-only.
        assert!(fs::write(mounted_src.join("new"), b"x").is_err());
        assert!(m.stop(), "tessera mount did not exit cleanly on SIGTERM");
    }
}

/// `n` small text files alike (what compression dictionaries are for),
/// the `version`-th edition of them.
fn write_similar_files(root: &Path, n: usize, version: usize) {
    for i in 0..n {
        let p = root.join(format!("pkg{}/mod_{i}.py", i % 5));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let body = format!(
            "# Copyright (c) the project authors. Licensed under the Apache License 2.0.\n\
             import os\nimport sys\nfrom typing import Any, Dict, Optional\n\n\
             class Handler{i}:\n    \"\"\"Handles requests of kind {} (edition {version}).\"\"\"\n\n    \
             def __init__(self, config: Optional[Dict[str, Any]] = None) -> None:\n        \
             self.config = config or {{}}\n        self.limit = {}\n\n    \
             def handle(self, request: Dict[str, Any]) -> str:\n        \
             return os.path.join(sys.prefix, str(request.get('field_{}', {})))\n",
            i % 7,
            i * 13 % 100,
            i % 11,
            i * 37 % 1000
        );
        fs::write(p, body).unwrap();
    }
}

/// Compression dictionaries (FORMAT.md §7.8) in both layouts: a backup of
/// small similar files trains one (the container layout during its first
/// backup, the lifecycle layout after it, for the next), and the files of
/// a backup compressed with it read back through `mount` as the source
/// holds them, as `restore` writes them, and `check --read-data` is clean.
#[test]
fn dictionary_compressed_files_read_back_through_mount_in_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for layout in ["container", "lifecycle"] {
        let repo = dir.path().join(format!("repo-{layout}"));
        init_layout(&repo, layout);
        for version in 1..=2 {
            write_similar_files(&src, 1500, version);
            backup_tree(&repo, &src);
        }
        let dicts = fs::read_dir(repo.join("dictionaries"))
            .map(|d| {
                d.filter(|e| {
                    !e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with('.')
                })
                .count()
            })
            .unwrap_or(0);
        assert_eq!(dicts, 1, "{layout}: one dictionary trained");
        ok(["check".as_ref(), repo.as_os_str(), "--read-data".as_ref()]);
        let restored = dir.path().join(format!("restored-dict-{layout}"));
        ok([
            "restore".as_ref(),
            repo.as_os_str(),
            "2".as_ref(),
            restored.as_os_str(),
        ]);
        let restored_src = restored.join(src.strip_prefix("/").unwrap());
        let at = dir.path().join(format!("mnt-dict-{layout}"));
        fs::create_dir(&at).unwrap();
        let Some(mut m) = Mount::start(&repo, &at) else {
            return;
        };
        let mounted_src = at.join("ids/2").join(src.strip_prefix("/").unwrap());
        let mut objects = Vec::new();
        walk(&src, Path::new(""), &mut objects);
        let mut files = 0;
        for rel in &objects {
            let s = src.join(rel);
            if !fs::symlink_metadata(&s).unwrap().is_file() {
                continue;
            }
            let via_mount = fs::read(mounted_src.join(rel)).unwrap();
            assert!(via_mount == fs::read(&s).unwrap(), "{}", rel.display());
            assert!(
                via_mount == fs::read(restored_src.join(rel)).unwrap(),
                "{}",
                rel.display()
            );
            files += 1;
        }
        assert_eq!(files, 1500);
        assert!(m.stop(), "{layout}: mount stopped cleanly");
    }
}
