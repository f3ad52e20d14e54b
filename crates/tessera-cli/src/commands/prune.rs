//! `tessera prune`: reclaim unused space with restic's knobs.

use anyhow::Result;
use clap::Args;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};

use crate::output::{human, print, Form, Report};
use crate::progress::Phases;
use crate::repo_open::open;
use crate::secrets::Access;

/// The arguments of `tessera prune`.
#[derive(Args)]
pub struct PruneArgs {
    /// The repository.
    repo: Location,
    /// What to reclaim: --max-unused, --max-repack, --defrag, --dry-run.
    #[command(flatten)]
    options: tessera::commands::prune::PruneOptions,
    /// Print the plan and what was done as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera prune`.
pub fn run(args: PruneArgs, access: &Access) -> Result<ExitCode> {
    let PruneArgs {
        repo,
        options,
        json,
    } = args;
    let mode = if options.dry_run {
        LockMode::Read
    } else {
        LockMode::Exclusive
    };
    let r = open(&repo, mode, access)?;
    let report = tessera::commands::prune::prune_with_progress(&r, &options, &Phases::default())?;
    print(&report, Form::pretty_json_if(json))?;
    Ok(ExitCode::SUCCESS)
}

/// What `prune` planned and did.
impl Report for tessera::commands::prune::PruneReport {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        if let Some(p) = &self.plan {
            writeln!(
                out,
                "{} containers: {} unused, {} wholly unused (deleted), {} repacked ({} copied); {} unused afterwards (GC threshold {:.1}%)",
                p.containers,
                human(p.unused_before),
                p.containers_dead,
                p.containers_repacked,
                human(p.bytes_repacked),
                human(p.unused_after),
                p.threshold_pct
            )?;
        }
        if let Some(l) = &self.lifecycle {
            writeln!(
                out,
                "lifecycle layout: deleting a backup frees its space at once, nothing to repack; {} freed by finishing deletions",
                human(l.bytes_freed)
            )?;
        } else if self.plan.is_none() {
            writeln!(
                out,
                "lifecycle layout: deleting a backup frees its space at once, nothing to repack"
            )?;
        }
        if let Some(g) = &self.gc {
            g.text(out)?;
        } else if self.dry_run {
            writeln!(out, "dry run: nothing changed")?;
        }
        Ok(())
    }
}
