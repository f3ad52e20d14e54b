//! Byte formats of the lifecycle layout (docs/LIFECYCLE-FORMAT.md): volume
//! objects (also used, with one category, for active and pending
//! categories), NDF fingerprint tables and the arranging journal (lineage
//! states: [`crate::layout::lifecycle::lineage_state`]).

use super::uploads::Uploads;
use crate::backend::{Backend, WriteMode};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use crate::format::compression::{self, Compression, EncodeCounts};
use crate::format::dictionary::Dictionary;
use crate::format::envelope::{self, le4, le8};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Magic of volume (and category) objects.
pub const VOLUME_MAGIC: &[u8; 4] = b"TSLV";
/// Format version of volume objects.
pub const VOLUME_VERSION: u32 = 1;
/// Bytes of the fixed part of a volume header.
pub const HEADER_FIXED: usize = 28;
/// Bytes of one category entry in a volume header.
pub const ENTRY_LEN: usize = 40;
/// Bytes of one chunk's metadata (fingerprint, length).
pub const META_ENTRY_LEN: usize = FINGERPRINT_LEN + 4;
/// Header flag: chunk bytes are stored (absent in trace repositories).
pub const FLAG_DATA: u32 = 1;
/// Header flag (with [`FLAG_DATA`]): every chunk is stored as an encoded
/// entry (`crate::format::compression`, docs/FORMAT.md §7.7); metadata lengths are
/// the entries'.
pub const FLAG_ENCODED: u32 = 2;
/// Most categories one volume header may announce.
pub const MAX_CATEGORIES: u32 = 1 << 20;

const NDF_KIND: &[u8; 4] = b"LNDF";
const JOURNAL_KIND: &[u8; 4] = b"LJRN";
/// Format version of NDF tables and journals.
pub const META_VERSION: u32 = 1;

/// One category's entry in a volume header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CategoryEntry {
    /// First backup version of the category's lifecycle (`i` of Cat.(i,j)).
    pub start: u64,
    /// Chunks in the category.
    pub chunks: u64,
    /// Offset of the category's metadata section from the start of the object.
    pub offset: u64,
    /// Sum of the chunk lengths (the data section's length when data is stored).
    pub data_bytes: u64,
    /// CRC-32C of the metadata section.
    pub meta_crc: u32,
    /// CRC-32C of the data section (of the empty string without data).
    pub data_crc: u32,
}

impl CategoryEntry {
    /// Bytes of the metadata section.
    pub fn meta_len(&self) -> u64 {
        self.chunks * META_ENTRY_LEN as u64
    }
}

/// A parsed volume header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeHeader {
    /// Last backup version of every category's lifecycle (`j` of Cat.(i,j)).
    pub end: u64,
    /// Whether chunk bytes are stored.
    pub has_data: bool,
    /// Whether chunks are stored as encoded entries ([`FLAG_ENCODED`]).
    pub encoded: bool,
    /// The categories, by ascending `start`.
    pub categories: Vec<CategoryEntry>,
}

impl VolumeHeader {
    /// Bytes of a header announcing `count` categories.
    pub fn len_for(count: usize) -> u64 {
        (HEADER_FIXED + ENTRY_LEN * count + 4) as u64
    }

    /// Bytes of category `idx` (metadata and data sections).
    pub fn category_len(&self, idx: usize) -> u64 {
        let c = &self.categories[idx];
        c.meta_len() + if self.has_data { c.data_bytes } else { 0 }
    }

    /// Offset of the data section of category `idx`.
    pub fn data_offset(&self, idx: usize) -> u64 {
        let c = &self.categories[idx];
        c.offset + c.meta_len()
    }

    /// Total object length announced by the header.
    pub fn object_len(&self) -> u64 {
        let mut end = Self::len_for(self.categories.len());
        for i in 0..self.categories.len() {
            end += self.category_len(i);
        }
        end
    }

