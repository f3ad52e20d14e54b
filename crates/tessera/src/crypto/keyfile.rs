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
    /// 32 MiB, 3 passes, two lanes computed on two threads: about 0.1 s of
    /// CPU, 0.05 s of wall time on the 2-core development machine, 1.7× the
    /// memory and 2.5× the memory-passes of OWASP's minimum (19 MiB with 2
    /// passes); docs/SECURITY.md.
    fn default() -> Self {
        KdfParams {
            memory_kib: 32 * 1024,
            iterations: 3,
            parallelism: 2,
        }
    }
}

/// OWASP's minimum Argon2id memory with two or more passes: 19 MiB.
pub const MIN_MEMORY_KIB_MULTI_PASS: u32 = 19 * 1024;
/// OWASP's minimum Argon2id memory with a single pass: 46 MiB.
pub const MIN_MEMORY_KIB_ONE_PASS: u32 = 46 * 1024;

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

    /// Whether these parameters reach OWASP's minimum for Argon2id:
    /// at least 19 MiB with 2 or more passes, or 46 MiB with 1 pass.
    pub fn meets_minimum(&self) -> bool {
        match self.iterations {
            0 => false,
            1 => self.memory_kib >= MIN_MEMORY_KIB_ONE_PASS,
            _ => self.memory_kib >= MIN_MEMORY_KIB_MULTI_PASS,
        }
    }

    /// Refuses parameters below [`KdfParams::meets_minimum`] for a new key
    /// file (readers still open such files: they may predate the minimum).
    pub fn require_minimum(&self) -> Result<()> {
        self.validate()?;
        if self.meets_minimum() {
            return Ok(());
        }
        Err(Error::InvalidConfig(format!(
            "key derivation memory {} KiB with {} pass(es) is below the minimum for a new key \
             (OWASP: at least {} KiB = 19 MiB with 2 or more passes, or {} KiB = 46 MiB with \
             1 pass); raise --kdf-memory or --kdf-iterations (default {} KiB, {} passes)",
            self.memory_kib,
            self.iterations,
            MIN_MEMORY_KIB_MULTI_PASS,
            MIN_MEMORY_KIB_ONE_PASS,
            KdfParams::default().memory_kib,
            KdfParams::default().iterations,
        )))
    }

    /// Parses a memory cost: a number of KiB (`32768`) or a size with a
    /// binary unit (`32MiB`, `32M`, `1GiB`, `512KiB`).
    pub fn parse_memory(text: &str) -> std::result::Result<u32, String> {
        let text = text.trim();
        let digits = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(digits);
        let number: u64 = number
            .parse()
            .map_err(|_| format!("invalid memory {text:?}: expected KiB or a size like 32MiB"))?;
        let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "k" | "kib" => 1,
            "m" | "mib" => 1024,
            "g" | "gib" => 1024 * 1024,
            other => return Err(format!("invalid memory unit {other:?} (KiB, MiB or GiB)")),
        };
        number
            .checked_mul(scale)
            .and_then(|kib| u32::try_from(kib).ok())
            .ok_or_else(|| format!("memory {text:?} is too large"))
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
#[cfg(test)]
pub(crate) fn unlock(
    backend: &dyn Backend,
    password: &[u8],
    only: Option<&str>,
) -> Result<(MasterKey, String)> {
    unlock_wrapping(backend, password, only).map(|(master, id, _)| (master, id))
}

/// Like [`unlock`], with the key derived from `password` for that file
/// (what a session, `crypto::session`, keeps instead of the password).
pub(crate) fn unlock_wrapping(
    backend: &dyn Backend,
    password: &[u8],
    only: Option<&str>,
) -> Result<(MasterKey, String, Wrapping)> {
    let candidates = match only {
        Some(id) => vec![id.to_string()],
        None => ids(backend)?,
    };
    for id in candidates {
        let file = load(backend, &id)?;
        let wrapping = Wrapping {
            salt: file.salt()?,
            key: file.params().derive(password, &file.salt()?)?,
        };
        if let Some(master) = try_open(&file, &wrapping.key)? {
            return Ok((master, id, wrapping));
        }
    }
    Err(Error::WrongPassword(backend.location()))
}

