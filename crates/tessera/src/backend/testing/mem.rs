//! An in-memory store for tests (the local backend syncs every write, too
//! slow for hundreds of property cases) that records the lock calls and
//! hints it is given.

use crate::backend::{Backend, CacheStats, Hints, LockGuard, LockMode, Locks, ObjectStore};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// A call of [`Locks`] or [`Hints`] a [`Mem`] was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Lock(LockMode),
    Unlock(bool),
    RemoveTemporaries,
    WillRead(Vec<String>),
    WillReadHeads(Vec<String>, u64),
    CacheMetadata(String),
}

/// What a [`Mem`] answers to the questions of [`Locks`] and [`Hints`]:
/// nothing ([`Mem::default`]) or, for a probe ([`Mem::probe`]), values no
/// default gives, so a test sees whether a layer forwarded the question.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answers {
    pub connections: Option<usize>,
    pub retries: u64,
    pub cache: CacheStats,
    pub temporaries: u64,
    pub stale_locks: Vec<String>,
}

/// Objects in memory, and the lock calls and hints given.
#[derive(Default)]
pub struct Mem {
    objects: Mutex<BTreeMap<String, Vec<u8>>>,
    calls: Mutex<Vec<Call>>,
    answers: Answers,
}

/// Locks a mutex of a test backend, whatever a panicking test left in it.
fn held<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Mem {
    /// An empty store answering with values no default gives.
    pub fn probe() -> Mem {
        Mem {
            answers: Answers {
                connections: Some(3),
                retries: 5,
                cache: CacheStats { hits: 7, lists: 2 },
                temporaries: 4,
                stale_locks: vec!["locks/stale".into()],
            },
            ..Mem::default()
        }
    }

    /// The lock calls and hints given so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        held(&self.calls).clone()
    }

    /// The objects whose heads [`Hints::will_read_heads`] announced, with
    /// the length announced, in order.
    pub fn heads_hinted(&self) -> Vec<(String, u64)> {
        let calls = held(&self.calls);
        let heads = calls.iter().filter_map(|c| match c {
            Call::WillReadHeads(keys, len) => Some(keys.iter().map(move |k| (k.clone(), *len))),
            _ => None,
        });
        heads.flatten().collect()
    }

    fn record(&self, call: Call) {
        held(&self.calls).push(call);
    }
}

/// A new, empty [`Mem`] shared as a backend.
pub fn mem() -> Arc<dyn Backend> {
    Arc::new(Mem::default())
}

impl ObjectStore for Mem {
    fn location(&self) -> String {
        "memory".into()
    }
    fn read(&self, key: &str) -> Result<Vec<u8>> {
        let objects = held(&self.objects);
        objects
            .get(key)
            .cloned()
            .ok_or_else(|| Error::NotFound(key.into()))
    }
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let all = self.read(key)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(all.len());
        let end = usize::try_from(offset.saturating_add(len))
            .unwrap_or(usize::MAX)
            .min(all.len());
        Ok(all[start..end].to_vec())
    }
    fn size(&self, key: &str) -> Result<u64> {
        Ok(self.read(key)?.len() as u64)
    }
    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        held(&self.objects).insert(key.into(), data.to_vec());
        Ok(())
    }
    fn delete(&self, key: &str) -> Result<()> {
        held(&self.objects).remove(key);
        Ok(())
    }
    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let prefix = format!("{dir}/");
        let objects = held(&self.objects);
        Ok(objects
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|k| !k.contains('/'))
            .map(String::from)
            .collect())
    }
    fn exists(&self, key: &str) -> Result<bool> {
        Ok(held(&self.objects).contains_key(key))
    }
}

/// No lock excludes anything; the calls are recorded.
impl Locks for Mem {
    fn lock(&self, mode: LockMode) -> Result<LockGuard> {
        self.record(Call::Lock(mode));
        Ok(LockGuard::default())
    }
    fn unlock(&self, all: bool) -> Result<Vec<String>> {
        self.record(Call::Unlock(all));
        Ok(self.answers.stale_locks.clone())
    }
    fn remove_temporaries(&self) -> Result<u64> {
        self.record(Call::RemoveTemporaries);
        Ok(self.answers.temporaries)
    }
}

/// Hints are recorded; questions get the [`Answers`].
impl Hints for Mem {
    fn will_read(&self, keys: &[String]) {
        self.record(Call::WillRead(keys.to_vec()));
    }
    fn will_read_heads(&self, keys: &[String], len: u64) {
        self.record(Call::WillReadHeads(keys.to_vec(), len));
    }
    fn connections(&self) -> Option<usize> {
        self.answers.connections
    }
    fn cache_metadata(&self, id: &str) {
        self.record(Call::CacheMetadata(id.into()));
    }
    fn retries(&self) -> u64 {
        self.answers.retries
    }
    fn cache_stats(&self) -> CacheStats {
        self.answers.cache
    }
}

/// Asserts that the layer `wrap` puts over a store passes every lock call
/// and hint down and every answer up unchanged (a layer that forgot one
/// would fall back to a default and drop what the store does).
pub fn assert_forwards_locks_and_hints(wrap: impl FnOnce(Box<dyn Backend>) -> Box<dyn Backend>) {
    let probe = Arc::new(Mem::probe());
    let layered = wrap(Box::new(Shared(probe.clone())));
    let keys = vec!["data/1".to_string(), "data/2".to_string()];
    drop(layered.lock(LockMode::Backup).unwrap());
    assert_eq!(layered.unlock(true).unwrap(), probe.answers.stale_locks);
    assert_eq!(
        layered.remove_temporaries().unwrap(),
        probe.answers.temporaries
    );
    layered.will_read(&keys);
    layered.will_read_heads(&keys, 64);
    layered.cache_metadata("id");
    assert_eq!(layered.connections(), probe.answers.connections);
    assert_eq!(layered.retries(), probe.answers.retries);
    assert_eq!(layered.cache_stats(), probe.answers.cache);
    assert_eq!(
        probe.calls(),
        vec![
            Call::Lock(LockMode::Backup),
            Call::Unlock(true),
            Call::RemoveTemporaries,
            Call::WillRead(keys.clone()),
            Call::WillReadHeads(keys, 64),
            Call::CacheMetadata("id".into()),
        ]
    );
}

/// A backend shared with the test that inspects it.
struct Shared(Arc<Mem>);

impl crate::backend::Layer for Shared {
    fn inner(&self) -> &dyn Backend {
        &*self.0
    }
}