    /// Encodes the header.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::len_for(self.categories.len()) as usize);
        out.extend_from_slice(VOLUME_MAGIC);
        out.extend_from_slice(&VOLUME_VERSION.to_le_bytes());
        out.extend_from_slice(&self.end.to_le_bytes());
        let flags = match (self.has_data, self.encoded) {
            (false, _) => 0,
            (true, false) => FLAG_DATA,
            (true, true) => FLAG_DATA | FLAG_ENCODED,
        };
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&(self.categories.len() as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        for c in &self.categories {
            out.extend_from_slice(&c.start.to_le_bytes());
            out.extend_from_slice(&c.chunks.to_le_bytes());
            out.extend_from_slice(&c.offset.to_le_bytes());
            out.extend_from_slice(&c.data_bytes.to_le_bytes());
            out.extend_from_slice(&c.meta_crc.to_le_bytes());
            out.extend_from_slice(&c.data_crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses the fixed part: returns the number of categories announced.
    pub fn parse_fixed(name: &str, b: &[u8]) -> Result<u32> {
        if b.len() < HEADER_FIXED {
            return Err(Error::corrupt(name, "truncated volume header"));
        }
        if &b[0..4] != VOLUME_MAGIC {
            return Err(Error::corrupt(name, "bad magic (not a lifecycle volume)"));
        }
        let version = u32::from_le_bytes(le4(&b[4..8]));
        if version != VOLUME_VERSION {
            return Err(Error::UnsupportedVersion {
                object: name.to_string(),
                found: version,
                supported: VOLUME_VERSION,
            });
        }
        let count = u32::from_le_bytes(le4(&b[20..24]));
        if count > MAX_CATEGORIES {
            return Err(Error::corrupt(
                name,
                format!("{count} categories announced"),
            ));
        }
        Ok(count)
    }

    /// Parses a whole header (`b` may continue past it).
    pub fn parse(name: &str, b: &[u8]) -> Result<VolumeHeader> {
        let count = Self::parse_fixed(name, b)? as usize;
        let len = Self::len_for(count) as usize;
        if b.len() < len {
            return Err(Error::corrupt(name, "truncated volume header"));
        }
        let stored = u32::from_le_bytes(le4(&b[len - 4..len]));
        if crc32c::crc32c(&b[..len - 4]) != stored {
            return Err(Error::corrupt(name, "volume header checksum mismatch"));
        }
        let end = u64::from_le_bytes(le8(&b[8..16]));
        let flags = u32::from_le_bytes(le4(&b[16..20]));
        if flags & !(FLAG_DATA | FLAG_ENCODED) != 0 || flags == FLAG_ENCODED {
            return Err(Error::corrupt(name, format!("unknown flags {flags:#x}")));
        }
        let has_data = flags & FLAG_DATA != 0;
        let encoded = flags & FLAG_ENCODED != 0;
        let mut categories = Vec::with_capacity(count);
        let mut expect = len as u64;
        for k in 0..count {
            let e = &b[HEADER_FIXED + k * ENTRY_LEN..HEADER_FIXED + (k + 1) * ENTRY_LEN];
            let c = CategoryEntry {
                start: u64::from_le_bytes(le8(&e[0..8])),
                chunks: u64::from_le_bytes(le8(&e[8..16])),
                offset: u64::from_le_bytes(le8(&e[16..24])),
                data_bytes: u64::from_le_bytes(le8(&e[24..32])),
                meta_crc: u32::from_le_bytes(le4(&e[32..36])),
                data_crc: u32::from_le_bytes(le4(&e[36..40])),
            };
            let ordered = categories
                .last()
                .is_none_or(|p: &CategoryEntry| p.start < c.start);
            if c.offset != expect || c.start > end || c.start == 0 || !ordered {
                return Err(Error::corrupt(
                    name,
                    format!("inconsistent category entry {k}"),
                ));
            }
            let size = c
                .chunks
                .checked_mul(META_ENTRY_LEN as u64)
                .and_then(|m| m.checked_add(if has_data { c.data_bytes } else { 0 }))
                .and_then(|s| s.checked_add(expect));
            expect = size.ok_or_else(|| Error::corrupt(name, "category sizes overflow"))?;
            categories.push(c);
        }
        Ok(VolumeHeader {
            end,
            has_data,
            encoded,
            categories,
        })
    }
}

/// Reads and parses the header of volume object `key` (two ranged reads).
pub fn read_header(backend: &dyn Backend, key: &str, log: &mut ReadLog) -> Result<VolumeHeader> {
    // One request covers headers of up to ~100 categories (every byte read
    // is counted; the extent ends where the header does, so reading on from
    // there continues it). Larger headers take a second request.
    const GUESS: u64 = 4096;
    let mut all = backend.read_range(key, 0, GUESS)?;
    let count = VolumeHeader::parse_fixed(key, &all)?;
    let len = VolumeHeader::len_for(count as usize);
    if all.len() as u64 >= len {
        log.note_until(key, 0, all.len() as u64, len);
        all.truncate(len as usize);
    } else {
        log.note(key, 0, all.len() as u64);
        let rest = log.read(backend, key, all.len() as u64, len - all.len() as u64)?;
        all.extend_from_slice(&rest);
    }
    VolumeHeader::parse(key, &all)
}

/// Parses a metadata section of `chunks` entries, checking its CRC.
pub fn parse_meta(name: &str, entry: &CategoryEntry, b: &[u8]) -> Result<Vec<(Fingerprint, u32)>> {
    if b.len() as u64 != entry.meta_len() {
        return Err(Error::corrupt(name, "truncated category metadata"));
    }
    if crc32c::crc32c(b) != entry.meta_crc {
        return Err(Error::corrupt(
            name,
            format!("metadata checksum mismatch in category {}", entry.start),
        ));
    }
    let mut out = Vec::with_capacity(b.len() / META_ENTRY_LEN);
    let mut total = 0u64;
    for m in b.chunks_exact(META_ENTRY_LEN) {
        let mut fp = [0u8; FINGERPRINT_LEN];
        fp.copy_from_slice(&m[..FINGERPRINT_LEN]);
        let len = u32::from_le_bytes(le4(&m[FINGERPRINT_LEN..]));
        total += u64::from(len);
        out.push((Fingerprint(fp), len));
    }
    if total != entry.data_bytes {
        return Err(Error::corrupt(
            name,
            format!(
                "category {} chunk lengths disagree with its header",
                entry.start
            ),
        ));
    }
    Ok(out)
}

/// Reads the metadata of category `idx` of a volume.
pub fn read_meta(
    backend: &dyn Backend,
    key: &str,
    header: &VolumeHeader,
    idx: usize,
    log: &mut ReadLog,
) -> Result<Vec<(Fingerprint, u32)>> {
    let e = &header.categories[idx];
    let b = log.read(backend, key, e.offset, e.meta_len())?;
    parse_meta(key, e, &b)
}

/// The bytes of chunk `fp` stored as `stored` in object `key`: decoded
/// when the object stores encoded entries (a damaged entry is a corrupt
/// object naming the chunk).
pub fn decode_entry<'a>(
    encoded: bool,
    key: &str,
    fp: &Fingerprint,
    stored: &'a [u8],
) -> Result<std::borrow::Cow<'a, [u8]>> {
    if !encoded {
        return Ok(std::borrow::Cow::Borrowed(stored));
    }
    compression::decode(stored).map_err(|e| {
        Error::corrupt(
            key,
            format!("chunk {fp}: stored entry does not decode: {e}"),
        )
    })
}

/// Bytes of chunk data read per request when streaming a category.
pub const PIECE_BYTES: u64 = 8 * 1024 * 1024;

/// Streams category `idx` of a volume whose metadata is `metas`: calls
/// `f(fp, len, bytes)` for every chunk in order (`bytes` is `None` without
/// data). See [`stream_pieces`].
pub fn stream_category(
    backend: &dyn Backend,
    key: &str,
    header: &VolumeHeader,
    idx: usize,
    metas: &[(Fingerprint, u32)],
    log: &mut ReadLog,
    mut f: impl FnMut(Fingerprint, u32, Option<&[u8]>) -> Result<()>,
) -> Result<()> {
    stream_pieces(backend, key, header, idx, metas, log, |chunks, piece| {
        let mut off = 0usize;
        for &(fp, len) in chunks {
            let bytes = piece.map(|p| &p[off..off + len as usize]);
            f(fp, len, bytes)?;
            off += len as usize;
        }
        Ok(())
    })
}

/// Streams category `idx` of a volume whose metadata is `metas` in pieces:
/// calls `f(chunks, bytes)` for runs of whole chunks of about
/// [`PIECE_BYTES`] (`bytes`, their concatenation, is `None` without data).
/// Checks the data section's CRC at the end (the callback has then seen
/// every chunk; callers verify fingerprints themselves before using bytes).
pub fn stream_pieces(
    backend: &dyn Backend,
    key: &str,
    header: &VolumeHeader,
    idx: usize,
    metas: &[(Fingerprint, u32)],
    log: &mut ReadLog,
    mut f: impl FnMut(&[(Fingerprint, u32)], Option<&[u8]>) -> Result<()>,
) -> Result<()> {
    if !header.has_data {
        return f(metas, None);
    }
    let entry = &header.categories[idx];
    let mut pos = header.data_offset(idx);
    let mut crc = 0u32;
    let mut k = 0;
    while k < metas.len() {
        // A piece: whole chunks, at least one, about PIECE_BYTES.
        let mut end = k;
        let mut bytes = 0u64;
        while end < metas.len() && (end == k || bytes + u64::from(metas[end].1) <= PIECE_BYTES) {
            bytes += u64::from(metas[end].1);
            end += 1;
        }
        let piece = log.read(backend, key, pos, bytes)?;
        if piece.len() as u64 != bytes {
            return Err(Error::corrupt(key, "truncated category data"));
        }
        log.data_bytes += bytes;
        crc = crc32c::crc32c_append(crc, &piece);
        f(&metas[k..end], Some(&piece))?;
        pos += bytes;
        k = end;
    }
    if crc != entry.data_crc {
        return Err(Error::corrupt(
            key,
            format!("data checksum mismatch in category {}", entry.start),
        ));
    }
    Ok(())
}

/// One category being built: metadata and data sections in memory.
#[derive(Debug)]
pub struct CategoryBuilder {
    /// First backup version of the lifecycle.
    pub start: u64,
    meta: Vec<u8>,
    data: Vec<u8>,
    chunks: u64,
    data_bytes: u64,
}

impl CategoryBuilder {
    /// An empty Cat.(start, ·).
    pub fn new(start: u64) -> Self {
        CategoryBuilder {
            start,
            meta: Vec::new(),
            data: Vec::new(),
            chunks: 0,
            data_bytes: 0,
        }
    }

