//! The arranging stage (AVAR): round `v` splits every active category
//! Cat.(i,v-1) with version v's NDF table into the new active Cat.(i,v)
//! (chunks v references) and the archived Cat.(i,v-1), and groups the
//! archived categories of the round, by ascending `i`, into volume v-1.
//!
//! Crash safety: a round writes its journal, then only new objects (new
//! names), then commits by writing the lineage state (`arranged = v`), and
//! only then deletes its inputs, the old NDF tables and the journal. An
//! interrupted round leaves its inputs intact; the next `arrange` deletes
//! whatever the uncommitted round wrote and runs it again.

use super::backup::load_table;
use super::format::{self, Journal, PartWriter, ReadLog};
use super::{
    cat_key, journal_key, lineages, live_ids, ndf_dir, ndf_key, parse_num_name, require_layout,
    vol_key, Lineage,
};
use crate::backend::{Backend as _, LockMode};
use crate::error::{Error, Result};
use crate::progress::{Phase, Progress, Silent, Unit};
use crate::repo::Repository;
use serde::Serialize;
use std::collections::BTreeSet;
use std::time::Instant;

/// What an arranging run did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ArrangeStats {
    /// Rounds completed.
    pub rounds: u64,
    /// Interrupted rounds found (by their journal) and run again.
    pub resumed: u64,
    /// Active categories split.
    pub categories_split: u64,
    /// New active categories written.
    pub categories_written: u64,
    /// Volumes written.
    pub volumes_written: u64,
    /// Chunks migrated to new active categories.
    pub chunks_migrated: u64,
    /// Chunks archived into volumes.
    pub chunks_archived: u64,
    /// Chunks no live backup references any more, dropped instead of archived.
    pub chunks_dropped: u64,
    /// Bytes read from the backend.
    pub bytes_read: u64,
    /// Bytes written to the backend.
    pub bytes_written: u64,
    /// Objects deleted (split inputs, old NDF tables, leftovers of interrupted rounds).
    pub objects_deleted: u64,
    /// Rounds still pending after this run (arranging behind).
    pub pending_rounds: u64,
    /// Wall time.
    pub seconds: f64,
}

impl ArrangeStats {
    fn add(&mut self, o: &ArrangeStats) {
        self.rounds += o.rounds;
        self.resumed += o.resumed;
        self.categories_split += o.categories_split;
        self.categories_written += o.categories_written;
        self.volumes_written += o.volumes_written;
        self.chunks_migrated += o.chunks_migrated;
        self.chunks_archived += o.chunks_archived;
        self.chunks_dropped += o.chunks_dropped;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.objects_deleted += o.objects_deleted;
        self.pending_rounds += o.pending_rounds;
    }
}

/// Runs every pending arranging round of every lineage of `repo` (open
/// exclusively), resuming interrupted rounds first.
pub fn arrange(repo: &Repository) -> Result<ArrangeStats> {
    arrange_rounds(repo, None)
}

/// Like [`arrange`], reporting progress to `progress`: the rounds of
/// each lineage, one phase a lineage.
pub fn arrange_with_progress(repo: &Repository, progress: &dyn Progress) -> Result<ArrangeStats> {
    arrange_rounds_with_progress(repo, None, progress)
}

/// Like [`arrange`], but runs at most `limit` rounds per lineage (arranging
/// that catches up gradually).
pub fn arrange_rounds(repo: &Repository, limit: Option<u64>) -> Result<ArrangeStats> {
    arrange_rounds_with_progress(repo, limit, &Silent)
}

fn arrange_rounds_with_progress(
    repo: &Repository,
    limit: Option<u64>,
    progress: &dyn Progress,
) -> Result<ArrangeStats> {
    require_layout(repo)?;
    repo.require(LockMode::Exclusive, "arranging")?;
    let started = Instant::now();
    let mut total = ArrangeStats::default();
    for mut l in lineages(repo.backend().as_ref())? {
        let s = arrange_lineage(repo, &mut l, limit, progress)?;
        total.add(&s);
    }
    total.seconds = started.elapsed().as_secs_f64();
    Ok(total)
}

