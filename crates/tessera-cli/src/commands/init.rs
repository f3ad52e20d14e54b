//! `tessera init`: create a repository.

use anyhow::Result;
use clap::Args;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::Location;
use tessera::chunker::{ChunkerKind, ChunkerParams};
use tessera::delta::features::FeatureKind;
use tessera::delta::stage::{BasePrefetch, BaseScope};
use tessera::delta::{DeltaKind, DeltaParams};
use tessera::repo::config::{Arrange, Compression, Config, Encryption, IndexKind, Layout};
use tessera::rewrite::{RewriteKind, RewriteParams};
use tessera::FingerprintAlgo;
use tessera::Repository;
use tessera::{parse_size, parse_size_u32};

use crate::output::{print, Form, Keys, Report};
use crate::secrets::{new_repo_key, tuned, Access, KdfArgs};

/// Chunking and fingerprint options shared by `init` and `analyze`.
#[derive(Args)]
pub struct ChunkingArgs {
    /// Chunking algorithm: fastcdc, rabin or fixed.
    #[arg(long, default_value = "fastcdc")]
    pub chunker: ChunkerKind,
    /// Minimum chunk size (e.g. 2KiB).
    #[arg(long, default_value = "2KiB", value_parser = parse_size_u32)]
    min_size: u32,
    /// Average chunk size (the chunk size of `fixed`).
    #[arg(long, default_value = "8KiB", value_parser = parse_size_u32)]
    avg_size: u32,
    /// Maximum chunk size.
    #[arg(long, default_value = "64KiB", value_parser = parse_size_u32)]
    max_size: u32,
    /// Fingerprint hash: blake3, sha256 or sha1.
    #[arg(long, default_value = "blake3")]
    pub fingerprint: FingerprintAlgo,
}

impl ChunkingArgs {
    pub fn params(&self) -> ChunkerParams {
        ChunkerParams {
            kind: self.chunker,
            min_size: self.min_size,
            avg_size: self.avg_size,
            max_size: self.max_size,
        }
    }
}

