//! `tessera repair`: repair what can be proven.

use anyhow::{Context, Result};
use clap::Args;
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::commands::repair::{repair_with_progress, RepairOptions};
use tessera::gc::{gc_with_progress, GcOptions};
use tessera::repo::config::Layout;

use super::gc::print_gc;
use crate::output::EXIT_INCOMPLETE;
use crate::progress::{quiet, Phases};
use crate::repo_open::open;
use crate::secrets::Access;

/// The arguments of `tessera repair`.
#[derive(Args)]
pub struct RepairArgs {
    /// The repository.
    repo: Location,
    /// Report what would be done without changing anything.
    #[arg(long)]
    dry_run: bool,
    /// Delete backups that still have unrecoverable chunks (by default
    /// they are kept and listed; restore them with --skip-damaged).
    #[arg(long)]
    forget_damaged: bool,
    /// Then run `gc` (container layout), which deletes the damaged
    /// containers no backup uses any more, or copies their intact chunks
    /// forward without the damage, so that `check` passes.
    #[arg(long, conflicts_with = "dry_run")]
    gc: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera repair`.
pub fn run(args: RepairArgs, access: &Access) -> Result<ExitCode> {
    let RepairArgs {
        repo,
        dry_run,
        forget_damaged,
        gc,
        json,
    } = args;
    let options = RepairOptions {
        dry_run,
        forget_damaged,
    };
    repair_cmd(&repo, options, gc, json, access)
}

fn repair_cmd(
    repo: &Location,
    options: RepairOptions,
    then_gc: bool,
    json: bool,
    access: &Access,
) -> Result<ExitCode> {
    let r = open(repo, LockMode::Exclusive, access)?;
    let report = repair_with_progress(&r, options, &Phases::default())
        .context("repairing the repository")?;
    // Damage no backup uses is garbage: gc clears it (`--gc`), or says how.
    let gc = match then_gc && r.config().layout == Layout::Container {
        true => Some(gc_with_progress(
            &r,
            GcOptions::default(),
            &Phases::default(),
        )?),
        false => None,
    };
    if json {
        let mut v = serde_json::to_value(&report)?;
        v["gc"] = serde_json::to_value(&gc)?;
        println!("{v}");
    } else {
        let verb = if report.dry_run { "would do" } else { "did" };
        for a in &report.actions {
            println!("{} ({verb}): {}: {}", a.kind, a.object, a.detail);
        }
        for u in &report.unrepaired {
            let state = if u.forgotten { "forgotten" } else { "kept" };
            println!("unrepaired: backup {} ({state}): {}", u.backup, u.reason);
        }
        if report.actions.is_empty() && report.unrepaired.is_empty() && !quiet() {
            println!("nothing to repair");
        }
        if let Some(s) = &gc {
            print_gc(s, false)?;
        }
    }
    if gc.is_none() && !report.unused_damage.is_empty() {
        eprintln!(
            "tessera: warning: no backup uses the damage of {}: `check` reports it until \
             `tessera gc {repo}` (or `tessera repair --gc`) clears it",
            report.unused_damage.join(", ")
        );
    }
    if report.unrepaired.iter().any(|u| !u.forgotten) {
        eprintln!(
            "tessera: {} backup(s) still have unrecoverable damage",
            report.unrepaired.iter().filter(|u| !u.forgotten).count()
        );
        return Ok(ExitCode::from(EXIT_INCOMPLETE));
    }
    Ok(ExitCode::SUCCESS)
}
