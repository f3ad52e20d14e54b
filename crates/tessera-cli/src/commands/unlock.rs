//! `tessera unlock`: remove stale lock objects.

use anyhow::Result;
use clap::Args;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::Location;
use tessera::Repository;

use crate::output::{print, Form, Report};
use crate::secrets::{tuned, Access};

/// The arguments of `tessera unlock`.
#[derive(Args)]
pub struct UnlockArgs {
    /// The repository.
    repo: Location,
    /// Remove every lock object, also those of running processes
    /// (only when you know none is running).
    #[arg(long)]
    remove_all: bool,
    /// Print JSON: `{"removed": [LOCK, ...]}`.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera unlock`.
pub fn run(args: UnlockArgs, access: &Access) -> Result<ExitCode> {
    let UnlockArgs {
        repo,
        remove_all,
        json,
    } = args;
    let removed = Repository::unlock_at(&tuned(&repo, access), remove_all)?;
    print(&Unlocked { removed }, Form::json_if(json))?;
    Ok(ExitCode::SUCCESS)
}

/// What `tessera unlock` removed.
#[derive(serde::Serialize)]
struct Unlocked {
    removed: Vec<String>,
}

impl Report for Unlocked {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        for line in &self.removed {
            writeln!(out, "removed {line}")?;
        }
        writeln!(out, "{} lock object(s) removed", self.removed.len())
    }
}
