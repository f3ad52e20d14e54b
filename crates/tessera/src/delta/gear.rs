//! The Gear rolling hash and a 64-bit mixer, shared by the Edelta-style
//! encoder and the similarity features.
//!
//! A Gear hash adds one table value per byte after shifting the hash left:
//! `h = (h << shift) + GEAR[byte]`. A byte's contribution leaves the 64-bit
//! hash after `64 / shift` more bytes, so the hash covers a window of that
//! many bytes without having to subtract the byte that leaves.

/// SplitMix64's finalizer: a bijective, well-mixing map of 64-bit values.
pub(super) const fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The `i`-th value of a fixed pseudo-random sequence, for tables and
/// coefficients (`stream` separates the uses).
pub(super) const fn random(stream: u64, i: usize) -> u64 {
    mix64(stream ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// One pseudo-random 64-bit value per byte value.
static GEAR: [u64; 256] = {
    let mut t = [0; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = random(0x6EA2, i);
        i += 1;
    }
    t
};

/// The table value of `byte`.
#[inline(always)]
pub(super) fn value(byte: u8) -> u64 {
    GEAR[byte as usize]
}

/// Rolls `byte` into the Gear hash `h` (window `64 / SHIFT` bytes).
#[inline(always)]
pub(super) fn roll<const SHIFT: u32>(h: u64, byte: u8) -> u64 {
    (h << SHIFT).wrapping_add(value(byte))
}
