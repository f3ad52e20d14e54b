//! Parts of a category written in the background while the next ones
//! fill, at most a given number at once (`--connections` on an object
//! store). Nothing refers to a part before the lineage state that lists
//! it, written after every upload ended (LIFECYCLE-FORMAT.md §8), so the
//! order in which parts land does not matter: an interruption leaves only
//! leftovers.

use crate::backend::Backend;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Uploads in flight, oldest first.
pub(crate) struct Uploads {
    backend: Arc<dyn Backend>,
    at_once: usize,
    running: VecDeque<JoinHandle<Result<()>>>,
}

impl Uploads {
    /// Uploads to `backend`, at most `at_once` (at least 1) in flight.
    pub(crate) fn new(backend: Arc<dyn Backend>, at_once: usize) -> Uploads {
        Uploads {
            backend,
            at_once: at_once.max(1),
            running: VecDeque::new(),
        }
    }

    /// Starts writing `object` as `key`, once fewer than the limit are in
    /// flight; fails with the error of an earlier upload, if one failed.
    pub(crate) fn start(&mut self, key: String, object: Vec<u8>) -> Result<()> {
        while self.running.len() >= self.at_once {
            self.wait_oldest()?;
        }
        let backend = self.backend.clone();
        let handle = std::thread::Builder::new()
            .name("tessera-upload".into())
            .spawn(move || backend.write(&key, &object))
            .map_err(|e| Error::io("starting an upload thread", e))?;
        self.running.push_back(handle);
        Ok(())
    }

    fn wait_oldest(&mut self) -> Result<()> {
        match self.running.pop_front() {
            Some(h) => h
                .join()
                .map_err(|_| Error::Pipeline("upload thread panicked".into()))?,
            None => Ok(()),
        }
    }

    /// Waits for every upload; the first error among them.
    pub(crate) fn finish(&mut self) -> Result<()> {
        let mut first = Ok(());
        while !self.running.is_empty() {
            let r = self.wait_oldest();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for Uploads {
    /// No upload outlives its writer (a failed backup writes nothing
    /// after it returned).
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Local;

    #[test]
    fn writes_every_part_and_reports_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let backend: Arc<dyn Backend> = Arc::new(Local::new(dir.path()));
        let mut uploads = Uploads::new(backend.clone(), 2);
        for p in 0..5u8 {
            uploads.start(format!("cat/{p}"), vec![p; 1000]).unwrap();
        }
        uploads.finish().unwrap();
        for p in 0..5u8 {
            assert_eq!(backend.read(&format!("cat/{p}")).unwrap(), vec![p; 1000]);
        }
        // A key the backend refuses fails the upload, reported by the next
        // start or by finish.
        uploads.start("../escape".into(), vec![1]).unwrap();
        assert!(uploads.finish().is_err());
    }
}
