//! Compression dictionaries (docs/FORMAT.md §7.8): zstd dictionaries
//! trained from a repository's own chunks, stored as `dictionaries/<id>`
//! objects and named by the `0x02` entries compressed with them.
//!
//! A process keeps every dictionary it loads in one registry, by id, so
//! that decoding an entry (anywhere: restore, check, mount, serve, copy)
//! needs no handle on the repository. Opening a repository only lists its
//! dictionaries ([`announce`]: names, no object read); the first entry
//! naming one reads and decodes it ([`lookup`]), so a command that decodes
//! no such entry (`list`, a re-backup that stores nothing, a restore of
//! raw entries) never reads one.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::format::envelope;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

/// Directory of the dictionary objects.
pub const DICT_DIR: &str = "dictionaries";
/// Envelope kind of a dictionary object.
const KIND: &[u8; 4] = b"DICT";
/// Version of the dictionary object written: 2, the dictionary stored as
/// a zstd frame (FORMAT.md §7.8); version 1 (stored as it is) is read too.
const VERSION: u32 = 2;
/// zstd level of the frame of a version-2 object (written once per
/// repository: the dictionary's text shrinks to about 40 %). Level 9: on a
/// 112 KiB dictionary of Redis sources 46,713 B, 4 % more than level 15's
/// 44,932 B in a quarter of its time; the object is made on the first
/// backup's critical path, between training and compressing
/// (docs/MEASUREMENTS.md).
const OBJECT_LEVEL: i32 = 9;
/// Bytes of the payload before the dictionary itself.
const PAYLOAD_HEADER: usize = 20;
/// Largest dictionary Tessera trains.
pub const MAX_TRAINED_BYTES: usize = 112 * 1024;
/// Smallest and largest dictionary a reader accepts.
const DICT_BYTES: std::ops::RangeInclusive<usize> = 256..=1024 * 1024;
/// Fewest entries, and bytes of them, a dictionary is trained from.
pub const MIN_SAMPLES: usize = 64;
/// See [`MIN_SAMPLES`].
pub const MIN_SAMPLE_BYTES: usize = 128 * 1024;
/// Most bytes of samples collected for training (bounds the memory).
pub const MAX_SAMPLE_BYTES: usize = 16 * 1024 * 1024;
/// Bytes of samples given to training: an evenly spread selection of the
/// collected ones (bounds its time, which is linear in it: ~0.1 s of CPU
/// on the development machine; 2 MiB stored 0.2 % less on Redis sources
/// and took twice as long, docs/MEASUREMENTS.md).
pub const TRAIN_SAMPLE_BYTES: usize = 1024 * 1024;
/// The magic number that opens a zstd dictionary (RFC 8878 §5).
const ZSTD_DICT_MAGIC: [u8; 4] = [0x37, 0xA4, 0x30, 0xEC];

/// The key of dictionary `id`.
pub fn key(id: u32) -> String {
    format!("{DICT_DIR}/{id:08x}")
}

/// zstd level of entries compressed with a dictionary (FORMAT.md §7.8):
/// on small source files 4 % smaller than level 3 for little more time, as
/// most of what a chunk can refer to is in the dictionary.
pub const LEVEL: i32 = 5;

