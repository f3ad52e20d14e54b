//! Verification of a lifecycle repository: every lineage state, NDF table,
//! journal, volume and category object parses and its checksums hold; every
//! chunk of every committed backup's recipe is in a category whose
//! lifecycle covers that backup; with `read_data`, every chunk is re-hashed.

use crate::commands::check::records::{check_derived, check_records, derived_problem, Retained};
use crate::commands::check::report::{CheckOptions, CheckReport, Problem};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::recipe_reader::for_each_ref;
use crate::format::snapshot::BackupId;
use crate::layout::lifecycle::format::{self, Journal, ReadLog};
use crate::layout::lifecycle::{
    cat_key, journal_key, lineage_names, ndf_dir, ndf_key, read_state_copy, require_layout,
    state_copy_key, state_key, vol_key, Lineage, LIFECYCLE_DIR,
};
use crate::progress::{Phase, Progress, Unit};
use crate::repo::Repository;
use crate::util::sorted_pairs::Sorter;
use std::collections::{BTreeMap, BTreeSet};

fn problem(report: &mut CheckReport, object: &str, e: &Error, affected: Vec<BackupId>) {
    report.problems.push(Problem::damaged(object, e, affected));
}

/// Checks one volume or category object; returns whether it is sound.
fn check_object(
    repo: &Repository,
    key: &str,
    options: CheckOptions,
    report: &mut CheckReport,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    let algo = repo.fingerprinter();
    let mut log = ReadLog::default();
    let header = format::read_header(backend, key, &mut log)?;
    let size = backend.size(key)?;
    if size != header.object_len() {
        return Err(Error::corrupt(
            key,
            format!("{size} bytes, its header announces {}", header.object_len()),
        ));
    }
    report.containers += 1;
    for idx in 0..header.categories.len() {
        let metas = format::read_meta(backend, key, &header, idx, &mut log)?;
        report.stored_chunks += metas.len() as u64;
        if options.read_data && header.has_data {
            let mut verified = 0;
            format::stream_category(
                backend,
                key,
                &header,
                idx,
                &metas,
                &mut log,
                |fp, _, bytes| {
                    let stored = bytes.unwrap_or_default();
                    let bytes = format::decode_entry(header.encoded, key, &fp, stored)?;
                    let actual = algo.hash(&bytes);
                    if actual != fp {
                        return Err(Error::ObjectChunkMismatch {
                            object: key.to_string(),
                            fingerprint: fp.to_string(),
                            actual: actual.to_string(),
                        });
                    }
                    verified += 1;
                    Ok(())
                },
            )?;
            report.chunks_verified += verified;
        }
    }
    Ok(())
}

