//! A repository in an S3-compatible object store, through Apache OpenDAL
//! (FORMAT.md §13.1). Every PUT is atomic (a reader sees the old object or
//! the new one whole), objects that commit a backup are created with a
//! conditional PUT (`If-None-Match: *`), and locks are lock objects.

use super::buffers::BufferPool;
use super::cache::{self, MetaCache, Part};
use super::throttle::Throttle;
use super::{object_lock, CacheStats, Hints, LockGuard, LockMode, Locks, ObjectStore, S3Location};
use crate::error::{Error, Result};
use bytes::Bytes;
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::{ErrorKind, Operator};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::task::JoinHandle;

/// Tuning of an object-store backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct S3Options {
    /// Requests in flight at most (`--connections`): the restore's
    /// container readers, the backup's container writers, and the
    /// read-ahead of [`Hints::will_read`] each keep this many.
    pub connections: usize,
    /// Retries of a request that failed transiently (with exponential
    /// backoff and jitter).
    pub retries: usize,
    /// Bytes the local metadata cache may take (FORMAT.md §13.2); 0: no
    /// cache (`--no-cache`).
    pub cache_limit: u64,
    /// Upload bandwidth limit in bytes per second; 0: none.
    pub upload_limit: u64,
    /// Download bandwidth limit in bytes per second; 0: none.
    pub download_limit: u64,
    /// A request, or one transfer step of its body, that takes longer
    /// fails as a transient error and is retried (`--timeout`): a stalled
    /// connection or server never hangs a command.
    pub timeout: Duration,
}

impl S3Options {
    /// The default of [`S3Options::connections`]: twice the processors,
    /// from 4 to 16. More requests in flight than that only add threads
    /// competing for the processors that chunk, hash and verify: on 2
    /// processors against a loopback server, 8 container writers back up
    /// slower than 4, with more processor time per byte.
    pub fn default_connections() -> usize {
        let processors = std::thread::available_parallelism().map_or(2, |n| n.get());
        (2 * processors).clamp(4, 16)
    }
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            connections: S3Options::default_connections(),
            retries: 6,
            cache_limit: 1 << 30,
            upload_limit: 0,
            download_limit: 0,
            timeout: Duration::from_secs(120),
        }
    }
}

/// Objects in an S3 bucket below a key prefix.
#[derive(Clone)]
pub struct S3 {
    inner: Arc<Inner>,
}

/// Read-aheads started by [`Hints::will_read`], oldest first.
type Prefetches = (
    HashMap<String, JoinHandle<opendal::Result<opendal::Buffer>>>,
    VecDeque<String>,
);

struct Inner {
    /// Drives OpenDAL's requests; callers block on them.
    runtime: tokio::runtime::Runtime,
    op: Operator,
    location: String,
    options: S3Options,
    /// Requests retried after a transient failure.
    retries: Arc<AtomicU64>,
    prefetches: Mutex<Prefetches>,
    /// The local metadata cache, once the repository's id is known.
    cache: OnceLock<MetaCache>,
    /// What this process's listings say of the objects' versions.
    versions: Mutex<Versions>,
    /// Reads served by the cache, and listings made for it.
    cache_hits: AtomicU64,
    cache_lists: AtomicU64,
    /// Bandwidth limits (`None`: unlimited).
    upload: Option<Throttle>,
    download: Option<Throttle>,
    /// Buffers that containers are gathered into, read or written.
    buffers: Arc<BufferPool>,
}

/// The versions (ETag and size) of the objects of the directories this
/// process listed (FORMAT.md §13.2).
#[derive(Default)]
struct Versions {
    listed: HashSet<String>,
    of: HashMap<String, String>,
}

