//! `tessera copy`: backups into another repository.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::format::snapshot::BackupId;

use crate::output::{human, print_json, Keys};
use crate::progress::summary;
use crate::repo_open::{backup_id, open};
use crate::secrets::{Access, ToPasswordArgs};

/// The arguments of `tessera copy`.
#[derive(Args)]
pub struct CopyArgs {
    /// The source repository.
    src: Location,
    /// The destination repository (created with `tessera init`).
    dst: Location,
    /// Backup ids (or `latest`) to copy (default: all).
    ids: Vec<String>,
    #[command(flatten)]
    to: ToPasswordArgs,
    /// Print a JSON array, one record per backup.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera copy`.
pub fn run(args: CopyArgs, access: &Access) -> Result<ExitCode> {
    let CopyArgs {
        src,
        dst,
        ids,
        to,
        json,
    } = args;
    copy_cmd(&src, &dst, &ids, &to, json, access)?;
    Ok(ExitCode::SUCCESS)
}

/// `tessera copy`: each backup copied (or skipped), one line or record each.
fn copy_cmd(
    src: &Location,
    dst: &Location,
    ids: &[String],
    to: &ToPasswordArgs,
    json: bool,
    access: &Access,
) -> Result<()> {
    let same = match (src, dst) {
        (Location::Local(a), Location::Local(b)) => {
            std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
        }
        (a, b) => a == b,
    };
    if same {
        bail!("{src} and {dst} are the same repository: copy needs two");
    }
    let from = open(src, LockMode::Read, access)?;
    let to_access = Access {
        wait: access.wait,
        password: to.password_args(),
        connections: access.connections,
        transfer: access.transfer,
    };
    let into = open(dst, LockMode::Backup, &to_access)?;
    let mut ids: Vec<BackupId> = match ids.is_empty() {
        true => from.backups()?,
        false => ids
            .iter()
            .map(|t| backup_id(&from, t))
            .collect::<Result<_>>()?,
    };
    ids.sort_unstable();
    ids.dedup();
    let mut unclaimed = into.snapshots()?;
    let mut records = Vec::new();
    for id in ids {
        let c = tessera::commands::copy::copy_backup(&from, &into, id, &mut unclaimed)
            .with_context(|| format!("copying backup {id}"))?;
        if !json {
            match c.skipped {
                true => summary!("backup {id}: already copied as {}", c.copy_id),
                false => summary!(
                    "backup {id}: copied as {} ({}, {} stored)",
                    c.copy_id,
                    human(c.logical_bytes),
                    human(c.stored_bytes)
                ),
            }
        }
        records.push(c);
    }
    if json {
        print_json(&records, Keys::Declared, true)?;
    }
    Ok(())
}
