//! The catalog of a tree backup: one record per file-system object, written
//! after the files' bytes in the backup's stream and read back record by
//! record (docs/FORMAT.md §24.2).

use crate::backup::SegmentRead;
use crate::error::{Error, Result};
use crate::format::snapshot::{IndexPage, CATALOG_VERSION};
use crate::util::spill::temp_file;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufReader, BufWriter, ErrorKind, Read, Seek, SeekFrom, Write};

const MAGIC: &[u8; 4] = b"TCAT";
/// Largest record of a version-1 catalog (paths and link targets are at most a few KiB).
const MAX_RECORD_V1: u64 = 65536;
/// Largest record of a version-2 catalog (extended attributes included).
const MAX_RECORD: u64 = 1 << 20;

/// What a catalog entry is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// A directory.
    #[default]
    Dir,
    /// A regular file; its bytes are in the stream.
    File,
    /// A symbolic link (stored, never followed).
    Symlink,
    /// Bytes of a file that failed while it was read: in the stream, never restored.
    Gap,
    /// Another path of a regular file recorded earlier (`target`): restored as a hard link.
    Hardlink,
    /// A named pipe.
    Fifo,
    /// A character device (`rdev`).
    CharDevice,
    /// A block device (`rdev`).
    BlockDevice,
}

/// One extended attribute (POSIX ACLs are `system.posix_acl_*` attributes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xattr {
    /// Its name, e.g. `user.comment`.
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    /// Its value.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// One file-system object of a tree backup (catalog version 2; a version-1
/// record reads with the fields after `target` empty, `atime` = `mtime`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Absolute path without the leading `/`, as bytes.
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    /// What it is.
    pub kind: Kind,
    /// Permission bits, setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time: seconds since the epoch.
    pub mtime: i64,
    /// Nanoseconds of the modification time.
    pub mtime_ns: u32,
    /// Status-change time: seconds since the epoch.
    pub ctime: i64,
    /// Nanoseconds of the status-change time.
    pub ctime_ns: u32,
    /// Device of the object.
    pub dev: u64,
    /// Inode of the object.
    pub ino: u64,
    /// Bytes in the stream (files and gaps), 0 otherwise.
    pub size: u64,
    /// Target of a symbolic link, or the catalog path of the file a hard
    /// link is a link to; empty otherwise.
    #[serde(with = "serde_bytes")]
    pub target: Vec<u8>,
    /// Access time: seconds since the epoch.
    pub atime: i64,
    /// Nanoseconds of the access time.
    pub atime_ns: u32,
    /// Name of the owner on the backed-up host (empty if unknown).
    #[serde(with = "serde_bytes")]
    pub user: Vec<u8>,
    /// Name of the group (empty if unknown).
    #[serde(with = "serde_bytes")]
    pub group: Vec<u8>,
    /// Device number of a device node, 0 otherwise.
    pub rdev: u64,
    /// A regular file with holes (fewer blocks allocated than its size).
    pub sparse: bool,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<Xattr>,
}

/// A version-1 record (docs/FORMAT.md §24.2).
#[derive(Deserialize)]
struct EntryV1 {
    path: Vec<u8>,
    kind: Kind,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    mtime_ns: u32,
    ctime: i64,
    ctime_ns: u32,
    dev: u64,
    ino: u64,
    size: u64,
    target: Vec<u8>,
}

impl From<EntryV1> for Entry {
    fn from(v: EntryV1) -> Self {
        Entry {
            path: v.path,
            kind: v.kind,
            mode: v.mode,
            uid: v.uid,
            gid: v.gid,
            mtime: v.mtime,
            mtime_ns: v.mtime_ns,
            atime: v.mtime,
            atime_ns: v.mtime_ns,
            ctime: v.ctime,
            ctime_ns: v.ctime_ns,
            dev: v.dev,
            ino: v.ino,
            size: v.size,
            target: v.target,
            ..Entry::default()
        }
    }
}

impl Entry {
    /// Whether the entry's bytes are in the stream (a file or a gap).
    pub fn has_bytes(&self) -> bool {
        matches!(self.kind, Kind::File | Kind::Gap)
    }
}

/// Catalog bytes kept in memory before a writer spills them to a temporary file.
const SPILL_AT: usize = 8 << 20;

