//! The log-structured metadata array of the lazy and eager indexes (Ma et
//! al., "Lazy exact deduplication", §4.2.2): every chunk a backup offers,
//! unique or duplicate, in arrival order, with the container holding it.
//! Entries are addressed by their position in the log; prefetching reads a
//! run of consecutive entries, so chunks that arrived together are cached
//! together (docs/FORMAT.md, "Lazy index").
//!
//! The log of one *generation* is split into segment objects
//! `{prefix}/l{generation:016x}.{segment:08x}` of [`SEGMENT_PAGES`] pages.
//! A page is [`PAGE_BYTES`] bytes: an entry count (u32), up to
//! [`PAGE_ENTRIES`] entries of fingerprint (32 bytes) + container id (u64),
//! zero padding, and a CRC-32C of the generation (u64), the page's index in
//! the log (u64) and the page's bytes `0..PAGE_BYTES-4`. Every page but the
//! last of the log is full. Only positions below the length recorded in the
//! index manifest are valid; appending rewrites the last, partly filled
//! segment whole (objects are written atomically), streamed a segment at a
//! time ([`Appender`]).

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use crate::format::envelope::{le4, le8};
use crate::layout::container::ContainerId;

/// Bytes of a log page.
pub const PAGE_BYTES: usize = 4096;
/// Bytes of one entry: fingerprint and container id.
const ENTRY_LEN: usize = FINGERPRINT_LEN + 8;
/// Entries per page.
pub const PAGE_ENTRIES: u64 = ((PAGE_BYTES - 8) / ENTRY_LEN) as u64;
/// Pages per segment object (1 MiB segments).
pub const SEGMENT_PAGES: u64 = 256;
/// Entries per segment object.
pub const SEGMENT_ENTRIES: u64 = PAGE_ENTRIES * SEGMENT_PAGES;

/// One log entry: a chunk's fingerprint and the container that holds it.
pub type Entry = (Fingerprint, ContainerId);

/// Key of segment `segment` of log generation `generation` under `prefix`.
pub fn segment_key(prefix: &str, generation: u64, segment: u64) -> String {
    format!("{prefix}/l{generation:016x}.{segment:08x}")
}

/// The log generation of an object name (without the prefix), if it is a segment.
pub fn segment_generation(name: &str) -> Option<u64> {
    let (g, s) = name.strip_prefix('l')?.split_once('.')?;
    if g.len() != 16 || s.len() != 8 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()?;
    u64::from_str_radix(g, 16).ok()
}

fn page_crc(generation: u64, page: u64, body: &[u8]) -> u32 {
    let mut seed = [0u8; 16];
    seed[..8].copy_from_slice(&generation.to_le_bytes());
    seed[8..].copy_from_slice(&page.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&seed), body)
}

/// A readable, appendable log generation of `len` entries.
#[derive(Clone, Debug)]
pub struct MetaLog {
    prefix: String,
    generation: u64,
    len: u64,
}

impl MetaLog {
    /// The log of `generation` under `prefix` holding `len` valid entries.
    pub fn new(prefix: &str, generation: u64, len: u64) -> MetaLog {
        MetaLog {
            prefix: prefix.to_string(),
            generation,
            len,
        }
    }

