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

use super::format::{self, Journal, PartWriter, ReadLog, VolumeHeader};
use super::table::with_table;
use super::{
    cat_key, journal_key, lineages, live_ids, ndf_dir, ndf_key, parse_num_name, require_layout,
    vol_key, Lineage,
};
use crate::backend::{Backend, LockMode};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::progress::{Phase, Progress, Silent, Unit};
use crate::repo::Repository;
use crate::util::sorted_pairs::{Sorted, Sorter};
use crate::util::spill::DEFAULT_SORT_BUDGET;
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

/// Options of an arranging run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrangeOptions {
    /// Rounds run at most per lineage (`None`: every pending round;
    /// a limit makes arranging catch up gradually).
    pub rounds: Option<u64>,
    /// Memory of each of a round's sorts (the active chunks by fingerprint,
    /// the positions of those version v references), beyond which they
    /// spill to unnamed temporary files: a round's memory is bounded
    /// whatever the version's size.
    pub sort_budget: u64,
}

impl Default for ArrangeOptions {
    fn default() -> Self {
        ArrangeOptions {
            rounds: None,
            sort_budget: DEFAULT_SORT_BUDGET,
        }
    }
}

/// Runs every pending arranging round of every lineage of `repo` (open
/// exclusively), resuming interrupted rounds first.
pub fn arrange(repo: &Repository) -> Result<ArrangeStats> {
    arrange_with_options(repo, &ArrangeOptions::default(), &Silent)
}

/// Like [`arrange`], reporting progress to `progress`: the rounds of
/// each lineage, one phase a lineage.
pub fn arrange_with_progress(repo: &Repository, progress: &dyn Progress) -> Result<ArrangeStats> {
    arrange_with_options(repo, &ArrangeOptions::default(), progress)
}

/// Like [`arrange`], but runs at most `limit` rounds per lineage (arranging
/// that catches up gradually).
pub fn arrange_rounds(repo: &Repository, limit: Option<u64>) -> Result<ArrangeStats> {
    let options = ArrangeOptions {
        rounds: limit,
        ..ArrangeOptions::default()
    };
    arrange_with_options(repo, &options, &Silent)
}

/// Like [`arrange_with_progress`], with `options`.
pub fn arrange_with_options(
    repo: &Repository,
    options: &ArrangeOptions,
    progress: &dyn Progress,
) -> Result<ArrangeStats> {
    require_layout(repo)?;
    repo.require(LockMode::Exclusive, "arranging")?;
    let started = Instant::now();
    let mut total = ArrangeStats::default();
    for mut l in lineages(repo.backend().as_ref())? {
        let s = arrange_lineage(repo, &mut l, options, progress)?;
        total.add(&s);
    }
    total.seconds = started.elapsed().as_secs_f64();
    Ok(total)
}

