//! Verification of a lifecycle repository: every lineage state, NDF table,
//! journal, volume and category object parses and its checksums hold; every
//! chunk of every committed backup's recipe is in a category whose
//! lifecycle covers that backup; with `read_data`, every chunk is re-hashed.

use super::format::{self, Journal, ReadLog};
use super::{cat_key, journal_key, lineages, ndf_dir, require_layout, vol_key, Lineage};
use crate::backend::Backend as _;
use crate::check::{CheckOptions, CheckReport, Problem};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder};
use crate::repo::Repository;
use crate::snapshot::BackupId;
use std::collections::BTreeSet;

type FpSet = hashbrown::HashSet<Fingerprint, FingerprintHashBuilder>;

fn problem(report: &mut CheckReport, object: &str, e: &Error, affected: Vec<BackupId>) {
    report.problems.push(Problem {
        object: object.to_string(),
        detail: e.to_string(),
        affected_backups: affected,
    });
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
                    let bytes = bytes.unwrap_or_default();
                    let actual = algo.hash(bytes);
                    if actual != fp {
                        return Err(Error::ChunkMismatch {
                            container: 0,
                            fingerprint: format!("{fp} in {key}"),
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

/// Checks `repo` (lifecycle layout).
pub fn check(repo: &Repository, options: CheckOptions) -> Result<CheckReport> {
    require_layout(repo)?;
    let backend = repo.backend().as_ref();
    let mut report = CheckReport::default();
    let live: BTreeSet<BackupId> = repo.backups()?.into_iter().collect();
    let recipes: BTreeSet<BackupId> = repo.recipes()?.into_iter().collect();
    report.uncommitted_recipes = recipes.difference(&live).count() as u64;
    let mut covered: BTreeSet<BackupId> = BTreeSet::new();
    let mut bad_lineage_states = Vec::new();
    for name in backend.list(super::STATE_DIR)? {
        if let Err(e) = Lineage::load(backend, &name) {
            bad_lineage_states.push((super::state_key(&name), e));
        }
    }
    for (key, e) in bad_lineage_states {
        problem(&mut report, &key, &e, Vec::new());
    }
    for l in lineages(backend).unwrap_or_default() {
        let (r, last) = (l.state.arranged, l.state.last());
        let backups_of = |versions: &mut dyn Iterator<Item = u64>| -> Vec<BackupId> {
            versions
                .filter_map(|v| l.state.backup_of(v))
                .filter(|b| live.contains(b))
                .collect()
        };
        // Objects of the layout.
        let mut bad_objects: BTreeSet<String> = BTreeSet::new();
        for (i, j, p) in l.cat_objects(backend)? {
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
        for (j, parts) in l.volumes(backend)? {
            for (p, first) in parts {
                let key = vol_key(&l.name, j, p, first);
                if j >= r {
                    report.unreferenced_containers += 1;
                    continue;
                }
                if let Err(e) = check_object(repo, &key, options, &mut report) {
                    let affected = backups_of(&mut (1..=j));
                    problem(&mut report, &key, &e, affected);
                    bad_objects.insert(key);
                }
            }
        }
        for name in backend.list(&ndf_dir(&l.name))? {
            let key = format!("{}/{name}", ndf_dir(&l.name));
            let parsed = backend
                .read(&key)
                .and_then(|b| format::decode_ndf(&key, &b));
            if let Err(e) = parsed {
                problem(&mut report, &key, &e, Vec::new());
            }
        }
        let jkey = journal_key(&l.name);
        match backend.read(&jkey) {
            Ok(b) => {
                if let Err(e) = Journal::decode(&jkey, &b) {
                    problem(&mut report, &jkey, &e, Vec::new());
                }
            }
            Err(Error::NotFound(_)) => {}
            Err(e) => problem(&mut report, &jkey, &e, Vec::new()),
        }
        // Every live version's chunks are in the categories covering it.
        for v in &l.state.versions {
            if !live.contains(&v.backup) {
                continue;
            }
            covered.insert(v.backup);
            report.backups += 1;
            if let Err(e) = repo.snapshot(v.backup) {
                let key = crate::snapshot::snapshot_key(v.backup);
                problem(&mut report, &key, &e, vec![v.backup]);
            }
            if let Err(e) = check_version(repo, &l, v.version, v.backup, &bad_objects, &mut report)
            {
                problem(
                    &mut report,
                    &crate::snapshot::recipe_key(v.backup),
                    &e,
                    vec![v.backup],
                );
            }
        }
    }
    for &id in live.difference(&covered) {
        report.backups += 1;
        let e = Error::corrupt(
            crate::snapshot::snapshot_key(id),
            "backup is not a version of any lifecycle lineage",
        );
        problem(
            &mut report,
            &crate::snapshot::snapshot_key(id),
            &e,
            vec![id],
        );
    }
    Ok(report)
}

fn check_version(
    repo: &Repository,
    l: &Lineage,
    k: u64,
    id: BackupId,
    bad_objects: &BTreeSet<String>,
    report: &mut CheckReport,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    let recipe = repo.recipe(id)?;
    report.references += recipe.chunks.len() as u64;
    let mut present = FpSet::default();
    let mut log = ReadLog::default();
    let required = l.required(backend, k)?;
    let (bad, good): (Vec<_>, Vec<_>) = required
        .into_iter()
        .partition(|r| bad_objects.contains(&r.key));
    // Damaged objects are reported already, with this backup among the affected.
    let skipped = !bad.is_empty();
    super::for_each_required(backend, &good, &mut log, |req, header, prefix, log| {
        for idx in 0..prefix {
            for (fp, _) in format::read_meta(backend, &req.key, header, idx, log)? {
                present.insert(fp);
            }
        }
        Ok(())
    })?;
    let missing = recipe
        .chunks
        .iter()
        .filter(|c| !present.contains(&c.fp))
        .count();
    if missing > 0 && !skipped {
        let first = recipe.chunks.iter().find(|c| !present.contains(&c.fp));
        return Err(Error::MissingChunk {
            backup: id,
            container: 0,
            fingerprint: format!(
                "{} (and {} more) not in the categories covering version {k}",
                first.map(|c| c.fp.to_string()).unwrap_or_default(),
                missing - 1
            ),
        });
    }
    Ok(())
}
