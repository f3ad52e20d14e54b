//! Tags of backups: their syntax, and the `tag` command, which changes the
//! tags of committed backups by replacing their snapshots atomically
//! (docs/FORMAT.md §9.2).

use crate::backend::LockMode;
use crate::error::{Error, Result};
use crate::format::snapshot::{snapshot_key, BackupId};
use crate::repo::Repository;
use serde::Serialize;
use std::collections::BTreeSet;

/// Longest tag accepted, in bytes.
const MAX_TAG: usize = 128;

/// Checks `tags` and returns them sorted and distinct, as snapshots store
/// them. A tag is 1 to 128 bytes of printable characters without `,` (it
/// separates tags that must all be present in a `--tag` filter) and without
/// leading or trailing white space.
pub fn normalize(tags: &[String]) -> Result<Vec<String>> {
    for t in tags {
        let bad = if t.is_empty() {
            Some("is empty")
        } else if t.len() > MAX_TAG {
            Some("is longer than 128 bytes")
        } else if t.contains(',') {
            Some("contains `,`")
        } else if t.chars().any(char::is_control) {
            Some("contains a control character")
        } else if t.trim() != t {
            Some("starts or ends with white space")
        } else {
            None
        };
        if let Some(why) = bad {
            return Err(Error::InvalidOption(format!("tag {t:?} {why}")));
        }
    }
    let set: BTreeSet<&String> = tags.iter().collect();
    Ok(set.into_iter().cloned().collect())
}

/// A change of tags: replace them all (`set`), then add and remove some.
#[derive(Clone, Debug, Default)]
pub struct TagChange {
    /// The new tags, replacing the old ones (`None`: keep them).
    pub set: Option<Vec<String>>,
    /// Tags to add.
    pub add: Vec<String>,
    /// Tags to remove.
    pub remove: Vec<String>,
}

impl TagChange {
    /// The tags after the change of `tags` (checked, sorted, distinct).
    pub fn apply(&self, tags: &[String]) -> Result<Vec<String>> {
        let mut out: Vec<String> = self.set.clone().unwrap_or_else(|| tags.to_vec());
        out.extend(self.add.iter().cloned());
        normalize(&self.remove)?;
        out.retain(|t| !self.remove.contains(t));
        normalize(&out)
    }

    /// Whether the change does nothing whatever the tags.
    pub fn is_empty(&self) -> bool {
        self.set.is_none() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// The tags of one backup after [`retag`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Retagged {
    /// The backup.
    pub id: BackupId,
    /// Its tags before.
    pub old: Vec<String>,
    /// Its tags now.
    pub tags: Vec<String>,
    /// Whether its snapshot was rewritten (false when the tags were already so).
    pub changed: bool,
}

/// Applies `change` to the tags of backups `ids` of `repo` (opened for a
/// backup, which excludes other writers and maintenance but not readers).
///
/// Every snapshot is read and the change checked before any is written, so
/// an unknown backup or a bad tag changes nothing. Each changed snapshot is
/// then replaced atomically (a new object written and synced, renamed over
/// the old one): a reader, or a crash, sees the old snapshot or the new
/// one, never a mixture; the snapshot stays the backup's commit point and
/// nothing else of the backup changes.
pub fn retag(repo: &Repository, ids: &[BackupId], change: &TagChange) -> Result<Vec<Retagged>> {
    repo.require(LockMode::Backup, "changing tags")?;
    if change.is_empty() {
        return Err(Error::InvalidOption(
            "no change of tags given (--add, --remove or --set)".into(),
        ));
    }
    // Two `tag` commands beside each other take turns (FORMAT.md §13.3).
    let _section = repo.commit_section()?;
    let mut planned = Vec::with_capacity(ids.len());
    for &id in ids {
        let snap = repo.snapshot(id)?;
        let tags = change.apply(&snap.tags)?;
        planned.push((snap, tags));
    }
    let mut done = Vec::with_capacity(planned.len());
    for (mut snap, tags) in planned {
        let old = std::mem::replace(&mut snap.tags, tags.clone());
        let changed = old != tags;
        if changed {
            repo.backend()
                .write(&snapshot_key(snap.id), &snap.encode()?)?;
        }
        done.push(Retagged {
            id: snap.id,
            old,
            tags,
            changed,
        });
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn tags_are_checked_sorted_and_distinct() {
        assert_eq!(normalize(&s(&["b", "a", "b"])).unwrap(), s(&["a", "b"]));
        for bad in ["", "a,b", " a", "a\n", &"x".repeat(129)] {
            assert!(normalize(&s(&[bad])).is_err(), "{bad:?}");
        }
        let c = TagChange {
            set: None,
            add: s(&["new", "keep"]),
            remove: s(&["old"]),
        };
        assert_eq!(c.apply(&s(&["old", "keep"])).unwrap(), s(&["keep", "new"]));
        let c = TagChange {
            set: Some(s(&["x"])),
            add: s(&["y"]),
            remove: s(&["x"]),
        };
        assert_eq!(c.apply(&s(&["z"])).unwrap(), s(&["y"]));
        assert!(TagChange::default().is_empty());
    }
}