/// Arranges one lineage: cleans up after an interrupted round, then runs up
/// to `options.rounds` pending rounds.
pub(crate) fn arrange_lineage(
    repo: &Repository,
    lineage: &mut Lineage,
    options: &ArrangeOptions,
    progress: &dyn Progress,
) -> Result<ArrangeStats> {
    let limit = options.rounds;
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
        round(repo, lineage, v, &live, options.sort_budget, &mut stats)?;
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

/// The header of active part `key` of Cat.(i, v-1), checked against its
/// name and the repository; `None` if it holds no category.
fn active_header(
    backend: &dyn Backend,
    key: &str,
    (i, v): (u64, u64),
    encoded: bool,
    log: &mut ReadLog,
) -> Result<Option<VolumeHeader>> {
    let header = format::read_header(backend, key, log)?;
    if header.categories.len() > 1 || header.end != v - 1 {
        return Err(Error::corrupt(
            key,
            "an active category part holds several categories",
        ));
    }
    let Some(entry) = header.categories.first() else {
        return Ok(None);
    };
    if entry.start != i {
        return Err(Error::corrupt(
            key,
            "category start disagrees with its name",
        ));
    }
    if header.encoded != encoded {
        return Err(Error::corrupt(
            key,
            "its chunk encoding (flag bit 1) disagrees with the repository's compression",
        ));
    }
    Ok(Some(header))
}

/// The positions of the active chunks version `v` references, ascending
/// (a chunk's position counts the chunks before it in the active parts
/// `parts`, (start, key), in order), sorted in `budget` bytes: the chunks
/// sorted by fingerprint, merge-joined with version v's NDF table (sorted
/// on disk), the hits sorted back by position. `None` without version v's
/// table and recipe.
fn referenced_positions(
    repo: &Repository,
    lineage: &Lineage,
    v: u64,
    parts: &[(u64, String)],
    encoded: bool,
    budget: u64,
) -> Result<Option<Sorted<u64>>> {
    let backend = repo.backend().as_ref();
    let mut log = ReadLog::default();
    let mut by_fp = Sorter::<(Fingerprint, u64)>::with_budget(budget);
    let mut position = 0u64;
    for (i, key) in parts {
        let Some(header) = active_header(backend, key, (*i, v), encoded, &mut log)? else {
            continue;
        };
        for (fp, _) in format::read_meta(backend, key, &header, 0, &mut log)? {
            by_fp.push((fp, position))?;
            position += 1;
        }
    }
    let by_fp = by_fp.finish()?;
    with_table(repo, lineage, v, budget, |next_in_table| {
        let mut referenced = Sorter::<u64>::with_budget(budget);
        let mut chunks = by_fp.stream()?;
        let mut table = next_in_table()?;
        while let Some((fp, position)) = chunks.next()? {
            while table.is_some_and(|t| t < fp) {
                table = next_in_table()?;
            }
            if table == Some(fp) {
                referenced.push(position)?;
            }
        }
        referenced.finish()
    })
}

/// Splits the active categories `inputs` — parts (i, p) of Cat.(i, v-1),
/// ascending — of round `v`: chunks version `v` references migrate to the
/// new active categories Cat.(i, v), the others are archived into volume
/// v-1, or dropped when no live version can reference them any more.
fn split_categories(
    repo: &Repository,
    lineage: &Lineage,
    v: u64,
    live: &BTreeSet<u64>,
    inputs: &[(u64, u32)],
    sort_budget: u64,
    stats: &mut ArrangeStats,
) -> Result<()> {
    let backend = repo.backend().as_ref();
    let has_data = !repo.config().trace;
    // Chunks move as they are stored (encoded entries, in a compressing repository).
    let encoded = repo.config().encoding().is_some();
    let part_bytes = repo.config().lifecycle_part_bytes;
    let l = lineage.name.clone();
    // Without version v's table (and recipe), every chunk stays active:
    // keeping a chunk in a category whose lifecycle is too long only
    // costs space, archiving one v references would lose it.
    // The round decides by position: the chunks v references, found
    // by a merge join in bounded memory (no table in memory), are read
    // back in the order the parts stream their chunks.
    let parts: Vec<(u64, String)> = inputs
        .iter()
        .map(|&(i, p)| (i, cat_key(&l, i, v - 1, p)))
        .collect();
    let positions =
        referenced_positions(repo, lineage, v, &parts, encoded && has_data, sort_budget)?;
    let mut kept = positions.as_ref().map(Sorted::stream).transpose()?;
    let mut position = 0u64;
    let mut referenced = || -> Result<bool> {
        let at = position;
        position += 1;
        let Some(kept) = kept.as_mut() else {
            return Ok(true);
        };
        let hit = kept.peek()? == Some(at);
        if hit {
            kept.next()?;
        }
        Ok(hit)
    };
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
            let Some(header) = active_header(backend, &key, (i, v), encoded && has_data, &mut log)?
            else {
                continue;
            };
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
                    if referenced()? {
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
    Ok(())
}

/// Arranging round `v` (the active categories are Cat.(i, v-1)); its
/// sorts hold `sort_budget` bytes of memory each.
fn round(
    repo: &Repository,
    lineage: &mut Lineage,
    v: u64,
    live: &BTreeSet<u64>,
    sort_budget: u64,
    stats: &mut ArrangeStats,
) -> Result<()> {
    let backend = repo.backend().as_ref();
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
        split_categories(repo, lineage, v, live, &inputs, sort_budget, stats)?;
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
