//! `tessera restore`: a backup into a file, a device, standard output or a directory.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::io;
use std::path::Path;
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::format::snapshot::BackupId;
use tessera::restore::{restore, restore_to_path, ExistingFile, RestoreOptions};
use tessera::tree::select::Selection;
use tessera::tree::{restore_tree, Overwrite, TarScope, TreeRestoreOptions};
use tessera::Repository;

use super::browse;
use crate::output::{data_stdout, human, json_text, print_json, Keys, EXIT_INCOMPLETE};
use crate::progress::{self, bytes_bar as progress_bar, quiet, summary};
use crate::repo_open::{backup_id, open};
use crate::secrets::Access;

/// The arguments of `tessera restore`.
#[derive(Args)]
pub struct RestoreArgs {
    /// The repository.
    repo: Location,
    /// The backup id (or `latest`).
    id: String,
    /// The output: a new file (appears only when complete), a device or
    /// FIFO (written in place), or `-` for standard output; for a tree
    /// backup, the directory to restore into (created if missing).
    output: String,
    /// Tree backups: restore only paths matching this glob (or inside a
    /// directory matching it), as `ls` shows them (repeatable). One
    /// starting with `/` is absolute; one with a `/` elsewhere is
    /// relative to each backed-up path; one without `/` matches a name
    /// at any depth. A pattern that matches nothing is an error.
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// Tree backups: leave out paths matching this glob (repeatable;
    /// read as --include's patterns are).
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Replace an existing regular file (only once the whole backup
    /// restored); tree backups: what to do with what is in the way of
    /// a restored entry (`--overwrite=WHEN`): `always` (the default
    /// value) replaces it, `if-changed` replaces files whose size or
    /// modification time differ, `never` keeps it. Without it, nothing
    /// is replaced: each entry in the way is reported (exit status 3).
    #[arg(
        long,
        value_name = "WHEN",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "always"
    )]
    overwrite: Option<OverwriteArg>,
    /// Tree backups: remove what is in the directory (among the
    /// selected paths) but not in the backup.
    #[arg(long)]
    delete: bool,
    /// Tree backups: read every restored file back and check it
    /// against the backup's fingerprints.
    #[arg(long)]
    verify: bool,
    /// Tree backups: write the selected entries as a tar stream to OUTPUT
    /// (`-`: standard output; else a new file) instead of into a directory.
    #[arg(long)]
    tar: bool,
    /// The restore's options: --cache, --cache-size, --skip-damaged.
    #[command(flatten)]
    restore: RestoreOptions<'static>,
    /// Print the metrics as one JSON object (to stderr when restoring to stdout).
    #[arg(long)]
    json: bool,
}

/// Runs `tessera restore`.
pub fn run(args: RestoreArgs, access: &Access) -> Result<ExitCode> {
    let RestoreArgs {
        repo,
        id,
        output,
        include,
        exclude,
        overwrite,
        delete,
        verify,
        tar,
        restore,
        json,
    } = args;
    let overwrite = overwrite.map(Overwrite::from).unwrap_or_default();
    let r = open(&repo, LockMode::Read, access)?;
    let id = backup_id(&r, &id)?;
    if let Some(tree) = r.snapshot(id)?.tree {
        // Relative patterns: relative to each backed-up path.
        let selection = Selection::for_backup(&include, &exclude, &tree.paths)?;
        if tar {
            tessera::tree::restore::check_includes(&r, id, &selection)?;
            if delete || verify {
                bail!("backup {id}: --delete and --verify do not apply to --tar");
            }
            let scope = TarScope {
                selection,
                under: None,
            };
            let existing = existing_file(id, overwrite)?;
            browse::tar_restore_cmd(&r, id, &output, &scope, existing, &restore, json)?;
            return Ok(ExitCode::SUCCESS);
        }
        let options = TreeRestoreOptions {
            selection,
            overwrite,
            delete,
            verify,
            restore,
        };
        tree_restore_cmd(&r, id, &output, options, json)
    } else if tar {
        bail!("backup {id}: --tar applies to tree backups only (restore it to `-` for its bytes)");
    } else if !include.is_empty() || !exclude.is_empty() || delete || verify {
        bail!(
            "backup {id}: --include, --exclude, --delete and --verify apply to tree backups only"
        );
    } else {
        let existing = existing_file(id, overwrite)?;
        restore_cmd(&r, id, &output, existing, restore, json)
    }
}

/// `--overwrite`'s values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum OverwriteArg {
    Always,
    IfChanged,
    Never,
}

impl From<OverwriteArg> for Overwrite {
    fn from(a: OverwriteArg) -> Self {
        match a {
            OverwriteArg::Always => Overwrite::Always,
            OverwriteArg::IfChanged => Overwrite::IfChanged,
            OverwriteArg::Never => Overwrite::Never,
        }
    }
}

/// What `--overwrite` means when a restore writes one file (a stream or a
/// tar archive): it may replace the file or not, nothing in between.
fn existing_file(id: BackupId, overwrite: Overwrite) -> Result<ExistingFile> {
    match overwrite {
        Overwrite::Refuse => Ok(ExistingFile::Refuse),
        Overwrite::Always => Ok(ExistingFile::Replace),
        _ => bail!(
            "backup {id}: --overwrite if-changed|never applies to restores into a directory only"
        ),
    }
}

