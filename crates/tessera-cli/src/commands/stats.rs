//! `tessera stats`: repository totals, or one backup's statistics.

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::format::snapshot::Snapshot;
use tessera::repo::config::Config;
use tessera::repo::RepoTotals;

use crate::output::{human, json_text, print, ratio_text, Form, Keys, Report};
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
        return print(&BackupStats(&snap), Form::json_if(json));
    }
    let totals = Totals {
        totals: tessera::commands::stats::totals(&r)?,
        config: r.config(),
        encrypted: r.is_encrypted(),
    };
    print(&totals, Form::json_if(json))
}

/// One backup's statistics: its snapshot (as text, indented JSON).
#[derive(Serialize)]
#[serde(transparent)]
struct BackupStats<'a>(&'a Snapshot);

impl Report for BackupStats<'_> {
    const SUMMARY: bool = false;

    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{}", json_text(self.0, Keys::Declared, true)?)
    }
}

/// The repository's totals and configuration.
#[derive(Serialize)]
struct Totals<'a> {
    #[serde(flatten)]
    totals: RepoTotals,
    config: &'a Config,
    #[serde(skip)]
    encrypted: bool,
}

impl Report for Totals<'_> {
    const KEYS: Keys = Keys::Sorted;
    const SUMMARY: bool = false;

    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let (t, c) = (&self.totals, self.config);
        writeln!(
            out,
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
            if self.encrypted { " (keyed)" } else { "" },
            human(c.container_size.into()),
            format!("{:?}", c.layout).to_lowercase(),
            format!("{:?}", c.index).to_lowercase(),
            c.rewrite.kind.name(),
            c.delta.kind.name(),
            c.encryption,
            c.compression,
        )
    }
}
