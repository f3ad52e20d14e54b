//! Chunk fingerprints and the hash functions that compute them.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use zeroize::Zeroizing;

/// Width of a stored fingerprint; shorter hashes (SHA-1) are zero-padded.
pub const FINGERPRINT_LEN: usize = 32;

/// A chunk's fingerprint: a cryptographic hash of its bytes, zero-padded to 32 bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Fingerprint(pub [u8; FINGERPRINT_LEN]);

impl Fingerprint {
    /// The first 8 bytes mixed into a well-distributed 64-bit key, for hash tables.
    ///
    /// Mixing matters for short trace fingerprints whose high bytes are zero.
    pub fn key64(&self) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.0[..8]);
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..16]);
        let x = u64::from_le_bytes(a) ^ u64::from_le_bytes(b).rotate_left(29);
        x.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (x >> 31)
    }

    /// Lower-case hex of the first `len` bytes.
    pub fn hex(&self, len: usize) -> String {
        self.0[..len.min(FINGERPRINT_LEN)]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl fmt::Display for Fingerprint {
    /// Shows the full 32 bytes in hex, trailing zero padding trimmed to whole hash widths.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let len = if self.0[20..].iter().all(|&b| b == 0) {
            20
        } else {
            32
        };
        f.write_str(&self.hex(len))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// The hash function of a repository, fixed at `init`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FingerprintAlgo {
    /// BLAKE3-256 (default: fastest).
    Blake3,
    /// SHA-256.
    Sha256,
    /// SHA-1, for fidelity with the papers and their traces.
    Sha1,
}

impl FingerprintAlgo {
    /// Fingerprint of `data`.
    pub fn hash(self, data: &[u8]) -> Fingerprint {
        use sha1::Digest as _;
        let mut out = [0u8; FINGERPRINT_LEN];
        match self {
            FingerprintAlgo::Blake3 => out.copy_from_slice(blake3::hash(data).as_bytes()),
            FingerprintAlgo::Sha256 => out.copy_from_slice(&sha2::Sha256::digest(data)),
            FingerprintAlgo::Sha1 => out[..20].copy_from_slice(&sha1::Sha1::digest(data)),
        }
        Fingerprint(out)
    }

    /// Number of significant bytes of this algorithm's fingerprints.
    pub fn digest_len(self) -> usize {
        match self {
            FingerprintAlgo::Sha1 => 20,
            FingerprintAlgo::Blake3 | FingerprintAlgo::Sha256 => 32,
        }
    }

    /// The name used in configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FingerprintAlgo::Blake3 => "blake3",
            FingerprintAlgo::Sha256 => "sha256",
            FingerprintAlgo::Sha1 => "sha1",
        }
    }
}

impl FromStr for FingerprintAlgo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "blake3" => Ok(FingerprintAlgo::Blake3),
            "sha256" => Ok(FingerprintAlgo::Sha256),
            "sha1" => Ok(FingerprintAlgo::Sha1),
            other => Err(format!(
                "unknown fingerprint {other:?} (expected blake3, sha256 or sha1)"
            )),
        }
    }
}

/// The secret key of keyed fingerprints (docs/FORMAT.md §23.5): held in
/// memory that is zeroed when the last copy is dropped, and never shown.
#[derive(Clone)]
pub struct FingerprintKey(Arc<Zeroizing<[u8; 32]>>);

impl FingerprintKey {
    /// Wraps key bytes derived by the crypto layer.
    pub(crate) fn new(bytes: Zeroizing<[u8; 32]>) -> Self {
        FingerprintKey(Arc::new(bytes))
    }
}

impl fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintKey(..)")
    }
}

/// Computes a repository's fingerprints: its algorithm, keyed with the
/// repository's fingerprint key in an encrypted repository (BLAKE3 keyed
/// mode or HMAC-SHA256), plain otherwise.
#[derive(Clone, Debug)]
pub struct Fingerprinter {
    algo: FingerprintAlgo,
    key: Option<FingerprintKey>,
}

impl Fingerprinter {
    /// Unkeyed fingerprints of `algo` (unencrypted repositories).
    pub fn plain(algo: FingerprintAlgo) -> Self {
        Fingerprinter { algo, key: None }
    }

    /// Fingerprints of `algo` keyed with `key`. SHA-1 is never keyed
    /// (configuration validation refuses encrypted SHA-1 repositories); it
    /// hashes plainly.
    pub fn keyed(algo: FingerprintAlgo, key: FingerprintKey) -> Self {
        Fingerprinter {
            algo,
            key: Some(key),
        }
    }

