//! Retention and mark-sweep garbage collection of the container layout.
//!
//! `mark` walks every live recipe into a table of valid chunks per
//! container; `select` picks containers by utilization (live bytes / stored
//! bytes) against a threshold — 0% reclaims every dead byte (perfect GC),
//! 100% only wholly dead containers (container-marker style); `sweep` copies
//! the valid chunks of selected containers forward into new containers,
//! then the index and the recipes are updated and the old containers deleted.
//!
//! Crash safety: new containers are durable before the index and recipes
//! name them, every recipe is rewritten atomically, and old containers are
//! deleted only after every recipe and the index have moved on. An
//! interrupted GC leaves a valid repository plus garbage the next GC reclaims.
//!
//! Delta-encoded chunks (PFC-delta) name their base by container id, so a
//! base that a surviving delta needs is live too and never moves: a selected
//! container holding such bases is rewritten in place (same id, atomically)
//! with only its live chunks, after the index and recipes have moved on;
//! the live chunks of other selected containers migrate as usual, deltas
//! keeping their base reference.

use crate::backend::{Backend, LockMode};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintHashBuilder};
use crate::format::compression::Compression;
use crate::format::snapshot::{self, BackupId};
use crate::index::Relocations;
use crate::layout::container::{self, Builder, Container, ContainerId};
use crate::progress::{Phase, Progress, Silent, Unit};
use crate::repo::Repository;
use crate::util::sorted_pairs::{PairSorter, SortedPairs};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

mod fold;
mod gccdf;

type LiveSet = hashbrown::HashSet<(ContainerId, Fingerprint), FingerprintHashBuilder>;

/// The default of [`GcOptions::sort_budget`] (and of `check`'s).
pub use crate::util::spill::DEFAULT_SORT_BUDGET;

/// How the copy-forward orders the live chunks it migrates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Defrag {
    /// In container order (plain mark-sweep).
    #[default]
    None,
    /// GCCDF: ownership clustering with a binary tree over backups, newest first.
    Gccdf,
    /// Random order within each segment (the GCCDF paper's ablation).
    Random,
    /// In container order, as plain mark-sweep, with container fill
    /// ([`Fill`]) as GCCDF's: the fill without the reordering.
    Fill,
}

impl Defrag {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Defrag::None => "none",
            Defrag::Gccdf => "gccdf",
            Defrag::Random => "random",
            Defrag::Fill => "fill",
        }
    }
}

impl std::str::FromStr for Defrag {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Defrag::None),
            "gccdf" => Ok(Defrag::Gccdf),
            "random" => Ok(Defrag::Random),
            "fill" => Ok(Defrag::Fill),
            other => Err(format!(
                "unknown defragmentation {other:?} (expected none, gccdf, random or fill)"
            )),
        }
    }
}

/// Options of a garbage collection (with the `cli` feature, the arguments
/// of `tessera gc`: their help is the command line's).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct GcOptions {
    /// Utilization threshold in percent: a container with dead chunks is
    /// copied forward when its live bytes are at most `100 - threshold`
    /// percent of its stored bytes. 0 = perfect GC, 100 = only wholly dead containers.
    #[cfg_attr(
        feature = "cli",
        arg(
            long = "threshold",
            value_name = "THRESHOLD",
            default_value_t = 0.0,
            help = "Utilization threshold in percent: 0 reclaims every dead byte (perfect GC), 100 only wholly dead containers"
        )
    )]
    pub threshold_pct: f64,
    /// Order of the migrated chunks.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            default_value = "none",
            help = "Order of the migrated chunks: none (container order), gccdf (ownership clustering, newest backups first), random, or fill (container order, merging wholly live containers stored below half the container size as gccdf does: its container fill without the ownership analysis). In a compressed repository every backup's container is stored below half its size, so gccdf and fill copy each forward once into fuller containers: restores read far fewer containers for 2-4x GC's I/O (see docs/RESEARCH.md, GCCDF)"
        )
    )]
    pub defrag: Defrag,
    /// Containers per segment (the unit GCCDF reorders within, held in memory).
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            default_value_t = 100,
            help = "Containers per segment (GCCDF reorders within a segment, held in memory)"
        )
    )]
    pub segment: usize,
    /// GCCDF: a cluster smaller than this many bytes is not split further.
    #[cfg_attr(feature = "cli", arg(
        long,
        default_value = "64KiB",
        value_parser = crate::parse_size,
        help = "GCCDF: clusters smaller than this are not split further"
    ))]
    pub split_threshold: u64,
    /// GCCDF, random and fill: also copy forward wholly live containers
    /// stored below half the container size, to fill containers ([`Fill`]).
    #[cfg_attr(feature = "cli", arg(
        long = "no-fill",
        action = clap::ArgAction::SetFalse,
        help = "GCCDF and random: do not copy forward wholly live containers below half the container size (no container fill)"
    ))]
    pub fill: bool,
    /// Memory (bytes) of each of GC's two structures that grow with the
    /// repository, beyond which they spill to temporary files: the mark
    /// phase's buffer of live (container, fingerprint) pairs (sorted
    /// externally; select and sweep then hold one container's live chunks
    /// at a time — the delta-compressing repositories' selection still
    /// loads them all) and the map of the chunks it moved.
    #[cfg_attr(feature = "cli", arg(
        long = "sort-memory",
        value_name = "SIZE",
        default_value = "32MiB",
        value_parser = crate::parse_size,
        help = "Memory for each of GC's structures that grow with the repository (live chunks, moved chunks); past it they spill to temporary files"
    ))]
    pub sort_budget: u64,
}