/// Checks `repo` (lifecycle layout), reporting progress to `progress`:
/// the objects of each lineage, one phase a lineage.
pub(crate) fn check_with_progress(
    repo: &Repository,
    options: CheckOptions,
    progress: &dyn Progress,
) -> Result<CheckReport> {
    require_layout(repo)?;
    let backend = repo.backend().as_ref();
    let mut report = CheckReport::default();
    let retained = check_records(repo, &mut report)?;
    check_derived(repo, &mut report)?;
    let live: BTreeSet<BackupId> = retained.iter().map(|b| b.id).collect();
    let mut covered: BTreeSet<BackupId> = BTreeSet::new();
    for name in lineage_names(backend)? {
        let Some(l) = check_states(repo, &name, &retained, &mut report)? else {
            continue;
        };
        let (r, last) = (l.state.arranged, l.state.last());
        let backups_of = |versions: &mut dyn Iterator<Item = u64>| -> Vec<BackupId> {
            versions
                .filter_map(|v| l.state.backup_of(v))
                .filter(|b| live.contains(b))
                .collect()
        };
        // Objects of the layout.
        let mut bad_objects: BTreeSet<String> = BTreeSet::new();
        // Parts the state lists but that are gone are checked too: missing.
        let cats = l.all_cat_objects(backend)?;
        let volumes = l.all_volumes(backend)?;
        let objects = cats.len() + volumes.values().map(Vec::len).sum::<usize>();
        let phase = Phase::begin(
            progress,
            &format!("lineage {}", l.name),
            Unit::Objects,
            Some(objects as u64),
        );
        for &(i, j, p) in &cats {
            phase.add(1);
            let key = cat_key(&l.name, i, j, p);
            let active = j == r && i <= r && r > 0;
            let pending = i == j && j > r && j <= last;
            if !active && !pending {
                report.unreferenced_containers += 1;
                continue;
            }
            if let Err(e) = check_object(repo, &key, options, &mut report) {
                // Active: versions i..; pending: versions j.. may need it.
                let affected = backups_of(&mut (i..=last));
                problem(&mut report, &key, &e, affected);
                bad_objects.insert(key);
            }
        }
        for (i, j, p) in missing_cat_parts(repo, &l, &cats, &live) {
            let key = cat_key(&l.name, i, j, p);
            let e = Error::NotFound(key.clone());
            problem(&mut report, &key, &e, backups_of(&mut (i..=last)));
            bad_objects.insert(key);
        }
        for (j, parts) in volumes {
            for (n, &(p, first)) in parts.iter().enumerate() {
                phase.add(1);
                let key = vol_key(&l.name, j, p, first);
                if j >= r {
                    report.unreferenced_containers += 1;
                    continue;
                }
                let result = match usize::try_from(p) {
                    Ok(p) if p == n => check_object(repo, &key, options, &mut report),
                    _ => Err(Error::corrupt(
                        &key,
                        format!("part {n} of volume {j:016x} is missing before it"),
                    )),
                };
                if let Err(e) = result {
                    let affected = backups_of(&mut (1..=j));
                    problem(&mut report, &key, &e, affected);
                    bad_objects.insert(key);
                }
            }
        }
        phase.end();
        check_ndf_tables(repo, &l, &mut report)?;
        let jkey = journal_key(&l.name);
        match backend.read(&jkey) {
            Ok(b) => {
                if let Err(e) = Journal::decode(&jkey, &b) {
                    report.problems.push(derived_problem(
                        &jkey,
                        &e,
                        "recovery does not depend on it; the next arrange deletes it",
                    ));
                }
            }
            Err(Error::NotFound(_)) => {}
            Err(e) => problem(&mut report, &jkey, &e, Vec::new()),
        }
        // Every live version's chunks are in the categories covering it;
        // those that are not (or only in damaged objects) are quarantined.
        let mut lost: BTreeSet<Fingerprint> = BTreeSet::new();
        for v in &l.state.versions {
            if !live.contains(&v.backup) {
                continue;
            }
            covered.insert(v.backup);
            let version = (v.version, v.backup);
            let budget = options.sort_budget;
            let e = match check_version(repo, &l, version, &bad_objects, budget, &mut report) {
                Ok((missing, e)) => {
                    lost.extend(missing);
                    e
                }
                Err(e) => Some(e),
            };
            if let Some(e) = e {
                let key = match e {
                    Error::ChunkNotInCategories { .. } => format!("{LIFECYCLE_DIR}/{}", l.name),
                    _ => crate::format::snapshot::recipe_key(v.backup),
                };
                problem(&mut report, &key, &e, vec![v.backup]);
            }
        }
        if !lost.is_empty() {
            crate::repo::quarantine::record_lineage(backend, &l.name, lost)?;
        }
    }
    for &id in live.difference(&covered) {
        if report
            .problems
            .iter()
            .any(|p| p.affected_backups.contains(&id))
        {
            continue; // its lineage state (or snapshot) is reported already
        }
        let key = crate::format::snapshot::snapshot_key(id);
        let e = Error::corrupt(&key, "backup is not a version of any lifecycle lineage");
        problem(&mut report, &key, &e, vec![id]);
    }
    Ok(report)
}

/// Checks both copies of lineage `name`'s state; returns the lineage if a
/// copy is readable. One damaged or missing copy is derived-data damage
/// (the other is used and both are rewritten at the lineage's next backup
/// or arranging round); both damaged make every backup of the lineage
/// (by its snapshot's source) unrestorable.
fn check_states(
    repo: &Repository,
    name: &str,
    retained: &[Retained],
    report: &mut CheckReport,
) -> Result<Option<Lineage>> {
    let backend = repo.backend().as_ref();
    let (key, copy_key) = (state_key(name), state_copy_key(name));
    let primary = read_state_copy(backend, &key);
    let copy = read_state_copy(backend, &copy_key);
    const REWRITTEN: &str =
        "the other copy is used; both are rewritten at the lineage's next backup or arranging round";
    match (&primary, &copy) {
        (Ok(Some(_)), Err(e)) => report
            .problems
            .push(derived_problem(&copy_key, e, REWRITTEN)),
        (Err(e), Ok(Some(_))) => report.problems.push(derived_problem(&key, e, REWRITTEN)),
        (Ok(None), Ok(Some(_))) => {
            let e = Error::NotFound(key.clone());
            report.problems.push(derived_problem(&key, &e, REWRITTEN));
        }
        (Ok(Some(_)), Ok(None)) => {
            let e = Error::NotFound(copy_key.clone());
            report
                .problems
                .push(derived_problem(&copy_key, &e, REWRITTEN));
        }
        (Err(e), _) | (_, Err(e)) => {
            let affected = retained
                .iter()
                .filter(|b| {
                    b.source
                        .as_deref()
                        .map(crate::layout::lifecycle::lineage_name)
                        .as_deref()
                        == Some(name)
                })
                .map(|b| b.id)
                .collect();
            problem(report, &key, e, affected);
            return Ok(None);
        }
        _ => {}
    }
    Lineage::load(backend, name)
}

