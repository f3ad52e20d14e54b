//! Backups as stored: the recipe (the chunk sequence that rebuilds the
//! stream) and the snapshot (the backup's metadata and statistics, whose
//! write commits the backup). See docs/FORMAT.md, "Recipes" and "Snapshots".

use crate::backend::{IoStats, WriteMode};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, Fingerprinter, FINGERPRINT_LEN};
use crate::format::envelope;
use crate::layout::container::ContainerId;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Read, Write};

/// Backup identifier: 1, 2, 3, … never reused.
pub type BackupId = u64;

/// Directory of snapshot objects.
pub const SNAPSHOT_DIR: &str = "snapshots";
/// Directory of recipe objects.
pub const RECIPE_DIR: &str = "recipes";
const SNAPSHOT_KIND: &[u8; 4] = b"SNAP";
/// Object kind of recipes (their envelope).
pub(crate) const RECIPE_KIND: &[u8; 4] = b"RCPE";
/// Format version of snapshots and recipes.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Object key of backup `id`'s snapshot.
pub fn snapshot_key(id: BackupId) -> String {
    format!("{SNAPSHOT_DIR}/{id:016x}")
}

/// Object key of backup `id`'s recipe.
pub fn recipe_key(id: BackupId) -> String {
    format!("{RECIPE_DIR}/{id:016x}")
}

/// Parses a snapshot or recipe object name back into a backup id.
pub fn parse_key_name(name: &str) -> Option<BackupId> {
    if name.len() != 16 {
        return None;
    }
    BackupId::from_str_radix(name, 16).ok()
}

/// One chunk reference of a recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// The chunk's fingerprint.
    pub fp: Fingerprint,
    /// Its length in bytes.
    pub len: u32,
    /// The container holding it.
    pub container: ContainerId,
}

impl ChunkRef {
    /// Checks that `bytes` are this chunk: its length and fingerprint.
    pub(crate) fn verify(&self, algo: &Fingerprinter, bytes: &[u8]) -> Result<()> {
        let actual = algo.hash(bytes);
        if actual != self.fp || bytes.len() != self.len as usize {
            return Err(Error::ChunkMismatch {
                container: self.container,
                fingerprint: self.fp.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(())
    }
}

/// The ordered chunk references that rebuild a backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    /// The backup this recipe belongs to.
    pub backup: BackupId,
    /// Chunk references in stream order.
    pub chunks: Vec<ChunkRef>,
}

/// Backups a `keep-last` retention would delete: all but the `keep` newest.
pub fn forget_candidates(snapshots: &[Snapshot], keep: usize) -> Vec<BackupId> {
    let mut ids: Vec<BackupId> = snapshots.iter().map(|s| s.id).collect();
    ids.sort_unstable();
    let n = ids.len().saturating_sub(keep);
    ids.truncate(n);
    ids
}

impl Recipe {
    /// The chunks that `select` picks, as ranges of chunk positions (all
    /// when `None`).
    pub(crate) fn selected(
        &self,
        select: Option<&[std::ops::Range<usize>]>,
    ) -> Result<Vec<ChunkRef>> {
        let Some(select) = select else {
            return Ok(self.chunks.clone());
        };
        let mut chunks = Vec::new();
        for r in select {
            let part = self.chunks.get(r.clone()).ok_or_else(|| {
                Error::corrupt(
                    recipe_key(self.backup),
                    format!(
                        "chunks {}..{} asked for, the recipe has {}",
                        r.start,
                        r.end,
                        self.chunks.len()
                    ),
                )
            })?;
            chunks.extend_from_slice(part);
        }
        Ok(chunks)
    }

    /// The recipe as a sealed object.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let payload = postcard::to_stdvec(self)
            .map_err(|e| Error::Pipeline(format!("encoding recipe {}: {e}", self.backup)))?;
        Ok(envelope::seal(RECIPE_KIND, SNAPSHOT_VERSION, &payload))
    }

    /// Parses the sealed recipe of backup `id`.
    pub fn decode(id: BackupId, bytes: &[u8]) -> Result<Recipe> {
        let name = recipe_key(id);
        let payload = envelope::open(&name, RECIPE_KIND, SNAPSHOT_VERSION, bytes)?;
        let recipe: Recipe = postcard::from_bytes(payload)
            .map_err(|e| Error::corrupt(&name, format!("undecodable recipe: {e}")))?;
        if recipe.backup != id {
            return Err(Error::corrupt(
                &name,
                format!("belongs to backup {}", recipe.backup),
            ));
        }
        Ok(recipe)
    }

    /// Sum of the chunk lengths.
    pub fn logical_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| u64::from(c.len)).sum()
    }
}

