//! `tessera forget`: delete the backups a retention policy does not keep.

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::commands::forget::{
    forget, parse_group_by, ForgetOptions, ForgetReport, DEFAULT_GROUP_BY,
};
use tessera::commands::retention::{Count, Period, Policy};
use tessera::gc::{gc_with_progress, GcOptions, GcStats};

use crate::output::{human, print, Form, Keys, Report};
use crate::progress::Phases;
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
    let pruned = if args.prune && tessera::layout::needs_gc(&r) && !report.removed.is_empty() {
        Some(gc_with_progress(
            &r,
            GcOptions::default(),
            &Phases::default(),
        )?)
    } else {
        None
    };
    let forgotten = Forgotten {
        report: &report,
        gc: pruned.as_ref(),
    };
    print(&forgotten, Form::pretty_json_if(args.json))?;
    Ok(ExitCode::SUCCESS)
}

/// What `tessera forget` decided and did, and the gc that followed it (`--prune`).
#[derive(Serialize)]
struct Forgotten<'a> {
    #[serde(flatten)]
    report: &'a ForgetReport,
    gc: Option<&'a GcStats>,
}

impl Report for Forgotten<'_> {
    const KEYS: Keys = Keys::Sorted;

    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        forget_text(self.report, out)?;
        match self.gc {
            Some(s) => s.text(out),
            None => Ok(()),
        }
    }
}

/// group its name and counts and each backup newest first with the rules
/// that keep it.
fn forget_text(report: &ForgetReport, out: &mut dyn Write) -> io::Result<()> {
    let tz = jiff::tz::TimeZone::system();
    let keys: Vec<&str> = report.group_by.iter().map(|k| k.name()).collect();
    writeln!(
        out,
        "{} group(s) by {}",
        report.groups.len(),
        if keys.is_empty() {
            "nothing (every backup in one group)".to_string()
        } else {
            keys.join(",")
        }
    )?;
    let mut groups = report.groups.iter();
    let mut group = None;
    for d in &report.decisions {
        if group != Some(&d.group) {
            let counts = groups
                .next()
                .map(|g| format!(": keep {}, remove {}", g.keep.len(), g.remove.len()))
                .unwrap_or_default();
            writeln!(
                out,
                "group {}{counts}",
                if d.group.is_empty() {
                    "(all)"
                } else {
                    &d.group
                }
            )?;
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
        writeln!(out, "  {:>6}  {when}  {verdict}  {}", d.id, why.join(", "))?;
    }
    for id in &report.unreadable {
        writeln!(
            out,
            "backup {id}: snapshot unreadable, left alone (see `tessera check`, `tessera repair`)"
        )?;
    }
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    writeln!(
        out,
        "{verb} {} of {} backup(s)",
        report.removed.len(),
        report.decisions.len()
    )?;
    if let Some(f) = &report.freed {
        writeln!(
            out,
            "freed {} at once (lifecycle layout: no gc needed)",
            human(f.bytes_freed)
        )?;
    }
    Ok(())
}