/// The arguments of `tessera init`.
#[derive(Args)]
pub struct InitArgs {
    /// The new repository: a local directory (absent or empty), or
    /// `s3:http[s]://HOST[:PORT]/BUCKET/PREFIX` (a prefix holding no object).
    repo: Location,
    /// Encrypt every object (`aes256gcm` or `xchacha20poly1305`, asks for a
    /// password) or not (`none`: lab and benchmark repositories). Default:
    /// aes256gcm, except for --trace and --fingerprint sha1 repositories,
    /// which cannot be encrypted.
    #[arg(long)]
    encryption: Option<Encryption>,
    /// Compression of stored chunks (zstd, per chunk, after deduplication,
    /// before encryption): auto (level 3, incompressible chunks stored raw
    /// without trying), off, fastest (1), default (3), max (19) or a level
    /// 1..=22. Default: auto in encrypted repositories, off in unencrypted
    /// ones (lab and benchmark repositories keep the uncompressed format).
    #[arg(long, value_name = "SETTING")]
    compression: Option<Compression>,
    /// Whether a compressing repository trains a zstd dictionary from the
    /// chunks of its first backup and compresses chunks with it (on; small
    /// files alike compress better), or compresses each chunk alone (off:
    /// the format older versions of Tessera read). Ignored without
    /// compression.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off,
          action = clap::ArgAction::Set)]
    compression_dictionary: bool,
    /// Print JSON: the repository's location, id, encryption, compression,
    /// layout and index.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    kdf: KdfArgs,
    #[command(flatten)]
    chunking: ChunkingArgs,
    /// Container capacity.
    #[arg(long, default_value = "4MiB", value_parser = parse_size_u32)]
    container_size: u32,
    /// Deduplication index: exact (all fingerprints in memory), ddfs
    /// (Bloom filter + on-disk table + locality-preserving cache), hid or
    /// ehid (ddfs keeping only hot entries: those of containers the last
    /// backup used at least 50%; ehid with a Bloom filter over them), eager
    /// or lazy (on-disk table + metadata log + fingerprint cache; lazy
    /// buffers cache misses and searches them on disk a bucket at a time).
    /// Default: ddfs, whose memory stays bounded (Bloom filter of ~1.5
    /// bytes per stored chunk plus --index-memory) while deduplicating
    /// exactly like exact, which holds 47-94 bytes per chunk in memory.
    #[arg(long, default_value = "ddfs", value_parser = parse_index)]
    index: IndexKind,
    /// HID/EHID: also look up hot misses in the cold index (maximum dedup).
    #[arg(long)]
    consult_cold: bool,
    /// HID/EHID: containers the last backup used below this percentage are sparse.
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_EHID_SPARSE_PCT)]
    sparse_threshold: u32,
    /// DDFS: target false-positive rate of the Bloom filter.
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_BLOOM_FPR)]
    bloom_fpr: f64,
    /// DDFS, eager, lazy: memory budget of the index's cache (lazy: cache
    /// and buffer together).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    index_memory: u64,
    /// Eager, lazy: size of the Bloom filter (default: sized for
    /// --bloom-fpr). DDFS, HID/EHID: memory budget of the Bloom filters
    /// (default 256MiB; runs whose filter does not fit are looked up on disk).
    #[arg(long, value_parser = parse_bloom_size)]
    bloom_size: Option<u64>,
    /// Lazy: buffer fingerprint threshold (fingerprints a buffer bucket
    /// collects before they are searched on disk together).
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_LAZY_BFT)]
    bft: u32,
    /// Eager, lazy: metadata-log entries prefetched into the cache per on-disk hit.
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_LAZY_PREFETCH)]
    prefetch: u32,
    /// Lazy: percent of --index-memory given to the buffer (the rest is the cache).
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_LAZY_BUFFER_PCT)]
    buffer_share: u32,
    /// Data layout: container (a log of containers) or lifecycle (MFDedup
    /// categories and volumes, deletion without GC).
    #[arg(long, default_value = "container", value_parser = parse_layout)]
    layout: Layout,
    /// Lifecycle layout: arrange after every backup (auto) or only on `tessera arrange` (manual).
    #[arg(long, default_value = "auto", value_parser = parse_arrange)]
    arrange: Arrange,
    /// A trace repository: backups replay fingerprint traces (`backup --trace`)
    /// and store metadata only.
    #[arg(long)]
    trace: bool,
    /// Rewriting policy: none, cbr, capping, har or smr.
    #[arg(long, default_value = "none")]
    rewrite: RewriteKind,
    /// Rewrite at most this percentage of the bytes seen (CBR: 5 unless set).
    #[arg(long)]
    rewrite_limit: Option<f64>,
    /// Capping and SMR: segment size.
    #[arg(long, default_value = "20MiB", value_parser = parse_size)]
    segment_size: u64,
    /// Capping: old containers a segment may reference.
    #[arg(long, default_value_t = 20)]
    capping_level: u32,
    /// SMR: containers selected per segment.
    #[arg(long, default_value_t = 20)]
    smr_level: u32,
    /// HAR: containers below this utilization (percent) are sparse.
    #[arg(long, default_value_t = 50.0)]
    har_utilization: f64,
    /// CBR: minimal rewrite utility (percent).
    #[arg(long, default_value_t = 70.0)]
    cbr_min_utility: f64,
    /// CBR: stream context size.
    #[arg(long, default_value = "5MiB", value_parser = parse_size)]
    cbr_stream_context: u64,
    /// Delta compression of stored chunks: none, pfc (PFC-delta: chunks
    /// around persistent fragmented chunks, bases prefetched with the
    /// index's container reads; needs --index ddfs|hid|ehid and a
    /// --rewrite policy) or greedy (any similar stored chunk, bases read
    /// from storage). Deltas are compressed too (--compression): on top
    /// of zstd, on data changed in place (release tarballs, database
    /// files) pfc still stores 1.5-2x less with --rewrite cbr and
    /// 1.15-1.2x less with har, for 2-23% slower restores; with capping,
    /// or on streams of new files, it gains under 10% (docs/RESEARCH.md,
    /// PFC-delta).
    #[arg(long, default_value = "none")]
    delta: DeltaKind,
    /// Delta: super-features finding similar chunks: odess or ntransform.
    #[arg(long, default_value = "odess")]
    features: FeatureKind,
    /// Delta: containers the base chunk cache holds.
    #[arg(long, default_value_t = tessera::delta::stage::DEFAULT_BASE_CACHE_CONTAINERS)]
    base_cache: u32,
    /// PFC-delta: containers the index reads whole for their bases: pfc
    /// (those of the last backup's persistent fragmented chunks, as the
    /// paper) or fc (those of all its fragmented chunks).
    #[arg(long, default_value = "pfc")]
    base_prefetch: BasePrefetch,
    /// PFC-delta: which cached chunks may be bases: any, or referenced
    /// (only those of the last 16 distinct containers the backup referenced
    /// for a kept duplicate, which its restores have just read).
    #[arg(long, default_value = "any")]
    base_scope: BaseScope,
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    s.parse()
}