/// Largest catalog segment (a region with the catalog's header or trailer)
/// and index page (docs/FORMAT.md §24.4), unless the chunker's maximum
/// chunk size is smaller.
pub const REGION_MAX: usize = 64 << 10;
/// A region ends after a record whose path's CRC-32C is a multiple of this
/// (once it holds a quarter of its maximum).
const REGION_CUT: u32 = 32;
const INDEX_MAGIC: &[u8; 4] = b"TCIX";
/// Largest record of an index (a region's ancestors included).
const MAX_INDEX_RECORD: u64 = 64 << 20;
/// Bytes of an index page's frame: magic, version, terminator, count, CRC.
const PAGE_FRAME: usize = 4 + 4 + 1 + 8 + 4;

/// One region of a catalog, as its index records it (docs/FORMAT.md §24.4).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// Byte offset in the catalog of the region's first record.
    pub offset: u64,
    /// Catalog records before it.
    pub entries: u64,
    /// Stream offset of the bytes of the first file (or gap) at or after it.
    pub data_offset: u64,
    /// Path of its first record.
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    /// The directory records of the ancestors of `path`, outermost first.
    pub ancestors: Vec<Entry>,
    /// Byte offset in the catalog of its end (version 4 records it after
    /// the fields above; for version 3, the next region's offset).
    #[serde(skip)]
    pub end: u64,
}

/// A segment of a catalog's or index's bytes as the backup's stream holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Its length.
    pub len: u64,
    /// Whether it is stored as one chunk (at most the writer's maximum).
    pub whole: bool,
}

/// Whether catalog path `dir` is a proper ancestor of `path`.
pub(crate) fn is_ancestor(dir: &[u8], path: &[u8]) -> bool {
    dir.is_empty() && !path.is_empty()
        || path.len() > dir.len() && path.starts_with(dir) && path[dir.len()] == b'/'
}

/// Builds a catalog record by record: in memory up to a few MiB, then in an
/// unnamed temporary file, so a backup's memory does not grow with its tree;
/// and its index, one record per region (docs/FORMAT.md §24.4).
pub struct CatalogWriter {
    memory: Vec<u8>,
    spill: Option<BufWriter<File>>,
    crc: u32,
    len: u64,
    count: u64,
    /// Bytes of the files and gaps recorded so far.
    data: u64,
    /// The directories recorded that are ancestors of the last record, outermost first.
    open_dirs: Vec<Entry>,
    /// The index's records so far.
    regions: Vec<Region>,
    /// The catalog's segments before the current one.
    segments: Vec<Segment>,
    /// Catalog offset of the current segment.
    segment_start: u64,
    /// Largest whole segment or page.
    max: u64,
    /// The record being written: its length, then its bytes (reused).
    record: Vec<u8>,
}

impl Default for CatalogWriter {
    fn default() -> Self {
        CatalogWriter::new(REGION_MAX)
    }
}

impl CatalogWriter {
    /// A writer whose regions and index pages take at most `max` bytes
    /// (the chunker's maximum chunk size, at most [`REGION_MAX`]) when
    /// their records fit.
    pub fn new(max: usize) -> Self {
        let mut w = CatalogWriter {
            memory: Vec::new(),
            spill: None,
            crc: 0,
            len: 0,
            count: 0,
            data: 0,
            open_dirs: Vec::new(),
            regions: Vec::new(),
            segments: Vec::new(),
            segment_start: 0,
            max: max.clamp(PAGE_FRAME + 1, REGION_MAX) as u64,
            record: Vec::new(),
        };
        w.memory.extend_from_slice(MAGIC);
        w.memory.extend_from_slice(&CATALOG_VERSION.to_le_bytes());
        w.crc = crc32c::crc32c(&w.memory);
        w.len = w.memory.len() as u64;
        w
    }
}

/// A finished catalog, to be read once from its start, and its index.
pub struct CatalogBytes {
    input: Box<dyn Read + Send>,
    len: u64,
    /// The index (docs/FORMAT.md §24.4): its pages one after another.
    pub index: Vec<u8>,
    /// The index's pages.
    pub pages: Vec<IndexPage>,
    /// The segments of the catalog then of the index, in stream order.
    segments: std::collections::VecDeque<Segment>,
    /// Bytes left of the current segment that is not whole (0: at a boundary).
    left: u64,
    /// A segment that is not whole was fed to its end: it ends now.
    ending: bool,
}

