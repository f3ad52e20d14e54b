//! `tessera repair`: repair what can be proven.

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::commands::repair::{repair_with_progress, RepairOptions, RepairReport};
use tessera::gc::{gc_with_progress, GcOptions, GcStats};

use crate::output::{print, Form, Keys, Report, EXIT_INCOMPLETE};
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
    let gc = match then_gc && tessera::layout::needs_gc(&r) {
        true => Some(gc_with_progress(
            &r,
            GcOptions::default(),
            &Phases::default(),
        )?),
        false => None,
    };
    let repaired = Repaired {
        report: &report,
        gc: gc.as_ref(),
    };
    print(&repaired, Form::json_if(json))?;
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

/// What `tessera repair` did, and the gc that followed it (`--gc`).
#[derive(Serialize)]
struct Repaired<'a> {
    #[serde(flatten)]
    report: &'a RepairReport,
    gc: Option<&'a GcStats>,
}

impl Report for Repaired<'_> {
    const KEYS: Keys = Keys::Sorted;
    /// What was repaired or left unrepaired is printed whatever the verbosity.
    const SUMMARY: bool = false;

    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let report = self.report;
        let verb = if report.dry_run { "would do" } else { "did" };
        for a in &report.actions {
            writeln!(out, "{} ({verb}): {}: {}", a.kind, a.object, a.detail)?;
        }
        for u in &report.unrepaired {
            let state = if u.forgotten { "forgotten" } else { "kept" };
            writeln!(
                out,
                "unrepaired: backup {} ({state}): {}",
                u.backup, u.reason
            )?;
        }
        if report.actions.is_empty() && report.unrepaired.is_empty() && !quiet() {
            writeln!(out, "nothing to repair")?;
        }
        match self.gc {
            Some(s) if !quiet() => s.text(out),
            _ => Ok(()),
        }
    }
}
