//! `tessera delete`: delete a backup.

use anyhow::{Context, Result};
use clap::Args;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};

use crate::output::{print, Form, Report};
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
    print(&Deleted { deleted: id }, Form::json_if(json))?;
    Ok(ExitCode::SUCCESS)
}

/// What `tessera delete` did.
#[derive(serde::Serialize)]
struct Deleted {
    deleted: tessera::format::snapshot::BackupId,
}

impl Report for Deleted {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "deleted backup {}", self.deleted)
    }
}