    /// Appends a chunk (`bytes` is `None` without data).
    pub fn push(&mut self, fp: &Fingerprint, len: u32, bytes: Option<&[u8]>) {
        self.meta.extend_from_slice(&fp.0);
        self.meta.extend_from_slice(&len.to_le_bytes());
        if let Some(b) = bytes {
            self.data.extend_from_slice(b);
        }
        self.chunks += 1;
        self.data_bytes += u64::from(len);
    }

    /// Chunks so far.
    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Chunk bytes so far.
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// Whether it holds no chunk.
    pub fn is_empty(&self) -> bool {
        self.chunks == 0
    }

    /// Memory held, in bytes.
    pub fn memory(&self) -> usize {
        self.meta.capacity() + self.data.capacity()
    }
}

/// Seals categories (ascending `start`) into a volume object ending at
/// `end`; `encoded`: their chunks are encoded entries.
pub fn seal_volume(end: u64, has_data: bool, encoded: bool, cats: Vec<CategoryBuilder>) -> Vec<u8> {
    let mut offset = VolumeHeader::len_for(cats.len());
    let mut entries = Vec::with_capacity(cats.len());
    for c in &cats {
        entries.push(CategoryEntry {
            start: c.start,
            chunks: c.chunks,
            offset,
            data_bytes: c.data_bytes,
            meta_crc: crc32c::crc32c(&c.meta),
            data_crc: crc32c::crc32c(&c.data),
        });
        offset += c.meta.len() as u64 + c.data.len() as u64;
    }
    let header = VolumeHeader {
        end,
        has_data,
        encoded: encoded && has_data,
        categories: entries,
    };
    let mut out = header.encode();
    out.reserve(offset as usize - out.len());
    for c in cats {
        out.extend_from_slice(&c.meta);
        out.extend_from_slice(&c.data);
    }
    out
}

/// Writes a volume (or a category) as parts of about `part_bytes` each:
/// part `p` is the volume-format object `key_of(p, first start in it)`. A
/// category may continue from one part into the next (the same `start` in
/// both). Parts are cut by chunk bytes (stored or not, so that trace
/// repositories are cut like data repositories) plus metadata.
pub struct PartWriter<'a> {
    backend: &'a dyn Backend,
    key_of: Box<dyn Fn(u32, u64) -> String + 'a>,
    end: u64,
    has_data: bool,
    /// Chunks are stored as encoded entries ([`FLAG_ENCODED`]).
    encoded: bool,
    /// Pushed chunks are encoded under this setting (`None`: they are
    /// pushed as they are stored, encoded already when `encoded`).
    encode: Option<Compression>,
    /// The dictionary chunks are compressed with (docs/FORMAT.md §7.8).
    dictionary: Option<Arc<Dictionary>>,
    /// Copies of the first pushed chunks (up to a bound), kept to train
    /// a dictionary from when the repository has none.
    samples: Option<(Vec<Vec<u8>>, usize)>,
    /// Scratch buffer of one encoded chunk.
    scratch: Vec<u8>,
    counts: EncodeCounts,
    part_bytes: u64,
    cats: Vec<CategoryBuilder>,
    bytes: u64,
    parts: u32,
    /// Parts written in the background (`None`: each as it fills).
    uploads: Option<Uploads>,
}

