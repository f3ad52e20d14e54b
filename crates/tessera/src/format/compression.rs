//! Compression of stored chunks: the repository's setting and the chunk
//! encoding (docs/FORMAT.md §7.7). In a compressing repository every stored
//! entry — a whole chunk, or a delta — is a tag byte followed by the bytes
//! themselves (`raw`) or by its length and one zstd frame (`zstd`). The
//! encoding is applied after deduplication (and after delta encoding) and
//! before encryption; whether a chunk is worth compressing is decided per
//! chunk, so incompressible chunks cost one byte. With a compression
//! dictionary (§7.8) a compressed entry is tagged `zstd-dict` and names it.

use crate::format::dictionary::{self, Dictionary};
use std::borrow::Cow;
use std::cell::RefCell;

/// Tag of an entry stored as the chunk's own bytes.
pub const TAG_RAW: u8 = 0;
/// Tag of an entry stored as its length and one zstd frame.
pub const TAG_ZSTD: u8 = 1;
/// Tag of an entry stored as its length, a dictionary id and one zstd
/// frame compressed with that dictionary (docs/FORMAT.md §7.8).
pub const TAG_ZSTD_DICT: u8 = 2;
/// Bytes of the header of a `zstd` entry: tag and u32 LE length.
pub const ZSTD_HEADER_LEN: usize = 5;
/// Bytes of the header of a `zstd-dict` entry: tag, u32 LE length and
/// u32 LE dictionary id.
pub const ZSTD_DICT_HEADER_LEN: usize = 9;
/// Most bytes an entry decodes to: the largest chunk (docs/FORMAT.md §5).
pub const MAX_DECODED_LEN: usize = 16 * 1024 * 1024;
/// Most bytes the encoding adds to an entry (the tag of a `raw` entry).
pub const MAX_OVERHEAD: usize = 1;
/// zstd level of `fastest`.
pub const LEVEL_FASTEST: i32 = 1;
/// zstd level of `default`, and of `auto` without a dictionary.
pub const LEVEL_DEFAULT: i32 = 3;
/// zstd level of `auto` with a dictionary (FORMAT.md §7.8).
pub use crate::format::dictionary::LEVEL as LEVEL_AUTO_DICT;
/// zstd level of `max`.
pub const LEVEL_MAX: i32 = 19;
/// Highest zstd level accepted as `N`.
pub const LEVEL_HIGHEST: i32 = 22;
/// `auto` samples this many bytes of a chunk for its byte entropy.
const SAMPLE_BYTES: usize = 1024;
/// `auto` stores a chunk raw without trying zstd when its sample's byte
/// entropy is at least this many bits per byte (random or already
/// compressed data estimate ≈ 7.8 from a 1 KiB sample; text 4–6).
const ENTROPY_LIMIT: f64 = 7.2;

/// How a repository (or one backup) compresses the chunks it stores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Chunks are stored raw.
    #[default]
    Off,
    /// zstd level 3 for chunks whose sampled byte entropy is below 7.2
    /// bits per byte; the others raw without trying.
    Auto,
    /// zstd at this level (1..=22) for every chunk.
    Level(i32),
}

impl Compression {
    /// Whether chunks are compressed at all.
    pub fn is_on(self) -> bool {
        self != Compression::Off
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compression::Off => f.write_str("off"),
            Compression::Auto => f.write_str("auto"),
            Compression::Level(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Compression::Off),
            "auto" => Ok(Compression::Auto),
            "fastest" => Ok(Compression::Level(LEVEL_FASTEST)),
            "default" => Ok(Compression::Level(LEVEL_DEFAULT)),
            "max" => Ok(Compression::Level(LEVEL_MAX)),
            other => match other.parse::<i32>() {
                Ok(n) if (1..=LEVEL_HIGHEST).contains(&n) => Ok(Compression::Level(n)),
                _ => Err(format!(
                    "unknown compression {other:?} (expected auto, off, fastest, default, max \
                     or a zstd level 1..={LEVEL_HIGHEST})"
                )),
            },
        }
    }
}

