//! Edelta-style delta encoding (Xia et al., HotStorage'15): a Gear-hash
//! index of the base finds alignments, and word-enlarging extends each
//! verified match with 8-byte compares instead of hashing every byte.
//!
//! The base is indexed by the Gear hash of each [`WORD`]-byte word at a
//! multiple of [`WORD`]. The target is scanned byte by byte with the same
//! hash rolling over a [`WORD`]-byte window; on a hit the candidate is
//! verified, and the match is extended forward and backward (the backward
//! extension recovers the bytes before the aligned word) and emitted as a
//! COPY; scanning resumes after the match without hashing it. Content
//! shifted by insertions or deletions is found whenever a common run spans
//! an aligned base word, i.e. runs of at least `2 * WORD - 1` bytes.

use super::compare::{match_len, match_len_back};
use super::format::Writer;
use super::gear;

/// Shift of the Gear hash: 4 bits per byte gives a 16-byte window.
const SHIFT: u32 = 4;
/// Word length: the hash window and the stride of the base index.
const WORD: usize = 64 / SHIFT as usize;

/// Gear hashes of the base's aligned words in a direct-mapped table.
struct BaseIndex {
    /// Word position + 1 per slot (0: empty). Only positions below
    /// `u32::MAX` are indexed (chunks are at most 16 MiB).
    slots: Vec<u32>,
    bits: u32,
}

impl BaseIndex {
    fn new(base: &[u8]) -> Self {
        let words = base.len() / WORD;
        // At least twice as many slots as words: few collisions.
        let bits = (2 * words).max(16).next_power_of_two().trailing_zeros();
        let mut index = BaseIndex {
            slots: vec![0; 1 << bits],
            bits,
        };
        for (k, w) in base.as_chunks::<WORD>().0.iter().enumerate() {
            let Ok(pos) = u32::try_from(k * WORD + 1) else {
                break;
            };
            let h = w.iter().fold(0, |h, &b| gear::roll::<SHIFT>(h, b));
            let i = index.slot(h);
            // Keep the first word of a repeated hash.
            if index.slots[i] == 0 {
                index.slots[i] = pos;
            }
        }
        index
    }

    /// The slot of hash `h`.
    fn slot(&self, h: u64) -> usize {
        // Gear's low bits depend on the latest bytes only: mix before taking the top bits.
        (h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }

    /// The base position whose word may hash to `h`.
    fn get(&self, h: u64) -> Option<usize> {
        (self.slots[self.slot(h)] as usize).checked_sub(1)
    }
}

/// Encodes `target` against `base`; correct for any pair.
pub(super) fn encode(base: &[u8], target: &[u8]) -> Vec<u8> {
    let mut w = Writer::new(target.len());
    let index = BaseIndex::new(base);
    // Target bytes before `lit` are encoded; the window starts at `s`.
    let mut lit = 0;
    let mut s = lit;
    let mut h = 0;
    let mut filled = 0;
    while s + WORD <= target.len() {
        // Roll the window forward until it holds target[s..s + WORD].
        while filled < WORD {
            h = gear::roll::<SHIFT>(h, target[s + filled]);
            filled += 1;
        }
        if let Some(p) = index.get(h) {
            let fwd = match_len(&base[p..], &target[s..]);
            if fwd >= WORD {
                let back = match_len_back(&base[..p], &target[lit..s]);
                w.insert(&target[lit..s - back]);
                w.copy(p - back, back + fwd);
                lit = s + fwd;
                s = lit;
                filled = 0;
                continue;
            }
        }
        s += 1;
        filled -= 1;
    }
    w.insert(&target[lit..]);
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::decode;

    fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
        (0..len).map(|i| gear::random(seed, i) as u8).collect()
    }

    #[test]
    fn shifted_content_is_copied() {
        let base = pseudo_random(8192, 1);
        // Insert 5 bytes at 1000, delete 20 at 5000, change a byte at 7000.
        let mut target = base[..1000].to_vec();
        target.extend_from_slice(b"hello");
        target.extend_from_slice(&base[1000..5000]);
        target.extend_from_slice(&base[5020..]);
        target[7000] ^= 0xff;
        let d = encode(&base, &target);
        assert_eq!(decode(&base, &d).unwrap(), target);
        // 4 COPYs of ≤ 5 bytes, INSERTs of 5 and 1 byte, a 3-byte header.
        assert!(d.len() <= 3 + 4 * 5 + 2 * 2 + 6, "{} bytes", d.len());
    }

    #[test]
    fn unrelated_data_is_inserted_whole() {
        let base = pseudo_random(4096, 2);
        let target = pseudo_random(4096, 3);
        let d = encode(&base, &target);
        assert_eq!(decode(&base, &d).unwrap(), target);
        assert!(d.len() <= target.len() + 6);
    }
}