/// Bytes of a chunk reference in a recipe writer's spill file.
const SPILLED_REF_LEN: usize = FINGERPRINT_LEN + 4 + 8;
/// Most bytes a chunk reference takes in a recipe (postcard: the
/// fingerprint, then the length and the container as varints).
pub(crate) const MAX_ENCODED_REF_LEN: usize = FINGERPRINT_LEN + 5 + 10;

/// A recipe built reference by reference during a backup, so that a backup
/// does not hold its recipe in memory: the references go to a spill file
/// ([`crate::util::spill::temp_file`]), and [`RecipeWriter::store`] streams the
/// sealed recipe to the backend, the same bytes as [`Recipe::encode`].
pub struct RecipeWriter {
    backup: BackupId,
    out: BufWriter<File>,
    chunks: u64,
    logical_bytes: u64,
    /// Bytes of the encoded references.
    encoded: u64,
}

impl RecipeWriter {
    /// An empty recipe of backup `backup`.
    pub fn new(backup: BackupId) -> Result<RecipeWriter> {
        Ok(RecipeWriter {
            backup,
            out: BufWriter::with_capacity(1 << 16, crate::util::spill::temp_file()?),
            chunks: 0,
            logical_bytes: 0,
            encoded: 0,
        })
    }

    /// Makes this the recipe of backup `backup` (a shared backup takes its
    /// id when it commits, FORMAT.md §13.3).
    pub fn set_backup(&mut self, backup: BackupId) {
        self.backup = backup;
    }

    /// Appends the next chunk reference.
    pub fn push(&mut self, c: &ChunkRef) -> Result<()> {
        let mut rec = [0u8; SPILLED_REF_LEN];
        rec[..FINGERPRINT_LEN].copy_from_slice(&c.fp.0);
        rec[FINGERPRINT_LEN..FINGERPRINT_LEN + 4].copy_from_slice(&c.len.to_le_bytes());
        rec[FINGERPRINT_LEN + 4..].copy_from_slice(&c.container.to_le_bytes());
        self.out
            .write_all(&rec)
            .map_err(crate::util::spill::spill_io)?;
        self.chunks += 1;
        self.logical_bytes += u64::from(c.len);
        self.encoded += encode_ref(c, &mut [0u8; MAX_ENCODED_REF_LEN])?.len() as u64;
        Ok(())
    }

    /// Chunk references so far.
    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Sum of the chunk lengths so far.
    pub fn logical_bytes(&self) -> u64 {
        self.logical_bytes
    }

    /// The references so far, in stream order (read back from the spill file).
    pub fn refs(&mut self) -> Result<impl Iterator<Item = Result<ChunkRef>> + '_> {
        self.out.flush().map_err(crate::util::spill::spill_io)?;
        let mut r = crate::util::spill::reader(self.out.get_ref())?;
        Ok((0..self.chunks).map(move |_| {
            let mut rec = [0u8; SPILLED_REF_LEN];
            r.read_exact(&mut rec)
                .map_err(crate::util::spill::spill_io)?;
            Ok(decode_spilled(&rec))
        }))
    }

    /// Writes the sealed recipe to `backend` (atomically, streamed).
    pub fn store(&mut self, backend: &dyn crate::backend::Backend) -> Result<()> {
        let prefix = postcard::to_stdvec(&(self.backup, self.chunks))
            .map_err(|e| Error::Pipeline(format!("encoding recipe {}: {e}", self.backup)))?;
        let payload_len = prefix.len() as u64 + self.encoded;
        let key = recipe_key(self.backup);
        backend.write_streamed(&key, WriteMode::CreateNew, &mut |out| {
            envelope::seal_streamed(RECIPE_KIND, SNAPSHOT_VERSION, payload_len, out, |w| {
                let io_err = |e| Error::io(format!("writing {key}"), e);
                w.write_all(&prefix).map_err(io_err)?;
                let mut buf = [0u8; MAX_ENCODED_REF_LEN];
                for c in self.refs()? {
                    w.write_all(encode_ref(&c?, &mut buf)?).map_err(io_err)?;
                }
                Ok(())
            })
        })?;
        Ok(())
    }
}