impl S3 {
    /// A backend for `location`, with credentials and region from the
    /// environment: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (and
    /// `AWS_SESSION_TOKEN`), or the profile `AWS_PROFILE` of the AWS
    /// configuration files; `AWS_DEFAULT_REGION` or `AWS_REGION` (default
    /// `us-east-1`); the endpoint from the location, else
    /// `AWS_ENDPOINT_URL`, else AWS's. Nothing is requested yet.
    pub fn connect(location: &S3Location) -> Result<S3> {
        let options = &location.options;
        let name = location.to_string();
        let fail =
            |what: &str, e: String| Error::io(format!("{name}: {what}"), io::Error::other(e));
        opendal::install_default();
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let endpoint = location
            .endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| "https://s3.amazonaws.com".to_string());
        let region = env("AWS_DEFAULT_REGION")
            .or_else(|| env("AWS_REGION"))
            .unwrap_or_else(|| "us-east-1".to_string());
        let mut builder = opendal::services::S3::default()
            .bucket(&location.bucket)
            .root(&format!("/{}", location.prefix))
            .endpoint(&endpoint)
            .region(&region)
            .disable_ec2_metadata();
        match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) => {
                builder = builder.access_key_id(&id).secret_access_key(&secret);
                if let Some(token) = env("AWS_SESSION_TOKEN") {
                    builder = builder.session_token(&token);
                }
            }
            _ => match env("AWS_PROFILE") {
                Some(profile) => builder = builder.profile(&profile),
                None => {
                    return Err(fail(
                        "no credentials",
                        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE".into(),
                    ))
                }
            },
        }
        let retries = Arc::new(AtomicU64::new(0));
        let counter = retries.clone();
        let op = Operator::new(builder)
            .map_err(|e| fail("configuring", describe(&e)))?
            // Below the retries, so that each attempt has its own deadline.
            .layer(
                TimeoutLayer::new()
                    .with_timeout(options.timeout)
                    .with_io_timeout(options.timeout),
            )
            .layer(
                RetryLayer::new()
                    .with_max_times(options.retries)
                    .with_min_delay(Duration::from_millis(50))
                    .with_max_delay(Duration::from_secs(5))
                    .with_jitter()
                    .with_notify(move |_: opendal::layers::RetryEvent<'_>| {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }),
            );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tessera-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::io(format!("{name}: starting the I/O runtime"), e))?;
        Ok(S3 {
            inner: Arc::new(Inner {
                runtime,
                op,
                location: name,
                options: *options,
                retries,
                prefetches: Mutex::new((HashMap::new(), VecDeque::new())),
                cache: OnceLock::new(),
                versions: Mutex::new(Versions::default()),
                cache_hits: AtomicU64::new(0),
                cache_lists: AtomicU64::new(0),
                upload: Throttle::new(options.upload_limit),
                download: Throttle::new(options.download_limit),
                // As many as transfers in flight, and as many again
                // released by their users meanwhile.
                buffers: BufferPool::new(2 * options.connections.max(1)),
            }),
        })
    }

    /// Whether the bucket holds no object below the prefix (a new
    /// repository may be created only there).
    pub fn is_empty(&self) -> Result<bool> {
        let entries = self
            .block_on(self.inner.op.list("/"))
            .map_err(|e| self.error("listing", "", e))?;
        Ok(entries
            .iter()
            .all(|e| e.path() == "/" || e.path().is_empty()))
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.inner.runtime.block_on(f)
    }

    /// An engine error for OpenDAL's `e` while `doing` `key`.
    fn error(&self, doing: &str, key: &str, e: opendal::Error) -> Error {
        match e.kind() {
            ErrorKind::NotFound if !key.is_empty() => Error::NotFound(key.to_string()),
            ErrorKind::ConditionNotMatch => Error::ObjectExists(key.to_string()),
            _ => Error::io(
                format!("{doing} {}/{key}", self.inner.location),
                io::Error::other(describe(&e)),
            ),
        }
    }

    /// The read-ahead of `key` started by [`Hints::will_read`], if any.
    fn take_prefetch(&self, key: &str) -> Option<JoinHandle<opendal::Result<opendal::Buffer>>> {
        let mut p = self.inner.prefetches.lock().ok()?;
        let handle = p.0.remove(key)?;
        p.1.retain(|k| k != key);
        Some(handle)
    }

    fn read_buffer(&self, key: &str) -> Result<opendal::Buffer> {
        super::check_key(key)?;
        let version = self.version(key, cache::is_cached(key, Part::Whole));
        if let Some(hit) = self.cache_get(key, version.as_deref(), Part::Whole) {
            return Ok(opendal::Buffer::from(hit));
        }
        let buffer = self.fetch(key)?;
        // Only what the listing says the object is goes into the cache.
        let whole =
            |v: &String| v.rsplit_once(':').map(|(_, n)| n) == Some(&buffer.len().to_string());
        if let (Some(cache), Some(v)) = (self.inner.cache.get(), version.filter(whole)) {
            cache.put(key, &v, Part::Whole, &buffer.to_vec());
        }
        Ok(buffer)
    }

    /// The version of `key` if the read is `cached`: its ETag and size in
    /// this process's listing of its directory, listed now if it was not
    /// yet (FORMAT.md §13.2).
    fn version(&self, key: &str, cached: bool) -> Option<String> {
        self.inner.cache.get()?;
        if !cached {
            return None;
        }
        let (dir, _) = key.rsplit_once('/')?;
        let listed = self.versions().listed.contains(dir);
        if !listed {
            self.inner.cache_lists.fetch_add(1, Ordering::Relaxed);
            self.list(dir).ok()?;
        }
        self.versions().of.get(key).cloned()
    }

    fn versions(&self) -> std::sync::MutexGuard<'_, Versions> {
        self.inner
            .versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The cached bytes of `part` of `key` in `version`, counted as a hit.
    fn cache_get(&self, key: &str, version: Option<&str>, part: Part) -> Option<Vec<u8>> {
        let hit = self.inner.cache.get()?.get(key, version?, part)?;
        self.inner.cache_hits.fetch_add(1, Ordering::Relaxed);
        Some(hit)
    }

    /// Forgets what this process's listing says of `key` (it writes or
    /// deletes it): its next read goes to the store.
    fn forget_version(&self, key: &str) {
        if self.inner.cache.get().is_some() {
            self.versions().of.remove(key);
        }
    }

    /// Reads `key` from the store (or its read-ahead), at the download limit.
    fn fetch(&self, key: &str) -> Result<opendal::Buffer> {
        let fetched = match self.take_prefetch(key) {
            Some(handle) => match self.block_on(handle) {
                Ok(result) => result,
                // The read-ahead task failed to run: read now.
                Err(_) => self.block_on(self.inner.op.read(key)),
            },
            None => self.block_on(self.inner.op.read(key)),
        };
        let buffer = fetched.map_err(|e| self.error("reading", key, e))?;
        if let Some(t) = &self.inner.download {
            t.pass(buffer.len() as u64);
        }
        Ok(buffer)
    }

    /// `len` bytes of `key` from `offset` from the store, fewer if the
    /// object ends first.
    fn fetch_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        if len == 0 {
            return self.size(key).map(|_| Vec::new());
        }
        let end = offset.saturating_add(len);
        let ranged = |end: u64| {
            self.block_on(async { self.inner.op.read_with(key).range(offset..end).await })
        };
        match ranged(end) {
            Ok(buf) => Ok(buf.to_vec()),
            // The range starts at or beyond the end: nothing to return.
            Err(e) if e.kind() == ErrorKind::RangeNotSatisfied => Ok(Vec::new()),
            // The range runs past the end, which OpenDAL reports as a short
            // read: read what there is (the object's size bounds it).
            Err(e) if e.kind() == ErrorKind::Unexpected => {
                let size = self.size(key)?;
                match offset < size {
                    true => ranged(end.min(size))
                        .map(|buf| buf.to_vec())
                        .map_err(|e| self.error("reading", key, e)),
                    false => Ok(Vec::new()),
                }
            }
            Err(e) => Err(self.error("reading", key, e)),
        }
    }

    /// `len` bytes of `key` from `offset`, through the cache if the range
    /// is metadata or `keep` (FORMAT.md §13.2).
    fn range(&self, key: &str, offset: u64, len: u64, keep: bool) -> Result<Vec<u8>> {
        super::check_key(key)?;
        let part = Part::Range { offset, len };
        let version = self.version(key, keep || cache::is_cached(key, part));
        if let Some(hit) = self.cache_get(key, version.as_deref(), part) {
            return Ok(hit);
        }
        let data = self.fetch_range(key, offset, len)?;
        if let Some(t) = &self.inner.download {
            t.pass(data.len() as u64);
        }
        if let (Some(cache), Some(v)) = (self.inner.cache.get(), &version) {
            cache.put(key, v, part, &data);
        }
        Ok(data)
    }

    fn put(&self, key: &str, parts: &[&[u8]], create_new: bool) -> Result<()> {
        super::check_key(key)?;
        self.forget_version(key);
        let len = parts.iter().map(|p| p.len()).sum();
        let data = self.inner.buffers.gather(len, parts.iter().copied());
        if let Some(t) = &self.inner.upload {
            t.pass(data.len() as u64);
        }
        let written = self.block_on(async {
            let write = self.inner.op.write_with(key, data);
            match create_new {
                true => write.if_not_exists(true).await,
                false => write.await,
            }
        });
        written
            .map(|_| ())
            .map_err(|e| self.error("writing", key, e))
    }
}

