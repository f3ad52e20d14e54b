//! Containers: fixed-capacity objects holding chunks, with a metadata section
//! (fingerprint, offset, length per chunk) before the data section
//! (docs/FORMAT.md, "Containers"). A container of a delta-compressing
//! repository ([`FLAG_DELTAS`]) may store a chunk as a delta against a base
//! chunk of another container; its metadata entries then also name the base.

use crate::backend::{Backend, ObjectImage};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap, FINGERPRINT_LEN};
use crate::format::compression::{self, Compression, EncodeCounts};
use crate::format::dictionary::Dictionary;
use crate::format::envelope::{le4, le8};
use bytes::Bytes;
use std::sync::Arc;

pub(crate) mod backup;
pub(crate) mod check;
pub(crate) mod ranged;
pub(crate) mod repair;
pub(crate) mod restore;
pub(crate) mod salvage;
pub(crate) mod totals;

pub use crate::backend::AlignedBuf;

/// Container identifier; ids grow monotonically.
pub type ContainerId = u64;

/// Bytes of the fixed container header.
pub const HEADER_LEN: usize = 40;
/// Bytes of one metadata entry.
pub const META_ENTRY_LEN: usize = FINGERPRINT_LEN + 8;
/// Bytes of one metadata entry of a container with [`FLAG_DELTAS`]: the
/// entry, then the base's container id and fingerprint.
pub const DELTA_META_ENTRY_LEN: usize = META_ENTRY_LEN + 8 + FINGERPRINT_LEN;
/// Bytes of one metadata entry of a container with [`FLAG_FEATURES`]: the
/// delta entry, then the chunk's super-features.
pub const FEATURE_META_ENTRY_LEN: usize = DELTA_META_ENTRY_LEN + 8 * SUPER_FEATURES;
/// Bytes of one metadata entry of a container with [`FLAG_CHUNK_CRCS`]: the
/// feature entry, then the CRC-32C of the chunk's stored bytes.
pub const CRC_META_ENTRY_LEN: usize = FEATURE_META_ENTRY_LEN + 4;
/// Number of super-features per chunk (`crate::delta::features` computes
/// them; a container with [`FLAG_FEATURES`] stores as many per entry).
pub const SUPER_FEATURES: usize = 3;
/// A whole chunk's super-features (`crate::delta::features`), kept in the
/// container so that a base chunk cache need not compute them again.
pub type SuperFeatures = [u64; SUPER_FEATURES];
/// Base container id of an entry (with [`FLAG_DELTAS`]) stored whole.
const NO_BASE: u64 = u64::MAX;
/// Container format version.
pub const CONTAINER_VERSION: u32 = 1;
const MAGIC: &[u8; 4] = b"TSCN";
/// Header flag: the data section is absent (a container of a trace
/// repository); `data_len` is the length it would have.
pub const FLAG_NO_DATA: u32 = 1;
/// Header flag: metadata entries are [`DELTA_META_ENTRY_LEN`] bytes and name
/// each delta-encoded chunk's base (delta-compressing repositories).
pub const FLAG_DELTAS: u32 = 2;
/// Header flag (with [`FLAG_DELTAS`]): metadata entries are
/// [`FEATURE_META_ENTRY_LEN`] bytes and carry each whole chunk's
/// super-features (all zero: not recorded).
pub const FLAG_FEATURES: u32 = 8;
/// Header flag (with [`FLAG_FEATURES`]): metadata entries are
/// [`CRC_META_ENTRY_LEN`] bytes and carry the CRC-32C of each chunk's stored
/// bytes, so that one chunk can be checked without the whole data section.
pub const FLAG_CHUNK_CRCS: u32 = 16;
/// Header flag: the data section starts at the next multiple of
/// [`DATA_ALIGN`] bytes after the metadata section, zero bytes in between,
/// so that it can be written with direct I/O. Set on containers of at least
/// [`ALIGN_MIN_CAPACITY`] bytes (in trace repositories too, where the gap is
/// nominal like the data).
pub const FLAG_ALIGNED: u32 = 4;
/// Header flag (never with [`FLAG_NO_DATA`]): every entry's stored bytes
/// are an encoded entry (`crate::format::compression`, docs/FORMAT.md §7.7): a
/// tag, then the bytes or a zstd frame. Set by compressing repositories.
pub const FLAG_ENCODED: u32 = 32;
/// Alignment of the data section of a [`FLAG_ALIGNED`] container.
pub const DATA_ALIGN: usize = crate::backend::buffers::ALIGN;
/// Containers of at least this capacity align their data section.
pub const ALIGN_MIN_CAPACITY: usize = 1 << 20;
/// Directory of container objects.
pub const CONTAINER_DIR: &str = "containers";

/// Object key of container `id`.
pub fn key(id: ContainerId) -> String {
    format!("{CONTAINER_DIR}/{id:016x}")
}

/// Parses a container object name back into its id.
pub fn parse_key_name(name: &str) -> Option<ContainerId> {
    if name.len() != 16 {
        return None;
    }
    ContainerId::from_str_radix(name, 16).ok()
}

/// The base chunk a delta-encoded chunk is decoded against: a chunk stored
/// whole in another container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BaseRef {
    /// The container holding the base.
    pub container: ContainerId,
    /// The base's fingerprint.
    pub fp: Fingerprint,
}

/// Where one chunk lies in a container's data section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkMeta {
    /// The chunk's fingerprint.
    pub fp: Fingerprint,
    /// Offset in the data section.
    pub offset: u32,
    /// Length in bytes of what is stored: the chunk, or its delta.
    pub len: u32,
    /// The base when the chunk is stored as a delta (`crate::delta` format).
    pub base: Option<BaseRef>,
    /// The super-features of a whole chunk, when recorded ([`FLAG_FEATURES`]).
    pub features: Option<SuperFeatures>,
    /// CRC-32C of the stored bytes, when recorded ([`FLAG_CHUNK_CRCS`]).
    pub crc: Option<u32>,
}

/// The fixed header of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The container's id.
    pub id: ContainerId,
    /// Number of chunks.
    pub chunk_count: u32,
    /// Bytes in the data section (nominal when the data is absent).
    pub data_len: u32,
    /// Flags ([`FLAG_NO_DATA`]).
    pub flags: u32,
    meta_crc: u32,
    data_crc: u32,
}

impl Header {
    /// Bytes of one metadata entry.
    pub fn entry_len(&self) -> usize {
        entry_len(self.flags)
    }

    /// Bytes of header plus metadata section.
    pub fn meta_end(&self) -> usize {
        HEADER_LEN + self.chunk_count as usize * self.entry_len()
    }

    /// Offset of the data section in the object.
    pub fn data_start(&self) -> usize {
        data_start(self.meta_end(), self.flags & FLAG_ALIGNED != 0)
    }

    /// Size of the container with its data section: what restores read and
    /// what it occupies (also for trace containers, whose data is absent).
    pub fn total_len(&self) -> usize {
        self.data_start() + self.data_len as usize
    }

    /// Whether the data section is stored.
    pub fn has_data(&self) -> bool {
        self.flags & FLAG_NO_DATA == 0
    }

    /// Whether entries are stored encoded ([`FLAG_ENCODED`]).
    pub fn encoded(&self) -> bool {
        self.flags & FLAG_ENCODED != 0
    }

