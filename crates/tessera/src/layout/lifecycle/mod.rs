//! The lifecycle layout (MFDedup, Zou et al., ACM TOS 2022): chunks are
//! classified by lifecycle into categories Cat.(i,j) — the chunks that
//! backup versions i..=j of one source lineage reference — and archived
//! categories are grouped into volumes, so that restoring a version reads a
//! contiguous prefix of a few volumes without read amplification, and
//! deleting versions deletes or truncates volumes without garbage collection.
//!
//! * [`backup`]: NDF deduplication (against the backup itself and the
//!   lineage's previous version only) consuming batches of [`Chunk`]s; the
//!   unique chunks form the new category Cat.(n,n).
//! * [`arrange`]: AVAR arranging rounds, crash-safe through a journal.
//! * [`restore_to_file`], [`restore_to_writer`], [`plan_restore`]: restore by
//!   category ranges with a restore hash table.
//! * [`delete_backups`], [`forget_keep_last`], [`space`], [`trend`]:
//!   deletion by dropping or truncating volumes, and space accounting.
//! * [`check()`] verifies; `repair` (crate-internal, for
//!   [`crate::commands::repair`]) rewrites damaged or missing parts.
//!
//! Every source lineage (snapshot `source`) has its own version numbering,
//! NDF chain and categories, under `lifecycle/<lineage>/`. Recipes are the
//! shared [`crate::format::snapshot::Recipe`]; their `container` field is 0 (the
//! categories holding a chunk follow from the version number).
//! The byte formats are in docs/LIFECYCLE-FORMAT.md.
//!
//! [`Chunk`]: crate::index::Chunk

mod arrange;
mod backup;
mod check;
pub mod format;
pub mod lineage_state;
mod manage;
mod prev_table;
mod repair;
mod restore;
mod salvage;
mod table;
mod uploads;

pub use arrange::{
    arrange, arrange_rounds, arrange_with_options, arrange_with_progress, ArrangeOptions,
    ArrangeStats,
};
pub(crate) use backup::backup;

pub(crate) use check::check_with_progress as check;
pub use manage::{
    delete_backups, forget_keep_last, reclaim, space, totals, trend, DeleteStats, VersionSpace,
};
pub(crate) use manage::{live_ids, require_layout};
pub(crate) use repair::{repair_lineage, repair_lineage_state, repair_lineages};
pub(crate) use restore::locate;
pub(crate) use restore::read_backup;
pub use restore::{
    plan_restore, restore_selection_to_writer, restore_to_file, restore_to_writer,
    LifecycleRestoreOptions, LifecycleRestoreStats, DEFAULT_WINDOW_BYTES,
};
pub(crate) use salvage::salvage;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::layout::lifecycle::lineage_state::LineageState;
pub(crate) use crate::layout::lifecycle::lineage_state::{lineage_names, read_state_copy};
pub use crate::layout::lifecycle::lineage_state::{
    state_copy_key, state_key, STATE_COPY_DIR, STATE_DIR,
};
use format::{ReadLog, VolumeHeader};
use std::collections::{BTreeMap, BTreeSet};

/// Directory of all lifecycle objects.
pub const LIFECYCLE_DIR: &str = "lifecycle";

/// The directory name of the lineage of `source`: `s` and the hex of its bytes.
pub fn lineage_name(source: &str) -> String {
    format!("s{}", crate::util::source_key::source_hex(source))
}

/// Directory of lineage `l`'s active and pending categories.
pub fn cat_dir(l: &str) -> String {
    format!("{LIFECYCLE_DIR}/{l}/cat")
}

/// Key of part `p` of the category object Cat.(i,j) (active or pending).
pub fn cat_key(l: &str, i: u64, j: u64, p: u32) -> String {
    format!("{LIFECYCLE_DIR}/{l}/cat/{i:016x}-{j:016x}-{p:08x}")
}

/// Directory of lineage `l`'s volumes.
pub fn vol_dir(l: &str) -> String {
    format!("{LIFECYCLE_DIR}/{l}/vol")
}

/// Key of part `p` of volume `j`, whose first category starts at `first`.
pub fn vol_key(l: &str, j: u64, p: u32, first: u64) -> String {
    format!("{LIFECYCLE_DIR}/{l}/vol/{j:016x}-{p:08x}-{first:016x}")
}

/// Directory of lineage `l`'s NDF tables.
pub fn ndf_dir(l: &str) -> String {
    format!("{LIFECYCLE_DIR}/{l}/ndf")
}