impl<'a> PartWriter<'a> {
    /// A writer of a volume ending at `end`, parts named by `key_of`.
    pub fn new(
        backend: &'a dyn Backend,
        end: u64,
        has_data: bool,
        part_bytes: u64,
        key_of: impl Fn(u32, u64) -> String + 'a,
    ) -> Self {
        PartWriter {
            backend,
            key_of: Box::new(key_of),
            end,
            has_data,
            encoded: false,
            encode: None,
            dictionary: None,
            samples: None,
            scratch: Vec::new(),
            counts: EncodeCounts::default(),
            part_bytes: part_bytes.max(1),
            cats: Vec::new(),
            bytes: 0,
            parts: 0,
            uploads: None,
        }
    }

    /// The same writer writing full parts in the background through
    /// `shared` (the writer's backend), up to `at_once` at a time, while
    /// the next ones fill; [`PartWriter::finish`] waits for them all.
    pub fn uploading(self, shared: Arc<dyn Backend>, at_once: usize) -> Self {
        PartWriter {
            uploads: Some(Uploads::new(shared, at_once)),
            ..self
        }
    }

    /// The same writer encoding every chunk pushed with bytes under
    /// `setting` ([`FLAG_ENCODED`]; a backup of a compressing repository).
    pub fn encoding(self, setting: Compression) -> Self {
        PartWriter {
            encoded: self.has_data,
            encode: Some(setting),
            ..self
        }
    }

    /// The same writer compressing with `dictionary` (when it encodes).
    pub fn with_dictionary(self, dictionary: Option<Arc<Dictionary>>) -> Self {
        PartWriter { dictionary, ..self }
    }

