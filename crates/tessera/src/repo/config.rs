//! Repository configuration, fixed at `init` and stored as the `config` object.

use crate::chunker::ChunkerParams;
use crate::error::{Error, Result};
use crate::fingerprint::FingerprintAlgo;
pub use crate::format::compression::Compression;
use crate::format::envelope;
use crate::index::{Compaction, DdfsParams, EhidParams, LazyMode, LazyParams};
use serde::{Deserialize, Serialize};

pub use crate::backend::CONFIG_KEY;
/// Envelope kind of the configuration object.
const KIND: &[u8; 4] = b"CONF";
/// Repository format version of unencrypted repositories.
pub const FORMAT_VERSION: u32 = 1;
/// Repository format version of encrypted repositories (docs/FORMAT.md §23).
pub const ENCRYPTED_FORMAT_VERSION: u32 = 2;
/// Repository format version of unencrypted compressing repositories
/// (docs/FORMAT.md §7.7): every stored chunk is an encoded entry.
pub const COMPRESSED_FORMAT_VERSION: u32 = 3;
/// Repository format version of encrypted compressing repositories.
pub const ENCRYPTED_COMPRESSED_FORMAT_VERSION: u32 = 4;
/// Added to the format version of a *shared-writers* repository, in which
/// backups run at once (docs/FORMAT.md §13.3): versions 5 to 8.
pub const SHARED_WRITERS: u32 = 4;
/// Added to the format version of a compressing repository that may hold
/// compression dictionaries (docs/FORMAT.md §7.8): versions 11, 12, 15, 16.
pub const DICTIONARIES: u32 = 8;
/// Every repository format version this build reads.
const FORMAT_VERSIONS: [u32; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 15, 16];

/// The repository format version of a repository with `encryption` that
/// compresses (`compressed`) or not: 1, plus 1 when encrypted, plus 2
/// when compressing (docs/FORMAT.md §19).
pub fn format_version(encryption: Encryption, compressed: bool) -> u32 {
    let encrypted = encryption != Encryption::None;
    FORMAT_VERSION + u32::from(encrypted) + 2 * u32::from(compressed)
}

/// Format `version` without the dictionaries part: 1 to 8.
fn without_dictionaries(version: u32) -> u32 {
    match version > DICTIONARIES {
        true => version - DICTIONARIES,
        false => version,
    }
}

/// Format `version` without the shared-writers and dictionaries parts: 1 to 4.
fn base_version(version: u32) -> u32 {
    let version = without_dictionaries(version);
    match version > SHARED_WRITERS {
        true => version - SHARED_WRITERS,
        false => version,
    }
}

/// Whether format `version` is that of an encrypted repository.
fn encrypted_version(version: u32) -> bool {
    version.is_multiple_of(2)
}

/// Default container capacity: 4 MiB.
pub const DEFAULT_CONTAINER_SIZE: u32 = 4 * 1024 * 1024;

/// Which deduplication index a repository uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexKind {
    /// Every fingerprint in memory (persisted as one snapshot object).
    Exact,
    /// DDFS (Zhu et al., FAST'08): on-disk bucketed fingerprint table, Bloom
    /// filter in memory, and an LRU cache of container metadata loaded on
    /// each on-disk hit (locality-preserved caching).
    Ddfs,
    /// HID (Liu et al., ACM TOS 2021): DDFS whose table keeps only the entries
    /// of containers the last backup used well (hot); the others move to a
    /// cold index. No Bloom filter: every miss reads the table.
    Hid,
    /// EHID: HID with a Bloom filter over the hot fingerprints only.
    Ehid,
    /// Eager baseline of lazy deduplication (Ma et al., ACM TOS 2017):
    /// Bloom filter, LRU fingerprint cache, one on-disk lookup per miss that
    /// prefetches the following entries of the metadata log.
    Eager,
    /// Lazy deduplication: cache misses are buffered and searched on disk a
    /// hash bucket at a time, prefetching around buffer cycles.
    Lazy,
}