impl serde::Serialize for Compression {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Compression {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Bytes given to and produced by the encoder, summed over entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeCounts {
    /// Entries stored as `zstd`.
    pub compressed: u64,
    /// Entries stored as `raw`.
    pub raw: u64,
    /// Bytes of the entries before encoding.
    pub bytes_in: u64,
    /// Bytes of the entries as stored (tags and headers included).
    pub bytes_out: u64,
}

impl EncodeCounts {
    /// Counts one entry of `bytes_in` bytes stored as `bytes_out`.
    fn record(&mut self, compressed: bool, bytes_in: usize, bytes_out: usize) {
        self.compressed += u64::from(compressed);
        self.raw += u64::from(!compressed);
        self.bytes_in += bytes_in as u64;
        self.bytes_out += bytes_out as u64;
    }

    /// Adds `other`.
    pub fn add(&mut self, other: &EncodeCounts) {
        self.compressed += other.compressed;
        self.raw += other.raw;
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
    }
}

/// What a backup's compression did, for its statistics (docs/FORMAT.md
/// §7.7): stored entries (chunks and deltas) before and after encoding.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CompressionStats {
    /// The setting the backup stored chunks with (`"off"` also in a
    /// repository that does not compress).
    pub setting: String,
    /// Entries stored compressed (zstd).
    pub compressed_chunks: u64,
    /// Entries stored raw (incompressible, or compression off).
    pub raw_chunks: u64,
    /// Bytes of the stored entries before compression (what deduplication
    /// and delta compression left).
    pub bytes_before: u64,
    /// Bytes of the stored entries as written (tags and headers included).
    pub bytes_after: u64,
    /// `bytes_before / bytes_after` (`None` when nothing was stored).
    pub ratio: Option<f64>,
}

impl CompressionStats {
    /// The statistics of `counts`, encoded under `setting` (`None`: a
    /// repository that stores chunks as they are, which counts them as
    /// stored raw without a tag).
    pub fn new(setting: Option<Compression>, counts: &EncodeCounts) -> Self {
        CompressionStats {
            setting: setting.unwrap_or_default().to_string(),
            compressed_chunks: counts.compressed,
            raw_chunks: counts.raw,
            bytes_before: counts.bytes_in,
            bytes_after: counts.bytes_out,
            ratio: (counts.bytes_out > 0).then(|| counts.bytes_in as f64 / counts.bytes_out as f64),
        }
    }
}

thread_local! {
    /// One compression context per thread, reused (a fresh context per
    /// 8 KiB chunk halves throughput), with the level it is set to.
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    /// One decompression context per thread, reused.
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
    /// Contexts of entries with a dictionary, reused likewise.
    static DICT_CCTX: RefCell<Option<zstd::zstd_safe::CCtx<'static>>> = const { RefCell::new(None) };
    static DICT_DCTX: RefCell<Option<zstd::zstd_safe::DCtx<'static>>> = const { RefCell::new(None) };
}

/// Appends the stored encoding of `bytes` to `out` under `setting`:
/// `zstd` when it is on, the chunk passes the cheap test and the frame
/// saves at least 1/16 of the chunk; `raw` otherwise; compressed with
/// `dict` when given (a `zstd-dict` entry). Counts it in `counts`.
pub fn encode(
    setting: Compression,
    dict: Option<&Dictionary>,
    bytes: &[u8],
    out: &mut Vec<u8>,
    counts: &mut EncodeCounts,
) {
    let start = out.len();
    let compressed = zstd_level(setting, dict.is_some(), bytes)
        .is_some_and(|level| try_zstd(level, dict, bytes, out));
    if !compressed {
        out.truncate(start);
        out.reserve(1 + bytes.len());
        out.push(TAG_RAW);
        out.extend_from_slice(bytes);
    }
    counts.record(compressed, bytes.len(), out.len() - start);
}

/// The stored encoding of `bytes` under `setting`, decided as by
/// [`encode`], as the pieces to store in order: the `raw` tag and `bytes`
/// themselves (not copied), or a `zstd` entry built in `scratch` (and
/// nothing). Counts it in `counts`.
pub fn encode_pieces<'a>(
    setting: Compression,
    dict: Option<&Dictionary>,
    bytes: &'a [u8],
    scratch: &'a mut Vec<u8>,
    counts: &mut EncodeCounts,
) -> [&'a [u8]; 2] {
    scratch.clear();
    let compressed = zstd_level(setting, dict.is_some(), bytes)
        .is_some_and(|level| try_zstd(level, dict, bytes, scratch));
    match compressed {
        true => {
            counts.record(true, bytes.len(), scratch.len());
            [scratch.as_slice(), &[]]
        }
        false => {
            counts.record(false, bytes.len(), 1 + bytes.len());
            [&[TAG_RAW], bytes]
        }
    }
}

