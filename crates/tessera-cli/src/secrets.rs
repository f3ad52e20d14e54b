//! Passwords and keys of encrypted repositories: where a password comes
//! from (file, command, `TESSERA_PASSWORD`, terminal prompt), opening a
//! repository with it, and the new password of `tessera key add|passwd`.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;
use tessera::backend::{Location, LockMode};
use tessera::crypto::{Credentials, KdfParams, NewKey};
use tessera::Repository;
use zeroize::Zeroizing;

/// Environment variable holding the password (as restic users expect).
const PASSWORD_ENV: &str = "TESSERA_PASSWORD";
/// Environment variable holding the password of `copy`'s destination.
const TO_PASSWORD_ENV: &str = "TESSERA_TO_PASSWORD";
/// Environment variable holding the new password of `key add|passwd`.
const NEW_PASSWORD_ENV: &str = "TESSERA_NEW_PASSWORD";

/// How a command gets the password of an encrypted repository, in this
/// order: `--password-file`, `--password-command`, `TESSERA_PASSWORD`, a
/// prompt on the terminal.
#[derive(Args, Clone, Default)]
pub struct PasswordArgs {
    /// Read the repository password from the first line of FILE.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "TESSERA_PASSWORD_FILE"
    )]
    password_file: Option<PathBuf>,
    /// Run CMD with the shell and use the first line it prints as the password.
    #[arg(
        long,
        global = true,
        value_name = "CMD",
        conflicts_with = "password_file"
    )]
    password_command: Option<String>,
    /// Try only key file ID (faster with many keys; see `tessera key list`).
    #[arg(long, global = true, value_name = "ID")]
    key_id: Option<String>,
    /// Where this password comes from, for the prompt and for the
    /// message when there is none ([`REPOSITORY`] when unset).
    #[arg(skip)]
    source: Option<Source>,
}

/// The names a password goes by: its environment variable, the options
/// that give it, and what a prompt calls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    /// The environment variable holding it.
    env: &'static str,
    /// The options giving it, as a message names them.
    options: &'static str,
    /// What the prompt asks for.
    what: &'static str,
}

/// The repository's password.
const REPOSITORY: Source = Source {
    env: PASSWORD_ENV,
    options: "--password-file FILE or --password-command CMD",
    what: "repository password",
};
/// `copy`'s destination's password.
const DESTINATION: Source = Source {
    env: TO_PASSWORD_ENV,
    options: "--to-password-file FILE or --to-password-command CMD",
    what: "destination repository password",
};
/// The new password of `key add|passwd`.
const NEW: Source = Source {
    env: NEW_PASSWORD_ENV,
    options: "--new-password-file FILE",
    what: "new password",
};
/// The password of a new repository (`init`): given as the repository's.
const INIT: Source = Source {
    what: "password for the new repository",
    ..REPOSITORY
};

/// Where `copy` gets the password of its destination repository, in this
/// order: `--to-password-file`, `--to-password-command`,
/// `TESSERA_TO_PASSWORD`, a prompt on the terminal.
#[derive(Args, Clone, Default)]
pub struct ToPasswordArgs {
    /// Read the destination repository's password from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    to_password_file: Option<PathBuf>,
    /// Run CMD with the shell and use the first line it prints as the
    /// destination repository's password.
    #[arg(long, value_name = "CMD", conflicts_with = "to_password_file")]
    to_password_command: Option<String>,
    /// Try only the destination's key file ID.
    #[arg(long, value_name = "ID")]
    to_key_id: Option<String>,
}

impl ToPasswordArgs {
    /// The destination's password options as those of a repository.
    pub fn password_args(&self) -> PasswordArgs {
        PasswordArgs {
            password_file: self.to_password_file.clone(),
            password_command: self.to_password_command.clone(),
            key_id: self.to_key_id.clone(),
            source: Some(DESTINATION),
        }
    }
}