    /// Size of the stored object.
    pub fn object_len(&self) -> usize {
        if self.has_data() {
            self.total_len()
        } else {
            self.meta_end()
        }
    }

    /// Parses and checks the header of container `id`.
    pub fn parse(id: ContainerId, bytes: &[u8]) -> Result<Header> {
        let name = key(id);
        if bytes.len() < HEADER_LEN {
            return Err(Error::corrupt(name, "truncated header"));
        }
        if &bytes[0..4] != MAGIC {
            return Err(Error::corrupt(name, "bad magic (not a container)"));
        }
        if crc32c::crc32c(&bytes[..36]) != u32::from_le_bytes(le4(&bytes[36..40])) {
            return Err(Error::corrupt(name, "header checksum mismatch"));
        }
        let version = u32::from_le_bytes(le4(&bytes[4..8]));
        if version != CONTAINER_VERSION {
            return Err(Error::UnsupportedVersion {
                object: name,
                found: version,
                supported: CONTAINER_VERSION,
            });
        }
        let header = Header {
            id: u64::from_le_bytes(le8(&bytes[8..16])),
            chunk_count: u32::from_le_bytes(le4(&bytes[16..20])),
            data_len: u32::from_le_bytes(le4(&bytes[20..24])),
            meta_crc: u32::from_le_bytes(le4(&bytes[24..28])),
            data_crc: u32::from_le_bytes(le4(&bytes[28..32])),
            flags: u32::from_le_bytes(le4(&bytes[32..36])),
        };
        let known = FLAG_NO_DATA
            | FLAG_DELTAS
            | FLAG_ALIGNED
            | FLAG_FEATURES
            | FLAG_CHUNK_CRCS
            | FLAG_ENCODED;
        if header.flags & !known != 0
            || header.flags & (FLAG_NO_DATA | FLAG_DELTAS) == FLAG_NO_DATA | FLAG_DELTAS
            || header.flags & (FLAG_NO_DATA | FLAG_ENCODED) == FLAG_NO_DATA | FLAG_ENCODED
            || header.flags & (FLAG_DELTAS | FLAG_FEATURES) == FLAG_FEATURES
            || header.flags & (FLAG_FEATURES | FLAG_CHUNK_CRCS) == FLAG_CHUNK_CRCS
        {
            return Err(Error::corrupt(
                name,
                format!("unknown header flags {:#x}", header.flags),
            ));
        }
        if header.id != id {
            return Err(Error::corrupt(
                name,
                format!("header names container {:016x}", header.id),
            ));
        }
        Ok(header)
    }

    /// Parses and checks the metadata section (`bytes` starts at the header).
    pub fn parse_meta(&self, bytes: &[u8]) -> Result<Vec<ChunkMeta>> {
        let name = key(self.id);
        let end = self.meta_end();
        if bytes.len() < end {
            return Err(Error::corrupt(name, "truncated metadata section"));
        }
        let section = &bytes[HEADER_LEN..end];
        if crc32c::crc32c(section) != self.meta_crc {
            return Err(Error::corrupt(name, "metadata checksum mismatch"));
        }
        let fingerprint = |b: &[u8]| {
            let mut fp = [0u8; FINGERPRINT_LEN];
            fp.copy_from_slice(&b[..FINGERPRINT_LEN]);
            Fingerprint(fp)
        };
        let mut metas = Vec::with_capacity(self.chunk_count as usize);
        for (i, e) in section.chunks_exact(self.entry_len()).enumerate() {
            let offset = u32::from_le_bytes(le4(&e[FINGERPRINT_LEN..]));
            let len = u32::from_le_bytes(le4(&e[FINGERPRINT_LEN + 4..]));
            if u64::from(offset) + u64::from(len) > u64::from(self.data_len) {
                return Err(Error::corrupt(
                    name,
                    format!("chunk {i} extends past the data section"),
                ));
            }
            let base = match e.get(META_ENTRY_LEN..DELTA_META_ENTRY_LEN) {
                Some(b) => {
                    let container = u64::from_le_bytes(le8(&b[..8]));
                    (container != NO_BASE).then(|| BaseRef {
                        container,
                        fp: fingerprint(&b[8..]),
                    })
                }
                None => None,
            };
            let features = match e.get(DELTA_META_ENTRY_LEN..FEATURE_META_ENTRY_LEN) {
                Some(b) => {
                    let mut sf = [0u64; SUPER_FEATURES];
                    for (f, bytes) in sf.iter_mut().zip(b.chunks_exact(8)) {
                        *f = u64::from_le_bytes(le8(bytes));
                    }
                    (sf != [0; SUPER_FEATURES]).then_some(sf)
                }
                None => None,
            };
            let crc = e
                .get(FEATURE_META_ENTRY_LEN..CRC_META_ENTRY_LEN)
                .map(|b| u32::from_le_bytes(le4(b)));
            metas.push(ChunkMeta {
                fp: fingerprint(e),
                offset,
                len,
                base,
                features,
                crc,
            });
        }
        Ok(metas)
    }
}

/// Bytes of one metadata entry of a container with header `flags`.
fn entry_len(flags: u32) -> usize {
    if flags & FLAG_CHUNK_CRCS != 0 {
        CRC_META_ENTRY_LEN
    } else if flags & FLAG_FEATURES != 0 {
        FEATURE_META_ENTRY_LEN
    } else if flags & FLAG_DELTAS != 0 {
        DELTA_META_ENTRY_LEN
    } else {
        META_ENTRY_LEN
    }
}

/// Where the data section starts after a metadata section ending at `meta_end`.
fn data_start(meta_end: usize, aligned: bool) -> usize {
    if aligned {
        meta_end.next_multiple_of(DATA_ALIGN)
    } else {
        meta_end
    }
}

thread_local! {
    /// The buffer a container writer thread encodes data sections into
    /// ([`FLAG_ENCODED`]), swapped with each container's raw one.
    static ENCODE_BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Reads and checks the header and metadata section of container `id`
/// (usually one ranged read).
pub fn read_meta(backend: &dyn Backend, id: ContainerId) -> Result<(Header, Vec<ChunkMeta>)> {
    let k = key(id);
    let mut bytes = backend.read_range(&k, 0, META_GUESS)?;
    let header = Header::parse(id, &bytes)?;
    if bytes.len() < header.meta_end() {
        let rest = backend.read_range(
            &k,
            bytes.len() as u64,
            (header.meta_end() - bytes.len()) as u64,
        )?;
        bytes.extend_from_slice(&rest);
    }
    let metas = header.parse_meta(&bytes)?;
    Ok((header, metas))
}

/// Bytes [`read_meta`] reads first: the header and, in containers of up to
/// about a thousand chunks, the whole metadata.
pub(crate) const META_GUESS: u64 = 64 * 1024;

/// Accumulates chunks into a container until it is full.
pub struct Builder {
    id: ContainerId,
    capacity: usize,
    metas: Vec<ChunkMeta>,
    /// The data section.
    data: AlignedBuf,
    data_len: usize,
    /// CRC-32C of the data section so far, updated as chunks are appended
    /// (while their bytes are still in the CPU cache).
    data_crc: u32,
    with_data: bool,
    /// Whether metadata entries name bases ([`FLAG_DELTAS`]).
    deltas: bool,
    /// Whether the data section is aligned ([`FLAG_ALIGNED`]).
    aligned: bool,
    /// How entries are encoded when sealed ([`FLAG_ENCODED`]); `None`:
    /// stored as they are.
    encoding: Option<Compression>,
    /// The dictionary entries are compressed with (docs/FORMAT.md §7.8).
    dictionary: Option<Arc<Dictionary>>,
    /// Per entry (with `encoding`): whether its bytes were appended
    /// already encoded (copied from another encoded container).
    pre_encoded: Vec<bool>,
    /// The entries' bytes, held by reference instead of copied into
    /// `data` ([`Builder::holding`]).
    held: Option<Vec<Bytes>>,
}

/// A sealed container as the two pieces to write in order: header,
/// metadata and alignment gap, then the data section (so the data is not
/// copied again). Both start aligned in memory, for direct I/O.
pub struct Sealed {
    /// Header, metadata section and the gap before the data section.
    pub head: AlignedBuf,
    /// The data section.
    pub data: AlignedBuf,
    /// What encoding the entries did ([`FLAG_ENCODED`]; zero otherwise).
    pub encoded: EncodeCounts,
}

impl Sealed {
    /// The pieces to write, in order.
    pub fn parts(&self) -> [&[u8]; 2] {
        [self.head.as_slice(), self.data.as_slice()]
    }

    /// The container as one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        self.parts().concat()
    }
}

