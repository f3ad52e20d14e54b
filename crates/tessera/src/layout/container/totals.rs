//! Totals of a container-layout repository (`tessera stats`).

use crate::commands::stats::container_compression;
use crate::error::Result;
use crate::format::snapshot::BackupId;
use crate::layout::container;
use crate::repo::{RepoTotals, Repository};

/// Totals over a container-layout repository: containers' sizes, and the
/// compression ratio over what the retained backups reference.
pub(crate) fn totals(repo: &Repository) -> Result<RepoTotals> {
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
    let totals = RepoTotals::new(&snapshots, physical_bytes, containers.len() as u64);
    if repo.config().encoding().is_none() {
        return Ok(totals);
    }
    let ids: Vec<BackupId> = snapshots.iter().map(|s| s.id).collect();
    Ok(totals.with_compression(container_compression(repo, &ids)?))
}