/// Argon2id cost of a new key file.
#[derive(Args, Clone, Copy)]
pub struct KdfArgs {
    /// Argon2id memory of the new key: KiB, or a size such as 64MiB
    /// (default 32MiB: about 0.1 s; at least 19MiB, or 46MiB with 1 pass).
    #[arg(long, value_name = "SIZE", env = "TESSERA_KDF_MEMORY",
          default_value_t = KdfParams::default().memory_kib,
          value_parser = KdfParams::parse_memory)]
    kdf_memory: u32,
    /// Argon2id passes of the new key.
    #[arg(long, value_name = "N", env = "TESSERA_KDF_ITERATIONS",
          default_value_t = KdfParams::default().iterations)]
    kdf_iterations: u32,
    /// Accept a key derivation cost below OWASP's minimum (tests and
    /// benchmarks only: such a key file is cheap to attack).
    #[arg(long, env = "TESSERA_INSECURE_KDF", hide = true,
          value_parser = clap::builder::BoolishValueParser::new())]
    insecure_kdf: bool,
}

impl KdfArgs {
    fn params(self) -> KdfParams {
        KdfParams {
            memory_kib: self.kdf_memory,
            iterations: self.kdf_iterations,
            ..KdfParams::default()
        }
    }
}

/// What opening a repository needs besides its path and mode.
pub struct Access {
    /// How long to wait for a conflicting lock holder (`None`: the
    /// default of the mode, [`default_wait`]).
    pub wait: Option<Duration>,
    /// Where the password comes from, if the repository is encrypted.
    pub password: PasswordArgs,
    /// Object stores: requests in flight at once (restore reads, backup
    /// writes, read-ahead).
    pub connections: usize,
    /// Object stores: the metadata cache and bandwidth limits.
    pub transfer: Transfer,
}

/// Object stores: the local metadata cache's size and the bandwidth limits.
#[derive(Clone, Copy, Debug)]
pub struct Transfer {
    /// Bytes the local metadata cache may take; 0: no cache.
    pub cache_limit: u64,
    /// Upload limit in bytes per second; 0: none.
    pub upload_limit: u64,
    /// Download limit in bytes per second; 0: none.
    pub download_limit: u64,
    /// A request (or step of its transfer) taking longer fails and is retried.
    pub timeout: Duration,
}

/// `location` with the transfer settings of `access` (object stores).
pub fn tuned(location: &Location, access: &Access) -> Location {
    let mut location = location.clone();
    if let Location::S3(s3) = &mut location {
        s3.options.connections = access.connections;
        s3.options.cache_limit = access.transfer.cache_limit;
        s3.options.upload_limit = access.transfer.upload_limit;
        s3.options.download_limit = access.transfer.download_limit;
        s3.options.timeout = access.transfer.timeout;
    }
    location
}

/// Opens the repository at `path` for `mode`; asks for the password only
/// if it is encrypted.
pub fn open_repo(
    location: &Location,
    mode: LockMode,
    access: &Access,
) -> tessera::Result<Repository> {
    let unlock = || {
        let source = access.password.source.unwrap_or(REPOSITORY);
        let password = read_password(&access.password, source, false)
            .map_err(|e| tessera::Error::Credentials(format!("{e:#}")))?;
        Ok(Credentials::new(password, access.password.key_id.clone()))
    };
    let wait = access.wait.unwrap_or_else(|| default_wait(mode));
    Repository::open_at(&tuned(location, access), mode, wait, &unlock)
}

/// How long a command waits for a conflicting lock holder without
/// `--wait`: backups and maintenance up to an hour (a scheduled job
/// started beside another one must not fail, FORMAT.md §13.3), readers
/// not at all.
pub fn default_wait(mode: LockMode) -> Duration {
    match mode {
        LockMode::Read => Duration::ZERO,
        _ => Duration::from_secs(3600),
    }
}

/// The password of a new repository (`init`): asked twice on a terminal.
pub fn new_repo_key(args: &PasswordArgs, kdf: KdfArgs) -> Result<NewKey> {
    let password = read_password(args, args.source.unwrap_or(INIT), true)?;
    new_key(password, kdf)
}

