//! An on-disk fingerprint table: a bucketed hash table of (fingerprint,
//! container id) entries stored as repository objects and read only through
//! the [`Backend`], so that every lookup is a counted ranged read
//! (docs/FORMAT.md, "Fingerprint table").
//!
//! The table has `buckets` fixed-size buckets; fingerprint `fp` lives in
//! bucket `(fp.key64() * buckets) >> 64` (the multiply-shift range reduction:
//! as uniform as `key64 % buckets`, but monotone in the key, so the buckets
//! partition the key space into consecutive ranges and the whole table is
//! sorted by key). Entries inside a bucket are sorted by (key, fingerprint).
//! Looking one fingerprint up is one ranged read of its bucket.
//!
//! A table of one *generation* is split into *parts* of `part_buckets`
//! buckets, one object each (`{prefix}/t{generation:016x}.{part:06x}`), so
//! that writing a table never holds more than one part in memory. Tables are
//! immutable: an update writes a new generation by merging the old table
//! (read sequentially, part by part) with the new entries, which are sorted
//! the same way, in one streaming pass ([`TableWriter`]).
//!
//! Part layout: a 64-byte header, then the buckets back to back.
//!
//! ```text
//! header: 0 magic "TSIT" | 4 version u32 | 8 generation u64 | 16 part u64
//!         24 first bucket u64 | 32 buckets in this part u64 | 40 buckets in the table u64
//!         48 bucket bytes u32 | 52 buckets per part u32 | 56 reserved u32 (0)
//!         60 CRC-32C of bytes 0..60
//! bucket: 0 entry count u32 | 4 entries, each fingerprint [u8; 32] + container id u64
//!         | zero padding | B-4 CRC-32C
//! ```
//!
//! A bucket's CRC-32C covers the generation (u64 LE) and the bucket's index
//! in the table (u64 LE) followed by bytes `0..B-4` of the bucket, so a
//! bucket of another generation or position fails its check. All integers
//! are little-endian.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use crate::format::envelope::{le4, le8};
use crate::layout::container::ContainerId;

/// Format version of table parts.
pub const TABLE_VERSION: u32 = 1;
const MAGIC: &[u8; 4] = b"TSIT";
/// Bytes of a part header.
pub const PART_HEADER_LEN: usize = 64;
/// Bytes of one entry: fingerprint and container id.
pub const ENTRY_LEN: usize = FINGERPRINT_LEN + 8;
/// Bytes of a bucket that are not entries: the count and the checksum.
const BUCKET_OVERHEAD: usize = 8;
/// Smallest bucket: room for one entry.
pub const MIN_BUCKET_BYTES: u32 = (BUCKET_OVERHEAD + ENTRY_LEN) as u32;
/// Largest bucket.
pub const MAX_BUCKET_BYTES: u32 = 1 << 20;
/// Default buckets per part object (16 MiB parts with 4 KiB buckets).
pub const DEFAULT_PART_BUCKETS: u32 = 4096;
/// Buckets read per request when scanning a table sequentially.
const SCAN_WINDOW_BYTES: usize = 1 << 20;
/// Fraction of bucket capacity a freshly written table fills on average: at
/// one half, a 102-entry bucket overflows with probability below 1e-11.
const TARGET_LOAD: f64 = 0.5;

/// Sort key of an entry: table order.
pub fn order_key(fp: &Fingerprint) -> (u64, Fingerprint) {
    (fp.key64(), *fp)
}

/// The shape of one table generation, as recorded by its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableMeta {
    /// Generation: names the part objects.
    pub generation: u64,
    /// Number of buckets (at least 1).
    pub buckets: u64,
    /// Bytes per bucket.
    pub bucket_bytes: u32,
    /// Buckets per part object.
    pub part_buckets: u32,
    /// Entries in the table.
    pub entries: u64,
}

impl TableMeta {
    /// Entries one bucket holds.
    pub fn capacity(&self) -> usize {
        bucket_capacity(self.bucket_bytes)
    }

    /// Number of part objects.
    pub fn parts(&self) -> u64 {
        self.buckets.div_ceil(u64::from(self.part_buckets.max(1)))
    }

    /// Bytes of all parts together.
    pub fn total_bytes(&self) -> u64 {
        (self.parts().saturating_mul(PART_HEADER_LEN as u64))
            .saturating_add(self.buckets.saturating_mul(u64::from(self.bucket_bytes)))
    }

