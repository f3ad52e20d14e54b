//! `tessera repair` in the lifecycle layout (docs/RECOVERY.md): every
//! category and volume part a lineage uses is read and every chunk
//! verified. A part that is damaged, or listed by the lineage state but
//! missing, is rewritten in place, under its own name, with its chunks
//! that verify plus an intact copy — found in any other part of the
//! lineage, e.g. stored again by a later backup — of every chunk that a
//! version reading the part cannot find intact elsewhere. In this layout
//! the location of a chunk follows from the version, so this is what
//! re-pointing a reference means: putting a verified copy where the
//! version reads. The lineage's quarantine record is then replaced by the
//! chunks still without any intact copy.
//!
//! Each part is replaced atomically (a complete new object under the same
//! name); the quarantine record only shrinks after every part is
//! rewritten: an interrupted repair leaves the lineage as good as before
//! or better, and running it again finishes.

use super::format::{self, CategoryBuilder, VolumeHeader};
use super::{cat_key, vol_key, Lineage};
use crate::backend::Backend;
use crate::commands::repair::report::{RepairReport, Unrepaired};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap};
use crate::format::snapshot::BackupId;
use crate::repo::Repository;
use std::collections::{BTreeMap, BTreeSet};

/// What repairing one lineage did (or, dry, would do).
#[derive(Default)]
pub(crate) struct LineageRepair {
    /// Parts rewritten: (key, what was done, backups reading it).
    pub rewritten: Vec<(String, String, Vec<BackupId>)>,
    /// The quarantine record was replaced: (key, chunks left in it).
    pub quarantine: Option<(String, usize)>,
    /// Versions left with chunks no object holds intact: (backup, chunks, bytes).
    pub lost: Vec<(BackupId, u64, u64)>,
}

/// One part of the lineage as read: its intact chunks and whether it is sound.
struct Part {
    key: String,
    /// The start of its first category (a category part: `i`; a volume
    /// part: the `first` of its name), where copies are added.
    start: u64,
    /// The end `j` of its categories.
    end: u64,
    /// Intact chunks: (category start, fingerprint, offset, length).
    intact: Vec<(u64, Fingerprint, usize, u32)>,
    /// The object's bytes, kept for bad parts only (which are rewritten).
    bytes: Vec<u8>,
    /// Missing, unreadable, or holding a chunk that does not verify.
    bad: bool,
    /// Chunks dropped because they do not verify.
    dropped: u64,
    /// Whether its entries are stored encoded (a compressing repository).
    encoded: bool,
}

/// Whether `stored`, an entry of an object whose entries are `encoded` or
/// not, decodes to bytes that hash to `fp`.
fn verifies(repo: &Repository, encoded: bool, key: &str, fp: &Fingerprint, stored: &[u8]) -> bool {
    format::decode_entry(encoded, key, fp, stored)
        .is_ok_and(|plain| repo.fingerprinter().hash(&plain) == *fp)
}

/// Reads part `key` whole and verifies every chunk.
fn read_part(repo: &Repository, key: String, start: u64, end: u64) -> Result<Part> {
    let mut part = Part {
        key,
        start,
        end,
        intact: Vec::new(),
        bytes: Vec::new(),
        bad: true,
        dropped: 0,
        encoded: false,
    };
    let bytes = match repo.backend().read(&part.key) {
        Ok(b) => b,
        Err(e) if e.lost_reason().is_some() => return Ok(part),
        Err(e) => return Err(e),
    };
    let Ok(header) = VolumeHeader::parse(&part.key, &bytes) else {
        return Ok(part);
    };
    part.encoded = header.encoded;
    let mut sound = header.has_data && bytes.len() as u64 == header.object_len();
    for (idx, e) in header.categories.iter().enumerate() {
        let (m, d) = (e.offset as usize, header.data_offset(idx) as usize);
        let metas = bytes
            .get(m..d)
            .ok_or_else(|| Error::corrupt(&part.key, "truncated"))
            .and_then(|b| format::parse_meta(&part.key, e, b));
        let Ok(metas) = metas else {
            sound = false;
            continue;
        };
        let mut at = d;
        for (fp, len) in metas {
            let chunk = bytes.get(at..at + len as usize);
            at += len as usize;
            match chunk {
                Some(c) if verifies(repo, part.encoded, &part.key, &fp, c) => {
                    part.intact.push((e.start, fp, at - len as usize, len))
                }
                _ => {
                    sound = false;
                    part.dropped += 1;
                }
            }
        }
    }
    part.bad = !sound;
    if part.bad {
        part.bytes = bytes;
    }
    Ok(part)
}

