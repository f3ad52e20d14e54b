//! Verification of a container-layout repository (`tessera check`): every
//! container parses and its checksums hold (with `read_data` every chunk is
//! re-hashed), every chunk of every retained recipe is stored where it
//! says, every delta's base is stored whole; damaged containers and chunks
//! are quarantined for `repair`.

use crate::commands::check::records::{self, Retained};
use crate::commands::check::report::{CheckOptions, CheckReport, Problem, ProblemKind};
use crate::delta;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder};
use crate::format::snapshot::BackupId;
use crate::layout::container::{self, BaseRef, Container, ContainerId};
use crate::progress::{Phase, Progress, Unit};
use crate::repo::Repository;
use crate::util::sorted_pairs::{PairSorter, SortedPairs};

use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

type ChunkSet = hashbrown::HashSet<(Fingerprint, ContainerId), FingerprintHashBuilder>;

/// A delta entry found by the scan: its container, fingerprint and base,
/// and with `read_data` its encoded bytes.
type DeltaEntry = (ContainerId, Fingerprint, BaseRef, Option<Vec<u8>>);

/// What the scan of the stored containers found.
#[derive(Default)]
struct Scan {
    /// Damaged containers: id → detail.
    bad_containers: BTreeMap<ContainerId, String>,
    /// Chunk-level damage: (container, fingerprint) → detail.
    bad_chunks: BTreeMap<(ContainerId, Fingerprint), String>,
    /// Every delta entry of an intact container.
    deltas: Vec<DeltaEntry>,
}

/// What the walk over the retained backups found.
struct Walk {
    /// Containers some recipe (or delta) references.
    referenced: BTreeSet<ContainerId>,
    /// Backups using each damaged container.
    users_of_bad: BTreeMap<ContainerId, BTreeSet<BackupId>>,
    /// Backups using each damaged chunk.
    users_of_bad_chunk: BTreeMap<(ContainerId, Fingerprint), BTreeSet<BackupId>>,
    /// Each backup's problems, in the order of the retained backups
    /// (`None`: its recipe could not be read).
    per_backup: Vec<Option<Vec<Problem>>>,
}

/// [`check_with_progress`] of the container layout.
pub(crate) fn check_containers(
    repo: &Repository,
    options: CheckOptions,
    progress: &dyn Progress,
) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    let algo = repo.fingerprinter();
    let containers = repo.containers()?;
    let (mut scan, stored) = scan_containers(repo, &containers, options, progress, &mut report)?;

    // A container that only bases of deltas use is referenced through them.
    let referenced: BTreeSet<ContainerId> = scan.deltas.iter().map(|d| d.2.container).collect();
    let unstored = bases_not_stored(&scan.deltas, &stored, options.sort_budget)?;
    check_deltas(
        repo,
        algo,
        std::mem::take(&mut scan.deltas),
        &unstored,
        &scan.bad_containers,
        &mut scan.bad_chunks,
        &mut report,
    )?;

    let retained = records::check_records(repo, &mut report)?;
    records::check_derived(repo, &mut report)?;
    let (mut walk, references) = walk_backups(
        repo,
        &retained,
        &scan,
        referenced,
        options,
        progress,
        &mut report,
    )?;
    // The references no intact container stores (a merge join of the two
    // sorted streams); only then are the backups read again to count them.
    let absent = references.absent_from(&stored)?;
    let existing: BTreeSet<ContainerId> = containers.iter().copied().collect();
    let missing_containers: BTreeSet<ContainerId> = absent
        .iter()
        .map(|&(c, _)| c)
        .filter(|c| !existing.contains(c))
        .collect();
    let absent: ChunkSet = absent.into_iter().map(|(c, fp)| (fp, c)).collect();
    report_missing(repo, &retained, &mut walk.per_backup, &absent, &mut report)?;
    quarantine_damage(
        repo,
        &scan.bad_containers,
        &missing_containers,
        &scan.bad_chunks,
    )?;
    report_damage(scan, &mut walk, &mut report);
    report.unreferenced_containers = containers
        .iter()
        .filter(|c| !walk.referenced.contains(c))
        .count() as u64;
    Ok(report)
}