impl GcOptions {
    /// Checks that every option is in its valid range.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidOption(what));
        if !(0.0..=100.0).contains(&self.threshold_pct) {
            return bad(format!(
                "GC threshold (--threshold) {}% is outside 0..=100",
                self.threshold_pct
            ));
        }
        if self.segment == 0 {
            return bad("GC segment (--segment) is 0 containers: valid range 1 or more".into());
        }
        if self.split_threshold == 0 {
            return bad(
                "GCCDF split threshold (--split-threshold) is 0 bytes: valid range 1 byte or more"
                    .into(),
            );
        }
        Ok(())
    }
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            threshold_pct: 0.0,
            defrag: Defrag::None,
            segment: 100,
            split_threshold: 64 * 1024,
            fill: true,
            sort_budget: DEFAULT_SORT_BUDGET,
        }
    }
}

/// Seconds spent per GC stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GcStageSeconds {
    /// Walking live recipes.
    pub mark: f64,
    /// Reading container metadata and choosing containers.
    pub select: f64,
    /// GCCDF: ownership analysis and packing plan.
    pub analyze: f64,
    /// Reading the selected containers.
    pub sweep_read: f64,
    /// Writing the live chunks forward.
    pub sweep_write: f64,
    /// Rewriting the index and the recipes.
    pub update: f64,
    /// Deleting old containers.
    pub delete: f64,
}

/// Metrics of one garbage collection.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GcStats {
    /// Containers examined.
    pub containers_total: u64,
    /// Containers selected (copied forward or reclaimed whole).
    pub containers_involved: u64,
    /// Containers deleted.
    pub containers_reclaimed: u64,
    /// Containers written by the copy-forward.
    pub containers_produced: u64,
    /// Live chunks copied forward.
    pub chunks_moved: u64,
    /// Bytes of live chunks copied forward.
    pub bytes_moved: u64,
    /// Live chunks not copied because this GC had already copied their
    /// fingerprint from another container, or folded away because another
    /// container keeps their fingerprint (FORMAT.md §16.2): both places now
    /// name one copy.
    pub copies_merged: u64,
    /// Bytes read from the backend.
    pub bytes_read: u64,
    /// Bytes written to the backend.
    pub bytes_written: u64,
    /// Container bytes freed (deleted minus produced).
    pub bytes_freed: i64,
    /// Recipes rewritten to name the new containers.
    pub recipes_rewritten: u64,
    /// Leftover recipes of interrupted backups removed.
    pub uncommitted_recipes_removed: u64,
    /// Temporary files of interrupted writes removed (only with the exclusive lock).
    pub temporaries_removed: u64,
    /// Wholly live containers filled below half the container size that
    /// were copied forward to fill containers (GCCDF and its random
    /// ablation; see [`Fill`]).
    pub containers_refilled: u64,
    /// Segments the selected containers were processed in.
    pub segments: u64,
    /// GCCDF: clusters (binary tree leaves), summed over segments.
    pub tree_leaves: u64,
    /// GCCDF: binary tree nodes, summed over segments.
    pub tree_nodes: u64,
    /// Wall time.
    pub seconds: f64,
    /// Time per stage.
    pub stage_seconds: GcStageSeconds,
}

/// Deletes all but the `keep` newest backups; returns the deleted ids. (The
/// lifecycle layout frees their space at once; the container layout at the next GC.)
pub fn forget_keep_last(repo: &Repository, keep: usize, dry_run: bool) -> Result<Vec<BackupId>> {
    let ids = crate::format::snapshot::forget_candidates(&repo.snapshots()?, keep);
    if !dry_run {
        crate::layout::delete_backups(repo, &ids)?;
    }
    Ok(ids)
}

/// What `select` decided for a container.
struct Selected {
    id: ContainerId,
    /// Stored bytes (nominal, with data).
    size: u64,
    /// Whether it still holds live chunks (copied forward) or none (deleted only).
    has_live: bool,
}

/// Collects garbage in `repo` (open exclusively).
pub fn gc(repo: &Repository, options: GcOptions) -> Result<GcStats> {
    gc_with_progress(repo, options, &Silent)
}

