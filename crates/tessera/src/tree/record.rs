//! Catalog entries and differences as listings show them to scripts and
//! to the web interface: `ls --json`, `find --json`, `diff --json` and the
//! JSON API of `tessera serve` build them here, so each field has one
//! meaning everywhere (docs/CLI.md, docs/API.md).

use super::catalog::{Entry, Kind};
use super::diff::{Change, ChangeKind};
use serde::Serialize;

impl Kind {
    /// The kind's name in listings: `dir`, `file`, `symlink`, `gap`,
    /// `hardlink`, `fifo`, `chardev`, `blockdev`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Dir => "dir",
            Kind::File => "file",
            Kind::Symlink => "symlink",
            Kind::Gap => "gap",
            Kind::Hardlink => "hardlink",
            Kind::Fifo => "fifo",
            Kind::CharDevice => "chardev",
            Kind::BlockDevice => "blockdev",
        }
    }
}

/// A catalog path as listings show it: absolute, `/home/ann/a.txt` (bytes
/// that are not UTF-8 replaced; see [`EntryRecord::path_hex`]).
pub fn shown_path(path: &[u8]) -> String {
    format!("/{}", String::from_utf8_lossy(path))
}

/// One catalog entry as listings show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EntryRecord {
    /// The path ([`shown_path`]).
    pub path: String,
    /// The path's bytes in hex, when they are not UTF-8 (`path` then has
    /// replacement characters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    /// The kind ([`Kind::name`]).
    pub kind: &'static str,
    /// Permission bits (with setuid, setgid, sticky).
    pub mode: u32,
    /// Owner's user id.
    pub uid: u32,
    /// Owner's group id.
    pub gid: u32,
    /// Bytes (of a regular file; 0 for others).
    pub size: u64,
    /// Modification time: seconds since the epoch.
    pub mtime: i64,
    /// Modification time: nanoseconds within the second.
    pub mtime_ns: u32,
    /// A symbolic link's target, or the first path of a hard link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl EntryRecord {
    /// The record of `e`.
    pub fn of(e: &Entry) -> EntryRecord {
        EntryRecord {
            path: shown_path(&e.path),
            path_hex: std::str::from_utf8(&e.path)
                .is_err()
                .then(|| hex::encode(&e.path)),
            kind: e.kind.name(),
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            size: e.size,
            mtime: e.mtime,
            mtime_ns: e.mtime_ns,
            target: matches!(e.kind, Kind::Symlink | Kind::Hardlink)
                .then(|| String::from_utf8_lossy(&e.target).into_owned()),
        }
    }
}

/// One difference between two backups as listings show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChangeRecord {
    /// How the entry differs.
    pub change: ChangeKind,
    /// Its path ([`shown_path`]).
    pub path: String,
    /// The entry in the first backup (`null` when added).
    pub old: Option<EntryRecord>,
    /// The entry in the second backup (`null` when removed).
    pub new: Option<EntryRecord>,
}

impl ChangeRecord {
    /// The record of `c`.
    pub fn of(c: &Change) -> ChangeRecord {
        ChangeRecord {
            change: c.kind,
            path: shown_path(c.path()),
            old: c.old.as_ref().map(EntryRecord::of),
            new: c.new.as_ref().map(EntryRecord::of),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_show_paths_kinds_and_targets() {
        let file = Entry {
            path: b"home/ann/a.txt".to_vec(),
            kind: Kind::File,
            mode: 0o644,
            size: 5,
            mtime: 1_700_000_000,
            ..Entry::default()
        };
        let v = serde_json::to_value(EntryRecord::of(&file)).unwrap();
        assert_eq!(v["path"], "/home/ann/a.txt");
        assert_eq!(v["kind"], "file");
        assert_eq!(v["size"], 5);
        assert!(v.get("path_hex").is_none() && v.get("target").is_none());
        let link = Entry {
            path: b"x/\xff".to_vec(),
            kind: Kind::Symlink,
            target: b"../t".to_vec(),
            ..Entry::default()
        };
        let r = EntryRecord::of(&link);
        assert_eq!(r.path_hex.as_deref(), Some("782fff"));
        assert_eq!(r.target.as_deref(), Some("../t"));
        let c = ChangeRecord::of(&Change {
            kind: ChangeKind::Added,
            old: None,
            new: Some(file),
        });
        let v = serde_json::to_value(c).unwrap();
        assert_eq!(
            (v["change"].clone(), v["path"].clone()),
            ("added".into(), "/home/ann/a.txt".into())
        );
        assert!(v["old"].is_null());
        assert_eq!(v["new"]["kind"], "file");
    }
}