/// One compression dictionary, loaded: its bytes and zstd's tables for
/// decoding, and for encoding at each level used so far.
pub struct Dictionary {
    /// Its id (the name of its object).
    pub id: u32,
    /// Unix time in seconds when it was trained.
    pub created: u64,
    /// Entries it was trained from.
    pub samples: u32,
    bytes: Vec<u8>,
    decoder: DecoderDictionary<'static>,
    encoders: Mutex<Vec<(i32, Arc<EncoderDictionary<'static>>)>>,
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary")
            .field("id", &self.id)
            .field("created", &self.created)
            .field("samples", &self.samples)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl Dictionary {
    /// The dictionary `bytes` (a zstd dictionary) as dictionary `id`, or
    /// why zstd cannot use them.
    pub fn new(
        id: u32,
        created: u64,
        samples: u32,
        bytes: Vec<u8>,
    ) -> std::result::Result<Self, String> {
        if id == 0 {
            return Err("dictionary id 0".into());
        }
        if !DICT_BYTES.contains(&bytes.len()) {
            return Err(format!(
                "{} bytes of dictionary, outside {}..={}",
                bytes.len(),
                DICT_BYTES.start(),
                DICT_BYTES.end()
            ));
        }
        if bytes[..4] != ZSTD_DICT_MAGIC {
            return Err("not a zstd dictionary (no magic number)".into());
        }
        // Loading the decoding tables checks the entropy tables; the
        // encoding ones are built by the first writer that needs them (a
        // reader never does: ~ 1 ms and 0.5 MiB saved per command).
        let decoder = DecoderDictionary::try_copy(&bytes)
            .map_err(|e| format!("zstd refuses the dictionary: {e}"))?;
        Ok(Dictionary {
            id,
            created,
            samples,
            bytes,
            decoder,
            encoders: Mutex::new(Vec::new()),
        })
    }

    /// The dictionary's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// zstd's decoding tables.
    pub(crate) fn ddict(&self) -> &zstd::zstd_safe::DDict<'static> {
        self.decoder.as_ddict()
    }

    /// zstd's encoding tables at `level` (built on first use).
    pub(crate) fn encoder(&self, level: i32) -> Option<Arc<EncoderDictionary<'static>>> {
        let mut encoders = self.encoders.lock().ok()?;
        if let Some((_, e)) = encoders.iter().find(|(l, _)| *l == level) {
            return Some(e.clone());
        }
        let e = Arc::new(EncoderDictionary::try_copy(&self.bytes, level).ok()?);
        encoders.push((level, e.clone()));
        Some(e)
    }

    /// The dictionary as its enveloped object (version 2: the dictionary
    /// as a zstd frame; version 1, as it is, should zstd fail).
    pub fn encode(&self) -> Vec<u8> {
        let frame = zstd::bulk::compress(&self.bytes, OBJECT_LEVEL).ok();
        let (version, body) = match &frame {
            Some(f) => (VERSION, f.as_slice()),
            None => (1, self.bytes.as_slice()),
        };
        let mut payload = Vec::with_capacity(PAYLOAD_HEADER + body.len());
        payload.extend_from_slice(&self.id.to_le_bytes());
        payload.extend_from_slice(&self.created.to_le_bytes());
        payload.extend_from_slice(&self.samples.to_le_bytes());
        payload.extend_from_slice(&(self.bytes.len() as u32).to_le_bytes());
        payload.extend_from_slice(body);
        envelope::seal(KIND, version, &payload)
    }

    /// Parses the object `name` (`dictionaries/<id>`): a damaged one is
    /// [`Error::Corrupt`] naming it.
    pub fn decode(name: &str, object: &[u8]) -> Result<Dictionary> {
        let (version, payload) = envelope::open_versions(name, KIND, &[1, VERSION], object)?;
        let bad = |why: String| Error::corrupt(name, why);
        let field = |at: usize| -> Option<[u8; 4]> { payload.get(at..at + 4)?.try_into().ok() };
        let (Some(id), Some(samples), Some(len), Some(created)) = (
            field(0),
            field(12),
            field(16),
            payload.get(4..12).and_then(|b| <[u8; 8]>::try_from(b).ok()),
        ) else {
            return Err(bad(format!(
                "payload of {} bytes is truncated",
                payload.len()
            )));
        };
        let (id, len) = (u32::from_le_bytes(id), u32::from_le_bytes(len) as usize);
        if key(id) != name {
            return Err(bad(format!(
                "holds dictionary {id:08x}, not the one it is named for"
            )));
        }
        let body = &payload[PAYLOAD_HEADER.min(payload.len())..];
        let bytes = match version {
            1 if body.len() == len => body.to_vec(),
            1 => {
                return Err(bad(format!(
                    "announces {len} bytes of dictionary, holds {}",
                    body.len()
                )))
            }
            _ => unpack(body, len).map_err(bad)?,
        };
        Dictionary::new(
            id,
            u64::from_le_bytes(created),
            u32::from_le_bytes(samples),
            bytes,
        )
        .map_err(bad)
    }
}