/// A chunk reference as a recipe encodes it.
fn encode_ref<'a>(c: &ChunkRef, buf: &'a mut [u8]) -> Result<&'a [u8]> {
    postcard::to_slice(c, buf)
        .map(|b| &*b)
        .map_err(|e| Error::Pipeline(format!("encoding a chunk reference: {e}")))
}

fn decode_spilled(rec: &[u8; SPILLED_REF_LEN]) -> ChunkRef {
    let mut fp = [0u8; FINGERPRINT_LEN];
    fp.copy_from_slice(&rec[..FINGERPRINT_LEN]);
    let mut len = [0u8; 4];
    len.copy_from_slice(&rec[FINGERPRINT_LEN..FINGERPRINT_LEN + 4]);
    let mut container = [0u8; 8];
    container.copy_from_slice(&rec[FINGERPRINT_LEN + 4..]);
    ChunkRef {
        fp: Fingerprint(fp),
        len: u32::from_le_bytes(len),
        container: u64::from_le_bytes(container),
    }
}

/// Chunk counts and bytes of one class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassCount {
    /// Number of chunks.
    pub chunks: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl ClassCount {
    /// Counts one chunk of `len` bytes.
    pub fn add(&mut self, len: u32) {
        self.chunks += 1;
        self.bytes += u64::from(len);
    }
}

/// Statistics of one backup run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BackupStats {
    /// Bytes of the input stream.
    pub logical_bytes: u64,
    /// Bytes of chunk data newly stored (chunks stored as deltas count
    /// their deltas' bytes).
    pub stored_bytes: u64,
    /// All chunks of the stream.
    pub chunks: u64,
    /// Chunks stored by this backup.
    pub unique_chunks: u64,
    /// Chunks and bytes stored by this backup.
    pub unique: ClassCount,
    /// Duplicates of an earlier chunk of the same stream.
    pub internal_duplicates: ClassCount,
    /// Duplicates of chunks stored by earlier backups.
    pub duplicates: ClassCount,
    /// Duplicates the rewrite policy stored again.
    pub rewritten: ClassCount,
    /// Containers written.
    pub containers_written: u64,
    /// Bytes written to the backend before the snapshot itself (containers, index, recipe).
    pub bytes_written: u64,
    /// Read requests the backup made to the backend (index buckets and
    /// objects, container metadata or whole containers, state objects).
    pub reads: u64,
    /// Bytes those reads returned.
    pub bytes_read: u64,
    /// Logical bytes / stored bytes of this backup (`None` when it stored nothing).
    pub dedup_ratio: Option<f64>,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Logical MB (10^6 bytes) per second.
    pub throughput_mb_s: f64,
    /// Time spent in each stage (seconds of the thread that runs it).
    pub stage_seconds: StageSeconds,
    /// Index counters.
    pub index: crate::index::IndexStats,
    /// Delta compression counters (policy `none` when the repository has none).
    pub delta: crate::delta::DeltaStats,
    /// Compression of the stored chunks (after deduplication and delta
    /// compression: `stored_bytes` is before it).
    pub compression: crate::format::compression::CompressionStats,
}

impl BackupStats {
    /// Records the backend traffic `io` of the backup (up to its snapshot object).
    pub fn record_io(&mut self, io: &IoStats) {
        self.bytes_written = io.write_bytes;
        self.reads = io.reads;
        self.bytes_read = io.read_bytes;
    }
}

