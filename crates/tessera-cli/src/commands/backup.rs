//! `tessera backup`: a tree, standard input or a fingerprint trace as a new backup.

use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::backup::{backup, BackupOptions, Input, Outcome, TreeBackupOptions};
use tessera::delta::DeltaKind;
use tessera::format::snapshot::{BackupId, BackupStats, TreeRef};
use tessera::layout::lifecycle::ArrangeStats;
use tessera::parse_size;
use tessera::repo::config::Compression;
use tessera::Repository;

use crate::output::{human, print, ratio_text, Form, Keys, Report, EXIT_INCOMPLETE};
use crate::progress::{self, bytes_bar as progress_bar};
use crate::repo_open::open;
use crate::secrets::Access;

/// The arguments of `tessera backup`.
#[derive(Args)]
pub struct BackupArgs {
    /// The repository.
    repo: Location,
    /// Paths to back up — directories, files, symbolic links — as one
    /// tree backup recording each at its absolute path with its
    /// metadata; or `-` alone for standard input, backed up as a stream.
    #[arg(required_unless_present_any = ["trace", "files_from"], conflicts_with = "trace")]
    inputs: Vec<String>,
    /// The tree backup's options: --exclude, --iexclude,
    /// --exclude-if-present, --exclude-caches, --exclude-larger-than,
    /// --follow-symlinks, --stdin-name, --one-file-system, --parent, --force.
    #[command(flatten)]
    tree: TreeBackupOptions,
    /// Tree backups: read exclude patterns from this file, one a line
    /// (blank lines and lines starting with `#` ignored; repeatable).
    #[arg(long, value_name = "FILE")]
    exclude_file: Vec<PathBuf>,
    /// Tree backups: back up the paths listed in this file too, one a
    /// line (blank lines and lines starting with `#` ignored; repeatable).
    #[arg(long, value_name = "FILE")]
    files_from: Vec<PathBuf>,
    /// A fingerprint trace (Destor text or FSL hashfile) to replay instead of data.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// A label stored with the backup.
    #[arg(long, default_value = "")]
    label: String,
    /// The source lineage the backup belongs to (default: `default`;
    /// for a tree, the host name and the absolute paths).
    #[arg(long)]
    source: Option<String>,
    /// The host name recorded with the backup (default: this machine's).
    #[arg(long)]
    host: Option<String>,
    /// A tag recorded with the backup (repeatable; `tessera tag` changes them).
    #[arg(long = "tag", value_name = "TAG")]
    tags: Vec<String>,
    /// Compression of the chunks this backup stores, instead of the
    /// repository's (auto, off, fastest, default, max or a level
    /// 1..=22; only in a repository created with compression).
    #[arg(long, value_name = "SETTING")]
    compression: Option<Compression>,
    /// Lifecycle layout: memory for the previous version's table as
    /// the backup looks it up, and for each sort of the arranging that
    /// follows the backup (default 32MiB); past it they spill to
    /// temporary files.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    sort_memory: Option<u64>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera backup`.
pub fn run(args: BackupArgs, access: &Access) -> Result<ExitCode> {
    let BackupArgs {
        repo,
        inputs,
        mut tree,
        exclude_file,
        files_from,
        trace,
        label,
        source,
        host,
        tags,
        compression,
        sort_memory,
        json,
    } = args;
    for file in &exclude_file {
        tree.excludes
            .extend(tessera::tree::select::read_patterns(file)?);
    }
    let input = backup_input(
        &inputs,
        !files_from.is_empty(),
        tree.stdin_name.is_some(),
        trace,
    )?;
    let mut inputs: Vec<PathBuf> = inputs.iter().map(PathBuf::from).collect();
    for file in &files_from {
        let listed = tessera::tree::select::read_paths(file)?;
        if listed.is_empty() {
            bail!("--files-from {}: no paths listed", file.display());
        }
        inputs.extend(listed);
    }
    let naming = Naming {
        label,
        source,
        host,
        tags,
        compression,
        sort_memory,
    };
    backup_cmd(&repo, &inputs, input, &tree, naming, json, access)
}

/// What a `backup` reads.
#[derive(Debug, PartialEq, Eq)]
enum BackupInput {
    /// A fingerprint trace (`--trace FILE`).
    Trace(PathBuf),
    /// Standard input (`-` alone) as one stream.
    Stdin,
    /// Paths — files, directories, symbolic links, any number of them —
    /// as one tree backup recording each at its absolute path with its
    /// metadata; or standard input as one file named `--stdin-name`.
    Tree,
}

/// What `backup` reads, from its command line: `-` alone is standard input
/// (a stream, or with `--stdin-name` a one-file tree), a trace is a trace,
/// and any other paths (`--files-from` too) a tree backup of them — one
/// regular file included, so that it is recorded with its path and metadata.
fn backup_input(
    inputs: &[String],
    files_from: bool,
    stdin_name: bool,
    trace: Option<PathBuf>,
) -> Result<BackupInput> {
    let stdin = inputs.iter().any(|i| i == "-");
    if stdin && (inputs.len() > 1 || files_from) {
        bail!(
            "`-` (standard input) is backed up alone: back up the paths in a backup of their own"
        );
    }
    if stdin_name && !stdin {
        bail!("--stdin-name applies to a backup of standard input (`-`) alone");
    }
    Ok(match trace {
        Some(path) => BackupInput::Trace(path),
        None if stdin && !stdin_name => BackupInput::Stdin,
        None => BackupInput::Tree,
    })
}

/// What a backup is called (label, source lineage, host and tags), how
/// its new chunks are compressed and the memory of the arranging after it.
struct Naming {
    label: String,
    source: Option<String>,
    host: Option<String>,
    tags: Vec<String>,
    compression: Option<Compression>,
    sort_memory: Option<u64>,
}

fn backup_cmd(
    repo: &Location,
    paths: &[PathBuf],
    input: BackupInput,
    tree_options: &TreeBackupOptions,
    naming: Naming,
    json: bool,
    access: &Access,
) -> Result<ExitCode> {
    let Naming {
        label,
        source,
        host,
        tags,
        compression,
        sort_memory,
    } = naming;
    let tags = tessera::commands::tags::normalize(&tags)?;
    let host = host.unwrap_or_else(tessera::backup::host_name);
    let t = tree_options;
    if input != BackupInput::Tree
        && (!t.excludes.is_empty()
            || !t.iexcludes.is_empty()
            || !t.exclude_if_present.is_empty()
            || t.exclude_caches
            || t.exclude_larger_than.is_some()
            || t.follow_symlinks
            || t.one_file_system
            || t.parent.is_some()
            || t.force)
    {
        bail!("the exclude options, --follow-symlinks, --one-file-system, --parent and --force apply to backups of paths only");
    }
    let source = match source {
        Some(s) => s,
        None if input == BackupInput::Tree => match &t.stdin_name {
            Some(name) => format!("stdin:{name}"),
            None => tessera::backup::default_source(&host, paths)?,
        },
        None => "default".into(),
    };
    let r = open(repo, LockMode::Backup, access)?;
    // Refuse a compression the repository cannot store before reading anything.
    r.config().backup_encoding(compression)?;
    let options_for = |progress| BackupOptions {
        label: label.clone(),
        source: source.clone(),
        host: host.clone(),
        tags: tags.clone(),
        progress,
        time: None,
        compression,
        sort_budget: sort_memory,
    };
    let outcome = match input {
        BackupInput::Trace(path) => backup_trace(&r, &path, &options_for(None))?,
        BackupInput::Tree => {
            let bar = progress::Bar::tree_backup(paths, tree_options);
            let on_progress = |n: u64| bar.set_position(n);
            let tree = Input::Tree {
                paths,
                options: tree_options,
            };
            let done = backup(&r, tree, &options_for(Some(&on_progress)))?;
            bar.finish_and_clear();
            done
        }
        BackupInput::Stdin => {
            let bar = progress_bar(stdin_len());
            let on_progress = |n: u64| bar.set_position(n);
            let stream = Input::Stream {
                input: &mut io::stdin(),
                name: "stdin",
            };
            let done = backup(&r, stream, &options_for(Some(&on_progress)))?;
            bar.finish_and_clear();
            done
        }
    };
    for note in &outcome.notes {
        eprintln!("tessera: note: {note}");
    }
    for warning in &outcome.warnings {
        eprintln!("tessera: warning: {warning}");
    }
    let warnings = &outcome.warnings;
    if outcome.snapshot.stats.index.damaged_left {
        // Once per backup: the backup itself is complete and committed.
        eprintln!(
            "tessera: note: {}: the deduplication index on disk is damaged; this backup, \
             sharing the repository with others, looked chunks up in a copy rebuilt in memory \
             and left the index as it is: `tessera repair` (or `tessera index rebuild`) rebuilds it",
            r.backend().location()
        );
    }
    print(&Committed::of(&r, &outcome, warnings), Form::json_if(json))?;
    if warnings.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "tessera: backup {} is incomplete: {} object(s) could not be read",
            outcome.snapshot.id,
            warnings.len()
        );
        Ok(ExitCode::from(EXIT_INCOMPLETE))
    }
}

