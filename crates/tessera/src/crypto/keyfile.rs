//! Key files `keys/<id>` (docs/FORMAT.md §23.2): the master key wrapped with
//! XChaCha20-Poly1305 under a key derived from a password by Argon2id.

use super::{random_bytes, MasterKey};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::format::envelope;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

/// Directory of the key files.
pub const KEYS_DIR: &str = "keys";
const KIND: &[u8; 4] = b"KEYF";
const VERSION: u32 = 1;
const SALT_LEN: usize = 16;

/// Argon2id cost parameters of a key file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfParams {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes over the memory.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl Default for KdfParams {
    /// 128 MiB, 3 passes, one lane: about half a second on one core.
    fn default() -> Self {
        KdfParams {
            memory_kib: 128 * 1024,
            iterations: 3,
            parallelism: 1,
        }
    }
}

impl KdfParams {
    /// Checks the bounds a reader accepts (so that a forged key file cannot
    /// make an opener allocate or compute without bound).
    pub fn validate(&self) -> Result<()> {
        let ok = (8..=4 * 1024 * 1024).contains(&self.memory_kib)
            && (1..=100).contains(&self.iterations)
            && (1..=16).contains(&self.parallelism)
            && self.memory_kib >= 8 * self.parallelism;
        match ok {
            true => Ok(()),
            false => Err(Error::InvalidConfig(format!(
                "key derivation parameters {self:?} out of bounds (memory 8 KiB ..= 4 GiB, \
                 iterations 1..=100, parallelism 1..=16)"
            ))),
        }
    }

    /// The 32-byte key derived from `password` and `salt`.
    fn derive(&self, password: &[u8], salt: &[u8]) -> Result<Zeroizing<[u8; 32]>> {
        self.validate()?;
        let params =
            argon2::Params::new(self.memory_kib, self.iterations, self.parallelism, Some(32))
                .map_err(|e| Error::InvalidConfig(format!("key derivation parameters: {e}")))?;
        let argon =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = Zeroizing::new([0u8; 32]);
        argon
            .hash_password_into(password, salt, out.as_mut())
            .map_err(|e| Error::InvalidConfig(format!("key derivation: {e}")))?;
        Ok(out)
    }
}

/// What a key file says about itself (no secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    /// The key's id (its file name).
    pub id: String,
    /// When it was added (Unix seconds).
    pub created: u64,
    /// Its key derivation parameters.
    pub kdf: KdfParams,
}

#[derive(Serialize, Deserialize)]
struct Kdf {
    algorithm: String,
    memory_kib: u32,
    iterations: u32,
    parallelism: u32,
    salt: String,
}

#[derive(Serialize, Deserialize)]
struct KeyFile {
    id: String,
    created: u64,
    kdf: Kdf,
    nonce: String,
    wrapped: String,
}

impl KeyFile {
    fn params(&self) -> KdfParams {
        KdfParams {
            memory_kib: self.kdf.memory_kib,
            iterations: self.kdf.iterations,
            parallelism: self.kdf.parallelism,
        }
    }

    fn info(&self) -> KeyInfo {
        KeyInfo {
            id: self.id.clone(),
            created: self.created,
            kdf: self.params(),
        }
    }
}

/// Object key of key file `id`.
pub(crate) fn key_path(id: &str) -> String {
    format!("{KEYS_DIR}/{id}")
}

