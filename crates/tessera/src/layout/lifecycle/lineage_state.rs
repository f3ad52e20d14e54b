//! The lifecycle layout's lineage states on a backend
//! (docs/LIFECYCLE-FORMAT.md §6): their format, their keys
//! (two copies each) and reading them. The lifecycle operations
//! ([`crate::layout::lifecycle`]) build on it; the repository reads it only to
//! recompute its id counters when both copies of its own state are damaged
//! ([`highest_recorded_backup`]), which is why it stands apart from them.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::format::envelope;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

const STATE_KIND: &[u8; 4] = b"LSTA";
/// Format version of lineage states (1: without `parts`, still read).
pub const STATE_VERSION: u32 = 2;

/// Directory of the lineage state objects.
pub const STATE_DIR: &str = "lifecycle/state";
/// Directory of the second copies of the lineage state objects.
pub const STATE_COPY_DIR: &str = "lifecycle/state-copy";

/// One backup version of a lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// Lineage-local version number: 1, 2, 3, …
    pub version: u64,
    /// The repository backup id.
    pub backup: u64,
}

/// The persistent state of one source lineage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineageState {
    /// The source name.
    pub source: String,
    /// Every version ever committed, ascending (deleted ones included).
    pub versions: Vec<Version>,
    /// Last version whose arranging round is done (0: none).
    pub arranged: u64,
    /// Every active and pending category part and archived volume part
    /// (`cat/<name>`, `vol/<name>`); `None` in version 1 states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<BTreeSet<String>>,
}

impl LineageState {
    /// The last version number (0 when empty).
    pub fn last(&self) -> u64 {
        self.versions.last().map_or(0, |v| v.version)
    }

    /// The version of backup `id`.
    pub fn version_of(&self, id: u64) -> Option<u64> {
        self.versions
            .iter()
            .find(|v| v.backup == id)
            .map(|v| v.version)
    }

    /// The backup id of `version`.
    pub fn backup_of(&self, version: u64) -> Option<u64> {
        self.versions
            .get(usize::try_from(version).ok()?.checked_sub(1)?)
            .map(|v| v.backup)
    }

    /// Encodes the state.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        envelope::seal(STATE_KIND, STATE_VERSION, &json)
    }

    /// Decodes and validates a state.
    pub fn decode(name: &str, bytes: &[u8]) -> Result<LineageState> {
        let (_, payload) = envelope::open_versions(name, STATE_KIND, &[1, STATE_VERSION], bytes)?;
        let s: LineageState = serde_json::from_slice(payload)
            .map_err(|e| Error::corrupt(name, format!("invalid JSON: {e}")))?;
        let numbered = s
            .versions
            .iter()
            .enumerate()
            .all(|(k, v)| v.version == k as u64 + 1);
        if !numbered || s.arranged > s.last() {
            return Err(Error::corrupt(name, "inconsistent lineage state"));
        }
        Ok(s)
    }
}

/// Key of lineage `l`'s state.
pub fn state_key(l: &str) -> String {
    format!("{STATE_DIR}/{l}")
}

/// Key of the second copy of lineage `l`'s state.
pub fn state_copy_key(l: &str) -> String {
    format!("{STATE_COPY_DIR}/{l}")
}

/// Reads one copy of a lineage state: `None` if absent.
pub(crate) fn read_state_copy(backend: &dyn Backend, key: &str) -> Result<Option<LineageState>> {
    match backend.read(key) {
        Ok(b) => LineageState::decode(key, &b).map(Some),
        Err(Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Of two copies of a lineage state, the one further along: states only
/// grow (versions are appended, `arranged` rises), and the two copies
/// differ only after an interruption between their writes.
fn further(a: LineageState, b: LineageState) -> LineageState {
    let key = |s: &LineageState| (s.versions.len(), s.arranged);
    if key(&b) > key(&a) {
        b
    } else {
        a
    }
}

/// Loads lineage `name`'s state from whichever copy verifies (the one
/// further along if both do); `None` if it has none. Fails only if no copy
/// is readable and at least one is damaged.
pub(crate) fn load(backend: &dyn Backend, name: &str) -> Result<Option<LineageState>> {
    let primary = read_state_copy(backend, &state_key(name));
    let copy = read_state_copy(backend, &state_copy_key(name));
    Ok(match (primary, copy) {
        (Ok(Some(a)), Ok(Some(b))) => Some(further(a, b)),
        (Ok(Some(a)), _) | (_, Ok(Some(a))) => Some(a),
        (Ok(None), Ok(None)) => None,
        (Err(e), _) | (_, Err(e)) => return Err(e),
    })
}

/// Names of all lineages with a state object (either copy), ascending.
pub(crate) fn lineage_names(backend: &dyn Backend) -> Result<BTreeSet<String>> {
    let mut names: BTreeSet<String> = backend.list(STATE_DIR)?.into_iter().collect();
    names.extend(backend.list(STATE_COPY_DIR)?);
    Ok(names)
}

/// The highest backup id any readable lineage state records (deleted
/// versions included); 0 if none. Damaged states are skipped.
pub(crate) fn highest_recorded_backup(backend: &dyn Backend) -> u64 {
    lineage_names(backend)
        .unwrap_or_default()
        .iter()
        .filter_map(|name| load(backend, name).ok().flatten())
        .flat_map(|s| s.versions.into_iter().map(|v| v.backup))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_version_1_is_read_and_inconsistent_ones_refused() {
        let s = LineageState {
            source: "x".into(),
            versions: vec![Version {
                version: 1,
                backup: 7,
            }],
            arranged: 1,
            parts: Some(["cat/x".to_string()].into()),
        };
        assert_eq!(LineageState::decode("s", &s.encode()).unwrap(), s);
        // A version 1 state (no `parts`) is still read.
        let v1 = envelope::seal(
            STATE_KIND,
            1,
            br#"{"source":"x","versions":[],"arranged":0}"#,
        );
        assert_eq!(LineageState::decode("s", &v1).unwrap().parts, None);
        let bad = LineageState {
            arranged: 2,
            ..s.clone()
        };
        assert!(LineageState::decode("s", &bad.encode()).is_err());
    }
}
