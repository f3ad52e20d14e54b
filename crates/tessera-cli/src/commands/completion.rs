//! `tessera completion` and `tessera man`: the shell completion script and
//! the manual pages, both drawn from the command line's definition.

use anyhow::{Context, Result};
use clap::{Args, CommandFactory};
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::progress::summary;
use crate::Cli;

/// The arguments of `tessera completion`.
#[derive(Args)]
pub struct CompletionArgs {
    /// The shell.
    shell: clap_complete::Shell,
}

/// Runs `tessera completion`.
pub fn completion(args: CompletionArgs) -> Result<ExitCode> {
    let CompletionArgs { shell } = args;
    clap_complete::generate(shell, &mut Cli::command(), "tessera", &mut io::stdout());
    Ok(ExitCode::SUCCESS)
}

/// The arguments of `tessera man`.
#[derive(Args)]
pub struct ManArgs {
    /// The directory (created if absent; existing pages of the same
    /// names are replaced).
    dir: PathBuf,
}

/// Runs `tessera man`.
pub fn man(args: ManArgs) -> Result<ExitCode> {
    let ManArgs { dir } = args;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("{}: cannot create the directory", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), &dir)
        .with_context(|| format!("{}: cannot write the manual pages", dir.display()))?;
    summary!("manual pages written to {}", dir.display());
    Ok(ExitCode::SUCCESS)
}
