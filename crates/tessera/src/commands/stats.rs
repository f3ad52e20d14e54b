//! Totals over a repository, whatever its layout (`tessera stats`):
//! backups, logical and stored bytes, containers or parts.

use crate::error::Result;
use crate::layout::container;
use crate::repo::config::Layout;
use crate::repo::{RepoTotals, Repository};

/// Totals over the whole repository.
pub fn totals(repo: &Repository) -> Result<RepoTotals> {
    if repo.config().layout == Layout::Lifecycle {
        return crate::layout::lifecycle::totals(repo);
    }
    let backend = repo.backend().as_ref();
    let snapshots = repo.snapshots()?;
    let containers = repo.containers()?;
    let mut physical_bytes = 0;
    for &c in &containers {
        physical_bytes += if repo.config().trace {
            // Trace containers store no data: count the size they stand for.
            let head = backend.read_range(&container::key(c), 0, container::HEADER_LEN as u64)?;
            container::Header::parse(c, &head)?.total_len() as u64
        } else {
            backend.size(&container::key(c))?
        };
    }
    Ok(RepoTotals::new(
        &snapshots,
        physical_bytes,
        containers.len() as u64,
    ))
}