fn parse_arrange(s: &str) -> Result<Arrange, String> {
    match s {
        "auto" => Ok(Arrange::Auto),
        "manual" => Ok(Arrange::Manual),
        other => Err(format!(
            "unknown arranging mode {other:?} (expected auto or manual)"
        )),
    }
}

fn parse_index(s: &str) -> Result<IndexKind, String> {
    s.parse()
}

/// A Bloom filter size: at least 1 byte (the configuration's 0 means "sized
/// for --bloom-fpr", which omitting the option asks for).
fn parse_bloom_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("0 bytes is out of range: valid range 1 byte or more \
                  (omit --bloom-size to size the filter for --bloom-fpr)"
            .into()),
        n => Ok(n),
    }
}

/// Creates the repository `a` describes.
pub fn run(a: InitArgs, access: &Access) -> Result<ExitCode> {
    let mut config = Config::new(random_id(&a.repo.to_string()));
    config.chunker = a.chunking.params();
    config.fingerprint = a.chunking.fingerprint;
    config.container_size = a.container_size;
    config.index = a.index;
    config.layout = a.layout;
    config.arrange = a.arrange;
    config.trace = a.trace;
    config.bloom_fpr = a.bloom_fpr;
    config.index_cache_bytes = a.index_memory;
    config.bloom_bytes = a.bloom_size.unwrap_or(0);
    config.lazy_bft = a.bft;
    config.lazy_prefetch = a.prefetch;
    config.lazy_buffer_pct = a.buffer_share;
    config.ehid_consult_cold = a.consult_cold;
    config.ehid_sparse_pct = a.sparse_threshold;
    config.rewrite = RewriteParams {
        kind: a.rewrite,
        limit: a.rewrite_limit.map(|p| p / 100.0),
        cbr_stream_context: a.cbr_stream_context,
        cbr_min_utility: a.cbr_min_utility / 100.0,
        segment_bytes: a.segment_size,
        segment_chunks: None,
        capping_level: a.capping_level,
        smr_level: a.smr_level,
        har_utilization: a.har_utilization / 100.0,
    };
    config.delta = DeltaParams {
        kind: a.delta,
        features: a.features,
        base_cache_containers: a.base_cache,
        prefetch: a.base_prefetch,
        scope: a.base_scope,
    };
    let plain_only = a.trace || a.chunking.fingerprint == FingerprintAlgo::Sha1;
    let encryption = a.encryption.unwrap_or(match plain_only {
        true => Encryption::None,
        false => Encryption::Aes256Gcm,
    });
    // A trace repository stores no chunk bytes: nothing to compress.
    let compression = a.compression.unwrap_or(match encryption {
        Encryption::XChaCha20Poly1305 | Encryption::Aes256Gcm if !a.trace => Compression::Auto,
        _ => Compression::Off,
    });
    config.set_protection(Encryption::None, compression);
    config.set_dictionaries(a.compression_dictionary);
    match encryption {
        Encryption::None => {
            Repository::init_at(&tuned(&a.repo, access), config.clone(), None)?;
        }
        Encryption::XChaCha20Poly1305 | Encryption::Aes256Gcm => {
            // Refuse a configuration that cannot be encrypted before asking for a password.
            config.set_protection(encryption, compression);
            config.validate()?;
            let key = new_repo_key(&access.password, a.kdf)?;
            Repository::init_at(&tuned(&a.repo, access), config.clone(), Some(&key))?;
        }
    }
    let created = Created {
        repository: a.repo.to_string(),
        id: config.id,
        encryption: encryption.to_string(),
        compression: compression.to_string(),
        layout: config.layout,
        index: config.index,
        encrypted: encryption != Encryption::None,
    };
    print(&created, Form::json_if(a.json))?;
    Ok(ExitCode::SUCCESS)
}

/// The repository `tessera init` created.
#[derive(serde::Serialize)]
struct Created {
    repository: String,
    id: String,
    encryption: String,
    compression: String,
    layout: Layout,
    index: IndexKind,
    #[serde(skip)]
    encrypted: bool,
}

impl Report for Created {
    const KEYS: Keys = Keys::Sorted;

    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let Created {
            repository,
            encryption,
            compression,
            ..
        } = self;
        if !self.encrypted {
            writeln!(
                out,
                "created unencrypted repository {repository} (compression {compression})"
            )
        } else {
            writeln!(
                out,
                "created encrypted repository {repository} ({encryption}, compression {compression})"
            )
        }
    }
}

/// `on` or `off`.
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected on or off, not {other:?}")),
    }
}

/// A repository id unlikely to repeat: a hash of the location, time and process.
fn random_id(location: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{location}|{nanos}|{}", std::process::id());
    FingerprintAlgo::Blake3.hash(seed.as_bytes()).hex(16)
}