/// Collects garbage in `repo` (open exclusively), reporting progress to
/// `progress`: mark (backups), select (containers), sweep (containers
/// copied forward), recipes (backups), delete (containers).
pub fn gc_with_progress(
    repo: &Repository,
    options: GcOptions,
    progress: &dyn Progress,
) -> Result<GcStats> {
    repo.require(LockMode::Exclusive, "garbage collection")?;
    crate::layout::require_gc(repo)?;
    options.validate()?;
    let started = Instant::now();
    let io_before = repo.io_stats();
    let backend = repo.backend().as_ref();
    let mut run = Run {
        repo,
        options,
        progress,
        // Damage found by check or repair: a container whose damage no backup
        // uses any more is selected, so that the damage goes with it.
        quarantined: crate::repo::quarantine::load(backend)?,
        stats: GcStats {
            // The lock is exclusive: no write is in progress.
            temporaries_removed: backend.remove_temporaries()?,
            ..GcStats::default()
        },
    };

    let t = Instant::now();
    let mut marked = mark(
        repo,
        options.defrag == Defrag::Gccdf,
        options.sort_budget,
        progress,
    )?;
    let (live, folds) = fold::fold(repo, &run.quarantined, marked.live, options.sort_budget)?;
    marked.live = live;
    let containers = repo.containers()?;
    run.stats.stage_seconds.mark = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let selection = run.select(&containers, &marked.live)?;
    run.stats.stage_seconds.select = t.elapsed().as_secs_f64();

    let mut writer = Forward {
        backend,
        capacity: repo.config().container_size as usize,
        trace: repo.config().trace,
        deltas: repo.config().delta.kind != crate::delta::DeltaKind::None,
        encoding: repo.config().encoding(),
        next_id: repo.next_container_id()?,
        open: None,
        produced: 0,
        produced_bytes: 0,
    };
    // Where this GC copied each fingerprint: a chunk live in two selected
    // containers (an old copy and a copy a rewriting policy made) is
    // written once, and both old places point to that copy. (Not to a copy
    // that stays in place: those sit in sparse containers kept for delta
    // bases, which would scatter the chunk's readers.) Spilled to temporary
    // files past the budget.
    let mut moved = Relocations::with_budget(options.sort_budget);
    run.sweep(&selection, &marked, &mut writer, &mut moved)?;

    let t = Instant::now();
    let removed: BTreeSet<ContainerId> = selection.selected.iter().map(|s| s.id).collect();
    run.stats.copies_merged += fold::relocate(&folds, &removed, &mut moved)?;
    // Nothing selected: the index names no removed container; only the
    // DDFS runs that shared backups left for each other are deleted
    // (FORMAT.md §13.3), by a commit that writes its manifest again.
    let leftovers = repo.config().shared_writers()
        && repo.config().index == crate::repo::config::IndexKind::Ddfs;
    if !removed.is_empty() || leftovers {
        let mut index = repo.open_index()?;
        if !removed.is_empty() {
            index.relocate(&removed, &moved)?;
        }
        index.commit(writer.next_id)?;
    }
    run.rewrite_recipes(&marked.retained, &removed, &moved)?;
    run.stats.stage_seconds.update = t.elapsed().as_secs_f64();
    if repo.config().delta.kind == crate::delta::DeltaKind::Pfc && !removed.is_empty() {
        crate::delta::pfc::relocate(backend, &removed, &moved)?;
    }

    let t = Instant::now();
    repo.reserve_container_ids(writer.next_id)?;
    let freed = run.delete_selected(&selection, &writer)?;
    run.remove_leftover_recipes(&marked.retained)?;
    run.stats.stage_seconds.delete = t.elapsed().as_secs_f64();

    let mut stats = run.stats;
    let io = repo.io_stats().since(&io_before);
    stats.bytes_read = io.read_bytes;
    stats.bytes_written = io.write_bytes;
    stats.bytes_freed = freed as i64 - writer.produced_bytes as i64;
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// What select decided: the containers to process and, with delta
/// compression, the bases pinned where they are.
struct Selection {
    selected: Vec<Selected>,
    /// Live delta bases that stay in their (selected) containers.
    pinned: LiveSet,
    /// `pinned` and every other live chunk of a container holding one.
    stay: LiveSet,
    /// The containers holding pinned bases (compacted in place).
    holds_pinned: BTreeSet<ContainerId>,
}

/// One garbage collection under way: its settings and what it counted.
struct Run<'a> {
    repo: &'a Repository,
    options: GcOptions,
    progress: &'a dyn Progress,
    quarantined: HashMap<ContainerId, crate::repo::quarantine::Quarantined>,
    stats: GcStats,
}