/// Parts of active and pending categories that must exist but do not: a
/// part before an existing one, and part 0 of the pending category of a
/// version whose snapshot says it stored new chunks.
fn missing_cat_parts(
    repo: &Repository,
    l: &Lineage,
    cats: &[(u64, u64, u32)],
    live: &BTreeSet<BackupId>,
) -> Vec<(u64, u64, u32)> {
    let (r, last) = (l.state.arranged, l.state.last());
    let mut parts: BTreeMap<(u64, u64), BTreeSet<u32>> = BTreeMap::new();
    // Only active and pending categories: others are leftovers.
    for &(i, j, p) in cats {
        if (j == r && i <= r && r > 0) || (i == j && j > r && j <= last) {
            parts.entry((i, j)).or_default().insert(p);
        }
    }
    for v in r + 1..=last {
        let stored_new = l
            .state
            .backup_of(v)
            .filter(|b| live.contains(b))
            .and_then(|b| repo.snapshot(b).ok())
            .is_some_and(|s| s.stats.unique.chunks > 0);
        if stored_new {
            parts.entry((v, v)).or_default();
        }
    }
    let mut missing = Vec::new();
    for ((i, j), have) in parts {
        let end = have.last().map_or(1, |p| p + 1);
        missing.extend((0..end).filter(|p| !have.contains(p)).map(|p| (i, j, p)));
    }
    missing
}

/// Checks the NDF tables: a damaged one, or a missing one a later round or
/// backup needs, is derived-data damage (rebuilt from the version's recipe).
fn check_ndf_tables(repo: &Repository, l: &Lineage, report: &mut CheckReport) -> Result<()> {
    let backend = repo.backend().as_ref();
    let (r, last) = (l.state.arranged, l.state.last());
    let stored: BTreeSet<u64> = backend
        .list(&ndf_dir(&l.name))?
        .iter()
        .filter_map(|n| crate::layout::lifecycle::parse_num_name(n))
        .collect();
    let needed = (r + 1..=last).chain((last > 0).then_some(last));
    for v in stored
        .iter()
        .copied()
        .chain(needed)
        .collect::<BTreeSet<_>>()
    {
        let key = ndf_key(&l.name, v);
        // Streamed: a window of the table in memory at a time.
        let damage = format::NdfReader::open(backend, &key)
            .and_then(|mut r| {
                while r.next()?.is_some() {}
                Ok(())
            })
            .err();
        let Some(e) = damage else { continue };
        let how = match l.state.backup_of(v).map(|id| for_each_ref(backend, id, |_| Ok(()))) {
            Some(Ok(_)) => "rebuilt from the version's recipe when needed".to_string(),
            _ => format!(
                "the version's recipe is gone too: the next round keeps every active chunk of version {v} (costs space), the next backup stores its chunks again"
            ),
        };
        report.problems.push(derived_problem(&key, &e, &how));
    }
    Ok(())
}

/// Checks that version `k` (backup `id`) finds every chunk of its recipe
/// in the sound objects it reads. Returns the chunks it does not find and
/// the error to report for them (none when a damaged object it reads is
/// reported already).
///
/// In bounded memory: the recipe is streamed ([`for_each_ref`]), its
/// fingerprints and those of the objects' chunks are sorted in
/// `sort_budget` bytes each and compared as sorted streams; only when
/// chunks are missing is the recipe read again, for the first of them.
fn check_version(
    repo: &Repository,
    l: &Lineage,
    (k, id): (u64, BackupId),
    bad_objects: &BTreeSet<String>,
    sort_budget: u64,
    report: &mut CheckReport,
) -> Result<(Vec<Fingerprint>, Option<Error>)> {
    let backend = repo.backend().as_ref();
    let mut wanted = Sorter::<Fingerprint>::with_budget(sort_budget);
    let references = for_each_ref(backend, id, |c| wanted.push(c.fp))?;
    let wanted = wanted.finish()?;
    report.references += references;
    let mut present = Sorter::<Fingerprint>::with_budget(sort_budget);
    let mut log = ReadLog::default();
    let required = l.required(backend, k)?;
    let (bad, good): (Vec<_>, Vec<_>) = required
        .into_iter()
        .partition(|r| bad_objects.contains(&r.key));
    // Damaged objects are reported already, with this backup among the affected.
    let skipped = !bad.is_empty();
    crate::layout::lifecycle::for_each_required(
        backend,
        &good,
        &mut log,
        |req, header, prefix, log| {
            for idx in 0..prefix {
                for (fp, _) in format::read_meta(backend, &req.key, header, idx, log)? {
                    present.push(fp)?;
                }
            }
            Ok(())
        },
    )?;
    // Sorted and distinct.
    let missing = wanted.absent_from(&present.finish()?)?;
    if missing.is_empty() || skipped {
        return Ok((missing, None));
    }
    let mut first = None;
    for_each_ref(backend, id, |c| {
        if first.is_none() && missing.binary_search(&c.fp).is_ok() {
            first = Some(c.fp);
        }
        Ok(())
    })?;
    let e = first.map(|fp| {
        let mut e = crate::layout::lifecycle::not_in_categories(l, id, k, &good, &fp);
        if let Error::ChunkNotInCategories { fingerprint, .. } = &mut e {
            fingerprint.push_str(&format!(" (and {} more)", missing.len() - 1));
        }
        e
    });
    Ok((missing, e))
}