/// Key of version `v`'s NDF table.
pub fn ndf_key(l: &str, v: u64) -> String {
    format!("{LIFECYCLE_DIR}/{l}/ndf/{v:016x}")
}

/// Key of lineage `l`'s arranging journal.
pub fn journal_key(l: &str) -> String {
    format!("{LIFECYCLE_DIR}/{l}/journal")
}

fn parse_hex16(s: &str) -> Option<u64> {
    (s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
}

fn parse_hex8(s: &str) -> Option<u32> {
    (s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u32::from_str_radix(s, 16).ok())
        .flatten()
}

/// Parses a category part name `iiii…-jjjj…-pppppppp` into `(i, j, p)`.
pub fn parse_cat_name(name: &str) -> Option<(u64, u64, u32)> {
    let mut it = name.split('-');
    let r = (
        parse_hex16(it.next()?)?,
        parse_hex16(it.next()?)?,
        parse_hex8(it.next()?)?,
    );
    it.next().is_none().then_some(r)
}

/// Parses a volume part name `jjjj…-pppppppp-ffff…` into `(j, p, first)`.
pub fn parse_vol_name(name: &str) -> Option<(u64, u32, u64)> {
    let mut it = name.split('-');
    let r = (
        parse_hex16(it.next()?)?,
        parse_hex8(it.next()?)?,
        parse_hex16(it.next()?)?,
    );
    it.next().is_none().then_some(r)
}

/// Parses an NDF table name.
pub fn parse_num_name(name: &str) -> Option<u64> {
    parse_hex16(name)
}

/// A category part `(i, j, p)`.
type CatPart = (u64, u64, u32);
/// A volume part `(j, p, first)`.
type VolPart = (u64, u32, u64);

/// One source lineage: its directory name and state.
#[derive(Clone, Debug)]
pub(crate) struct Lineage {
    pub name: String,
    pub state: LineageState,
}

impl Lineage {
    /// Loads lineage `name` from whichever copy of its state verifies (the
    /// one further along if both do); `None` if it has no state. Fails only
    /// if no copy is readable and at least one is damaged.
    pub fn load(backend: &dyn Backend, name: &str) -> Result<Option<Lineage>> {
        Ok(
            crate::layout::lifecycle::lineage_state::load(backend, name)?.map(|state| Lineage {
                name: name.to_string(),
                state,
            }),
        )
    }

    /// The lineage of `source`, new if it has none yet.
    pub fn load_or_new(backend: &dyn Backend, source: &str) -> Result<Lineage> {
        let name = lineage_name(source);
        Ok(Lineage::load(backend, &name)?.unwrap_or_else(|| Lineage {
            name,
            state: LineageState {
                source: source.to_string(),
                ..LineageState::default()
            },
        }))
    }

    /// Persists the state (atomically), in both copies: one damaged copy
    /// cannot lose the lineage.
    pub fn save(&self, backend: &dyn Backend) -> Result<()> {
        let bytes = self.state.encode();
        backend.write(&state_key(&self.name), &bytes)?;
        backend.write(&state_copy_key(&self.name), &bytes)
    }

    /// Deletes both copies of the state (the first step of removing the lineage).
    pub fn delete_state(&self, backend: &dyn Backend) -> Result<()> {
        backend.delete(&state_key(&self.name))?;
        backend.delete(&state_copy_key(&self.name))
    }

    /// Versions whose backups are committed (in `live_ids`).
    pub fn live_versions(&self, live_ids: &BTreeSet<u64>) -> BTreeSet<u64> {
        self.state
            .versions
            .iter()
            .filter(|v| live_ids.contains(&v.backup))
            .map(|v| v.version)
            .collect()
    }

    /// Existing category parts `(i, j, p)`, ascending.
    pub fn cat_objects(&self, backend: &dyn Backend) -> Result<Vec<(u64, u64, u32)>> {
        let mut v: Vec<_> = backend
            .list(&cat_dir(&self.name))?
            .iter()
            .filter_map(|n| parse_cat_name(n))
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// Existing volumes, ascending, each with its parts `(p, first start)`, ascending.
    pub fn volumes(&self, backend: &dyn Backend) -> Result<BTreeMap<u64, Vec<(u32, u64)>>> {
        let mut v: BTreeMap<u64, Vec<(u32, u64)>> = BTreeMap::new();
        for (j, p, first) in backend
            .list(&vol_dir(&self.name))?
            .iter()
            .filter_map(|n| parse_vol_name(n))
        {
            v.entry(j).or_default().push((p, first));
        }
        for parts in v.values_mut() {
            parts.sort_unstable();
        }
        Ok(v)
    }

    /// Whether part `(i, j, ·)` is an active or pending category (others
    /// are leftovers of interrupted operations, §3).
    pub fn cat_in_use(&self, i: u64, j: u64) -> bool {
        let (r, last) = (self.state.arranged, self.state.last());
        (j == r && i <= r && r > 0) || (i == j && j > r && j <= last)
    }

    /// The parts the state lists (`parts`, LIFECYCLE-FORMAT.md §6):
    /// categories `(i, j, p)` and volumes `(j, p, first)`.
    fn listed(&self) -> (Vec<CatPart>, Vec<VolPart>) {
        let (mut cats, mut vols) = (Vec::new(), Vec::new());
        for name in self.state.parts.iter().flatten() {
            if let Some(n) = name.strip_prefix("cat/") {
                cats.extend(parse_cat_name(n));
            } else if let Some(n) = name.strip_prefix("vol/") {
                vols.extend(parse_vol_name(n));
            }
        }
        (cats, vols)
    }

    /// [`Lineage::cat_objects`] and the category parts the state lists
    /// that are missing (a restore finds nothing in them, `check` reports them).
    pub fn all_cat_objects(&self, backend: &dyn Backend) -> Result<Vec<(u64, u64, u32)>> {
        let mut v = self.cat_objects(backend)?;
        v.extend(self.listed().0);
        v.sort_unstable();
        v.dedup();
        Ok(v)
    }

    /// [`Lineage::volumes`] and the volume parts the state lists that are missing.
    pub fn all_volumes(&self, backend: &dyn Backend) -> Result<BTreeMap<u64, Vec<(u32, u64)>>> {
        let mut v = self.volumes(backend)?;
        for (j, p, first) in self.listed().1 {
            v.entry(j).or_default().push((p, first));
        }
        for parts in v.values_mut() {
            parts.sort_unstable();
            parts.dedup();
        }
        Ok(v)
    }

    /// Keys of the parts the state lists that do not exist.
    pub fn missing_parts(&self, backend: &dyn Backend) -> Result<Vec<String>> {
        if self.state.parts.is_none() {
            return Ok(Vec::new());
        }
        let existing: BTreeSet<String> = self.existing_part_names(backend)?;
        Ok(self
            .state
            .parts
            .iter()
            .flatten()
            .filter(|n| !existing.contains(*n))
            .map(|n| format!("{LIFECYCLE_DIR}/{}/{n}", self.name))
            .collect())
    }

    /// Names (`cat/…`, `vol/…`) of the existing parts in use: active and
    /// pending categories, volumes below the arranged round.
    fn existing_part_names(&self, backend: &dyn Backend) -> Result<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        for (i, j, p) in self.cat_objects(backend)? {
            if self.cat_in_use(i, j) {
                out.insert(format!("cat/{i:016x}-{j:016x}-{p:08x}"));
            }
        }
        for (j, parts) in self.volumes(backend)?.range(..self.state.arranged) {
            for (p, first) in parts {
                out.insert(format!("vol/{j:016x}-{p:08x}-{first:016x}"));
            }
        }
        Ok(out)
    }

    /// Updates the state's list of parts (in memory; [`Lineage::save`]
    /// persists it): removes the keys `removed`, adds `added`. A state
    /// without the list (version 1) starts from the existing parts in use.
    pub fn update_parts(
        &mut self,
        backend: &dyn Backend,
        removed: &[String],
        added: &[String],
    ) -> Result<()> {
        let mut parts = match self.state.parts.take() {
            Some(p) => p,
            None => self.existing_part_names(backend)?,
        };
        let prefix = format!("{LIFECYCLE_DIR}/{}/", self.name);
        for k in removed {
            if let Some(n) = k.strip_prefix(&prefix) {
                parts.remove(n);
            }
        }
        parts.extend(
            added
                .iter()
                .filter_map(|k| k.strip_prefix(&prefix))
                .map(str::to_string),
        );
        self.state.parts = Some(parts);
        Ok(())
    }

    /// What backups of the lineage must not deduplicate against: the
    /// chunks its quarantine record lists, or everything (`All`) when that
    /// record is damaged or a part the state lists is missing.
    pub fn unusable(&self, backend: &dyn Backend) -> Result<crate::repo::quarantine::Quarantined> {
        if !self.missing_parts(backend)?.is_empty() {
            return Ok(crate::repo::quarantine::Quarantined::All);
        }
        Ok(crate::repo::quarantine::load_lineage(backend, &self.name)?
            .unwrap_or_else(|| crate::repo::quarantine::Quarantined::Chunks(Default::default())))
    }

    /// The objects restoring version `k` reads, in reading order, each with
    /// the highest category start to read from it (a prefix). Parts the
    /// state lists but that are missing are included (they hold nothing).
    pub fn required(&self, backend: &dyn Backend, k: u64) -> Result<Vec<Required>> {
        let r = self.state.arranged;
        let mut out = Vec::new();
        let cats = self.all_cat_objects(backend)?;
        let whole = |key: String| Required {
            key,
            max_start: u64::MAX,
            group: None,
        };
        if k <= r {
            for (j, parts) in self.all_volumes(backend)?.range(k..r) {
                // Parts whose first category starts after k are not needed.
                for &(p, first) in parts.iter().filter(|(_, first)| *first <= k) {
                    out.push(Required {
                        key: vol_key(&self.name, *j, p, first),
                        max_start: k,
                        group: Some(*j),
                    });
                }
            }
            for &(i, j, p) in &cats {
                if j == r && i <= k {
                    out.push(whole(cat_key(&self.name, i, j, p)));
                }
            }
        } else {
            for &(i, j, p) in &cats {
                if j == r && i <= r {
                    out.push(whole(cat_key(&self.name, i, j, p)));
                }
            }
            for &(i, j, p) in &cats {
                if i == j && i > r && i <= k {
                    out.push(whole(cat_key(&self.name, i, j, p)));
                }
            }
        }
        Ok(out)
    }
}

/// The error for a chunk of backup `id` (version `k` of lineage `l`) found
/// in none of the `required` objects: it names them, or, when none
/// exists, the key patterns of those that should.
pub(crate) fn not_in_categories(
    l: &Lineage,
    id: u64,
    k: u64,
    required: &[Required],
    fp: &crate::fingerprint::Fingerprint,
) -> Error {
    let searched = if required.is_empty() {
        let r = l.state.arranged;
        format!(
            "expected in {}/<i>-{r:016x}-* or {}/<{k:016x} or below>-<{k:016x} or below>-*, none exists",
            cat_dir(&l.name),
            cat_dir(&l.name)
        )
    } else {
        required
            .iter()
            .map(|r| r.key.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Error::ChunkNotInCategories {
        backup: id,
        version: k,
        lineage: format!("{LIFECYCLE_DIR}/{}", l.name),
        fingerprint: fp.to_string(),
        searched,
    }
}

/// An object a restore reads: its categories with `start <= max_start` (a
/// prefix). Parts of one volume share a `group`: once a part's prefix ends
/// before its last category, the group's later parts are not needed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Required {
    pub key: String,
    pub max_start: u64,
    pub group: Option<u64>,
}

impl Required {
    /// Number of leading categories of `header` to read.
    pub fn prefix(&self, header: &VolumeHeader) -> usize {
        header
            .categories
            .iter()
            .take_while(|c| c.start <= self.max_start)
            .count()
    }
}

/// Calls `f(required, header, prefix)` for each required object that
/// exists and has a non-empty prefix, in order, reading its header.
pub(crate) fn for_each_required(
    backend: &dyn Backend,
    required: &[Required],
    log: &mut ReadLog,
    mut f: impl FnMut(&Required, &VolumeHeader, usize, &mut ReadLog) -> Result<()>,
) -> Result<()> {
    let mut done_group = None;
    for req in required {
        if req.group.is_some() && req.group == done_group {
            continue;
        }
        let Some(header) = header_if_exists(backend, &req.key, log)? else {
            continue;
        };
        let prefix = req.prefix(&header);
        if prefix < header.categories.len() {
            done_group = req.group;
        }
        if prefix > 0 {
            f(req, &header, prefix, log)?;
        }
    }
    Ok(())
}

/// All lineages with a state object.
pub(crate) fn lineages(backend: &dyn Backend) -> Result<Vec<Lineage>> {
    let mut out = Vec::new();
    for name in lineage_names(backend)? {
        if let Some(l) = Lineage::load(backend, &name)? {
            out.push(l);
        }
    }
    Ok(out)
}

/// Reads a volume header, `None` if the object does not exist.
pub(crate) fn header_if_exists(
    backend: &dyn Backend,
    key: &str,
    log: &mut ReadLog,
) -> Result<Option<VolumeHeader>> {
    match format::read_header(backend, key, log) {
        Ok(h) => Ok(Some(h)),
        Err(Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
