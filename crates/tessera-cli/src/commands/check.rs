//! `tessera check`: verify the repository.

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::commands::check::last::{self, LastCheck};
use tessera::commands::check::{check_with_progress, CheckOptions, CheckReport, ProblemKind};
use tessera::Repository;

use crate::output::{print, Form, Report};
use crate::progress::{quiet, Phases};
use crate::repo_open::open;
use crate::secrets::Access;

/// The arguments of `tessera check`.
#[derive(Args)]
pub struct CheckArgs {
    /// The repository.
    repo: Location,
    /// What to verify: --read-data, --sort-memory.
    #[command(flatten)]
    options: CheckOptions,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera check`.
pub fn run(args: CheckArgs, access: &Access) -> Result<ExitCode> {
    let CheckArgs {
        repo,
        options,
        json,
    } = args;
    check_cmd(&repo, options, json, access)
}

/// Keeps the report as the repository's last check (FORMAT.md §13.4) in
/// the per-user cache directory, for `tessera serve`'s health view; not
/// with `--no-cache`. A failure to keep it is a warning: the check ran.
fn keep_record(r: &Repository, options: CheckOptions, report: &CheckReport, access: &Access) {
    if access.transfer.cache_limit == 0 {
        return;
    }
    let Some(root) = tessera::backend::cache_root() else {
        return;
    };
    let record = LastCheck::new(r, options.read_data, "check", report.clone());
    if let Err(e) = last::save(&root, &record) {
        eprintln!("tessera: warning: keeping the check's result: {e}");
    }
}

fn check_cmd(
    repo: &Location,
    options: CheckOptions,
    json: bool,
    access: &Access,
) -> Result<ExitCode> {
    let r = open(repo, LockMode::Read, access)?;
    let report = check_with_progress(&r, options, &Phases::default())?;
    for w in &report.warnings {
        eprintln!("tessera: warning: {w}");
    }
    keep_record(&r, options, &report, access);
    let checked = Checked {
        report: &report,
        repo,
        read_data: options.read_data,
        needs_gc: tessera::layout::needs_gc(&r),
    };
    print(&checked, Form::json_if(json))?;
    if report.is_ok() {
        Ok(ExitCode::SUCCESS)
    } else {
        if !json {
            eprintln!(
                "tessera: error: check found {} problem(s)",
                report.problems.len()
            );
        }
        Ok(ExitCode::FAILURE)
    }
}

/// What `tessera check` found, with what its text says about it.
#[derive(Serialize)]
#[serde(transparent)]
struct Checked<'a> {
    report: &'a CheckReport,
    #[serde(skip)]
    repo: &'a Location,
    #[serde(skip)]
    read_data: bool,
    #[serde(skip)]
    needs_gc: bool,
}

impl Report for Checked<'_> {
    const SUMMARY: bool = false;

    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let (report, repo) = (self.report, self.repo);
        let needs_gc = self.needs_gc;
        // Damaged containers no backup uses any damage of: gc clears them.
        let used: std::collections::HashSet<&str> = report
            .problems
            .iter()
            .filter(|p| !p.affected_backups.is_empty())
            .map(|p| p.object.as_str())
            .collect();
        for p in &report.problems {
            let users: Vec<String> = p.affected_backups.iter().map(|b| b.to_string()).collect();
            writeln!(
                out,
                "problem: {}: {} (affects backups: {})",
                p.object,
                p.detail,
                match (users.is_empty(), p.kind) {
                    (false, _) => users.join(", "),
                    (true, ProblemKind::Derived) =>
                        "none: derived data, rebuilt automatically or by `repair`".into(),
                    (true, ProblemKind::Damaged)
                        if needs_gc
                            && p.object.starts_with("containers/")
                            && !used.contains(p.object.as_str()) =>
                        format!("none: no backup uses its damage; `tessera gc {repo}` clears it"),
                    (true, _) => "none".into(),
                }
            )?;
        }
        if quiet() {
            // Problems are listed above; the summary is chatter.
        } else {
            writeln!(
                out,
                "checked {} containers ({} chunks{}), {} backups ({} references): {}{}",
                report.containers,
                report.stored_chunks,
                if self.read_data {
                    format!(", {} re-hashed", report.chunks_verified)
                } else {
                    String::new()
                },
                report.backups,
                report.references,
                if report.is_ok() {
                    "no problems".to_string()
                } else {
                    format!("{} problem(s)", report.problems.len())
                },
                if report.unreferenced_containers + report.uncommitted_recipes > 0 {
                    format!(
                    "; {} unreferenced container(s) and {} uncommitted recipe(s) left by interrupted backups",
                    report.unreferenced_containers, report.uncommitted_recipes
                )
                } else {
                    String::new()
                }
            )?;
        }
        Ok(())
    }
}