/// Reads every container's metadata (with `read_data`, its data too,
/// re-hashing every whole chunk): the damage found, the delta entries, and
/// every stored (container, fingerprint), sorted in bounded memory.
fn scan_containers(
    repo: &Repository,
    containers: &[ContainerId],
    options: CheckOptions,
    progress: &dyn Progress,
    report: &mut CheckReport,
) -> Result<(Scan, SortedPairs)> {
    let mut scan = Scan::default();
    let mut stored = PairSorter::with_budget(options.sort_budget);
    // Every stored copy by fingerprint, for counting duplicates.
    let mut copies = crate::commands::stats::stored_copies();
    let phase = Phase::begin(
        progress,
        "containers",
        Unit::Containers,
        Some(containers.len() as u64),
    );
    for &cid in containers {
        phase.add(1);
        report.containers += 1;
        let metas = if options.read_data {
            read_and_verify(repo, cid, &mut scan, report)
        } else {
            read_metadata(repo, cid)
        };
        match metas {
            Ok(metas) => {
                report.stored_chunks += metas.len() as u64;
                for m in &metas {
                    stored.push((cid, m.fp))?;
                    copies.push(crate::commands::stats::StoredCopy(m.fp, cid, m.len))?;
                }
                if !options.read_data {
                    scan.deltas.extend(
                        metas
                            .iter()
                            .filter_map(|m| m.base.map(|b| (cid, m.fp, b, None))),
                    );
                }
            }
            Err(Error::Corrupt { detail, .. }) => {
                scan.bad_containers.insert(cid, detail);
            }
            Err(e @ (Error::UnsupportedVersion { .. } | Error::Authentication { .. })) => {
                scan.bad_containers.insert(cid, e.to_string());
            }
            Err(e) => return Err(e),
        }
    }
    phase.end();
    (report.duplicate_chunks, report.duplicate_bytes) = count_duplicates(copies)?;
    Ok((scan, stored.finish()?))
}

/// A container's metadata, with its object's size checked against its header.
fn read_metadata(repo: &Repository, cid: ContainerId) -> Result<Vec<container::ChunkMeta>> {
    let (header, metas) = container::read_meta(repo.backend().as_ref(), cid)?;
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
}

/// Reads container `cid` whole and re-hashes every whole chunk: damaged
/// data is reported (and later quarantined) chunk by chunk, not as the
/// whole container. Its delta entries go to `scan.deltas` with their bytes.
fn read_and_verify(
    repo: &Repository,
    cid: ContainerId,
    scan: &mut Scan,
    report: &mut CheckReport,
) -> Result<Vec<container::ChunkMeta>> {
    let algo = repo.fingerprinter();
    let bytes = repo.backend().read(&container::key(cid))?;
    let ct = Container::parse_unchecked_data(cid, bytes)?;
    // Trace containers hold no data to re-hash.
    let to_hash = if ct.header.has_data() {
        ct.metas.len()
    } else {
        0
    };
    for (i, m) in ct.metas.iter().enumerate().take(to_hash) {
        if let Some(base) = m.base {
            match ct.entry(i) {
                Ok(delta) => scan
                    .deltas
                    .push((cid, m.fp, base, Some(delta.into_owned()))),
                Err(e) => {
                    scan.bad_chunks.insert((cid, m.fp), e.to_string());
                }
            }
        }
    }
    let mismatches: Vec<(Fingerprint, String)> = (0..to_hash)
        .into_par_iter()
        .filter(|&i| ct.metas[i].base.is_none())
        .filter_map(|i| {
            let expected = ct.metas[i].fp;
            match ct.entry(i) {
                Ok(bytes) => {
                    let actual = algo.hash(&bytes);
                    (actual != expected)
                        .then(|| (expected, format!("chunk {expected} hashes to {actual}")))
                }
                Err(e) => Some((expected, e.to_string())),
            }
        })
        .collect();
    report.chunks_verified += ct.metas[..to_hash]
        .iter()
        .filter(|m| m.base.is_none())
        .count() as u64;
    for (fp, detail) in mismatches {
        scan.bad_chunks.insert((cid, fp), detail);
    }
    Ok(ct.metas)
}