impl Builder {
    /// An empty container `id` of `capacity` bytes (header, metadata and data).
    pub fn new(id: ContainerId, capacity: usize) -> Self {
        Builder {
            id,
            capacity,
            metas: Vec::new(),
            data: AlignedBuf::default(),
            data_len: 0,
            data_crc: 0,
            with_data: true,
            deltas: false,
            aligned: capacity >= ALIGN_MIN_CAPACITY,
            encoding: None,
            dictionary: None,
            pre_encoded: Vec::new(),
            held: None,
        }
    }

    /// The same container holding its entries' bytes by reference, copied
    /// (and encoded) only when it is written, straight where the backend
    /// stores them ([`Builder::write_new`]): once, on the writer's thread.
    /// A container without data ignores it.
    pub fn holding(self) -> Self {
        Builder {
            held: self.with_data.then(Vec::new),
            ..self
        }
    }

    /// The same container in the [`FLAG_ENCODED`] format: entries are
    /// encoded under `setting` when the container is sealed (a container
    /// without data ignores it).
    pub fn with_encoding(self, setting: Compression) -> Self {
        Builder {
            encoding: self.with_data.then_some(setting),
            ..self
        }
    }

    /// The same container compressing its entries with `dictionary`
    /// (docs/FORMAT.md §7.8), when it encodes them.
    pub fn with_dictionary(self, dictionary: Option<Arc<Dictionary>>) -> Self {
        Builder { dictionary, ..self }
    }

    /// Sets the dictionary entries are compressed with ([`Builder::with_dictionary`]).
    pub fn set_dictionary(&mut self, dictionary: Option<Arc<Dictionary>>) {
        self.dictionary = dictionary;
    }

    /// The bytes of the whole chunks appended as they are (not deltas,
    /// not entries copied encoded): samples to train a dictionary from.
    pub fn whole_entries(&self) -> Vec<&[u8]> {
        let whole = |i: usize, m: &ChunkMeta| {
            m.base.is_none() && !self.pre_encoded.get(i).copied().unwrap_or(false)
        };
        match &self.held {
            Some(held) => self
                .metas
                .iter()
                .zip(held)
                .enumerate()
                .filter(|(i, (m, _))| whole(*i, m))
                .map(|(_, (_, b))| b.as_ref())
                .collect(),
            None => self
                .metas
                .iter()
                .enumerate()
                .filter(|(i, m)| whole(*i, m))
                .filter_map(|(_, m)| {
                    let start = m.offset as usize;
                    self.data.as_slice().get(start..start + m.len as usize)
                })
                .collect(),
        }
    }

    /// Whether entries are stored encoded ([`FLAG_ENCODED`]).
    pub fn encoded(&self) -> bool {
        self.encoding.is_some()
    }

    /// The same container in the [`FLAG_DELTAS`] format, which can hold
    /// delta-encoded chunks ([`Builder::push_delta`]).
    pub fn with_deltas(self) -> Self {
        Builder {
            deltas: self.with_data,
            ..self
        }
    }

    fn entry_len(&self) -> usize {
        entry_len(self.flags())
    }

    /// The header flags the container is written with.
    fn flags(&self) -> u32 {
        let mut flags = match (self.with_data, self.deltas) {
            (false, _) => FLAG_NO_DATA,
            (true, false) => 0,
            (true, true) => FLAG_DELTAS | FLAG_FEATURES | FLAG_CHUNK_CRCS,
        };
        if self.aligned {
            flags |= FLAG_ALIGNED;
        }
        if self.encoding.is_some() {
            flags |= FLAG_ENCODED;
        }
        flags
    }

    /// An empty container `id` whose data section reuses `buf` (cleared; its
    /// capacity spares allocating and faulting in a new buffer).
    pub fn with_buffer(id: ContainerId, capacity: usize, mut buf: AlignedBuf) -> Self {
        buf.clear();
        Builder {
            data: buf,
            ..Builder::new(id, capacity)
        }
    }

    /// An empty container of a trace repository: chunk lengths only, no data section.
    pub fn without_data(id: ContainerId, capacity: usize) -> Self {
        Builder {
            with_data: false,
            ..Builder::new(id, capacity)
        }
    }

    /// The container's id.
    pub fn id(&self) -> ContainerId {
        self.id
    }

    /// Whether the container holds no chunk.
    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// Whether a chunk of `len` bytes still fits.
    pub fn fits(&self, len: usize) -> bool {
        let meta_end = HEADER_LEN + (self.metas.len() + 1) * self.entry_len();
        // Entries are encoded at sealing: count the most a raw one takes.
        let overhead = match self.encoding {
            Some(_) => compression::MAX_OVERHEAD,
            None => 0,
        };
        data_start(meta_end, self.aligned) + self.data_len + len + overhead <= self.capacity
    }

    /// Appends a chunk (the caller checked [`Builder::fits`]).
    pub fn push(&mut self, fp: Fingerprint, bytes: &[u8]) {
        self.push_stored(fp, bytes, None, None, None);
    }

    /// Appends a chunk given as shared bytes, with its super-features if
    /// known (recorded in the [`FLAG_DELTAS`] format): a
    /// [`Builder::holding`] container keeps a reference instead of a copy
    /// (the caller checked [`Builder::fits`]).
    pub fn push_shared(&mut self, fp: Fingerprint, bytes: &Bytes, features: Option<SuperFeatures>) {
        self.push_stored(fp, bytes, Some(bytes), None, features);
    }

    /// Appends a chunk with its super-features, recorded when the container
    /// is in the [`FLAG_DELTAS`] format (the caller checked [`Builder::fits`]).
    pub fn push_with_features(&mut self, fp: Fingerprint, bytes: &[u8], features: SuperFeatures) {
        self.push_stored(fp, bytes, None, None, Some(features));
    }

    /// Appends chunk `fp` as `delta`, its encoding against `base` (the
    /// caller checked [`Builder::fits`] for the delta's length). A builder
    /// not made [`Builder::with_deltas`] refuses it.
    pub fn push_delta(&mut self, fp: Fingerprint, delta: &[u8], base: BaseRef) -> Result<()> {
        if !self.deltas {
            return Err(Error::Pipeline(format!(
                "container {:016x} cannot hold the delta of chunk {fp}",
                self.id
            )));
        }
        self.push_stored(fp, delta, None, Some(base), None);
        Ok(())
    }