impl CatalogBytes {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty (never: a catalog has a header).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl CatalogBytes {
    /// Feeds the catalog then its index into a backup's stream, segment by
    /// segment (whole segments as one chunk); `None` after the last.
    pub fn feed(&mut self, buf: &mut [u8]) -> Result<Option<SegmentRead>> {
        let read_err = |e| Error::io("reading the catalog's spill file", e);
        if self.left == 0 {
            if std::mem::take(&mut self.ending) {
                return Ok(Some(SegmentRead::SegmentEnd));
            }
            let Some(next) = self.segments.pop_front() else {
                return Ok(None);
            };
            if !next.whole {
                self.left = next.len;
            } else {
                let len = next.len as usize;
                let room = buf.len();
                let buf = buf.get_mut(..len).ok_or_else(|| {
                    Error::Pipeline(format!("a {len}-byte catalog region, room for {room}"))
                })?;
                self.input.read_exact(buf).map_err(read_err)?;
                return Ok(Some(SegmentRead::Whole(len)));
            }
        }
        let n = buf.len().min(self.left as usize);
        self.input.read_exact(&mut buf[..n]).map_err(read_err)?;
        self.left -= n as u64;
        self.ending = self.left == 0;
        Ok(Some(SegmentRead::Data(n)))
    }
}

impl CatalogWriter {
    /// Appends one record.
    pub fn push(&mut self, entry: &Entry) -> Result<()> {
        // The record is encoded after room for its length (a varint of at
        // most 3 bytes, as records take at most MAX_RECORD bytes), into a
        // buffer kept from record to record.
        const ROOM: usize = 3;
        let mut record = std::mem::take(&mut self.record);
        record.clear();
        record.resize(ROOM, 0);
        let mut record = postcard::to_extend(entry, record).map_err(|e| {
            Error::Pipeline(format!(
                "encoding the catalog entry of {}: {e}",
                String::from_utf8_lossy(&entry.path)
            ))
        })?;
        let len = (record.len() - ROOM) as u64;
        if len > MAX_RECORD {
            return Err(Error::Pipeline(format!(
                "catalog entry of {} takes {len} bytes (at most {MAX_RECORD})",
                String::from_utf8_lossy(&entry.path),
            )));
        }
        let mut prefix = Vec::with_capacity(ROOM);
        push_varint(&mut prefix, len);
        let start = ROOM - prefix.len();
        record[start..ROOM].copy_from_slice(&prefix);
        let put = self.put_record(entry, &record[start..], len);
        self.record = record;
        put
    }

    /// Appends the record of `entry` as `record`, its bytes in a catalog of
    /// this version (an unchanged record of the parent backup's catalog),
    /// without encoding it again.
    pub fn push_record(&mut self, entry: &Entry, record: &[u8]) -> Result<()> {
        debug_assert_eq!(postcard::to_stdvec(entry).ok().as_deref(), Some(record));
        let mut bytes = std::mem::take(&mut self.record);
        bytes.clear();
        push_varint(&mut bytes, record.len() as u64);
        bytes.extend_from_slice(record);
        let put = self.put_record(entry, &bytes, record.len() as u64);
        self.record = bytes;
        put
    }

    /// Appends `bytes`, the record of `entry` (`len` bytes) after its length.
    fn put_record(&mut self, entry: &Entry, bytes: &[u8], len: u64) -> Result<()> {
        while self
            .open_dirs
            .last()
            .is_some_and(|d| !is_ancestor(&d.path, &entry.path))
        {
            self.open_dirs.pop();
        }
        // A new region (and segment) at a record whose path cuts (so that
        // an unchanged run of records is cut the same way in the next
        // backup) or that would not fit in the current one.
        let size = varint_len(len) + len as usize;
        let held = self.len - self.segment_start;
        let cut = crc32c::crc32c(&entry.path).is_multiple_of(REGION_CUT);
        if self.regions.is_empty() || held >= self.max / 4 && cut || held + size as u64 > self.max {
            if let Some(last) = self.regions.last_mut() {
                last.end = self.len;
                self.segments.push(Segment {
                    len: self.len - self.segment_start,
                    whole: self.len - self.segment_start <= self.max,
                });
                self.segment_start = self.len;
            }
            self.regions.push(Region {
                offset: self.len,
                entries: self.count,
                data_offset: self.data,
                path: entry.path.clone(),
                ancestors: self.open_dirs.clone(),
                end: 0,
            });
        }
        self.put(bytes)?;
        self.count += 1;
        if entry.has_bytes() {
            self.data += entry.size;
        }
        if entry.kind == Kind::Dir {
            self.open_dirs.push(entry.clone());
        }
        Ok(())
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.len += bytes.len() as u64;
        let spill_err = |e| Error::io("writing the catalog's spill file", e);
        match &mut self.spill {
            Some(f) => f.write_all(bytes).map_err(spill_err),
            None => {
                self.memory.extend_from_slice(bytes);
                if self.memory.len() > SPILL_AT {
                    let mut f = BufWriter::new(temp_file()?);
                    f.write_all(&self.memory).map_err(spill_err)?;
                    self.memory = Vec::new();
                    self.spill = Some(f);
                }
                Ok(())
            }
        }
    }

