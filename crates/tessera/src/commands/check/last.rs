//! The last check's record (FORMAT.md §13.4): the report of the latest
//! `check` of a repository, kept by the user who ran it in the per-user
//! cache directory (`$XDG_CACHE_HOME/tessera/<name>.last-check`, beside
//! the metadata caches of §13.2), never in the repository: a check is a
//! read-only command. `tessera check` and `tessera serve`'s check write
//! it; `tessera serve` shows it as the repository's health.

use super::CheckReport;
use crate::backend::cache_dir_name;
use crate::backend::private::{create_dirs, create_new_file};
use crate::error::{Error, Result};
use crate::repo::Repository;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The record format's name, in its header line.
const FORMAT: &str = "tessera-last-check";
/// The record format version written and read.
pub const VERSION: u32 = 1;

/// The header line of a record: what follows it, and its hash.
#[derive(Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    /// BLAKE3 (hex) of the bytes after the header's newline.
    blake3: String,
}

/// A check's report with when, on what and how it ran.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LastCheck {
    /// The repository's id (`config`'s `id`).
    pub repository: String,
    /// Where the repository was opened from.
    pub location: String,
    /// When the check ended (seconds since the Unix epoch, UTC).
    pub time: u64,
    /// Whether every chunk was read and re-hashed (`--read-data`).
    pub read_data: bool,
    /// Who ran it: `check` (the command) or `serve` (the web interface).
    pub by: String,
    /// The report, as `tessera check --json` prints it.
    pub report: CheckReport,
}

impl LastCheck {
    /// The record of `report`, a check of `repo` ending now.
    pub fn new(repo: &Repository, read_data: bool, by: &str, report: CheckReport) -> LastCheck {
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        LastCheck {
            repository: repo.config().id.clone(),
            location: repo.backend().location().to_string(),
            time,
            read_data,
            by: by.to_string(),
            report,
        }
    }
}

/// The file of the record of the repository with id `id` below `root`
/// (the cache root, [`crate::backend::cache_root`]).
pub fn record_path(root: &Path, id: &str) -> PathBuf {
    root.join(format!("{}.last-check", cache_dir_name(id)))
}

/// Writes `record` (replacing the one before) below `root`, created
/// `0700` if missing: to a temporary file (`0600`), synced, then renamed
/// into place, so a reader finds the old record or the new one whole.
/// Returns the record's path.
pub fn save(root: &Path, record: &LastCheck) -> Result<PathBuf> {
    let path = record_path(root, &record.repository);
    let io = |what: String| move |source| Error::Io { what, source };
    let body = serde_json::to_vec(record).map_err(|e| Error::Corrupt {
        object: path.display().to_string(),
        detail: e.to_string(),
    })?;
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        blake3: blake3::hash(&body).to_hex().to_string(),
    };
    let mut bytes = serde_json::to_vec(&header).map_err(|e| Error::Corrupt {
        object: path.display().to_string(),
        detail: e.to_string(),
    })?;
    bytes.push(b'\n');
    bytes.extend_from_slice(&body);
    create_dirs(root).map_err(io(format!("creating {}", root.display())))?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = root.join(format!(
        ".{}.tmp.{}.{nanos}",
        cache_dir_name(&record.repository),
        std::process::id()
    ));
    let written = (|| {
        let mut f = create_new_file(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io(format!("writing {}", path.display())))?;
    Ok(path)
}

/// The record of the repository with id `id` below `root`: `None` when
/// there is none; an error when it is damaged (its hash does not hold)
/// or of a version this build does not read.
pub fn load(root: &Path, id: &str) -> Result<Option<LastCheck>> {
    let path = record_path(root, id);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Io {
                what: format!("reading {}", path.display()),
                source,
            })
        }
    };
    let object = path.display().to_string();
    let corrupt = |detail: String| Error::Corrupt {
        object: object.clone(),
        detail,
    };
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| corrupt("no header line".into()))?;
    let header: Header =
        serde_json::from_slice(&bytes[..nl]).map_err(|e| corrupt(format!("header: {e}")))?;
    if header.format != FORMAT {
        return Err(corrupt(format!("not a {FORMAT} record")));
    }
    if header.version != VERSION {
        return Err(Error::UnsupportedVersion {
            object,
            found: header.version,
            supported: VERSION,
        });
    }
    let body = &bytes[nl + 1..];
    if blake3::hash(body).to_hex().as_str() != header.blake3 {
        return Err(corrupt("its BLAKE3 hash does not hold".into()));
    }
    let record: LastCheck =
        serde_json::from_slice(body).map_err(|e| corrupt(format!("body: {e}")))?;
    if record.repository != id {
        return Err(corrupt(format!(
            "it is the record of repository {:?}",
            record.repository
        )));
    }
    Ok(Some(record))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::check::{Problem, ProblemKind};
    use std::os::unix::fs::PermissionsExt;

    fn record(id: &str) -> LastCheck {
        LastCheck {
            repository: id.into(),
            location: "/srv/repo".into(),
            time: 1_764_355_200,
            read_data: true,
            by: "check".into(),
            report: CheckReport {
                containers: 3,
                problems: vec![Problem::new(
                    ProblemKind::Damaged,
                    "containers/0000000000000001",
                    "bad",
                    vec![2],
                )],
                ..CheckReport::default()
            },
        }
    }

    #[test]
    fn a_record_is_written_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache/tessera");
        assert!(load(&root, "r1").unwrap().is_none());
        let path = save(&root, &record("r1")).unwrap();
        assert_eq!(path, root.join("r1.last-check"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mode = std::fs::metadata(&root).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let back = load(&root, "r1").unwrap().unwrap();
        assert_eq!((back.time, back.report.containers), (1_764_355_200, 3));
        assert_eq!(back.report.problems[0].affected_backups, vec![2]);
        // Replaced whole; no temporary file left.
        let mut second = record("r1");
        second.time += 60;
        save(&root, &second).unwrap();
        assert_eq!(load(&root, "r1").unwrap().unwrap().time, 1_764_355_260);
        let names: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
        assert_eq!(names.len(), 1);
        // Another repository's record is another file.
        assert!(load(&root, "r2").unwrap().is_none());
        // An id with other characters is named by its hash.
        let odd = save(&root, &record("s3://b/p")).unwrap();
        assert!(!odd.file_name().unwrap().to_string_lossy().contains('/'));
        assert_eq!(
            load(&root, "s3://b/p").unwrap().unwrap().location,
            "/srv/repo"
        );
    }

    #[test]
    fn a_damaged_or_newer_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = save(dir.path(), &record("r")).unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut bad = good.clone();
        let last = bad.len() - 2;
        bad[last] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        assert!(matches!(load(dir.path(), "r"), Err(Error::Corrupt { .. })));
        let text = String::from_utf8(good).unwrap();
        std::fs::write(&path, text.replacen("\"version\":1", "\"version\":9", 1)).unwrap();
        assert!(matches!(
            load(dir.path(), "r"),
            Err(Error::UnsupportedVersion { found: 9, .. })
        ));
        std::fs::write(&path, b"garbage").unwrap();
        assert!(load(dir.path(), "r").is_err());
    }
}
