//! `tessera repair` in the container layout (docs/RECOVERY.md): every
//! container is read and every chunk verified; each recipe reference to a
//! chunk that is missing or damaged is re-pointed to an intact copy of the
//! same fingerprint in another container, the recipe rewritten atomically;
//! the index is rebuilt when any of its objects is damaged, so that the
//! next backup stores what is lost again.

use crate::commands::repair::report::{RepairReport, Unrepaired};
use crate::error::Result;
use crate::fingerprint::{Fingerprint, FingerprintMap};
use crate::format::snapshot::{self, BackupId};
use crate::layout::container::{self, Container, ContainerId};
use crate::progress::{Phase, Progress, Unit};
use crate::repo::Repository;
use lru::LruCache;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::num::NonZeroUsize;
use std::sync::Arc;

/// The container layout's repair steps: re-points recipes away from
/// damaged chunks (unless a trace repository, which stores none), then
/// rebuilds a damaged index.
pub(crate) fn repair(
    repo: &Repository,
    dry: bool,
    report: &mut RepairReport,
    progress: &dyn Progress,
) -> Result<()> {
    if !repo.config().trace {
        repoint(repo, dry, report, progress)?;
    }
    rebuild_damaged_index(repo, dry, report)
}

/// Rebuilds the index from the containers when any of its objects (a
/// manifest, a table part, a Bloom filter, a metadata log segment) is
/// damaged, or missing while its manifest lists it — unless quarantining
/// already rebuilt it.
fn rebuild_damaged_index(repo: &Repository, dry: bool, report: &mut RepairReport) -> Result<()> {
    if report.actions.iter().any(|a| a.kind == "index_rebuilt") {
        return Ok(());
    }
    let damaged = crate::commands::check::index_problems(repo)?;
    if damaged.is_empty() {
        return Ok(());
    }
    if !dry {
        repo.rebuild_index()?;
    }
    let objects: Vec<String> = damaged.into_iter().map(|p| p.object).collect();
    report.act(
        "index_rebuilt",
        "index".into(),
        format!(
            "index object(s) {} damaged or missing: the index rebuilt from the containers",
            objects.join(", ")
        ),
        vec![],
    );
    Ok(())
}

/// What the scan of every container found.
#[derive(Default)]
struct Scan {
    /// Containers holding an intact copy of each fingerprint, ascending.
    intact: FingerprintMap<Vec<ContainerId>>,
    /// Chunks (container, fingerprint) stored but damaged.
    damaged: HashSet<(ContainerId, Fingerprint)>,
    /// Containers with any damage (unreadable, or a damaged chunk).
    damaged_containers: BTreeSet<ContainerId>,
    /// Containers whose chunks cannot even be listed (metadata unreadable).
    unreadable: BTreeSet<ContainerId>,
}

impl Scan {
    fn is_intact(&self, c: ContainerId, fp: &Fingerprint) -> bool {
        self.intact
            .get(fp)
            .is_some_and(|v| v.binary_search(&c).is_ok())
    }
}

/// Reads every container and verifies every chunk (deltas decoded against
/// their bases).
fn scan(repo: &Repository, progress: &dyn Progress) -> Result<Scan> {
    let backend = repo.backend().as_ref();
    let algo = repo.fingerprinter();
    let mut out = Scan::default();
    let mut bases: LruCache<ContainerId, Option<Arc<Container>>> =
        LruCache::new(NonZeroUsize::new(8).unwrap_or(NonZeroUsize::MIN));
    let load = |id: ContainerId| -> Result<Option<Arc<Container>>> {
        match backend
            .read(&container::key(id))
            // Every chunk is verified by its fingerprint: a damaged byte loses
            // its chunk, not the container's intact neighbours.
            .and_then(|b| Container::parse_unchecked_data(id, b))
        {
            Ok(c) => Ok(Some(Arc::new(c))),
            Err(e) if e.lost_reason().is_some() => Ok(None),
            Err(e) => Err(e),
        }
    };
    let containers = repo.containers()?;
    let phase = Phase::begin(
        progress,
        "scan",
        Unit::Containers,
        Some(containers.len() as u64),
    );
    for id in containers {
        phase.add(1);
        let Some(ct) = load(id)? else {
            out.damaged_containers.insert(id);
            // Unreadable as a whole: every chunk its metadata names is damaged.
            match container::read_meta(backend, id) {
                Ok((_, metas)) => out.damaged.extend(metas.iter().map(|m| (id, m.fp))),
                Err(_) => {
                    out.unreadable.insert(id);
                }
            }
            continue;
        };
        for (i, m) in ct.metas.iter().enumerate() {
            let ok = match ct.base(i) {
                None => ct.entry(i).is_ok_and(|b| algo.hash(&b) == m.fp),
                Some(base) => {
                    if bases.get(&base.container).is_none() {
                        let b = if base.container == id {
                            Some(ct.clone())
                        } else {
                            load(base.container)?
                        };
                        bases.put(base.container, b);
                    }
                    match bases.get(&base.container).cloned().flatten() {
                        Some(bc) => bc
                            .find(&base.fp)
                            .filter(|&j| bc.base(j).is_none())
                            .and_then(|j| Some((bc.entry(j).ok()?, ct.entry(i).ok()?)))
                            .and_then(|(b, d)| crate::delta::decode(&b, &d).ok())
                            .is_some_and(|d| algo.hash(&d) == m.fp),
                        None => false,
                    }
                }
            };
            if ok {
                out.intact.entry(m.fp).or_default().push(id);
            } else {
                out.damaged.insert((id, m.fp));
                out.damaged_containers.insert(id);
            }
        }
    }
    phase.end();
    Ok(out)
}