    /// Appends entry `i` of `from` as it is stored there: a delta against
    /// the same base, or a whole chunk with its super-features (the caller
    /// checked [`Builder::fits`] for its stored length). An encoded entry is
    /// copied as it is into an encoded container, and decoded into one
    /// that is not.
    pub fn push_like(&mut self, from: &Container, i: usize) -> Result<()> {
        let m = &from.metas[i];
        let copied = from.header.encoded() && self.encoding.is_some();
        let bytes = match copied {
            true => std::borrow::Cow::Borrowed(from.stored(i)),
            false => from.entry(i)?,
        };
        match m.base {
            Some(base) => self.push_delta(m.fp, &bytes, base)?,
            None => self.push_stored(m.fp, &bytes, None, None, m.features),
        }
        if let Some(last) = self.pre_encoded.last_mut() {
            *last = copied;
        }
        Ok(())
    }

    /// Appends stored bytes (a chunk, or a delta against `base`), also
    /// given as `shared` bytes if the caller has them.
    fn push_stored(
        &mut self,
        fp: Fingerprint,
        bytes: &[u8],
        shared: Option<&Bytes>,
        base: Option<BaseRef>,
        features: Option<SuperFeatures>,
    ) {
        self.push_len(fp, bytes.len() as u32);
        if self.encoding.is_some() {
            self.pre_encoded.push(false);
        }
        let held = self.held.is_some();
        if let Some(m) = self.metas.last_mut() {
            m.base = base;
            m.features = features.filter(|_| self.deltas);
            // (Held entries are checksummed when they are written.)
            m.crc = (self.deltas && !held).then(|| crc32c::crc32c(bytes));
        }
        if let Some(entries) = &mut self.held {
            entries.push(
                shared
                    .cloned()
                    .unwrap_or_else(|| Bytes::copy_from_slice(bytes)),
            );
        } else if self.with_data {
            self.data.reserve_total(self.capacity);
            self.data.extend_from_slice(bytes);
            if self.encoding.is_none() {
                // (Encoded containers checksum their entries when sealed.)
                self.data_crc = crc32c::crc32c_append(self.data_crc, bytes);
            }
        }
    }

    /// Records super-features, computed by `features`, for the whole chunks
    /// of at least `min_len` bytes appended without them.
    pub fn complete_features(&mut self, min_len: usize, features: impl Fn(&[u8]) -> SuperFeatures) {
        if !(self.deltas && self.with_data) {
            return;
        }
        for (i, m) in self.metas.iter_mut().enumerate() {
            let copied = self.pre_encoded.get(i).copied().unwrap_or(false);
            if m.base.is_none() && m.features.is_none() && m.len as usize >= min_len && !copied {
                let start = m.offset as usize;
                let bytes = match &self.held {
                    Some(entries) => entries.get(i).map(|b| b.as_ref()),
                    None => self.data.as_slice().get(start..start + m.len as usize),
                };
                if let Some(bytes) = bytes {
                    m.features = Some(features(bytes));
                }
            }
        }
    }

    /// Appends a chunk known only by fingerprint and length (trace containers).
    pub fn push_len(&mut self, fp: Fingerprint, len: u32) {
        self.metas.push(ChunkMeta {
            fp,
            offset: self.data_len as u32,
            len,
            base: None,
            features: None,
            crc: None,
        });
        self.data_len += len as usize;
    }

    /// Serialises the container into one buffer.
    pub fn seal(self) -> Vec<u8> {
        self.seal_parts().to_vec()
    }

    /// Encodes every entry not appended encoded ([`FLAG_ENCODED`]) into a
    /// new data section, updating offsets, lengths and checksums. The new
    /// section is written into a buffer kept by the thread, which then
    /// keeps the old one: no allocation per container.
    fn encode_entries(&mut self, setting: Compression) -> EncodeCounts {
        let mut counts = EncodeCounts::default();
        let mut out = ENCODE_BUF
            .with(|b| b.borrow_mut().take())
            .unwrap_or_else(|| AlignedBuf::with_capacity(self.capacity));
        out.clear();
        out.reserve_total(self.data.len() + self.metas.len());
        let mut data_crc = 0;
        for (i, m) in self.metas.iter_mut().enumerate() {
            let start = m.offset as usize;
            let bytes = &self.data.as_slice()[start..start + m.len as usize];
            let at = out.len();
            match self.pre_encoded.get(i) {
                Some(true) => out.extend_from_slice(bytes),
                // Appending to the buffer's vector keeps its aligned start.
                _ => compression::encode(
                    setting,
                    self.dictionary.as_deref(),
                    bytes,
                    out.vec_mut(),
                    &mut counts,
                ),
            }
            let stored = &out.as_slice()[at..];
            m.offset = at as u32;
            m.len = stored.len() as u32;
            if self.deltas {
                m.crc = Some(crc32c::crc32c(stored));
            }
            data_crc = crc32c::crc32c_append(data_crc, stored);
        }
        self.data_len = out.len();
        self.data_crc = data_crc;
        let raw = std::mem::replace(&mut self.data, out);
        ENCODE_BUF.with(|b| *b.borrow_mut() = Some(raw));
        counts
    }

    /// Serialises the header and metadata; the data stays in the chunks'
    /// buffers (of a [`FLAG_ENCODED`] container, encoded first). A
    /// [`Builder::holding`] container is assembled whole in `head`.
    pub fn seal_parts(mut self) -> Sealed {
        if self.held.is_some() {
            let mut whole = AlignedBuf::with_capacity(self.capacity);
            let encoded = self.fill(&mut whole);
            return Sealed {
                head: whole,
                data: AlignedBuf::default(),
                encoded,
            };
        }
        let encoded = match self.encoding {
            Some(setting) if self.with_data => self.encode_entries(setting),
            _ => EncodeCounts::default(),
        };
        let head = self.head();
        // The gap before the data section (trace containers store no data, nor gap).
        let end = match self.with_data {
            true => data_start(head.len(), self.aligned),
            false => head.len(),
        };
        let mut aligned = AlignedBuf::with_capacity(end);
        aligned.extend_from_slice(&head);
        aligned.pad(end - head.len());
        Sealed {
            head: aligned,
            data: self.data,
            encoded,
        }
    }

    /// Writes the container as a new object to `backend`; what encoding
    /// its entries did, and its data buffer for the next container (none
    /// when [`Builder::holding`]: its entries are copied straight into
    /// the object).
    pub fn write_new(
        mut self,
        backend: &dyn Backend,
    ) -> Result<(EncodeCounts, Option<AlignedBuf>)> {
        let k = key(self.id);
        if self.held.is_none() {
            let sealed = self.seal_parts();
            backend.write_new(&k, &sealed.parts())?;
            return Ok((sealed.encoded, Some(sealed.data)));
        }
        let mut encoded = EncodeCounts::default();
        let len_hint = self.capacity.max(self.max_len());
        backend.write_new_filled(&k, len_hint, &mut |image| {
            encoded = self.fill(image);
            Ok(())
        })?;
        Ok((encoded, None))
    }

