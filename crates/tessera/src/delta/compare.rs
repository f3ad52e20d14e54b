//! Word-at-a-time comparisons of two byte strings, shared by both encoders.
//!
//! Each compares 8 bytes at a time as little-endian `u64`s with one XOR; at
//! the first word that differs, the position of its lowest (or, backwards,
//! highest) non-zero byte is the first mismatching byte — the byte-wise step
//! done with one `trailing_zeros`/`leading_zeros`. The forward match, the
//! hot loop of both encoders, first skips equal 32-byte blocks (four XORs
//! or-ed, one branch).

/// Bytes `0x01` repeated: with [`HIGH`], the classic zero-byte test.
const LOW: u64 = u64::from_ne_bytes([0x01; 8]);
/// Bytes `0x80` repeated.
const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);

fn word(w: &[u8; 8]) -> u64 {
    u64::from_le_bytes(*w)
}

/// The length of the longest common prefix of `a` and `b`.
pub(super) fn match_len(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    // Skip equal 32-byte blocks with one branch per four words.
    let (ba, _) = a[..n].as_chunks::<8>().0.as_chunks::<4>();
    let (bb, _) = b[..n].as_chunks::<8>().0.as_chunks::<4>();
    let equal = ba
        .iter()
        .zip(bb)
        .take_while(|(x, y)| {
            x.iter()
                .zip(*y)
                .fold(0, |d, (p, q)| d | (word(p) ^ word(q)))
                == 0
        })
        .count();
    let skip = equal * 32;
    skip + word_match_len(&a[skip..n], &b[skip..n])
}

/// [`match_len`] one word at a time.
fn word_match_len(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (wa, _) = a[..n].as_chunks::<8>();
    let (wb, _) = b[..n].as_chunks::<8>();
    for (i, (x, y)) in wa.iter().zip(wb).enumerate() {
        let d = word(x) ^ word(y);
        if d != 0 {
            return i * 8 + (d.trailing_zeros() / 8) as usize;
        }
    }
    let done = wa.len() * 8;
    done + a[done..n]
        .iter()
        .zip(&b[done..n])
        .take_while(|(x, y)| x == y)
        .count()
}

/// The length of the longest common suffix of `a` and `b`.
pub(super) fn match_len_back(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (_, wa) = a[a.len() - n..].as_rchunks::<8>();
    let (_, wb) = b[b.len() - n..].as_rchunks::<8>();
    for (i, (x, y)) in wa.iter().rev().zip(wb.iter().rev()).enumerate() {
        let d = word(x) ^ word(y);
        if d != 0 {
            return i * 8 + (d.leading_zeros() / 8) as usize;
        }
    }
    let done = wa.len() * 8;
    done + a[..a.len() - done]
        .iter()
        .rev()
        .zip(b[..b.len() - done].iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

/// The position of the first byte at which `a` and `b` are equal (`n`, the
/// shorter length, if none).
fn first_equal(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (wa, _) = a[..n].as_chunks::<8>();
    let (wb, _) = b[..n].as_chunks::<8>();
    for (i, (x, y)) in wa.iter().zip(wb).enumerate() {
        let d = word(x) ^ word(y);
        // The lowest flagged byte is exactly the lowest zero byte of `d`.
        let zero = d.wrapping_sub(LOW) & !d & HIGH;
        if zero != 0 {
            return i * 8 + (zero.trailing_zeros() / 8) as usize;
        }
    }
    let done = wa.len() * 8;
    done + a[done..n]
        .iter()
        .zip(&b[done..n])
        .take_while(|(x, y)| x != y)
        .count()
}

/// The length of the longest prefix of `b` before a run of at least
/// `min_match` bytes equal to `a` at the same positions starts: `b.len()` if
/// no such run starts within both. Shorter equal runs count as unmatched.
pub(super) fn unmatched_len(a: &[u8], b: &[u8], min_match: usize) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    loop {
        i += first_equal(&a[i..n], &b[i..n]);
        if i == n {
            return b.len();
        }
        let m = match_len(&a[i..n], &b[i..n]);
        if m >= min_match {
            return i;
        }
        i += m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive_unmatched(a: &[u8], b: &[u8], min: usize) -> usize {
        let n = a.len().min(b.len());
        (0..n)
            .find(|&i| (i..n).take_while(|&j| a[j] == b[j]).count() >= min)
            .unwrap_or(b.len())
    }

    /// `a` and a copy of it with one byte changed (if `at` is within it)
    /// and cut to `len` bytes: long equal runs that end anywhere.
    fn edited_copy() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
        (
            prop::collection::vec(any::<u8>(), 0..200),
            any::<usize>(),
            any::<usize>(),
        )
            .prop_map(|(a, at, len)| {
                let mut b = a.clone();
                if let Some(x) = b.get_mut(at % 256) {
                    *x ^= 1;
                }
                b.truncate(len % 256);
                (a, b)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn matches_end_at_the_first_difference((a, b) in edited_copy()) {
            let n = a.len().min(b.len());
            let prefix = (0..n).take_while(|&i| a[i] == b[i]).count();
            let suffix = (1..=n).take_while(|&k| a[a.len() - k] == b[b.len() - k]).count();
            prop_assert_eq!(match_len(&a, &b), prefix);
            prop_assert_eq!(match_len(&b, &a), prefix);
            prop_assert_eq!(match_len_back(&a, &b), suffix);
            prop_assert_eq!(match_len_back(&b, &a), suffix);
        }

        /// Small alphabets make equal bytes (and runs of them) frequent.
        #[test]
        fn comparisons_agree_with_bytewise_ones(
            a in prop::collection::vec(0u8..3, 0..80),
            b in prop::collection::vec(0u8..3, 0..80),
            min in 1usize..6,
        ) {
            let n = a.len().min(b.len());
            let prefix = (0..n).take_while(|&i| a[i] == b[i]).count();
            let suffix = (1..=n).take_while(|&k| a[a.len() - k] == b[b.len() - k]).count();
            prop_assert_eq!(match_len(&a, &b), prefix);
            prop_assert_eq!(match_len_back(&a, &b), suffix);
            prop_assert_eq!(unmatched_len(&a, &b, min), naive_unmatched(&a, &b, min));
        }
    }
}
