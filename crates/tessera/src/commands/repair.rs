//! `tessera repair` (issue 20, docs/RECOVERY.md): puts back what can be
//! proven, never deletes primary data it cannot prove dead.
//!
//! In order:
//! 1. derived state: the `state` copies and lifecycle lineage state copies
//!    (one intact copy is rewritten to both);
//! 2. snapshots: a backup whose snapshot is missing or damaged but whose
//!    commit mark and recipe are intact gets its snapshot back from the
//!    mark (id, time, label, source, logical bytes, a tree backup's tree
//!    record; statistics are not recorded there and come back as zeros); a damaged commit mark of an
//!    intact snapshot is rewritten;
//! 3. container layout: every container is read and every chunk verified;
//!    each recipe reference to a chunk that is missing or damaged is
//!    re-pointed to an intact copy of the same fingerprint in another
//!    container (stored again by a later backup), the recipe rewritten
//!    atomically as garbage collection rewrites recipes; the index is
//!    rebuilt and forgets every damaged chunk, so that the next backup
//!    stores it again;
//! 4. lifecycle layout: every category and volume part is read and every
//!    chunk verified; a damaged part, or one the lineage state lists but
//!    that is missing, is rewritten in place with its intact chunks and an
//!    intact copy (from elsewhere in the lineage) of every chunk its readers
//!    lost; the lineage's quarantine record keeps only what is still lost
//!    ([`crate::layout::lifecycle::repair_lineage`]);
//! 5. container layout: an index with a damaged or missing object is
//!    rebuilt from the containers;
//! 6. with `forget_damaged`, backups still holding unrecoverable chunks are
//!    deleted (their snapshots; space goes with the next `gc`); otherwise
//!    they are kept and listed.
//!
//! Every action writes a complete new object or replaces one atomically
//! (write-then-rename): an interrupted repair leaves the repository as
//! good as before or better, and running it again finishes the job.

use crate::backend::Backend;
use crate::backend::LockMode;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap};
use crate::format::snapshot::{self, BackupId, Snapshot};
use crate::layout::container::{self, Container, ContainerId};
use crate::progress::{Phase, Progress, Silent, Unit};
use crate::repo::commit::{self, CommitMark};
use crate::repo::config::Layout;
use crate::repo::Repository;
use lru::LruCache;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::num::NonZeroUsize;
use std::sync::Arc;

/// Options of a repair.
#[derive(Clone, Copy, Debug, Default)]
pub struct RepairOptions {
    /// Report what would be done, change nothing.
    pub dry_run: bool,
    /// Delete backups that still have unrecoverable chunks after repair.
    pub forget_damaged: bool,
}

/// One thing repair did (or, in a dry run, would do).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RepairAction {
    /// `state_rewritten`, `lineage_state_rewritten`, `snapshot_recovered`,
    /// `commit_mark_rewritten`, `recipe_repointed`, `chunks_quarantined`,
    /// `index_rebuilt`, `part_rewritten`, `backup_forgotten`.
    pub kind: String,
    /// The object written (or deleted).
    pub object: String,
    /// What was done.
    pub detail: String,
    /// The backups it concerns.
    pub backups: Vec<BackupId>,
}

/// A backup that still cannot be restored completely.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unrepaired {
    /// The backup.
    pub backup: BackupId,
    /// Why.
    pub reason: String,
    /// Chunks without an intact copy (container layout; 0 when unknown).
    pub lost_chunks: u64,
    /// Their bytes.
    pub lost_bytes: u64,
    /// Whether `forget_damaged` deleted it.
    pub forgotten: bool,
}

/// What a repair did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RepairReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// Actions, in the order taken.
    pub actions: Vec<RepairAction>,
    /// Backups that still have holes (restore them with `--skip-damaged`).
    pub unrepaired: Vec<Unrepaired>,
    /// Damaged containers no backup uses any damage of (after the
    /// re-pointing): `check` still reports them until `gc` deletes them,
    /// or copies their intact chunks forward without the damage.
    pub unused_damage: Vec<String>,
}

impl RepairReport {
    fn act(&mut self, kind: &str, object: String, detail: String, backups: Vec<BackupId>) {
        self.actions.push(RepairAction {
            kind: kind.into(),
            object,
            detail,
            backups,
        });
    }
}

/// Repairs `repo`, which must be open with [`LockMode::Exclusive`].
pub fn repair(repo: &Repository, options: RepairOptions) -> Result<RepairReport> {
    repair_with_progress(repo, options, &Silent)
}

