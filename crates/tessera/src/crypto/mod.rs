//! Encryption of repositories (docs/FORMAT.md §23, docs/SECURITY.md).
//!
//! One layer, [`Encrypting`], sits between the repository and its storage
//! backend and encrypts every object except the key files and the `config`
//! header; no other module sees a key. The master key lives in
//! [`MasterKey`], wrapped on disk by password key files ([`keyfile`]); the
//! object encryption key and the fingerprint key are derived from it.

mod backend;
pub mod keyfile;
mod object;
pub mod session;

pub use backend::Encrypting;
pub use keyfile::{KdfParams, KeyInfo, KEYS_DIR};
pub(crate) use object::ObjectCipher;

use crate::error::{Error, Result};
use crate::fingerprint::FingerprintKey;
use crate::repo::config::Encryption;
use zeroize::Zeroizing;

/// BLAKE3 key-derivation context of the XChaCha20-Poly1305 object key.
const XCHACHA_KEY_CONTEXT: &str = "tessera 2025-07 object encryption key v1";
/// BLAKE3 key-derivation context of the AES-256-GCM object master key.
const AES_KEY_CONTEXT: &str = "tessera 2026-11 aes256gcm object master key v1";
/// BLAKE3 key-derivation context of the fingerprint key.
const FINGERPRINT_KEY_CONTEXT: &str = "tessera 2025-07 chunk fingerprint key v1";

/// A repository's master key: 32 random bytes, zeroed when dropped.
pub struct MasterKey(Zeroizing<[u8; 32]>);

impl MasterKey {
    /// A new random master key.
    pub(crate) fn generate() -> Result<Self> {
        let mut key = Zeroizing::new([0u8; 32]);
        random_bytes(key.as_mut())?;
        Ok(MasterKey(key))
    }

    /// A master key from exactly 32 bytes.
    fn from_slice(bytes: &[u8]) -> Option<Self> {
        let array: [u8; 32] = bytes.try_into().ok()?;
        Some(MasterKey(Zeroizing::new(array)))
    }

    fn bytes(&self) -> &[u8] {
        self.0.as_slice()
    }

    fn derive(&self, context: &str) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(blake3::derive_key(context, self.0.as_slice()))
    }

    /// The cipher of the objects of a repository with `encryption`, or an
    /// error for [`Encryption::None`].
    pub(crate) fn object_cipher(&self, encryption: Encryption) -> Result<ObjectCipher> {
        let context = match encryption {
            Encryption::Aes256Gcm => AES_KEY_CONTEXT,
            Encryption::XChaCha20Poly1305 | Encryption::None => XCHACHA_KEY_CONTEXT,
        };
        ObjectCipher::new(encryption, &self.derive(context)).ok_or_else(|| {
            Error::InvalidConfig("an unencrypted repository has no object cipher".into())
        })
    }

    /// The key of the repository's fingerprints.
    pub(crate) fn fingerprint_key(&self) -> FingerprintKey {
        FingerprintKey::new(self.derive(FINGERPRINT_KEY_CONTEXT))
    }
}

/// What opens an encrypted repository: a password, and optionally the id of
/// the one key file to try.
pub struct Credentials {
    password: Zeroizing<String>,
    key_id: Option<String>,
}

impl Credentials {
    /// `password`, tried on every key file, or on key file `key_id` only.
    pub fn new(password: Zeroizing<String>, key_id: Option<String>) -> Self {
        Credentials { password, key_id }
    }
}

/// A new key file: its password and key derivation parameters.
pub struct NewKey {
    /// The password.
    pub password: Zeroizing<String>,
    /// Argon2id parameters.
    pub kdf: KdfParams,
    /// Accept `kdf` below OWASP's minimum ([`KdfParams::meets_minimum`]):
    /// for tests and benchmarks only.
    pub insecure_kdf: bool,
}

impl NewKey {
    /// A key for `password` with `kdf`, which must reach the minimum.
    pub fn new(password: Zeroizing<String>, kdf: KdfParams) -> Self {
        NewKey {
            password,
            kdf,
            insecure_kdf: false,
        }
    }

    /// The key derivation parameters, checked: in bounds, and at OWASP's
    /// minimum unless `insecure_kdf`.
    pub(crate) fn checked_kdf(&self) -> Result<KdfParams> {
        match self.insecure_kdf {
            true => self.kdf.validate()?,
            false => self.kdf.require_minimum()?,
        }
        Ok(self.kdf)
    }
}

/// The master key of an open repository and the key file it came from.
pub(crate) struct Unlocked {
    master: MasterKey,
    key_id: String,
    /// The key the password derived for that key file (kept by `login`).
    wrapping: Option<keyfile::Wrapping>,
}

impl Unlocked {
    /// The master key.
    pub(crate) fn master(&self) -> &MasterKey {
        &self.master
    }

    /// The id of the key file the master key came from.
    pub(crate) fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The cipher of the objects of a repository with `encryption`.
    pub(crate) fn cipher(&self, encryption: Encryption) -> Result<ObjectCipher> {
        self.master.object_cipher(encryption)
    }

    /// The key of the repository's fingerprints.
    pub(crate) fn fingerprint_key(&self) -> FingerprintKey {
        self.master.fingerprint_key()
    }
}

/// A new master key and its first key file on `backend`.
pub(crate) fn create_key(backend: &dyn crate::backend::Backend, key: &NewKey) -> Result<Unlocked> {
    let master = MasterKey::generate()?;
    let kdf = key.checked_kdf()?;
    let key_id = keyfile::add(backend, &master, key.password.as_bytes(), kdf)?;
    Ok(Unlocked {
        master,
        key_id,
        wrapping: None,
    })
}

/// The master key that `credentials` unwrap from a key file of `backend`.
pub(crate) fn unlock(
    backend: &dyn crate::backend::Backend,
    credentials: &Credentials,
) -> Result<Unlocked> {
    let (master, key_id, wrapping) = keyfile::unlock_wrapping(
        backend,
        credentials.password.as_bytes(),
        credentials.key_id.as_deref(),
    )?;
    Ok(Unlocked {
        master,
        key_id,
        wrapping: Some(wrapping),
    })
}

/// Fills `buf` from the operating system's random generator.
pub(crate) fn random_bytes(buf: &mut [u8]) -> Result<()> {
    getrandom::fill(buf)
        .map_err(|e| Error::io("drawing random bytes", std::io::Error::other(e.to_string())))
}
