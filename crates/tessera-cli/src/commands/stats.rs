//! `tessera stats`: repository totals, or one backup's statistics.

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};

use crate::output::{human, ratio_text};
use crate::repo_open::{backup_id, open};
use crate::secrets::Access;

/// The arguments of `tessera stats`.
#[derive(Args)]
pub struct StatsArgs {
    /// The repository.
    repo: Location,
    /// A backup id (or `latest`).
    id: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera stats`.
pub fn run(args: StatsArgs, access: &Access) -> Result<ExitCode> {
    let StatsArgs { repo, id, json } = args;
    stats(&repo, id.as_deref(), json, access)?;
    Ok(ExitCode::SUCCESS)
}

fn stats(repo: &Location, id: Option<&str>, json: bool, access: &Access) -> Result<()> {
    let r = open(repo, LockMode::Read, access)?;
    if let Some(id) = id {
        let id = backup_id(&r, id)?;
        let snap = r.snapshot(id)?;
        if json {
            println!("{}", serde_json::to_string(&snap)?);
        } else {
            println!("{}", serde_json::to_string_pretty(&snap)?);
        }
        return Ok(());
    }
    let t = tessera::commands::stats::totals(&r)?;
    if json {
        let mut v = serde_json::to_value(&t)?;
        v["config"] = serde_json::to_value(r.config())?;
        println!("{v}");
    } else {
        let c = r.config();
        println!(
            "{} backups, {} logical, {} physical in {} containers, dedup {}, compression {}, total {}\nchunker {} {}/{}/{}, fingerprint {}{}, containers {}\nlayout {}, index {}, rewrite {}, delta {}\nencryption {}, compression {}",
            t.backups,
            human(t.logical_bytes),
            human(t.physical_bytes),
            t.containers,
            ratio_text(t.dedup_ratio),
            ratio_text(t.compression_ratio),
            ratio_text(t.total_ratio),
            c.chunker.kind.name(),
            human(c.chunker.min_size.into()),
            human(c.chunker.avg_size.into()),
            human(c.chunker.max_size.into()),
            c.fingerprint.name(),
            if r.is_encrypted() { " (keyed)" } else { "" },
            human(c.container_size.into()),
            format!("{:?}", c.layout).to_lowercase(),
            format!("{:?}", c.index).to_lowercase(),
            c.rewrite.kind.name(),
            c.delta.kind.name(),
            c.encryption,
            c.compression,
        );
    }
    Ok(())
}
