//! The local cache of a remote repository's metadata objects (FORMAT.md
//! §13.2): entries are versions of objects (key, ETag, size, range),
//! checksummed, in a directory per repository, within a size limit.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

/// Length of an entry's header: the BLAKE3 hash of its content.
const HASH_LEN: usize = 32;

/// Which part of an object an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// The whole object.
    Whole,
    /// `len` bytes from `offset`.
    Range { offset: u64, len: u64 },
}

/// Whether reads of `key` (whole, or `part`) are cached: metadata only
/// (FORMAT.md §13.2), never container data.
pub(crate) fn is_cached(key: &str, part: Part) -> bool {
    let dir = key.split('/').next().unwrap_or("");
    matches!(
        (dir, part),
        ("index", _)
            | ("snapshots" | "recipes" | "commits", Part::Whole)
            | ("containers", Part::Range { offset: 0, .. })
    )
}

/// The directory of the caches of all repositories:
/// `$XDG_CACHE_HOME/tessera`, else `~/.cache/tessera` (`None` without
/// either variable).
pub fn default_root() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    match env("XDG_CACHE_HOME") {
        Some(dir) => Some(PathBuf::from(dir).join("tessera")),
        None => env("HOME").map(|home| PathBuf::from(home).join(".cache").join("tessera")),
    }
}

/// The name, below the cache root, of the cache of the repository whose
/// configuration has the id `id`: the id itself if it holds only ASCII
/// letters, digits, `-` and `_`, else its BLAKE3 hash in hex (FORMAT.md
/// §13.2).
pub fn cache_dir_name(id: &str) -> String {
    let plain = !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match plain {
        true => id.to_string(),
        false => blake3::hash(id.as_bytes()).to_hex().to_string(),
    }
}

/// The cache of one repository.
pub(crate) struct MetaCache {
    dir: PathBuf,
    /// Bytes the entries may take at most.
    limit: u64,
    /// Bytes the entries take, as far as this process knows (others may
    /// add some: the sum is recounted when evicting).
    used: Mutex<u64>,
    /// Entries written by this process, to name its temporary files.
    written: AtomicU64,
}

impl MetaCache {
    /// The cache of the repository `id` below `root`, created if needed.
    pub(crate) fn open(root: &Path, id: &str, limit: u64) -> io::Result<MetaCache> {
        let dir = root.join(cache_dir_name(id));
        // The cache holds repository metadata: the owner's alone, as the repository.
        super::private::create_dirs(&dir)?;
        let used = usage(&dir)?.iter().map(|e| e.1).sum();
        Ok(MetaCache {
            dir,
            limit,
            used: Mutex::new(used),
            written: AtomicU64::new(0),
        })
    }

    /// The directory holding the entries.
    #[cfg(test)]
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str, version: &str, part: Part) -> PathBuf {
        let mut h = blake3::Hasher::new();
        for field in [key, version] {
            h.update(&(field.len() as u64).to_le_bytes());
            h.update(field.as_bytes());
        }
        if let Part::Range { offset, len } = part {
            h.update(&offset.to_le_bytes());
            h.update(&len.to_le_bytes());
        }
        self.dir.join(h.finalize().to_hex().as_str())
    }

    /// The cached bytes of `part` of `key` in `version`, if there is a
    /// sound entry (a damaged one is deleted).
    pub(crate) fn get(&self, key: &str, version: &str, part: Part) -> Option<Vec<u8>> {
        let path = self.path(key, version, part);
        let mut bytes = fs::read(&path).ok()?;
        let sound = bytes.len() >= HASH_LEN
            && blake3::hash(&bytes[HASH_LEN..]).as_bytes()[..] == bytes[..HASH_LEN];
        if !sound {
            let _ = fs::remove_file(&path);
            return None;
        }
        // A hit makes the entry recently used.
        if let Ok(f) = fs::File::options().append(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        bytes.drain(..HASH_LEN);
        Some(bytes)
    }

    /// Stores `data` as `part` of `key` in `version`. Failures are ignored:
    /// the cache only saves requests.
    pub(crate) fn put(&self, key: &str, version: &str, part: Part, data: &[u8]) {
        let _ = self.try_put(key, version, part, data);
    }

    fn try_put(&self, key: &str, version: &str, part: Part, data: &[u8]) -> io::Result<()> {
        let size = (HASH_LEN + data.len()) as u64;
        if size > self.limit {
            return Ok(());
        }
        let path = self.path(key, version, part);
        let n = self.written.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!(".tmp.{}.{n}", std::process::id()));
        let written = (|| {
            let mut f = super::private::create_new_file(&tmp)?;
            f.write_all(blake3::hash(data).as_bytes())?;
            f.write_all(data)?;
            fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
            return written;
        }
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used += size;
        if *used > self.limit {
            *used = evict(&self.dir, self.limit / 4 * 3)?;
        }
        Ok(())
    }
}

