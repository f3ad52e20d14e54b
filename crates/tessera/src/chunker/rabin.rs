//! Rabin-fingerprint content-defined chunking over a 48-byte sliding window.
//!
//! The window's bytes are read as a polynomial over GF(2) and reduced modulo
//! an irreducible polynomial of degree 53; a chunk ends where the low bits of
//! the fingerprint are zero (`digest & (avg - 1) == 0`), no sooner than
//! `min` and no later than `max` bytes from its start. Because the digest at
//! a position depends only on the 48 bytes before it, hashing starts 48
//! bytes before the minimum cut point and the chunker needs no state across chunks.

use super::Chunker;

/// Bytes in the sliding window.
pub const WINDOW_SIZE: usize = 48;

/// An irreducible polynomial of degree 53 over GF(2) (verified by a unit test).
const POLYNOMIAL: u64 = 0x3D_A335_8B4D_C173;

/// Rabin CDC with precomputed tables for the window's outgoing byte and for reduction.
pub struct Rabin {
    min: usize,
    max: usize,
    mask: u64,
    shift: u32,
    out_table: [u64; 256],
    mod_table: [u64; 256],
}

fn degree(p: u64) -> u32 {
    63 - p.leading_zeros()
}

/// `x mod p` for polynomials over GF(2).
fn poly_mod(mut x: u64, p: u64) -> u64 {
    let dp = degree(p);
    while x != 0 && degree(x) >= dp {
        x ^= p << (degree(x) - dp);
    }
    x
}

fn append_byte(h: u64, b: u8, p: u64) -> u64 {
    poly_mod((h << 8) | u64::from(b), p)
}

impl Rabin {
    /// A chunker with the given sizes (`avg` a power of two, `min >= 48`).
    pub fn new(min: usize, avg: usize, max: usize) -> Self {
        let k = degree(POLYNOMIAL);
        let mut out_table = [0u64; 256];
        let mut mod_table = [0u64; 256];
        for b in 0..256usize {
            let mut h = append_byte(0, b as u8, POLYNOMIAL);
            for _ in 0..WINDOW_SIZE - 1 {
                h = append_byte(h, 0, POLYNOMIAL);
            }
            out_table[b] = h;
            let top = (b as u64) << k;
            mod_table[b] = poly_mod(top, POLYNOMIAL) | top;
        }
        Rabin {
            min,
            max,
            mask: avg as u64 - 1,
            shift: k - 8,
            out_table,
            mod_table,
        }
    }
}

impl Chunker for Rabin {
    fn cut(&self, data: &[u8]) -> usize {
        let limit = data.len().min(self.max);
        if limit <= self.min {
            return limit;
        }
        let mut window = [0u8; WINDOW_SIZE];
        let mut wpos = 0;
        let mut digest = 0u64;
        let start = self.min - WINDOW_SIZE;
        for (i, &b) in data[..limit].iter().enumerate().skip(start) {
            let out = window[wpos];
            window[wpos] = b;
            wpos = (wpos + 1) % WINDOW_SIZE;
            digest ^= self.out_table[out as usize];
            let index = (digest >> self.shift) as usize;
            digest = ((digest << 8) | u64::from(b)) ^ self.mod_table[index & 0xff];
            if i + 1 >= self.min && digest & self.mask == 0 {
                return i + 1;
            }
        }
        limit
    }

    fn max_size(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carry-less product of two polynomials of degree < 64, reduced mod `p`.
    fn mul_mod(a: u64, b: u64, p: u64) -> u64 {
        let mut prod: u128 = 0;
        for i in 0..64 {
            if b >> i & 1 == 1 {
                prod ^= u128::from(a) << i;
            }
        }
        let dp = degree(p);
        let p = u128::from(p);
        while prod >> dp != 0 {
            let d = 127 - prod.leading_zeros();
            prod ^= p << (d - dp);
        }
        prod as u64
    }

    #[test]
    fn polynomial_is_irreducible() {
        // Degree 53 is prime, so P is irreducible iff x^(2^53) = x (mod P)
        // and P has no linear factor (x or x+1).
        let d = degree(POLYNOMIAL);
        assert_eq!(d, 53);
        let mut h = 2u64; // the polynomial x
        for _ in 0..d {
            h = mul_mod(h, h, POLYNOMIAL);
        }
        assert_eq!(h, 2);
        assert_eq!(POLYNOMIAL & 1, 1, "divisible by x");
        assert_eq!(POLYNOMIAL.count_ones() % 2, 1, "divisible by x+1");
    }
}
