//! Repository verification: every object parses and its checksums hold,
//! every chunk of every recipe exists where the recipe says, and with
//! `read_data` every stored chunk is re-hashed.

use crate::backend::Backend;
use crate::container::{self, Container, ContainerId};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder};
use crate::repo::Repository;
use crate::snapshot::BackupId;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Options of a check.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckOptions {
    /// Read every container whole and re-hash every chunk.
    pub read_data: bool,
}

/// One problem found, with the backups it affects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The damaged or missing object (e.g. `containers/000000000000002a`).
    pub object: String,
    /// What is wrong.
    pub detail: String,
    /// Backups that cannot be restored because of it.
    pub affected_backups: Vec<BackupId>,
}

/// What a check found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckReport {
    /// Containers examined.
    pub containers: u64,
    /// Chunks found in container metadata.
    pub stored_chunks: u64,
    /// Chunks re-hashed (with `read_data`).
    pub chunks_verified: u64,
    /// Committed backups examined.
    pub backups: u64,
    /// Chunk references of all recipes checked.
    pub references: u64,
    /// Containers no committed backup references (left by interrupted backups; GC reclaims them).
    pub unreferenced_containers: u64,
    /// Recipes without a snapshot (left by interrupted backups).
    pub uncommitted_recipes: u64,
    /// Problems found; the repository is healthy when empty.
    pub problems: Vec<Problem>,
}

impl CheckReport {
    /// Whether no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

type ChunkSet = hashbrown::HashSet<(Fingerprint, ContainerId), FingerprintHashBuilder>;

/// Checks `repo`.
pub fn check(repo: &Repository, options: CheckOptions) -> Result<CheckReport> {
    if repo.config().layout == crate::config::Layout::Lifecycle {
        return crate::lifecycle::check(repo, options);
    }
    let mut report = CheckReport::default();
    let algo = repo.config().fingerprint;
    let mut stored = ChunkSet::default();
    // Damaged containers: id → (object, detail); chunk-level damage: (fp, container) → detail.
    let mut bad_containers: BTreeMap<ContainerId, String> = BTreeMap::new();
    let mut bad_chunks: BTreeMap<(ContainerId, Fingerprint), String> = BTreeMap::new();
    let containers = repo.containers()?;
    for &cid in &containers {
        report.containers += 1;
        let metas = if options.read_data {
            let parsed = repo
                .backend()
                .read(&container::key(cid))
                .and_then(|bytes| Container::parse(cid, bytes));
            match parsed {
                Ok(ct) => {
                    // Trace containers hold no data to re-hash.
                    let to_hash = if ct.header.has_data() {
                        ct.metas.len()
                    } else {
                        0
                    };
                    let mismatches: Vec<(Fingerprint, String)> = (0..to_hash)
                        .into_par_iter()
                        .filter_map(|i| {
                            let expected = ct.metas[i].fp;
                            let actual = algo.hash(ct.chunk(i));
                            (actual != expected)
                                .then(|| (expected, format!("chunk {expected} hashes to {actual}")))
                        })
                        .collect();
                    report.chunks_verified += to_hash as u64;
                    for (fp, detail) in mismatches {
                        bad_chunks.insert((cid, fp), detail);
                    }
                    Ok(ct.metas)
                }
                Err(e) => Err(e),
            }
        } else {
            container::read_meta(repo.backend().as_ref(), cid).and_then(|(header, metas)| {
                let size = repo.backend().size(&container::key(cid))?;
                if size != header.object_len() as u64 {
                    return Err(Error::corrupt(
                        container::key(cid),
                        format!(
                            "size {size} differs from the {} bytes its header announces",
                            header.object_len()
                        ),
                    ));
                }
                Ok(metas)
            })
        };
        match metas {
            Ok(metas) => {
                report.stored_chunks += metas.len() as u64;
                stored.extend(metas.iter().map(|m| (m.fp, cid)));
            }
            Err(Error::Corrupt { detail, .. }) => {
                bad_containers.insert(cid, detail);
            }
            Err(e @ Error::UnsupportedVersion { .. }) => {
                bad_containers.insert(cid, e.to_string());
            }
            Err(e) => return Err(e),
        }
    }

    let mut referenced: BTreeSet<ContainerId> = BTreeSet::new();
    let mut users_of_bad: BTreeMap<ContainerId, BTreeSet<BackupId>> = BTreeMap::new();
    let mut users_of_bad_chunk: BTreeMap<(ContainerId, Fingerprint), BTreeSet<BackupId>> =
        BTreeMap::new();
    let backups = repo.backups()?;
    for &id in &backups {
        report.backups += 1;
        let loaded = repo.snapshot(id).and_then(|s| Ok((s, repo.recipe(id)?)));
        let (snap, recipe) = match loaded {
            Ok(v) => v,
            Err(e) => {
                report.problems.push(Problem {
                    object: crate::snapshot::snapshot_key(id),
                    detail: e.to_string(),
                    affected_backups: vec![id],
                });
                continue;
            }
        };
        let mut missing = 0u64;
        let mut first_missing = None;
        for c in &recipe.chunks {
            report.references += 1;
            referenced.insert(c.container);
            if bad_containers.contains_key(&c.container) {
                users_of_bad.entry(c.container).or_default().insert(id);
            } else if bad_chunks.contains_key(&(c.container, c.fp)) {
                users_of_bad_chunk
                    .entry((c.container, c.fp))
                    .or_default()
                    .insert(id);
            } else if !stored.contains(&(c.fp, c.container)) {
                missing += 1;
                first_missing.get_or_insert(*c);
            }
        }
        if let Some(c) = first_missing {
            report.problems.push(Problem {
                object: container::key(c.container),
                detail: format!(
                    "{missing} chunk reference(s) of backup {id} missing, first {}",
                    c.fp
                ),
                affected_backups: vec![id],
            });
        }
        if recipe.logical_bytes() != snap.logical_bytes {
            report.problems.push(Problem {
                object: crate::snapshot::recipe_key(id),
                detail: format!(
                    "recipe rebuilds {} bytes but the snapshot records {}",
                    recipe.logical_bytes(),
                    snap.logical_bytes
                ),
                affected_backups: vec![id],
            });
        }
    }
    for (cid, detail) in bad_containers {
        report.problems.push(Problem {
            object: container::key(cid),
            detail,
            affected_backups: users_of_bad
                .remove(&cid)
                .unwrap_or_default()
                .into_iter()
                .collect(),
        });
    }
    for ((cid, fp), detail) in bad_chunks {
        report.problems.push(Problem {
            object: container::key(cid),
            detail,
            affected_backups: users_of_bad_chunk
                .remove(&(cid, fp))
                .unwrap_or_default()
                .into_iter()
                .collect(),
        });
    }
    report.unreferenced_containers = containers
        .iter()
        .filter(|c| !referenced.contains(c))
        .count() as u64;
    let committed: BTreeSet<_> = backups.into_iter().collect();
    report.uncommitted_recipes = repo
        .recipes()?
        .iter()
        .filter(|r| !committed.contains(r))
        .count() as u64;
    Ok(report)
}