/// Seconds spent per pipeline stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StageSeconds {
    /// Reading the input and finding chunk boundaries.
    pub chunk: f64,
    /// Fingerprinting (summed over the threads hashing blocks in parallel).
    pub fingerprint: f64,
    /// Deduplication index decisions.
    pub index: f64,
    /// Filling containers and handing them to the writer.
    pub store: f64,
    /// Writing containers to the backend (writer thread).
    pub write: f64,
    /// Persisting index, recipe and snapshot.
    pub commit: f64,
    /// Waiting for the commit lock of a shared backup (FORMAT.md §13.3),
    /// in all: at its start, for more container ids and at its commit
    /// (the last part is within `commit` too). 0 for other backups.
    pub commit_lock: f64,
}

/// A committed backup: its metadata and statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The backup id.
    pub id: BackupId,
    /// Seconds since the Unix epoch when the backup finished (a copy: its original's).
    pub time: u64,
    /// Free-form label.
    pub label: String,
    /// Source lineage name.
    pub source: String,
    /// Host name of the machine that made the backup (empty in snapshots
    /// written before hosts were recorded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// Tags, sorted and distinct (`backup --tag`, the `tag` command).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Bytes of the backed-up stream.
    pub logical_bytes: u64,
    /// Statistics of the run that made it.
    pub stats: BackupStats,
    /// Present when the backup is a directory tree: where its catalog is
    /// in the stream (docs/FORMAT.md, "Trees and catalogs"). Absent in
    /// backups of a single stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeRef>,
}

/// Format version of tree catalogs this build writes; it reads this one and every earlier one.
pub const CATALOG_VERSION: u32 = 4;

/// Where a tree backup's catalog is in its stream, and what the tree holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRef {
    /// Format version of the catalog.
    pub catalog_version: u32,
    /// Index in the recipe of the catalog's first chunk.
    pub catalog_chunk: u64,
    /// Byte offset of the catalog in the stream (= the files' bytes).
    pub catalog_offset: u64,
    /// Length of the catalog in bytes (only the index follows it).
    pub catalog_bytes: u64,
    /// Index in the recipe of the catalog index's first chunk (version 3;
    /// meaningful when `index_bytes` > 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub index_chunk: u64,
    /// Length of the catalog's index, which ends the stream (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub index_bytes: u64,
    /// The pages of the index, in order (catalog version 4: docs/FORMAT.md
    /// §24.4); empty: one page (version 3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub index_pages: Vec<IndexPage>,
    /// Catalog entries (directories, files, symbolic links).
    pub entries: u64,
    /// Regular files among them.
    pub files: u64,
    /// Objects that could not be read and are missing from the backup.
    pub skipped: u64,
    /// The paths given to the backup, as absolute paths.
    pub paths: Vec<String>,
    /// The parent backup whose unchanged files were reused, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<BackupId>,
    /// Regular files not in the parent (all of them without a parent).
    #[serde(default)]
    pub files_new: u64,
    /// Regular files in the parent but changed (size, times, device or inode): read again.
    #[serde(default)]
    pub files_changed: u64,
    /// Regular files unchanged since the parent: their chunks reused, not read.
    #[serde(default)]
    pub files_unmodified: u64,
    /// Bytes read from files.
    #[serde(default)]
    pub bytes_read: u64,
    /// Bytes of unchanged files represented by reused chunks (not read).
    #[serde(default)]
    pub bytes_reused: u64,
}