    /// The bucket of a fingerprint.
    pub fn bucket_of(&self, fp: &Fingerprint) -> u64 {
        bucket_of_key(fp.key64(), self.buckets)
    }

    /// Checks that the shape is one this code can read.
    pub fn validate(&self, name: &str) -> Result<()> {
        if self.buckets == 0
            || self.part_buckets == 0
            || !(MIN_BUCKET_BYTES..=MAX_BUCKET_BYTES).contains(&self.bucket_bytes)
            || self.entries > self.buckets.saturating_mul(self.capacity() as u64)
        {
            return Err(Error::corrupt(
                name,
                format!("impossible table shape {self:?}"),
            ));
        }
        Ok(())
    }
}

/// Entries one bucket of `bucket_bytes` holds.
pub fn bucket_capacity(bucket_bytes: u32) -> usize {
    (bucket_bytes as usize).saturating_sub(BUCKET_OVERHEAD) / ENTRY_LEN
}

/// Times a table may double its bucket count after an overflow before the
/// write fails: only many distinct fingerprints sharing one 64-bit key (their
/// first 16 bytes) can need more.
pub const MAX_DOUBLINGS: u32 = 16;

/// The bucket count after an overflow with `buckets` buckets, the `doublings`-th time.
pub fn grow(buckets: u64, doublings: u32) -> Result<u64> {
    if doublings >= MAX_DOUBLINGS {
        return Err(Error::Pipeline(format!(
            "fingerprint table: a bucket still overflows with {buckets} buckets \
             (too many fingerprints share their first 16 bytes; use larger buckets)"
        )));
    }
    Ok(buckets.saturating_mul(2))
}

/// Bucket count for about `entries` entries at the target load.
pub fn buckets_for(entries: u64, bucket_bytes: u32) -> u64 {
    let per_bucket = (bucket_capacity(bucket_bytes) as f64 * TARGET_LOAD).max(1.0);
    ((entries as f64 / per_bucket).ceil() as u64).max(1)
}

fn bucket_of_key(key: u64, buckets: u64) -> u64 {
    ((u128::from(key) * u128::from(buckets)) >> 64) as u64
}

/// Bytes of the head every table-owning index manifest starts with.
pub const MANIFEST_HEAD_LEN: usize = 40;

/// Appends a manifest head (docs/FORMAT.md §10.2): generation,
/// `next_container`, buckets, entries (u64 LE each), bucket bytes and
/// buckets per part (u32 LE each).
pub fn encode_manifest_head(meta: &TableMeta, next_container: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&meta.generation.to_le_bytes());
    out.extend_from_slice(&next_container.to_le_bytes());
    out.extend_from_slice(&meta.buckets.to_le_bytes());
    out.extend_from_slice(&meta.entries.to_le_bytes());
    out.extend_from_slice(&meta.bucket_bytes.to_le_bytes());
    out.extend_from_slice(&meta.part_buckets.to_le_bytes());
}

/// Parses and validates the head of manifest `key`: (table shape, next container).
pub fn decode_manifest_head(key: &str, p: &[u8]) -> Result<(TableMeta, u64)> {
    if p.len() < MANIFEST_HEAD_LEN {
        return Err(Error::corrupt(key, "truncated manifest"));
    }
    let meta = TableMeta {
        generation: u64::from_le_bytes(le8(&p[0..8])),
        buckets: u64::from_le_bytes(le8(&p[16..24])),
        entries: u64::from_le_bytes(le8(&p[24..32])),
        bucket_bytes: u32::from_le_bytes(le4(&p[32..36])),
        part_buckets: u32::from_le_bytes(le4(&p[36..40])),
    };
    meta.validate(key)?;
    Ok((meta, u64::from_le_bytes(le8(&p[8..16]))))
}

/// Appends a list of ids: their count (u64 LE), then each (u64 LE).
pub fn encode_ids(ids: &[u64], out: &mut Vec<u8>) {
    out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
}

/// Parses a list written by [`encode_ids`] that ends object `key`.
pub fn decode_ids(key: &str, p: &[u8]) -> Result<Vec<u64>> {
    let count = p.get(..8).map(|c| u64::from_le_bytes(le8(c)));
    let body = p.get(8..).unwrap_or_default();
    if count.is_none_or(|n| body.len() as u64 != n.saturating_mul(8)) {
        return Err(Error::corrupt(
            key,
            "container list does not match its size",
        ));
    }
    Ok(body
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(le8(c)))
        .collect())
}