impl Run<'_> {
    /// Select: the containers sparse enough (or damaged) to copy forward
    /// or delete.
    fn select(&mut self, containers: &[ContainerId], live: &SortedPairs) -> Result<Selection> {
        let backend = self.repo.backend().as_ref();
        self.stats.containers_total = containers.len() as u64;
        let keep_fraction = 1.0 - self.options.threshold_pct / 100.0;
        let selection = if self.repo.config().delta.kind == crate::delta::DeltaKind::None {
            let phase = Phase::begin(
                self.progress,
                "select",
                Unit::Containers,
                Some(containers.len() as u64),
            );
            let mut fill = Fill::new(&self.options, u64::from(self.repo.config().container_size));
            let mut selected = Vec::new();
            let mut stream = live.stream()?;
            for &cid in containers {
                phase.add(1);
                let here = fingerprint_set(stream.take(cid)?);
                let damage = self.quarantined.get(&cid);
                selected.extend(select_one(
                    backend,
                    cid,
                    &here,
                    damage,
                    keep_fraction,
                    &mut fill,
                )?);
            }
            phase.end();
            self.stats.containers_refilled = fill.add_to(&mut selected);
            Selection {
                selected,
                pinned: LiveSet::default(),
                stay: LiveSet::default(),
                holds_pinned: BTreeSet::new(),
            }
        } else {
            let mut all = LiveSet::default();
            let mut stream = live.stream()?;
            while let Some(pair) = stream.next()? {
                all.insert(pair);
            }
            let (selected, pinned) =
                select_pinning_bases(backend, containers, &mut all, keep_fraction)?;
            // A selected container holding pinned bases is compacted in place with
            // all its live chunks, not only the bases: the backups whose deltas
            // use a base are those that read its neighbours (bases are taken from
            // containers a backup references), so a restore that reads the
            // container for those finds the base there too, instead of reading a
            // container kept for the base alone.
            let holds_pinned: BTreeSet<ContainerId> = pinned.iter().map(|(c, _)| *c).collect();
            let mut stay = pinned.clone();
            stay.extend(
                all.iter()
                    .filter(|(c, _)| holds_pinned.contains(c))
                    .copied(),
            );
            Selection {
                selected,
                pinned,
                stay,
                holds_pinned,
            }
        };
        self.stats.containers_involved = selection.selected.len() as u64;
        Ok(selection)
    }

    /// Sweep: copies live chunks forward, a segment of containers at a
    /// time, in the order the defragmentation policy plans.
    fn sweep(
        &mut self,
        selection: &Selection,
        marked: &Marked,
        writer: &mut Forward,
        moved: &mut Relocations,
    ) -> Result<()> {
        let segment = match self.options.defrag {
            Defrag::None | Defrag::Fill => 1,
            Defrag::Gccdf | Defrag::Random => self.options.segment,
        };
        // Ascending, as the live pairs stream.
        let mut with_live: Vec<ContainerId> = selection
            .selected
            .iter()
            .filter(|s| s.has_live)
            .map(|s| s.id)
            .collect();
        with_live.sort_unstable();
        let mut stream = marked.live.stream()?;
        let phase = Phase::begin(
            self.progress,
            "sweep",
            Unit::Containers,
            Some(with_live.len() as u64),
        );
        for group in with_live.chunks(segment) {
            phase.add(group.len() as u64);
            self.stats.segments += 1;
            let t = Instant::now();
            let mut cache = Vec::new();
            for &cid in group {
                // Pinned bases are live too.
                let here = fingerprint_set(stream.take(cid)?);
                self.read_live(cid, &here, selection, moved, &mut cache)?;
            }
            self.stats.stage_seconds.sweep_read += t.elapsed().as_secs_f64();

            let t = Instant::now();
            let order = self.segment_order(group, &cache, &marked.owners)?;
            self.stats.stage_seconds.analyze += t.elapsed().as_secs_f64();

            let t = Instant::now();
            for i in order {
                let c = &cache[i];
                let m = c.meta();
                let new = match moved.copy_of(&m.fp)? {
                    Some(new) => {
                        self.stats.copies_merged += 1;
                        new
                    }
                    None => {
                        let new = writer.push(&c.container, c.index)?;
                        self.stats.chunks_moved += 1;
                        self.stats.bytes_moved += u64::from(m.len);
                        new
                    }
                };
                moved.insert((c.container.header.id, m.fp), new)?;
            }
            self.stats.stage_seconds.sweep_write += t.elapsed().as_secs_f64();
        }
        phase.end();
        let t = Instant::now();
        writer.seal()?;
        self.stats.stage_seconds.sweep_write += t.elapsed().as_secs_f64();
        self.stats.containers_produced = writer.produced;
        Ok(())
    }

    /// Reads container `cid` and adds its live chunks (`here`, and its
    /// pinned bases) to `cache`, each verified; chunks that stay in place
    /// are recorded in `moved` as their own copy.
    fn read_live(
        &self,
        cid: ContainerId,
        here: &hashbrown::HashSet<Fingerprint, FingerprintHashBuilder>,
        selection: &Selection,
        moved: &mut Relocations,
        cache: &mut Vec<LiveChunk>,
    ) -> Result<()> {
        let repo = self.repo;
        let trace = repo.config().trace;
        let algo = repo.fingerprinter();
        let deltas = repo.config().delta.kind != crate::delta::DeltaKind::None;
        let bytes = repo.backend().read(&container::key(cid))?;
        // A container with damage no backup uses: every live chunk is
        // verified below, the damaged bytes are not copied.
        let ct = Arc::new(match self.quarantined.contains_key(&cid) && !deltas {
            true => Container::parse_unchecked_data(cid, bytes)?,
            false => Container::parse(cid, bytes)?,
        });
        // This container's chunks already handled (a chunk listed twice is taken once).
        let mut taken = hashbrown::HashSet::with_hasher(FingerprintHashBuilder);
        for (i, m) in ct.metas.iter().enumerate() {
            let is_live = here.contains(&m.fp) || selection.pinned.contains(&(cid, m.fp));
            if !is_live || !taken.insert(m.fp) {
                continue;
            }
            if selection.stay.contains(&(cid, m.fp)) {
                // A live delta's base, and its container's other live
                // chunks, stay where they are.
                moved.insert((cid, m.fp), cid)?;
                continue;
            }
            // A delta's bytes are covered by the container's CRC; its
            // fingerprint is that of the decoded chunk. A chunk is
            // verified decoded; an encoded one is copied as it is stored.
            if !trace && m.base.is_none() {
                let actual = algo.hash(&ct.entry(i)?);
                if actual != m.fp {
                    // Never copy a damaged chunk forward: stop before anything refers to the copies.
                    return Err(Error::ChunkMismatch {
                        container: cid,
                        fingerprint: m.fp.to_string(),
                        actual: actual.to_string(),
                    });
                }
            }
            cache.push(LiveChunk {
                container: ct.clone(),
                index: i,
            });
        }
        Ok(())
    }

    /// The order in which a segment's live chunks (`cache`, read from the
    /// containers `group`) are written, as the defragmentation policy plans.
    fn segment_order(
        &mut self,
        group: &[ContainerId],
        cache: &[LiveChunk],
        owners: &gccdf::Owners,
    ) -> Result<Vec<usize>> {
        Ok(match self.options.defrag {
            Defrag::None | Defrag::Fill => (0..cache.len()).collect(),
            Defrag::Random => gccdf::random_order(cache.len(), self.stats.segments),
            Defrag::Gccdf => {
                let involved = owners.involved(group);
                let located: Vec<(ContainerId, Fingerprint)> = cache
                    .iter()
                    .map(|c| (c.container.header.id, c.meta().fp))
                    .collect();
                let reads = gccdf::newest_reads(&located, &involved, |id| {
                    self.repo.recipe(id).map(|r| r.chunks)
                })?;
                let chunks: Vec<gccdf::SegmentChunk> = cache
                    .iter()
                    .zip(reads)
                    .map(|(c, read_at)| gccdf::SegmentChunk {
                        fp: c.meta().fp,
                        len: c.meta().len,
                        read_at,
                    })
                    .collect();
                let plan = gccdf::plan(&chunks, &involved, owners, self.options.split_threshold);
                self.stats.tree_leaves += plan.leaves;
                self.stats.tree_nodes += plan.nodes;
                plan.order
            }
        })
    }

    /// Points every retained recipe that names a removed container at the
    /// chunks' new homes.
    fn rewrite_recipes(
        &mut self,
        retained: &BTreeSet<BackupId>,
        removed: &BTreeSet<ContainerId>,
        moved: &Relocations,
    ) -> Result<()> {
        let phase = Phase::begin(
            self.progress,
            "recipes",
            Unit::Backups,
            Some(retained.len() as u64),
        );
        for &id in retained {
            phase.add(1);
            let mut recipe = self.repo.recipe(id)?;
            let mut changed = false;
            for c in &mut recipe.chunks {
                if removed.contains(&c.container) {
                    let new = moved.get(c.container, &c.fp)?.ok_or_else(|| {
                        Error::Pipeline(format!(
                            "GC found no new home for chunk {} of backup {} in container {:016x}",
                            c.fp, id, c.container
                        ))
                    })?;
                    c.container = new;
                    changed = true;
                }
            }
            if changed {
                self.repo
                    .backend()
                    .write(&snapshot::recipe_key(id), &recipe.encode()?)?;
                self.stats.recipes_rewritten += 1;
            }
        }
        phase.end();
        Ok(())
    }

    /// Deletes the selected containers (compacting those holding pinned
    /// bases) and returns the bytes freed.
    fn delete_selected(&mut self, selection: &Selection, writer: &Forward) -> Result<u64> {
        let backend = self.repo.backend().as_ref();
        let mut freed = 0u64;
        // Newest first: a delta's base always lies in an older container than
        // the delta (bases are chosen among containers written before), so an
        // interruption never leaves a delta whose base is gone.
        let mut newest_first: Vec<&Selected> = selection.selected.iter().collect();
        newest_first.sort_unstable_by_key(|s| std::cmp::Reverse(s.id));
        let phase = Phase::begin(
            self.progress,
            "delete",
            Unit::Containers,
            Some(newest_first.len() as u64),
        );
        for s in newest_first {
            phase.add(1);
            let kept = if s.has_live && selection.holds_pinned.contains(&s.id) {
                compact(
                    backend,
                    s.id,
                    &selection.stay,
                    writer.capacity,
                    writer.encoding,
                )?
            } else {
                backend.delete(&container::key(s.id))?;
                // Its damage went with it.
                if self.quarantined.contains_key(&s.id) {
                    backend.delete(&crate::repo::quarantine::key(s.id))?;
                }
                0
            };
            freed += s.size.saturating_sub(kept);
        }
        phase.end();
        self.stats.containers_reclaimed = selection.selected.len() as u64;
        Ok(freed)
    }

    /// Deletes the recipes of backups that never committed.
    fn remove_leftover_recipes(&mut self, retained: &BTreeSet<BackupId>) -> Result<()> {
        for id in self.repo.recipes()? {
            if !retained.contains(&id) {
                self.repo.backend().delete(&snapshot::recipe_key(id))?;
                self.stats.uncommitted_recipes_removed += 1;
            }
        }
        Ok(())
    }
}

