//! `tessera delete`: delete a backup.

use anyhow::{Context, Result};
use clap::Args;
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};

use crate::progress::summary;
use crate::repo_open::{backup_id, open};
use crate::secrets::Access;

/// The arguments of `tessera delete`.
#[derive(Args)]
pub struct DeleteArgs {
    /// The repository.
    repo: Location,
    /// The backup id.
    id: String,
    /// Print `{"deleted": ID}`.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera delete`.
pub fn run(args: DeleteArgs, access: &Access) -> Result<ExitCode> {
    let DeleteArgs { repo, id, json } = args;
    let r = open(&repo, LockMode::Exclusive, access)?;
    let id = backup_id(&r, &id)?;
    tessera::commands::delete::delete_backup(&r, id)
        .with_context(|| format!("deleting backup {id}"))?;
    if json {
        println!("{}", serde_json::json!({ "deleted": id }));
    } else {
        summary!("deleted backup {id}");
    }
    Ok(ExitCode::SUCCESS)
}