    /// The same writer keeping copies of the first chunks pushed (about
    /// [`crate::format::dictionary::MAX_SAMPLE_BYTES`]), to train a
    /// dictionary from ([`PartWriter::take_samples`]).
    pub fn sampling(self) -> Self {
        PartWriter {
            samples: Some((Vec::new(), 0)),
            ..self
        }
    }

    /// The chunks kept by [`PartWriter::sampling`].
    pub fn take_samples(&mut self) -> Vec<Vec<u8>> {
        self.samples.take().map(|(s, _)| s).unwrap_or_default()
    }

    /// The same writer for chunks pushed as they are stored: encoded
    /// entries when `encoded` (arranging copies them as they are).
    pub fn copying(self, encoded: bool) -> Self {
        PartWriter {
            encoded: encoded && self.has_data,
            encode: None,
            ..self
        }
    }

    /// What encoding the pushed chunks did.
    pub fn counts(&self) -> EncodeCounts {
        self.counts
    }

    /// Appends a chunk of Cat.(start, end); starts must not decrease.
    /// `len` is the length of `bytes` as pushed (before a writer made
    /// [`PartWriter::encoding`] encodes them).
    pub fn push(
        &mut self,
        start: u64,
        fp: &Fingerprint,
        len: u32,
        bytes: Option<&[u8]>,
    ) -> Result<()> {
        if self.cats.last().is_none_or(|c| c.start != start) {
            self.cats.push(CategoryBuilder::new(start));
        }
        if let (Some((samples, total)), Some(b)) = (&mut self.samples, bytes) {
            if *total + b.len() <= crate::format::dictionary::MAX_SAMPLE_BYTES {
                *total += b.len();
                samples.push(b.to_vec());
            }
        }
        let (len, bytes) = match (self.encode, bytes) {
            (Some(setting), Some(b)) => {
                self.scratch.clear();
                compression::encode(
                    setting,
                    self.dictionary.as_deref(),
                    b,
                    &mut self.scratch,
                    &mut self.counts,
                );
                (self.scratch.len() as u32, Some(&self.scratch[..]))
            }
            _ => (len, bytes),
        };
        if let Some(c) = self.cats.last_mut() {
            c.push(fp, len, bytes);
        }
        self.bytes += META_ENTRY_LEN as u64 + u64::from(len);
        if self.bytes >= self.part_bytes {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.cats.is_empty() {
            return Ok(());
        }
        let cats = std::mem::take(&mut self.cats);
        let first = cats.first().map_or(0, |c| c.start);
        let object = seal_volume(self.end, self.has_data, self.encoded, cats);
        let key = (self.key_of)(self.parts, first);
        match &mut self.uploads {
            Some(uploads) => uploads.start(key, object)?,
            None => self.backend.write(&key, &object)?,
        }
        self.parts += 1;
        self.bytes = 0;
        Ok(())
    }

    /// Writes the last part; returns the number of parts written.
    pub fn finish(mut self) -> Result<u32> {
        self.flush()?;
        if let Some(uploads) = &mut self.uploads {
            uploads.finish()?;
        }
        Ok(self.parts)
    }
}

/// Rewrites a volume keeping only its first `keep` categories, given the
/// object's bytes up to the end of category `keep - 1` (`prefix`).
pub fn truncate_volume(
    name: &str,
    header: &VolumeHeader,
    keep: usize,
    prefix: &[u8],
) -> Result<Vec<u8>> {
    let old_len = VolumeHeader::len_for(header.categories.len());
    let new_len = VolumeHeader::len_for(keep);
    let body_end = match header.categories.get(keep) {
        Some(c) => c.offset,
        None => header.object_len(),
    };
    if (prefix.len() as u64) < body_end {
        return Err(Error::corrupt(name, "truncated volume"));
    }
    let shift = old_len - new_len;
    let kept = VolumeHeader {
        end: header.end,
        has_data: header.has_data,
        encoded: header.encoded,
        categories: header.categories[..keep]
            .iter()
            .map(|c| CategoryEntry {
                offset: c.offset - shift,
                ..*c
            })
            .collect(),
    };
    let mut out = kept.encode();
    out.extend_from_slice(&prefix[old_len as usize..body_end as usize]);
    Ok(out)
}

/// Counts the reads of an operation: requests, bytes, distinct extents.
#[derive(Clone, Debug, Default)]
pub struct ReadLog {
    /// Read requests.
    pub requests: u64,
    /// Bytes read (headers, metadata and data).
    pub bytes: u64,
    /// Chunk data bytes read.
    pub data_bytes: u64,
    /// Distinct read extents: reads that do not continue the previous one.
    pub extents: u64,
    /// Objects read.
    pub objects: BTreeSet<String>,
    last: Option<(String, u64)>,
}

impl ReadLog {
    /// Reads `len` bytes of `key` from `offset`, counting it.
    pub fn read(
        &mut self,
        backend: &dyn Backend,
        key: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let b = backend.read_range(key, offset, len)?;
        self.note(key, offset, b.len() as u64);
        if (b.len() as u64) < len {
            return Err(Error::corrupt(
                key,
                "object shorter than its header announces",
            ));
        }
        Ok(b)
    }

