//! `tessera serve`: the web interface (crate `tessera-serve`), on a
//! repository opened here for reading.

use crate::repo_open::open;
use crate::secrets::Access;
use anyhow::{Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};

/// Arguments of `tessera serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// The repository.
    repo: Location,
    /// The address and port to listen on (port 0: a free port). Only
    /// loopback addresses unless --insecure.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Refuse every request that would change something (restore, check).
    #[arg(long)]
    read_only: bool,
    /// Allow --listen on an address other than loopback: the server has
    /// no TLS, so the token and the backups' contents cross the network
    /// in clear.
    #[arg(long)]
    insecure: bool,
    /// A directory of experiment reports to show (`tessera experiment
    /// --out DIR`); found by itself when REPO is a lab repository
    /// (DIR/repos/SYSTEM).
    #[arg(long, value_name = "DIR")]
    reports: Option<PathBuf>,
}

/// Opens the repository with a shared read lock (held while serving:
/// backups can run, maintenance waits) and serves until interrupted.
pub fn run(args: ServeArgs, access: &Access) -> Result<ExitCode> {
    let options = tessera_serve::Options {
        listen: args.listen,
        read_only: args.read_only,
        insecure: args.insecure,
        // The last check's record, beside the metadata caches (FORMAT.md
        // §13.4); not with --no-cache.
        last_check_dir: (access.transfer.cache_limit != 0)
            .then(tessera::backend::cache_root)
            .flatten(),
        reports: args.reports.clone().or_else(|| match &args.repo {
            Location::Local(path) => std::fs::canonicalize(path)
                .ok()
                .and_then(|p| tessera_serve::reports::beside_lab_repository(&p)),
            Location::S3(_) => None,
        }),
    };
    if !options.listen.ip().is_loopback() && !options.insecure {
        // Refused before the password is asked for.
        return Err(tessera_serve::Error::NotLoopback {
            addr: options.listen,
        }
        .into());
    }
    let r = open(&args.repo, LockMode::Read, access)?;
    tessera_serve::serve(r, &options).with_context(|| format!("serving {}", args.repo))?;
    Ok(ExitCode::SUCCESS)
}
