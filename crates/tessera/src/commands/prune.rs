//! `prune`: garbage collection with the knobs restic users know.
//!
//! `--max-unused` and `--max-repack` are turned into the one knob Tessera's
//! GC has, the utilization threshold (docs/CLI.md, "prune"): a survey of
//! every container's live bytes ([`crate::gc::survey`]) orders the partly
//! dead containers from the emptiest, and the threshold is set so that GC
//! copies forward the shortest such prefix that leaves at most
//! `--max-unused` unused bytes behind, and no more live bytes than
//! `--max-repack`. Wholly dead containers are always deleted (they cost no
//! copy). The lifecycle layout frees space when backups are deleted: prune
//! only finishes an interrupted deletion there.

use serde::Serialize;

use crate::backend::LockMode;
use crate::error::{Error, Result};
use crate::gc::{gc_with_progress, survey_with_progress, ContainerUse, Defrag, GcOptions, GcStats};
use crate::layout::lifecycle::DeleteStats;
use crate::progress::{Progress, Silent};
use crate::repo::Repository;

/// How much unused space may stay in partly dead containers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MaxUnused {
    /// Per container: a container is repacked when more than this percent
    /// of its chunk bytes is unused.
    Percent(f64),
    /// In total: repack the emptiest containers until at most this many
    /// unused bytes remain.
    Bytes(u64),
    /// Only delete wholly dead containers.
    Unlimited,
}

impl std::str::FromStr for MaxUnused {
    type Err = Error;

    /// Parses `5%`, a size such as `100MiB`, or `unlimited`.
    fn from_str(s: &str) -> Result<MaxUnused> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("unlimited") {
            return Ok(MaxUnused::Unlimited);
        }
        if let Some(p) = t.strip_suffix('%') {
            return match p.trim().parse::<f64>() {
                Ok(v) if (0.0..=100.0).contains(&v) => Ok(MaxUnused::Percent(v)),
                _ => Err(Error::InvalidOption(format!(
                    "--max-unused {s:?}: a percentage must be between 0% and 100%"
                ))),
            };
        }
        crate::util::units::parse_size(t)
            .map(MaxUnused::Bytes)
            .map_err(|e| {
                Error::InvalidOption(format!(
                    "--max-unused {s:?}: {e}; or give a percentage (5%) or `unlimited`"
                ))
            })
    }
}

/// What `prune` is asked to do (with the `cli` feature, the arguments of
/// `tessera prune`: their help is the command line's).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct PruneOptions {
    /// Unused space tolerated.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            value_name = "PCT|SIZE",
            default_value = "5%",
            help = "Unused space tolerated: a percentage per container (`5%`: repack containers more than 5% unused), a total size (`1GiB`: repack the emptiest containers until at most that much is unused), or `unlimited` (delete only wholly unused containers)"
        )
    )]
    pub max_unused: MaxUnused,
    /// At most this many live bytes copied forward.
    #[cfg_attr(feature = "cli", arg(
        long,
        value_name = "SIZE",
        value_parser = crate::parse_size,
        help = "Copy at most this many live bytes forward"
    ))]
    pub max_repack: Option<u64>,
    /// Order of the chunks copied forward (GCCDF defragments).
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            default_value = "none",
            help = "Order of the copied chunks: none, gccdf (defragments for the newest backups), random, or fill (container order, with gccdf's container fill)"
        )
    )]
    pub defrag: Defrag,
    /// Only plan.
    #[cfg_attr(feature = "cli", arg(long, help = "Only show the plan"))]
    pub dry_run: bool,
}

/// What a prune plans, from the survey.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PrunePlan {
    /// Readable containers.
    pub containers: u64,
    /// Containers with no live chunk: deleted.
    pub containers_dead: u64,
    /// Partly dead containers copied forward.
    pub containers_repacked: u64,
    /// Live bytes copied forward.
    pub bytes_repacked: u64,
    /// Unused chunk bytes in the repository before.
    pub unused_before: u64,
    /// Unused chunk bytes left after (in partly dead containers not repacked).
    pub unused_after: u64,
    /// The GC utilization threshold this maps onto (percent).
    pub threshold_pct: f64,
}

