//! `tessera login` / `tessera logout`: sessions that spare later commands
//! the key derivation (docs/SECURITY.md "Sessions").

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;
use tessera::backend::{Location, LockMode};

use crate::progress::summary;
use crate::secrets::{open_repo, Access};

/// The arguments of `tessera login`.
#[derive(Args)]
pub struct LoginArgs {
    /// The (encrypted) repository.
    repo: Location,
    /// How long the session lasts.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_lifetime)]
    expire_after: Duration,
    /// Print JSON: `{"session": PATH, "key": ID, "expires": UNIX_SECONDS}`.
    #[arg(long)]
    json: bool,
}

/// The arguments of `tessera logout`.
#[derive(Args)]
pub struct LogoutArgs {
    /// The repository.
    repo: Location,
    /// Print JSON: `{"removed": N}`.
    #[arg(long)]
    json: bool,
}

fn parse_lifetime(s: &str) -> std::result::Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{e} (a duration such as 30m, 8h or 1d)"))?;
    match d.as_secs() {
        0 => Err("a session of no time".into()),
        n if n > 31 * 24 * 3600 => Err("a session lasts at most 31 days".into()),
        _ => Ok(d),
    }
}

/// Runs `tessera login`.
pub fn login(args: LoginArgs, access: &Access) -> Result<ExitCode> {
    let repo = open_repo(&args.repo, LockMode::Read, access)?;
    let session = tessera::commands::key::login(&repo, args.expire_after)?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "session": session.path,
                "key": session.key,
                "expires": session.expires,
            })
        );
    } else {
        summary!(
            "logged in with key {} until {} ({})",
            session.key,
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_secs(session.expires)
            ),
            session.path.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `tessera logout`.
pub fn logout(args: LogoutArgs, access: &Access) -> Result<ExitCode> {
    let repo = open_repo(&args.repo, LockMode::Read, access)?;
    let removed = tessera::commands::key::logout(&repo)?;
    if args.json {
        println!("{}", serde_json::json!({ "removed": removed }));
    } else {
        summary!("{removed} session(s) ended");
    }
    Ok(ExitCode::SUCCESS)
}