/// The stored bytes of intact chunk `c` of `part` (verified again when read).
fn copy_of(repo: &Repository, part: &Part, c: usize) -> Result<Vec<u8>> {
    let (_, fp, at, len) = part.intact[c];
    if !part.bytes.is_empty() {
        return Ok(part.bytes[at..at + len as usize].to_vec());
    }
    let bytes = repo
        .backend()
        .read_range(&part.key, at as u64, u64::from(len))?;
    if !verifies(repo, part.encoded, &part.key, &fp, &bytes) {
        return Err(Error::corrupt(
            &part.key,
            format!("chunk {fp} no longer verifies"),
        ));
    }
    Ok(bytes)
}

/// Repairs lineage `l` of `repo` (lifecycle layout, data repository, open
/// exclusively); `live` are the backups whose data is kept.
pub(crate) fn repair_lineage(
    repo: &Repository,
    l: &Lineage,
    live: &BTreeSet<BackupId>,
    dry: bool,
) -> Result<LineageRepair> {
    let backend = repo.backend().as_ref();
    let mut out = LineageRepair::default();
    let r = l.state.arranged;
    let mut parts: Vec<Part> = Vec::new();
    for (i, j, p) in l.all_cat_objects(backend)? {
        if l.cat_in_use(i, j) {
            parts.push(read_part(repo, cat_key(&l.name, i, j, p), i, j)?);
        }
    }
    for (j, ps) in l.all_volumes(backend)?.range(..r) {
        for &(p, first) in ps {
            parts.push(read_part(repo, vol_key(&l.name, *j, p, first), first, *j)?);
        }
    }
    // Every intact copy in the lineage: fingerprint → (part, chunk).
    let mut copies: FingerprintMap<(usize, usize)> = FingerprintMap::default();
    for (n, part) in parts.iter().enumerate() {
        for (c, (_, fp, _, _)) in part.intact.iter().enumerate() {
            copies.entry(*fp).or_insert((n, c));
        }
    }
    let index: BTreeMap<&str, usize> = parts
        .iter()
        .enumerate()
        .map(|(n, p)| (p.key.as_str(), n))
        .collect();
    // Copies to add to each bad part, and the readers of each part.
    let mut added: BTreeMap<usize, BTreeSet<Fingerprint>> = BTreeMap::new();
    let mut readers: BTreeMap<usize, BTreeSet<BackupId>> = BTreeMap::new();
    let mut still_lost: BTreeSet<Fingerprint> = BTreeSet::new();
    for v in &l.state.versions {
        if !live.contains(&v.backup) {
            continue;
        }
        let Ok(recipe) = repo.recipe(v.backup) else {
            continue; // reported by the snapshot and recipe steps
        };
        let mut present: BTreeSet<Fingerprint> = BTreeSet::new();
        let mut bad_read: Vec<usize> = Vec::new();
        for req in l.required(backend, v.version)? {
            let Some(&n) = index.get(req.key.as_str()) else {
                continue;
            };
            readers.entry(n).or_default().insert(v.backup);
            let part = &parts[n];
            present.extend(
                part.intact
                    .iter()
                    .filter(|(s, _, _, _)| *s <= req.max_start)
                    .map(|(_, fp, _, _)| *fp),
            );
            if part.bad && part.start <= req.max_start {
                bad_read.push(n);
            }
        }
        let (mut lost_chunks, mut lost_bytes) = (0u64, 0u64);
        let mut seen: BTreeSet<Fingerprint> = BTreeSet::new();
        for c in &recipe.chunks {
            if present.contains(&c.fp) || !seen.insert(c.fp) {
                continue;
            }
            match (copies.contains_key(&c.fp), bad_read.first()) {
                (true, Some(&n)) => {
                    added.entry(n).or_default().insert(c.fp);
                }
                _ => {
                    still_lost.insert(c.fp);
                    lost_chunks += 1;
                    lost_bytes += u64::from(c.len);
                }
            }
        }
        if lost_chunks > 0 {
            out.lost.push((v.backup, lost_chunks, lost_bytes));
        }
    }
    for (n, part) in parts.iter().enumerate() {
        if !part.bad {
            continue;
        }
        let extra = added.remove(&n).unwrap_or_default();
        // Categories by start: the intact chunks, then the copies at `start`.
        let mut cats: BTreeMap<u64, CategoryBuilder> = BTreeMap::new();
        for &(s, fp, at, len) in &part.intact {
            cats.entry(s)
                .or_insert_with(|| CategoryBuilder::new(s))
                .push(&fp, len, Some(&part.bytes[at..at + len as usize]));
        }
        for fp in &extra {
            let Some(&(m, c)) = copies.get(fp) else {
                continue;
            };
            let bytes = copy_of(repo, &parts[m], c)?;
            cats.entry(part.start)
                .or_insert_with(|| CategoryBuilder::new(part.start))
                .push(fp, bytes.len() as u32, Some(&bytes));
        }
        if !dry {
            // Entries are copied as stored: every data part of a
            // repository has the same encoding.
            let encoded = repo.config().encoding().is_some();
            let object = format::seal_volume(part.end, true, encoded, cats.into_values().collect());
            backend.write(&part.key, &object)?;
        }
        out.rewritten.push((
            part.key.clone(),
            format!(
                "rewritten with its {} intact chunk(s) and {} intact copies of chunks its readers had lost, found elsewhere in the lineage ({} damaged chunk(s) dropped)",
                part.intact.len(),
                extra.len(),
                part.dropped
            ),
            readers.remove(&n).unwrap_or_default().into_iter().collect(),
        ));
    }
    let key = crate::repo::quarantine::lineage_key(&l.name);
    let recorded = match crate::repo::quarantine::load_lineage(backend, &l.name)? {
        None => None,
        Some(crate::repo::quarantine::Quarantined::Chunks(s)) => Some(s),
        Some(crate::repo::quarantine::Quarantined::All) => Some(Default::default()),
    };
    let wanted: std::collections::HashSet<String> =
        still_lost.iter().map(|fp| fp.to_string()).collect();
    let differs = match &recorded {
        None => !wanted.is_empty(),
        // A damaged record (`All`) is always rewritten.
        Some(s) => *s != wanted || s.is_empty(),
    };
    if differs {
        if !dry {
            crate::repo::quarantine::replace_lineage(backend, &l.name, &still_lost)?;
        }
        out.quarantine = Some((key, still_lost.len()));
    }
    Ok(out)
}

/// Rewrites both copies of lineage `name`'s state when exactly one is
/// intact (both damaged: nothing to rewrite from).
pub(crate) fn repair_lineage_state(backend: &dyn Backend, name: &str, dry: bool) -> Result<bool> {
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

/// Lifecycle layout: rewrites every damaged or missing category and
/// volume part with its intact chunks and intact copies of the chunks its
/// readers lost ([`crate::layout::lifecycle::repair_lineage`]); lists the backups
/// left with holes.
pub(crate) fn repair_lineages(
    repo: &Repository,
    dry: bool,
    report: &mut RepairReport,
) -> Result<()> {
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
