//! `tessera index`: maintain the deduplication index.

use anyhow::{Context, Result};
use clap::Subcommand;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};

use crate::output::{print, Form, Report};
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
    print(&s, Form::json_if(json))?;
    Ok(ExitCode::SUCCESS)
}

impl Report for tessera::index::IndexStats {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "index rebuilt: {} entries from {} containers",
            self.entries, self.containers_scanned
        )
    }
}