/// Arranges one lineage: cleans up after an interrupted round, then runs up
/// to `limit` pending rounds.
pub(crate) fn arrange_lineage(
    repo: &Repository,
    lineage: &mut Lineage,
    limit: Option<u64>,
    progress: &dyn Progress,
) -> Result<ArrangeStats> {
    let started = Instant::now();
    let io_before = repo.io_stats();
    let mut stats = ArrangeStats::default();
    let backend = repo.backend().as_ref();
    if backend.exists(&journal_key(&lineage.name))? {
        stats.resumed += 1;
    }
    cleanup(repo, lineage, &mut stats)?;
    let live = lineage.live_versions(&live_ids(repo)?);
    let pending = lineage.state.last() - lineage.state.arranged;
    let phase = Phase::begin(
        progress,
        &format!("lineage {}", lineage.name),
        Unit::Rounds,
        Some(limit.map_or(pending, |n| n.min(pending))),
    );
    while lineage.state.arranged < lineage.state.last() && limit.is_none_or(|n| stats.rounds < n) {
        let v = lineage.state.arranged + 1;
        round(repo, lineage, v, &live, &mut stats)?;
        stats.rounds += 1;
        phase.add(1);
    }
    phase.end();
    stats.pending_rounds = lineage.state.last() - lineage.state.arranged;
    let io = repo.io_stats().since(&io_before);
    stats.bytes_read = io.read_bytes;
    stats.bytes_written = io.write_bytes;
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// Deletes what an interrupted round (or backup) left: category parts
/// that are neither active nor pending, volumes at or above the arranged
/// round, NDF tables no round or backup needs, and the journal (last).
fn cleanup(repo: &Repository, lineage: &Lineage, stats: &mut ArrangeStats) -> Result<()> {
    let backend = repo.backend().as_ref();
    let (r, last) = (lineage.state.arranged, lineage.state.last());
    let l = &lineage.name;
    for (i, j, p) in lineage.cat_objects(backend)? {
        let active = j == r && i <= r && r > 0;
        let pending = i == j && j > r && j <= last;
        if !active && !pending {
            backend.delete(&cat_key(l, i, j, p))?;
            stats.objects_deleted += 1;
        }
    }
    for (j, parts) in lineage.volumes(backend)? {
        if j >= r {
            for (p, first) in parts {
                backend.delete(&vol_key(l, j, p, first))?;
                stats.objects_deleted += 1;
            }
        }
    }
    for name in backend.list(&ndf_dir(l))? {
        if let Some(v) = parse_num_name(&name) {
            if v < r || v > last {
                backend.delete(&ndf_key(l, v))?;
                stats.objects_deleted += 1;
            }
        }
    }
    backend.delete(&journal_key(l))
}

/// Arranging round `v` (the active categories are Cat.(i, v-1)).
fn round(
    repo: &Repository,
    lineage: &mut Lineage,
    v: u64,
    live: &BTreeSet<u64>,
    stats: &mut ArrangeStats,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    let has_data = !repo.config().trace;
    // Chunks move as they are stored (encoded entries, in a compressing repository).
    let encoded = repo.config().encoding().is_some();
    let part_bytes = repo.config().lifecycle_part_bytes;
    let l = lineage.name.clone();
    // Active parts (i, p) of Cat.(i, v-1), ascending.
    let inputs: Vec<(u64, u32)> = lineage
        .cat_objects(backend)?
        .into_iter()
        .filter(|&(i, j, _)| v > 1 && j == v - 1 && i < v)
        .map(|(i, _, p)| (i, p))
        .collect();
    // A part the state lists but that is gone holds chunks this round
    // would lose: stop (damage; `tessera repair` rewrites the part).
    let cats = format!("{}/", super::cat_dir(&l));
    let missing = lineage.missing_parts(backend)?;
    if let Some(k) = missing.iter().find(|k| k.starts_with(&cats)) {
        return Err(Error::corrupt(
            k,
            "missing: the lineage state lists this category part",
        ));
    }
    let journal = Journal {
        round: v,
        inputs: inputs
            .iter()
            .map(|&(i, p)| cat_key(&l, i, v - 1, p))
            .collect(),
        outputs: vec![
            format!("{}/{:016x}-{:016x}-*", super::cat_dir(&l), 0, v),
            format!("{}/{:016x}-*", super::vol_dir(&l), v - 1),
        ],
    };
    backend.write(&journal_key(&l), &journal.encode())?;
    if !inputs.is_empty() {
        // Without version v's table (and recipe), every chunk stays active:
        // keeping a chunk in a category whose lifecycle is too long only
        // costs space, archiving one v references would lose it.
        let table = load_table(repo, lineage, v)?;
        let referenced =
            |fp: &crate::fingerprint::Fingerprint| table.as_ref().is_none_or(|t| t.contains(fp));
        let mut log = ReadLog::default();
        let mut archive = PartWriter::new(backend, v - 1, has_data, part_bytes, |p, first| {
            vol_key(&l, v - 1, p, first)
        })
        .copying(encoded);
        // Versions below the oldest live one are gone for good: a category
        // Cat.(i,j) with i < oldest has the live lifecycle oldest..=j, so the
        // active categories starting below it are merged into the oldest's
        // (and archived likewise). Without this, a lineage would keep one
        // active category per version ever backed up, and restoring any
        // version would read all of them (one object and extent each).
        // (At most v-1: Cat.(v,v) is version v's pending category.)
        let oldest = live.first().copied();
        let start_of = |i: u64| oldest.map_or(i, |o| i.max(o.min(v - 1)));
        // The writer of the new active category being written, by start.
        let mut migrate: Option<(u64, PartWriter)> = None;
        let mut k = 0;
        while k < inputs.len() {
            let i = inputs[k].0;
            let to = start_of(i);
            if migrate.as_ref().is_none_or(|(s, _)| *s != to) {
                if let Some((_, w)) = migrate.take() {
                    stats.categories_written += u64::from(w.finish()?);
                }
                let key_of = {
                    let l = l.clone();
                    move |p: u32, _: u64| cat_key(&l, to, v, p)
                };
                migrate = Some((
                    to,
                    PartWriter::new(backend, v, has_data, part_bytes, key_of).copying(encoded),
                ));
            }
            let Some((_, writer)) = migrate.as_mut() else {
                return Err(Error::Pipeline("arranging lost its category writer".into()));
            };
            // Dead: no live version in [i, v-1] (nothing can reference it any more).
            let dead = live.range(i..v).next().is_none();
            while k < inputs.len() && inputs[k].0 == i {
                let key = cat_key(&l, i, v - 1, inputs[k].1);
                k += 1;
                let header = format::read_header(backend, &key, &mut log)?;
                if header.categories.len() > 1 || header.end != v - 1 {
                    return Err(Error::corrupt(
                        &key,
                        "an active category part holds several categories",
                    ));
                }
                let Some(entry) = header.categories.first() else {
                    continue;
                };
                if entry.start != i {
                    return Err(Error::corrupt(
                        &key,
                        "category start disagrees with its name",
                    ));
                }
                if header.encoded != (encoded && has_data) {
                    return Err(Error::corrupt(
                        &key,
                        "its chunk encoding (flag bit 1) disagrees with the repository's compression",
                    ));
                }
                let metas = format::read_meta(backend, &key, &header, 0, &mut log)?;
                // Parts written before a checksum fails are outputs of an
                // uncommitted round: the next arrange deletes them.
                format::stream_category(
                    backend,
                    &key,
                    &header,
                    0,
                    &metas,
                    &mut log,
                    |fp, len, bytes| {
                        if referenced(&fp) {
                            stats.chunks_migrated += 1;
                            writer.push(to, &fp, len, bytes)
                        } else if dead {
                            stats.chunks_dropped += 1;
                            Ok(())
                        } else {
                            stats.chunks_archived += 1;
                            archive.push(to, &fp, len, bytes)
                        }
                    },
                )?;
            }
            stats.categories_split += 1;
        }
        if let Some((_, w)) = migrate.take() {
            stats.categories_written += u64::from(w.finish()?);
        }
        stats.volumes_written += u64::from(archive.finish()? > 0);
    }
    // Commit the round, then delete what it replaced.
    let mut written: Vec<String> = lineage
        .cat_objects(backend)?
        .into_iter()
        .filter(|&(_, j, _)| j == v)
        .map(|(i, j, p)| cat_key(&l, i, j, p))
        .collect();
    if let Some(parts) = lineage.volumes(backend)?.get(&(v - 1)) {
        written.extend(parts.iter().map(|&(p, first)| vol_key(&l, v - 1, p, first)));
    }
    lineage.update_parts(backend, &journal.inputs, &written)?;
    lineage.state.arranged = v;
    lineage.save(backend)?;
    for key in &journal.inputs {
        backend.delete(key)?;
        stats.objects_deleted += 1;
    }
    for name in backend.list(&ndf_dir(&l))? {
        if let Some(w) = parse_num_name(&name) {
            if w < v {
                backend.delete(&ndf_key(&l, w))?;
                stats.objects_deleted += 1;
            }
        }
    }
    backend.delete(&journal_key(&l))
}