    /// The most bytes the container takes, its entries stored raw.
    fn max_len(&self) -> usize {
        let meta_end = HEADER_LEN + self.metas.len() * self.entry_len();
        let overhead = match self.encoding {
            Some(_) => self.metas.len() * compression::MAX_OVERHEAD,
            None => 0,
        };
        data_start(meta_end, self.aligned) + self.data_len + overhead
    }

    /// Appends the whole container, its held entries copied (and encoded)
    /// once, to `image`, which is empty; what the encoding did.
    fn fill(&mut self, image: &mut dyn ObjectImage) -> EncodeCounts {
        let meta_end = HEADER_LEN + self.metas.len() * self.entry_len();
        let start = data_start(meta_end, self.aligned);
        // Header and metadata, completed below; the gap stays zero.
        let zeros = [0u8; DATA_ALIGN];
        let mut left = start;
        while left > 0 {
            let n = left.min(DATA_ALIGN);
            image.append(&zeros[..n]);
            left -= n;
        }
        let mut counts = EncodeCounts::default();
        let mut scratch = Vec::new();
        let entries = self.held.take().unwrap_or_default();
        let (mut data_len, mut data_crc) = (0usize, 0u32);
        for (i, (m, bytes)) in self.metas.iter_mut().zip(&entries).enumerate() {
            let pieces = match self.encoding {
                Some(setting) if !self.pre_encoded.get(i).copied().unwrap_or(false) => {
                    compression::encode_pieces(
                        setting,
                        self.dictionary.as_deref(),
                        bytes,
                        &mut scratch,
                        &mut counts,
                    )
                }
                _ => [bytes.as_ref(), &[]],
            };
            let (mut crc, mut len) = (0u32, 0usize);
            for piece in pieces {
                // (Checksummed before the copy reads it from the cache.)
                data_crc = crc32c::crc32c_append(data_crc, piece);
                if self.deltas {
                    crc = crc32c::crc32c_append(crc, piece);
                }
                image.append(piece);
                len += piece.len();
            }
            m.offset = data_len as u32;
            m.len = len as u32;
            if self.deltas {
                m.crc = Some(crc);
            }
            data_len += len;
        }
        self.data_len = data_len;
        self.data_crc = data_crc;
        image.overwrite(0, &self.head());
        counts
    }

    /// The header and metadata section.
    fn head(&self) -> Vec<u8> {
        let mut head = Vec::with_capacity(HEADER_LEN + self.metas.len() * self.entry_len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&CONTAINER_VERSION.to_le_bytes());
        head.extend_from_slice(&self.id.to_le_bytes());
        head.extend_from_slice(&(self.metas.len() as u32).to_le_bytes());
        head.extend_from_slice(&(self.data_len as u32).to_le_bytes());
        head.extend_from_slice(&[0; 8]); // metadata and data checksums, below
        head.extend_from_slice(&self.flags().to_le_bytes());
        head.extend_from_slice(&[0; 4]); // header checksum, below
        for m in &self.metas {
            head.extend_from_slice(&m.fp.0);
            head.extend_from_slice(&m.offset.to_le_bytes());
            head.extend_from_slice(&m.len.to_le_bytes());
            if self.deltas {
                let (container, fp) = m
                    .base
                    .map_or((NO_BASE, Fingerprint::default()), |b| (b.container, b.fp));
                head.extend_from_slice(&container.to_le_bytes());
                head.extend_from_slice(&fp.0);
                for f in m.features.unwrap_or_default() {
                    head.extend_from_slice(&f.to_le_bytes());
                }
                head.extend_from_slice(&m.crc.unwrap_or_default().to_le_bytes());
            }
        }
        let meta_crc = crc32c::crc32c(&head[HEADER_LEN..]);
        head[24..28].copy_from_slice(&meta_crc.to_le_bytes());
        head[28..32].copy_from_slice(&self.data_crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&head[..36]);
        head[36..40].copy_from_slice(&header_crc.to_le_bytes());
        head
    }
}

/// A whole container read back and checked, with lookup by fingerprint.
pub struct Container {
    /// The header.
    pub header: Header,
    /// The chunks, in data order.
    pub metas: Vec<ChunkMeta>,
    bytes: Bytes,
    by_fp: FingerprintMap<u32>,
    data_checked: bool,
}

impl Container {
    /// Parses container `id` and checks all its checksums.
    pub fn parse(id: ContainerId, bytes: impl Into<Bytes>) -> Result<Container> {
        Self::parse_checking(id, bytes.into(), true)
    }

    /// Parses container `id`, checking its header and metadata but not its
    /// data checksum: for a caller that verifies every chunk it uses, by
    /// [`Container::chunk_crc_matches`] or the chunk's fingerprint
    /// (PFC-delta's prefetched bases), and so
    /// need not check bytes it never uses.
    pub fn parse_unchecked_data(id: ContainerId, bytes: impl Into<Bytes>) -> Result<Container> {
        Self::parse_checking(id, bytes.into(), false)
    }

    fn parse_checking(id: ContainerId, bytes: Bytes, check_data: bool) -> Result<Container> {
        let header = Header::parse(id, &bytes)?;
        if bytes.len() != header.object_len() {
            return Err(Error::corrupt(
                key(id),
                format!(
                    "size {} differs from the {} bytes its header announces (truncated?)",
                    bytes.len(),
                    header.object_len()
                ),
            ));
        }
        let metas = header.parse_meta(&bytes)?;
        if header.has_data()
            && bytes[header.meta_end()..header.data_start()]
                .iter()
                .any(|&b| b != 0)
        {
            return Err(Error::corrupt(
                key(id),
                "non-zero bytes between the metadata and data sections",
            ));
        }
        let data = bytes.get(header.data_start()..).unwrap_or_default();
        if check_data && crc32c::crc32c(data) != header.data_crc {
            return Err(Error::corrupt(key(id), "data checksum mismatch"));
        }
        let mut by_fp = FingerprintMap::with_capacity_and_hasher(metas.len(), Default::default());
        for (i, m) in metas.iter().enumerate() {
            by_fp.entry(m.fp).or_insert(i as u32);
        }
        Ok(Container {
            header,
            metas,
            bytes,
            by_fp,
            data_checked: check_data,
        })
    }

    /// Whether the data checksum was checked when parsing (not with
    /// [`Container::parse_unchecked_data`]: then a user of a chunk's bytes
    /// must verify them, by [`Container::chunk_crc_matches`] or the chunk's
    /// fingerprint).
    pub fn data_checked(&self) -> bool {
        self.data_checked
    }

    /// Stored bytes of the `i`-th entry (an index into `metas`), encoded
    /// in a [`FLAG_ENCODED`] container; empty in a container without data.
    pub fn stored(&self, i: usize) -> &[u8] {
        if !self.header.has_data() {
            return &[];
        }
        let m = &self.metas[i];
        let start = self.header.data_start() + m.offset as usize;
        &self.bytes[start..start + m.len as usize]
    }

    /// Whether entry `j`'s stored bytes start where entry `i`'s end, in a
    /// container whose entries are stored as they are (not
    /// [`FLAG_ENCODED`]): then [`Container::stored_span`] holds both.
    pub fn follows(&self, i: usize, j: usize) -> bool {
        match (self.metas.get(i), self.metas.get(j)) {
            (Some(a), Some(b)) => {
                !self.header.encoded()
                    && self.header.has_data()
                    && u64::from(a.offset) + u64::from(a.len) == u64::from(b.offset)
            }
            _ => false,
        }
    }

