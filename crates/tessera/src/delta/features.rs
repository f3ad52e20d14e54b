//! Similarity features: super-features that similar chunks share, for
//! finding a delta base among candidate chunks.
//!
//! Both kinds roll a Gear hash (`h = (h << 1) + GEAR[byte]`, a 64-byte
//! window) over the chunk, apply 12 linear transforms
//! `a_i · h + b_i (mod 2^64)` to the hash at sampled positions, keep the
//! maximum of each transform as feature `i`, and hash features `4j..4j+4`
//! into super-feature `j`. Two chunks are deemed similar when they agree on
//! at least one super-feature (compared slot by slot: super-feature `j` of
//! one chunk with super-feature `j` of the other). A few edits change only
//! the hashes of the windows they touch, so most maxima, and most likely
//! one whole group of four, survive.
//!
//! The kinds differ in the positions sampled:
//! * [`FeatureKind::Odess`] (Zou et al., FAST'21): content-defined
//!   sampling, only where `h & MASK == 0` with 7 mask bits (1 position in
//!   128), so the transforms cost little;
//! * [`FeatureKind::NTransform`] (Shilane et al., FAST'12): every position,
//!   the classic baseline.
//!
//! A chunk without a sampled position (Odess, in practice chunks of a few
//! hundred bytes or less) has all features 0, so all such chunks share
//! super-features: callers should not look for bases of tiny chunks.

use super::gear;

pub use crate::layout::container::SUPER_FEATURES;
/// Features grouped into one super-feature.
const PER_SUPER_FEATURE: usize = 4;
/// Number of features (linear transforms).
const FEATURES: usize = SUPER_FEATURES * PER_SUPER_FEATURE;

/// Odess' sampling mask: 7 bits spread over the hash, each depending on
/// at least the last 16 bytes.
const ODESS_MASK: u64 =
    (1 << 15) | (1 << 21) | (1 << 27) | (1 << 33) | (1 << 39) | (1 << 45) | (1 << 51);

/// The transforms' coefficients `(a_i, b_i)`, `a_i` odd.
static TRANSFORMS: [(u64, u64); FEATURES] = {
    let mut t = [(0, 0); FEATURES];
    let mut i = 0;
    while i < FEATURES {
        t[i] = (gear::random(0xA, i) | 1, gear::random(0xB, i));
        i += 1;
    }
    t
};

/// Which positions of a chunk the features sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureKind {
    #[default]
    /// Content-defined sampling of 1 position in 128 (Odess).
    Odess,
    /// Every position (N-transform super-features).
    NTransform,
}

impl std::str::FromStr for FeatureKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "odess" => Ok(FeatureKind::Odess),
            "ntransform" => Ok(FeatureKind::NTransform),
            other => Err(format!(
                "unknown similarity features {other:?} (expected odess or ntransform)"
            )),
        }
    }
}

/// The super-features of `data`.
pub fn super_features(kind: FeatureKind, data: &[u8]) -> [u64; SUPER_FEATURES] {
    let mask = match kind {
        FeatureKind::Odess => ODESS_MASK,
        FeatureKind::NTransform => 0,
    };
    let mut features = [0u64; FEATURES];
    // Four bytes per step: the hashes after each of them are computed from
    // the hash before the step and the table values alone, so the serial
    // chain is one shift and add per four bytes, not per byte (the same
    // hashes as rolling byte by byte).
    let mut h = 0u64;
    let (quads, rest) = data.as_chunks::<4>();
    for q in quads {
        let g = q.map(gear::value);
        let x2 = (g[0] << 1).wrapping_add(g[1]);
        let x3 = (x2 << 1).wrapping_add(g[2]);
        let x4 = (x3 << 1).wrapping_add(g[3]);
        let hs = [
            (h << 1).wrapping_add(g[0]),
            (h << 2).wrapping_add(x2),
            (h << 3).wrapping_add(x3),
            (h << 4).wrapping_add(x4),
        ];
        if hs.iter().fold(false, |any, &x| any | (x & mask == 0)) {
            for x in hs {
                if x & mask == 0 {
                    sample(&mut features, x);
                }
            }
        }
        h = hs[3];
    }
    for &b in rest {
        h = gear::roll::<1>(h, b);
        if h & mask == 0 {
            sample(&mut features, h);
        }
    }
    let mut sf = [0; SUPER_FEATURES];
    for (s, group) in sf
        .iter_mut()
        .zip(features.as_chunks::<PER_SUPER_FEATURE>().0)
    {
        *s = group.iter().fold(0, |acc, &f| gear::mix64(acc ^ f));
    }
    sf
}