/// Ids of the key files, sorted.
pub(crate) fn ids(backend: &dyn Backend) -> Result<Vec<String>> {
    Ok(backend
        .list(KEYS_DIR)?
        .into_iter()
        .filter(|n| n.len() == 16 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect())
}

fn load(backend: &dyn Backend, id: &str) -> Result<KeyFile> {
    let path = key_path(id);
    let bytes = backend.read(&path)?;
    let payload = envelope::open(&path, KIND, VERSION, &bytes)?;
    let file: KeyFile = serde_json::from_slice(payload)
        .map_err(|e| Error::corrupt(&path, format!("invalid JSON: {e}")))?;
    if file.id != id || file.kdf.algorithm != "argon2id" {
        return Err(Error::corrupt(&path, "id or algorithm does not match"));
    }
    file.params()
        .validate()
        .map_err(|e| Error::corrupt(&path, e.to_string()))?;
    Ok(file)
}

/// Every key file's description.
pub(crate) fn list(backend: &dyn Backend) -> Result<Vec<KeyInfo>> {
    ids(backend)?
        .iter()
        .map(|id| load(backend, id).map(|f| f.info()))
        .collect()
}

/// Writes a new key file wrapping `master` with `password`; returns its id.
pub(crate) fn add(
    backend: &dyn Backend,
    master: &MasterKey,
    password: &[u8],
    params: KdfParams,
) -> Result<String> {
    let mut raw = [0u8; 8 + SALT_LEN + 24];
    random_bytes(&mut raw)?;
    let (id, rest) = raw.split_at(8);
    let (salt, nonce) = rest.split_at(SALT_LEN);
    let id = hex::encode(id);
    let path = key_path(&id);
    let wrapping = params.derive(password, salt)?;
    let nonce = XNonce::try_from(nonce).map_err(|_| Error::Pipeline("nonce length".into()))?;
    let wrapped = XChaCha20Poly1305::new(&Key::from(*wrapping))
        .encrypt(
            &nonce,
            Payload {
                msg: master.bytes(),
                aad: path.as_bytes(),
            },
        )
        .map_err(|_| Error::Pipeline(format!("{path}: encryption failed")))?;
    let file = KeyFile {
        id: id.clone(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        kdf: Kdf {
            algorithm: "argon2id".into(),
            memory_kib: params.memory_kib,
            iterations: params.iterations,
            parallelism: params.parallelism,
            salt: hex::encode(salt),
        },
        nonce: hex::encode(nonce),
        wrapped: hex::encode(wrapped),
    };
    let json = serde_json::to_vec_pretty(&file).unwrap_or_default();
    backend.write_new(&path, &[&envelope::seal(KIND, VERSION, &json)])?;
    Ok(id)
}

/// Deletes key file `id`, unless it is the last one.
pub(crate) fn remove(backend: &dyn Backend, id: &str) -> Result<()> {
    let all = ids(backend)?;
    if !all.iter().any(|k| k == id) {
        return Err(Error::NotFound(key_path(id)));
    }
    if all.len() == 1 {
        return Err(Error::LastKey(id.to_string()));
    }
    backend.delete(&key_path(id))
}

/// The master key the first key file that `password` opens wraps, and that
/// file's id; only key file `only` is tried if given.
pub(crate) fn unlock(
    backend: &dyn Backend,
    password: &[u8],
    only: Option<&str>,
) -> Result<(MasterKey, String)> {
    let candidates = match only {
        Some(id) => vec![id.to_string()],
        None => ids(backend)?,
    };
    for id in candidates {
        let file = load(backend, &id)?;
        if let Some(master) = try_open(&file, password)? {
            return Ok((master, id));
        }
    }
    Err(Error::WrongPassword(backend.location()))
}

/// The master key `file` wraps, or `None` if `password` does not open it.
fn try_open(file: &KeyFile, password: &[u8]) -> Result<Option<MasterKey>> {
    let path = key_path(&file.id);
    let bad = |what: &str| Error::corrupt(&path, format!("invalid {what}"));
    let salt = hex::decode(&file.kdf.salt).map_err(|_| bad("salt"))?;
    let nonce = hex::decode(&file.nonce).map_err(|_| bad("nonce"))?;
    let nonce = XNonce::try_from(nonce.as_slice()).map_err(|_| bad("nonce"))?;
    let wrapped = hex::decode(&file.wrapped).map_err(|_| bad("wrapped key"))?;
    if salt.len() != SALT_LEN {
        return Err(bad("salt"));
    }
    let wrapping = file.params().derive(password, &salt)?;
    let opened = XChaCha20Poly1305::new(&Key::from(*wrapping)).decrypt(
        &nonce,
        Payload {
            msg: &wrapped,
            aad: path.as_bytes(),
        },
    );
    match opened {
        Ok(bytes) => MasterKey::from_slice(&Zeroizing::new(bytes))
            .map(Some)
            .ok_or_else(|| bad("wrapped key length")),
        Err(_) => Ok(None),
    }
}