/// What the mark phase found.
struct Marked {
    /// The backups kept: committed ones, and those whose snapshot is lost
    /// but whose commit mark and recipe remain (they can still be recovered).
    retained: BTreeSet<BackupId>,
    /// Every (container, fingerprint) a retained recipe references.
    live: SortedPairs,
    /// GCCDF: which backups own which chunks (empty unless asked for).
    owners: gccdf::Owners,
}

/// Walks every retained recipe.
fn mark(
    repo: &Repository,
    with_owners: bool,
    sort_budget: u64,
    progress: &dyn Progress,
) -> Result<Marked> {
    let retained = repo.retained_backups()?;
    let mut live = PairSorter::with_budget(sort_budget);
    let mut owners = gccdf::Owners::default();
    let phase = Phase::begin(progress, "mark", Unit::Backups, Some(retained.len() as u64));
    for &id in &retained {
        phase.add(1);
        let recipe = repo.recipe(id)?;
        for c in &recipe.chunks {
            live.push((c.container, c.fp))?;
        }
        if with_owners {
            owners.add_backup(id, &recipe.chunks);
        }
    }
    phase.end();
    Ok(Marked {
        retained,
        live: live.finish()?,
        owners,
    })
}

/// The fingerprints of one container's live chunks, as a set.
fn fingerprint_set(
    fps: Vec<Fingerprint>,
) -> hashbrown::HashSet<Fingerprint, FingerprintHashBuilder> {
    fps.into_iter().collect()
}