    /// The stored bytes from the start of entry `first` to the end of
    /// entry `last` (empty if `last` ends before `first` starts): the
    /// entries from `first` to `last` when each [`Container::follows`] the
    /// one before.
    pub fn stored_span(&self, first: usize, last: usize) -> &[u8] {
        let (Some(a), Some(b)) = (self.metas.get(first), self.metas.get(last)) else {
            return &[];
        };
        if !self.header.has_data() {
            return &[];
        }
        let data = self.header.data_start();
        let start = data + a.offset as usize;
        let end = data + b.offset as usize + b.len as usize;
        self.bytes.get(start..end).unwrap_or_default()
    }

    /// The `i`-th entry's bytes (the chunk, or its delta) when they are
    /// stored as they are: in a container without [`FLAG_ENCODED`], or as
    /// a raw encoded entry; `None` when they must be decompressed.
    pub fn plain(&self, i: usize) -> Option<&[u8]> {
        match self.header.encoded() {
            true => compression::raw_part(self.stored(i)),
            false => Some(self.stored(i)),
        }
    }

    /// The `i`-th entry's bytes (the chunk, or its delta), decoded: a
    /// damaged encoded entry is a corrupt container.
    pub fn entry(&self, i: usize) -> Result<std::borrow::Cow<'_, [u8]>> {
        let stored = self.stored(i);
        if !self.header.encoded() {
            return Ok(std::borrow::Cow::Borrowed(stored));
        }
        compression::decode(stored).map_err(|e| {
            Error::corrupt(
                key(self.header.id),
                format!(
                    "chunk {}: stored entry does not decode: {e}",
                    self.metas[i].fp
                ),
            )
        })
    }

    /// Whether the stored bytes of the `i`-th chunk match the CRC-32C its
    /// entry records; `None` when the container records none
    /// ([`FLAG_CHUNK_CRCS`]).
    pub fn chunk_crc_matches(&self, i: usize) -> Option<bool> {
        let crc = self.metas[i].crc?;
        Some(crc32c::crc32c(self.stored(i)) == crc)
    }

    /// The base of the `i`-th chunk when it is stored as a delta.
    pub fn base(&self, i: usize) -> Option<BaseRef> {
        self.metas[i].base
    }

    /// Index of the chunk with fingerprint `fp`, if the container holds it.
    pub fn find(&self, fp: &Fingerprint) -> Option<usize> {
        self.by_fp.get(fp).map(|&i| i as usize)
    }

    /// Size of the whole object in bytes.
    pub fn object_len(&self) -> usize {
        self.bytes.len()
    }
}

