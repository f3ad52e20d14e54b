//! Reading a tree backup's catalog as its chunks are restored: entries are
//! decoded one by one, so memory does not grow with the tree.

use super::catalog::{check_version, CatalogReader, Entry};
use crate::error::{Error, Result};
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions, RestoreStats};
use crate::snapshot::{BackupId, TreeRef};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::io::{self, Read, Write};

/// The tree record of backup `id`, checked to be one this build reads.
pub fn tree_of(repo: &Repository, id: BackupId) -> Result<TreeRef> {
    let tree = repo.snapshot(id)?.tree.ok_or(Error::NotATree(id))?;
    check_version(tree.catalog_version, &format!("catalog of backup {id}"))?;
    Ok(tree)
}

/// Calls `f` with every catalog entry of tree backup `id` in order, until it
/// returns `false`; returns the metrics of restoring the catalog's chunks.
pub fn for_each_entry(
    repo: &Repository,
    id: BackupId,
    tree: &TreeRef,
    chunks: usize,
    mut f: impl FnMut(Entry) -> Result<bool>,
) -> Result<RestoreStats> {
    let first = usize::try_from(tree.catalog_chunk).unwrap_or(usize::MAX);
    let range = std::slice::from_ref(&(first..chunks)).to_vec();
    let (tx, rx) = bounded::<Vec<u8>>(8);
    std::thread::scope(|s| {
        let reader = s.spawn(move || {
            let mut out = Pipe(tx);
            restore_selection(repo, id, &range, &mut out, &RestoreOptions::default())
        });
        let name = format!("catalog of backup {id}");
        let parsed = (|| -> Result<()> {
            let mut catalog = CatalogReader::new(
                PipeReader {
                    rx,
                    buf: Vec::new(),
                    at: 0,
                },
                &name,
            )?;
            while let Some(entry) = catalog.next_entry()? {
                if !f(entry)? {
                    break;
                }
            }
            Ok(())
        })();
        // The reader ends when its pipe closes (here, on an early stop).
        let restored = reader
            .join()
            .map_err(|_| Error::Pipeline("catalog reader thread panicked".into()))?;
        parsed?;
        restored.or_else(|e| match e {
            // The listing stopped early and closed the pipe.
            Error::Output { .. } => Ok(RestoreStats::default()),
            e => Err(e),
        })
    })
}

/// The writing end of an in-memory pipe.
struct Pipe(Sender<Vec<u8>>);

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .send(buf.to_vec())
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "catalog reader stopped"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The reading end.
struct PipeReader {
    rx: Receiver<Vec<u8>>,
    buf: Vec<u8>,
    at: usize,
}

impl Read for PipeReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.buf.len() {
            match self.rx.recv() {
                Ok(next) => {
                    self.buf = next;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