    /// Records pushed so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The finished catalog: terminator, record count, CRC; and its index.
    pub fn finish(mut self) -> Result<CatalogBytes> {
        let records_end = self.len;
        self.put(&[0])?;
        let count = self.count.to_le_bytes();
        self.put(&count)?;
        let crc = self.crc.to_le_bytes();
        self.put(&crc)?;
        let len = self.len;
        if let Some(last) = self.regions.last_mut() {
            last.end = records_end;
        }
        // The last region takes the trailer if it fits; else it is a
        // segment of its own.
        let mut segments = std::mem::take(&mut self.segments);
        let last = len - self.segment_start;
        if last <= self.max || records_end == self.segment_start {
            segments.push(Segment {
                len: last,
                whole: last <= self.max,
            });
        } else {
            segments.push(Segment {
                len: records_end - self.segment_start,
                whole: records_end - self.segment_start <= self.max,
            });
            segments.push(Segment {
                len: len - records_end,
                whole: true,
            });
        }
        let mut records = Vec::with_capacity(self.regions.len());
        for r in &self.regions {
            let record = postcard::to_stdvec(&(r, r.end))
                .map_err(|e| Error::Pipeline(format!("encoding the catalog's index: {e}")))?;
            if record.len() as u64 > MAX_INDEX_RECORD {
                return Err(Error::Pipeline(format!(
                    "the catalog's index record of {} takes {} bytes (at most {MAX_INDEX_RECORD})",
                    String::from_utf8_lossy(&r.path),
                    record.len()
                )));
            }
            records.push(record);
        }
        // Pages of at most `max` bytes where their records fit.
        let mut index = Vec::new();
        let mut pages = Vec::new();
        let mut k = 0;
        while k < records.len() {
            let first = k;
            let mut size = PAGE_FRAME;
            while k < records.len() {
                let add = varint_len(records[k].len() as u64) + records[k].len();
                if k > first && (size + add) as u64 > self.max {
                    break;
                }
                size += add;
                k += 1;
            }
            let start = index.len();
            index.extend_from_slice(INDEX_MAGIC);
            index.extend_from_slice(&CATALOG_VERSION.to_le_bytes());
            for record in &records[first..k] {
                push_varint(&mut index, record.len() as u64);
                index.extend_from_slice(record);
            }
            index.push(0);
            index.extend_from_slice(&((k - first) as u64).to_le_bytes());
            let crc = crc32c::crc32c(&index[start..]);
            index.extend_from_slice(&crc.to_le_bytes());
            let bytes = (index.len() - start) as u64;
            segments.push(Segment {
                len: bytes,
                whole: bytes <= self.max,
            });
            pages.push(IndexPage {
                path: hex::encode(&self.regions[first].path),
                bytes,
            });
        }
        let spill_err = |e| Error::io("reading the catalog's spill file", e);
        let input: Box<dyn Read + Send> = match self.spill {
            None => Box::new(std::io::Cursor::new(self.memory)),
            Some(f) => {
                let mut f = f.into_inner().map_err(|e| spill_err(e.into_error()))?;
                f.seek(SeekFrom::Start(0)).map_err(spill_err)?;
                Box::new(BufReader::new(f))
            }
        };
        let input = Box::new(input.chain(std::io::Cursor::new(index.clone())));
        Ok(CatalogBytes {
            input,
            len,
            index,
            pages,
            segments: segments.into(),
            left: 0,
            ending: false,
        })
    }
}

/// Refuses a catalog version this build does not read (it reads 1 to 3).
pub(crate) fn check_version(version: u32, name: &str) -> Result<()> {
    if version == 0 || version > CATALOG_VERSION {
        return Err(Error::UnsupportedVersion {
            object: name.to_string(),
            found: version,
            supported: CATALOG_VERSION,
        });
    }
    Ok(())
}

/// Bytes of `v` as a varint.
fn varint_len(v: u64) -> usize {
    (64 - v.leading_zeros()).max(1).div_ceil(7) as usize
}

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads framed records (docs/FORMAT.md §24.2) one by one: a whole frame
/// (header, records, terminator, count, CRC) or, for a region, records up to
/// the end of the input.
struct RecordReader<R> {
    input: R,
    name: String,
    crc: u32,
    count: u64,
    done: bool,
    /// A region: records without header and trailer, ending with the input.
    region: bool,
    /// A region's byte read ahead to find its end.
    peeked: Option<u8>,
    record: Vec<u8>,
    max: u64,
}

impl<R: Read> RecordReader<R> {
    /// Checks the header (`magic`, a version this build reads) and returns
    /// the reader positioned at the first record, with the version.
    fn framed(input: R, name: &str, magic: &[u8; 4]) -> Result<(Self, u32)> {
        let mut r = RecordReader {
            input,
            name: name.to_string(),
            crc: 0,
            count: 0,
            done: false,
            region: false,
            peeked: None,
            record: Vec::new(),
            max: MAX_RECORD,
        };
        let mut head = [0u8; 8];
        r.read_exact(&mut head)?;
        if &head[..4] != magic {
            return Err(Error::corrupt(&r.name, "bad magic"));
        }
        let version = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        check_version(version, &r.name)?;
        Ok((r, version))
    }