/// The entries of `dir` with their sizes and modification times.
fn usage(dir: &Path) -> io::Result<Vec<(PathBuf, u64, SystemTime)>> {
    let mut entries = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if let Ok(m) = e.metadata() {
            let time = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            entries.push((e.path(), m.len(), time));
        }
    }
    Ok(entries)
}

/// Deletes the least recently used entries of `dir` until they take at
/// most `target` bytes; returns the bytes left.
fn evict(dir: &Path, target: u64) -> io::Result<u64> {
    let mut entries = usage(dir)?;
    entries.sort_by_key(|e| std::cmp::Reverse(e.2));
    let mut kept = 0;
    for (path, len, _) in entries {
        match kept + len <= target {
            true => kept += len,
            false => {
                let _ = fs::remove_file(path);
            }
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_metadata_is_cached() {
        let head = Part::Range {
            offset: 0,
            len: 65536,
        };
        let later = Part::Range {
            offset: 65536,
            len: 10,
        };
        assert!(is_cached("snapshots/0000000000000001", Part::Whole));
        assert!(is_cached("index/ddfs/t0000000000000001.000001", later));
        assert!(is_cached("containers/0000000000000001", head));
        assert!(!is_cached("containers/0000000000000001", Part::Whole));
        assert!(!is_cached("containers/0000000000000001", later));
        assert!(!is_cached("config", Part::Whole));
        assert!(!is_cached("locks/abc", Part::Whole));
    }

    #[test]
    fn entries_are_versions_and_damage_is_a_miss() {
        let root = tempfile::tempdir().unwrap();
        let cache = MetaCache::open(root.path(), "repo-1", 1 << 20).unwrap();
        let key = "snapshots/0000000000000001";
        cache.put(key, "\"e1\":10", Part::Whole, b"first");
        assert_eq!(
            cache.get(key, "\"e1\":10", Part::Whole).as_deref(),
            Some(&b"first"[..])
        );
        // Another version of the object is another entry.
        assert_eq!(cache.get(key, "\"e2\":10", Part::Whole), None);
        // A damaged entry is a miss, and is removed.
        let path = cache.path(key, "\"e1\":10", Part::Whole);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, bytes).unwrap();
        assert_eq!(cache.get(key, "\"e1\":10", Part::Whole), None);
        assert!(!path.exists());
        // An odd repository id still names one directory.
        let other = MetaCache::open(root.path(), "../x", 1 << 20).unwrap();
        assert_eq!(other.dir().parent(), Some(root.path()));
    }

    #[test]
    fn the_cache_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("cache/tessera");
        let cache = MetaCache::open(&base, "repo-1", 1 << 20).unwrap();
        let key = "snapshots/0000000000000001";
        cache.put(key, "v", Part::Whole, b"metadata");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        for dir in [
            root.path().join("cache"),
            base.clone(),
            cache.dir().to_path_buf(),
        ] {
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        }
        assert_eq!(mode(&cache.path(key, "v", Part::Whole)), 0o600);
    }

    #[test]
    fn the_limit_evicts_least_recently_used_entries() {
        let root = tempfile::tempdir().unwrap();
        let cache = MetaCache::open(root.path(), "r", 4 * (HASH_LEN as u64 + 1000)).unwrap();
        let old = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        for i in 0..4u64 {
            let key = format!("recipes/{i:016x}");
            cache.put(&key, "v", Part::Whole, &[i as u8; 1000]);
            let f = fs::File::options()
                .append(true)
                .open(cache.path(&key, "v", Part::Whole))
                .unwrap();
            f.set_modified(old + std::time::Duration::from_secs(i))
                .unwrap();
        }
        // Entry 0 is used again: now the most recent.
        assert!(cache
            .get("recipes/0000000000000000", "v", Part::Whole)
            .is_some());
        cache.put("recipes/0000000000000009", "v", Part::Whole, &[9; 1000]);
        let total: u64 = usage(&cache.dir).unwrap().iter().map(|e| e.1).sum();
        assert!(total <= 3 * (HASH_LEN as u64 + 1000), "{total}");
        assert!(cache
            .get("recipes/0000000000000000", "v", Part::Whole)
            .is_some());
        assert!(cache
            .get("recipes/0000000000000009", "v", Part::Whole)
            .is_some());
        assert!(cache
            .get("recipes/0000000000000001", "v", Part::Whole)
            .is_none());
    }
}
