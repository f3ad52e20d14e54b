//! `tessera unlock`: remove stale lock objects.

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use tessera::backend::Location;
use tessera::Repository;

use crate::progress::summary;
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
    if json {
        println!("{}", serde_json::json!({ "removed": removed }));
    } else {
        for line in &removed {
            summary!("removed {line}");
        }
        summary!("{} lock object(s) removed", removed.len());
    }
    Ok(ExitCode::SUCCESS)
}