/// Reads every retained backup's recipe: who uses damaged containers and
/// chunks, each backup's own problems, and the sorted references to
/// chunks of intact containers.
fn walk_backups(
    repo: &Repository,
    retained: &[Retained],
    scan: &Scan,
    mut referenced: BTreeSet<ContainerId>,
    options: CheckOptions,
    progress: &dyn Progress,
    report: &mut CheckReport,
) -> Result<(Walk, SortedPairs)> {
    let mut users_of_bad: BTreeMap<ContainerId, BTreeSet<BackupId>> = BTreeMap::new();
    let mut users_of_bad_chunk: BTreeMap<(ContainerId, Fingerprint), BTreeSet<BackupId>> =
        BTreeMap::new();
    let phase = Phase::begin(
        progress,
        "backups",
        Unit::Backups,
        Some(retained.len() as u64),
    );
    let mut per_backup: Vec<Option<Vec<Problem>>> = Vec::with_capacity(retained.len());
    let mut references = PairSorter::with_budget(options.sort_budget);
    for b in retained {
        phase.add(1);
        let id = b.id;
        let recipe = match repo.recipe(id) {
            Ok(r) => r,
            Err(e) => {
                report.problems.push(Problem::damaged(
                    crate::format::snapshot::recipe_key(id),
                    &e,
                    vec![id],
                ));
                per_backup.push(None);
                continue;
            }
        };
        for c in &recipe.chunks {
            report.references += 1;
            referenced.insert(c.container);
            if scan.bad_containers.contains_key(&c.container) {
                users_of_bad.entry(c.container).or_default().insert(id);
            } else if scan.bad_chunks.contains_key(&(c.container, c.fp)) {
                users_of_bad_chunk
                    .entry((c.container, c.fp))
                    .or_default()
                    .insert(id);
            } else {
                references.push((c.container, c.fp))?;
            }
        }
        let mut problems = Vec::new();
        match b.logical_bytes {
            Some(n) if n != recipe.logical_bytes() => problems.push(Problem::new(
                ProblemKind::Damaged,
                crate::format::snapshot::recipe_key(id),
                format!(
                    "recipe rebuilds {} bytes but the snapshot records {n}",
                    recipe.logical_bytes(),
                ),
                vec![id],
            )),
            _ => {}
        }
        per_backup.push(Some(problems));
    }
    phase.end();
    let walk = Walk {
        referenced,
        users_of_bad,
        users_of_bad_chunk,
        per_backup,
    };
    Ok((walk, references.finish()?))
}

/// Adds each backup's problems to the report, a missing-chunks problem
/// first for a backup referencing chunks in `absent`.
fn report_missing(
    repo: &Repository,
    retained: &[Retained],
    per_backup: &mut [Option<Vec<Problem>>],
    absent: &ChunkSet,
    report: &mut CheckReport,
) -> Result<()> {
    for (b, problems) in retained.iter().zip(per_backup) {
        let Some(problems) = problems else {
            continue;
        };
        if !absent.is_empty() {
            let recipe = repo.recipe(b.id)?;
            let mut missing = recipe
                .chunks
                .iter()
                .filter(|c| absent.contains(&(c.fp, c.container)));
            if let Some(c) = missing.next() {
                problems.insert(
                    0,
                    Problem::new(
                        ProblemKind::Missing,
                        container::key(c.container),
                        format!(
                            "{} chunk reference(s) of backup {} missing, first {}",
                            1 + missing.count(),
                            b.id,
                            c.fp
                        ),
                        vec![b.id],
                    ),
                );
            }
        }
        report.problems.append(problems);
    }
    Ok(())
}

/// Adds a problem for each damaged container and chunk, with the backups using it.
fn report_damage(scan: Scan, walk: &mut Walk, report: &mut CheckReport) {
    for (cid, detail) in scan.bad_containers {
        report.problems.push(Problem {
            kind: ProblemKind::Damaged,
            object: container::key(cid),
            detail,
            affected_backups: walk
                .users_of_bad
                .remove(&cid)
                .unwrap_or_default()
                .into_iter()
                .collect(),
        });
    }
    for ((cid, fp), detail) in scan.bad_chunks {
        report.problems.push(Problem {
            kind: ProblemKind::Damaged,
            object: container::key(cid),
            detail,
            affected_backups: walk
                .users_of_bad_chunk
                .remove(&(cid, fp))
                .unwrap_or_default()
                .into_iter()
                .collect(),
        });
    }
}

/// Quarantines what the check found damaged (FORMAT.md §10.8): whole
/// containers that are unreadable or missing, single damaged chunks, so
/// that no later backup deduplicates against them.
/// Copies of a fingerprint in more than one container, beyond the first:
/// their number and stored bytes (a chunk listed twice in one container
/// counts once).
fn count_duplicates(
    copies: crate::util::sorted_pairs::Sorter<crate::commands::stats::StoredCopy>,
) -> Result<(u64, u64)> {
    let copies = copies.finish()?;
    let mut stream = copies.stream()?;
    let (mut chunks, mut bytes) = (0, 0);
    let mut last: Option<(Fingerprint, ContainerId)> = None;
    while let Some(crate::commands::stats::StoredCopy(fp, cid, len)) = stream.next()? {
        if let Some((lfp, lcid)) = last {
            if lfp == fp && lcid != cid {
                chunks += 1;
                bytes += u64::from(len);
            }
        }
        last = Some((fp, cid));
    }
    Ok((chunks, bytes))
}