fn new_key(password: Zeroizing<String>, kdf: KdfArgs) -> Result<NewKey> {
    if password.is_empty() {
        bail!("an empty password is refused");
    }
    Ok(NewKey {
        password,
        kdf: kdf.params(),
        insecure_kdf: kdf.insecure_kdf,
    })
}

/// The password from the first source `args` name (named as `source` says).
fn read_password(args: &PasswordArgs, source: Source, confirm: bool) -> Result<Zeroizing<String>> {
    if let Some(file) = &args.password_file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading the password file {}", file.display()))?;
        return Ok(first_line(text));
    }
    if let Some(command) = &args.password_command {
        return run_password_command(command);
    }
    if let Ok(password) = std::env::var(source.env) {
        return Ok(Zeroizing::new(password));
    }
    prompt(source, confirm)
}

/// The first line of `text` (without its line end), the rest zeroed.
fn first_line(text: String) -> Zeroizing<String> {
    let text = Zeroizing::new(text);
    Zeroizing::new(text.lines().next().unwrap_or_default().to_string())
}

fn run_password_command(command: &str) -> Result<Zeroizing<String>> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running the password command {command:?}"))?;
    if !out.status.success() {
        bail!("the password command {command:?} failed ({})", out.status);
    }
    let text = String::from_utf8(out.stdout)
        .with_context(|| format!("the password command {command:?} printed no UTF-8"))?;
    Ok(first_line(text))
}

/// Asks on the terminal (twice if `confirm`) for the password `source`
/// names; off a terminal, fails naming the options and variable that give it.
fn prompt(source: Source, confirm: bool) -> Result<Zeroizing<String>> {
    let Source { env, options, what } = source;
    if !std::io::stdin().is_terminal() {
        bail!("no {what}: not on a terminal; pass {options}, or set {env}");
    }
    let first = Zeroizing::new(rpassword::prompt_password(format!("enter {what}: "))?);
    if confirm {
        let again = Zeroizing::new(rpassword::prompt_password(format!("enter {what} again: "))?);
        if first != again {
            bail!("the passwords do not match");
        }
    }
    Ok(first)
}

/// Where the new password of `key add|passwd` comes from:
/// `--new-password-file`, `TESSERA_NEW_PASSWORD`, or a prompt (twice).
#[derive(Args)]
pub struct NewPasswordArgs {
    /// Read the new password from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    new_password_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) kdf: KdfArgs,
}

impl NewPasswordArgs {
    pub fn key(&self) -> Result<NewKey> {
        let password = match (&self.new_password_file, std::env::var(NEW_PASSWORD_ENV)) {
            (Some(file), _) => first_line(
                std::fs::read_to_string(file)
                    .with_context(|| format!("reading the password file {}", file.display()))?,
            ),
            (None, Ok(password)) => Zeroizing::new(password),
            (None, Err(_)) => prompt(NEW, true)?,
        };
        new_key(password, self.kdf)
    }
}

/// Opens `repo` for a backup with the password of `access`, asked once,
/// and makes the new key for that same password with cost `kdf`.
pub(crate) fn open_keeping_password(
    repo: &Location,
    access: &Access,
    kdf: KdfArgs,
) -> Result<(Repository, NewKey)> {
    let asked = std::cell::RefCell::new(None);
    let unlock = || {
        let password = read_password(&access.password, REPOSITORY, false)
            .map_err(|e| tessera::Error::Credentials(format!("{e:#}")))?;
        *asked.borrow_mut() = Some(password.clone());
        Ok(Credentials::new(password, access.password.key_id.clone()))
    };
    let r = Repository::open_at(
        &tuned(repo, access),
        LockMode::Backup,
        access
            .wait
            .unwrap_or_else(|| default_wait(LockMode::Backup)),
        &unlock,
    )?;
    match asked.into_inner() {
        Some(password) => Ok((r, new_key(password, kdf)?)),
        None => bail!("{}: the repository is not encrypted: it has no keys", repo),
    }
}
