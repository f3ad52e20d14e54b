//! Helpers the benches share (each bench uses some of them).
#![allow(dead_code)]

/// Deterministic incompressible bytes (xoshiro256**).
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = [
        seed ^ 0x9E37_79B9_7F4A_7C15,
        seed.wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1,
        0x94D0_49BB_1331_11EB,
        0x2545_F491_4F6C_DD1D,
    ];
    let mut next = move || {
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    };
    let mut v = vec![0u8; len];
    for w in v.chunks_mut(8) {
        let x = next().to_le_bytes();
        w.copy_from_slice(&x[..w.len()]);
    }
    v
}

/// The median of `v` (the mean of the middle two for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The positive integer in environment variable `name`, else `default`.
pub fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// CPU seconds (user + system) this process has used so far (0 where /proc is absent).
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    f.iter().sum::<f64>() / 100.0
}
