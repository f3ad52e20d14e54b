//! Helpers shared by the integration tests (and the lifecycle bench):
//! deterministic data, edited versions, directory copies. (The test
//! backends — in memory, faulty, gated — are in `tessera::backend::testing`.)
#![allow(dead_code)] // each test binary uses a part

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tessera::backend::LockMode;
use tessera::backup::{backup, BackupOptions, Input, Outcome};
use tessera::chunker::{ChunkerKind, ChunkerParams};
use tessera::commands::check::{check, CheckOptions, CheckReport};
use tessera::repo::config::{Arrange, Config, Layout};
use tessera::restore::{restore, RestoreOptions};
use tessera::Repository;

/// A lifecycle-layout configuration with small chunks (FastCDC
/// 512/2048/8192) and small parts, so that categories and volumes span
/// several objects even with little data.
pub fn small_lifecycle_config(name: &str, arrange: Arrange) -> Config {
    let mut c = Config::new(name.into());
    c.chunker = ChunkerParams {
        kind: ChunkerKind::Fastcdc,
        min_size: 512,
        avg_size: 2048,
        max_size: 8192,
    };
    c.layout = Layout::Lifecycle;
    c.arrange = arrange;
    c.lifecycle_part_bytes = 16 * 1024;
    c
}

/// FastCDC chunking of 256/1024/4096 bytes: many chunks from little data.
pub fn small_chunker() -> ChunkerParams {
    ChunkerParams {
        kind: ChunkerKind::Fastcdc,
        min_size: 256,
        avg_size: 1024,
        max_size: 4096,
    }
}

/// A xorshift generator: deterministic test data from a seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// `prev` with `edits` overwrites, insertions and deletions of up to
/// `max_len` bytes each, chosen by `seed`.
pub fn edit(prev: &[u8], edits: u32, max_len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut v = prev.to_vec();
    for _ in 0..edits {
        let at = (rng.next() as usize) % v.len().max(1);
        let len = 1 + (rng.next() as usize) % max_len.max(1);
        match rng.next() % 3 {
            0 => {
                let end = (at + len).min(v.len());
                let fresh = rng.bytes(end - at);
                v[at..end].copy_from_slice(&fresh);
            }
            1 => {
                let fresh = rng.bytes(len);
                v.splice(at..at, fresh);
            }
            _ => {
                let end = (at + len).min(v.len());
                v.drain(at..end);
            }
        }
    }
    v
}

/// Copies the directory tree `from` to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// The report of `check` of the repository at `path` (read-only), as text,
/// with `read_data` and a sort budget of `sort_budget` bytes.
pub fn check_report(path: &Path, read_data: bool, sort_budget: u64) -> String {
    let repo = tessera::repo::Repository::open(path, LockMode::Read).unwrap();
    let options = tessera::commands::check::CheckOptions {
        read_data,
        sort_budget,
    };
    format!(
        "{:?}",
        tessera::commands::check::check(&repo, options).unwrap()
    )
}

/// The paths of the files under `dir` whose path contains `part`, sorted.
pub fn paths(dir: &Path, part: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.to_string_lossy().contains(part) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The files under `dir`, sorted, with their bytes, keyed by their path
/// relative to `dir`.
pub fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    paths(dir, "")
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p.strip_prefix(dir).unwrap().to_path_buf(), bytes)
        })
        .collect()
}

/// The first path (in order) that one of two [`files`] maps holds and the
/// other does not, or holds with other bytes; `None` when they are equal.
pub fn first_difference(
    a: &BTreeMap<PathBuf, Vec<u8>>,
    b: &BTreeMap<PathBuf, Vec<u8>>,
) -> Option<PathBuf> {
    let (mut x, mut y) = (a.iter(), b.iter());
    loop {
        match (x.next(), y.next()) {
            (None, None) => return None,
            (Some((p, u)), Some((q, v))) if p == q && u == v => {}
            (Some((p, _)), Some((q, _))) => return Some(p.min(q).clone()),
            (Some((p, _)), None) | (None, Some((p, _))) => return Some(p.clone()),
        }
    }
}

/// Damages one NDF table of the lifecycle repository at `root`, the
/// `pick`-th (modulo their number): flips a bit of its byte at `flip`
/// (modulo its length), or deletes it when `flip` is `None`. Does nothing
/// when the repository has no table.
pub fn damage_ndf_table(root: &Path, pick: usize, flip: Option<usize>) {
    let tables = paths(&root.join("lifecycle"), "/ndf/");
    let Some(path) = tables.get(pick % tables.len().max(1)) else {
        return;
    };
    match flip {
        Some(at) => {
            let mut b = std::fs::read(path).unwrap();
            if !b.is_empty() {
                let at = at % b.len();
                b[at] ^= 0x10;
                std::fs::write(path, b).unwrap();
            }
        }
        None => std::fs::remove_file(path).unwrap(),
    }
}

/// The report of a `check` of `repo` that reads every chunk (`--read-data`).
pub fn full_check(repo: &Repository) -> CheckReport {
    check(
        repo,
        CheckOptions {
            read_data: true,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Backs up `data` into `repo` as one stream named `name`; the outcome.
pub fn backup_bytes(
    repo: &Repository,
    data: &[u8],
    name: &str,
    options: &BackupOptions,
) -> tessera::Result<Outcome> {
    backup(
        repo,
        Input::Stream {
            input: &mut &data[..],
            name,
        },
        options,
    )
}

/// The bytes backup `id` of `repo` restores to (default options).
pub fn restored(repo: &Repository, id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    restore(repo, id, &mut out, &RestoreOptions::default()).unwrap();
    out
}