/// How much of one container is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ContainerUse {
    /// The container.
    pub id: ContainerId,
    /// Its stored bytes (header, metadata and chunks).
    pub size: u64,
    /// Bytes of its chunks.
    pub chunk_bytes: u64,
    /// Bytes of its chunks a retained backup references.
    pub live_bytes: u64,
}

/// The utilization of every readable container of `repo` (container
/// layout): what a GC would find, without changing anything. Damaged
/// containers are left out (GC leaves them alone too).
pub fn survey(repo: &Repository) -> Result<Vec<ContainerUse>> {
    survey_with_progress(repo, &Silent)
}

/// [`survey`], reporting progress to `progress`: mark (backups), then
/// survey (containers).
pub fn survey_with_progress(
    repo: &Repository,
    progress: &dyn Progress,
) -> Result<Vec<ContainerUse>> {
    crate::layout::require_gc(repo)?;
    let Marked { live, .. } = mark(repo, false, DEFAULT_SORT_BUDGET, progress)?;
    let backend = repo.backend().as_ref();
    // Copies GC folds away are unused space too.
    let quarantined = crate::repo::quarantine::load(backend)?;
    let (live, _) = fold::fold(repo, &quarantined, live, DEFAULT_SORT_BUDGET)?;
    let mut out = Vec::new();
    let containers = repo.containers()?;
    let phase = Phase::begin(
        progress,
        "survey",
        Unit::Containers,
        Some(containers.len() as u64),
    );
    let mut stream = live.stream()?;
    for cid in containers {
        phase.add(1);
        let here = fingerprint_set(stream.take(cid)?);
        if let Some((header, metas)) = readable_meta(backend, cid)? {
            out.push(ContainerUse {
                id: cid,
                size: header.total_len() as u64,
                chunk_bytes: metas.iter().map(|m| u64::from(m.len)).sum(),
                live_bytes: metas
                    .iter()
                    .filter(|m| here.contains(&m.fp))
                    .map(|m| u64::from(m.len))
                    .sum(),
            });
        }
    }
    phase.end();
    Ok(out)
}

/// A live chunk held in the GC cache: its container and index there.
struct LiveChunk {
    container: Arc<Container>,
    index: usize,
}

impl LiveChunk {
    fn meta(&self) -> &crate::layout::container::ChunkMeta {
        &self.container.metas[self.index]
    }
}