/// Object key of part `part` of generation `generation` under `prefix`.
pub fn part_key(prefix: &str, generation: u64, part: u64) -> String {
    format!("{prefix}/t{generation:016x}.{part:06x}")
}

/// Parses a part object name (without the prefix) into (generation, part).
pub fn parse_part_name(name: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix('t')?;
    let (g, p) = rest.split_once('.')?;
    if g.len() != 16 || p.len() != 6 {
        return None;
    }
    Some((
        u64::from_str_radix(g, 16).ok()?,
        u64::from_str_radix(p, 16).ok()?,
    ))
}

fn bucket_crc(generation: u64, index: u64, body: &[u8]) -> u32 {
    let mut seed = [0u8; 16];
    seed[..8].copy_from_slice(&generation.to_le_bytes());
    seed[8..].copy_from_slice(&index.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&seed), body)
}

/// A readable table generation.
pub struct Table {
    prefix: String,
    meta: TableMeta,
}

impl Table {
    /// The table `meta` under `prefix` (nothing is read until it is used).
    pub fn new(prefix: &str, meta: TableMeta) -> Table {
        Table {
            prefix: prefix.to_string(),
            meta,
        }
    }

    /// Its shape.
    pub fn meta(&self) -> &TableMeta {
        &self.meta
    }

    /// Object key of part `part`.
    pub fn part_key(&self, part: u64) -> String {
        part_key(&self.prefix, self.meta.generation, part)
    }

    fn locate(&self, bucket: u64) -> (String, u64) {
        let pb = u64::from(self.meta.part_buckets);
        let offset = PART_HEADER_LEN as u64 + (bucket % pb) * u64::from(self.meta.bucket_bytes);
        (self.part_key(bucket / pb), offset)
    }

    /// The container the table records for `fp`: one ranged read of its bucket.
    pub fn lookup(&self, backend: &dyn Backend, fp: &Fingerprint) -> Result<Option<ContainerId>> {
        let bucket = self.meta.bucket_of(fp);
        let entries = self.read_bucket(backend, bucket)?;
        Ok(entries.iter().find(|e| e.0 == *fp).map(|e| e.1))
    }

    /// The entries of the buckets in `first..first+count` for which
    /// `wanted` holds (only those are checked and decoded): one ranged read
    /// of the whole run per part touched; returns the entries and the number
    /// of reads.
    pub fn read_buckets(
        &self,
        backend: &dyn Backend,
        first: u64,
        count: u64,
        wanted: impl Fn(u64) -> bool,
    ) -> Result<(Vec<(Fingerprint, ContainerId)>, u64)> {
        let end = first.saturating_add(count).min(self.meta.buckets);
        let b = u64::from(self.meta.bucket_bytes);
        let pb = u64::from(self.meta.part_buckets);
        let mut out = Vec::new();
        let mut reads = 0;
        let mut bucket = first;
        while bucket < end {
            let run = (pb - bucket % pb).min(end - bucket);
            let (key, offset) = self.locate(bucket);
            let bytes = backend.read_range(&key, offset, run * b)?;
            reads += 1;
            if bytes.len() as u64 != run * b {
                return Err(Error::corrupt(key, format!("bucket {bucket} truncated")));
            }
            for (i, one) in bytes.chunks_exact(b as usize).enumerate() {
                let index = bucket + i as u64;
                if wanted(index) {
                    self.decode_bucket(&key, index, one, &mut out)?;
                }
            }
            bucket += run;
        }
        Ok((out, reads))
    }

    /// The entries of bucket `bucket` (one ranged read).
    pub fn read_bucket(
        &self,
        backend: &dyn Backend,
        bucket: u64,
    ) -> Result<Vec<(Fingerprint, ContainerId)>> {
        let (key, offset) = self.locate(bucket);
        let b = u64::from(self.meta.bucket_bytes);
        let bytes = backend.read_range(&key, offset, b)?;
        if bytes.len() as u64 != b {
            return Err(Error::corrupt(key, format!("bucket {bucket} truncated")));
        }
        let mut out = Vec::new();
        self.decode_bucket(&key, bucket, &bytes, &mut out)?;
        Ok(out)
    }