/// The dictionary of `len` bytes that the zstd `frame` of a version-2
/// object holds (`len` is bounded before anything is allocated).
fn unpack(frame: &[u8], len: usize) -> std::result::Result<Vec<u8>, String> {
    if !DICT_BYTES.contains(&len) {
        return Err(format!(
            "{len} bytes of dictionary, outside {}..={}",
            DICT_BYTES.start(),
            DICT_BYTES.end()
        ));
    }
    let bytes = zstd::bulk::decompress(frame, len)
        .map_err(|e| format!("the dictionary's frame does not decode: {e}"))?;
    match bytes.len() == len {
        true => Ok(bytes),
        false => Err(format!(
            "announces {len} bytes of dictionary, its frame holds {}",
            bytes.len()
        )),
    }
}

/// A registered dictionary, or why its object could not be used, or
/// where to read it from when an entry first names it.
#[derive(Clone)]
enum Registered {
    Loaded(Arc<Dictionary>),
    Damaged(String),
    /// Listed by an open repository ([`announce`]), not read yet: the
    /// repository's backend (weak: a closed repository is not kept open).
    Listed(Weak<dyn Backend>),
}

fn registry() -> &'static RwLock<HashMap<u32, Registered>> {
    static REGISTRY: OnceLock<RwLock<HashMap<u32, Registered>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

fn poisoned() -> Error {
    Error::Pipeline("the dictionary registry was poisoned".into())
}

/// Makes `dict` available to every decoder of this process. A dictionary
/// of the same id and other bytes already there (one of another
/// repository: ids are random 32-bit numbers) is an error, never a
/// replacement.
pub fn register(dict: Arc<Dictionary>) -> Result<Arc<Dictionary>> {
    let mut map = registry().write().map_err(|_| poisoned())?;
    register_in(&mut map, dict)
}

fn register_in(
    map: &mut HashMap<u32, Registered>,
    dict: Arc<Dictionary>,
) -> Result<Arc<Dictionary>> {
    match map.get(&dict.id) {
        Some(Registered::Loaded(d)) if d.bytes == dict.bytes => return Ok(d.clone()),
        Some(Registered::Loaded(_)) => return Err(conflict(dict.id)),
        _ => {}
    }
    map.insert(dict.id, Registered::Loaded(dict.clone()));
    Ok(dict)
}

fn conflict(id: u32) -> Error {
    Error::corrupt(
        key(id),
        "another repository open in this process has a different dictionary of the \
         same id; open the repositories in separate processes",
    )
}

/// Records that dictionary `id` cannot be used, and why (an entry naming
/// it then fails to decode with that reason), unless a good one is known.
fn register_damaged(id: u32, why: String) {
    if let Ok(mut map) = registry().write() {
        if !matches!(map.get(&id), Some(Registered::Loaded(_))) {
            map.insert(id, Registered::Damaged(why));
        }
    }
}