    /// Entries in the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Entries `start..start+count` (clamped to the log), one ranged read
    /// per segment touched; returns the entries and the number of reads.
    pub fn read(&self, backend: &dyn Backend, start: u64, count: u64) -> Result<(Vec<Entry>, u64)> {
        let end = start.saturating_add(count).min(self.len);
        let mut out = Vec::with_capacity(end.saturating_sub(start) as usize);
        let mut reads = 0;
        let mut pos = start;
        while pos < end {
            let segment = pos / SEGMENT_ENTRIES;
            let seg_end = ((segment + 1) * SEGMENT_ENTRIES).min(end);
            let first_page = pos / PAGE_ENTRIES;
            let last_page = (seg_end - 1) / PAGE_ENTRIES;
            let key = segment_key(&self.prefix, self.generation, segment);
            let offset = (first_page - segment * SEGMENT_PAGES) * PAGE_BYTES as u64;
            let bytes = backend.read_range(
                &key,
                offset,
                (last_page - first_page + 1) * PAGE_BYTES as u64,
            )?;
            reads += 1;
            for (i, page) in bytes.chunks(PAGE_BYTES).enumerate() {
                let index = first_page + i as u64;
                let entries = self.decode_page(&key, index, page)?;
                let page_start = index * PAGE_ENTRIES;
                for (j, e) in entries.into_iter().enumerate() {
                    let p = page_start + j as u64;
                    if p >= pos && p < seg_end {
                        out.push(e);
                    }
                }
            }
            if out.len() as u64 != seg_end - start {
                return Err(Error::corrupt(
                    key,
                    format!("log entries {pos}..{seg_end} missing"),
                ));
            }
            pos = seg_end;
        }
        Ok((out, reads))
    }

    fn decode_page(&self, key: &str, index: u64, page: &[u8]) -> Result<Vec<Entry>> {
        if page.len() != PAGE_BYTES {
            return Err(Error::corrupt(key, format!("log page {index} truncated")));
        }
        let end = PAGE_BYTES - 4;
        if page_crc(self.generation, index, &page[..end]) != u32::from_le_bytes(le4(&page[end..])) {
            return Err(Error::corrupt(
                key,
                format!("log page {index} checksum mismatch"),
            ));
        }
        let count = u64::from(u32::from_le_bytes(le4(page)));
        if count > PAGE_ENTRIES {
            return Err(Error::corrupt(
                key,
                format!("log page {index} count {count} too large"),
            ));
        }
        Ok(page[4..4 + count as usize * ENTRY_LEN]
            .chunks_exact(ENTRY_LEN)
            .map(|e| {
                let mut fp = [0u8; FINGERPRINT_LEN];
                fp.copy_from_slice(&e[..FINGERPRINT_LEN]);
                (
                    Fingerprint(fp),
                    u64::from_le_bytes(le8(&e[FINGERPRINT_LEN..])),
                )
            })
            .collect())
    }

    /// Appends `entries` (rewriting the last partly filled segment); the new
    /// length is durable once the caller records it in its manifest.
    pub fn append(&mut self, backend: &dyn Backend, entries: &[Entry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut appender = self.appender(backend)?;
        for &e in entries {
            appender.push(e)?;
        }
        appender.finish()
    }

    /// A streamed append: entries pushed to it are written a segment at a
    /// time (the same objects [`MetaLog::append`] writes), so that only one
    /// segment's entries are held in memory.
    pub fn appender<'a>(&'a mut self, backend: &'a dyn Backend) -> Result<Appender<'a>> {
        let segment = self.len / SEGMENT_ENTRIES;
        let segment_start = segment * SEGMENT_ENTRIES;
        let (pending, _) = self.read(backend, segment_start, self.len - segment_start)?;
        Ok(Appender {
            log: self,
            backend,
            segment,
            pending,
            pushed: 0,
        })
    }

    fn write_segment(&self, backend: &dyn Backend, segment: u64, run: &[Entry]) -> Result<()> {
        let mut bytes = Vec::with_capacity(run.len().div_ceil(PAGE_ENTRIES as usize) * PAGE_BYTES);
        for (j, page_entries) in run.chunks(PAGE_ENTRIES as usize).enumerate() {
            let index = segment * SEGMENT_PAGES + j as u64;
            let start = bytes.len();
            bytes.extend_from_slice(&(page_entries.len() as u32).to_le_bytes());
            for (fp, c) in page_entries {
                bytes.extend_from_slice(&fp.0);
                bytes.extend_from_slice(&c.to_le_bytes());
            }
            bytes.resize(start + PAGE_BYTES - 4, 0);
            let crc = page_crc(self.generation, index, &bytes[start..]);
            bytes.extend_from_slice(&crc.to_le_bytes());
        }
        backend.write(&segment_key(&self.prefix, self.generation, segment), &bytes)
    }
}

/// A streamed append to a [`MetaLog`] ([`MetaLog::appender`]).
pub struct Appender<'a> {
    log: &'a mut MetaLog,
    backend: &'a dyn Backend,
    /// The segment `pending` fills.
    segment: u64,
    /// Entries of that segment (its old entries first).
    pending: Vec<Entry>,
    pushed: u64,
}