    /// Reads the next record into `record`; `false` after the last.
    fn next_record(&mut self) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        if self.region && self.at_end()? {
            self.done = true;
            return Ok(false);
        }
        let len = self.read_varint()?;
        if len == 0 {
            if self.region {
                return Err(Error::corrupt(&self.name, "a region holds the terminator"));
            }
            return self.finish().map(|()| false);
        }
        if len > self.max {
            return Err(Error::corrupt(
                &self.name,
                format!("record {} claims {len} bytes", self.count),
            ));
        }
        let mut record = std::mem::take(&mut self.record);
        record.resize(len as usize, 0);
        self.read_exact(&mut record)?;
        self.record = record;
        self.count += 1;
        Ok(true)
    }

    /// Whether a region's input is exhausted (its next byte, if any, is kept).
    fn at_end(&mut self) -> Result<bool> {
        let mut b = [0u8; 1];
        loop {
            match self.input.read(&mut b) {
                Ok(0) => return Ok(true),
                Ok(_) => {
                    self.peeked = Some(b[0]);
                    return Ok(false);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(format!("reading {}", self.name), e)),
            }
        }
    }

    fn finish(&mut self) -> Result<()> {
        let mut count = [0u8; 8];
        self.read_exact(&mut count)?;
        let expected = self.crc;
        let mut crc = [0u8; 4];
        self.read_exact(&mut crc)?;
        if u64::from_le_bytes(count) != self.count {
            return Err(Error::corrupt(
                &self.name,
                format!(
                    "{} records, the trailer says {}",
                    self.count,
                    u64::from_le_bytes(count)
                ),
            ));
        }
        if u32::from_le_bytes(crc) != expected {
            return Err(Error::corrupt(&self.name, "checksum mismatch"));
        }
        self.done = true;
        Ok(())
    }

    fn read_varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let mut b = [0u8; 1];
            self.read_exact(&mut b)?;
            v |= u64::from(b[0] & 0x7f) << shift;
            if b[0] & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Error::corrupt(&self.name, "over-long record length"))
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        // A region's first byte of a record may have been read ahead.
        let ahead = match (self.peeked, buf.first_mut()) {
            (Some(b), Some(first)) => {
                *first = b;
                self.peeked = None;
                1
            }
            _ => 0,
        };
        self.input
            .read_exact(&mut buf[ahead..])
            .map_err(|e| match e.kind() {
                ErrorKind::UnexpectedEof => Error::corrupt(&self.name, "truncated"),
                _ => Error::io(format!("reading {}", self.name), e),
            })?;
        self.crc = crc32c::crc32c_append(self.crc, buf);
        Ok(())
    }
}

/// Reads a catalog record by record from `input` (named `name` in errors).
pub struct CatalogReader<R> {
    records: RecordReader<R>,
    version: u32,
}