/// Re-points recipe references to damaged or missing chunks to intact
/// copies; lists the backups left with holes; rebuilds the index without
/// the damaged chunks.
fn repoint(
    repo: &Repository,
    dry: bool,
    report: &mut RepairReport,
    progress: &dyn Progress,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    let scan = scan(repo, progress)?;
    let already: BTreeSet<BackupId> = report.unrepaired.iter().map(|u| u.backup).collect();
    let retained = repo.retained_backups()?;
    // Damaged containers whose damage a backup still uses (no intact copy),
    // and whether a recipe could not be read (it may use any).
    let mut still_used: BTreeSet<ContainerId> = BTreeSet::new();
    let mut unread = false;
    let phase = Phase::begin(
        progress,
        "recipes",
        Unit::Backups,
        Some(retained.len() as u64),
    );
    for id in retained {
        phase.add(1);
        if already.contains(&id) {
            // Listed already, left as it is; its damaged chunks are still used.
            match repo.recipe(id) {
                Ok(r) => still_used.extend(
                    r.chunks
                        .iter()
                        .filter(|c| !scan.is_intact(c.container, &c.fp))
                        .map(|c| c.container),
                ),
                Err(_) => unread = true,
            }
            continue;
        }
        let mut recipe = match repo.recipe(id) {
            Ok(r) => r,
            Err(e) if e.lost_reason().is_some() => {
                unread = true;
                report.unrepaired.push(Unrepaired {
                    backup: id,
                    reason: format!("recipe unreadable: {e}"),
                    lost_chunks: 0,
                    lost_bytes: 0,
                    forgotten: false,
                });
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut moved: BTreeMap<ContainerId, u64> = BTreeMap::new();
        let (mut repointed, mut lost, mut lost_bytes) = (0u64, 0u64, 0u64);
        let mut lost_fps: HashSet<Fingerprint> = HashSet::new();
        for c in &mut recipe.chunks {
            if scan.is_intact(c.container, &c.fp) {
                continue;
            }
            match scan.intact.get(&c.fp).and_then(|v| v.last()) {
                Some(&to) => {
                    *moved.entry(c.container).or_default() += 1;
                    c.container = to;
                    repointed += 1;
                }
                None => {
                    lost += 1;
                    lost_bytes += u64::from(c.len);
                    lost_fps.insert(c.fp);
                    still_used.insert(c.container);
                }
            }
        }
        if repointed > 0 {
            if !dry {
                backend.write(&snapshot::recipe_key(id), &recipe.encode()?)?;
            }
            let from: Vec<String> = moved.keys().map(|c| format!("{c:016x}")).collect();
            report.act(
                "recipe_repointed",
                snapshot::recipe_key(id),
                format!(
                    "{repointed} reference(s) to damaged or missing chunks (in container(s) {}) re-pointed to intact copies",
                    from.join(", ")
                ),
                vec![id],
            );
        }
        if lost > 0 {
            report.unrepaired.push(Unrepaired {
                backup: id,
                reason: format!(
                    "{} distinct chunk(s) are damaged or missing and no intact copy exists: restore with --skip-damaged",
                    lost_fps.len()
                ),
                lost_chunks: lost,
                lost_bytes,
                forgotten: false,
            });
        }
    }
    phase.end();
    if !unread {
        report.unused_damage = scan
            .damaged_containers
            .difference(&still_used)
            .map(|&c| container::key(c))
            .collect();
    }
    quarantine_found(repo, &scan, dry, report)
}

/// Quarantines the damaged chunks `scan` found (persistently: every later
/// index rebuild leaves them out), then rebuilds the index without them.
fn quarantine_found(
    repo: &Repository,
    scan: &Scan,
    dry: bool,
    report: &mut RepairReport,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    if !scan.damaged_containers.is_empty() {
        // Quarantine the damaged chunks (persistently: every later index
        // rebuild leaves them out), then rebuild the index without them.
        let mut by_container: BTreeMap<ContainerId, Vec<Fingerprint>> = BTreeMap::new();
        for (c, fp) in &scan.damaged {
            by_container.entry(*c).or_default().push(*fp);
        }
        let mut recorded = 0;
        let known = crate::repo::quarantine::load(backend)?;
        for &c in &scan.unreadable {
            if known.get(&c) != Some(&crate::repo::quarantine::Quarantined::All) {
                if !dry {
                    crate::repo::quarantine::record_whole(backend, c)?;
                }
                recorded += 1;
                report.act(
                    "chunks_quarantined",
                    crate::repo::quarantine::key(c),
                    format!("container {c:016x} is unreadable: all its chunks quarantined, the next backup of their data stores them again"),
                    vec![],
                );
            }
        }
        for (c, fps) in &by_container {
            let new = fps
                .iter()
                .any(|fp| !known.get(c).is_some_and(|q| q.contains(fp)));
            if new {
                if !dry {
                    crate::repo::quarantine::record(backend, *c, fps.iter().copied())?;
                }
                recorded += 1;
                report.act(
                    "chunks_quarantined",
                    crate::repo::quarantine::key(*c),
                    format!(
                        "{} damaged chunk(s) of container {c:016x} quarantined: indexes leave them out, the next backup of their data stores them again",
                        fps.len()
                    ),
                    vec![],
                );
            }
        }
        if recorded > 0 {
            if !dry {
                repo.rebuild_index()?;
            }
            report.act(
                "index_rebuilt",
                "index".into(),
                format!(
                    "index rebuilt without the {} quarantined chunk(s): a later repair re-points older backups to the copies the next backups store",
                    scan.damaged.len()
                ),
                vec![],
            );
        }
    }
    Ok(())
}