/// Registers the dictionaries of the repository on `backend` by name
/// only (one listing, no object read): each is read and decoded when an
/// entry first names it ([`lookup`]). Returns how many it lists. An id
/// another open repository has registered too is read at once and
/// compared (a different dictionary of the same id is an error, as in
/// [`register`]).
pub fn announce(backend: &Arc<dyn Backend>) -> Result<usize> {
    let ids: Vec<u32> = backend
        .list(DICT_DIR)?
        .iter()
        .filter_map(|n| parse_name(n))
        .collect();
    let mut map = registry().write().map_err(|_| poisoned())?;
    for &id in &ids {
        let shared = match map.get(&id) {
            None | Some(Registered::Damaged(_)) => false,
            Some(Registered::Listed(w)) => match w.upgrade() {
                None => false,
                Some(other) => !Arc::ptr_eq(&other, backend),
            },
            Some(Registered::Loaded(_)) => true,
        };
        if !shared {
            map.insert(id, Registered::Listed(Arc::downgrade(backend)));
            continue;
        }
        // Known from another repository (or another handle on this one):
        // compare the bytes now, as an eager load would.
        if let Some(Registered::Listed(w)) = map.get(&id).cloned() {
            if let Some(other) = w.upgrade() {
                load_into(&mut map, other.as_ref(), id)?;
            }
        }
        match read_one(backend.as_ref(), id) {
            Ok(d) => {
                register_in(&mut map, Arc::new(d))?;
            }
            Err(e) => {
                if !matches!(map.get(&id), Some(Registered::Loaded(_))) {
                    map.insert(id, Registered::Damaged(e.to_string()));
                }
            }
        }
    }
    Ok(ids.len())
}

/// Reads and decodes dictionary `id` of the repository on `backend`.
fn read_one(backend: &dyn Backend, id: u32) -> Result<Dictionary> {
    let object_key = key(id);
    let bytes = backend.read(&object_key)?;
    Dictionary::decode(&object_key, &bytes)
}

/// Reads dictionary `id` from `backend` into `map`: loaded, or damaged
/// with why; only a conflict with a loaded one of other bytes is an error.
fn load_into(map: &mut HashMap<u32, Registered>, backend: &dyn Backend, id: u32) -> Result<()> {
    match read_one(backend, id) {
        Ok(d) => register_in(map, Arc::new(d)).map(|_| ()),
        Err(e) => {
            map.insert(id, Registered::Damaged(e.to_string()));
            Ok(())
        }
    }
}

/// The registered dictionary `id` (read and decoded now if it was only
/// listed), or why there is none usable.
pub(crate) fn lookup(id: u32) -> std::result::Result<Arc<Dictionary>, String> {
    let poisoned = || "the dictionary registry was poisoned".to_string();
    {
        let map = registry().read().map_err(|_| poisoned())?;
        match map.get(&id) {
            Some(Registered::Loaded(d)) => return Ok(d.clone()),
            Some(Registered::Damaged(why)) => return Err(why.clone()),
            None => return Err(format!("{}: no such dictionary in the repository", key(id))),
            Some(Registered::Listed(_)) => {}
        }
    }
    // Listed, not read yet: read it once (another thread may have meanwhile).
    let mut map = registry().write().map_err(|_| poisoned())?;
    if let Some(Registered::Listed(w)) = map.get(&id).cloned() {
        match w.upgrade() {
            Some(backend) => {
                load_into(&mut map, backend.as_ref(), id).map_err(|e| e.to_string())?
            }
            None => {
                let why = format!("{}: its repository is closed", key(id));
                map.insert(id, Registered::Damaged(why));
            }
        }
    }
    match map.get(&id) {
        Some(Registered::Loaded(d)) => Ok(d.clone()),
        Some(Registered::Damaged(why)) => Err(why.clone()),
        _ => Err(format!("{}: no such dictionary in the repository", key(id))),
    }
}

/// What [`load_all`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The dictionary writers use: the newest good one.
    pub newest: Option<Arc<Dictionary>>,
    /// Every good one.
    pub good: Vec<Arc<Dictionary>>,
    /// The damaged ones (corrupt, unreadable, or of another id).
    pub damaged: Vec<Error>,
}

