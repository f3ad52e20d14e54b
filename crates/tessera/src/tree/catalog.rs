//! The catalog of a tree backup: one record per file-system object, written
//! after the files' bytes in the backup's stream and read back record by
//! record (docs/FORMAT.md §24.2).

use crate::error::{Error, Result};
use crate::snapshot::CATALOG_VERSION;
use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Read};

const MAGIC: &[u8; 4] = b"TCAT";
/// Largest record accepted (paths and link targets are at most a few KiB).
const MAX_RECORD: u64 = 65536;

/// What a catalog entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file; its bytes are in the stream.
    File,
    /// A symbolic link (stored, never followed).
    Symlink,
    /// Bytes of a file that failed while it was read: in the stream, never restored.
    Gap,
}

/// One file-system object of a tree backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Target of a symbolic link, empty otherwise.
    pub target: Vec<u8>,
}

impl Entry {
    /// Whether the entry's bytes are in the stream (a file or a gap).
    pub fn has_bytes(&self) -> bool {
        matches!(self.kind, Kind::File | Kind::Gap)
    }
}

/// Builds a catalog in memory, record by record.
pub struct CatalogWriter {
    bytes: Vec<u8>,
    count: u64,
}

impl Default for CatalogWriter {
    fn default() -> Self {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&CATALOG_VERSION.to_le_bytes());
        CatalogWriter { bytes, count: 0 }
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
        push_varint(&mut self.bytes, record.len() as u64);
        self.bytes.extend_from_slice(&record);
        self.count += 1;
        Ok(())
    }

    /// Records pushed so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The finished catalog: terminator, record count, CRC.
    pub fn finish(mut self) -> Vec<u8> {
        self.bytes.push(0);
        self.bytes.extend_from_slice(&self.count.to_le_bytes());
        let crc = crc32c::crc32c(&self.bytes);
        self.bytes.extend_from_slice(&crc.to_le_bytes());
        self.bytes
    }
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
        };
        let mut head = [0u8; 8];
        r.read_exact(&mut head)?;
        if &head[..4] != MAGIC {
            return Err(Error::corrupt(&r.name, "not a catalog (bad magic)"));
        }
        let version = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if version != CATALOG_VERSION {
            return Err(Error::UnsupportedVersion {
                object: r.name.clone(),
                found: version,
                supported: CATALOG_VERSION,
            });
        }
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
        if len > MAX_RECORD {
            return Err(Error::corrupt(
                &self.name,
                format!("record {} claims {len} bytes", self.count),
            ));
        }
        let mut record = std::mem::take(&mut self.record);
        record.resize(len as usize, 0);
        self.read_exact(&mut record)?;
        let entry: Entry = postcard::from_bytes(&record).map_err(|e| {
            Error::corrupt(
                &self.name,
                format!("undecodable record {}: {e}", self.count),
            )
        })?;
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
        }
    }

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let entries = vec![
            entry(b"home", Kind::Dir, 0),
            entry(b"home/\xff\xfename", Kind::File, 12),
            entry(b"home/link", Kind::Symlink, 0),
            entry(b"home/gone", Kind::Gap, 7),
        ];
        let mut w = CatalogWriter::default();
        for e in &entries {
            w.push(e).unwrap();
        }
        assert_eq!(w.count(), 4);
        let bytes = w.finish();
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