impl<R: Read> CatalogReader<R> {
    /// Checks the header and returns a reader positioned at the first record.
    pub fn new(input: R, name: &str) -> Result<Self> {
        let (mut records, version) = RecordReader::framed(input, name, MAGIC)?;
        if version == 1 {
            records.max = MAX_RECORD_V1;
        }
        Ok(CatalogReader { records, version })
    }

    /// A reader of the records of a region of a catalog of `version`
    /// (docs/FORMAT.md §24.4): `input` starts at a record and ends at one;
    /// no header, terminator or CRC.
    pub fn region(input: R, name: &str, version: u32) -> Result<Self> {
        check_version(version, name)?;
        let records = RecordReader {
            input,
            name: name.to_string(),
            crc: 0,
            count: 0,
            done: false,
            region: true,
            peeked: None,
            record: Vec::new(),
            max: if version == 1 {
                MAX_RECORD_V1
            } else {
                MAX_RECORD
            },
        };
        Ok(CatalogReader { records, version })
    }

    /// The bytes of the record [`Self::next_entry`] returned last, if the
    /// catalog is of this build's version (so that they are what encoding
    /// that entry gives).
    pub fn record(&self) -> Option<&[u8]> {
        (self.version == CATALOG_VERSION).then_some(&self.records.record[..])
    }

    /// The next entry, or `None` after the last (whose count and CRC are then checked).
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        let version = self.version;
        let count = self.records.count;
        if !self.records.next_record()? {
            return Ok(None);
        }
        let (record, name) = (&self.records.record, &self.records.name);
        let undecodable =
            |e: postcard::Error| Error::corrupt(name, format!("undecodable record {count}: {e}"));
        if version == 1 {
            let v1: EntryV1 = postcard::from_bytes(record).map_err(undecodable)?;
            if v1.kind as u8 > Kind::Gap as u8 {
                return Err(Error::corrupt(
                    name,
                    format!("record {count}: kind {:?} in a version-1 catalog", v1.kind),
                ));
            }
            Ok(Some(v1.into()))
        } else {
            postcard::from_bytes(record).map(Some).map_err(undecodable)
        }
    }
}