fn quarantine_damage(
    repo: &Repository,
    bad_containers: &BTreeMap<ContainerId, String>,
    missing_containers: &BTreeSet<ContainerId>,
    bad_chunks: &BTreeMap<(ContainerId, Fingerprint), String>,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    for &c in bad_containers.keys().chain(missing_containers) {
        crate::repo::quarantine::record_whole(backend, c)?;
    }
    let mut by_container: BTreeMap<ContainerId, Vec<Fingerprint>> = BTreeMap::new();
    for &(c, fp) in bad_chunks.keys() {
        by_container.entry(c).or_default().push(fp);
    }
    for (c, fps) in by_container {
        crate::repo::quarantine::record(backend, c, fps)?;
    }
    Ok(())
}

/// The bases of `deltas` that no container stores (a merge join of the
/// sorted bases with the sorted stored chunks).
fn bases_not_stored(
    deltas: &[DeltaEntry],
    stored: &SortedPairs,
    sort_budget: u64,
) -> Result<ChunkSet> {
    let mut bases = PairSorter::with_budget(sort_budget);
    for d in deltas {
        bases.push((d.2.container, d.2.fp))?;
    }
    Ok(bases
        .finish()?
        .absent_from(stored)?
        .into_iter()
        .map(|(c, fp)| (fp, c))
        .collect())
}

/// Checks every delta entry: its base is stored whole where the entry says
/// (a damaged base container is reported as itself), and, when the delta's
/// bytes were read, that it decodes to bytes hashing to its fingerprint.
/// Base containers are read once each; `unstored` are the bases no
/// container stores.
fn check_deltas(
    repo: &Repository,
    algo: &crate::fingerprint::Fingerprinter,
    mut deltas: Vec<DeltaEntry>,
    unstored: &ChunkSet,
    bad_containers: &BTreeMap<ContainerId, String>,
    bad_chunks: &mut BTreeMap<(ContainerId, Fingerprint), String>,
    report: &mut CheckReport,
) -> Result<()> {
    // A base must be stored, and not as a delta itself.
    let is_delta: ChunkSet = deltas.iter().map(|d| (d.1, d.0)).collect();
    let whole = |b: &BaseRef| {
        !unstored.contains(&(b.fp, b.container)) && !is_delta.contains(&(b.fp, b.container))
    };
    deltas.sort_by_key(|d| d.2.container);
    let mut base_container: Option<Container> = None;
    for (cid, fp, base, bytes) in deltas {
        if bad_containers.contains_key(&base.container) {
            bad_chunks.insert(
                (cid, fp),
                format!(
                    "delta chunk {fp}: its base's container {:016x} is damaged",
                    base.container
                ),
            );
            continue;
        }
        if !whole(&base) {
            bad_chunks.insert(
                (cid, fp),
                format!(
                    "delta chunk {fp}: base {} is not stored whole in container {:016x}",
                    base.fp, base.container
                ),
            );
            continue;
        }
        let Some(delta) = bytes else {
            continue;
        };
        if base_container.as_ref().map(|c| c.header.id) != Some(base.container) {
            let bytes = repo.backend().read(&container::key(base.container))?;
            // The decoded delta is hashed: the base's bytes need no checksum.
            base_container = Some(Container::parse_unchecked_data(base.container, bytes)?);
        }
        let Some(bc) = &base_container else {
            continue;
        };
        let decoded = bc
            .find(&base.fp)
            .ok_or_else(|| format!("base {} vanished", base.fp))
            .and_then(|j| bc.entry(j).map_err(|e| e.to_string()))
            .and_then(|b| delta::decode(&b, &delta).map_err(|e| e.to_string()));
        match decoded {
            Ok(target) if algo.hash(&target) == fp => report.chunks_verified += 1,
            Ok(target) => {
                bad_chunks.insert(
                    (cid, fp),
                    format!("delta chunk {fp} decodes to {}", algo.hash(&target)),
                );
            }
            Err(e) => {
                bad_chunks.insert((cid, fp), format!("delta chunk {fp}: {e}"));
            }
        }
    }
    Ok(())
}

/// The object the configured index of a repository
/// always has once a committed backup stored chunks (every backup, and
/// `gc`, commits the index before its snapshot; HID/EHID's cold table is
/// written only when entries turn cold, so only the hot one counts).
pub(crate) fn expected_index(repo: &Repository) -> Result<Option<&'static str>> {
    use crate::repo::config::IndexKind;
    if repo.containers()?.is_empty()
        || (repo.backups()?.is_empty() && repo.commit_marks()?.is_empty())
    {
        return Ok(None);
    }
    Ok(Some(match repo.config().index {
        IndexKind::Exact => "index/exact",
        IndexKind::Ddfs => "index/ddfs/manifest",
        IndexKind::Hid | IndexKind::Ehid => "index/ehid-hot/manifest",
        IndexKind::Eager | IndexKind::Lazy => "index/lazy/manifest",
    }))
}