/// Repairs `repo`, reporting progress to `progress`: snapshots (objects),
/// then in the container layout scan (containers) and recipes (backups).
pub fn repair_with_progress(
    repo: &Repository,
    options: RepairOptions,
    progress: &dyn Progress,
) -> Result<RepairReport> {
    repo.require(LockMode::Exclusive, "repairing the repository")?;
    let dry = options.dry_run;
    let backend = repo.backend().as_ref();
    let mut report = RepairReport {
        dry_run: dry,
        ..RepairReport::default()
    };
    if repo.repair_state(dry)? {
        report.act(
            "state_rewritten",
            "state".into(),
            "a copy of the id counters was damaged or missing: both copies rewritten".into(),
            vec![],
        );
    }
    for name in crate::layout::lifecycle::lineage_names(backend)? {
        if repair_lineage_state(backend, &name, dry)? {
            report.act(
                "lineage_state_rewritten",
                crate::layout::lifecycle::state_key(&name),
                "one copy of the lineage state was damaged or missing: both rewritten from the intact one".into(),
                vec![],
            );
        }
    }
    recover_snapshots(repo, dry, &mut report, progress)?;
    if repo.config().layout == Layout::Container && !repo.config().trace {
        repoint(repo, dry, &mut report, progress)?;
    }
    if repo.config().layout == Layout::Lifecycle && !repo.config().trace {
        repair_lineages(repo, dry, &mut report)?;
    }
    if repo.config().layout == Layout::Container {
        rebuild_damaged_index(repo, dry, &mut report)?;
    }
    if options.forget_damaged {
        for u in &mut report.unrepaired {
            // Only a backup whose snapshot reads (delete needs it); others stay listed.
            if repo.snapshot(u.backup).is_ok() {
                if !dry {
                    crate::commands::delete::delete_backup(repo, u.backup)?;
                }
                u.forgotten = true;
                report.actions.push(RepairAction {
                    kind: "backup_forgotten".into(),
                    object: snapshot::snapshot_key(u.backup),
                    detail: format!(
                        "backup {} still had {} unrecoverable chunk(s): deleted (--forget-damaged)",
                        u.backup, u.lost_chunks
                    ),
                    backups: vec![u.backup],
                });
            }
        }
    }
    Ok(report)
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

/// Rewrites both copies of lineage `name`'s state when exactly one is
/// intact (both damaged: nothing to rewrite from).
fn repair_lineage_state(backend: &dyn Backend, name: &str, dry: bool) -> Result<bool> {
    use crate::layout::lifecycle::{read_state_copy, state_copy_key, state_key, Lineage};
    let primary = read_state_copy(backend, &state_key(name));
    let copy = read_state_copy(backend, &state_copy_key(name));
    let one_bad = |r: &Result<Option<_>>| match r {
        Ok(None) => Ok(true),
        Ok(Some(_)) => Ok(false),
        Err(e) if e.is_damage() || matches!(e, Error::UnsupportedVersion { .. }) => Ok(true),
        Err(e) => Err(Error::Pipeline(e.to_string())),
    };
    let bad = (one_bad(&primary)?, one_bad(&copy)?);
    if bad.0 == bad.1 {
        return Ok(false);
    }
    if !dry {
        if let Some(lineage) = Lineage::load(backend, name)? {
            lineage.save(backend)?;
        }
    }
    Ok(true)
}

/// Recovers missing or damaged snapshots from commit marks and recipes;
/// rewrites damaged commit marks of intact snapshots.
fn recover_snapshots(
    repo: &Repository,
    dry: bool,
    report: &mut RepairReport,
    progress: &dyn Progress,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    let snapshots: BTreeSet<BackupId> = repo.backups()?.into_iter().collect();
    let marks: BTreeSet<BackupId> = repo.commit_marks()?.into_iter().collect();
    let phase = Phase::begin(
        progress,
        "snapshots",
        Unit::Objects,
        Some(snapshots.union(&marks).count() as u64),
    );
    for &id in snapshots.union(&marks) {
        phase.add(1);
        let snap = match repo.snapshot(id) {
            Ok(s) => Some(s),
            Err(Error::NoSuchBackup(_)) => None,
            Err(e) if e.is_damage() || matches!(e, Error::UnsupportedVersion { .. }) => None,
            Err(e) => return Err(e),
        };
        let mark = if marks.contains(&id) {
            match backend.read(&commit::mark_key(id)) {
                Ok(b) => CommitMark::decode(id, &b).ok(),
                Err(Error::NotFound(_)) => None,
                Err(e) if e.is_damage() => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        match (snap, mark) {
            (Some(snap), None) => {
                if !dry {
                    backend.write(&commit::mark_key(id), &CommitMark::of(&snap).encode()?)?;
                }
                let what = if marks.contains(&id) {
                    "damaged"
                } else {
                    "missing"
                };
                report.act(
                    "commit_mark_rewritten",
                    commit::mark_key(id),
                    format!("{what} commit mark of backup {id} rewritten from its snapshot"),
                    vec![id],
                );
            }
            (Some(_), _) => {}
            (None, Some(mark)) => {
                let recipe = match repo.recipe(id) {
                    Ok(r) => r,
                    Err(e) => {
                        report.unrepaired.push(Unrepaired {
                            backup: id,
                            reason: format!("snapshot and recipe lost: {e}"),
                            lost_chunks: 0,
                            lost_bytes: mark.logical_bytes,
                            forgotten: false,
                        });
                        continue;
                    }
                };
                if recipe.logical_bytes() != mark.logical_bytes {
                    report.unrepaired.push(Unrepaired {
                        backup: id,
                        reason: format!(
                            "snapshot lost; its recipe holds {} bytes, its commit mark says {}: not recovered",
                            recipe.logical_bytes(),
                            mark.logical_bytes
                        ),
                        lost_chunks: 0,
                        lost_bytes: mark.logical_bytes,
                        forgotten: false,
                    });
                    continue;
                }
                let snap = Snapshot {
                    id,
                    time: mark.time,
                    label: mark.label.clone(),
                    source: mark.source.clone(),
                    host: String::new(),
                    tags: Vec::new(),
                    logical_bytes: mark.logical_bytes,
                    stats: Default::default(),
                    tree: mark.tree.clone(),
                };
                if !dry {
                    // Atomic replacement of a damaged snapshot, or a new one.
                    backend.write(&snapshot::snapshot_key(id), &snap.encode()?)?;
                }
                report.act(
                    "snapshot_recovered",
                    snapshot::snapshot_key(id),
                    format!(
                        "snapshot of backup {id} ({} bytes, label {:?}, source {:?}) rewritten from its commit mark and recipe (run statistics are not recorded there)",
                        mark.logical_bytes, mark.label, mark.source
                    ),
                    vec![id],
                );
            }
            (None, None) => {
                report.unrepaired.push(Unrepaired {
                    backup: id,
                    reason: "snapshot damaged and no readable commit mark to rebuild it from"
                        .into(),
                    lost_chunks: 0,
                    lost_bytes: 0,
                    forgotten: false,
                });
            }
        }
    }
    phase.end();
    Ok(())
}

/// Lifecycle layout: rewrites every damaged or missing category and
/// volume part with its intact chunks and intact copies of the chunks its
/// readers lost ([`crate::layout::lifecycle::repair_lineage`]); lists the backups
/// left with holes.
fn repair_lineages(repo: &Repository, dry: bool, report: &mut RepairReport) -> Result<()> {
    let backend = repo.backend().as_ref();
    let live = repo.retained_backups()?;
    let already: BTreeSet<BackupId> = report.unrepaired.iter().map(|u| u.backup).collect();
    for name in crate::layout::lifecycle::lineage_names(backend)? {
        // A lineage without a readable state is reported by check; nothing to rewrite from.
        let Ok(Some(l)) = crate::layout::lifecycle::Lineage::load(backend, &name) else {
            continue;
        };
        let done = crate::layout::lifecycle::repair_lineage(repo, &l, &live, dry)?;
        for (key, detail, backups) in done.rewritten {
            report.act("part_rewritten", key, detail, backups);
        }
        if let Some((key, left)) = done.quarantine {
            report.act(
                "chunks_quarantined",
                key,
                format!("quarantine record of the lineage replaced: {left} chunk(s) still without an intact copy"),
                vec![],
            );
        }
        for (backup, lost_chunks, lost_bytes) in done.lost {
            if already.contains(&backup) {
                continue;
            }
            report.unrepaired.push(Unrepaired {
                backup,
                reason: format!(
                    "{lost_chunks} distinct chunk(s) are damaged or missing and no intact copy exists in the lineage: restore with --skip-damaged"
                ),
                lost_chunks,
                lost_bytes,
                forgotten: false,
            });
        }
    }
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