impl std::str::FromStr for IndexKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "exact" => Ok(IndexKind::Exact),
            "ddfs" => Ok(IndexKind::Ddfs),
            "hid" => Ok(IndexKind::Hid),
            "ehid" => Ok(IndexKind::Ehid),
            "eager" => Ok(IndexKind::Eager),
            "lazy" => Ok(IndexKind::Lazy),
            other => Err(format!(
                "unknown index {other:?} (expected exact, ddfs, hid, ehid, eager or lazy)"
            )),
        }
    }
}

pub use crate::index::{
    DEFAULT_BLOOM_FPR, DEFAULT_DDFS_BLOOM_BUDGET, DEFAULT_EHID_SPARSE_PCT,
    DEFAULT_INDEX_BUCKET_BYTES, DEFAULT_INDEX_CACHE_BYTES,
};

fn default_bloom_fpr() -> f64 {
    DEFAULT_BLOOM_FPR
}
fn default_index_cache_bytes() -> u64 {
    DEFAULT_INDEX_CACHE_BYTES
}
fn default_index_bucket_bytes() -> u32 {
    DEFAULT_INDEX_BUCKET_BYTES
}

fn default_ehid_sparse_pct() -> u32 {
    DEFAULT_EHID_SPARSE_PCT
}

/// Default buffer fingerprint threshold of the lazy index (the paper's BFT).
pub const DEFAULT_LAZY_BFT: u32 = 32;
/// Default metadata-log entries per prefetch (the paper's N).
pub const DEFAULT_LAZY_PREFETCH: u32 = 2048;
/// Default share of the lazy index's memory budget given to its buffer, in percent.
pub const DEFAULT_LAZY_BUFFER_PCT: u32 = 50;

fn default_lazy_bft() -> u32 {
    DEFAULT_LAZY_BFT
}
fn default_lazy_prefetch() -> u32 {
    DEFAULT_LAZY_PREFETCH
}
fn default_lazy_buffer_pct() -> u32 {
    DEFAULT_LAZY_BUFFER_PCT
}

/// How a repository lays out chunk data, fixed at `init`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// A log of fixed-capacity containers (docs/FORMAT.md).
    #[default]
    Container,
    /// MFDedup lifecycle categories grouped into volumes (docs/LIFECYCLE-FORMAT.md).
    Lifecycle,
}

/// When the lifecycle layout arranges (AVAR) its categories.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrange {
    /// After every backup.
    #[default]
    Auto,
    /// Only when `lifecycle::arrange` is called (arranging may fall behind).
    Manual,
}

/// Whether and how a repository encrypts its objects, fixed at `init`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encryption {
    /// Objects stored in the clear (format version 1).
    #[default]
    None,
    /// Every object encrypted with XChaCha20-Poly1305, fingerprints keyed
    /// (format version 2 or 4, docs/FORMAT.md §23).
    #[serde(rename = "xchacha20poly1305")]
    XChaCha20Poly1305,
    /// Every object encrypted with AES-256-GCM under a key of its own,
    /// fingerprints keyed (format version 2 or 4, docs/FORMAT.md §23): the
    /// default, 6 times faster than XChaCha20-Poly1305 on CPUs with AES
    /// instructions.
    #[serde(rename = "aes256gcm")]
    Aes256Gcm,
}

impl std::fmt::Display for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Encryption::None => "none",
            Encryption::XChaCha20Poly1305 => "xchacha20poly1305",
            Encryption::Aes256Gcm => "aes256gcm",
        })
    }
}

impl std::str::FromStr for Encryption {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(Encryption::None),
            "xchacha20poly1305" => Ok(Encryption::XChaCha20Poly1305),
            "aes256gcm" => Ok(Encryption::Aes256Gcm),
            other => Err(format!(
                "unknown encryption {other:?} (expected aes256gcm, xchacha20poly1305 or none)"
            )),
        }
    }
}

/// The `config` object as stored: the configuration of an unencrypted
/// repository, or the header of an encrypted one around its sealed
/// configuration (docs/FORMAT.md §23.4).
pub enum Stored {
    /// Format version 1 or 3: the configuration in the clear.
    Plain(Config),
    /// Format version 2 or 4: the configuration as an encrypted object of
    /// the encryption the header names (checked against the configuration
    /// once opened).
    Sealed(Encryption, Vec<u8>),
}