/// What `prune` did.
#[derive(Clone, Debug, Serialize)]
pub struct PruneReport {
    /// The plan (container layout).
    pub plan: Option<PrunePlan>,
    /// The garbage collection run (container layout, not a dry run).
    pub gc: Option<GcStats>,
    /// The lifecycle layout: what finishing deletions freed (usually
    /// nothing: deletion freed the space already).
    pub lifecycle: Option<DeleteStats>,
    /// Whether this was a dry run.
    pub dry_run: bool,
}

/// Live fraction of a partly dead container.
fn live_fraction(c: &ContainerUse) -> f64 {
    c.live_bytes as f64 / c.chunk_bytes.max(1) as f64
}

/// Plans which containers to repack under `options`.
pub fn plan(usage: &[ContainerUse], options: &PruneOptions) -> PrunePlan {
    let dead = usage.iter().filter(|c| c.live_bytes == 0).count() as u64;
    let mut partial: Vec<&ContainerUse> = usage
        .iter()
        .filter(|c| c.live_bytes > 0 && c.live_bytes < c.chunk_bytes)
        .collect();
    partial.sort_by(|a, b| live_fraction(a).total_cmp(&live_fraction(b)));
    let unused = |c: &&ContainerUse| c.chunk_bytes - c.live_bytes;
    let unused_before: u64 = usage
        .iter()
        .map(|c| c.chunk_bytes.saturating_sub(c.live_bytes))
        .sum();
    // How many of the emptiest partly dead containers to repack.
    let mut n = match options.max_unused {
        MaxUnused::Unlimited => 0,
        MaxUnused::Percent(p) => partial
            .iter()
            .take_while(|c| live_fraction(c) <= 1.0 - p / 100.0)
            .count(),
        MaxUnused::Bytes(limit) => {
            let mut left: u64 = partial.iter().map(unused).sum();
            let mut n = 0;
            while left > limit && n < partial.len() {
                left -= unused(&partial[n]);
                n += 1;
            }
            n
        }
    };
    if let Some(cap) = options.max_repack {
        let mut total = 0u64;
        let fits = partial
            .iter()
            .take_while(|c| {
                total += c.live_bytes;
                total <= cap
            })
            .count();
        n = n.min(fits);
        // One threshold cannot split containers equally full: when the
        // cap falls inside such a group, leave the whole group.
        if n > 0 && n < partial.len() {
            let f = live_fraction(partial[n - 1]);
            if live_fraction(partial[n]) == f {
                n = partial
                    .iter()
                    .position(|c| live_fraction(c) == f)
                    .unwrap_or(0);
            }
        }
    }
    // Containers as empty as the last one chosen are chosen too (one
    // threshold selects them all): count them.
    let threshold_pct = match n {
        0 => 100.0,
        _ => ((1.0 - live_fraction(partial[n - 1])) * 100.0 - 1e-9).clamp(0.0, 100.0),
    };
    let cut = 1.0 - threshold_pct / 100.0;
    let chosen: Vec<&&ContainerUse> = partial
        .iter()
        .filter(|c| n > 0 && live_fraction(c) <= cut)
        .collect();
    PrunePlan {
        containers: usage.len() as u64,
        containers_dead: dead,
        containers_repacked: chosen.len() as u64,
        bytes_repacked: chosen.iter().map(|c| c.live_bytes).sum(),
        unused_before,
        unused_after: partial.iter().map(unused).sum::<u64>()
            - chosen.iter().map(|c| unused(c)).sum::<u64>(),
        threshold_pct,
    }
}

/// Prunes `repo` (open exclusively unless a dry run).
pub fn prune(repo: &Repository, options: &PruneOptions) -> Result<PruneReport> {
    prune_with_progress(repo, options, &Silent)
}

