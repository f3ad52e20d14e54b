//! Commit marks (`commits/<id>`, docs/FORMAT.md §9.1): one small object per
//! committed backup, created with `write_new` right after its snapshot and
//! removed right after it by `delete`/`forget`. They are the repository's
//! redundant knowledge of which backups are committed: a backup whose
//! snapshot is lost but whose mark remains is noticed by `check`, and its
//! recipe (and, in the lifecycle layout, its categories) is kept by `gc`
//! and reclamation so that it can still be recovered.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::format::envelope;
use crate::format::snapshot::{self, BackupId, Snapshot};
use serde::{Deserialize, Serialize};

/// Directory of commit marks.
pub const COMMIT_DIR: &str = "commits";
const COMMIT_KIND: &[u8; 4] = b"CMIT";
/// Format version of commit marks.
pub const COMMIT_VERSION: u32 = 1;

/// Object key of backup `id`'s commit mark.
pub fn mark_key(id: BackupId) -> String {
    format!("{COMMIT_DIR}/{id:016x}")
}

/// The metadata a commit mark records: what a snapshot says about its
/// backup, without the statistics (enough to rebuild a lost snapshot).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitMark {
    /// The backup id.
    pub id: BackupId,
    /// Seconds since the Unix epoch when the backup finished.
    pub time: u64,
    /// Free-form label.
    pub label: String,
    /// Source lineage name.
    pub source: String,
    /// Bytes of the backed-up stream.
    pub logical_bytes: u64,
    /// Tree backups: the snapshot's tree record (where the catalog is), so
    /// that a lost snapshot of a tree backup is recovered as a tree. Absent
    /// for stream backups and in marks written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<snapshot::TreeRef>,
}

impl CommitMark {
    /// The mark of the backup `snap` describes.
    pub fn of(snap: &Snapshot) -> CommitMark {
        CommitMark {
            id: snap.id,
            time: snap.time,
            label: snap.label.clone(),
            source: snap.source.clone(),
            logical_bytes: snap.logical_bytes,
            tree: snap.tree.clone(),
        }
    }

    /// The mark as a sealed object.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let payload = serde_json::to_vec(self)
            .map_err(|e| Error::Pipeline(format!("encoding commit mark {}: {e}", self.id)))?;
        Ok(envelope::seal(COMMIT_KIND, COMMIT_VERSION, &payload))
    }

    /// Parses the sealed commit mark of backup `id`.
    pub fn decode(id: BackupId, bytes: &[u8]) -> Result<CommitMark> {
        let name = mark_key(id);
        let payload = envelope::open(&name, COMMIT_KIND, COMMIT_VERSION, bytes)?;
        let mark: CommitMark = serde_json::from_slice(payload)
            .map_err(|e| Error::corrupt(&name, format!("undecodable commit mark: {e}")))?;
        if mark.id != id {
            return Err(Error::corrupt(
                &name,
                format!("belongs to backup {}", mark.id),
            ));
        }
        Ok(mark)
    }
}

/// Creates the commit mark of `snap` (never replacing one: an existing mark
/// of the same id is left as it is).
pub fn write_mark(backend: &dyn Backend, snap: &Snapshot) -> Result<()> {
    match backend.write_new(&mark_key(snap.id), &[&CommitMark::of(snap).encode()?]) {
        Err(Error::ObjectExists(_)) => Ok(()),
        other => other,
    }
}

/// Ids of all commit marks, ascending.
pub fn marked(backend: &dyn Backend) -> Result<Vec<BackupId>> {
    let mut ids: Vec<_> = backend
        .list(COMMIT_DIR)?
        .iter()
        .filter_map(|n| snapshot::parse_key_name(n))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}