/// The JSON payload of an encrypted repository's `config` header.
#[derive(Serialize, Deserialize)]
struct Header {
    version: u32,
    encryption: Encryption,
    sealed: String,
}

impl Stored {
    /// Parses the `config` object.
    pub fn decode(bytes: &[u8]) -> Result<Stored> {
        let (version, payload) =
            envelope::open_versions(CONFIG_KEY, KIND, &FORMAT_VERSIONS, bytes)?;
        if !encrypted_version(version) {
            return Config::from_payload(version, payload).map(Stored::Plain);
        }
        let header: Header = serde_json::from_slice(payload)
            .map_err(|e| Error::corrupt(CONFIG_KEY, format!("invalid JSON: {e}")))?;
        if header.version != version || header.encryption == Encryption::None {
            return Err(Error::corrupt(
                CONFIG_KEY,
                "header does not match its version",
            ));
        }
        hex::decode(&header.sealed)
            .map(|sealed| Stored::Sealed(header.encryption, sealed))
            .map_err(|_| Error::corrupt(CONFIG_KEY, "sealed configuration is not hex"))
    }

    /// The `config` header, of format `version` (2 or 4), of a repository
    /// with `encryption` around `sealed`.
    pub fn encode_sealed(version: u32, encryption: Encryption, sealed: &[u8]) -> Vec<u8> {
        let header = Header {
            version,
            encryption,
            sealed: hex::encode(sealed),
        };
        let json = serde_json::to_vec_pretty(&header).unwrap_or_default();
        envelope::seal(KIND, version, &json)
    }
}

/// The configuration of a repository.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Repository format version.
    pub version: u32,
    /// Random repository id (hex), to tell repositories apart.
    pub id: String,
    /// Chunking algorithm and sizes.
    pub chunker: ChunkerParams,
    /// Fingerprint hash.
    pub fingerprint: FingerprintAlgo,
    /// Container capacity in bytes (metadata and data sections together).
    pub container_size: u32,
    /// Deduplication index policy.
    pub index: IndexKind,
    /// A trace repository: backups are fingerprint traces, containers hold
    /// metadata only (for experiments at scales beyond the machine's disk).
    #[serde(default)]
    pub trace: bool,
    /// Target false-positive rate of the index's Bloom filter (DDFS), in (0, 0.5].
    #[serde(default = "default_bloom_fpr")]
    pub bloom_fpr: f64,
    /// Memory budget in bytes of the index's cache (DDFS: container metadata;
    /// eager: fingerprints; lazy: fingerprint cache and buffer together).
    #[serde(default = "default_index_cache_bytes")]
    pub index_cache_bytes: u64,
    /// Bucket size in bytes of the on-disk fingerprint table (DDFS).
    #[serde(default = "default_index_bucket_bytes")]
    pub index_bucket_bytes: u32,
    /// Bytes of the Bloom filter (eager/lazy; 0 sizes it for `bloom_fpr`),
    /// or the memory budget of the Bloom filters (DDFS, HID/EHID; 0 is
    /// [`DEFAULT_DDFS_BLOOM_BUDGET`]).
    #[serde(default)]
    pub bloom_bytes: u64,
    /// Lazy: fingerprints a buffer bucket collects before its on-disk search.
    #[serde(default = "default_lazy_bft")]
    pub lazy_bft: u32,
    /// Eager/lazy: metadata-log entries read into the cache per prefetch.
    #[serde(default = "default_lazy_prefetch")]
    pub lazy_prefetch: u32,
    /// Lazy: percent of the memory budget given to the buffer (the rest is the cache).
    #[serde(default = "default_lazy_buffer_pct")]
    pub lazy_buffer_pct: u32,
    /// HID/EHID: look up hot-index misses in the cold index too (maximum
    /// deduplication; fragmented chunks are then not stored again).
    #[serde(default)]
    pub ehid_consult_cold: bool,
    /// HID/EHID: a container whose utilization by the last backup is below
    /// this percentage is sparse (its entries go cold), 0..=100.
    #[serde(default = "default_ehid_sparse_pct")]
    pub ehid_sparse_pct: u32,
    /// Rewriting policy and its parameters.
    #[serde(default)]
    pub rewrite: crate::rewrite::RewriteParams,
    /// Data layout (container log or lifecycle volumes).
    #[serde(default)]
    pub layout: Layout,
    /// When the lifecycle layout arranges.
    #[serde(default)]
    pub arrange: Arrange,
    /// Largest lifecycle volume or category object part, in bytes (categories
    /// and volumes are split into parts of about this size, which bounds the
    /// memory of backup and arranging).
    #[serde(default = "default_lifecycle_part_bytes")]
    pub lifecycle_part_bytes: u64,
    /// Delta compression of stored chunks (PFC-delta, or the greedy baseline).
    #[serde(default)]
    pub delta: crate::delta::DeltaParams,
    /// Encryption of the repository's objects (and keying of its fingerprints).
    #[serde(default)]
    pub encryption: Encryption,
    /// Compression of stored chunks by default (a backup may override it);
    /// other than `Off`, every stored chunk is an encoded entry
    /// (docs/FORMAT.md §7.7) and the format version is 3 or 4.
    #[serde(default)]
    pub compression: Compression,
}