/// Reads and registers every dictionary of the repository on `backend`.
/// A damaged object is reported in [`Loaded::damaged`] (and registered as
/// damaged, so entries naming it fail with its error); only a failure to
/// list the objects, or a conflict in the registry, is an error.
pub fn load_all(backend: &dyn Backend) -> Result<Loaded> {
    let mut loaded = Loaded::default();
    for name in backend.list(DICT_DIR)? {
        let Some(id) = parse_name(&name) else {
            continue;
        };
        match read_one(backend, id) {
            Ok(d) => {
                let d = register(Arc::new(d))?;
                let newer = loaded
                    .newest
                    .as_ref()
                    .is_none_or(|n| (d.created, d.id) > (n.created, n.id));
                if newer {
                    loaded.newest = Some(d.clone());
                }
                loaded.good.push(d);
            }
            Err(e) => {
                register_damaged(id, e.to_string());
                loaded.damaged.push(e);
            }
        }
    }
    Ok(loaded)
}

/// The id in an object name of `dictionaries/` (8 lower-case hex digits, not 0).
fn parse_name(name: &str) -> Option<u32> {
    let ok = name.len() == 8 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    ok.then(|| u32::from_str_radix(name, 16).ok())
        .flatten()
        .filter(|&id| id != 0)
}

/// Trains a dictionary from `samples` (entries' bytes; every k-th of
/// them, so that about [`TRAIN_SAMPLE_BYTES`] spread over all are
/// used), or `None` when they are too few (below
/// [`MIN_SAMPLES`] or [`MIN_SAMPLE_BYTES`]) or zstd finds nothing to learn.
/// The zstd dictionary's own id field is set to 0 (entries name it).
pub fn train(samples: &[&[u8]]) -> Option<Vec<u8>> {
    let all: usize = samples.iter().map(|s| s.len()).sum();
    let step = all.div_ceil(TRAIN_SAMPLE_BYTES).max(1);
    let taken: Vec<&[u8]> = samples
        .iter()
        .copied()
        .filter(|s| !s.is_empty())
        .step_by(step)
        .collect();
    let bytes: usize = taken.iter().map(|s| s.len()).sum();
    if taken.len() < MIN_SAMPLES || bytes < MIN_SAMPLE_BYTES {
        return None;
    }
    // zstd wants about 10 to 100 times the dictionary in samples.
    let size = MAX_TRAINED_BYTES.min(bytes / 10).max(*DICT_BYTES.start());
    let mut dict = train_fastcover(&taken, size)?;
    if dict.len() < *DICT_BYTES.start() || dict[..4] != ZSTD_DICT_MAGIC {
        return None;
    }
    dict[4..8].copy_from_slice(&0u32.to_le_bytes());
    Some(dict)
}

/// zstd's fastCover parameters of [`train`]: segments of `K` bytes, `D`-byte
/// d-mers, a 2^`F`-entry frequency table (6 · 2^20 B = 6 MiB while training).
/// One training with fixed parameters: zstd's default entry point
/// (`ZDICT_trainFromBuffer`) trains five times (k from 50 to 2000) and
/// compresses a held-out quarter of the samples with each to pick one —
/// 6× the CPU time, and on Redis sources a 0.5 % *larger* result
/// (docs/MEASUREMENTS.md).
const FASTCOVER_K: u32 = 300;
/// See [`FASTCOVER_K`].
const FASTCOVER_D: u32 = 8;
/// See [`FASTCOVER_K`].
const FASTCOVER_F: u32 = 20;