/// The zstd level to try on `bytes` under `setting`, if any (`auto`:
/// [`LEVEL_AUTO_DICT`] with a dictionary, [`LEVEL_DEFAULT`] without).
fn zstd_level(setting: Compression, dict: bool, bytes: &[u8]) -> Option<i32> {
    match setting {
        Compression::Off => None,
        Compression::Auto => (!looks_random(bytes)).then_some(match dict {
            true => LEVEL_AUTO_DICT,
            false => LEVEL_DEFAULT,
        }),
        Compression::Level(n) => Some(n),
    }
}

/// Appends a `zstd` entry of `bytes` at `level` to `out` if it saves at
/// least 1/16 of them; returns whether it did (`out` may then hold a
/// partial entry, which the caller truncates).
fn try_zstd(level: i32, dict: Option<&Dictionary>, bytes: &[u8], out: &mut Vec<u8>) -> bool {
    let budget = bytes.len() - bytes.len() / 16;
    let header = match dict {
        Some(_) => ZSTD_DICT_HEADER_LEN,
        None => ZSTD_HEADER_LEN,
    };
    if bytes.len() > MAX_DECODED_LEN || budget <= header {
        return false;
    }
    let start = out.len();
    out.push(if dict.is_some() {
        TAG_ZSTD_DICT
    } else {
        TAG_ZSTD
    });
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    if let Some(d) = dict {
        out.extend_from_slice(&d.id.to_le_bytes());
    }
    let frame_start = out.len();
    out.resize(frame_start + budget - header, 0);
    let written = match dict {
        Some(d) => compress_with(d, level, bytes, &mut out[frame_start..]),
        None => compress_plain(level, bytes, &mut out[frame_start..]),
    };
    match written {
        Some(n) => {
            out.truncate(frame_start + n);
            true
        }
        None => {
            out.truncate(start);
            false
        }
    }
}

/// Compresses `bytes` at `level` into `dst` as one frame with `dict`;
/// `None` if it does not fit (or zstd fails).
fn compress_with(dict: &Dictionary, level: i32, bytes: &[u8], dst: &mut [u8]) -> Option<usize> {
    let cdict = dict.encoder(level)?;
    DICT_CCTX.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = zstd::zstd_safe::CCtx::try_create();
        }
        let cctx = cell.as_mut()?;
        cctx.compress_using_cdict(dst, bytes, cdict.as_cdict()).ok()
    })
}

/// Compresses `bytes` at `level` into `dst` as one frame; `None` if it
/// does not fit (or zstd fails).
fn compress_plain(level: i32, bytes: &[u8], dst: &mut [u8]) -> Option<usize> {
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(l, _)| *l != level) {
            *cell = zstd::bulk::Compressor::new(level).ok().map(|c| (level, c));
        }
        let (_, c) = cell.as_mut()?;
        // A frame that does not fit the budget fails: the chunk is not worth it.
        c.compress_to_buffer(bytes, dst).ok()
    })
}

/// Whether `bytes` look incompressible: the byte entropy of a sample of up
/// to [`SAMPLE_BYTES`] (four windows spread over the chunk) is at least
/// [`ENTROPY_LIMIT`] bits per byte.
fn looks_random(bytes: &[u8]) -> bool {
    sample_counts(bytes).is_some_and(|counts| entropy(&counts) >= ENTROPY_LIMIT)
}

/// Byte counts of the [`SAMPLE_BYTES`] sampled from `bytes` (four windows
/// spread over them); `None` for fewer bytes.
fn sample_counts(bytes: &[u8]) -> Option<[u32; 256]> {
    if bytes.len() < SAMPLE_BYTES {
        return None;
    }
    let mut counts = [0u32; 256];
    let window = SAMPLE_BYTES / 4;
    let step = (bytes.len() - window) / 3;
    for w in 0..4 {
        for &b in &bytes[w * step..w * step + window] {
            counts[usize::from(b)] += 1;
        }
    }
    Some(counts)
}