/// Applies the transforms to the hash `h` of a sampled position.
#[inline(always)]
fn sample(features: &mut [u64; FEATURES], h: u64) {
    for (f, &(a, c)) in features.iter_mut().zip(&TRANSFORMS) {
        *f = (*f).max(a.wrapping_mul(h).wrapping_add(c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, RngCore, SeedableRng};

    fn share(a: &[u64; SUPER_FEATURES], b: &[u64; SUPER_FEATURES]) -> bool {
        a.iter().zip(b).any(|(x, y)| x == y)
    }

    /// Of `pairs` pairs of 8 KiB chunks, how many share a super-feature:
    /// (similar pairs with 4 small in-place edits, unrelated pairs).
    fn shared_counts(kind: FeatureKind, pairs: usize) -> (usize, usize) {
        let mut rng = StdRng::seed_from_u64(8);
        let (mut similar, mut unrelated) = (0, 0);
        for _ in 0..pairs {
            let mut base = vec![0u8; 8192];
            rng.fill_bytes(&mut base);
            let mut target = base.clone();
            for _ in 0..4 {
                let len = rng.random_range(1..=16);
                let at = rng.random_range(0..=target.len() - len);
                rng.fill_bytes(&mut target[at..at + len]);
            }
            let mut other = vec![0u8; 8192];
            rng.fill_bytes(&mut other);
            let sf = super_features(kind, &base);
            similar += usize::from(share(&sf, &super_features(kind, &target)));
            unrelated += usize::from(share(&sf, &super_features(kind, &other)));
        }
        (similar, unrelated)
    }

    /// The definition: roll byte by byte, sample where the mask is clear.
    fn reference(kind: FeatureKind, data: &[u8]) -> [u64; SUPER_FEATURES] {
        let mask = match kind {
            FeatureKind::Odess => ODESS_MASK,
            FeatureKind::NTransform => 0,
        };
        let mut features = [0u64; FEATURES];
        let mut h = 0;
        for &b in data {
            h = gear::roll::<1>(h, b);
            if h & mask == 0 {
                sample(&mut features, h);
            }
        }
        let mut sf = [0; SUPER_FEATURES];
        for (j, s) in sf.iter_mut().enumerate() {
            let group = &features[j * PER_SUPER_FEATURE..(j + 1) * PER_SUPER_FEATURE];
            *s = group.iter().fold(0, |acc, &f| gear::mix64(acc ^ f));
        }
        sf
    }

    proptest::proptest! {
        #[test]
        fn four_bytes_per_step_give_the_byte_by_byte_features(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..3000),
            skew in 0usize..4,
        ) {
            let data = &data[skew.min(data.len())..];
            for kind in [FeatureKind::Odess, FeatureKind::NTransform] {
                proptest::prop_assert_eq!(super_features(kind, data), reference(kind, data));
            }
        }
    }

    #[test]
    fn four_bytes_per_step_give_the_byte_by_byte_features_on_chunks() {
        let mut rng = StdRng::seed_from_u64(4);
        for len in [8191, 8192, 8193, 65_535] {
            let mut data = vec![0u8; len];
            rng.fill_bytes(&mut data);
            assert_eq!(
                super_features(FeatureKind::Odess, &data),
                reference(FeatureKind::Odess, &data)
            );
        }
    }

    #[test]
    fn similar_chunks_share_super_features_unrelated_ones_do_not() {
        for kind in [FeatureKind::Odess, FeatureKind::NTransform] {
            let (similar, unrelated) = shared_counts(kind, 200);
            assert!(
                similar >= 180,
                "{kind:?}: only {similar}/200 similar pairs share"
            );
            assert!(
                unrelated <= 2,
                "{kind:?}: {unrelated}/200 unrelated pairs share"
            );
        }
    }
}