/// OpenDAL's error `e` in a line: its kind, message and cause, without
/// the request's headers.
fn describe(e: &opendal::Error) -> String {
    let mut text = format!("{}: {}", e.kind(), e.message());
    if let Some(cause) = std::error::Error::source(e) {
        text.push_str(&format!(" ({cause})"));
    }
    text
}

impl ObjectStore for S3 {
    fn location(&self) -> String {
        self.inner.location.clone()
    }

    fn read(&self, key: &str) -> Result<Vec<u8>> {
        Ok(self.read_buffer(key)?.to_vec())
    }

    /// The object in one buffer of the pool (its pieces gathered).
    fn read_shared(&self, key: &str) -> Result<Bytes> {
        let buffer = self.read_buffer(key)?;
        let pieces: Vec<Bytes> = buffer.clone().collect();
        match pieces.as_slice() {
            [one] => Ok(one.clone()),
            _ => Ok(self
                .inner
                .buffers
                .gather(buffer.len(), pieces.iter().map(|b| &b[..]))),
        }
    }

    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.range(key, offset, len, false)
    }

    /// Reads of ranges to keep are cached as metadata ranges are.
    fn read_range_cached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.range(key, offset, len, true)
    }

    fn size(&self, key: &str) -> Result<u64> {
        super::check_key(key)?;
        self.block_on(self.inner.op.stat(key))
            .map(|m| m.content_length())
            .map_err(|e| self.error("inspecting", key, e))
    }

    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        self.put(key, &[data], false)
    }

    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.put(key, parts, false)
    }

    /// A conditional PUT (`If-None-Match: *`): the store refuses it if the
    /// object exists, atomically.
    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.put(key, parts, true)
    }

    fn delete(&self, key: &str) -> Result<()> {
        super::check_key(key)?;
        if let Some(h) = self.take_prefetch(key) {
            h.abort();
        }
        self.forget_version(key);
        match self.block_on(self.inner.op.delete(key)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.error("deleting", key, e)),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        super::check_key(dir)?;
        let prefix = format!("{dir}/");
        let entries = match self.block_on(self.inner.op.list(&prefix)) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.error("listing", dir, e)),
        };
        let mut names: Vec<String> = entries
            .iter()
            .filter_map(|e| e.path().strip_prefix(&prefix))
            .map(|name| name.trim_end_matches('/').to_string())
            .filter(|name| !name.is_empty() && !name.starts_with('.'))
            .collect();
        if self.inner.cache.get().is_some() {
            let mut versions = self.versions();
            versions.listed.insert(dir.to_string());
            for e in &entries {
                let (path, meta) = (e.path(), e.metadata());
                if let (Some(etag), false) = (meta.etag(), path.ends_with('/')) {
                    let version = format!("{etag}:{}", meta.content_length());
                    versions.of.insert(path.to_string(), version);
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn exists(&self, key: &str) -> Result<bool> {
        super::check_key(key)?;
        self.block_on(self.inner.op.exists(key))
            .map_err(|e| self.error("inspecting", key, e))
    }
}

/// Lock objects (FORMAT.md §13.1).
impl Locks for S3 {
    fn lock(&self, mode: LockMode) -> Result<LockGuard> {
        object_lock::acquire(Arc::new(self.clone()), mode)
    }

    fn unlock(&self, all: bool) -> Result<Vec<String>> {
        object_lock::remove(self, all)
    }
}

impl Hints for S3 {
    /// Starts fetching up to `--connections` of `keys` in the background;
    /// a later read of one of them takes its result.
    fn will_read(&self, keys: &[String]) {
        let Ok(mut p) = self.inner.prefetches.lock() else {
            return;
        };
        let limit = self.inner.options.connections.max(1);
        for key in keys {
            if p.0.contains_key(key) || super::check_key(key).is_err() {
                continue;
            }
            if p.1.len() >= limit {
                // Full of read-aheads nobody took: drop the oldest.
                if let Some(old) = p.1.pop_front() {
                    if let Some(h) = p.0.remove(&old) {
                        h.abort();
                    }
                }
            }
            let op = self.inner.op.clone();
            let owned = key.clone();
            let handle = self
                .inner
                .runtime
                .spawn(async move { op.read(&owned).await });
            p.0.insert(key.clone(), handle);
            p.1.push_back(key.clone());
        }
    }

    /// `--connections`.
    fn connections(&self) -> Option<usize> {
        Some(self.inner.options.connections.max(1))
    }

    fn retries(&self) -> u64 {
        self.inner.retries.load(Ordering::Relaxed)
    }

    /// Opens the cache of repository `id` below `$XDG_CACHE_HOME/tessera`
    /// (or `~/.cache/tessera`), unless the options turn it off; without a
    /// usable cache directory, reads go to the store.
    fn cache_metadata(&self, id: &str) {
        if self.inner.options.cache_limit == 0 {
            return;
        }
        let Some(root) = cache::default_root() else {
            return;
        };
        if let Ok(cache) = MetaCache::open(&root, id, self.inner.options.cache_limit) {
            let _ = self.inner.cache.set(cache);
        }
    }

    fn cache_stats(&self) -> CacheStats {
        CacheStats {
            hits: self.inner.cache_hits.load(Ordering::Relaxed),
            lists: self.inner.cache_lists.load(Ordering::Relaxed),
        }
    }
}