    fn decode_bucket(
        &self,
        key: &str,
        bucket: u64,
        bytes: &[u8],
        out: &mut Vec<(Fingerprint, ContainerId)>,
    ) -> Result<()> {
        let end = bytes.len() - 4;
        if bucket_crc(self.meta.generation, bucket, &bytes[..end])
            != u32::from_le_bytes(le4(&bytes[end..]))
        {
            return Err(Error::corrupt(
                key,
                format!("bucket {bucket} checksum mismatch"),
            ));
        }
        let count = u32::from_le_bytes(le4(bytes)) as usize;
        if count > self.meta.capacity() {
            return Err(Error::corrupt(
                key,
                format!("bucket {bucket} count {count} too large"),
            ));
        }
        for e in bytes[4..4 + count * ENTRY_LEN].chunks_exact(ENTRY_LEN) {
            let mut fp = [0u8; FINGERPRINT_LEN];
            fp.copy_from_slice(&e[..FINGERPRINT_LEN]);
            let fp = Fingerprint(fp);
            if self.meta.bucket_of(&fp) != bucket {
                return Err(Error::corrupt(
                    key,
                    format!("bucket {bucket} holds a foreign entry"),
                ));
            }
            out.push((fp, u64::from_le_bytes(le8(&e[FINGERPRINT_LEN..]))));
        }
        Ok(())
    }

    fn check_part_header(&self, key: &str, part: u64, bytes: &[u8]) -> Result<()> {
        if bytes.len() < PART_HEADER_LEN {
            return Err(Error::corrupt(key, "truncated table header"));
        }
        if &bytes[..4] != MAGIC {
            return Err(Error::corrupt(key, "bad magic (not a fingerprint table)"));
        }
        if crc32c::crc32c(&bytes[..60]) != u32::from_le_bytes(le4(&bytes[60..64])) {
            return Err(Error::corrupt(key, "table header checksum mismatch"));
        }
        let version = u32::from_le_bytes(le4(&bytes[4..8]));
        if version != TABLE_VERSION {
            return Err(Error::UnsupportedVersion {
                object: key.to_string(),
                found: version,
                supported: TABLE_VERSION,
            });
        }
        let (first, count) = part_range(&self.meta, part);
        let m = &self.meta;
        let fields_match = u64::from_le_bytes(le8(&bytes[8..16])) == m.generation
            && u64::from_le_bytes(le8(&bytes[16..24])) == part
            && u64::from_le_bytes(le8(&bytes[24..32])) == first
            && u64::from_le_bytes(le8(&bytes[32..40])) == count
            && u64::from_le_bytes(le8(&bytes[40..48])) == m.buckets
            && u32::from_le_bytes(le4(&bytes[48..52])) == m.bucket_bytes
            && u32::from_le_bytes(le4(&bytes[52..56])) == m.part_buckets;
        if !fields_match {
            return Err(Error::corrupt(
                key,
                "table header does not match the index manifest",
            ));
        }
        Ok(())
    }

    /// Calls `f` with every entry in table order, reading the parts
    /// sequentially in windows of about 1 MiB (headers checked too).
    pub fn scan(
        &self,
        backend: &dyn Backend,
        mut f: impl FnMut(Fingerprint, ContainerId) -> Result<()>,
    ) -> Result<()> {
        let mut cursor = self.cursor(backend);
        while let Some((fp, c)) = cursor.next()? {
            f(fp, c)?;
        }
        Ok(())
    }

    /// A reader of every entry in table order, one window of about 1 MiB
    /// in memory at a time (for merging several tables in one pass).
    pub fn cursor<'a>(&'a self, backend: &'a dyn Backend) -> Cursor<'a> {
        Cursor {
            table: self,
            backend,
            part: 0,
            done: 0,
            entries: std::collections::VecDeque::new(),
            seen: 0,
            finished: false,
        }
    }

    /// Deletes the table's part objects.
    pub fn delete(&self, backend: &dyn Backend) -> Result<()> {
        for part in 0..self.meta.parts() {
            backend.delete(&self.part_key(part))?;
        }
        Ok(())
    }
}

