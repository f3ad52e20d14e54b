//! Layers: a backend over another backend that changes some of what it
//! does (counting, encrypting, injecting faults) and passes the rest down.

use super::{
    Backend, CacheStats, Hints, LockGuard, LockMode, Locks, ObjectImage, ObjectStore, WriteMode,
};
use crate::error::Result;
use bytes::Bytes;
use std::io::Write;

/// A backend over the backend [`Layer::inner`]. Every method of
/// [`ObjectStore`], [`Locks`] and [`Hints`] is here with a default that
/// forwards the call to the inner backend unchanged; a layer overrides
/// those it changes, and every type that is a layer is a [`Backend`].
///
/// Forwarding is the default, not the traits' own defaults, so that a
/// layer never drops what the backend below does: a read-ahead hint still
/// reaches the store, and a specialised path (a memory-mapped shared read,
/// a streamed or filled write) stays specialised. A layer that transforms
/// the bytes of objects overrides every method that moves them (reads,
/// writes, sizes, [`ObjectStore::transforms_objects`]).
pub trait Layer: Send + Sync {
    /// The backend below this layer.
    fn inner(&self) -> &dyn Backend;

    /// [`ObjectStore::location`].
    fn location(&self) -> String {
        self.inner().location()
    }
    /// [`ObjectStore::read`].
    fn read(&self, key: &str) -> Result<Vec<u8>> {
        self.inner().read(key)
    }
    /// [`ObjectStore::read_shared`].
    fn read_shared(&self, key: &str) -> Result<Bytes> {
        self.inner().read_shared(key)
    }
    /// [`ObjectStore::read_range`].
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.inner().read_range(key, offset, len)
    }
    /// [`ObjectStore::read_range_cached`].
    fn read_range_cached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.inner().read_range_cached(key, offset, len)
    }
    /// [`ObjectStore::size`].
    fn size(&self, key: &str) -> Result<u64> {
        self.inner().size(key)
    }
    /// [`ObjectStore::write`].
    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        self.inner().write(key, data)
    }
    /// [`ObjectStore::write_parts`].
    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.inner().write_parts(key, parts)
    }
    /// [`ObjectStore::write_new`].
    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.inner().write_new(key, parts)
    }
    /// [`ObjectStore::write_new_filled`].
    fn write_new_filled(
        &self,
        key: &str,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut dyn ObjectImage) -> Result<()>,
    ) -> Result<()> {
        self.inner().write_new_filled(key, len_hint, fill)
    }
    /// [`ObjectStore::transforms_objects`].
    fn transforms_objects(&self) -> bool {
        self.inner().transforms_objects()
    }
    /// [`ObjectStore::write_streamed`].
    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        self.inner().write_streamed(key, mode, produce)
    }
    /// [`ObjectStore::delete`].
    fn delete(&self, key: &str) -> Result<()> {
        self.inner().delete(key)
    }
    /// [`ObjectStore::list`].
    fn list(&self, dir: &str) -> Result<Vec<String>> {
        self.inner().list(dir)
    }
    /// [`ObjectStore::exists`].
    fn exists(&self, key: &str) -> Result<bool> {
        self.inner().exists(key)
    }

    /// [`Locks::lock`].
    fn lock(&self, mode: LockMode) -> Result<LockGuard> {
        self.inner().lock(mode)
    }
    /// [`Locks::unlock`].
    fn unlock(&self, all: bool) -> Result<Vec<String>> {
        self.inner().unlock(all)
    }
    /// [`Locks::remove_temporaries`].
    fn remove_temporaries(&self) -> Result<u64> {
        self.inner().remove_temporaries()
    }
    /// [`Locks::lock_retry`].
    fn lock_retry(&self) -> std::time::Duration {
        self.inner().lock_retry()
    }

    /// [`Hints::will_read`].
    fn will_read(&self, keys: &[String]) {
        self.inner().will_read(keys)
    }
    /// [`Hints::will_read_heads`].
    fn will_read_heads(&self, keys: &[String], len: u64) {
        self.inner().will_read_heads(keys, len)
    }
    /// [`Hints::connections`].
    fn connections(&self) -> Option<usize> {
        self.inner().connections()
    }
    /// [`Hints::cache_metadata`].
    fn cache_metadata(&self, id: &str) {
        self.inner().cache_metadata(id)
    }
    /// [`Hints::retries`].
    fn retries(&self) -> u64 {
        self.inner().retries()
    }
    /// [`Hints::cache_stats`].
    fn cache_stats(&self) -> CacheStats {
        self.inner().cache_stats()
    }
    /// [`Hints::readable_by_others`].
    fn readable_by_others(&self, key: &str) -> Result<bool> {
        self.inner().readable_by_others(key)
    }
}

impl<L: Layer> ObjectStore for L {
    fn location(&self) -> String {
        Layer::location(self)
    }
    fn read(&self, key: &str) -> Result<Vec<u8>> {
        Layer::read(self, key)
    }
    fn read_shared(&self, key: &str) -> Result<Bytes> {
        Layer::read_shared(self, key)
    }
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        Layer::read_range(self, key, offset, len)
    }
    fn read_range_cached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        Layer::read_range_cached(self, key, offset, len)
    }
    fn size(&self, key: &str) -> Result<u64> {
        Layer::size(self, key)
    }
    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        Layer::write(self, key, data)
    }
    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        Layer::write_parts(self, key, parts)
    }
    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        Layer::write_new(self, key, parts)
    }
    fn write_new_filled(
        &self,
        key: &str,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut dyn ObjectImage) -> Result<()>,
    ) -> Result<()> {
        Layer::write_new_filled(self, key, len_hint, fill)
    }
    fn transforms_objects(&self) -> bool {
        Layer::transforms_objects(self)
    }
    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        Layer::write_streamed(self, key, mode, produce)
    }
    fn delete(&self, key: &str) -> Result<()> {
        Layer::delete(self, key)
    }
    fn list(&self, dir: &str) -> Result<Vec<String>> {
        Layer::list(self, dir)
    }
    fn exists(&self, key: &str) -> Result<bool> {
        Layer::exists(self, key)
    }
}

impl<L: Layer> Locks for L {
    fn lock(&self, mode: LockMode) -> Result<LockGuard> {
        Layer::lock(self, mode)
    }
    fn unlock(&self, all: bool) -> Result<Vec<String>> {
        Layer::unlock(self, all)
    }
    fn remove_temporaries(&self) -> Result<u64> {
        Layer::remove_temporaries(self)
    }
    fn lock_retry(&self) -> std::time::Duration {
        Layer::lock_retry(self)
    }
}

impl<L: Layer> Hints for L {
    fn will_read(&self, keys: &[String]) {
        Layer::will_read(self, keys)
    }
    fn will_read_heads(&self, keys: &[String], len: u64) {
        Layer::will_read_heads(self, keys, len)
    }
    fn connections(&self) -> Option<usize> {
        Layer::connections(self)
    }
    fn cache_metadata(&self, id: &str) {
        Layer::cache_metadata(self, id)
    }
    fn retries(&self) -> u64 {
        Layer::retries(self)
    }
    fn cache_stats(&self) -> CacheStats {
        Layer::cache_stats(self)
    }
    fn readable_by_others(&self, key: &str) -> Result<bool> {
        Layer::readable_by_others(self, key)
    }
}