/// The byte entropy, in bits per byte, of a sample with these `counts`
/// (summing to [`SAMPLE_BYTES`]): H = -sum(c/n log2(c/n)) = log2(n) -
/// sum(c log2 c) / n, with c log2 c from a table (no logarithm per chunk).
fn entropy(counts: &[u32; 256]) -> f64 {
    let table = c_log2_c();
    let sum: f64 = counts
        .iter()
        .map(|&c| table.get(c as usize).copied().unwrap_or(0.0))
        .sum();
    let n = SAMPLE_BYTES as f64;
    n.log2() - sum / n
}

/// `c * log2(c)` for every count `c` of a sample (0 for 0).
fn c_log2_c() -> &'static [f64; SAMPLE_BYTES + 1] {
    static TABLE: std::sync::OnceLock<[f64; SAMPLE_BYTES + 1]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0.0; SAMPLE_BYTES + 1];
        for (c, v) in t.iter_mut().enumerate().skip(1) {
            let c = c as f64;
            *v = c * c.log2();
        }
        t
    })
}

/// What is wrong with a stored entry that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// Decodes a stored entry: the chunk's (or delta's) bytes, borrowed from
/// `stored` when it is `raw`.
pub fn decode(stored: &[u8]) -> Result<Cow<'_, [u8]>, DecodeError> {
    match stored.split_first() {
        None => Err(DecodeError("empty stored entry (no encoding tag)".into())),
        Some((&TAG_RAW, rest)) => Ok(Cow::Borrowed(rest)),
        Some((&TAG_ZSTD, rest)) => decode_zstd(rest).map(Cow::Owned),
        Some((&TAG_ZSTD_DICT, rest)) => decode_zstd_dict(rest).map(Cow::Owned),
        Some((tag, _)) => Err(DecodeError(format!("unknown encoding tag {tag}"))),
    }
}

/// The bytes of a stored `raw` entry, `None` for a `zstd` or malformed one.
pub fn raw_part(stored: &[u8]) -> Option<&[u8]> {
    match stored.split_first() {
        Some((&TAG_RAW, rest)) => Some(rest),
        _ => None,
    }
}

/// The dictionary id a `zstd-dict` entry names, if it is one.
pub fn dictionary_of(stored: &[u8]) -> Option<u32> {
    match stored {
        [TAG_ZSTD_DICT, _, _, _, _, a, b, c, d, ..] => Some(u32::from_le_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

fn decode_zstd_dict(rest: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let (len, id, frame) = match rest.split_first_chunk::<8>() {
        Some((h, frame)) => (
            u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize,
            u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
            frame,
        ),
        None => return Err(DecodeError("truncated zstd-dict entry header".into())),
    };
    if len > MAX_DECODED_LEN {
        return Err(DecodeError(format!(
            "zstd-dict entry announces {len} bytes, above the {MAX_DECODED_LEN}-byte limit"
        )));
    }
    let dict = dictionary::lookup(id).map_err(|why| {
        DecodeError(format!(
            "its dictionary {} cannot be used: {why}",
            dictionary::key(id)
        ))
    })?;
    let mut out = Vec::with_capacity(len);
    let n = DICT_DCTX.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = zstd::zstd_safe::DCtx::try_create();
        }
        let dctx = cell
            .as_mut()
            .ok_or_else(|| DecodeError("no zstd context".into()))?;
        dctx.decompress_using_ddict(&mut out, frame, dict.ddict())
            .map_err(|e| {
                DecodeError(format!(
                    "zstd frame does not decode with {}: {}",
                    dictionary::key(id),
                    zstd::zstd_safe::get_error_name(e)
                ))
            })
    })?;
    if n != len {
        return Err(DecodeError(format!(
            "zstd frame decodes to {n} bytes, its header announces {len}"
        )));
    }
    Ok(out)
}