/// Reads a table's entries in table order (see [`Table::cursor`]); every
/// part header and bucket is checked, and the entry count against the shape.
pub struct Cursor<'a> {
    table: &'a Table,
    backend: &'a dyn Backend,
    /// The part being read and the buckets of it read so far.
    part: u64,
    done: u64,
    entries: std::collections::VecDeque<(Fingerprint, ContainerId)>,
    seen: u64,
    finished: bool,
}

impl Cursor<'_> {
    /// The next entry, without taking it.
    pub fn peek(&mut self) -> Result<Option<(Fingerprint, ContainerId)>> {
        while self.entries.is_empty() && !self.finished {
            self.fill()?;
        }
        Ok(self.entries.front().copied())
    }

    /// Takes the next entry.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<(Fingerprint, ContainerId)>> {
        self.peek()?;
        Ok(self.entries.pop_front())
    }

    /// Reads the next window of buckets (or notes the end).
    fn fill(&mut self) -> Result<()> {
        let t = self.table;
        if self.part >= t.meta.parts() {
            self.finished = true;
            if self.seen != t.meta.entries {
                return Err(Error::corrupt(
                    t.part_key(0),
                    format!(
                        "table holds {} entries, its manifest says {}",
                        self.seen, t.meta.entries
                    ),
                ));
            }
            return Ok(());
        }
        let b = t.meta.bucket_bytes as usize;
        let window = (SCAN_WINDOW_BYTES / b).max(1) as u64;
        let key = t.part_key(self.part);
        let (first, count) = part_range(&t.meta, self.part);
        if self.done == 0 {
            let header = self.backend.read_range(&key, 0, PART_HEADER_LEN as u64)?;
            t.check_part_header(&key, self.part, &header)?;
        }
        let n = window.min(count - self.done);
        let offset = PART_HEADER_LEN as u64 + self.done * b as u64;
        let bytes = self.backend.read_range(&key, offset, n * b as u64)?;
        if bytes.len() as u64 != n * b as u64 {
            return Err(Error::corrupt(&key, "table part truncated"));
        }
        let mut decoded = Vec::new();
        for (i, bucket) in bytes.chunks_exact(b).enumerate() {
            t.decode_bucket(&key, first + self.done + i as u64, bucket, &mut decoded)?;
        }
        self.seen += decoded.len() as u64;
        self.entries.extend(decoded);
        self.done += n;
        if self.done >= count {
            self.part += 1;
            self.done = 0;
        }
        Ok(())
    }
}

/// First bucket and bucket count of part `part`.
fn part_range(meta: &TableMeta, part: u64) -> (u64, u64) {
    let pb = u64::from(meta.part_buckets);
    let first = part * pb;
    (first, pb.min(meta.buckets.saturating_sub(first)))
}

/// Outcome of [`TableWriter::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Pushed {
    /// The entry was added.
    Added,
    /// Its bucket is full: write the table again with more buckets.
    Overflow,
}

/// Writes a new table generation from entries given in table order,
/// holding at most one part in memory.
pub struct TableWriter<'a> {
    backend: &'a dyn Backend,
    prefix: String,
    meta: TableMeta,
    bucket: u64,
    current: Vec<(Fingerprint, ContainerId)>,
    part: Vec<u8>,
    last: Option<(u64, Fingerprint)>,
}

