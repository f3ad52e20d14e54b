//! An in-memory backend for the index tests (the local backend syncs every
//! write, too slow for hundreds of property cases).

use crate::backend::Backend;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Objects in memory.
#[derive(Default)]
pub(crate) struct Mem(Mutex<BTreeMap<String, Vec<u8>>>);

impl Backend for Mem {
    fn location(&self) -> String {
        "memory".into()
    }
    fn read(&self, key: &str) -> Result<Vec<u8>> {
        let m = self.0.lock().unwrap();
        m.get(key)
            .cloned()
            .ok_or_else(|| Error::NotFound(key.into()))
    }
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let all = self.read(key)?;
        let start = (offset as usize).min(all.len());
        let end = (offset.saturating_add(len) as usize).min(all.len());
        Ok(all[start..end].to_vec())
    }
    fn size(&self, key: &str) -> Result<u64> {
        Ok(self.read(key)?.len() as u64)
    }
    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        self.0.lock().unwrap().insert(key.into(), data.to_vec());
        Ok(())
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.0.lock().unwrap().remove(key);
        Ok(())
    }
    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let prefix = format!("{dir}/");
        let m = self.0.lock().unwrap();
        Ok(m.keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|k| !k.contains('/'))
            .map(String::from)
            .collect())
    }
    fn exists(&self, key: &str) -> Result<bool> {
        Ok(self.0.lock().unwrap().contains_key(key))
    }
    fn lock(&self, _exclusive: bool) -> Result<crate::backend::LockGuard> {
        Ok(crate::backend::LockGuard::default())
    }
}

pub(crate) fn mem() -> Arc<dyn Backend> {
    Arc::new(Mem::default())
}