/// A delta container as written before [`FLAG_CHUNK_CRCS`] existed:
/// 104-byte entries, the flag clear.
#[cfg(test)]
pub(crate) fn without_chunk_crcs(new: &[u8]) -> Vec<u8> {
    let header = Header::parse(u64::from_le_bytes(le8(&new[8..16])), new).unwrap();
    assert_ne!(header.flags & FLAG_CHUNK_CRCS, 0);
    let mut old = new[..HEADER_LEN].to_vec();
    for e in new[HEADER_LEN..header.meta_end()].chunks_exact(CRC_META_ENTRY_LEN) {
        old.extend_from_slice(&e[..FEATURE_META_ENTRY_LEN]);
    }
    let meta_crc = crc32c::crc32c(&old[HEADER_LEN..]);
    let aligned = header.flags & FLAG_ALIGNED != 0;
    old.resize(data_start(old.len(), aligned), 0);
    old.extend_from_slice(&new[header.data_start()..]);
    let flags = header.flags & !FLAG_CHUNK_CRCS;
    old[32..36].copy_from_slice(&flags.to_le_bytes());
    old[24..28].copy_from_slice(&meta_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&old[..36]);
    old[36..40].copy_from_slice(&header_crc.to_le_bytes());
    old
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ObjectStore;
    use crate::fingerprint::FingerprintAlgo;

    fn sample() -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut b = Builder::new(7, 1 << 16);
        let chunks: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 100 + i as usize]).collect();
        for c in &chunks {
            assert!(b.fits(c.len()));
            b.push(FingerprintAlgo::Blake3.hash(c), c);
        }
        (b.seal(), chunks)
    }

    #[test]
    fn round_trip() {
        let (bytes, chunks) = sample();
        let c = Container::parse(7, bytes.clone()).unwrap();
        assert_eq!(c.metas.len(), 5);
        assert!(c.data_checked());
        for (i, chunk) in chunks.iter().enumerate() {
            let fp = FingerprintAlgo::Blake3.hash(chunk);
            assert_eq!(c.find(&fp), Some(i));
            assert_eq!(c.stored(i), &chunk[..]);
        }
        // Without the data check: the same chunks, and it says so.
        let mut flipped = bytes;
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(Container::parse(7, flipped.clone()).is_err());
        let u = Container::parse_unchecked_data(7, flipped).unwrap();
        assert!(!u.data_checked());
        assert_eq!(u.metas.len(), 5);
        assert_ne!(u.stored(4), &chunks[4][..]);
    }

    #[test]
    fn every_byte_flip_is_detected() {
        let (bytes, _) = sample();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Container::parse(7, bad).is_err(), "flip at {i} undetected");
        }
    }

    #[test]
    fn wrong_id_and_truncation_are_detected() {
        let (bytes, _) = sample();
        assert!(Container::parse(8, bytes.clone()).is_err());
        assert!(Container::parse(7, bytes[..bytes.len() - 1].to_vec()).is_err());
    }

    #[test]
    fn trace_containers_have_metadata_only() {
        for (capacity, gap) in [
            (1 << 19, 0),
            (1 << 20, DATA_ALIGN - HEADER_LEN - 2 * META_ENTRY_LEN),
        ] {
            let mut b = Builder::without_data(3, capacity);
            b.push_len(Fingerprint([1; 32]), 8000);
            b.push_len(Fingerprint([2; 32]), 9000);
            let bytes = b.seal();
            assert_eq!(bytes.len(), HEADER_LEN + 2 * META_ENTRY_LEN);
            let c = Container::parse(3, bytes).unwrap();
            assert!(!c.header.has_data());
            // The nominal size counts the gap a data container of that capacity has.
            assert_eq!(
                c.header.total_len(),
                HEADER_LEN + 2 * META_ENTRY_LEN + gap + 17000
            );
            assert_eq!(c.metas[1].offset, 8000);
            assert!(c.stored(1).is_empty());
        }
    }

    #[test]
    fn large_containers_align_their_data_section() {
        let mut b = Builder::new(9, ALIGN_MIN_CAPACITY);
        let chunks: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 1; 5000]).collect();
        for c in &chunks {
            b.push(FingerprintAlgo::Blake3.hash(c), c);
        }
        let sealed = b.seal_parts();
        let [head, data] = sealed.parts();
        assert_eq!(head.len(), DATA_ALIGN);
        assert_eq!(head.as_ptr() as usize % DATA_ALIGN, 0);
        assert_eq!(data.as_ptr() as usize % DATA_ALIGN, 0);
        let bytes = sealed.to_vec();
        let c = Container::parse(9, bytes.clone()).unwrap();
        assert_eq!(c.header.flags & FLAG_ALIGNED, FLAG_ALIGNED);
        assert_eq!(c.header.data_start(), DATA_ALIGN);
        assert_eq!(c.object_len(), DATA_ALIGN + 15000);
        for (i, chunk) in chunks.iter().enumerate() {
            assert_eq!(c.stored(i), &chunk[..]);
        }
        // A byte in the gap is caught like any other.
        for i in [c.header.meta_end(), DATA_ALIGN - 1] {
            let mut bad = bytes.clone();
            bad[i] = 1;
            assert!(Container::parse(9, bad).is_err(), "flip at {i} undetected");
        }
    }

    #[test]
    fn delta_entries_name_their_base_and_every_flip_is_detected() {
        let base = BaseRef {
            container: 3,
            fp: Fingerprint([9; 32]),
        };
        let mut b = Builder::new(7, 1 << 16).with_deltas();
        b.push(Fingerprint([1; 32]), b"whole");
        assert!(b.fits(100));
        b.push_delta(Fingerprint([2; 32]), b"delta", base).unwrap();
        let bytes = b.seal();
        assert_eq!(bytes.len(), HEADER_LEN + 2 * CRC_META_ENTRY_LEN + 10);
        let c = Container::parse(7, bytes.clone()).unwrap();
        assert_eq!(c.base(0), None);
        assert_eq!(c.base(1), Some(base));
        assert_eq!(c.stored(1), b"delta");
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Container::parse(7, bad).is_err(), "flip at {i} undetected");
        }
        // A container without the delta format refuses deltas.
        let mut plain = Builder::new(8, 1 << 16);
        assert!(plain.push_delta(Fingerprint([2; 32]), b"d", base).is_err());
    }

    #[test]
    fn missing_super_features_are_completed_for_whole_chunks_only() {
        let (recorded, computed) = ([1, 2, 3], [4, 5, 6]);
        let base = BaseRef {
            container: 3,
            fp: Fingerprint([9; 32]),
        };
        let mut b = Builder::new(7, 1 << 16).with_deltas();
        b.push(Fingerprint([1; 32]), b"without");
        b.push_with_features(Fingerprint([2; 32]), b"with", recorded);
        b.push(Fingerprint([3; 32]), b"tiny");
        b.push_delta(Fingerprint([4; 32]), b"delta", base).unwrap();
        b.complete_features(5, |bytes| {
            assert_eq!(bytes, b"without", "only the chunk missing them");
            computed
        });
        let c = Container::parse(7, b.seal()).unwrap();
        let features: Vec<_> = c.metas.iter().map(|m| m.features).collect();
        assert_eq!(features, [Some(computed), Some(recorded), None, None]);
        // A container that cannot record them is left as it is.
        let mut plain = Builder::new(8, 1 << 16);
        plain.push(Fingerprint([1; 32]), b"without");
        plain.complete_features(0, |_| computed);
        assert_eq!(
            Container::parse(8, plain.seal()).unwrap().metas[0].features,
            None
        );
    }

    #[test]
    fn delta_containers_record_super_features_of_whole_chunks() {
        let sf = [1, u64::MAX, 42];
        let base = BaseRef {
            container: 3,
            fp: Fingerprint([9; 32]),
        };
        let mut b = Builder::new(7, 1 << 16).with_deltas();
        b.push_with_features(Fingerprint([1; 32]), b"whole", sf);
        b.push(Fingerprint([2; 32]), b"plain");
        b.push_delta(Fingerprint([3; 32]), b"delta", base).unwrap();
        let bytes = b.seal();
        assert_eq!(bytes.len(), HEADER_LEN + 3 * CRC_META_ENTRY_LEN + 15);
        let c = Container::parse(7, bytes.clone()).unwrap();
        assert_eq!(
            c.header.flags,
            FLAG_DELTAS | FLAG_FEATURES | FLAG_CHUNK_CRCS
        );
        let features: Vec<_> = c.metas.iter().map(|m| m.features).collect();
        assert_eq!(features, [Some(sf), None, None]);
        // Every entry records its stored bytes' checksum.
        for (i, stored) in [&b"whole"[..], b"plain", b"delta"].iter().enumerate() {
            assert_eq!(c.metas[i].crc, Some(crc32c::crc32c(stored)));
            assert_eq!(c.chunk_crc_matches(i), Some(true));
        }
        assert_eq!(c.base(2), Some(base));
        // Copied entry by entry (as GC does), every chunk keeps its form.
        let mut copy = Builder::new(9, 1 << 16).with_deltas();
        for i in 0..c.metas.len() {
            copy.push_like(&c, i).unwrap();
        }
        let copied = Container::parse(9, copy.seal()).unwrap();
        assert_eq!(copied.metas, c.metas);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Container::parse(7, bad).is_err(), "flip at {i} undetected");
        }
        // Features without the delta format, and checksums without
        // features, are refused; plain containers record neither.
        for flags in [FLAG_FEATURES, FLAG_DELTAS | FLAG_CHUNK_CRCS] {
            let mut bad = bytes.clone();
            bad[32..36].copy_from_slice(&flags.to_le_bytes());
            let crc = crc32c::crc32c(&bad[..36]);
            bad[36..40].copy_from_slice(&crc.to_le_bytes());
            assert!(Container::parse(7, bad).is_err(), "flags {flags:#x}");
        }
        let mut plain = Builder::new(8, 1 << 16);
        plain.push_with_features(Fingerprint([1; 32]), b"whole", sf);
        let c = Container::parse(8, plain.seal()).unwrap();
        assert_eq!(c.metas[0].features, None);
        assert_eq!(c.metas[0].crc, None);
        assert_eq!(c.chunk_crc_matches(0), None);
        assert_eq!(c.header.entry_len(), META_ENTRY_LEN);
    }

    #[test]
    fn containers_without_chunk_checksums_read_unchanged() {
        let sf = [5, 6, 7];
        let mut b = Builder::new(4, 1 << 16).with_deltas();
        b.push_with_features(Fingerprint([1; 32]), b"whole", sf);
        let c = Container::parse(4, without_chunk_crcs(&b.seal())).unwrap();
        assert_eq!(c.metas[0].features, Some(sf));
        assert_eq!(c.metas[0].crc, None);
        assert_eq!(c.chunk_crc_matches(0), None);
        assert_eq!(c.stored(0), b"whole");
    }

    /// Chunks of text, random bytes and a small one, pushed (with one
    /// delta when the builder takes them) into `b`.
    fn push_mix(b: &mut Builder) -> Vec<Vec<u8>> {
        let text: Vec<u8> = b"fn main() { println!(\"hello\"); }\n"
            .iter()
            .copied()
            .cycle()
            .take(70_000)
            .collect();
        let chunks = vec![
            text.clone(),
            crate::chunker::pseudo_random(100_000, 9),
            b"tiny".to_vec(),
            text[..9000].to_vec(),
            crate::chunker::pseudo_random(3000, 4),
        ];
        for (i, c) in chunks.iter().enumerate() {
            let fp = FingerprintAlgo::Blake3.hash(c);
            match i {
                1 => b.push_shared(fp, &Bytes::from(c.clone()), Some([1, 2, 3])),
                3 if b.deltas => {
                    let base = BaseRef { container: 1, fp };
                    b.push_delta(fp, c, base).unwrap()
                }
                _ => b.push(fp, c),
            }
        }
        chunks
    }

    #[test]
    fn holding_containers_write_the_same_bytes() {
        for encoding in [None, Some(Compression::Auto), Some(Compression::Level(3))] {
            for deltas in [false, true] {
                let make = |holding: bool| {
                    let mut b = Builder::new(3, 1 << 20);
                    if deltas {
                        b = b.with_deltas();
                    }
                    if let Some(e) = encoding {
                        b = b.with_encoding(e);
                    }
                    if holding {
                        b = b.holding();
                    }
                    let chunks = push_mix(&mut b);
                    b.complete_features(1000, |c| [c.len() as u64, 1, 1]);
                    (b.seal_parts(), chunks)
                };
                let (copied, chunks) = make(false);
                let (held, _) = make(true);
                assert_eq!(held.encoded, copied.encoded, "{encoding:?} {deltas}");
                let bytes = held.to_vec();
                assert_eq!(bytes, copied.to_vec(), "{encoding:?} {deltas}");
                let c = Container::parse(3, bytes).unwrap();
                for (i, chunk) in chunks.iter().enumerate() {
                    assert_eq!(c.entry(i).unwrap().as_ref(), &chunk[..]);
                    if deltas {
                        assert_eq!(c.chunk_crc_matches(i), Some(true));
                    }
                }
                if encoding.is_some() {
                    // Text compressed, random raw, the mix in one section.
                    assert!(c.plain(0).is_none() && c.plain(1).is_some());
                }
            }
        }
    }

    #[test]
    fn holding_containers_write_through_backends_and_flips_are_caught() {
        let dir = tempfile::tempdir().unwrap();
        let plain = crate::backend::Local::new(dir.path());
        let mut b = Builder::new(4, 1 << 20)
            .with_encoding(Compression::Auto)
            .holding();
        let chunks = push_mix(&mut b);
        let (counts, spare) = b.write_new(&plain).unwrap();
        assert!(spare.is_none());
        assert_eq!((counts.compressed, counts.raw), (2, 3));
        let stored = plain.read(&key(4)).unwrap();
        let c = Container::parse(4, stored.clone()).unwrap();
        for (i, chunk) in chunks.iter().enumerate() {
            assert_eq!(c.entry(i).unwrap().as_ref(), &chunk[..]);
        }
        // Written again, as a new object: refused.
        let mut again = Builder::new(4, 1 << 20).holding();
        again.push(Fingerprint([1; 32]), b"x");
        assert!(matches!(
            again.write_new(&plain),
            Err(Error::ObjectExists(_))
        ));
        // Any flipped byte of the raw or the compressed entries fails.
        for at in [c.header.data_start() + 3, stored.len() - 5, 45] {
            let mut bad = stored.clone();
            bad[at] ^= 1;
            assert!(Container::parse(4, bad).is_err(), "flip at {at}");
        }
    }

    #[test]
    fn encoded_containers_compress_text_store_random_raw_and_copy_as_is() {
        let text: Vec<u8> = b"static int add(int a, int b) { return a + b; }\n"
            .iter()
            .copied()
            .cycle()
            .take(8192)
            .collect();
        let random = crate::chunker::pseudo_random(8192, 3);
        let mut b = Builder::new(5, 1 << 20)
            .with_deltas()
            .with_encoding(Compression::Auto);
        let (ft, fr) = (
            FingerprintAlgo::Blake3.hash(&text),
            FingerprintAlgo::Blake3.hash(&random),
        );
        b.push(ft, &text);
        b.push(fr, &random);
        let base = BaseRef {
            container: 5,
            fp: ft,
        };
        b.push_delta(Fingerprint([7; 32]), &text[..2000], base)
            .unwrap();
        let sealed = b.seal_parts();
        assert_eq!((sealed.encoded.compressed, sealed.encoded.raw), (2, 1));
        let bytes = sealed.to_vec();
        let c = Container::parse(5, bytes.clone()).unwrap();
        assert!(c.header.encoded());
        assert!(c.metas[0].len < 1000, "text compressed: {}", c.metas[0].len);
        assert_eq!(c.metas[1].len, 8193, "random stored raw, one tag byte");
        assert_eq!(c.entry(0).unwrap().as_ref(), &text[..]);
        assert_eq!(c.plain(1), Some(&random[..]));
        assert_eq!(c.plain(0), None);
        assert_eq!(c.entry(2).unwrap().as_ref(), &text[..2000]);
        assert_eq!(c.chunk_crc_matches(0), Some(true));
        // Copied entry by entry into another encoded container: as stored.
        let mut copy = Builder::new(6, 1 << 20)
            .with_deltas()
            .with_encoding(Compression::Level(19));
        for i in 0..3 {
            copy.push_like(&c, i).unwrap();
        }
        let copied = copy.seal_parts();
        assert_eq!(copied.encoded.bytes_in, 0, "nothing encoded again");
        let copied = Container::parse(6, copied.to_vec()).unwrap();
        for i in 0..3 {
            assert_eq!(copied.stored(i), c.stored(i));
        }
        // Into one that is not encoded: decoded.
        let mut plain = Builder::new(7, 1 << 20).with_deltas();
        for i in 0..3 {
            plain.push_like(&c, i).unwrap();
        }
        let plain = Container::parse(7, plain.seal()).unwrap();
        assert_eq!(plain.stored(0), &text[..]);
        // A damaged frame (checksums made to match) is a corrupt container
        // naming the chunk, not a panic.
        let mut bad = bytes;
        let at = c.header.data_start() + 5;
        bad[at] ^= 0xff;
        let ds = c.header.data_start();
        let crc = crc32c::crc32c(&bad[ds..]);
        bad[28..32].copy_from_slice(&crc.to_le_bytes());
        let hc = crc32c::crc32c(&bad[..36]);
        bad[36..40].copy_from_slice(&hc.to_le_bytes());
        let damaged = Container::parse(5, bad).unwrap();
        match damaged.entry(0) {
            Err(e @ Error::Corrupt { .. }) => {
                assert!(e.to_string().contains("containers/0000000000000005"), "{e}")
            }
            Ok(b) => assert_ne!(FingerprintAlgo::Blake3.hash(&b), ft),
            Err(e) => panic!("unexpected {e}"),
        }
        // FLAG_ENCODED with FLAG_NO_DATA is refused.
        let mut t = Builder::without_data(8, 1 << 20).with_encoding(Compression::Auto);
        t.push_len(ft, 10);
        let tb = t.seal();
        assert!(!Container::parse(8, tb).unwrap().header.encoded());
    }

    #[test]
    fn capacity_is_respected() {
        let mut b = Builder::new(1, HEADER_LEN + 2 * META_ENTRY_LEN + 200);
        assert!(b.fits(200));
        b.push(Fingerprint::default(), &[0; 150]);
        assert!(b.fits(50));
        assert!(!b.fits(51));
        // An aligned container counts the gap before its data.
        let mut b = Builder::new(2, ALIGN_MIN_CAPACITY);
        assert!(b.fits(ALIGN_MIN_CAPACITY - DATA_ALIGN));
        assert!(!b.fits(ALIGN_MIN_CAPACITY - DATA_ALIGN + 1));
        b.push(Fingerprint::default(), &[0; 100]);
        assert_eq!(b.seal().len(), DATA_ALIGN + 100);
    }
}
