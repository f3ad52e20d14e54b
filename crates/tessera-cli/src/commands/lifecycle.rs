//! The lifecycle layout's commands: `tessera arrange` and `tessera space`.

use anyhow::Result;
use clap::Args;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::format::snapshot::BackupId;
use tessera::parse_size;

use crate::output::{human, print, Form, Keys, Report};
use crate::progress::Phases;
use crate::repo_open::open;
use crate::secrets::Access;

/// The arguments of `tessera arrange`.
#[derive(Args)]
pub struct ArrangeArgs {
    /// The repository.
    repo: Location,
    /// Memory for each sort of a round (the active chunks by
    /// fingerprint, the positions kept); past it they spill to
    /// temporary files.
    #[arg(long, value_name = "SIZE", default_value = "32MiB", value_parser = parse_size)]
    sort_memory: u64,
    /// Print the metrics as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera arrange`.
pub fn arrange(args: ArrangeArgs, access: &Access) -> Result<ExitCode> {
    let ArrangeArgs {
        repo,
        sort_memory,
        json,
    } = args;
    let r = open(&repo, LockMode::Exclusive, access)?;
    let options = tessera::layout::lifecycle::ArrangeOptions {
        rounds: None,
        sort_budget: sort_memory,
    };
    let s = tessera::layout::lifecycle::arrange_with_options(&r, &options, &Phases::default())?;
    print(&s, Form::json_if(json))?;
    Ok(ExitCode::SUCCESS)
}

impl Report for tessera::layout::lifecycle::ArrangeStats {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "arranged {} round(s): {} categories split, {} volumes written, {} read, {} written, {:.2} s",
            self.rounds,
            self.categories_split,
            self.volumes_written,
            human(self.bytes_read),
            human(self.bytes_written),
            self.seconds
        )
    }
}

/// The arguments of `tessera space`.
#[derive(Args)]
pub struct SpaceArgs {
    /// The repository.
    repo: Location,
    /// Backup ids (none: only the trend).
    ids: Vec<BackupId>,
    /// Source lineage of the trend.
    #[arg(long, default_value = "default")]
    source: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera space`.
pub fn space(args: SpaceArgs, access: &Access) -> Result<ExitCode> {
    let SpaceArgs {
        repo,
        ids,
        source,
        json,
    } = args;
    let r = open(&repo, LockMode::Read, access)?;
    let freed = if ids.is_empty() {
        0
    } else {
        tessera::layout::lifecycle::space(&r, &ids)?
    };
    let trend = tessera::layout::lifecycle::trend(&r, &source)?;
    let report = Space {
        ids,
        freed_bytes: freed,
        trend,
    };
    print(&report, Form::json_if(json))?;
    Ok(ExitCode::SUCCESS)
}

/// What `tessera space` found.
#[derive(serde::Serialize)]
struct Space {
    ids: Vec<BackupId>,
    freed_bytes: u64,
    trend: Vec<tessera::layout::lifecycle::VersionSpace>,
}

impl Report for Space {
    const KEYS: Keys = Keys::Sorted;
    const SUMMARY: bool = false;

    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        if !self.ids.is_empty() {
            let list: Vec<String> = self.ids.iter().map(|i| i.to_string()).collect();
            writeln!(
                out,
                "deleting backups {} would free {}",
                list.join(" "),
                human(self.freed_bytes)
            )?;
        }
        writeln!(
            out,
            "{:>8} {:>8} {:>12} {:>12}",
            "version", "backup", "new data", "volume"
        )?;
        for v in &self.trend {
            let show = |b: Option<u64>| b.map_or_else(|| "-".into(), human);
            writeln!(
                out,
                "{:>8} {:>8} {:>12} {:>12}",
                v.version,
                v.backup,
                show(v.new_bytes),
                show(v.volume_bytes)
            )?;
        }
        Ok(())
    }
}