impl Appender<'_> {
    /// Appends one entry; writes its segment once full.
    pub fn push(&mut self, entry: Entry) -> Result<()> {
        self.pending.push(entry);
        self.pushed += 1;
        if self.pending.len() as u64 == SEGMENT_ENTRIES {
            self.log
                .write_segment(self.backend, self.segment, &self.pending)?;
            self.segment += 1;
            self.pending.clear();
        }
        Ok(())
    }

    /// Writes the last, partly filled segment; the log's length then counts
    /// the pushed entries.
    pub fn finish(self) -> Result<()> {
        if self.pushed == 0 {
            return Ok(());
        }
        if !self.pending.is_empty() {
            self.log
                .write_segment(self.backend, self.segment, &self.pending)?;
        }
        self.log.len += self.pushed;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Local, ObjectStore};

    fn entry(i: u64) -> Entry {
        let mut fp = [0u8; FINGERPRINT_LEN];
        fp[..8].copy_from_slice(&i.to_le_bytes());
        fp[31] = 7;
        (Fingerprint(fp), i * 3)
    }

    #[test]
    fn appends_and_reads_across_pages_and_segments() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Local::new(dir.path());
        let mut log = MetaLog::new("index/lazy", 1, 0);
        let all: Vec<Entry> = (0..SEGMENT_ENTRIES + 500).map(entry).collect();
        log.append(&backend, &all[..150]).unwrap();
        log.append(&backend, &all[150..SEGMENT_ENTRIES as usize - 3])
            .unwrap();
        log.append(&backend, &all[SEGMENT_ENTRIES as usize - 3..])
            .unwrap();
        assert_eq!(log.len(), all.len() as u64);
        let (got, reads) = log.read(&backend, 0, log.len()).unwrap();
        assert_eq!(got, all);
        assert_eq!(reads, 2);
        let (got, reads) = log.read(&backend, SEGMENT_ENTRIES - 10, 20).unwrap();
        assert_eq!(
            got,
            all[SEGMENT_ENTRIES as usize - 10..SEGMENT_ENTRIES as usize + 10]
        );
        assert_eq!(reads, 2);
        let (got, _) = log.read(&backend, 100, 5).unwrap();
        assert_eq!(got, all[100..105]);
        // Reads past the end are clamped.
        let (got, _) = log.read(&backend, log.len() - 2, 100).unwrap();
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn damaged_page_is_reported_with_its_object() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Local::new(dir.path());
        let mut log = MetaLog::new("index/lazy", 2, 0);
        let all: Vec<Entry> = (0..300).map(entry).collect();
        log.append(&backend, &all).unwrap();
        let key = segment_key("index/lazy", 2, 0);
        let mut bytes = backend.read(&key).unwrap();
        bytes[PAGE_BYTES + 10] ^= 1;
        backend.write(&key, &bytes).unwrap();
        let err = log.read(&backend, 110, 1).unwrap_err().to_string();
        assert!(err.contains(&key) && err.contains("page 1"), "{err}");
        // Other pages still read.
        assert_eq!(log.read(&backend, 5, 1).unwrap().0, vec![entry(5)]);
    }

    #[test]
    fn segment_names_parse() {
        assert_eq!(segment_generation("l000000000000000a.00000003"), Some(10));
        assert_eq!(segment_generation("t000000000000000a.000003"), None);
        assert_eq!(segment_generation("manifest"), None);
    }
}
