//! A small, fast, fully specified PRNG (wyrand) and the distributions the
//! model draws from. Its output is fixed by this code alone, so datasets stay
//! byte-identical across builds and dependency upgrades.

/// SplitMix64's finalizer: a bijective 64-bit mixer.
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash of two words (seed derivation: `hash2(seed, index)`).
#[inline]
pub(crate) fn hash2(a: u64, b: u64) -> u64 {
    mix64(a ^ mix64(b.wrapping_add(0x9e37_79b9_7f4a_7c15)).rotate_left(23))
}

/// wyrand: one 64-bit state word, one 128-bit multiply per output.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(mix64(seed ^ 0x2545_f491_4f6c_dd1d))
    }

    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0).wrapping_mul(u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db));
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Uniform in [0, 1).
    #[inline]
    pub(crate) fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n) (0 when n is 0).
    #[inline]
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    #[inline]
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.f64(); // (0, 1]
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Lognormal with the given median and shape.
    pub(crate) fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }

    /// Pareto with scale `xm` and shape `alpha`.
    pub(crate) fn pareto(&mut self, xm: f64, alpha: f64) -> f64 {
        let u = 1.0 - self.f64(); // (0, 1]
        xm / u.powf(1.0 / alpha)
    }

    /// `x` rounded up or down at random so that the expectation is `x`.
    pub(crate) fn round(&mut self, x: f64) -> u64 {
        if x.is_nan() || x <= 0.0 {
            return 0;
        }
        let f = x.floor();
        f as u64 + u64::from(self.f64() < x - f)
    }

    /// Fills `buf` with random bytes, eight at a time.
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let v = self.next_u64().to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&v[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_output() {
        let mut a = Rng::new(1);
        let mut b = Rng::new(1);
        let mut c = Rng::new(2);
        let x: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let y: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        let z: Vec<u64> = (0..4).map(|_| c.next_u64()).collect();
        assert_eq!(x, y);
        assert_ne!(x, z);
        for _ in 0..1000 {
            assert!(a.below(7) < 7);
            let f = a.f64();
            assert!((0.0..1.0).contains(&f));
        }
    }

    #[test]
    fn distributions_are_sane() {
        let mut r = Rng::new(9);
        let n = 20_000;
        let mut logs: Vec<f64> = (0..n).map(|_| r.lognormal(1000.0, 1.0)).collect();
        logs.sort_by(|a, b| a.total_cmp(b));
        let median = logs[n / 2];
        assert!((800.0..1250.0).contains(&median), "{median}");
        assert!((0..n).all(|_| r.pareto(10.0, 1.5) >= 10.0));
        let total: u64 = (0..n).map(|_| r.round(0.25)).sum();
        assert!((4_000..6_000).contains(&total), "{total}");
    }
}
