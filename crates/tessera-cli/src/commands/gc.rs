//! `tessera gc`: reclaim the space of deleted backups.

use anyhow::Result;
use clap::Args;
use std::io::{self, Write};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::gc::{gc_with_progress, Defrag, GcOptions};
use tessera::parse_size;

use crate::output::{human, print, Form, Report};
use crate::progress::Phases;
use crate::repo_open::open;
use crate::secrets::Access;

/// The arguments of `tessera gc`.
#[derive(Args)]
pub struct GcArgs {
    /// The repository.
    repo: Location,
    /// Utilization threshold in percent: 0 reclaims every dead byte
    /// (perfect GC), 100 only wholly dead containers.
    #[arg(long, default_value_t = 0.0)]
    threshold: f64,
    /// Order of the migrated chunks: none (container order), gccdf
    /// (ownership clustering, newest backups first), random, or fill
    /// (container order, merging wholly live containers stored below
    /// half the container size as gccdf does: its container fill
    /// without the ownership analysis). In a compressed repository
    /// every backup's container is stored below half its size, so
    /// gccdf and fill copy each forward once into fuller containers:
    /// restores read far fewer containers for 2-4x GC's I/O (see
    /// docs/RESEARCH.md, GCCDF).
    #[arg(long, default_value = "none")]
    defrag: Defrag,
    /// Containers per segment (GCCDF reorders within a segment, held in memory).
    #[arg(long, default_value_t = 100)]
    segment: usize,
    /// GCCDF: clusters smaller than this are not split further.
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    split_threshold: u64,
    /// GCCDF and random: do not copy forward wholly live containers
    /// below half the container size (no container fill).
    #[arg(long)]
    no_fill: bool,
    /// Memory for each of GC's structures that grow with the repository
    /// (live chunks, moved chunks); past it they spill to temporary files.
    #[arg(long, value_name = "SIZE", default_value = "32MiB", value_parser = parse_size)]
    sort_memory: u64,
    /// Print the metrics as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera gc`.
pub fn run(args: GcArgs, access: &Access) -> Result<ExitCode> {
    let GcArgs {
        repo,
        threshold,
        defrag,
        segment,
        split_threshold,
        no_fill,
        sort_memory,
        json,
    } = args;
    let r = open(&repo, LockMode::Exclusive, access)?;
    let options = GcOptions {
        threshold_pct: threshold,
        defrag,
        segment,
        split_threshold,
        fill: !no_fill,
        sort_budget: sort_memory,
    };
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