/// Default size of lifecycle object parts: 64 MiB.
pub const DEFAULT_LIFECYCLE_PART_BYTES: u64 = 64 * 1024 * 1024;

fn default_lifecycle_part_bytes() -> u64 {
    DEFAULT_LIFECYCLE_PART_BYTES
}

impl Config {
    /// The default configuration with a fresh id.
    pub fn new(id: String) -> Self {
        Config {
            version: FORMAT_VERSION + SHARED_WRITERS,
            id,
            chunker: ChunkerParams::default(),
            fingerprint: FingerprintAlgo::Blake3,
            container_size: DEFAULT_CONTAINER_SIZE,
            index: IndexKind::Exact,
            trace: false,
            bloom_fpr: DEFAULT_BLOOM_FPR,
            index_cache_bytes: DEFAULT_INDEX_CACHE_BYTES,
            index_bucket_bytes: DEFAULT_INDEX_BUCKET_BYTES,
            bloom_bytes: 0,
            lazy_bft: DEFAULT_LAZY_BFT,
            lazy_prefetch: DEFAULT_LAZY_PREFETCH,
            lazy_buffer_pct: DEFAULT_LAZY_BUFFER_PCT,
            ehid_consult_cold: false,
            ehid_sparse_pct: DEFAULT_EHID_SPARSE_PCT,
            rewrite: crate::rewrite::RewriteParams::default(),
            layout: Layout::default(),
            arrange: Arrange::Auto,
            lifecycle_part_bytes: DEFAULT_LIFECYCLE_PART_BYTES,
            delta: crate::delta::DeltaParams::default(),
            encryption: Encryption::None,
            compression: Compression::Off,
        }
    }

    /// Whether this is a shared-writers repository (format version 5 to
    /// 8): backups that can share run at once (docs/FORMAT.md §13.3).
    pub fn shared_writers(&self) -> bool {
        without_dictionaries(self.version) > SHARED_WRITERS
    }

    /// Whether this repository may hold compression dictionaries (format
    /// version 11, 12, 15 or 16; docs/FORMAT.md §7.8).
    pub fn dictionaries(&self) -> bool {
        self.version > DICTIONARIES
    }

    /// Makes a compressing repository one that may hold compression
    /// dictionaries (`on`), or not; a repository that does not compress
    /// never does.
    pub fn set_dictionaries(&mut self, on: bool) {
        let base = without_dictionaries(self.version);
        self.version = match on && self.compression.is_on() && !self.trace {
            true => base + DICTIONARIES,
            false => base,
        };
    }

    /// Makes this configuration that of a single-writer repository (format
    /// version 1 to 4, as written before shared writers existed).
    pub fn set_single_writer(&mut self) {
        let dictionaries = self.dictionaries();
        self.version = base_version(self.version);
        self.set_dictionaries(dictionaries);
    }

