//! `tessera index`: maintain the deduplication index.

use anyhow::{Context, Result};
use clap::Subcommand;
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};

use crate::progress::summary;
use crate::repo_open::open;
use crate::secrets::Access;

#[derive(Subcommand)]
pub enum IndexCommand {
    /// Recreate the index from the containers.
    Rebuild {
        /// The repository.
        repo: Location,
        /// Print the index statistics as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `tessera index` command.
pub fn run(command: IndexCommand, access: &Access) -> Result<ExitCode> {
    let IndexCommand::Rebuild { repo, json } = command;
    let r = open(&repo, LockMode::Exclusive, access)?;
    let s = r.rebuild_index().context("rebuilding the index")?;
    if json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        summary!(
            "index rebuilt: {} entries from {} containers",
            s.entries,
            s.containers_scanned
        );
    }
    Ok(ExitCode::SUCCESS)
}