/// Trains a zstd dictionary of at most `capacity` bytes from `samples`
/// with fastCover at fixed parameters ([`FASTCOVER_K`]), tuned for
/// compression level [`LEVEL`]; `None` if zstd fails.
fn train_fastcover(samples: &[&[u8]], capacity: usize) -> Option<Vec<u8>> {
    use zstd_sys as sys;
    let flat: Vec<u8> = samples.concat();
    let sizes: Vec<usize> = samples.iter().map(|s| s.len()).collect();
    let count = u32::try_from(sizes.len()).ok()?;
    let params = sys::ZDICT_fastCover_params_t {
        k: FASTCOVER_K,
        d: FASTCOVER_D,
        f: FASTCOVER_F,
        steps: 0,
        nbThreads: 0,
        // Train on every sample (no held-out part to evaluate on).
        splitPoint: 1.0,
        accel: 1,
        shrinkDict: 0,
        shrinkDictMaxRegression: 0,
        zParams: sys::ZDICT_params_t {
            compressionLevel: LEVEL,
            notificationLevel: 0,
            dictID: 0,
        },
    };
    let mut dict = vec![0u8; capacity];
    // SAFETY: `dict` is writable for `capacity` bytes; `flat` holds the
    // samples back to back and `sizes` their `count` lengths, which sum to
    // `flat.len()`; zstd reads and writes only within those bounds and
    // keeps no pointer after it returns.
    let n = unsafe {
        sys::ZDICT_trainFromBuffer_fastCover(
            dict.as_mut_ptr().cast(),
            dict.len(),
            flat.as_ptr().cast(),
            sizes.as_ptr(),
            count,
            params,
        )
    };
    // SAFETY: a pure function of the code returned.
    if unsafe { sys::ZDICT_isError(n) } != 0 || n > capacity {
        return None;
    }
    dict.truncate(n);
    Some(dict)
}

