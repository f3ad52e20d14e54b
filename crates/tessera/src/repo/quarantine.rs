//! Quarantine (issue 20 point 3): chunks known to be damaged, recorded per
//! container as `quarantine/<container>` (envelope kind `QRNT`, version 2,
//! payload a JSON array of fingerprints in hex, `"*"` for the whole
//! container; FORMAT.md §10.8). Every index rebuild leaves quarantined
//! chunks out and every backup stores them again instead of deduplicating
//! against the damaged copy. Written by `tessera check` and `tessera
//! repair`; a damaged quarantine object quarantines its whole container.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::envelope;
use crate::layout::container::{self, ContainerId};
use std::collections::{BTreeSet, HashMap, HashSet};

/// Directory of quarantine records.
pub const QUARANTINE_DIR: &str = "quarantine";
const KIND: &[u8; 4] = b"QRNT";
const VERSION: u32 = 2;
/// The entry quarantining every chunk of a container (version 2).
const WHOLE: &str = "*";

/// Key of container `c`'s quarantine record.
pub fn key(c: ContainerId) -> String {
    format!("{QUARANTINE_DIR}/{c:016x}")
}

/// Key of lifecycle lineage `l`'s quarantine record (`l` is the lineage's
/// directory name, `s…`, which no container id can spell).
pub fn lineage_key(l: &str) -> String {
    format!("{QUARANTINE_DIR}/{l}")
}

/// What is quarantined in one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Quarantined {
    /// These chunks (fingerprints in hex).
    Chunks(HashSet<String>),
    /// The record is damaged: every chunk of the container.
    All,
}

impl Quarantined {
    /// Whether the chunk `fp` is quarantined.
    pub fn contains(&self, fp: &Fingerprint) -> bool {
        match self {
            Quarantined::All => true,
            Quarantined::Chunks(s) => s.contains(&fp.to_string()),
        }
    }
}

/// Whether chunk `fp` of container `c` is quarantined in `map` (from [`load`]).
pub fn is_quarantined(
    map: &HashMap<ContainerId, Quarantined>,
    c: ContainerId,
    fp: &Fingerprint,
) -> bool {
    map.get(&c).is_some_and(|q| q.contains(fp))
}

/// Every quarantine record, by container.
pub fn load(backend: &dyn Backend) -> Result<HashMap<ContainerId, Quarantined>> {
    let mut out = HashMap::new();
    for name in backend.list(QUARANTINE_DIR)? {
        let Some(c) = container::parse_key_name(&name) else {
            continue;
        };
        if let Some(q) = read_record(backend, &key(c))? {
            out.insert(c, q);
        }
    }
    Ok(out)
}

/// Lifecycle lineage `l`'s record: `None` if it has none; `All` if it is
/// damaged (every chunk of the lineage is then stored again).
pub fn load_lineage(backend: &dyn Backend, l: &str) -> Result<Option<Quarantined>> {
    read_record(backend, &lineage_key(l))
}

/// The quarantine record at `k`: `None` if there is none; `All` if it is
/// damaged or of an unknown version (every chunk it covers is then stored
/// again).
fn read_record(backend: &dyn Backend, k: &str) -> Result<Option<Quarantined>> {
    Ok(Some(match backend.read(k) {
        Ok(bytes) => match decode(k, &bytes) {
            Ok(s) if s.contains(WHOLE) => Quarantined::All,
            Ok(s) => Quarantined::Chunks(s),
            Err(e) if e.is_damage() || matches!(e, Error::UnsupportedVersion { .. }) => {
                Quarantined::All
            }
            Err(e) => return Err(e),
        },
        Err(Error::NotFound(_)) => return Ok(None),
        Err(e) if e.is_damage() => Quarantined::All,
        Err(e) => return Err(e),
    }))
}

/// Adds `fps` to lifecycle lineage `l`'s record (replaced atomically).
/// Returns whether anything was new.
pub fn record_lineage(
    backend: &dyn Backend,
    l: &str,
    fps: impl IntoIterator<Item = Fingerprint>,
) -> Result<bool> {
    add_at(
        backend,
        &lineage_key(l),
        fps.into_iter().map(|fp| fp.to_string()),
    )
}

/// Replaces lifecycle lineage `l`'s record by exactly `fps` (deletes it
/// when empty): `tessera repair` does this once it has rewritten the
/// lineage's damaged parts, so that only chunks still without an intact
/// copy stay quarantined.
pub fn replace_lineage(backend: &dyn Backend, l: &str, fps: &BTreeSet<Fingerprint>) -> Result<()> {
    let k = lineage_key(l);
    if fps.is_empty() {
        return backend.delete(&k);
    }
    let set: BTreeSet<String> = fps.iter().map(|fp| fp.to_string()).collect();
    write(backend, &k, &set)
}

fn decode(key: &str, bytes: &[u8]) -> Result<HashSet<String>> {
    let (_, payload) = envelope::open_versions(key, KIND, &[1, VERSION], bytes)?;
    serde_json::from_slice(payload)
        .map_err(|e| Error::corrupt(key, format!("undecodable quarantine record: {e}")))
}

/// Adds `fps` to container `c`'s record (replaced atomically). Returns
/// whether anything was new.
pub fn record(
    backend: &dyn Backend,
    c: ContainerId,
    fps: impl IntoIterator<Item = Fingerprint>,
) -> Result<bool> {
    add(backend, c, fps.into_iter().map(|fp| fp.to_string()))
}

/// Quarantines every chunk of container `c` (unreadable or missing).
/// Returns whether it was not already.
pub fn record_whole(backend: &dyn Backend, c: ContainerId) -> Result<bool> {
    add(backend, c, [WHOLE.to_string()])
}

fn add(
    backend: &dyn Backend,
    c: ContainerId,
    entries: impl IntoIterator<Item = String>,
) -> Result<bool> {
    add_at(backend, &key(c), entries)
}

fn add_at(
    backend: &dyn Backend,
    k: &str,
    entries: impl IntoIterator<Item = String>,
) -> Result<bool> {
    let mut set: BTreeSet<String> = match backend.read(k).and_then(|b| decode(k, &b)) {
        Ok(s) => s.into_iter().collect(),
        Err(Error::NotFound(_)) => BTreeSet::new(),
        // A damaged record quarantined the whole container: it still does.
        Err(e) if e.is_damage() => [WHOLE.to_string()].into(),
        Err(e) => return Err(e),
    };
    let before = set.len();
    set.extend(entries);
    if set.len() == before && before > 0 {
        return Ok(false);
    }
    write(backend, k, &set)?;
    Ok(true)
}

fn write(backend: &dyn Backend, k: &str, set: &BTreeSet<String>) -> Result<()> {
    let payload =
        serde_json::to_vec(set).map_err(|e| Error::Pipeline(format!("encoding {k}: {e}")))?;
    backend.write(k, &envelope::seal(KIND, VERSION, &payload))
}