    /// Adds the counts of `other`, a log of reads made in parallel with these.
    pub fn merge(&mut self, other: ReadLog) {
        self.requests += other.requests;
        self.bytes += other.bytes;
        self.data_bytes += other.data_bytes;
        self.extents += other.extents;
        self.objects.extend(other.objects);
    }

    /// Counts a read (or, for plans, a read that would be made).
    pub fn note(&mut self, key: &str, offset: u64, len: u64) {
        self.note_until(key, offset, len, len);
    }

    /// Counts a read of `len` bytes from `offset` of which only the first
    /// `used` are used: a next read from `offset + used` continues its extent.
    pub fn note_until(&mut self, key: &str, offset: u64, len: u64, used: u64) {
        self.requests += 1;
        self.bytes += len;
        let continues = matches!(&self.last, Some((k, end)) if k == key && *end == offset);
        if !continues {
            self.extents += 1;
        }
        if !self.objects.contains(key) {
            self.objects.insert(key.to_string());
        }
        self.last = Some((key.to_string(), offset + used));
    }
}

/// Writes the NDF table of one backup version, `key`: the `count` distinct
/// fingerprints of `fps` (a map in byte order, see
/// [`crate::util::spill::byte_order`]), streamed.
pub(crate) fn write_ndf(
    backend: &dyn crate::backend::Backend,
    key: &str,
    fps: &mut crate::util::spill::SpillMap,
    count: u64,
) -> Result<()> {
    let payload_len = count * FINGERPRINT_LEN as u64;
    backend.write_streamed(key, WriteMode::Replace, &mut |out| {
        envelope::seal_streamed(NDF_KIND, META_VERSION, payload_len, out, |w| {
            let mut all = fps.sorted()?;
            while let Some((fp, _)) = all.next()? {
                w.write_all(&fp.0)
                    .map_err(|e| Error::io(format!("writing {key}"), e))?;
            }
            Ok(())
        })
    })?;
    Ok(())
}

/// Bytes of an NDF table [`NdfReader`] reads per request (a multiple of
/// the fingerprint length).
const NDF_WINDOW: u64 = 4 << 20;

/// Reads an NDF table's fingerprints in order without holding the table:
/// ranges of [`NDF_WINDOW`] bytes, each fingerprint checked to ascend as it
/// comes, the checksum and format version after the last one (so a caller
/// trusts what it read only once [`NdfReader::next`] returned `None`).
pub(crate) struct NdfReader<'a> {
    backend: &'a dyn Backend,
    key: String,
    header: Vec<u8>,
    /// Offset of the next unread payload byte.
    at: u64,
    /// Offset of the payload's end (the trailer's start).
    end: u64,
    buf: Vec<u8>,
    pos: usize,
    crc: u32,
    last: Option<Fingerprint>,
    verified: bool,
}

impl<'a> NdfReader<'a> {
    /// Opens NDF table `key`, checking its envelope header and length.
    pub(crate) fn open(backend: &'a dyn Backend, key: &str) -> Result<NdfReader<'a>> {
        let size = backend.size(key)?;
        let header = backend.read_range(key, 0, envelope::HEADER_LEN as u64)?;
        let payload_len = envelope::check_header(key, NDF_KIND, &header, size)?;
        if !payload_len.is_multiple_of(FINGERPRINT_LEN as u64) {
            return Err(Error::corrupt(
                key,
                "NDF table length is not a multiple of 32",
            ));
        }
        Ok(NdfReader {
            backend,
            key: key.to_string(),
            crc: crc32c::crc32c(&header),
            header,
            at: envelope::HEADER_LEN as u64,
            end: envelope::HEADER_LEN as u64 + payload_len,
            buf: Vec::new(),
            pos: 0,
            last: None,
            verified: false,
        })
    }

    /// The next fingerprint, or `None` after the last once the table's
    /// checksum and version hold.
    pub(crate) fn next(&mut self) -> Result<Option<Fingerprint>> {
        if self.pos == self.buf.len() {
            if self.at == self.end {
                self.verify()?;
                return Ok(None);
            }
            let len = (self.end - self.at).min(NDF_WINDOW);
            self.buf = self.backend.read_range(&self.key, self.at, len)?;
            if self.buf.len() as u64 != len {
                return Err(Error::corrupt(&self.key, "truncated NDF table"));
            }
            self.crc = crc32c::crc32c_append(self.crc, &self.buf);
            self.at += len;
            self.pos = 0;
        }
        let mut fp = [0u8; FINGERPRINT_LEN];
        fp.copy_from_slice(&self.buf[self.pos..self.pos + FINGERPRINT_LEN]);
        self.pos += FINGERPRINT_LEN;
        let fp = Fingerprint(fp);
        if self.last.is_some_and(|p| p >= fp) {
            return Err(Error::corrupt(&self.key, "NDF table is not sorted"));
        }
        self.last = Some(fp);
        Ok(Some(fp))
    }

    /// Checks the trailer's checksum, then the format version.
    fn verify(&mut self) -> Result<()> {
        if self.verified {
            return Ok(());
        }
        let trailer = self
            .backend
            .read_range(&self.key, self.end, envelope::TRAILER_LEN as u64)?;
        if trailer.len() != envelope::TRAILER_LEN {
            return Err(Error::corrupt(&self.key, "truncated NDF table"));
        }
        if u32::from_le_bytes(le4(&trailer)) != self.crc {
            return Err(Error::corrupt(&self.key, "checksum mismatch"));
        }
        envelope::check_version(&self.key, &[META_VERSION], &self.header)?;
        self.verified = true;
        Ok(())
    }
}

/// The arranging journal: the round in progress and the objects it reads and writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    /// The round: the version whose table splits the active categories.
    pub round: u64,
    /// Active categories split (deleted after the round commits).
    pub inputs: Vec<String>,
    /// Objects written (new active categories and the volume).
    pub outputs: Vec<String>,
}