fn decode_zstd(rest: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let (len, frame) = match rest.split_first_chunk::<4>() {
        Some((len, frame)) => (u32::from_le_bytes(*len) as usize, frame),
        None => return Err(DecodeError("truncated zstd entry header".into())),
    };
    if len > MAX_DECODED_LEN {
        return Err(DecodeError(format!(
            "zstd entry announces {len} bytes, above the {MAX_DECODED_LEN}-byte limit"
        )));
    }
    let mut out = Vec::with_capacity(len);
    let n = DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(
                zstd::bulk::Decompressor::new()
                    .map_err(|e| DecodeError(format!("zstd context: {e}")))?,
            );
        }
        match cell.as_mut() {
            Some(d) => d
                .decompress_to_buffer(frame, &mut out)
                .map_err(|e| DecodeError(format!("zstd frame does not decode: {e}"))),
            None => Err(DecodeError("no zstd context".into())),
        }
    })?;
    if n != len {
        return Err(DecodeError(format!(
            "zstd frame decodes to {n} bytes, its header announces {len}"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_the_encoding() {
        let text = b"the quick brown fox ".repeat(500);
        let random = crate::chunker::pseudo_random(20_000, 2);
        for setting in [Compression::Off, Compression::Auto, Compression::Level(1)] {
            for bytes in [&text[..], &random[..], b"ab"] {
                let (mut whole, mut a, mut b) =
                    (Vec::new(), EncodeCounts::default(), EncodeCounts::default());
                encode(setting, None, bytes, &mut whole, &mut a);
                let mut scratch = Vec::new();
                let pieces = encode_pieces(setting, None, bytes, &mut scratch, &mut b);
                assert_eq!(pieces.concat(), whole, "{setting}");
                assert_eq!(a, b);
                assert_eq!(decode(&whole).unwrap().as_ref(), bytes);
            }
        }
    }
    use proptest::prelude::*;

    fn text(n: usize) -> Vec<u8> {
        let words = [
            "alpha ",
            "beta ",
            "gamma ",
            "delta\n",
            "static int ",
            "return 0;\n",
        ];
        let mut out = Vec::new();
        let mut x = 7u64;
        while out.len() < n {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            out.extend_from_slice(words[(x >> 60) as usize % words.len()].as_bytes());
        }
        out.truncate(n);
        out
    }

    fn random(n: usize) -> Vec<u8> {
        crate::chunker::pseudo_random(n, 42)
    }

    fn round_trip(setting: Compression, bytes: &[u8]) -> (Vec<u8>, EncodeCounts) {
        let mut out = vec![9, 9];
        let mut counts = EncodeCounts::default();
        encode(setting, None, bytes, &mut out, &mut counts);
        assert_eq!(&out[..2], &[9, 9], "encode appends");
        let stored = out[2..].to_vec();
        assert_eq!(decode(&stored).unwrap().as_ref(), bytes);
        assert_eq!(counts.bytes_out, stored.len() as u64);
        (stored, counts)
    }

    #[test]
    fn text_is_compressed_random_is_stored_raw() {
        for setting in [
            Compression::Auto,
            Compression::Level(1),
            Compression::Level(19),
        ] {
            let (stored, c) = round_trip(setting, &text(8192));
            assert_eq!(stored[0], TAG_ZSTD);
            assert!(stored.len() < 8192 / 2, "{setting}: {}", stored.len());
            assert_eq!(c.compressed, 1);
            let (stored, c) = round_trip(setting, &random(8192));
            assert_eq!((stored[0], stored.len(), c.raw), (TAG_RAW, 8193, 1));
        }
        let (stored, _) = round_trip(Compression::Off, &text(8192));
        assert_eq!((stored[0], stored.len()), (TAG_RAW, 8193));
        assert!(looks_random(&random(8192)));
        assert!(!looks_random(&text(8192)));
    }

    #[test]
    fn tabled_entropy_is_the_definition() {
        for data in [random(8192), text(8192), vec![7; 4096], random(1024)] {
            let counts = sample_counts(&data).unwrap();
            let n = SAMPLE_BYTES as f64;
            let direct: f64 = counts
                .iter()
                .filter(|&&c| c > 0)
                .map(|&c| -(f64::from(c) / n) * (f64::from(c) / n).log2())
                .sum();
            assert!((entropy(&counts) - direct).abs() < 1e-9);
        }
        assert!(sample_counts(&[0; SAMPLE_BYTES - 1]).is_none());
    }

    #[test]
    fn settings_parse_and_print() {
        for (s, c) in [
            ("off", Compression::Off),
            ("auto", Compression::Auto),
            ("fastest", Compression::Level(1)),
            ("default", Compression::Level(3)),
            ("max", Compression::Level(19)),
            ("22", Compression::Level(22)),
        ] {
            assert_eq!(s.parse::<Compression>().unwrap(), c);
            assert_eq!(c.to_string().parse::<Compression>().unwrap(), c);
        }
        for bad in ["99", "0", "-1", "foo", ""] {
            let e = bad.parse::<Compression>().unwrap_err();
            assert!(e.contains("expected auto, off"), "{e}");
        }
    }

    #[test]
    fn dictionary_entries_round_trip_and_name_a_missing_dictionary() {
        // Small texts alike: each compresses better with a dictionary.
        let files: Vec<Vec<u8>> = (0..300)
            .map(|i| {
                let mut t =
                    b"# Copyright the authors. Licensed under the MIT licence.\nimport os\n"
                        .to_vec();
                t.extend_from_slice(&text(600 + i));
                t
            })
            .collect();
        let samples: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
        let bytes = dictionary::train(&samples).expect("trained");
        let d = Dictionary::new(0x5eed_0001, 1, 300, bytes).unwrap();
        let d = dictionary::register(std::sync::Arc::new(d)).unwrap();
        let (mut with, mut without) = (0usize, 0usize);
        for f in &files {
            for (dict, total) in [(Some(&*d), &mut with), (None, &mut without)] {
                let mut out = Vec::new();
                let mut counts = EncodeCounts::default();
                encode(Compression::Auto, dict, f, &mut out, &mut counts);
                assert_eq!(decode(&out).unwrap().as_ref(), f.as_slice());
                assert_eq!(dictionary_of(&out), dict.map(|d| d.id));
                *total += out.len();
            }
        }
        assert!(with < without, "with {with} bytes, without {without}");
        // An entry naming a dictionary nobody registered fails, naming it.
        let mut out = Vec::new();
        encode(
            Compression::Auto,
            Some(&d),
            &files[0],
            &mut out,
            &mut EncodeCounts::default(),
        );
        out[5..9].copy_from_slice(&0x5eed_0002u32.to_le_bytes());
        let e = decode(&out).unwrap_err();
        assert!(e.0.contains("dictionaries/5eed0002"), "{e}");
        // Damage to the header or frame is an error or other bytes, never a panic.
        out[5..9].copy_from_slice(&d.id.to_le_bytes());
        for i in 0..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x40;
            let _ = decode(&bad);
        }
        assert!(decode(&out[..7]).is_err());
    }

    #[test]
    fn damaged_entries_are_errors() {
        let (stored, _) = round_trip(Compression::Auto, &text(8192));
        assert!(decode(&[]).is_err());
        assert!(decode(&[7, 1, 2]).is_err());
        assert!(decode(&stored[..3]).is_err());
        assert!(decode(&stored[..stored.len() - 1]).is_err());
        let mut longer = stored.clone();
        longer[1] ^= 1;
        assert!(decode(&longer).is_err());
        let mut huge = stored.clone();
        huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).is_err());
        // Flipping any byte never panics: most flips fail to decode, the
        // rest decode to some bytes (which the chunk's fingerprint checks).
        let mut failed = 0;
        for i in 0..stored.len() {
            let mut bad = stored.clone();
            bad[i] ^= 0x40;
            failed += usize::from(decode(&bad).is_err());
        }
        assert!(failed > 0);
    }

    proptest! {
        #[test]
        fn every_setting_round_trips(
            bytes in prop::collection::vec(any::<u8>(), 0..4096),
            repeat in 1usize..8,
            level in 1i32..=9,
        ) {
            let data: Vec<u8> = bytes.iter().copied().cycle().take(bytes.len() * repeat).collect();
            for setting in [Compression::Off, Compression::Auto, Compression::Level(level)] {
                let mut out = Vec::new();
                let mut counts = EncodeCounts::default();
                encode(setting, None, &data, &mut out, &mut counts);
                prop_assert!(out.len() <= data.len() + MAX_OVERHEAD);
                let decoded = decode(&out).unwrap();
                prop_assert_eq!(decoded.as_ref(), data.as_slice());
            }
        }
    }
}
