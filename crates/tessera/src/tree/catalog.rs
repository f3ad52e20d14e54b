//! The catalog of a tree backup: one record per file-system object, written
//! after the files' bytes in the backup's stream and read back record by
//! record (docs/FORMAT.md §24.2).

use crate::error::{Error, Result};
use crate::snapshot::CATALOG_VERSION;
use crate::spill::temp_file;
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
    pub name: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
}

/// One file-system object of a tree backup (catalog version 2; a version-1
/// record reads with the fields after `target` empty, `atime` = `mtime`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Absolute path without the leading `/`, as bytes.
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
    pub target: Vec<u8>,
    /// Access time: seconds since the epoch.
    pub atime: i64,
    /// Nanoseconds of the access time.
    pub atime_ns: u32,
    /// Name of the owner on the backed-up host (empty if unknown).
    pub user: Vec<u8>,
    /// Name of the group (empty if unknown).
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

/// Builds a catalog record by record: in memory up to a few MiB, then in an
/// unnamed temporary file, so a backup's memory does not grow with its tree.
pub struct CatalogWriter {
    memory: Vec<u8>,
    spill: Option<BufWriter<File>>,
    crc: u32,
    len: u64,
    count: u64,
}

impl Default for CatalogWriter {
    fn default() -> Self {
        let mut w = CatalogWriter {
            memory: Vec::new(),
            spill: None,
            crc: 0,
            len: 0,
            count: 0,
        };
        w.memory.extend_from_slice(MAGIC);
        w.memory.extend_from_slice(&CATALOG_VERSION.to_le_bytes());
        w.crc = crc32c::crc32c(&w.memory);
        w.len = w.memory.len() as u64;
        w
    }
}

/// A finished catalog, to be read once from its start.
pub struct CatalogBytes {
    input: Box<dyn Read + Send>,
    len: u64,
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

impl Read for CatalogBytes {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl CatalogWriter {
    /// Appends one record.
    pub fn push(&mut self, entry: &Entry) -> Result<()> {
        let record = postcard::to_stdvec(entry).map_err(|e| {
            Error::Pipeline(format!(
                "encoding the catalog entry of {}: {e}",
                String::from_utf8_lossy(&entry.path)
            ))
        })?;
        if record.len() as u64 > MAX_RECORD {
            return Err(Error::Pipeline(format!(
                "catalog entry of {} takes {} bytes (at most {MAX_RECORD})",
                String::from_utf8_lossy(&entry.path),
                record.len()
            )));
        }
        let mut len = Vec::with_capacity(4);
        push_varint(&mut len, record.len() as u64);
        self.put(&len)?;
        self.put(&record)?;
        self.count += 1;
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

    /// The finished catalog: terminator, record count, CRC.
    pub fn finish(mut self) -> Result<CatalogBytes> {
        self.put(&[0])?;
        let count = self.count.to_le_bytes();
        self.put(&count)?;
        let crc = self.crc.to_le_bytes();
        self.put(&crc)?;
        let len = self.len;
        let spill_err = |e| Error::io("reading the catalog's spill file", e);
        let input: Box<dyn Read + Send> = match self.spill {
            None => Box::new(std::io::Cursor::new(self.memory)),
            Some(f) => {
                let mut f = f.into_inner().map_err(|e| spill_err(e.into_error()))?;
                f.seek(SeekFrom::Start(0)).map_err(spill_err)?;
                Box::new(BufReader::new(f))
            }
        };
        Ok(CatalogBytes { input, len })
    }
}

/// Refuses a catalog version this build does not read (it reads 1 and 2).
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

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a catalog record by record from `input` (named `name` in errors).
pub struct CatalogReader<R> {
    input: R,
    name: String,
    crc: u32,
    count: u64,
    done: bool,
    record: Vec<u8>,
    version: u32,
}

impl<R: Read> CatalogReader<R> {
    /// Checks the header and returns a reader positioned at the first record.
    pub fn new(input: R, name: &str) -> Result<Self> {
        let mut r = CatalogReader {
            input,
            name: name.to_string(),
            crc: 0,
            count: 0,
            done: false,
            record: Vec::new(),
            version: CATALOG_VERSION,
        };
        let mut head = [0u8; 8];
        r.read_exact(&mut head)?;
        if &head[..4] != MAGIC {
            return Err(Error::corrupt(&r.name, "not a catalog (bad magic)"));
        }
        r.version = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        check_version(r.version, &r.name)?;
        Ok(r)
    }

    /// The next entry, or `None` after the last (whose count and CRC are then checked).
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        if self.done {
            return Ok(None);
        }
        let len = self.read_varint()?;
        if len == 0 {
            return self.finish().map(|()| None);
        }
        let max = if self.version == 1 {
            MAX_RECORD_V1
        } else {
            MAX_RECORD
        };
        if len > max {
            return Err(Error::corrupt(
                &self.name,
                format!("record {} claims {len} bytes", self.count),
            ));
        }
        let mut record = std::mem::take(&mut self.record);
        record.resize(len as usize, 0);
        self.read_exact(&mut record)?;
        let undecodable = |e: postcard::Error| {
            Error::corrupt(
                &self.name,
                format!("undecodable record {}: {e}", self.count),
            )
        };
        let entry: Entry = if self.version == 1 {
            let v1: EntryV1 = postcard::from_bytes(&record).map_err(undecodable)?;
            if v1.kind as u8 > Kind::Gap as u8 {
                return Err(Error::corrupt(
                    &self.name,
                    format!(
                        "record {}: kind {:?} in a version-1 catalog",
                        self.count, v1.kind
                    ),
                ));
            }
            v1.into()
        } else {
            postcard::from_bytes(&record).map_err(undecodable)?
        };
        self.record = record;
        self.count += 1;
        Ok(Some(entry))
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
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => Error::corrupt(&self.name, "truncated"),
            _ => Error::io(format!("reading {}", self.name), e),
        })?;
        self.crc = crc32c::crc32c_append(self.crc, buf);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(w: CatalogWriter) -> Vec<u8> {
        let mut c = w.finish().unwrap();
        let mut bytes = Vec::new();
        c.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, c.len());
        bytes
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
        future[4] = 3;
        let err = CatalogReader::new(&future[..], "new").err().unwrap();
        assert!(
            matches!(err, Error::UnsupportedVersion { found: 3, .. }),
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