/// The length of standard input when it is a regular file (`< FILE`).
fn stdin_len() -> Option<u64> {
    use std::os::fd::AsFd;
    let fd = io::stdin().as_fd().try_clone_to_owned().ok()?;
    let m = File::from(fd).metadata().ok()?;
    m.is_file().then_some(m.len())
}

/// Replays the fingerprint trace at `path` into `r` as one backup.
#[cfg(feature = "lab")]
fn backup_trace(r: &Repository, path: &Path, options: &BackupOptions) -> Result<Outcome> {
    use tessera::Fingerprint;
    use tessera_lab::trace::TraceFile;
    let mut reader = TraceFile::open(path)?;
    let mut failure = None;
    let done = {
        let mut chunks = std::iter::from_fn(|| match reader.next_chunk() {
            Ok(Some(c)) => Some(Ok((Fingerprint(c.fp), c.size))),
            Ok(None) => None,
            Err(e) => {
                let msg = e.to_string();
                failure = Some(e);
                Some(Err(tessera::Error::InvalidConfig(msg)))
            }
        });
        backup(r, Input::Trace(&mut chunks), options)
    };
    // A malformed trace is reported as such, with its line or offset.
    match (done, failure) {
        (_, Some(e)) => Err(e.into()),
        (done, None) => Ok(done?),
    }
}