impl<'a> TableWriter<'a> {
    /// Starts generation `generation` with `buckets` buckets.
    pub fn new(
        backend: &'a dyn Backend,
        prefix: &str,
        generation: u64,
        buckets: u64,
        bucket_bytes: u32,
        part_buckets: u32,
    ) -> Result<TableWriter<'a>> {
        let meta = TableMeta {
            generation,
            buckets: buckets.max(1),
            bucket_bytes,
            part_buckets: part_buckets.max(1),
            entries: 0,
        };
        meta.validate(prefix)
            .map_err(|_| Error::InvalidConfig(format!("invalid table shape {meta:?}")))?;
        let mut w = TableWriter {
            backend,
            prefix: prefix.to_string(),
            meta,
            bucket: 0,
            current: Vec::new(),
            part: Vec::new(),
            last: None,
        };
        w.start_part();
        Ok(w)
    }

    fn start_part(&mut self) {
        let part = self.bucket / u64::from(self.meta.part_buckets);
        let (first, count) = part_range(&self.meta, part);
        self.part.clear();
        self.part
            .reserve(PART_HEADER_LEN + count as usize * self.meta.bucket_bytes as usize);
        self.part.extend_from_slice(MAGIC);
        self.part.extend_from_slice(&TABLE_VERSION.to_le_bytes());
        self.part
            .extend_from_slice(&self.meta.generation.to_le_bytes());
        self.part.extend_from_slice(&part.to_le_bytes());
        self.part.extend_from_slice(&first.to_le_bytes());
        self.part.extend_from_slice(&count.to_le_bytes());
        self.part
            .extend_from_slice(&self.meta.buckets.to_le_bytes());
        self.part
            .extend_from_slice(&self.meta.bucket_bytes.to_le_bytes());
        self.part
            .extend_from_slice(&self.meta.part_buckets.to_le_bytes());
        self.part.extend_from_slice(&0u32.to_le_bytes());
        let crc = crc32c::crc32c(&self.part);
        self.part.extend_from_slice(&crc.to_le_bytes());
    }

    /// Adds an entry; entries must come in table order ([`order_key`]) without repeats.
    pub fn push(&mut self, fp: Fingerprint, container: ContainerId) -> Result<Pushed> {
        let key = order_key(&fp);
        if self.last.is_some_and(|last| last >= key) {
            return Err(Error::Pipeline(
                "fingerprint table entries out of order or repeated".into(),
            ));
        }
        self.last = Some(key);
        let bucket = self.meta.bucket_of(&fp);
        while self.bucket < bucket {
            self.flush_bucket()?;
        }
        if self.current.len() >= self.meta.capacity() {
            return Ok(Pushed::Overflow);
        }
        self.current.push((fp, container));
        self.meta.entries += 1;
        Ok(Pushed::Added)
    }

    fn flush_bucket(&mut self) -> Result<()> {
        let b = self.meta.bucket_bytes as usize;
        let start = self.part.len();
        self.part
            .extend_from_slice(&(self.current.len() as u32).to_le_bytes());
        for (fp, c) in self.current.drain(..) {
            self.part.extend_from_slice(&fp.0);
            self.part.extend_from_slice(&c.to_le_bytes());
        }
        self.part.resize(start + b - 4, 0);
        let crc = bucket_crc(self.meta.generation, self.bucket, &self.part[start..]);
        self.part.extend_from_slice(&crc.to_le_bytes());
        self.bucket += 1;
        let pb = u64::from(self.meta.part_buckets);
        if self.bucket.is_multiple_of(pb) || self.bucket == self.meta.buckets {
            let key = part_key(&self.prefix, self.meta.generation, (self.bucket - 1) / pb);
            self.backend.write(&key, &self.part)?;
            if self.bucket < self.meta.buckets {
                self.start_part();
            }
        }
        Ok(())
    }

    /// Entries added so far.
    pub fn entries(&self) -> u64 {
        self.meta.entries
    }

    /// Writes the remaining buckets and parts; returns the table.
    pub fn finish(mut self) -> Result<Table> {
        while self.bucket < self.meta.buckets {
            self.flush_bucket()?;
        }
        Ok(Table::new(&self.prefix, self.meta))
    }
}