    /// The algorithm.
    pub fn algo(&self) -> FingerprintAlgo {
        self.algo
    }

    /// Fingerprint of `data`.
    pub fn hash(&self, data: &[u8]) -> Fingerprint {
        let Some(key) = &self.key else {
            return self.algo.hash(data);
        };
        let key: &[u8; 32] = &key.0;
        let mut out = [0u8; FINGERPRINT_LEN];
        match self.algo {
            FingerprintAlgo::Blake3 => {
                out.copy_from_slice(blake3::keyed_hash(key, data).as_bytes())
            }
            FingerprintAlgo::Sha256 => {
                use hmac::{KeyInit as _, Mac as _};
                // HMAC takes keys of every length: this cannot fail.
                let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key)
                    .expect("HMAC accepts keys of any length");
                mac.update(data);
                out.copy_from_slice(&mac.finalize().into_bytes());
            }
            FingerprintAlgo::Sha1 => return self.algo.hash(data),
        }
        Fingerprint(out)
    }
}

impl BatchHasher for Fingerprinter {
    fn hash_batch(&self, chunks: &[&[u8]], out: &mut Vec<Fingerprint>) {
        out.extend(chunks.iter().map(|c| self.hash(c)));
    }
}

/// Fingerprints a batch of chunks: the seam where a hasher that wants large
/// batches (a GPU, as in the lazy-dedup paper's §3.4) can be plugged into
/// the backup pipeline, which hands it one block's chunks at a time, from
/// several rayon threads at once (one block each).
pub trait BatchHasher: Send + Sync {
    /// Appends the fingerprint of each of `chunks` to `out`, in order.
    fn hash_batch(&self, chunks: &[&[u8]], out: &mut Vec<Fingerprint>);
}

/// The CPU hasher: a batch's chunks are hashed one after the other on the
/// calling thread (the pipeline hashes several batches in parallel).
impl BatchHasher for FingerprintAlgo {
    fn hash_batch(&self, chunks: &[&[u8]], out: &mut Vec<Fingerprint>) {
        out.extend(chunks.iter().map(|c| self.hash(c)));
    }
}

/// A `BuildHasher` for maps keyed by [`Fingerprint`]: the key is already random,
/// so hashing just mixes its first bytes.
#[derive(Clone, Copy, Default, Debug)]
pub struct FingerprintHashBuilder;

/// The hasher behind [`FingerprintHashBuilder`].
#[derive(Default)]
pub struct FingerprintHasher(u64);

impl std::hash::BuildHasher for FingerprintHashBuilder {
    type Hasher = FingerprintHasher;
    fn build_hasher(&self) -> FingerprintHasher {
        FingerprintHasher(0)
    }
}

impl std::hash::Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Fingerprint hashes as its 32-byte array: take the mixed key once.
        if bytes.len() >= 16 {
            let mut fp = [0u8; FINGERPRINT_LEN];
            let n = bytes.len().min(FINGERPRINT_LEN);
            fp[..n].copy_from_slice(&bytes[..n]);
            self.0 ^= Fingerprint(fp).key64();
        } else {
            for &b in bytes {
                self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
}

/// A hash map keyed by fingerprints.
pub type FingerprintMap<V> = hashbrown::HashMap<Fingerprint, V, FingerprintHashBuilder>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(
            FingerprintAlgo::Sha1.hash(b"abc").to_string(),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            FingerprintAlgo::Sha256.hash(b"abc").to_string(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            FingerprintAlgo::Blake3.hash(b"").to_string(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn names_round_trip() {
        for a in [
            FingerprintAlgo::Blake3,
            FingerprintAlgo::Sha256,
            FingerprintAlgo::Sha1,
        ] {
            assert_eq!(a.name().parse::<FingerprintAlgo>().unwrap(), a);
        }
        assert!("md5".parse::<FingerprintAlgo>().is_err());
    }

    #[test]
    fn keyed_fingerprints_differ_from_plain_and_by_key() {
        let key = |b: u8| FingerprintKey::new(Zeroizing::new([b; 32]));
        for algo in [FingerprintAlgo::Blake3, FingerprintAlgo::Sha256] {
            let plain = Fingerprinter::plain(algo).hash(b"abc");
            let one = Fingerprinter::keyed(algo, key(1)).hash(b"abc");
            let two = Fingerprinter::keyed(algo, key(2)).hash(b"abc");
            assert_eq!(plain, algo.hash(b"abc"));
            assert_ne!(one, plain);
            assert_ne!(one, two);
            assert_eq!(one, Fingerprinter::keyed(algo, key(1)).hash(b"abc"));
        }
    }
}
