//! `tessera check`: verify the repository.

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::commands::check::last::{self, LastCheck};
use tessera::commands::check::{check_with_progress, CheckOptions, CheckReport, ProblemKind};
use tessera::parse_size;
use tessera::repo::config::Layout;
use tessera::Repository;

use crate::progress::{quiet, Phases};
use crate::repo_open::open;
use crate::secrets::Access;

/// The arguments of `tessera check`.
#[derive(Args)]
pub struct CheckArgs {
    /// The repository.
    repo: Location,
    /// Also read all data and re-hash every chunk.
    #[arg(long)]
    read_data: bool,
    /// Memory for each of check's structures that grow with the
    /// repository (stored chunks, references); past it they spill to
    /// temporary files.
    #[arg(long, value_name = "SIZE", default_value = "32MiB", value_parser = parse_size)]
    sort_memory: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera check`.
pub fn run(args: CheckArgs, access: &Access) -> Result<ExitCode> {
    let CheckArgs {
        repo,
        read_data,
        sort_memory,
        json,
    } = args;
    let options = CheckOptions {
        read_data,
        sort_budget: sort_memory,
    };
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
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        // Damaged containers no backup uses any damage of: gc clears them.
        let used: std::collections::HashSet<&str> = report
            .problems
            .iter()
            .filter(|p| !p.affected_backups.is_empty())
            .map(|p| p.object.as_str())
            .collect();
        let container_layout = r.config().layout == Layout::Container;
        for p in &report.problems {
            let users: Vec<String> = p.affected_backups.iter().map(|b| b.to_string()).collect();
            println!(
                "problem: {}: {} (affects backups: {})",
                p.object,
                p.detail,
                match (users.is_empty(), p.kind) {
                    (false, _) => users.join(", "),
                    (true, ProblemKind::Derived) =>
                        "none: derived data, rebuilt automatically or by `repair`".into(),
                    (true, ProblemKind::Damaged)
                        if container_layout
                            && p.object.starts_with("containers/")
                            && !used.contains(p.object.as_str()) =>
                        format!("none: no backup uses its damage; `tessera gc {repo}` clears it"),
                    (true, _) => "none".into(),
                }
            );
        }
        if quiet() {
            // Problems are listed above; the summary is chatter.
        } else {
            println!(
                "checked {} containers ({} chunks{}), {} backups ({} references): {}{}",
                report.containers,
                report.stored_chunks,
                if options.read_data {
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
            );
        }
    }
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