/// Writes a table of `entries` (sorted in table order, without repeated
/// fingerprints), growing the bucket count until no bucket overflows.
pub fn write_sorted(
    backend: &dyn Backend,
    prefix: &str,
    generation: u64,
    bucket_bytes: u32,
    part_buckets: u32,
    entries: &[(Fingerprint, ContainerId)],
) -> Result<Table> {
    let mut buckets = buckets_for(entries.len() as u64, bucket_bytes);
    let mut doublings = 0;
    'grow: loop {
        let mut w = TableWriter::new(
            backend,
            prefix,
            generation,
            buckets,
            bucket_bytes,
            part_buckets,
        )?;
        for &(fp, c) in entries {
            if w.push(fp, c)? == Pushed::Overflow {
                buckets = grow(buckets, doublings)?;
                doublings += 1;
                continue 'grow;
            }
        }
        return w.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Local, ObjectStore};

    fn fp(i: u32) -> Fingerprint {
        let mut f = [0u8; 32];
        f[..4].copy_from_slice(&i.to_le_bytes());
        f[31] = 7;
        Fingerprint(f)
    }

    fn sorted(n: u32) -> Vec<(Fingerprint, ContainerId)> {
        let mut v: Vec<_> = (0..n).map(|i| (fp(i), u64::from(i % 13))).collect();
        v.sort_by_key(|e| order_key(&e.0));
        v
    }

    #[test]
    fn round_trip_lookup_and_scan() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Local::new(dir.path());
        let entries = sorted(1000);
        let t = write_sorted(&backend, "idx", 3, 512, 8, &entries).unwrap();
        assert_eq!(t.meta().entries, 1000);
        assert!(t.meta().parts() > 1);
        for i in 0..1000 {
            assert_eq!(t.lookup(&backend, &fp(i)).unwrap(), Some(u64::from(i % 13)));
        }
        assert_eq!(t.lookup(&backend, &fp(5000)).unwrap(), None);
        let mut seen = Vec::new();
        t.scan(&backend, |f, c| {
            seen.push((f, c));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, entries);
        // Each part object has the size its shape announces.
        let total: u64 = (0..t.meta().parts())
            .map(|p| backend.size(&t.part_key(p)).unwrap())
            .sum();
        assert_eq!(total, t.meta().total_bytes());
    }

    #[test]
    fn grows_until_no_bucket_overflows() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Local::new(dir.path());
        // One-entry buckets: the load target alone cannot avoid collisions.
        let entries = sorted(300);
        let t = write_sorted(&backend, "idx", 1, MIN_BUCKET_BYTES, 64, &entries).unwrap();
        assert!(t.meta().buckets > buckets_for(300, MIN_BUCKET_BYTES));
        for i in 0..300 {
            assert_eq!(t.lookup(&backend, &fp(i)).unwrap(), Some(u64::from(i % 13)));
        }
    }

    #[test]
    fn damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Local::new(dir.path());
        let entries = sorted(200);
        let t = write_sorted(&backend, "idx", 1, 512, 1 << 10, &entries).unwrap();
        let key = t.part_key(0);
        let good = backend.read(&key).unwrap();
        let probe = entries[0].0;
        let bucket = t.meta().bucket_of(&probe);
        let at = PART_HEADER_LEN + bucket as usize * 512 + 10;
        let mut bad = good.clone();
        bad[at] ^= 1;
        backend.write(&key, &bad).unwrap();
        assert!(matches!(
            t.lookup(&backend, &probe),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            t.scan(&backend, |_, _| Ok(())),
            Err(Error::Corrupt { .. })
        ));
        // A header flip is caught by a scan.
        let mut bad = good.clone();
        bad[20] ^= 1;
        backend.write(&key, &bad).unwrap();
        assert!(t.scan(&backend, |_, _| Ok(())).is_err());
        // A truncated part.
        backend.write(&key, &good[..good.len() - 100]).unwrap();
        assert!(t.scan(&backend, |_, _| Ok(())).is_err());
        // The bucket of another generation does not pass as this one's.
        backend.write(&key, &good).unwrap();
        let other = Table::new(
            "idx",
            TableMeta {
                generation: 2,
                ..*t.meta()
            },
        );
        backend.write(&other.part_key(0), &good).unwrap();
        assert!(other.lookup(&backend, &probe).is_err());
        assert_eq!(t.lookup(&backend, &probe).unwrap(), Some(entries[0].1));
    }

    #[test]
    fn colliding_keys_fail_instead_of_growing_forever() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Local::new(dir.path());
        // Same first 16 bytes, so the same key: they can never share a one-entry bucket.
        let mut entries: Vec<_> = (0..2u8)
            .map(|i| {
                let mut f = [0u8; 32];
                f[20] = i;
                (Fingerprint(f), 1)
            })
            .collect();
        entries.sort_by_key(|e| order_key(&e.0));
        assert!(write_sorted(&backend, "idx", 1, MIN_BUCKET_BYTES, 1 << 20, &entries).is_err());
    }

    #[test]
    fn writer_rejects_unsorted_entries() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Local::new(dir.path());
        let entries = sorted(3);
        let mut w = TableWriter::new(&backend, "idx", 1, 4, 4096, 4).unwrap();
        assert_eq!(w.push(entries[1].0, 1).unwrap(), Pushed::Added);
        assert!(w.push(entries[0].0, 1).is_err());
    }

    #[test]
    fn part_names_round_trip() {
        let k = part_key("p", 0xabc, 7);
        assert_eq!(
            parse_part_name(k.strip_prefix("p/").unwrap()),
            Some((0xabc, 7))
        );
        assert_eq!(parse_part_name("manifest"), None);
    }
}