/// The regions of a catalog's index `bytes` (docs/FORMAT.md §24.4; named
/// `name` in errors): a version-3 index, or one page of a version-4 one,
/// checked to be of version `version` and whose offsets increase. A
/// version-3 region's `end` is the next one's offset (the last's:
/// `records_end`).
pub fn read_index(bytes: &[u8], name: &str, version: u32, records_end: u64) -> Result<Vec<Region>> {
    let (mut r, found) = RecordReader::framed(bytes, name, INDEX_MAGIC)?;
    if found != version {
        return Err(Error::corrupt(
            name,
            format!("index version {found}, the catalog's is {version}"),
        ));
    }
    r.max = MAX_INDEX_RECORD;
    let mut regions: Vec<Region> = Vec::new();
    while r.next_record()? {
        let undecodable =
            |e| Error::corrupt(name, format!("undecodable record {}: {e}", regions.len()));
        let region = match version {
            ..=3 => postcard::from_bytes::<Region>(&r.record).map_err(undecodable)?,
            _ => {
                let (mut region, end): (Region, u64) =
                    postcard::from_bytes(&r.record).map_err(undecodable)?;
                region.end = end;
                region
            }
        };
        if let Some(p) = regions.last_mut() {
            if p.offset >= region.offset {
                return Err(Error::corrupt(
                    name,
                    format!("region {} does not follow the one before", regions.len()),
                ));
            }
            if version <= 3 {
                p.end = region.offset;
            }
        }
        if region.end <= region.offset && version > 3 {
            return Err(Error::corrupt(
                name,
                format!("region {} ends before it starts", regions.len()),
            ));
        }
        regions.push(region);
    }
    if version <= 3 {
        if let Some(last) = regions.last_mut() {
            last.end = records_end;
        }
    }
    Ok(regions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes `c` feeds and its segments: (length, whole).
    fn fed(c: &mut CatalogBytes) -> (Vec<u8>, Vec<(usize, bool)>) {
        let mut buf = vec![0u8; REGION_MAX];
        let (mut bytes, mut segments) = (Vec::new(), Vec::new());
        let mut open = 0;
        while let Some(read) = c.feed(&mut buf).unwrap() {
            match read {
                SegmentRead::Data(n) => {
                    bytes.extend_from_slice(&buf[..n]);
                    open += n;
                }
                SegmentRead::SegmentEnd => segments.push((std::mem::take(&mut open), false)),
                SegmentRead::Whole(n) => {
                    assert_eq!(open, 0);
                    bytes.extend_from_slice(&buf[..n]);
                    segments.push((n, true));
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(open, 0);
        (bytes, segments)
    }

    fn finished(w: CatalogWriter) -> Vec<u8> {
        let mut c = w.finish().unwrap();
        let (mut bytes, _) = fed(&mut c);
        assert_eq!(bytes.len() as u64, c.len() + c.index.len() as u64);
        bytes.truncate(c.len() as usize);
        bytes
    }

    #[test]
    fn the_index_finds_each_region_with_its_ancestors_and_data_offset() {
        let mut w = CatalogWriter::new(4096);
        let mut entries = vec![entry(b"r", Kind::Dir, 0)];
        for d in 0..40 {
            entries.push(entry(format!("r/d{d:02}").as_bytes(), Kind::Dir, 0));
            for f in 0..100 {
                let path = format!("r/d{d:02}/f{f:03}-{}", "x".repeat(40));
                entries.push(entry(path.as_bytes(), Kind::File, f));
            }
        }
        for e in &entries {
            w.push(e).unwrap();
        }
        let mut c = w.finish().unwrap();
        let (mut bytes, segments) = fed(&mut c);
        let index = bytes.split_off(c.len() as usize);
        let records_end = bytes.len() - 13;
        // Every region and page is one whole segment of at most the
        // writer's maximum; the regions' segments start at their offsets.
        assert!(segments.iter().all(|&(n, whole)| whole && n <= 4096));
        assert_eq!(
            segments.len(),
            c.pages.len() + {
                let mut regions = 0;
                let mut at = 0;
                for p in &c.pages {
                    let page = &index[at..at + p.bytes as usize];
                    regions += read_index(page, "page", CATALOG_VERSION, 0).unwrap().len();
                    at += p.bytes as usize;
                }
                regions
            }
        );
        let mut regions = Vec::new();
        let mut at = 0;
        for p in &c.pages {
            let page = &index[at..at + p.bytes as usize];
            let mine = read_index(page, "page", CATALOG_VERSION, 0).unwrap();
            assert_eq!(hex::encode(&mine[0].path), p.path);
            regions.extend(mine);
            at += p.bytes as usize;
        }
        assert!(regions.len() > 3 && c.pages.len() > 1, "{}", regions.len());
        let mut segment_start = 0;
        for (k, r) in regions.iter().enumerate() {
            let end = r.end as usize;
            assert_eq!(
                end,
                regions
                    .get(k + 1)
                    .map_or(records_end, |n| n.offset as usize)
            );
            if k > 0 {
                assert_eq!(r.offset as usize, segment_start);
            }
            segment_start += segments[k].0;
            let at = r.entries as usize;
            let mut reader =
                CatalogReader::region(&bytes[r.offset as usize..end], "region", CATALOG_VERSION)
                    .unwrap();
            let mut read = Vec::new();
            while let Some(e) = reader.next_entry().unwrap() {
                read.push(e);
            }
            assert_eq!(read[..], entries[at..at + read.len()]);
            assert_eq!(r.path, entries[at].path);
            let data: u64 = entries[..at].iter().map(|e| e.size).sum();
            assert_eq!(r.data_offset, data);
            let ancestors: Vec<&Entry> = entries[..at]
                .iter()
                .filter(|e| is_ancestor(&e.path, &r.path))
                .collect();
            assert_eq!(r.ancestors.iter().collect::<Vec<_>>(), ancestors);
        }
        assert_eq!(segment_start, bytes.len());
        let mut bad = index.clone();
        bad[12] ^= 1;
        assert!(read_index(
            &bad[..c.pages[0].bytes as usize],
            "index",
            CATALOG_VERSION,
            0
        )
        .is_err());
    }

    #[test]
    fn varint_len_is_the_encoded_length() {
        for v in [0, 1, 127, 128, 16383, 16384, 1 << 20, u64::MAX] {
            let mut out = Vec::new();
            push_varint(&mut out, v);
            assert_eq!(varint_len(v), out.len(), "{v}");
        }
    }

    #[test]
    fn a_large_catalog_spills_and_reads_back() {
        let mut w = CatalogWriter::default();
        let n = 200_000u64;
        for i in 0..n {
            w.push(&entry(format!("d/file-{i:08}").as_bytes(), Kind::File, i))
                .unwrap();
        }
        assert!(w.spill.is_some() && w.memory.is_empty());
        let bytes = finished(w);
        let mut r = CatalogReader::new(&bytes[..], "big").unwrap();
        let mut i = 0;
        while let Some(e) = r.next_entry().unwrap() {
            assert_eq!(e.size, i);
            i += 1;
        }
        assert_eq!(i, n);
    }

    fn entry(path: &[u8], kind: Kind, size: u64) -> Entry {
        Entry {
            path: path.to_vec(),
            kind,
            mode: 0o640,
            uid: 1000,
            gid: 100,
            mtime: -5,
            mtime_ns: 999_999_999,
            ctime: 1_700_000_000,
            ctime_ns: 1,
            dev: 3,
            ino: u64::MAX,
            size,
            target: if kind == Kind::Symlink {
                b"../x".to_vec()
            } else {
                Vec::new()
            },
            ..Entry::default()
        }
    }

    #[test]
    fn version_1_records_read_as_version_2() {
        #[derive(Serialize)]
        struct V1<'a>(
            &'a [u8],
            Kind,
            u32,
            u32,
            u32,
            i64,
            u32,
            i64,
            u32,
            u64,
            u64,
            u64,
            &'a [u8],
        );
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        let rec = postcard::to_stdvec(&V1(
            b"a/b",
            Kind::File,
            0o644,
            1,
            2,
            7,
            8,
            9,
            10,
            11,
            12,
            13,
            b"",
        ))
        .unwrap();
        push_varint(&mut bytes, rec.len() as u64);
        bytes.extend_from_slice(&rec);
        bytes.push(0);
        bytes.extend_from_slice(&1u64.to_le_bytes());
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let mut r = CatalogReader::new(&bytes[..], "old").unwrap();
        let e = r.next_entry().unwrap().unwrap();
        assert_eq!(
            (e.path.as_slice(), e.kind, e.size),
            (&b"a/b"[..], Kind::File, 13)
        );
        assert_eq!((e.atime, e.atime_ns, e.mtime_ns), (7, 8, 8));
        assert!(e.xattrs.is_empty() && !e.sparse);
        assert!(r.next_entry().unwrap().is_none());
        let mut future = bytes.clone();
        future[4] = CATALOG_VERSION as u8 + 1;
        let err = CatalogReader::new(&future[..], "new").err().unwrap();
        assert!(
            matches!(err, Error::UnsupportedVersion { found, .. } if found == CATALOG_VERSION + 1),
            "{err}"
        );
    }

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let entries = vec![
            entry(b"home", Kind::Dir, 0),
            entry(b"home/\xff\xfename", Kind::File, 12),
            entry(b"home/link", Kind::Symlink, 0),
            entry(b"home/gone", Kind::Gap, 7),
            Entry {
                kind: Kind::CharDevice,
                rdev: 0x0103,
                user: b"root".to_vec(),
                sparse: true,
                xattrs: vec![Xattr {
                    name: b"user.x".to_vec(),
                    value: vec![0, 1, 2],
                }],
                ..entry(b"home/null", Kind::Dir, 0)
            },
        ];
        let mut w = CatalogWriter::default();
        for e in &entries {
            w.push(e).unwrap();
        }
        assert_eq!(w.count(), 5);
        let bytes = finished(w);
        let mut r = CatalogReader::new(&bytes[..], "catalog").unwrap();
        let mut read = Vec::new();
        while let Some(e) = r.next_entry().unwrap() {
            read.push(e);
        }
        assert_eq!(read, entries);
        assert!(r.next_entry().unwrap().is_none());

        for at in [0, 9, bytes.len() - 2] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            let mut r = match CatalogReader::new(&bad[..], "catalog") {
                Ok(r) => r,
                Err(e) => {
                    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
                    continue;
                }
            };
            let err = loop {
                match r.next_entry() {
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("damage at byte {at} went unnoticed"),
                    Err(e) => break e,
                }
            };
            assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        }
        let mut r = CatalogReader::new(&bytes[..bytes.len() - 1], "catalog").unwrap();
        let err = loop {
            match r.next_entry() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("a truncated catalog went unnoticed"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}