fn restore_cmd(
    r: &Repository,
    id: BackupId,
    output: &str,
    existing: ExistingFile,
    options: RestoreOptions,
    json: bool,
) -> Result<ExitCode> {
    let total = r.snapshot(id)?.logical_bytes;
    let bar = progress_bar(Some(total));
    let on_progress = |n: u64| bar.set_position(n);
    let options = RestoreOptions {
        progress: Some(&on_progress),
        ..options
    };
    let stats = if r.config().trace {
        // A trace repository holds no data: plan the restore, write nothing.
        restore(r, id, &mut io::sink(), &options)
            .with_context(|| format!("planning the restore of backup {id}"))?
    } else if output == "-" {
        let mut lock = data_stdout();
        restore(r, id, &mut lock, &options)
            .with_context(|| format!("restoring backup {id} to stdout"))?
    } else {
        restore_to_path(r, id, Path::new(output), existing, &options)
            // Engine errors about the output name it.
            .with_context(|| format!("restoring backup {id}"))?
    };
    bar.finish_and_clear();
    let text = if json {
        json_text(&stats, Keys::Declared, false)?
    } else if stats.plan_only {
        format!(
            "planned restore of backup {} (trace repository: nothing written): {} in {} containers read, {} read, read amplification {:.3}, speed factor {:.2} MiB/container",
            stats.id,
            human(stats.bytes_restored),
            stats.containers_read,
            human(stats.bytes_read),
            stats.read_amplification,
            stats.speed_factor
        )
    } else {
        format!(
            "restored backup {}: {} in {:.2} s ({:.0} MB/s), {} containers read, {} read, read amplification {:.3}, speed factor {:.2} MiB/container",
            stats.id,
            human(stats.bytes_restored),
            stats.seconds,
            stats.throughput_mb_s,
            stats.containers_read,
            human(stats.bytes_read),
            stats.read_amplification,
            stats.speed_factor
        )
    };
    let mut lines: Vec<String> = (json || !quiet()).then_some(text).into_iter().collect();
    if !json {
        for l in &stats.lost {
            lines.push(format!(
                "lost: bytes {}..{} ({} bytes, {}): {}",
                l.offset,
                l.offset + l.len,
                l.len,
                l.reason,
                l.detail
            ));
        }
    }
    for text in &lines {
        if output == "-" {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }
    if stats.lost.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        let bytes: u64 = stats.lost.iter().map(|l| l.len).sum();
        eprintln!(
            "tessera: restore of backup {id} is incomplete: {bytes} bytes in {} range(s) were lost and written as zeros",
            stats.lost.len()
        );
        Ok(ExitCode::from(EXIT_INCOMPLETE))
    }
}

#[allow(clippy::too_many_arguments)]
fn tree_restore_cmd(
    r: &Repository,
    id: BackupId,
    target: &str,
    options: TreeRestoreOptions,
    json: bool,
) -> Result<ExitCode> {
    if options.restore.cache_containers == 0 {
        bail!("--cache-size must be at least 1 container");
    }
    if target == "-" {
        bail!("backup {id} is a tree backup: give a directory to restore it into");
    }
    let bar = progress::Bar::new(None);
    let options = TreeRestoreOptions {
        restore: RestoreOptions {
            progress: Some(&bar),
            ..options.restore
        },
        ..options
    };
    let stats = restore_tree(r, id, Path::new(target), &options)
        .with_context(|| format!("restoring backup {id} into {target}"))?;
    bar.finish_and_clear();
    for note in &stats.notes {
        eprintln!("tessera: note: {note}");
    }
    if json {
        print_json(&stats, Keys::Declared, false)?;
    } else {
        let mut extra = String::new();
        for (n, what) in [
            (stats.hardlinks, "hard links"),
            (stats.nodes, "FIFOs and devices"),
            (stats.kept, "kept as they were"),
            (stats.deleted, "deleted"),
            (stats.verified, "files verified"),
        ] {
            if n > 0 {
                extra.push_str(&format!(", {n} {what}"));
            }
        }
        summary!(
            "restored backup {} into {target}: {} files ({}), {} directories, {} symbolic links{extra}, {} containers read ({} for the catalog, in {} ranged reads), {} read, {:.2} s",
            stats.id,
            stats.files,
            human(stats.bytes_restored),
            stats.dirs,
            stats.symlinks,
            stats.containers_read,
            stats.catalog_containers_read,
            stats.catalog_extents_read,
            human(stats.bytes_read),
            stats.seconds
        );
        for l in &stats.lost_files {
            println!("lost: {} ({}): {}", l.path, l.reason, l.detail);
        }
    }
    for f in &stats.failed {
        let below = match f.below {
            0 => String::new(),
            n => format!(" ({n} selected entries below it not restored)"),
        };
        eprintln!("tessera: warning: {}: {}{below}", f.path, f.reason);
    }
    if !stats.lost_files.is_empty() {
        eprintln!(
            "tessera: restore of backup {id} is incomplete: {} file(s) lost were left out",
            stats.lost_files.len()
        );
    }
    if !stats.failed.is_empty() {
        let below: u64 = stats.failed.iter().map(|f| f.below).sum();
        eprintln!(
            "tessera: restore of backup {id} is incomplete: {} entries could not be restored ({below} more below them), every other entry was",
            stats.failed.len()
        );
    }
    if stats.lost_files.is_empty() && stats.failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(EXIT_INCOMPLETE))
    }
}