impl Journal {
    /// Encodes the journal.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        envelope::seal(JOURNAL_KIND, META_VERSION, &json)
    }

    /// Decodes a journal.
    pub fn decode(name: &str, bytes: &[u8]) -> Result<Journal> {
        let payload = envelope::open(name, JOURNAL_KIND, META_VERSION, bytes)?;
        serde_json::from_slice(payload)
            .map_err(|e| Error::corrupt(name, format!("invalid JSON: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Local, ObjectStore};

    fn fp(n: u8) -> Fingerprint {
        Fingerprint([n; 32])
    }

    fn volume() -> Vec<u8> {
        let mut a = CategoryBuilder::new(1);
        a.push(&fp(1), 3, Some(b"abc"));
        a.push(&fp(2), 2, Some(b"de"));
        let mut b = CategoryBuilder::new(2);
        b.push(&fp(3), 4, Some(b"fghi"));
        let c = CategoryBuilder::new(3);
        seal_volume(3, true, false, vec![a, b, c])
    }

    #[test]
    fn encoded_parts_compress_and_copy_as_is() {
        let dir = tempfile::tempdir().unwrap();
        let be = Local::new(dir.path());
        let text = b"lifecycle ".repeat(400);
        let random = crate::chunker::pseudo_random(4000, 5);
        let mut w =
            PartWriter::new(&be, 2, true, 1 << 20, |_, _| "e".into()).encoding(Compression::Auto);
        w.push(2, &fp(1), text.len() as u32, Some(&text)).unwrap();
        w.push(2, &fp(2), random.len() as u32, Some(&random))
            .unwrap();
        let counts = w.counts();
        assert_eq!((counts.compressed, counts.raw), (1, 1));
        w.finish().unwrap();
        let mut log = ReadLog::default();
        let h = read_header(&be, "e", &mut log).unwrap();
        assert!(h.encoded);
        let metas = read_meta(&be, "e", &h, 0, &mut log).unwrap();
        assert!(metas[0].1 < 200 && metas[1].1 == 4001, "{metas:?}");
        let mut copy = PartWriter::new(&be, 2, true, 1 << 20, |_, _| "c".into()).copying(true);
        let mut got = Vec::new();
        stream_category(&be, "e", &h, 0, &metas, &mut log, |f, len, b| {
            let stored = b.unwrap();
            got.push(
                decode_entry(h.encoded, "e", &f, stored)
                    .unwrap()
                    .into_owned(),
            );
            copy.push(2, &f, len, Some(stored))
        })
        .unwrap();
        assert_eq!(got, vec![text.clone(), random]);
        copy.finish().unwrap();
        let c = read_header(&be, "c", &mut log).unwrap();
        assert!(c.encoded);
        assert_eq!(read_meta(&be, "c", &c, 0, &mut log).unwrap(), metas);
        // A damaged entry is a corrupt object naming the chunk.
        let e = decode_entry(true, "e", &fp(1), &[1, 9, 0, 0, 0, 7]).unwrap_err();
        assert!(e.to_string().contains("e: corrupt: chunk"), "{e}");
        // Flag bit 1 without bit 0 is refused.
        let mut bad = be.read("e").unwrap();
        bad[16..20].copy_from_slice(&FLAG_ENCODED.to_le_bytes());
        let n = VolumeHeader::len_for(1) as usize;
        let crc = crc32c::crc32c(&bad[..n - 4]);
        bad[n - 4..n].copy_from_slice(&crc.to_le_bytes());
        assert!(VolumeHeader::parse("e", &bad).is_err());
    }

    #[test]
    fn volume_round_trip_stream_and_truncate() {
        let dir = tempfile::tempdir().unwrap();
        let be = Local::new(dir.path());
        let v = volume();
        be.write("v", &v).unwrap();
        let mut log = ReadLog::default();
        let h = read_header(&be, "v", &mut log).unwrap();
        assert_eq!(h.object_len(), v.len() as u64);
        assert_eq!(h.categories.len(), 3);
        let metas = read_meta(&be, "v", &h, 0, &mut log).unwrap();
        let mut got = Vec::new();
        stream_category(&be, "v", &h, 0, &metas, &mut log, |f, _, b| {
            got.push((f, b.unwrap().to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec![(fp(1), b"abc".to_vec()), (fp(2), b"de".to_vec())]);
        assert_eq!(log.extents, 1, "header, metadata and data are one extent");
        let keep_end = h.categories[1].offset;
        let t = truncate_volume("v", &h, 1, &v[..keep_end as usize]).unwrap();
        be.write("t", &t).unwrap();
        let th = read_header(&be, "t", &mut log).unwrap();
        assert_eq!(th.categories.len(), 1);
        assert_eq!(th.object_len(), t.len() as u64);
        let metas = read_meta(&be, "t", &th, 0, &mut log).unwrap();
        stream_category(&be, "t", &th, 0, &metas, &mut log, |_, _, _| Ok(())).unwrap();
    }

    #[test]
    fn every_header_byte_flip_is_detected() {
        let v = volume();
        let len = VolumeHeader::len_for(3) as usize;
        for i in 0..len {
            let mut bad = v.clone();
            bad[i] ^= 1;
            assert!(VolumeHeader::parse("v", &bad).is_err(), "flip at {i}");
        }
        let h = VolumeHeader::parse("v", &v).unwrap();
        let e = h.categories[0];
        let mut bad = v[e.offset as usize..(e.offset + e.meta_len()) as usize].to_vec();
        bad[5] ^= 1;
        assert!(parse_meta("v", &e, &bad).is_err());
    }

    fn read_ndf(backend: &dyn Backend, key: &str) -> Result<Vec<Fingerprint>> {
        let mut r = NdfReader::open(backend, key)?;
        let mut out = Vec::new();
        while let Some(fp) = r.next()? {
            out.push(fp);
        }
        // Reading past the end stays at the end.
        assert_eq!(r.next()?, None);
        Ok(out)
    }

    #[test]
    fn ndf_tables_stream_across_windows_and_damage_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let backend = crate::backend::Local::new(dir.path());
        // More fingerprints than one window holds.
        let n = NDF_WINDOW / FINGERPRINT_LEN as u64 + 100;
        let mut fps =
            crate::util::spill::SpillMap::with_budget(1 << 20, crate::util::spill::byte_order);
        let mut expected = Vec::new();
        for i in 0..n {
            let mut b = [0u8; 32];
            b[..8].copy_from_slice(&(i * 7919 % n).to_le_bytes());
            fps.insert(Fingerprint(b), 0).unwrap();
            expected.push(Fingerprint(b));
        }
        expected.sort_unstable();
        write_ndf(&backend, "n", &mut fps, n).unwrap();
        assert_eq!(read_ndf(&backend, "n").unwrap(), expected);
        let good = ObjectStore::read(&backend, "n").unwrap();
        let damaged = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            ObjectStore::write(&backend, "d", &b).unwrap();
            read_ndf(&backend, "d").unwrap_err()
        };
        // A flipped byte in the last window: found by the checksum.
        let e = damaged(&|b| {
            let at = b.len() - 10;
            b[at] ^= 1;
        });
        assert!(e.is_damage() && e.to_string().contains("checksum"), "{e}");
        // Out of order (a fingerprint's first byte raised): found as it comes.
        let e = damaged(&|b| b[envelope::HEADER_LEN] = 0xff);
        assert!(e.to_string().contains("not sorted"), "{e}");
        let e = damaged(&|b| b.truncate(b.len() - 32));
        assert!(e.is_damage() && e.to_string().contains("length"), "{e}");
        let e = damaged(&|b| b[8] = 9);
        assert!(e.is_damage(), "{e}");
        let e = damaged(&|b| {
            b[8] = 9;
            let end = b.len() - 4;
            let crc = crc32c::crc32c(&b[..end]);
            b[end..].copy_from_slice(&crc.to_le_bytes());
        });
        assert!(matches!(e, Error::UnsupportedVersion { .. }), "{e}");
        assert!(matches!(
            NdfReader::open(&backend, "absent"),
            Err(Error::NotFound(_))
        ));
    }

    #[test]
    fn ndf_and_state_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let backend = crate::backend::Local::new(dir.path());
        let mut fps = crate::util::spill::SpillMap::with_budget(0, crate::util::spill::byte_order);
        for f in [fp(3), fp(1), fp(3)] {
            fps.insert(f, 0).unwrap();
        }
        write_ndf(&backend, "n", &mut fps, 2).unwrap();
        assert_eq!(read_ndf(&backend, "n").unwrap(), vec![fp(1), fp(3)]);
        let j = Journal {
            round: 2,
            inputs: vec!["a".into()],
            outputs: vec![],
        };
        assert_eq!(Journal::decode("j", &j.encode()).unwrap(), j);
    }
}
