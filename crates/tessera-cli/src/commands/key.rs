//! `tessera key`: the password key files of an encrypted repository.

use anyhow::Result;
use clap::Subcommand;
use std::process::ExitCode;
use std::time::Duration;
use tessera::backend::{Location, LockMode};

use crate::progress::summary;
use crate::secrets::{open_keeping_password, open_repo, Access, NewPasswordArgs};

/// `tessera key …`: the key files of an encrypted repository.
#[derive(Subcommand)]
pub enum KeyCommand {
    /// List the key files (the one used to open the repository marked `*`).
    List {
        /// The repository.
        repo: Location,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add a key file for a new password.
    Add {
        /// The repository.
        repo: Location,
        #[command(flatten)]
        new: NewPasswordArgs,
        /// Print JSON: `{"added": ID}`.
        #[arg(long)]
        json: bool,
    },
    /// Remove a key file (never the last one).
    Remove {
        /// The repository.
        repo: Location,
        /// The key's id (see `tessera key list`).
        id: String,
        /// Print JSON: `{"removed": ID}`.
        #[arg(long)]
        json: bool,
    },
    /// Change the password or the key derivation cost of the key file used
    /// to open the repository.
    Passwd {
        /// The repository.
        repo: Location,
        #[command(flatten)]
        new: NewPasswordArgs,
        /// Keep the password: only rewrap the master key with the new
        /// --kdf-memory and --kdf-iterations.
        #[arg(long, conflicts_with = "new_password_file")]
        keep_password: bool,
        /// Print JSON: `{"key": NEW_ID, "replaced": OLD_ID}`.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `tessera key` command.
pub fn run(command: KeyCommand, access: &Access) -> Result<ExitCode> {
    match command {
        KeyCommand::List { repo, json } => {
            let r = open_repo(&repo, LockMode::Read, access)?;
            let keys = tessera::commands::key::list_keys(&r)?;
            let current = tessera::commands::key::current_key(&r);
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "keys": keys, "current": current })
                );
            } else {
                println!(
                    " {:<16} {:>12} {:>6}  created",
                    "id", "memory KiB", "passes"
                );
                for k in keys {
                    let mark = if Some(k.id.as_str()) == current {
                        '*'
                    } else {
                        ' '
                    };
                    println!(
                        "{mark}{:<16} {:>12} {:>6}  {}",
                        k.id,
                        k.kdf.memory_kib,
                        k.kdf.iterations,
                        humantime::format_rfc3339_seconds(
                            std::time::UNIX_EPOCH + Duration::from_secs(k.created)
                        )
                    );
                }
            }
        }
        KeyCommand::Add { repo, new, json } => {
            let r = open_repo(&repo, LockMode::Backup, access)?;
            let id = tessera::commands::key::add_key(&r, &new.key()?)?;
            match json {
                true => println!("{}", serde_json::json!({ "added": id })),
                false => summary!("added key {id}"),
            }
        }
        KeyCommand::Remove { repo, id, json } => {
            let r = open_repo(&repo, LockMode::Backup, access)?;
            tessera::commands::key::remove_key(&r, &id)?;
            match json {
                true => println!("{}", serde_json::json!({ "removed": id })),
                false => summary!("removed key {id}"),
            }
        }
        KeyCommand::Passwd {
            repo,
            new,
            keep_password,
            json,
        } => {
            let (r, key) = match keep_password {
                true => open_keeping_password(&repo, access, new.kdf)?,
                false => (open_repo(&repo, LockMode::Backup, access)?, new.key()?),
            };
            let replaced = tessera::commands::key::current_key(&r).map(str::to_owned);
            let id = tessera::commands::key::change_password(&r, &key)?;
            match json {
                true => println!("{}", serde_json::json!({ "key": id, "replaced": replaced })),
                false => summary!(
                    "password changed: key {id} replaces the key used to open the repository"
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