    /// Whether backups into this repository run at once (a shared-writers
    /// repository whose backups do not rewrite objects every backup
    /// shares), or else why they run one at a time.
    pub fn backups_share(&self) -> std::result::Result<(), &'static str> {
        if !self.shared_writers() {
            return Err(
                "a repository of format version 1 to 4 (made before backups could share one) \
                 takes one backup at a time; to back up from several processes or machines at \
                 once, create a repository with `tessera init` and move the backups into it with \
                 `tessera copy`",
            );
        }
        if self.layout == Layout::Lifecycle {
            return Err("the lifecycle layout takes one backup at a time");
        }
        if !matches!(self.index, IndexKind::Exact | IndexKind::Ddfs) {
            return Err("its index (hid, ehid, lazy, eager) takes one backup at a time");
        }
        if self.delta.kind != crate::delta::DeltaKind::None {
            return Err("delta compression takes one backup at a time");
        }
        Ok(())
    }

    /// Sets the encryption and compression, and the format version that
    /// goes with them.
    pub fn set_protection(&mut self, encryption: Encryption, compression: Compression) {
        let shared = match self.shared_writers() {
            true => SHARED_WRITERS,
            false => 0,
        };
        let dictionaries = self.dictionaries();
        self.version = format_version(encryption, compression.is_on()) + shared;
        self.encryption = encryption;
        self.compression = compression;
        self.set_dictionaries(dictionaries);
    }

    /// The compression a backup stores its chunks with: the repository's
    /// setting, or `requested` by the backup; `None` in a repository that
    /// stores chunks as they are (where requesting compression is an error:
    /// its format has no encoded entries).
    pub fn backup_encoding(&self, requested: Option<Compression>) -> Result<Option<Compression>> {
        match (self.encoding(), requested) {
            (Some(default), requested) => Ok(Some(requested.unwrap_or(default))),
            (None, Some(c)) if c.is_on() => Err(Error::InvalidConfig(format!(
                "compression {c} was requested, but this repository was created without \
                 compression (format version {}; init --compression auto makes one that \
                 compresses)",
                self.version
            ))),
            (None, _) => Ok(None),
        }
    }

    /// The memory budget of the DDFS Bloom filters: `bloom_bytes`, or
    /// [`DEFAULT_DDFS_BLOOM_BUDGET`] when it is 0.
    pub fn ddfs_bloom_budget(&self) -> u64 {
        match self.bloom_bytes {
            0 => DEFAULT_DDFS_BLOOM_BUDGET,
            n => n,
        }
    }

    /// The DDFS index parameters this configuration sets.
    pub fn ddfs_params(&self) -> DdfsParams {
        DdfsParams {
            bloom_fpr: self.bloom_fpr,
            cache_bytes: self.index_cache_bytes,
            bucket_bytes: self.index_bucket_bytes,
            part_buckets: crate::index::table::DEFAULT_PART_BUCKETS,
            compaction: Compaction::default(),
            bloom_budget: self.ddfs_bloom_budget(),
        }
    }

    /// The HID/EHID index parameters this configuration sets (`bloom`: EHID).
    pub fn ehid_params(&self, bloom: bool) -> EhidParams {
        EhidParams {
            ddfs: self.ddfs_params(),
            bloom,
            sparse_threshold: f64::from(self.ehid_sparse_pct) / 100.0,
            consult_cold: self.ehid_consult_cold,
        }
    }

    /// The eager or lazy index parameters this configuration sets.
    pub fn lazy_params(&self, mode: LazyMode) -> LazyParams {
        LazyParams {
            mode,
            memory_bytes: self.index_cache_bytes,
            buffer_share: f64::from(self.lazy_buffer_pct) / 100.0,
            bloom_bytes: self.bloom_bytes,
            bloom_fpr: self.bloom_fpr,
            bft: self.lazy_bft,
            prefetch: self.lazy_prefetch,
            avg_chunk: self.chunker.avg_size,
            bucket_bytes: self.index_bucket_bytes,
            part_buckets: crate::index::table::DEFAULT_PART_BUCKETS,
            hold_duplicates: self.rewrite.kind != crate::rewrite::RewriteKind::None,
        }
    }

    /// How chunks are stored: `Some(default setting)` when every stored
    /// chunk is an encoded entry (a compressing repository), `None` when
    /// chunks are stored as they are.
    pub fn encoding(&self) -> Option<Compression> {
        self.compression.is_on().then_some(self.compression)
    }

    /// Checks that the parameters fit together.
    pub fn validate(&self) -> Result<()> {
        self.chunker.validate()?;
        self.rewrite.validate().map_err(Error::InvalidConfig)?;
        let one_chunk = crate::layout::container::HEADER_LEN
            + crate::layout::container::DELTA_META_ENTRY_LEN
            + self.chunker.max_size as usize;
        if (self.container_size as usize) < one_chunk {
            return Err(Error::InvalidConfig(format!(
                "container size {} cannot hold a maximum-size chunk ({} bytes with metadata)",
                self.container_size, one_chunk
            )));
        }
        if !(self.bloom_fpr > 0.0 && self.bloom_fpr <= 0.5) {
            return Err(Error::InvalidConfig(format!(
                "Bloom filter false-positive rate {} is not in (0, 0.5]",
                self.bloom_fpr
            )));
        }
        let buckets = crate::index::table::MIN_BUCKET_BYTES..=crate::index::table::MAX_BUCKET_BYTES;
        if !buckets.contains(&self.index_bucket_bytes) {
            return Err(Error::InvalidConfig(format!(
                "index bucket size {} is not in {}..={} bytes",
                self.index_bucket_bytes,
                buckets.start(),
                buckets.end()
            )));
        }
        if self.ehid_sparse_pct > 100 {
            return Err(Error::InvalidConfig(format!(
                "HID/EHID sparse threshold {}% is above 100%",
                self.ehid_sparse_pct
            )));
        }
        if self.lazy_bft == 0 || self.lazy_prefetch == 0 || self.lazy_buffer_pct >= 100 {
            return Err(Error::InvalidConfig(format!(
                "lazy index: buffer fingerprint threshold {} and prefetch {} must be positive \
                 and the buffer share {}% below 100%",
                self.lazy_bft, self.lazy_prefetch, self.lazy_buffer_pct
            )));
        }
        self.validate_delta()?;
        self.validate_encryption()?;
        if self.container_size > 1 << 30 {
            return Err(Error::InvalidConfig(format!(
                "container size {} exceeds 1 GiB",
                self.container_size
            )));
        }
        Ok(())
    }

    /// Checks a configuration for a new repository: [`Config::validate`],
    /// and that the index's memory budget is at least 1 byte. (Builds before
    /// this check accepted 0, so [`Config::decode`] does not make it: their
    /// repositories still open.)
    pub fn validate_new(&self) -> Result<()> {
        self.validate()?;
        if self.index_cache_bytes == 0 {
            return Err(Error::InvalidConfig(
                "index memory budget (--index-memory, index_cache_bytes) is 0 bytes: \
                 valid range 1 byte or more"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The format version follows the encryption; encrypted fingerprints
    /// must be keyable (BLAKE3 or SHA-256, not a trace).
    fn validate_encryption(&self) -> Result<()> {
        if base_version(self.version) != format_version(self.encryption, self.compression.is_on()) {
            return Err(Error::InvalidConfig(format!(
                "format version {} does not go with encryption {:?} and compression {}",
                self.version, self.encryption, self.compression
            )));
        }
        if self.dictionaries() && (!self.compression.is_on() || self.trace) {
            return Err(Error::InvalidConfig(format!(
                "format version {} (compression dictionaries) needs a repository that compresses",
                self.version
            )));
        }
        if self.trace && self.compression.is_on() {
            return Err(Error::InvalidConfig(
                "a trace repository stores no chunk bytes to compress: use --compression off"
                    .into(),
            ));
        }
        if self.encryption == Encryption::None {
            return Ok(());
        }
        if self.trace {
            return Err(Error::InvalidConfig(
                "a trace repository cannot be encrypted (its fingerprints come from the trace \
                 and cannot be keyed): use --encryption none"
                    .into(),
            ));
        }
        if self.fingerprint == FingerprintAlgo::Sha1 {
            return Err(Error::InvalidConfig(
                "SHA-1 fingerprints are for unencrypted lab repositories: use blake3 or sha256, \
                 or --encryption none"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Delta compression needs chunk data in containers; PFC-delta also an
    /// index that reads container metadata and a rewriting policy (its
    /// bases sit around the chunks that policy rewrites).
    fn validate_delta(&self) -> Result<()> {
        use crate::delta::DeltaKind;
        let d = &self.delta;
        if d.kind == DeltaKind::None {
            return Ok(());
        }
        let bad = |why: &str| {
            Err(Error::InvalidConfig(format!(
                "delta compression {:?} {why}",
                d.kind.name()
            )))
        };
        if self.trace {
            return bad("needs chunk data: a trace repository has none");
        }
        if self.layout != Layout::Container {
            return bad("works with the container layout only");
        }
        if d.base_cache_containers == 0 {
            return bad("needs a base cache of at least one container");
        }
        if d.kind == DeltaKind::Pfc {
            if !matches!(
                self.index,
                IndexKind::Ddfs | IndexKind::Hid | IndexKind::Ehid
            ) {
                return bad("needs an index that loads container metadata (ddfs, hid or ehid)");
            }
            if self.rewrite.kind == crate::rewrite::RewriteKind::None {
                return bad("needs a rewriting policy (cbr, capping, har or smr)");
            }
        }
        Ok(())
    }

    /// The configuration as an enveloped object (the whole `config` object
    /// of an unencrypted repository; the sealed plaintext of an encrypted one).
    pub fn encode(&self) -> Vec<u8> {
        // Serialising a struct of plain fields to JSON cannot fail.
        let json = serde_json::to_vec_pretty(self).unwrap_or_default();
        envelope::seal(KIND, self.version, &json)
    }

    /// Parses and validates an enveloped configuration (version 1 or 2).
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let (version, payload) =
            envelope::open_versions(CONFIG_KEY, KIND, &FORMAT_VERSIONS, bytes)?;
        Config::from_payload(version, payload)
    }

    /// The configuration in the JSON `payload` of an envelope of `version`.
    fn from_payload(version: u32, payload: &[u8]) -> Result<Self> {
        let config: Config = serde_json::from_slice(payload)
            .map_err(|e| Error::corrupt(CONFIG_KEY, format!("invalid JSON: {e}")))?;
        if config.version != version {
            return Err(Error::UnsupportedVersion {
                object: CONFIG_KEY.into(),
                found: config.version,
                supported: version,
            });
        }
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionaries_add_eight_to_compressing_versions() {
        let mut c = Config::new("abc".into());
        c.set_dictionaries(true);
        assert!(
            !c.dictionaries(),
            "a repository that does not compress has none"
        );
        c.set_protection(Encryption::XChaCha20Poly1305, Compression::Auto);
        c.set_dictionaries(true);
        assert_eq!(c.version, 16);
        assert!(c.dictionaries() && c.shared_writers());
        assert_eq!(Config::decode(&c.encode()).unwrap(), c);
        let mut single = c.clone();
        single.set_single_writer();
        assert_eq!(single.version, 12);
        assert!(single.dictionaries() && !single.shared_writers());
        c.set_protection(Encryption::None, Compression::Level(3));
        assert_eq!(c.version, 15);
        c.set_protection(Encryption::None, Compression::Off);
        assert_eq!(c.version, 5);
        // A version with dictionaries but no compression is refused.
        let mut bad = Config::new("abc".into());
        bad.version = 13;
        assert!(bad.validate().is_err());
    }

    #[test]
    fn compression_sets_the_format_version() {
        let mut c = Config::new("abc".into());
        assert_eq!((c.version, c.encoding()), (1 + SHARED_WRITERS, None));
        assert!(c.shared_writers());
        c.set_protection(Encryption::None, Compression::Auto);
        assert_eq!(c.version, COMPRESSED_FORMAT_VERSION + SHARED_WRITERS);
        assert_eq!(Config::decode(&c.encode()).unwrap(), c);
        c.set_protection(Encryption::XChaCha20Poly1305, Compression::Level(19));
        assert_eq!(
            c.version,
            ENCRYPTED_COMPRESSED_FORMAT_VERSION + SHARED_WRITERS
        );
        // A single-writer repository keeps its version without the shared part.
        let mut old = c.clone();
        old.set_single_writer();
        assert_eq!(old.version, ENCRYPTED_COMPRESSED_FORMAT_VERSION);
        assert!(!old.shared_writers() && old.validate().is_ok());
        // A second writer is told what to do.
        let why = old.backups_share().unwrap_err();
        assert!(
            why.contains("tessera init") && why.contains("tessera copy"),
            "{why}"
        );
        old.set_protection(Encryption::None, Compression::Off);
        assert_eq!(old.version, FORMAT_VERSION);
        assert_eq!(c.encoding(), Some(Compression::Level(19)));
        assert_eq!(
            c.backup_encoding(None).unwrap(),
            Some(Compression::Level(19))
        );
        assert_eq!(
            c.backup_encoding(Some(Compression::Off)).unwrap(),
            Some(Compression::Off)
        );
        // A version that does not go with the compression is refused.
        c.version = ENCRYPTED_FORMAT_VERSION + SHARED_WRITERS;
        assert!(c.validate().is_err());
        // An uncompressing repository refuses a backup asking for compression.
        let plain = Config::new("p".into());
        assert!(plain.backup_encoding(Some(Compression::Auto)).is_err());
        assert_eq!(plain.backup_encoding(Some(Compression::Off)).unwrap(), None);
        // A trace repository cannot compress.
        let mut t = Config::new("t".into());
        t.trace = true;
        t.set_protection(Encryption::None, Compression::Auto);
        assert!(t.validate().is_err());
    }

    #[test]
    fn round_trip() {
        let c = Config::new("abc".into());
        assert_eq!(Config::decode(&c.encode()).unwrap(), c);
    }

    #[test]
    fn rejects_future_versions() {
        let mut c = Config::new("abc".into());
        c.version = 99;
        let json = serde_json::to_vec(&c).unwrap();
        let sealed = envelope::seal(KIND, FORMAT_VERSION, &json);
        assert!(matches!(
            Config::decode(&sealed),
            Err(Error::UnsupportedVersion { found: 99, .. })
        ));
        let sealed = envelope::seal(KIND, 9, &json);
        assert!(matches!(
            Config::decode(&sealed),
            Err(Error::UnsupportedVersion { found: 9, .. })
        ));
    }

    #[test]
    fn old_configs_get_index_defaults() {
        let c = Config::new("abc".into());
        let mut v = serde_json::to_value(&c).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("bloom_fpr");
        o.remove("index_cache_bytes");
        o.remove("index_bucket_bytes");
        for field in [
            "bloom_bytes",
            "lazy_bft",
            "lazy_prefetch",
            "lazy_buffer_pct",
            "ehid_sparse_pct",
        ] {
            o.remove(field);
        }
        let sealed = envelope::seal(KIND, c.version, &serde_json::to_vec(&v).unwrap());
        assert_eq!(Config::decode(&sealed).unwrap(), c);
        let mut d = c.clone();
        d.index = IndexKind::Ddfs;
        assert_eq!(Config::decode(&d.encode()).unwrap(), d);
        d.bloom_fpr = 0.0;
        assert!(d.validate().is_err());
    }

    #[test]
    fn rejects_bad_lazy_and_ehid_parameters() {
        let ok = Config::new("abc".into());
        assert!(ok.validate().is_ok());
        for bad in [
            Config {
                ehid_sparse_pct: 101,
                ..ok.clone()
            },
            Config {
                lazy_bft: 0,
                ..ok.clone()
            },
            Config {
                lazy_prefetch: 0,
                ..ok.clone()
            },
            Config {
                lazy_buffer_pct: 100,
                ..ok.clone()
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(Error::InvalidConfig(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn new_repositories_need_an_index_memory_budget() {
        let mut c = Config::new("abc".into());
        c.index_cache_bytes = 0;
        assert!(c.validate().is_ok(), "existing repositories still open");
        assert!(matches!(c.validate_new(), Err(Error::InvalidConfig(_))));
        c.index_cache_bytes = 1;
        assert!(c.validate_new().is_ok());
    }

    #[test]
    fn rejects_containers_too_small_for_a_chunk() {
        let mut c = Config::new("abc".into());
        c.container_size = 1000;
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
    }
}
