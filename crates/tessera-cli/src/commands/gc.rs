//! `tessera gc`: reclaim the space of deleted backups.

use anyhow::Result;
use clap::Args;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::gc::{gc_with_progress, GcOptions};

use crate::output::{human, print, Form, Report};
use crate::progress::Phases;
use crate::repo_open::open;
use crate::secrets::Access;

/// The arguments of `tessera gc`.
#[derive(Args)]
pub struct GcArgs {
    /// The repository.
    repo: Location,
    /// The garbage collection's options: --threshold, --defrag,
    /// --segment, --split-threshold, --no-fill, --sort-memory.
    #[command(flatten)]
    options: GcOptions,
    /// Print the metrics as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera gc`.
pub fn run(args: GcArgs, access: &Access) -> Result<ExitCode> {
    let GcArgs {
        repo,
        options,
        json,
    } = args;
    let r = open(&repo, LockMode::Exclusive, access)?;
    let stats = gc_with_progress(&r, options, &Phases::default())?;
    print(&stats, Form::json_if(json))?;
    Ok(ExitCode::SUCCESS)
}

impl Report for tessera::gc::GcStats {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let s = self;
        writeln!(
            out,
            "gc: {} of {} containers involved, {} reclaimed, {} produced; {} live chunks ({}) moved; {} read, {} written, {} freed; {:.2} s",
            s.containers_involved,
            s.containers_total,
            s.containers_reclaimed,
            s.containers_produced,
            s.chunks_moved,
            human(s.bytes_moved),
            human(s.bytes_read),
            human(s.bytes_written),
            human(s.bytes_freed.max(0) as u64),
            s.seconds
        )
    }
}
