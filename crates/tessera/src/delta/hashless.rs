//! Hash-less delta encoding (PFC-delta §IV-C) for chunks whose common
//! strings sit at the same positions.
//!
//! From the start of both chunks, alternately measure the longest matched
//! run (emitted as a COPY from the same offset of the base) and the longest
//! unmatched run (emitted as an INSERT), comparing 8 bytes at a time. No
//! hashing, no index: the cost is one pass of word compares.

use super::compare::{match_len, unmatched_len};
use super::format::Writer;

/// Equal runs shorter than this stay inside an INSERT: a COPY op costs 3–5
/// bytes plus the INSERT op it splits, so shorter runs would not pay.
const MIN_COPY: usize = 8;

/// Number of portions [`applicable`] samples.
const SAMPLES: usize = 4;
/// Length of each sampled portion.
const SAMPLE_LEN: usize = 32;

/// Whether hash-less encoding suits `target` against `base`: both have the
/// same length, and at least one of 4 portions of 32 bytes sampled at the
/// end is identical in both.
///
/// Shifted content (an insertion or deletion) usually changes a chunk's
/// length; when the lengths still agree, a shift leaves the ends misaligned,
/// while edits in place (changed metadata) leave most of them identical.
/// The portions are the 32 bytes ending at `n`, `n − n/16`, `n − 2n/16` and
/// `n − 3n/16` for a chunk of `n` bytes: spread over its last quarter
/// (for `n` ≥ 512), the first being the chunk's tail. For chunks shorter
/// than 32 bytes each portion is the whole chunk.
pub fn applicable(base: &[u8], target: &[u8]) -> bool {
    let n = target.len();
    base.len() == n
        && (0..SAMPLES).any(|k| {
            let end = n - k * (n / 16);
            let start = end.saturating_sub(SAMPLE_LEN);
            base[start..end] == target[start..end]
        })
}

/// Encodes `target` against `base` position by position. Correct for any
/// pair (target bytes beyond the base's end are inserted), compact when
/// [`applicable`].
pub(super) fn encode(base: &[u8], target: &[u8]) -> Vec<u8> {
    let mut w = Writer::new(target.len());
    let mut i = 0;
    while i < target.len() {
        let u = unmatched_len(base.get(i..).unwrap_or_default(), &target[i..], MIN_COPY);
        w.insert(&target[i..i + u]);
        i += u;
        // Either the target ends here or a run of at least MIN_COPY starts.
        let m = match_len(base.get(i..).unwrap_or_default(), &target[i..]);
        w.copy(i, m);
        i += m;
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::decode;

    #[test]
    fn in_place_edits_give_copies_at_the_same_offsets() {
        let base: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut target = base.clone();
        target[100..104].copy_from_slice(b"WXYZ");
        target[2000] ^= 1;
        // A short equal run inside an edit stays in the INSERT.
        target[3000..3010].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        target[3003] = base[3003];
        assert!(applicable(&base, &target));
        let d = encode(&base, &target);
        assert_eq!(decode(&base, &d).unwrap(), target);
        // header 3, 4 COPYs of ≤ 5, INSERTs of 4, 1, 10 bytes with 1-byte tags.
        assert!(d.len() <= 3 + 4 * 5 + 3 + 15, "{} bytes", d.len());
    }

    #[test]
    fn applicability() {
        let base: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 253) as u8).collect();
        assert!(applicable(&base, &base));
        assert!(applicable(b"", b""));
        assert!(!applicable(&base, &base[1..]));
        // Edits at the front only: the tail samples match.
        let mut front = base.clone();
        front[..1024].fill(0xAA);
        assert!(applicable(&base, &front));
        // The tail sample changed, but another sample is intact.
        let mut tail = base.clone();
        tail[8191] ^= 1;
        assert!(applicable(&base, &tail));
        // Content shifted by one byte, at equal length.
        let mut shifted = base[1..].to_vec();
        shifted.push(0);
        assert!(!applicable(&base, &shifted));
        // Every sample touched.
        let mut all = base.clone();
        for k in 0..SAMPLES {
            all[8191 - k * 512] ^= 1;
        }
        assert!(!applicable(&base, &all));
        // Short chunks compare whole.
        assert!(applicable(b"abc", b"abc"));
        assert!(!applicable(b"abc", b"abd"));
    }
}