/// One page of a catalog index (docs/FORMAT.md §24.4), as the snapshot lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexPage {
    /// The path of its first region, hexadecimal.
    pub path: String,
    /// Its length in bytes.
    pub bytes: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl TreeRef {
    /// Sets `catalog_chunk` from the recipe's `chunks`, in order: the
    /// catalog must start at a chunk boundary (the chunker restarts at
    /// every file end).
    /// So is `index_chunk` when there is an index.
    pub fn locate(&mut self, chunks: impl Iterator<Item = Result<ChunkRef>>) -> Result<()> {
        let index_offset = self.catalog_offset + self.catalog_bytes;
        let (mut catalog, mut index) = (None, None);
        let mut offset = 0u64;
        let mut count = 0u64;
        for c in chunks {
            if offset == self.catalog_offset && catalog.is_none() {
                catalog = Some(count);
            }
            if offset == index_offset && index.is_none() {
                index = Some(count);
            }
            offset += u64::from(c?.len);
            count += 1;
        }
        if offset == self.catalog_offset && catalog.is_none() {
            catalog = Some(count);
        }
        if offset == index_offset && index.is_none() {
            index = Some(count);
        }
        let Some(catalog) = catalog else {
            return Err(Error::Pipeline(format!(
                "the tree catalog at byte {} does not start at a chunk boundary",
                self.catalog_offset
            )));
        };
        self.catalog_chunk = catalog;
        if self.index_bytes > 0 {
            self.index_chunk = index.ok_or_else(|| {
                Error::Pipeline(format!(
                    "the catalog's index at byte {index_offset} does not start at a chunk boundary"
                ))
            })?;
        }
        Ok(())
    }
}

impl Snapshot {
    /// The snapshot as a sealed object.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let payload = serde_json::to_vec(self)
            .map_err(|e| Error::Pipeline(format!("encoding snapshot {}: {e}", self.id)))?;
        Ok(envelope::seal(SNAPSHOT_KIND, SNAPSHOT_VERSION, &payload))
    }

    /// Parses the sealed snapshot of backup `id`.
    pub fn decode(id: BackupId, bytes: &[u8]) -> Result<Snapshot> {
        let name = snapshot_key(id);
        let payload = envelope::open(&name, SNAPSHOT_KIND, SNAPSHOT_VERSION, bytes)?;
        let snap: Snapshot = serde_json::from_slice(payload)
            .map_err(|e| Error::corrupt(&name, format!("undecodable snapshot: {e}")))?;
        if snap.id != id {
            return Err(Error::corrupt(
                &name,
                format!("belongs to backup {}", snap.id),
            ));
        }
        Ok(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_round_trip_and_compactness() {
        let chunks: Vec<ChunkRef> = (0..1000u32)
            .map(|i| ChunkRef {
                fp: Fingerprint([i as u8; 32]),
                len: 8192 + i,
                container: u64::from(i / 100),
            })
            .collect();
        let r = Recipe { backup: 3, chunks };
        let bytes = r.encode().unwrap();
        assert!(
            bytes.len() < 1000 * 40,
            "recipe takes {} bytes",
            bytes.len()
        );
        assert_eq!(Recipe::decode(3, &bytes).unwrap(), r);
        assert!(Recipe::decode(4, &bytes).is_err());
    }

    #[test]
    fn a_streamed_recipe_is_the_encoded_recipe() {
        use crate::backend::ObjectStore;
        let dir = tempfile::tempdir().unwrap();
        let backend = crate::backend::Local::new(dir.path());
        let chunks: Vec<ChunkRef> = (0..5000u32)
            .map(|i| ChunkRef {
                fp: Fingerprint([(i % 251) as u8; 32]),
                len: 100 + i * 977,
                container: u64::from(i) << (i % 50),
            })
            .collect();
        let mut w = RecipeWriter::new(7).unwrap();
        for c in &chunks {
            w.push(c).unwrap();
        }
        w.store(&backend).unwrap();
        let r = Recipe { backup: 7, chunks };
        assert_eq!(w.chunks(), 5000);
        assert_eq!(w.logical_bytes(), r.logical_bytes());
        assert_eq!(backend.read(&recipe_key(7)).unwrap(), r.encode().unwrap());
    }

    #[test]
    fn snapshot_round_trip() {
        let s = Snapshot {
            id: 9,
            time: 1,
            label: "l".into(),
            source: "s".into(),
            host: String::new(),
            tags: Vec::new(),
            logical_bytes: 5,
            stats: BackupStats::default(),
            tree: None,
        };
        let encoded = s.encode().unwrap();
        // A plain stream's snapshot has no `tree` field at all.
        assert!(!String::from_utf8_lossy(&encoded).contains("tree"));
        assert_eq!(Snapshot::decode(9, &s.encode().unwrap()).unwrap(), s);
    }
}