/// Header and metadata of container `cid`, or `None` when they are damaged
/// or of an unknown version.
fn readable_meta(
    backend: &dyn Backend,
    cid: ContainerId,
) -> Result<Option<(container::Header, Vec<container::ChunkMeta>)>> {
    match container::read_meta(backend, cid) {
        Ok(v) => Ok(Some(v)),
        Err(
            Error::Corrupt { .. } | Error::Authentication { .. } | Error::UnsupportedVersion { .. },
        ) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Select's verdict on container `cid` (without delta compression), whose
/// live chunks are `here` and quarantine record `damage`: selected, or
/// offered to `fill`, or left alone.
fn select_one(
    backend: &dyn Backend,
    cid: ContainerId,
    here: &hashbrown::HashSet<Fingerprint, FingerprintHashBuilder>,
    damage: Option<&crate::repo::quarantine::Quarantined>,
    keep_fraction: f64,
    fill: &mut Fill,
) -> Result<Option<Selected>> {
    match readable_meta(backend, cid)? {
        Some((header, metas)) => {
            let unused = damage_unused(damage, here);
            let chosen = choose(
                &header,
                &metas,
                |fp| here.contains(fp),
                keep_fraction,
                unused,
            );
            if chosen.is_none() {
                fill.offer(&header);
            }
            Ok(chosen)
        }
        // A damaged container no backup uses is garbage like any other; one
        // a backup uses is left alone: check reports it, GC must not hide it.
        None if here.is_empty() => Ok(Some(Selected {
            id: cid,
            size: backend.size(&container::key(cid))?,
            has_live: false,
        })),
        None => Ok(None),
    }
}

/// Whether the container whose quarantine record is `quarantined` holds
/// damage no backup uses any more: none of its `live` chunks is quarantined.
fn damage_unused(
    quarantined: Option<&crate::repo::quarantine::Quarantined>,
    live: &hashbrown::HashSet<Fingerprint, FingerprintHashBuilder>,
) -> bool {
    quarantined.is_some_and(|q| !live.iter().any(|fp| q.contains(fp)))
}

/// Whether GC selects a container, given which of its chunks are live: for deletion
/// (none live) or copy-forward (live bytes at most `keep_fraction` of its bytes,
/// or any when `damaged`: its dead chunks hold damage, which goes with it).
fn choose(
    header: &container::Header,
    metas: &[container::ChunkMeta],
    is_live: impl Fn(&Fingerprint) -> bool,
    keep_fraction: f64,
    damaged: bool,
) -> Option<Selected> {
    let cid = header.id;
    let total: u64 = metas.iter().map(|m| u64::from(m.len)).sum();
    let live_bytes: u64 = metas
        .iter()
        .filter(|m| is_live(&m.fp))
        .map(|m| u64::from(m.len))
        .sum();
    let selected = |has_live| Selected {
        id: cid,
        size: header.total_len() as u64,
        has_live,
    };
    if live_bytes == 0 {
        Some(selected(false))
    } else if live_bytes < total && (damaged || (live_bytes as f64) <= keep_fraction * total as f64)
    {
        Some(selected(true))
    } else {
        None
    }
}

/// Container fill for the reordering copy-forwards (GCCDF and its random
/// ablation) and for [`Defrag::Fill`]. Each backup ends with a partly filled container, and so does
/// each GC round; naive GC copies those forward again when one of their
/// chunks dies, but GCCDF's ownership clusters die whole or stay wholly
/// live, so they would never be selected and restores would read ever more,
/// smaller containers. A wholly live container whose stored size is below
/// half the container size is therefore copied forward too (merged into
/// the containers GC writes) when that lowers the number of partly filled
/// containers: when there are at least two of them, or when GC copies
/// other chunks forward anyway. Not with threshold 100% (GC that never
/// copies forward) nor in delta-compressing repositories (bases are pinned).
struct Fill {
    enabled: bool,
    /// Containers stored below this many bytes are under-filled.
    below: u64,
    candidates: Vec<Selected>,
}

impl Fill {
    fn new(options: &GcOptions, container_size: u64) -> Fill {
        Fill {
            enabled: options.fill
                && options.defrag != Defrag::None
                && options.threshold_pct < 100.0,
            below: container_size / 2,
            candidates: Vec::new(),
        }
    }

    /// Notes a container GC did not select.
    fn offer(&mut self, header: &container::Header) {
        let size = header.total_len() as u64;
        if self.enabled && size < self.below {
            self.candidates.push(Selected {
                id: header.id,
                size,
                has_live: true,
            });
        }
    }

    /// Adds the under-filled containers to `selected` (kept in container
    /// order) when merging them saves containers; returns how many.
    fn add_to(self, selected: &mut Vec<Selected>) -> u64 {
        let copying = selected.iter().any(|s| s.has_live);
        let n = self.candidates.len();
        if n >= 2 || (n == 1 && copying) {
            selected.extend(self.candidates);
            selected.sort_unstable_by_key(|s| s.id);
            n as u64
        } else {
            0
        }
    }
}

/// Selection in a delta-compressing repository. Every delta that survives
/// this GC — live ones, and dead ones in containers it does not select (the
/// index still names them: a later backup may deduplicate against them) —
/// keeps its base, which is then live and pinned: it must not move, as
/// deltas name its container. Pinning bases can keep a container from being
/// selected, which can keep more deltas, so this repeats until no base is
/// added (bases only grow). Returns the selection and the pinned bases.
fn select_pinning_bases(
    backend: &dyn Backend,
    containers: &[ContainerId],
    live: &mut LiveSet,
    keep_fraction: f64,
) -> Result<(Vec<Selected>, LiveSet)> {
    let mut metas = Vec::with_capacity(containers.len());
    for &cid in containers {
        metas.extend(readable_meta(backend, cid)?);
    }
    let mut pinned = LiveSet::default();
    loop {
        let selected: Vec<Selected> = metas
            .iter()
            // Delta repositories keep damaged containers by the threshold alone.
            .filter_map(|(h, m)| {
                choose(h, m, |fp| live.contains(&(h.id, *fp)), keep_fraction, false)
            })
            .collect();
        let dropped: BTreeSet<ContainerId> = selected.iter().map(|s| s.id).collect();
        let before = pinned.len();
        for (h, m) in &metas {
            let kept = |e: &&container::ChunkMeta| {
                !dropped.contains(&h.id) || live.contains(&(h.id, e.fp))
            };
            pinned.extend(
                m.iter()
                    .filter(kept)
                    .filter_map(|e| e.base)
                    .map(|b| (b.container, b.fp)),
            );
        }
        if pinned.len() == before {
            return Ok((selected, pinned));
        }
        live.extend(pinned.iter().copied());
    }
}

/// Rewrites container `id` in place with only its chunks in `stay`, each
/// once (a container GC filled can list a chunk twice, once as a delta:
/// the whole copy is kept, as a base must be); returns its new size.
fn compact(
    backend: &dyn Backend,
    id: ContainerId,
    stay: &LiveSet,
    capacity: usize,
    encoding: Option<Compression>,
) -> Result<u64> {
    let ct = Container::parse(id, backend.read(&container::key(id))?)?;
    let mut b = Builder::new(id, capacity.max(ct.object_len())).with_deltas();
    if let Some(setting) = encoding {
        b = b.with_encoding(setting);
    }
    let has_whole: std::collections::HashSet<Fingerprint> = ct
        .metas
        .iter()
        .filter(|m| m.base.is_none())
        .map(|m| m.fp)
        .collect();
    let mut kept = std::collections::HashSet::new();
    for (i, m) in ct.metas.iter().enumerate() {
        let wanted = match m.base {
            None => stay.contains(&(id, m.fp)),
            Some(_) => !has_whole.contains(&m.fp) && stay.contains(&(id, m.fp)),
        };
        if !wanted || !kept.insert(m.fp) {
            continue;
        }
        b.push_like(&ct, i)?;
    }
    let bytes = b.seal();
    let size = container::Header::parse(id, &bytes)?.total_len() as u64;
    backend.write(&container::key(id), &bytes)?;
    Ok(size)
}

/// Writes migrated chunks into new containers.
struct Forward<'a> {
    backend: &'a dyn Backend,
    capacity: usize,
    trace: bool,
    /// Containers in the format that can hold deltas.
    deltas: bool,
    /// Containers with encoded entries (compressing repositories).
    encoding: Option<Compression>,
    next_id: ContainerId,
    open: Option<Builder>,
    produced: u64,
    produced_bytes: u64,
}

impl Forward<'_> {
    /// Appends chunk `i` of `from` as it is stored there (whole or a
    /// delta); returns the container it goes to.
    fn push(&mut self, from: &Container, i: usize) -> Result<ContainerId> {
        let m = &from.metas[i];
        if self.open.as_ref().is_some_and(|b| !b.fits(m.len as usize)) {
            self.seal()?;
        }
        let (capacity, trace, deltas) = (self.capacity, self.trace, self.deltas);
        let encoding = self.encoding;
        let next_id = &mut self.next_id;
        let b = self.open.get_or_insert_with(|| {
            let id = *next_id;
            *next_id += 1;
            let b = match (trace, deltas) {
                (true, _) => Builder::without_data(id, capacity),
                (false, false) => Builder::new(id, capacity),
                (false, true) => Builder::new(id, capacity).with_deltas(),
            };
            match encoding {
                Some(setting) => b.with_encoding(setting),
                None => b,
            }
        });
        if trace {
            b.push_len(m.fp, m.len);
        } else {
            b.push_like(from, i)?;
        }
        Ok(b.id())
    }

    /// Writes the open container, if any.
    fn seal(&mut self) -> Result<()> {
        if let Some(b) = self.open.take() {
            let id = b.id();
            let bytes = b.seal();
            let header = container::Header::parse(id, &bytes)?;
            self.backend.write(&container::key(id), &bytes)?;
            self.produced_bytes += header.total_len() as u64;
            self.produced += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::snapshot::Snapshot;

    #[test]
    fn forget_keeps_the_newest() {
        let snaps: Vec<Snapshot> = [3, 1, 2, 5]
            .iter()
            .map(|&id| Snapshot {
                id,
                time: 0,
                label: String::new(),
                source: String::new(),
                host: String::new(),
                tags: Vec::new(),
                logical_bytes: 0,
                stats: Default::default(),
                tree: None,
            })
            .collect();
        assert_eq!(
            crate::format::snapshot::forget_candidates(&snaps, 2),
            vec![1, 2]
        );
        assert_eq!(
            crate::format::snapshot::forget_candidates(&snaps, 0),
            vec![1, 2, 3, 5]
        );
        assert!(crate::format::snapshot::forget_candidates(&snaps, 9).is_empty());
    }

    #[test]
    fn options_out_of_range_are_refused() {
        let ok = GcOptions::default();
        assert!(ok.validate().is_ok());
        for bad in [
            GcOptions { segment: 0, ..ok },
            GcOptions {
                split_threshold: 0,
                ..ok
            },
            GcOptions {
                threshold_pct: 101.0,
                ..ok
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(Error::InvalidOption(_))),
                "{bad:?}"
            );
        }
    }
}
