//! `tessera key`: the password key files of an encrypted repository.

use anyhow::Result;
use clap::Subcommand;
use serde::Serialize;
use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;
use tessera::backend::{Location, LockMode};

use crate::output::{print, Form, Keys, Report};
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
            print(&KeyList { keys, current }, Form::json_if(json))?;
        }
        KeyCommand::Add { repo, new, json } => {
            let r = open_repo(&repo, LockMode::Backup, access)?;
            let id = tessera::commands::key::add_key(&r, &new.key()?)?;
            print(&KeyChange::Added { added: id }, Form::json_if(json))?;
        }
        KeyCommand::Remove { repo, id, json } => {
            let r = open_repo(&repo, LockMode::Backup, access)?;
            tessera::commands::key::remove_key(&r, &id)?;
            print(&KeyChange::Removed { removed: id }, Form::json_if(json))?;
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
            print(
                &KeyChange::Passwd { key: id, replaced },
                Form::json_if(json),
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `tessera key list`: the key files, and the one that opened the repository.
#[derive(Serialize)]
struct KeyList<'a> {
    keys: Vec<tessera::crypto::KeyInfo>,
    current: Option<&'a str>,
}

impl Report for KeyList<'_> {
    const KEYS: Keys = Keys::Sorted;
    const SUMMARY: bool = false;

    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            " {:<16} {:>12} {:>6}  created",
            "id", "memory KiB", "passes"
        )?;
        for k in &self.keys {
            let mark = if Some(k.id.as_str()) == self.current {
                '*'
            } else {
                ' '
            };
            writeln!(
                out,
                "{mark}{:<16} {:>12} {:>6}  {}",
                k.id,
                k.kdf.memory_kib,
                k.kdf.iterations,
                humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + Duration::from_secs(k.created)
                )
            )?;
        }
        Ok(())
    }
}

/// What `tessera key add`, `remove` or `passwd` did.
#[derive(Serialize)]
#[serde(untagged)]
enum KeyChange {
    Added {
        added: String,
    },
    Removed {
        removed: String,
    },
    Passwd {
        key: String,
        replaced: Option<String>,
    },
}

impl Report for KeyChange {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        match self {
            KeyChange::Added { added } => writeln!(out, "added key {added}"),
            KeyChange::Removed { removed } => writeln!(out, "removed key {removed}"),
            KeyChange::Passwd { key, .. } => writeln!(
                out,
                "password changed: key {key} replaces the key used to open the repository"
            ),
        }
    }
}