/// Prunes `repo`, reporting the progress of the survey and of the GC
/// (container layout) to `progress`.
pub fn prune_with_progress(
    repo: &Repository,
    options: &PruneOptions,
    progress: &dyn Progress,
) -> Result<PruneReport> {
    if !crate::layout::needs_gc(repo) {
        let lifecycle = if options.dry_run {
            None
        } else {
            Some(crate::layout::lifecycle::reclaim(repo)?)
        };
        return Ok(PruneReport {
            plan: None,
            gc: None,
            lifecycle,
            dry_run: options.dry_run,
        });
    }
    if !options.dry_run {
        repo.require(LockMode::Exclusive, "pruning")?;
    }
    let plan = plan(&survey_with_progress(repo, progress)?, options);
    let gc = if options.dry_run {
        None
    } else {
        Some(gc_with_progress(
            repo,
            GcOptions {
                threshold_pct: plan.threshold_pct,
                defrag: options.defrag,
                // Container fill copies more than the plan: not under a repack bound.
                fill: options.max_repack.is_none(),
                ..GcOptions::default()
            },
            progress,
        )?)
    };
    Ok(PruneReport {
        plan: Some(plan),
        gc,
        lifecycle: None,
        dry_run: options.dry_run,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(id: u64, chunk_bytes: u64, live_bytes: u64) -> ContainerUse {
        ContainerUse {
            id,
            size: chunk_bytes + 100,
            chunk_bytes,
            live_bytes,
        }
    }

    fn opts(max_unused: MaxUnused, max_repack: Option<u64>) -> PruneOptions {
        PruneOptions {
            max_unused,
            max_repack,
            defrag: Defrag::None,
            dry_run: true,
        }
    }

    #[test]
    fn parses_max_unused() {
        assert_eq!("5%".parse::<MaxUnused>().unwrap(), MaxUnused::Percent(5.0));
        assert_eq!("1KiB".parse::<MaxUnused>().unwrap(), MaxUnused::Bytes(1024));
        assert_eq!(
            "unlimited".parse::<MaxUnused>().unwrap(),
            MaxUnused::Unlimited
        );
        assert!("150%".parse::<MaxUnused>().is_err());
        assert!("lots".parse::<MaxUnused>().is_err());
    }

    #[test]
    fn percent_is_per_container() {
        // Live fractions 0.1, 0.5, 0.9 and a dead one.
        let u = [
            c(1, 1000, 100),
            c(2, 1000, 500),
            c(3, 1000, 900),
            c(4, 1000, 0),
        ];
        let p = plan(&u, &opts(MaxUnused::Percent(50.0), None));
        assert_eq!(p.containers_dead, 1);
        assert_eq!(p.containers_repacked, 2);
        assert_eq!(p.bytes_repacked, 600);
        assert_eq!(p.unused_before, 900 + 500 + 100 + 1000);
        assert_eq!(p.unused_after, 100);
        let p = plan(&u, &opts(MaxUnused::Percent(0.0), None));
        assert_eq!(p.containers_repacked, 3);
        assert_eq!(p.unused_after, 0);
    }

    #[test]
    fn bytes_repack_the_emptiest_until_the_rest_fits() {
        let u = [c(1, 1000, 100), c(2, 1000, 500), c(3, 1000, 900)];
        // 1500 unused in partial containers; allow 600: repack #1 (900 unused) only.
        let p = plan(&u, &opts(MaxUnused::Bytes(600), None));
        assert_eq!((p.containers_repacked, p.unused_after), (1, 600));
        let p = plan(&u, &opts(MaxUnused::Bytes(5000), None));
        assert_eq!((p.containers_repacked, p.threshold_pct), (0, 100.0));
    }

    #[test]
    fn max_repack_caps_the_copy() {
        let u = [c(1, 1000, 100), c(2, 1000, 500), c(3, 1000, 900)];
        let p = plan(&u, &opts(MaxUnused::Percent(0.0), Some(650)));
        assert_eq!((p.containers_repacked, p.bytes_repacked), (2, 600));
        let p = plan(&u, &opts(MaxUnused::Percent(0.0), Some(50)));
        assert_eq!((p.containers_repacked, p.bytes_repacked), (0, 0));
    }

    proptest! {
        /// The plan never repacks more than `--max-repack`, and leaves at
        /// most `--max-unused` bytes when the repack limit allows it.
        #[test]
        fn plans_respect_the_limits(
            raw in proptest::collection::vec((1u64..10_000, 0u64..=100), 0..30),
            limit in 0u64..50_000,
            cap in proptest::option::of(0u64..50_000),
        ) {
            let u: Vec<ContainerUse> = raw.iter().enumerate()
                .map(|(i, &(b, pct))| c(i as u64, b, b * pct / 100))
                .collect();
            let p = plan(&u, &opts(MaxUnused::Bytes(limit), cap));
            if let Some(cap) = cap {
                prop_assert!(p.bytes_repacked <= cap);
            } else {
                prop_assert!(p.unused_after <= limit);
            }
            prop_assert!(p.unused_after <= p.unused_before);
        }
    }
}