/// Trains a dictionary from `samples` and stores it in the repository on
/// `backend` under a fresh random id (created, never replacing one), and
/// registers it. `None` when the samples teach nothing.
pub fn create(backend: &dyn Backend, samples: &[&[u8]]) -> Result<Option<Arc<Dictionary>>> {
    let Some(bytes) = train(samples) else {
        return Ok(None);
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let count = u32::try_from(samples.len()).unwrap_or(u32::MAX);
    for _ in 0..8 {
        let mut raw = [0u8; 4];
        crate::crypto::random_bytes(&mut raw)?;
        let id = u32::from_le_bytes(raw);
        if id == 0 {
            continue;
        }
        let dict = Dictionary::new(id, created, count, bytes.clone())
            .map_err(|e| Error::Pipeline(format!("a trained dictionary is unusable: {e}")))?;
        if dict.encoder(LEVEL).is_none() {
            return Ok(None);
        }
        match backend.write_new(&key(id), &[&dict.encode()]) {
            Ok(()) => return register(Arc::new(dict)).map(Some),
            Err(Error::ObjectExists(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Pipeline("no free dictionary id found".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Local, ObjectStore};

    /// Small source files alike: what dictionaries are for.
    pub(crate) fn similar_files(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                format!(
                    "# Copyright (c) the project authors. Licensed under the MIT licence.\n\
                     import os\nimport sys\nfrom typing import Optional\n\n\
                     def handler_{i}(request, context: Optional[dict] = None):\n    \
                     \"\"\"Handles request number {i}.\"\"\"\n    \
                     if context is None:\n        context = {{}}\n    \
                     value = request.get('field_{}', {})\n    \
                     return os.path.join(sys.prefix, str(value))\n",
                    i % 13,
                    i * 7
                )
                .into_bytes()
            })
            .collect()
    }

    #[test]
    fn objects_round_trip_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Local::new(dir.path());
        let files = similar_files(400);
        let samples: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
        let d = create(&backend, &samples).unwrap().expect("trained");
        let loaded = load_all(&backend).unwrap();
        assert_eq!(loaded.newest.as_ref().map(|n| n.id), Some(d.id));
        assert!(loaded.damaged.is_empty());
        let name = key(d.id);
        let object = backend.read(&name).unwrap();
        assert_eq!(
            Dictionary::decode(&name, &object).unwrap().bytes(),
            d.bytes()
        );
        // Any flipped byte is a corrupt object naming it, never a panic.
        for i in (0..object.len()).step_by(97) {
            let mut bad = object.clone();
            bad[i] ^= 0x10;
            match Dictionary::decode(&name, &bad) {
                Err(Error::Corrupt { object, .. }) => assert_eq!(object, name),
                other => panic!("byte {i}: {other:?}"),
            }
        }
        // Under another name it is corrupt too.
        let other = key(d.id ^ 1);
        assert!(matches!(
            Dictionary::decode(&other, &object),
            Err(Error::Corrupt { .. })
        ));
        assert!(train(&samples[..10]).is_none(), "too few samples");
    }

    #[test]
    fn version_1_objects_still_read_and_version_2_is_smaller() {
        let files = similar_files(400);
        let samples: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
        let bytes = train(&samples).expect("trained");
        let d = Dictionary::new(0x1234, 7, 400, bytes.clone()).unwrap();
        let name = key(d.id);
        let v2 = d.encode();
        assert!(v2.len() < bytes.len(), "{} >= {}", v2.len(), bytes.len());
        // Version 1, as written before: the dictionary as it is.
        let mut payload = Vec::new();
        payload.extend_from_slice(&d.id.to_le_bytes());
        payload.extend_from_slice(&7u64.to_le_bytes());
        payload.extend_from_slice(&400u32.to_le_bytes());
        payload.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        payload.extend_from_slice(&bytes);
        let v1 = envelope::seal(KIND, 1, &payload);
        for object in [&v1, &v2] {
            assert_eq!(
                Dictionary::decode(&name, object).unwrap().bytes(),
                &bytes[..]
            );
        }
        // A version-2 frame announcing another length is corrupt.
        let mut short = payload[..PAYLOAD_HEADER].to_vec();
        short[16..20].copy_from_slice(&(bytes.len() as u32 - 1).to_le_bytes());
        short.extend_from_slice(&zstd::bulk::compress(&bytes, 3).unwrap());
        assert!(matches!(
            Dictionary::decode(&name, &envelope::seal(KIND, 2, &short)),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn an_announced_dictionary_is_read_only_when_an_entry_names_it() {
        use crate::backend::Counting;
        let dir = tempfile::tempdir().unwrap();
        let files = similar_files(400);
        let samples: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
        // Stored, not registered (as by another process).
        let id = 0x7e57_1a2f;
        let d = Dictionary::new(id, 1, 400, train(&samples).expect("trained")).unwrap();
        Local::new(dir.path())
            .write_new(&key(id), &[&d.encode()])
            .unwrap();
        let counting = Arc::new(Counting::new(Box::new(Local::new(dir.path()))));
        let backend: Arc<dyn Backend> = counting.clone();
        // Opening lists the dictionaries and reads none of them.
        assert_eq!(announce(&backend).unwrap(), 1);
        assert_eq!(counting.stats().reads, 0);
        // The first entry naming it reads it, once.
        assert_eq!(lookup(id).unwrap().id, id);
        assert_eq!(lookup(id).unwrap().id, id);
        assert_eq!(counting.stats().reads, 1);
    }

    #[test]
    fn training_is_one_fastcover_pass_that_helps_small_files() {
        let files = similar_files(400);
        let samples: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
        let bytes = train(&samples).expect("trained");
        assert!(bytes.len() <= MAX_TRAINED_BYTES && bytes[..4] == ZSTD_DICT_MAGIC);
        let d = Dictionary::new(0x4321, 1, 400, bytes).unwrap();
        let enc = d.encoder(LEVEL).unwrap();
        let (mut with, mut without) = (0, 0);
        for f in &files {
            let mut c = zstd::bulk::Compressor::with_prepared_dictionary(&enc).unwrap();
            with += c.compress(f).unwrap().len();
            without += zstd::bulk::compress(f, LEVEL).unwrap().len();
        }
        assert!(with * 2 < without, "{with} vs {without}");
    }

    #[test]
    fn names_parse() {
        assert_eq!(parse_name("0000abcd"), Some(0xabcd));
        for bad in ["00000000", "0000ABCD", "abc", "0000abcdef", ".tmp.x"] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }
}
