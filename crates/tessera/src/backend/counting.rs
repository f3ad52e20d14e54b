//! The counting layer: every request and byte a repository makes, so that
//! I/O metrics are exact for every policy.

use super::{Backend, Layer, ObjectImage, WriteMode};
use crate::error::Result;
use bytes::Bytes;
use serde::Serialize;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Request and byte counts of a backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IoStats {
    /// Read requests (whole or ranged).
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Write requests.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Delete requests.
    pub deletes: u64,
    /// List requests.
    pub lists: u64,
    /// Requests retried after a transient failure (object stores).
    pub retries: u64,
    /// Of `reads`, those served by the local metadata cache, without a
    /// request to the store (object stores; FORMAT.md §13.2).
    pub cache_hits: u64,
    /// Listings the local metadata cache made (not in `lists`).
    pub cache_lists: u64,
}

impl IoStats {
    /// Counts accumulated since `earlier`.
    pub fn since(&self, earlier: &IoStats) -> IoStats {
        IoStats {
            reads: self.reads - earlier.reads,
            read_bytes: self.read_bytes - earlier.read_bytes,
            writes: self.writes - earlier.writes,
            write_bytes: self.write_bytes - earlier.write_bytes,
            deletes: self.deletes - earlier.deletes,
            lists: self.lists - earlier.lists,
            retries: self.retries - earlier.retries,
            cache_hits: self.cache_hits - earlier.cache_hits,
            cache_lists: self.cache_lists - earlier.cache_lists,
        }
    }

    /// Requests that reached the store: reads not served by the cache,
    /// writes, deletes and listings (the cache's included).
    pub fn requests(&self) -> u64 {
        self.reads - self.cache_hits + self.writes + self.deletes + self.lists + self.cache_lists
    }
}

/// Wraps a backend and counts every request and byte.
pub struct Counting {
    inner: Box<dyn Backend>,
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    deletes: AtomicU64,
    lists: AtomicU64,
}

impl Counting {
    /// Counts the requests made to `inner`.
    pub fn new(inner: Box<dyn Backend>) -> Self {
        Counting {
            inner,
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            lists: AtomicU64::new(0),
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> IoStats {
        let cache = self.inner.cache_stats();
        IoStats {
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            deletes: self.deletes.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            retries: self.inner.retries(),
            cache_hits: cache.hits,
            cache_lists: cache.lists,
        }
    }

    fn count_write(&self, bytes: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn count_read(&self, bytes: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// Counts reads, writes, deletes and listings and their bytes; sizes,
/// existence checks, locks and hints go to the inner backend uncounted.
impl Layer for Counting {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
    fn read(&self, key: &str) -> Result<Vec<u8>> {
        let data = self.inner.read(key)?;
        self.count_read(data.len());
        Ok(data)
    }
    fn read_shared(&self, key: &str) -> Result<Bytes> {
        let data = self.inner.read_shared(key)?;
        self.count_read(data.len());
        Ok(data)
    }
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let data = self.inner.read_range(key, offset, len)?;
        self.count_read(data.len());
        Ok(data)
    }
    fn read_range_cached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let data = self.inner.read_range_cached(key, offset, len)?;
        self.count_read(data.len());
        Ok(data)
    }
    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        self.inner.write(key, data)?;
        self.count_write(data.len() as u64);
        Ok(())
    }
    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.inner.write_parts(key, parts)?;
        self.count_write(parts.iter().map(|p| p.len() as u64).sum());
        Ok(())
    }
    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.inner.write_new(key, parts)?;
        self.count_write(parts.iter().map(|p| p.len() as u64).sum());
        Ok(())
    }
    fn write_new_filled(
        &self,
        key: &str,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut dyn ObjectImage) -> Result<()>,
    ) -> Result<()> {
        let mut len = 0;
        self.inner.write_new_filled(key, len_hint, &mut |image| {
            fill(image)?;
            len = image.len() as u64;
            Ok(())
        })?;
        self.count_write(len);
        Ok(())
    }
    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        let len = self.inner.write_streamed(key, mode, produce)?;
        self.count_write(len);
        Ok(len)
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)?;
        self.deletes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn list(&self, dir: &str) -> Result<Vec<String>> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        self.inner.list(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testing::{assert_forwards_locks_and_hints, Mem};
    use crate::error::Error;

    /// Every way of reading and writing is counted with the bytes that
    /// moved; sizes and existence checks are not requests that move bytes.
    #[test]
    fn every_read_write_delete_and_listing_is_counted() {
        let counting = Counting::new(Box::new(Mem::default()));
        let b: &dyn Backend = &counting;
        b.write("a/1", b"abc").unwrap();
        b.write_parts("a/2", &[b"de", b"f"]).unwrap();
        b.write_new("a/3", &[b"ghij"]).unwrap();
        let mut fill = |image: &mut dyn ObjectImage| {
            image.append(b"12345");
            Ok(())
        };
        b.write_new_filled("a/4", 8, &mut fill).unwrap();
        let mut produce =
            |out: &mut dyn Write| out.write_all(b"xy").map_err(|e| Error::io("a/5", e));
        let streamed = b.write_streamed("a/5", WriteMode::CreateNew, &mut produce);
        assert_eq!(streamed.unwrap(), 2);
        assert_eq!(b.read("a/1").unwrap(), b"abc");
        assert_eq!(&b.read_shared("a/2").unwrap()[..], b"def");
        assert_eq!(b.read_range("a/3", 1, 2).unwrap(), b"hi");
        assert_eq!(b.read_range_cached("a/4", 0, 100).unwrap(), b"12345");
        assert_eq!(b.size("a/5").unwrap(), 2);
        assert!(b.exists("a/5").unwrap());
        assert_eq!(b.list("a").unwrap(), ["1", "2", "3", "4", "5"]);
        b.delete("a/5").unwrap();
        let expected = IoStats {
            reads: 4,
            read_bytes: 3 + 3 + 2 + 5,
            writes: 5,
            write_bytes: 3 + 3 + 4 + 5 + 2,
            deletes: 1,
            lists: 1,
            ..IoStats::default()
        };
        assert_eq!(counting.stats(), expected);
    }

    #[test]
    fn locks_and_hints_reach_the_inner_backend() {
        assert_forwards_locks_and_hints(|inner| Box::new(Counting::new(inner)));
    }

    /// The statistics of the inner backend (retries, the metadata cache)
    /// are part of the counts.
    #[test]
    fn the_inner_backends_statistics_are_reported() {
        let stats = Counting::new(Box::new(Mem::probe())).stats();
        assert_eq!(
            (stats.retries, stats.cache_hits, stats.cache_lists),
            (5, 7, 2)
        );
    }
}