/// The key a password derives for one key file, and that file's salt.
pub(crate) struct Wrapping {
    /// The key file's salt (names a session entry, `crypto::session`).
    pub(crate) salt: Vec<u8>,
    /// The derived key.
    pub(crate) key: Zeroizing<[u8; 32]>,
}

/// The master key that key file `id` wraps under `key` (derived before,
/// for the file of salt `salt`), or `None` if it does not open it.
pub(crate) fn open_with(
    backend: &dyn Backend,
    id: &str,
    salt: &[u8],
    key: &[u8; 32],
) -> Result<Option<MasterKey>> {
    let file = load(backend, id)?;
    if file.salt()? != salt {
        return Ok(None);
    }
    try_open(&file, key)
}

impl KeyFile {
    /// The salt, decoded.
    fn salt(&self) -> Result<Vec<u8>> {
        let salt = hex::decode(&self.kdf.salt).ok();
        salt.filter(|s| s.len() == SALT_LEN)
            .ok_or_else(|| Error::corrupt(key_path(&self.id), "invalid salt"))
    }
}

/// The master key `file` wraps, or `None` if `wrapping` (the key derived
/// from a password) does not open it.
fn try_open(file: &KeyFile, wrapping: &[u8; 32]) -> Result<Option<MasterKey>> {
    let path = key_path(&file.id);
    let bad = |what: &str| Error::corrupt(&path, format!("invalid {what}"));
    let nonce = hex::decode(&file.nonce).map_err(|_| bad("nonce"))?;
    let nonce = XNonce::try_from(nonce.as_slice()).map_err(|_| bad("nonce"))?;
    let wrapped = hex::decode(&file.wrapped).map_err(|_| bad("wrapped key"))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Local;

    /// Cheap parameters (below the minimum) so that tests stay fast.
    const CHEAP: KdfParams = KdfParams {
        memory_kib: 64,
        iterations: 1,
        parallelism: 1,
    };

    fn local() -> (tempfile::TempDir, Box<dyn Backend>) {
        let dir = tempfile::tempdir().unwrap();
        let backend: Box<dyn Backend> = Box::new(Local::new(dir.path()));
        (dir, backend)
    }

    #[test]
    fn each_key_file_stores_and_opens_with_its_own_parameters() {
        let (_dir, backend) = local();
        let master = MasterKey::from_slice(&[7; 32]).unwrap();
        let other = KdfParams {
            memory_kib: 96,
            iterations: 2,
            parallelism: 2,
        };
        let a = add(backend.as_ref(), &master, b"first", CHEAP).unwrap();
        let b = add(backend.as_ref(), &master, b"second", other).unwrap();
        let mut listed = list(backend.as_ref()).unwrap();
        listed.sort_by_key(|k| k.id != a);
        assert_eq!((listed[0].id.as_str(), listed[0].kdf), (a.as_str(), CHEAP));
        assert_eq!((listed[1].id.as_str(), listed[1].kdf), (b.as_str(), other));
        for (password, id) in [(&b"first"[..], &a), (&b"second"[..], &b)] {
            let (opened, by) = unlock(backend.as_ref(), password, None).unwrap();
            assert_eq!(opened.bytes(), master.bytes());
            assert_eq!(&by, id);
        }
        let wrong = unlock(backend.as_ref(), b"third", None);
        assert!(matches!(wrong, Err(Error::WrongPassword(_))));
    }

    #[test]
    fn minimum_is_owasps() {
        let p = |memory_kib, iterations| KdfParams {
            memory_kib,
            iterations,
            parallelism: 1,
        };
        assert!(KdfParams::default().meets_minimum());
        assert!(KdfParams::default().require_minimum().is_ok());
        for ok in [p(19456, 2), p(19456, 5), p(47104, 1), p(1 << 20, 1)] {
            assert!(ok.meets_minimum(), "{ok:?}");
        }
        for low in [p(19455, 2), p(47103, 1), p(40960, 1), p(64, 3), p(8, 100)] {
            assert!(!low.meets_minimum(), "{low:?}");
            let message = low.require_minimum().unwrap_err().to_string();
            assert!(message.contains("below the minimum"), "{message}");
            assert!(message.contains("19456 KiB"), "{message}");
        }
        // Out of bounds is refused as such, not as weak.
        let message = p(1 << 30, 3).require_minimum().unwrap_err().to_string();
        assert!(message.contains("out of bounds"), "{message}");
    }

    #[test]
    fn memory_is_kib_or_a_size_with_a_unit() {
        let parse = KdfParams::parse_memory;
        assert_eq!(parse("32768"), Ok(32768));
        assert_eq!(parse("32MiB"), Ok(32768));
        assert_eq!(parse("46m"), Ok(47104));
        assert_eq!(parse("1GiB"), Ok(1 << 20));
        assert_eq!(parse("512 KiB"), Ok(512));
        for bad in ["", "MiB", "-1", "1.5MiB", "3TiB", "5000000GiB", "32 MB"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_new_key_below_the_minimum_needs_insecure_kdf() {
        let key = |insecure_kdf| crate::crypto::NewKey {
            password: Zeroizing::new("pw".into()),
            kdf: CHEAP,
            insecure_kdf,
        };
        assert!(key(false).checked_kdf().is_err());
        assert_eq!(key(true).checked_kdf().unwrap(), CHEAP);
        let (_dir, backend) = local();
        let refused = crate::crypto::create_key(backend.as_ref(), &key(false));
        assert!(refused.is_err());
        assert!(ids(backend.as_ref()).unwrap().is_empty());
    }

    /// A key file written by Tessera before issue 41 (the default of then:
    /// 128 MiB, 3 passes) wrapping the master key `[0x42; 32]` for
    /// "correct horse".
    const OLD_KEY_ID: &str = "ab22f41560ef3ac6";
    const OLD_KEY_FILE: &str = concat!(
        "545352414b4559460100000088010000000000007b0a2020226964223a2022616232326634313536",
        "30656633616336222c0a20202263726561746564223a20313739353839343235362c0a2020226b64",
        "66223a207b0a2020202022616c676f726974686d223a20226172676f6e326964222c0a2020202022",
        "6d656d6f72795f6b6962223a203133313037322c0a2020202022697465726174696f6e73223a2033",
        "2c0a2020202022706172616c6c656c69736d223a20312c0a202020202273616c74223a2022346138",
        "6136646237656637666163373063303362613533646162653863333765220a20207d2c0a2020226e",
        "6f6e6365223a20226530383938303335383738306431383637666339366134613038636361666230",
        "66313262336365666166346430626336222c0a20202277726170706564223a202234623730643063",
        "32393838666665653436303561653333613637386634636366643433333733353535393434346633",
        "65396539376335613138613362373263393333393539646337363861646464313461326439396664",
        "396263613765613865220a7d59eef5c3",
    );

    #[test]
    fn a_key_file_of_the_old_default_opens_with_its_own_parameters() {
        let (_dir, backend) = local();
        let bytes = hex::decode(OLD_KEY_FILE).unwrap();
        backend.write_new(&key_path(OLD_KEY_ID), &[&bytes]).unwrap();
        let listed = list(backend.as_ref()).unwrap();
        let old = KdfParams {
            memory_kib: 131072,
            iterations: 3,
            parallelism: 1,
        };
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].kdf, old);
        assert_ne!(old, KdfParams::default());
        let (master, id) = unlock(backend.as_ref(), b"correct horse", None).unwrap();
        assert_eq!(master.bytes(), &[0x42; 32]);
        assert_eq!(id, OLD_KEY_ID);
    }
}
