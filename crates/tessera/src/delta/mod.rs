//! Delta compression of similar chunks (PFC-delta, issue #8): a chunk to be
//! stored (the *target*) is encoded against a similar stored chunk (the
//! *base*) as COPY and INSERT ops.
//!
//! [`encode`] picks the encoder: [hash-less](hashless_applicable) for
//! chunks whose common strings sit at the same positions (equal lengths,
//! metadata changed in place), else the Edelta-style encoder, which finds
//! shifted content through a hash index of the base. [`decode`] rebuilds
//! the target. [`features`] computes the super-features that find a base.
//!
//! The backup pipeline's use of them lives in [`stage`] (base lookup,
//! policies `pfc` and `greedy`), [`cache`] (the base chunk cache) and
//! [`pfc`] (persistent fragmented chunk identification).
//!
//! # Delta format, version 1
//!
//! ```text
//! delta  = version target_len op*
//! version: one byte, 1
//! target_len: varint, the length of the target, at most 16 MiB (a chunk)
//! op     = COPY:   varint(len << 1)      varint(offset)  -- base[offset .. offset + len]
//!        | INSERT: varint(len << 1 | 1)  byte{len}       -- the bytes themselves
//! varint: unsigned LEB128: 7 bits per byte, least significant group first,
//!         high bit set on all bytes but the last; at most 10 bytes, < 2^64
//! ```
//!
//! The ops' outputs, concatenated in order, are the target: every `len` is
//! at least 1, every COPY lies within the base, the lengths add up to
//! `target_len` exactly, and the delta ends with the last op (a target of
//! length 0 has no ops). Offsets are absolute positions in the base.
//!
//! The format has no checksum: deltas are stored inside checksummed
//! objects, and the decoded chunk is verified against its fingerprint like
//! any stored chunk.

/// Recently loaded containers a restore keeps for the bases of
/// delta-encoded chunks: PFC-delta's `referenced` base scope takes bases only
/// from as many, so every base is still held when its target is restored.
pub const BASE_CONTAINERS: usize = 16;

pub mod cache;
mod compare;
mod edelta;
pub mod features;
mod format;
mod gear;
mod hashless;
pub mod params;
pub mod pfc;
pub mod stage;

pub use format::decode;
pub use hashless::applicable as hashless_applicable;
pub use params::{DeltaKind, DeltaParams};
pub use stage::DeltaStats;

/// The encoder that produced a delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Hash-less encoding: position-by-position comparison (PFC-delta §IV-C).
    HashLess,
    /// The Edelta-style encoder: hash index of the base, word-enlarging.
    Edelta,
}

/// A delta and the encoder [`encode`] chose for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    /// The encoder used, for the pipeline's "hash-less vs fallback" counts.
    pub method: Method,
    /// The encoded delta (format in the [module docs](self)).
    pub bytes: Vec<u8>,
}

/// Encodes `target` against `base` with hash-less encoding when
/// [`hashless_applicable`], else with the Edelta-style encoder.
pub fn encode(base: &[u8], target: &[u8]) -> Delta {
    let method = if hashless_applicable(base, target) {
        Method::HashLess
    } else {
        Method::Edelta
    };
    Delta {
        method,
        bytes: encode_with(method, base, target),
    }
}