/// Without the lab, traces are not read: a trace backup is refused.
#[cfg(not(feature = "lab"))]
fn backup_trace(_: &Repository, path: &Path, _: &BackupOptions) -> Result<Outcome> {
    bail!(
        "{}: this tessera was built without the lab (cargo feature `lab`), which reads fingerprint traces",
        path.display()
    )
}

/// What a committed backup stored: its snapshot's statistics, names and
/// tree, the arranging that followed it and (tree backups) the objects it
/// could not read.
#[derive(Serialize)]
struct Committed<'a> {
    #[serde(flatten)]
    stats: &'a BackupStats,
    id: BackupId,
    time: u64,
    label: &'a str,
    source: &'a str,
    host: &'a str,
    tags: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    arrange: Option<&'a ArrangeStats>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    arrange_deferred: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    tree: Option<&'a TreeRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<&'a [String]>,
    /// The repository compresses (the text says how much).
    #[serde(skip)]
    compressing: bool,
    /// The repository stores deltas (the text says how many).
    #[serde(skip)]
    delta: bool,
}

impl<'a> Committed<'a> {
    fn of(r: &Repository, outcome: &'a Outcome, warnings: &'a [String]) -> Self {
        let snap = &outcome.snapshot;
        Committed {
            stats: &snap.stats,
            id: snap.id,
            time: snap.time,
            label: &snap.label,
            source: &snap.source,
            host: &snap.host,
            tags: &snap.tags,
            arrange: outcome.arrange.as_ref(),
            arrange_deferred: outcome.arrange_deferred,
            tree: snap.tree.as_ref(),
            warnings: snap.tree.as_ref().map(|_| warnings),
            compressing: r.config().encoding().is_some(),
            delta: r.config().delta.kind != DeltaKind::None,
        }
    }
}

impl Report for Committed<'_> {
    const KEYS: Keys = Keys::Sorted;

    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        let s = self.stats;
        writeln!(
            out,
            "backup {} committed: {} logical, {} stored (dedup {}), {} chunks ({} new, {} internal duplicates, {} rewritten), {} containers, {:.2} s, {:.0} MB/s",
            self.id,
            human(s.logical_bytes),
            human(s.stored_bytes),
            ratio_text(s.dedup_ratio),
            s.chunks,
            s.unique.chunks,
            s.internal_duplicates.chunks,
            s.rewritten.chunks,
            s.containers_written,
            s.seconds,
            s.throughput_mb_s
        )?;
        let c = &s.compression;
        if self.compressing {
            writeln!(
                out,
                "compression ({}): {} stored before compression, {} after (compression {}; {} chunks compressed, {} raw)",
                c.setting,
                human(c.bytes_before),
                human(c.bytes_after),
                ratio_text(c.ratio),
                c.compressed_chunks,
                c.raw_chunks
            )?;
        }
        let d = &s.delta;
        if self.delta {
            writeln!(
                out,
                "delta ({}): {} chunks stored as deltas ({} hash-less, {} Edelta), {} saved, {} PFCs, {} containers piggybacked, {} extra base reads",
                d.policy,
                d.delta_chunks,
                d.hashless,
                d.edelta,
                human(d.bytes_saved),
                d.pfc_chunks,
                d.piggybacked_containers,
                d.base_reads
            )?;
        }
        if let Some(a) = self.arrange {
            writeln!(
                out,
                "arranged: {} categories split, {} volume(s) written, {:.2} s",
                a.categories_split, a.volumes_written, a.seconds
            )?;
        }
        if self.arrange_deferred {
            writeln!(out, "arranging deferred while other processes read the repository: it runs with the next backup or `tessera arrange`")?;
        }
        if let Some(t) = self.tree {
            writeln!(
                out,
                "tree: {} entries, {} files ({}), catalog {}, {} skipped",
                t.entries,
                t.files,
                human(t.catalog_offset),
                human(t.catalog_bytes),
                t.skipped
            )?;
            let parent = match t.parent {
                Some(p) => format!("parent backup {p}"),
                None => "no parent".into(),
            };
            writeln!(
                out,
                "files: {} new, {} changed, {} unmodified ({parent}); {} read, {} reused unread",
                t.files_new,
                t.files_changed,
                t.files_unmodified,
                human(t.bytes_read),
                human(t.bytes_reused)
            )?;
        }
        Ok(())
    }
}
