//! Helpers shared by the integration tests (and the lifecycle bench):
//! deterministic data, edited versions, directory copies.
#![allow(dead_code)] // each test binary uses a part

use std::path::Path;

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