/// Encodes `target` against `base` with the given encoder. Both are correct
/// for any pair; hash-less encoding is compact only for pairs without
/// shifted content.
pub fn encode_with(method: Method, base: &[u8], target: &[u8]) -> Vec<u8> {
    match method {
        Method::HashLess => hashless::encode(base, target),
        Method::Edelta => edelta::encode(base, target),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An edit of a target made from a base.
    #[derive(Clone, Debug)]
    enum Edit {
        Overwrite(usize, Vec<u8>),
        Insert(usize, Vec<u8>),
        Delete(usize, usize),
    }

    fn apply(base: &[u8], edits: &[Edit]) -> Vec<u8> {
        let mut t = base.to_vec();
        for e in edits {
            // Positions are taken modulo the current length.
            let at = |p: usize, len: usize| p % (len + 1);
            match e {
                Edit::Overwrite(p, bytes) => {
                    let start = at(*p, t.len());
                    let end = (start + bytes.len()).min(t.len());
                    t[start..end].copy_from_slice(&bytes[..end - start]);
                }
                Edit::Insert(p, bytes) => {
                    let start = at(*p, t.len());
                    t.splice(start..start, bytes.iter().copied());
                }
                Edit::Delete(p, n) => {
                    let start = at(*p, t.len());
                    t.drain(start..(start + n).min(t.len()));
                }
            }
        }
        t
    }

    /// Random bytes, or bytes of a 3-letter alphabet (many repeats and
    /// short equal runs, hash collisions in the Edelta index).
    fn data(max: usize) -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..max),
            prop::collection::vec(0u8..3, 0..max),
        ]
    }

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), 1..40)
    }

    fn in_place_edits() -> impl Strategy<Value = Vec<Edit>> {
        prop::collection::vec(
            (any::<usize>(), bytes()).prop_map(|(p, b)| Edit::Overwrite(p, b)),
            0..8,
        )
    }

    fn shifting_edits() -> impl Strategy<Value = Vec<Edit>> {
        prop::collection::vec(
            prop_oneof![
                (any::<usize>(), bytes()).prop_map(|(p, b)| Edit::Overwrite(p, b)),
                (any::<usize>(), bytes()).prop_map(|(p, b)| Edit::Insert(p, b)),
                (any::<usize>(), 1usize..200).prop_map(|(p, n)| Edit::Delete(p, n)),
            ],
            1..8,
        )
    }

    /// Both encoders, and the choice of [`encode`], round-trip.
    fn check_round_trip(base: &[u8], target: &[u8]) -> Result<(), TestCaseError> {
        for method in [Method::HashLess, Method::Edelta] {
            let d = encode_with(method, base, target);
            prop_assert_eq!(decode(base, &d).ok(), Some(target.to_vec()), "{:?}", method);
        }
        let d = encode(base, target);
        prop_assert_eq!(
            d.method == Method::HashLess,
            hashless_applicable(base, target)
        );
        prop_assert_eq!(decode(base, &d.bytes).ok(), Some(target.to_vec()));
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn identical_chunks_round_trip(base in data(20_000)) {
            check_round_trip(&base, &base)?;
            prop_assert!(hashless_applicable(&base, &base));
        }

        #[test]
        fn in_place_edits_round_trip(base in data(20_000), edits in in_place_edits()) {
            let target = apply(&base, &edits);
            prop_assert_eq!(target.len(), base.len());
            check_round_trip(&base, &target)?;
        }

        #[test]
        fn insertions_and_deletions_round_trip(base in data(20_000), edits in shifting_edits()) {
            check_round_trip(&base, &apply(&base, &edits))?;
        }

        #[test]
        fn unrelated_and_empty_chunks_round_trip(base in data(5_000), target in data(5_000)) {
            check_round_trip(&base, &target)?;
            check_round_trip(&[], &target)?;
            check_round_trip(&base, &[])?;
        }

        /// On random data, a delta costs a bounded number of bytes per edit
        /// beyond the edit's own bytes, whatever the chunk's length.
        #[test]
        fn deltas_grow_with_the_edits_not_the_chunk(
            base in prop::collection::vec(any::<u8>(), 0..20_000),
            in_place in in_place_edits(),
            shifting in shifting_edits(),
        ) {
            let budget = |edits: &[Edit]| {
                let edited = |e: &Edit| match e {
                    Edit::Overwrite(_, b) | Edit::Insert(_, b) => b.len(),
                    Edit::Delete(..) => 0,
                };
                // Header, plus a run too short to span an aligned base word
                // (under 31 bytes: a tiny chunk) that Edelta inserts literally.
                48 + edits.iter().map(|e| edited(e) + 48).sum::<usize>()
            };
            let target = apply(&base, &in_place);
            for method in [Method::HashLess, Method::Edelta] {
                let len = encode_with(method, &base, &target).len();
                prop_assert!(len <= budget(&in_place), "{:?}: {} bytes", method, len);
            }
            let target = apply(&base, &shifting);
            let len = encode_with(Method::Edelta, &base, &target).len();
            prop_assert!(len <= budget(&shifting), "{} bytes", len);
        }

        /// Every strict prefix of a delta, and the delta with bytes
        /// appended, is rejected.
        #[test]
        fn truncated_or_extended_deltas_are_rejected(
            base in data(3_000),
            edits in shifting_edits(),
            extra in bytes(),
        ) {
            let target = apply(&base, &edits);
            let d = encode(&base, &target).bytes;
            for end in 0..d.len() {
                prop_assert!(decode(&base, &d[..end]).is_err(), "prefix of {} bytes", end);
            }
            prop_assert!(decode(&base, &[&d[..], &extra].concat()).is_err());
        }
    }

    /// An 8 KiB chunk with a changed 16-byte header and 2 changed bytes.
    fn few_edits() -> (Vec<u8>, Vec<u8>) {
        let base: Vec<u8> = (0..8192).map(|i| gear::random(7, i) as u8).collect();
        let edits = [
            Edit::Overwrite(64, b"2026-05-01 12:00".to_vec()),
            Edit::Overwrite(3000, vec![0x55]),
            Edit::Overwrite(6000, vec![0xAA]),
        ];
        let target = apply(&base, &edits);
        (base, target)
    }

    #[test]
    fn deltas_of_few_edits_are_small() {
        let (base, target) = few_edits();
        let d = encode(&base, &target);
        assert_eq!(d.method, Method::HashLess);
        for bytes in [d.bytes, encode_with(Method::Edelta, &base, &target)] {
            assert_eq!(decode(&base, &bytes).unwrap(), target);
            assert!(bytes.len() < 64, "{} bytes for 8192", bytes.len());
        }
    }

    #[test]
    fn a_target_larger_than_any_chunk_is_rejected_before_decoding() {
        // Version 1, target length 2^30, then a COPY of 1 byte repeated:
        // a few bytes that would otherwise decode into a gigabyte.
        let mut d = vec![1, 0x80, 0x80, 0x80, 0x80, 0x04];
        d.extend(std::iter::repeat_n([2u8, 0], 1000).flatten());
        let err = decode(b"x", &d).unwrap_err().to_string();
        assert!(err.contains("exceeds the largest chunk"), "{err}");
    }

    #[test]
    fn shifted_content_falls_back_to_edelta() {
        let (base, mut target) = few_edits();
        target.insert(100, b'!');
        let d = encode(&base, &target);
        assert_eq!(d.method, Method::Edelta);
        assert!(d.bytes.len() < 64, "{} bytes", d.bytes.len());
        // Hash-less encoding of the same pair copies only the first 100 bytes.
        assert!(encode_with(Method::HashLess, &base, &target).len() > 8000);
    }
}
