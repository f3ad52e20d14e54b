//! `tessera forget`: delete the backups a retention policy does not keep.

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::commands::forget::{
    forget, parse_group_by, ForgetOptions, ForgetReport, DEFAULT_GROUP_BY,
};
use tessera::commands::retention::{Count, Period, Policy};
use tessera::gc::{gc_with_progress, GcOptions};
use tessera::repo::config::Layout;

use super::gc::print_gc;
use crate::output::human;
use crate::progress::{quiet, Phases};
use crate::repo_open::open;
use crate::secrets::Access;

/// `tessera forget`: a retention policy (restic's `--keep-*` rules).
#[derive(Args)]
#[command(group(clap::ArgGroup::new("rules").required(true).multiple(true).args([
    "keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly",
    "keep_within", "keep_tag",
])))]
pub struct ForgetArgs {
    /// The repository.
    repo: Location,
    /// Keep the N newest backups (`unlimited` keeps all).
    #[arg(long, value_name = "N")]
    keep_last: Option<Count>,
    /// Keep the newest backup of each of the N newest hours that have one.
    #[arg(long, value_name = "N")]
    keep_hourly: Option<Count>,
    /// Keep the newest backup of each of the N newest days that have one.
    #[arg(long, value_name = "N")]
    keep_daily: Option<Count>,
    /// Keep the newest backup of each of the N newest ISO weeks that have one.
    #[arg(long, value_name = "N")]
    keep_weekly: Option<Count>,
    /// Keep the newest backup of each of the N newest months that have one.
    #[arg(long, value_name = "N")]
    keep_monthly: Option<Count>,
    /// Keep the newest backup of each of the N newest years that have one.
    #[arg(long, value_name = "N")]
    keep_yearly: Option<Count>,
    /// Keep every backup made within this span before the group's newest
    /// (e.g. `30d`, `1y 6mo`, `2w`, `P1Y2M`).
    #[arg(long, value_name = "SPAN")]
    keep_within: Option<jiff::Span>,
    /// Keep every backup carrying this tag (repeatable).
    #[arg(long, value_name = "TAG")]
    keep_tag: Vec<String>,
    /// Group backups by these properties (comma-separated: host, paths,
    /// source, tags; empty: one group). The default is restic's host and
    /// paths, and the source lineage, which keeps apart streams of
    /// standard input (they have no paths).
    #[arg(long, value_name = "KEYS", default_value = DEFAULT_GROUP_BY)]
    group_by: String,
    /// Only show what would be deleted.
    #[arg(long)]
    dry_run: bool,
    /// Reclaim the space afterwards (`gc` with default settings; the
    /// lifecycle layout reclaims it anyway).
    #[arg(long, conflicts_with = "dry_run")]
    prune: bool,
    /// Print the decisions as JSON.
    #[arg(long)]
    json: bool,
}

impl ForgetArgs {
    fn options(&self) -> Result<ForgetOptions> {
        let periods = [
            (Period::Hourly, self.keep_hourly),
            (Period::Daily, self.keep_daily),
            (Period::Weekly, self.keep_weekly),
            (Period::Monthly, self.keep_monthly),
            (Period::Yearly, self.keep_yearly),
        ]
        .into_iter()
        .filter_map(|(p, c)| c.map(|c| (p, c)))
        .collect();
        Ok(ForgetOptions {
            policy: Policy {
                last: self.keep_last,
                periods,
                within: self.keep_within,
                tags: self.keep_tag.clone(),
            },
            group_by: parse_group_by(&self.group_by)?,
            dry_run: self.dry_run,
            time_zone: jiff::tz::TimeZone::system(),
        })
    }
}

/// Runs `tessera forget`.
pub fn run(args: ForgetArgs, access: &Access) -> Result<ExitCode> {
    let mode = if args.dry_run {
        LockMode::Read
    } else {
        LockMode::Exclusive
    };
    let r = open(&args.repo, mode, access)?;
    let report = forget(&r, &args.options()?)?;
    let pruned =
        if args.prune && r.config().layout == Layout::Container && !report.removed.is_empty() {
            Some(gc_with_progress(
                &r,
                GcOptions::default(),
                &Phases::default(),
            )?)
        } else {
            None
        };
    if args.json {
        let mut v = serde_json::to_value(&report)?;
        v["gc"] = serde_json::to_value(&pruned)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        if !quiet() {
            print_forget(&report);
        }
        if let Some(s) = &pruned {
            print_gc(s, false)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// group its name and counts and each backup newest first with the rules
/// that keep it.
fn print_forget(report: &ForgetReport) {
    let tz = jiff::tz::TimeZone::system();
    let keys: Vec<&str> = report.group_by.iter().map(|k| k.name()).collect();
    println!(
        "{} group(s) by {}",
        report.groups.len(),
        if keys.is_empty() {
            "nothing (every backup in one group)".to_string()
        } else {
            keys.join(",")
        }
    );
    let mut groups = report.groups.iter();
    let mut group = None;
    for d in &report.decisions {
        if group != Some(&d.group) {
            let counts = groups
                .next()
                .map(|g| format!(": keep {}, remove {}", g.keep.len(), g.remove.len()))
                .unwrap_or_default();
            println!(
                "group {}{counts}",
                if d.group.is_empty() {
                    "(all)"
                } else {
                    &d.group
                }
            );
            group = Some(&d.group);
        }
        let when = jiff::Timestamp::from_second(d.time)
            .map(|t| {
                t.to_zoned_datetime(tz.clone())
                    .strftime("%Y-%m-%d %H:%M:%S")
                    .to_string()
            })
            .unwrap_or_else(|_| d.time.to_string());
        let why: Vec<String> = d.reasons.iter().map(ToString::to_string).collect();
        let verdict = if d.keep() { "keep  " } else { "remove" };
        println!("  {:>6}  {when}  {verdict}  {}", d.id, why.join(", "));
    }
    for id in &report.unreadable {
        println!(
            "backup {id}: snapshot unreadable, left alone (see `tessera check`, `tessera repair`)"
        );
    }
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    println!(
        "{verb} {} of {} backup(s)",
        report.removed.len(),
        report.decisions.len()
    );
    if let Some(f) = &report.freed {
        println!(
            "freed {} at once (lifecycle layout: no gc needed)",
            human(f.bytes_freed)
        );
    }
}
