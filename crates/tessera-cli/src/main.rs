//! `tessera`: the command line over the Tessera engine. It parses
//! arguments, calls the library and prints results (human-readable or JSON).

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tessera::backend::{Location, LockMode, S3Options};
use tessera::backup::{run as run_backup, BackupOptions, Outcome, Source};
use tessera::chunker::{ChunkerKind, ChunkerParams};
use tessera::commands::check::{check_with_progress, CheckOptions, ProblemKind};
use tessera::commands::forget::{
    forget, parse_group_by, ForgetOptions, ForgetReport, DEFAULT_GROUP_BY,
};
use tessera::commands::repair::{repair_with_progress, RepairOptions};
use tessera::commands::retention::{Count, Period, Policy};
use tessera::commands::tags::TagChange;
use tessera::delta::features::FeatureKind;
use tessera::delta::stage::{BasePrefetch, BaseScope};
use tessera::delta::{DeltaKind, DeltaParams};
use tessera::fingerprint::Fingerprint;
use tessera::fingerprint::FingerprintAlgo;
use tessera::format::snapshot::BackupId;
use tessera::gc::{gc_with_progress, Defrag, GcOptions};
use tessera::repo::config::Config;
use tessera::repo::config::IndexKind;
use tessera::repo::config::{Arrange, Compression, Encryption, Layout};
use tessera::restore::plan::CachePolicy;
use tessera::restore::{
    restore, restore_to_path, ExistingFile, RestoreOptions, DEFAULT_CACHE_CONTAINERS,
};
use tessera::rewrite::{RewriteKind, RewriteParams};
use tessera::tree::catalog::{Entry, Kind};
use tessera::tree::select::Selection;
use tessera::tree::{
    backup_tree, list_tree, restore_tree, Overwrite, TarScope, TreeBackupOptions,
    TreeRestoreOptions,
};
use tessera::util::units::{parse_size, parse_size_u32};
use tessera::Repository;
use tessera_lab::analyze::{analyze_paths, Input, VersionRow};
use tessera_lab::experiment::{self, ExperimentConfig};
use tessera_lab::gen::{generate_with, GenOptions};
use tessera_lab::trace::write_data_trace;
use tessera_lab::trace::TraceFile;

mod browse;
mod hints;
mod mount;
mod progress;
mod secrets;
use browse::FilterArgs;
use progress::{bytes_bar as progress_bar, quiet, summary, summary_err, Phases};
use secrets::{
    key_cmd, new_repo_key, open_repo, tuned, Access, KdfArgs, KeyCommand, PasswordArgs,
    ToPasswordArgs, Transfer,
};

/// Tessera: a deduplicating backup store.
#[derive(Parser)]
#[command(name = "tessera", version, about, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// When the repository is locked by another process, wait up to this
    /// long for it (e.g. `30s`, `5m`, `1h`; `0s`: fail at once). Default:
    /// backups and maintenance wait up to 60m, readers fail at once.
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_wait)]
    wait: Option<Duration>,
    /// The repository, for users who prefer an option (or the
    /// `TESSERA_REPOSITORY` environment variable) to the REPO argument:
    /// with it, leave REPO out of the command.
    #[arg(
        short = 'r',
        long = "repo",
        global = true,
        value_name = "REPO",
        env = "TESSERA_REPOSITORY"
    )]
    repository: Option<std::ffi::OsString>,
    /// Object stores: requests in flight at once: container reads of a
    /// restore, container writes of a backup, read-ahead (index loading);
    /// the retries' budget is per request. Default: twice the processors,
    /// from 4 to 16.
    #[arg(long, global = true, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    connections: Option<u16>,
    /// Object stores: do not use the local cache of metadata objects
    /// (snapshots, recipes, indexes, container metadata) kept in
    /// $XDG_CACHE_HOME/tessera (or ~/.cache/tessera): read them all from
    /// the store.
    #[arg(long, global = true)]
    no_cache: bool,
    /// Object stores: the size the local metadata cache may take (least
    /// recently used entries are deleted beyond it).
    #[arg(long, global = true, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    cache_limit: u64,
    /// Object stores: upload at most this many KiB per second.
    #[arg(long, global = true, value_name = "KIB_PER_S")]
    limit_upload: Option<u64>,
    /// Object stores: download at most this many KiB per second.
    #[arg(long, global = true, value_name = "KIB_PER_S")]
    limit_download: Option<u64>,
    /// Object stores: a request, or one step of its transfer, that takes
    /// longer than this fails and is retried (a stalled connection or
    /// server never hangs the command).
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_timeout, default_value = "2m")]
    timeout: Duration,
    /// Print only errors, warnings and the results asked for (listings,
    /// `--json`): no progress bars, no summaries of what a command did.
    #[arg(short = 'q', long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Say more: the count and time of every phase of check, gc, prune,
    /// arrange and repair (on standard error).
    #[arg(short = 'v', long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(flatten)]
    password: PasswordArgs,
}

/// `argv` with the repository given by `--repo`/`-r` (or, without them,
/// `TESSERA_REPOSITORY`) put where the command expects its REPO argument:
/// first after the (sub)command name, for every command whose first
/// argument is the repository. Other commands are left as they are.
fn with_repository(
    argv: Vec<std::ffi::OsString>,
    env: Option<std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    let root = Cli::command();
    let mut repo = env.filter(|v| !v.is_empty());
    // Options (of the root command, global ones included) that take a value.
    let takes_value = |cmd: &clap::Command, tok: &str| {
        cmd.get_arguments().any(|a| {
            a.get_action().takes_values()
                && (a.get_long().is_some_and(|l| tok == format!("--{l}"))
                    || a.get_short().is_some_and(|c| tok == format!("-{c}")))
        })
    };
    let mut out = Vec::with_capacity(argv.len() + 1);
    let mut cmd = root.clone();
    let mut insert_at = None;
    let mut i = 0;
    while i < argv.len() {
        let tok = argv[i].to_string_lossy().into_owned();
        // The repository option itself is consumed here (and parsed again
        // by clap only for its help text).
        if tok == "-r" || tok == "--repo" {
            if let Some(v) = argv.get(i + 1) {
                repo = Some(v.clone());
            }
            i += 2;
            continue;
        }
        if let Some(v) = tok.strip_prefix("--repo=") {
            repo = Some(v.into());
            i += 1;
            continue;
        }
        out.push(argv[i].clone());
        if i == 0 || insert_at.is_some() {
            i += 1;
            continue;
        }
        if tok == "--" {
            i += 1;
            break;
        }
        if tok.starts_with('-') {
            if !tok.contains('=') && (takes_value(&cmd, &tok) || takes_value(&root, &tok)) {
                if let Some(v) = argv.get(i + 1) {
                    out.push(v.clone());
                }
                i += 1;
            }
        } else if let Some(sub) = cmd.find_subcommand(&tok).cloned() {
            let first_is_repo = sub
                .get_positionals()
                .next()
                .is_some_and(|a| a.get_id() == "repo");
            if first_is_repo {
                insert_at = Some(out.len());
            }
            cmd = sub;
        }
        i += 1;
    }
    out.extend(argv.into_iter().skip(i));
    if let (Some(at), Some(repo)) = (insert_at, repo) {
        out.insert(at, repo);
    }
    out
}

#[derive(Subcommand)]
enum Command {
    /// Create a repository in a local directory (absent or empty).
    Init(InitArgs),
    /// Back up directory trees, a file or standard input (`-`) as a new
    /// backup, or replay a fingerprint trace (--trace) into a trace repository.
    Backup {
        /// The repository.
        repo: Location,
        /// Paths to back up — directories, files, symbolic links — as one
        /// tree backup recording each at its absolute path with its
        /// metadata; or `-` alone for standard input, backed up as a stream.
        #[arg(required_unless_present_any = ["trace", "files_from"], conflicts_with = "trace")]
        inputs: Vec<String>,
        /// Tree backups: leave out paths matching this gitignore-style
        /// pattern (repeatable; a leading `/` anchors at the file-system root).
        #[arg(long, value_name = "PATTERN")]
        exclude: Vec<String>,
        /// Tree backups: read exclude patterns from this file, one a line
        /// (blank lines and lines starting with `#` ignored; repeatable).
        #[arg(long, value_name = "FILE")]
        exclude_file: Vec<PathBuf>,
        /// Tree backups: like --exclude, ignoring case (repeatable).
        #[arg(long, value_name = "PATTERN")]
        iexclude: Vec<String>,
        /// Tree backups: leave out directories holding a file of this name (repeatable).
        #[arg(long, value_name = "NAME")]
        exclude_if_present: Vec<String>,
        /// Tree backups: leave out directories holding a CACHEDIR.TAG with
        /// the standard signature.
        #[arg(long)]
        exclude_caches: bool,
        /// Tree backups: leave out regular files larger than SIZE (e.g. 100MiB).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        exclude_larger_than: Option<u64>,
        /// Tree backups: back up the paths listed in this file too, one a
        /// line (blank lines and lines starting with `#` ignored; repeatable).
        #[arg(long, value_name = "FILE")]
        files_from: Vec<PathBuf>,
        /// Tree backups: back up what symbolic links point to, not the links.
        #[arg(long)]
        follow_symlinks: bool,
        /// With `-`: back up standard input as a tree backup holding one
        /// file of this path (listed, found and restored like any file;
        /// restic's --stdin-filename).
        #[arg(long, value_name = "NAME")]
        stdin_name: Option<String>,
        /// Tree backups: do not descend into other file systems.
        #[arg(long)]
        one_file_system: bool,
        /// Tree backups: reuse the unchanged files of this backup (default:
        /// the latest tree backup of the same source).
        #[arg(long, value_name = "ID", conflicts_with = "force")]
        parent: Option<u64>,
        /// Tree backups: read every file, even those unchanged since the parent.
        #[arg(long)]
        force: bool,
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
    },
    /// Restore a backup into a file, a device or FIFO, or to standard
    /// output (`-`); a tree backup into a directory.
    Restore {
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
        /// Restore cache policy: lru, opt (Belady, using the recipe) or faa
        /// (forward assembly area of --cache-size containers).
        #[arg(long, default_value = "lru")]
        cache: CachePolicy,
        /// Containers held by the restore cache (at least 1; at most as
        /// many as the machine's memory holds).
        #[arg(long, default_value_t = DEFAULT_CACHE_CONTAINERS)]
        cache_size: usize,
        /// Tree backups: write the selected entries as a tar stream to OUTPUT
        /// (`-`: standard output; else a new file) instead of into a directory.
        #[arg(long)]
        tar: bool,
        /// Salvage a damaged backup: write every chunk that verifies, zeros
        /// in place of missing or damaged chunks, list the lost byte ranges
        /// and exit with status 3 when any were lost.
        #[arg(long)]
        skip_damaged: bool,
        /// Print the metrics as one JSON object (to stderr when restoring to stdout).
        #[arg(long)]
        json: bool,
    },
    /// List the entries of a tree backup.
    Ls {
        /// The repository.
        repo: Location,
        /// The backup id (or `latest`).
        id: String,
        /// A path in the backup (absolute, as given to the backup): a
        /// directory's entries, or one entry (default: the paths backed up).
        path: Option<PathBuf>,
        /// Show mode, owner, size and modification time.
        #[arg(short, long)]
        long: bool,
        /// List everything below the path.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// Print a JSON array of entries.
        #[arg(long)]
        json: bool,
    },
    /// Serve the repository's backups as a read-only file system at
    /// MOUNTPOINT (FUSE): `ids/<ID>/…`, `sources/<SOURCE>/<ID>`,
    /// `latest`. Runs in the foreground until `umount MOUNTPOINT` or
    /// Ctrl-C (SIGINT, SIGTERM, SIGHUP), then unmounts.
    Mount {
        /// The repository.
        repo: Location,
        /// An existing directory to mount on.
        mountpoint: PathBuf,
        /// Memory for decoded chunks (e.g. `64MiB`).
        #[arg(long, value_name = "SIZE", default_value = "64MiB")]
        cache: String,
    },
    /// Copy backups into another repository (its chunking, layout and keys),
    /// deduplicated against what it holds; backups it already holds are
    /// skipped. The source's password comes from the usual options, the
    /// destination's from `--to-password-file`, `--to-password-command` or
    /// `TESSERA_TO_PASSWORD`.
    Copy {
        /// The source repository.
        src: Location,
        /// The destination repository (created with `tessera init`).
        dst: Location,
        /// Backup ids (or `latest`) to copy (default: all).
        ids: Vec<String>,
        #[command(flatten)]
        to: ToPasswordArgs,
        /// Print a JSON array, one record per backup.
        #[arg(long)]
        json: bool,
    },
    /// List the backups.
    /// List the backups: time (local), host, paths or source, tags, files and sizes.
    List {
        /// The repository.
        repo: Location,
        #[command(flatten)]
        filter: FilterArgs,
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Find entries by a glob on their path in every tree backup, newest first.
    Find {
        /// The repository.
        repo: Location,
        /// A glob over paths as `ls` shows them (`/home/*/docs/*.txt`); one
        /// without `/` matches names at any depth (`*.rs`).
        pattern: String,
        #[command(flatten)]
        filter: FilterArgs,
        /// Print a JSON array of entries, each with its backup.
        #[arg(long)]
        json: bool,
    },
    /// Show what changed between two tree backups: added (+), removed (-),
    /// changed contents (M) and metadata only (U).
    Diff {
        /// The repository.
        repo: Location,
        /// The first backup (or `latest`).
        id1: String,
        /// The second backup (or `latest`).
        id2: String,
        /// Print one JSON object: the changes and the counts.
        #[arg(long)]
        json: bool,
    },
    /// Write one file of a tree backup to standard output, or a directory
    /// as a tar stream.
    Dump {
        /// The repository.
        repo: Location,
        /// The backup id (or `latest`).
        id: String,
        /// The path in the backup (absolute, as `ls` shows it; `/`: the whole tree).
        path: PathBuf,
    },
    /// Change the tags of backups (the snapshot is replaced atomically).
    Tag {
        /// The repository.
        repo: Location,
        /// Backup ids (or `latest`).
        #[arg(required = true)]
        ids: Vec<String>,
        /// Add this tag (repeatable).
        #[arg(long, value_name = "TAG")]
        add: Vec<String>,
        /// Remove this tag (repeatable).
        #[arg(long, value_name = "TAG")]
        remove: Vec<String>,
        /// Replace all tags by these (repeatable; `--set ''` is refused:
        /// use --remove).
        #[arg(long, value_name = "TAG")]
        set: Vec<String>,
        /// Print the new tags as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show repository totals, or one backup's statistics.
    Stats {
        /// The repository.
        repo: Location,
        /// A backup id (or `latest`).
        id: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a backup (garbage collection reclaims its space).
    Delete {
        /// The repository.
        repo: Location,
        /// The backup id.
        id: String,
        /// Print `{"deleted": ID}`.
        #[arg(long)]
        json: bool,
    },
    /// Delete the backups a retention policy does not keep, group by group
    /// (the newest backup of every group is always kept unless
    /// `--keep-last 0`); space is reclaimed by `gc` (container layout) or at
    /// once (lifecycle layout).
    Forget(ForgetArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    /// to standard output, e.g. `tessera completion bash > /etc/bash_completion.d/tessera`.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the manual pages (`tessera.1` and one per command, e.g.
    /// `tessera-backup.1`) into a directory.
    Man {
        /// The directory (created if absent; existing pages of the same
        /// names are replaced).
        dir: PathBuf,
    },
    /// Reclaim the space of deleted backups (mark, select, copy forward, sweep).
    Gc {
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
    },
    /// Reclaim unused space with restic's knobs: `--max-unused` and
    /// `--max-repack` choose GC's utilization threshold (container layout);
    /// the lifecycle layout only finishes interrupted deletions.
    Prune {
        /// The repository.
        repo: Location,
        /// Unused space tolerated: a percentage per container (`5%`: repack
        /// containers more than 5% unused), a total size (`1GiB`: repack the
        /// emptiest containers until at most that much is unused), or
        /// `unlimited` (delete only wholly unused containers).
        #[arg(long, value_name = "PCT|SIZE", default_value = "5%")]
        max_unused: tessera::commands::prune::MaxUnused,
        /// Copy at most this many live bytes forward.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        max_repack: Option<u64>,
        /// Order of the copied chunks: none, gccdf (defragments for the
        /// newest backups), random, or fill (container order, with
        /// gccdf's container fill).
        #[arg(long, default_value = "none")]
        defrag: Defrag,
        /// Only show the plan.
        #[arg(long)]
        dry_run: bool,
        /// Print the plan and what was done as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Verify the repository's objects and references.
    Check {
        /// The repository.
        repo: Location,
        /// Also read all data and re-hash every chunk.
        #[arg(long)]
        read_data: bool,
        /// Memory for each of check's structures that grow with the
        /// repository (stored chunks, references); past it they spill to
        /// temporary files.
        #[arg(long, value_name = "SIZE", default_value = "32MiB", value_parser = parse_size)]
        sort_memory: u64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Repair what can be proven: rewrite damaged derived state, recover
    /// lost snapshots from commit marks and recipes, re-point references to
    /// damaged chunks to intact copies, rebuild the index without damaged
    /// chunks (docs/RECOVERY.md). Exit status 3 when backups with
    /// unrecoverable chunks remain.
    Repair {
        /// The repository.
        repo: Location,
        /// Report what would be done without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Delete backups that still have unrecoverable chunks (by default
        /// they are kept and listed; restore them with --skip-damaged).
        #[arg(long)]
        forget_damaged: bool,
        /// Then run `gc` (container layout), which deletes the damaged
        /// containers no backup uses any more, or copies their intact chunks
        /// forward without the damage, so that `check` passes.
        #[arg(long, conflicts_with = "dry_run")]
        gc: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Generate a deterministic versioned dataset (packed tar streams, or
    /// fingerprint traces with --trace) aged by file create/delete/modify/rename.
    Gen(GenArgs),
    /// Classify the chunks of version files (in order): internal, adjacent and
    /// skip duplicates and unique chunks, with exact and NDF dedup ratios.
    Analyze(AnalyzeArgs),
    /// Write a Destor text trace (fingerprint and size per chunk) of files or directories.
    Trace {
        /// Files or directories (walked in name order).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Output file (default: standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        chunking: ChunkingArgs,
    },
    /// Run an experiment: every system of CONFIG over its dataset, with
    /// results as JSON, CSV and an HTML report with plots.
    Experiment {
        /// The experiment file (TOML; see experiments/).
        config: PathBuf,
        /// Output directory (default: `results/<experiment name>`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Lifecycle layout: run the pending arranging rounds (AVAR).
    Arrange {
        /// The repository.
        repo: Location,
        /// Memory for each sort of a round (the active chunks by
        /// fingerprint, the positions kept); past it they spill to
        /// temporary files.
        #[arg(long, value_name = "SIZE", default_value = "32MiB", value_parser = parse_size)]
        sort_memory: u64,
        /// Print the metrics as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lifecycle layout: bytes that deleting the given backups would free,
    /// and the per-version trend of new data.
    Space {
        /// The repository.
        repo: Location,
        /// Backup ids (none: only the trend).
        ids: Vec<BackupId>,
        /// Source lineage of the trend.
        #[arg(long, default_value = "default")]
        source: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Maintain the deduplication index.
    Index {
        #[command(subcommand)]
        command: IndexCommand,
    },
    /// Remove stale lock objects of a repository in object storage (those
    /// whose holder stopped refreshing them or no longer runs); local
    /// repositories use OS locks, which never outlive their holder.
    Unlock {
        /// The repository.
        repo: Location,
        /// Remove every lock object, also those of running processes
        /// (only when you know none is running).
        #[arg(long)]
        remove_all: bool,
        /// Print JSON: `{"removed": [LOCK, ...]}`.
        #[arg(long)]
        json: bool,
    },
    /// Manage the password key files of an encrypted repository.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
}

#[derive(Subcommand)]
enum IndexCommand {
    /// Recreate the index from the containers.
    Rebuild {
        /// The repository.
        repo: Location,
        /// Print the index statistics as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct GenArgs {
    /// Output directory (v0001.tar, v0002.tar, ..., MANIFEST.tsv).
    outdir: PathBuf,
    /// Versions per source lineage.
    #[arg(long, default_value_t = 10)]
    versions: u32,
    /// Size of one version (file contents).
    #[arg(long, default_value = "20MiB", value_parser = parse_size)]
    size: u64,
    /// Fraction of files modified per version.
    #[arg(long, default_value_t = 0.05)]
    change_rate: f64,
    /// Fraction of files whose mtime changes without a content change.
    #[arg(long, default_value_t = 0.01)]
    touch_rate: f64,
    /// Size growth per version (-0.5 to 0.5).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    growth: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Independent source lineages whose versions interleave.
    #[arg(long, default_value_t = 1)]
    sources: u32,
    /// Write Destor fingerprint traces of the same model instead of data.
    #[arg(long, conflicts_with = "tree")]
    trace: bool,
    /// Write each version as a directory tree (v0001/, …) instead of a tar
    /// archive, for tree backups.
    #[arg(long)]
    tree: bool,
}

#[derive(Args)]
struct AnalyzeArgs {
    /// Version files in backup order.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The files are fingerprint traces (Destor text or FSL hashfile), not data.
    #[arg(long)]
    trace: bool,
    #[command(flatten)]
    chunking: ChunkingArgs,
    /// Print the analysis as JSON.
    #[arg(long)]
    json: bool,
}

/// Chunking and fingerprint options shared by `init` and `analyze`.
#[derive(Args)]
struct ChunkingArgs {
    /// Chunking algorithm: fastcdc, rabin or fixed.
    #[arg(long, default_value = "fastcdc")]
    chunker: ChunkerKind,
    /// Minimum chunk size (e.g. 2KiB).
    #[arg(long, default_value = "2KiB", value_parser = parse_size_u32)]
    min_size: u32,
    /// Average chunk size (the chunk size of `fixed`).
    #[arg(long, default_value = "8KiB", value_parser = parse_size_u32)]
    avg_size: u32,
    /// Maximum chunk size.
    #[arg(long, default_value = "64KiB", value_parser = parse_size_u32)]
    max_size: u32,
    /// Fingerprint hash: blake3, sha256 or sha1.
    #[arg(long, default_value = "blake3")]
    fingerprint: FingerprintAlgo,
}

impl ChunkingArgs {
    fn params(&self) -> ChunkerParams {
        ChunkerParams {
            kind: self.chunker,
            min_size: self.min_size,
            avg_size: self.avg_size,
            max_size: self.max_size,
        }
    }
}

#[derive(Args)]
struct InitArgs {
    /// The new repository: a local directory (absent or empty), or
    /// `s3:http[s]://HOST[:PORT]/BUCKET/PREFIX` (a prefix holding no object).
    repo: Location,
    /// Encrypt every object (`aes256gcm` or `xchacha20poly1305`, asks for a
    /// password) or not (`none`: lab and benchmark repositories). Default:
    /// aes256gcm, except for --trace and --fingerprint sha1 repositories,
    /// which cannot be encrypted.
    #[arg(long)]
    encryption: Option<Encryption>,
    /// Compression of stored chunks (zstd, per chunk, after deduplication,
    /// before encryption): auto (level 3, incompressible chunks stored raw
    /// without trying), off, fastest (1), default (3), max (19) or a level
    /// 1..=22. Default: auto in encrypted repositories, off in unencrypted
    /// ones (lab and benchmark repositories keep the uncompressed format).
    #[arg(long, value_name = "SETTING")]
    compression: Option<Compression>,
    /// Print JSON: the repository's location, id, encryption, compression,
    /// layout and index.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    kdf: KdfArgs,
    #[command(flatten)]
    chunking: ChunkingArgs,
    /// Container capacity.
    #[arg(long, default_value = "4MiB", value_parser = parse_size_u32)]
    container_size: u32,
    /// Deduplication index: exact (all fingerprints in memory), ddfs
    /// (Bloom filter + on-disk table + locality-preserving cache), hid or
    /// ehid (ddfs keeping only hot entries: those of containers the last
    /// backup used at least 50%; ehid with a Bloom filter over them), eager
    /// or lazy (on-disk table + metadata log + fingerprint cache; lazy
    /// buffers cache misses and searches them on disk a bucket at a time).
    /// Default: ddfs, whose memory stays bounded (Bloom filter of ~1.5
    /// bytes per stored chunk plus --index-memory) while deduplicating
    /// exactly like exact, which holds 47-94 bytes per chunk in memory.
    #[arg(long, default_value = "ddfs", value_parser = parse_index)]
    index: IndexKind,
    /// HID/EHID: also look up hot misses in the cold index (maximum dedup).
    #[arg(long)]
    consult_cold: bool,
    /// HID/EHID: containers the last backup used below this percentage are sparse.
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_EHID_SPARSE_PCT)]
    sparse_threshold: u32,
    /// DDFS: target false-positive rate of the Bloom filter.
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_BLOOM_FPR)]
    bloom_fpr: f64,
    /// DDFS, eager, lazy: memory budget of the index's cache (lazy: cache
    /// and buffer together).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    index_memory: u64,
    /// Eager, lazy: size of the Bloom filter (default: sized for
    /// --bloom-fpr). DDFS, HID/EHID: memory budget of the Bloom filters
    /// (default 256MiB; runs whose filter does not fit are looked up on disk).
    #[arg(long, value_parser = parse_bloom_size)]
    bloom_size: Option<u64>,
    /// Lazy: buffer fingerprint threshold (fingerprints a buffer bucket
    /// collects before they are searched on disk together).
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_LAZY_BFT)]
    bft: u32,
    /// Eager, lazy: metadata-log entries prefetched into the cache per on-disk hit.
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_LAZY_PREFETCH)]
    prefetch: u32,
    /// Lazy: percent of --index-memory given to the buffer (the rest is the cache).
    #[arg(long, default_value_t = tessera::repo::config::DEFAULT_LAZY_BUFFER_PCT)]
    buffer_share: u32,
    /// Data layout: container (a log of containers) or lifecycle (MFDedup
    /// categories and volumes, deletion without GC).
    #[arg(long, default_value = "container", value_parser = parse_layout)]
    layout: Layout,
    /// Lifecycle layout: arrange after every backup (auto) or only on `tessera arrange` (manual).
    #[arg(long, default_value = "auto", value_parser = parse_arrange)]
    arrange: Arrange,
    /// A trace repository: backups replay fingerprint traces (`backup --trace`)
    /// and store metadata only.
    #[arg(long)]
    trace: bool,
    /// Rewriting policy: none, cbr, capping, har or smr.
    #[arg(long, default_value = "none")]
    rewrite: RewriteKind,
    /// Rewrite at most this percentage of the bytes seen (CBR: 5 unless set).
    #[arg(long)]
    rewrite_limit: Option<f64>,
    /// Capping and SMR: segment size.
    #[arg(long, default_value = "20MiB", value_parser = parse_size)]
    segment_size: u64,
    /// Capping: old containers a segment may reference.
    #[arg(long, default_value_t = 20)]
    capping_level: u32,
    /// SMR: containers selected per segment.
    #[arg(long, default_value_t = 20)]
    smr_level: u32,
    /// HAR: containers below this utilization (percent) are sparse.
    #[arg(long, default_value_t = 50.0)]
    har_utilization: f64,
    /// CBR: minimal rewrite utility (percent).
    #[arg(long, default_value_t = 70.0)]
    cbr_min_utility: f64,
    /// CBR: stream context size.
    #[arg(long, default_value = "5MiB", value_parser = parse_size)]
    cbr_stream_context: u64,
    /// Delta compression of stored chunks: none, pfc (PFC-delta: chunks
    /// around persistent fragmented chunks, bases prefetched with the
    /// index's container reads; needs --index ddfs|hid|ehid and a
    /// --rewrite policy) or greedy (any similar stored chunk, bases read
    /// from storage). Deltas are compressed too (--compression): on top
    /// of zstd, on data changed in place (release tarballs, database
    /// files) pfc still stores 1.5-2x less with --rewrite cbr and
    /// 1.15-1.2x less with har, for 2-23% slower restores; with capping,
    /// or on streams of new files, it gains under 10% (docs/RESEARCH.md,
    /// PFC-delta).
    #[arg(long, default_value = "none")]
    delta: DeltaKind,
    /// Delta: super-features finding similar chunks: odess or ntransform.
    #[arg(long, default_value = "odess")]
    features: FeatureKind,
    /// Delta: containers the base chunk cache holds.
    #[arg(long, default_value_t = tessera::delta::stage::DEFAULT_BASE_CACHE_CONTAINERS)]
    base_cache: u32,
    /// PFC-delta: containers the index reads whole for their bases: pfc
    /// (those of the last backup's persistent fragmented chunks, as the
    /// paper) or fc (those of all its fragmented chunks).
    #[arg(long, default_value = "pfc")]
    base_prefetch: BasePrefetch,
    /// PFC-delta: which cached chunks may be bases: any, or referenced
    /// (only those of the last 16 distinct containers the backup referenced
    /// for a kept duplicate, which its restores have just read).
    #[arg(long, default_value = "any")]
    base_scope: BaseScope,
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    match s {
        "container" => Ok(Layout::Container),
        "lifecycle" => Ok(Layout::Lifecycle),
        other => Err(format!(
            "unknown layout {other:?} (expected container or lifecycle)"
        )),
    }
}

fn parse_arrange(s: &str) -> Result<Arrange, String> {
    match s {
        "auto" => Ok(Arrange::Auto),
        "manual" => Ok(Arrange::Manual),
        other => Err(format!(
            "unknown arranging mode {other:?} (expected auto or manual)"
        )),
    }
}

fn parse_index(s: &str) -> Result<IndexKind, String> {
    s.parse()
}

fn parse_wait(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (a duration such as 30s, 5m or 1h)"))
}

/// A request timeout: a duration greater than zero.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    match parse_wait(s)? {
        d if d.is_zero() => Err("a timeout must be longer than 0s".to_string()),
        d => Ok(d),
    }
}

/// A Bloom filter size: at least 1 byte (the configuration's 0 means "sized
/// for --bloom-fpr", which omitting the option asks for).
fn parse_bloom_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("0 bytes is out of range: valid range 1 byte or more \
                  (omit --bloom-size to size the filter for --bloom-fpr)"
            .into()),
        n => Ok(n),
    }
}

fn main() -> ExitCode {
    // Output piped into a reader that stops early (`tessera ls … | head`)
    // ends the command quietly, as for other Unix tools, instead of
    // panicking on the broken pipe.
    #[cfg(unix)]
    // SAFETY: restoring the default action of SIGPIPE before any thread
    // starts; no handler is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    #[cfg(unix)]
    raise_open_file_limit();
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let parsed = Cli::try_parse_from(with_repository(
        raw.clone(),
        std::env::var_os("TESSERA_REPOSITORY"),
    ));
    // A REPO argument given although TESSERA_REPOSITORY is set: the
    // argument wins.
    let parsed = match parsed {
        Err(e) if std::env::var_os("TESSERA_REPOSITORY").is_some() => {
            Cli::try_parse_from(with_repository(raw, None)).map_err(|_| e)
        }
        other => other,
    };
    let cli = match parsed {
        Ok(cli) => cli,
        // Help and version go to stdout as clap prints them.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let message = hints::with_hint(&e, usage_error(&e));
            eprintln!("tessera: error: {message} (see tessera --help)");
            return ExitCode::from(2);
        }
    };
    progress::set_verbosity(cli.quiet, cli.verbose);
    tessera::repo::report_lock_waits(Box::new(|message| {
        if !progress::quiet() {
            eprintln!("tessera: {message}");
        }
    }));
    let access = Access {
        wait: cli.wait,
        password: cli.password,
        connections: cli
            .connections
            .map_or_else(S3Options::default_connections, usize::from),
        transfer: Transfer {
            cache_limit: if cli.no_cache { 0 } else { cli.cache_limit },
            upload_limit: cli.limit_upload.unwrap_or(0).saturating_mul(1024),
            download_limit: cli.limit_download.unwrap_or(0).saturating_mul(1024),
            timeout: cli.timeout,
        },
    };
    match run(cli.command, &access) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tessera: error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// A command-line usage error on one line, like every other error: clap's
/// message with what it lists below it (the missing arguments) and its tips
/// ("a similar subcommand exists: …"), without the usage block.
fn usage_error(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let mut text = String::new();
    let lines = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty());
    for line in lines {
        if !text.is_empty() {
            text.push_str(if line.starts_with("tip:") { "; " } else { " " });
        }
        text.push_str(line.trim_start_matches("error: "));
    }
    if text.is_empty() {
        text.push_str("invalid arguments");
    }
    text
}

/// The error and its causes on one line, skipping causes whose text the
/// message already contains (engine errors include their cause).
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !msg.contains(&text) {
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&text);
        }
    }
    msg.replace('\n', " ")
}

fn run(command: Command, access: &Access) -> Result<ExitCode> {
    match command {
        Command::Init(args) => init(args, access)?,
        Command::Backup {
            repo,
            inputs,
            mut exclude,
            exclude_file,
            iexclude,
            exclude_if_present,
            exclude_caches,
            exclude_larger_than,
            files_from,
            follow_symlinks,
            stdin_name,
            one_file_system,
            parent,
            force,
            trace,
            label,
            source,
            host,
            tags,
            compression,
            sort_memory,
            json,
        } => {
            for file in &exclude_file {
                exclude.extend(tessera::tree::select::read_patterns(file)?);
            }
            let input = backup_input(&inputs, !files_from.is_empty(), stdin_name.is_some(), trace)?;
            let mut inputs: Vec<PathBuf> = inputs.iter().map(PathBuf::from).collect();
            for file in &files_from {
                let listed = tessera::tree::select::read_paths(file)?;
                if listed.is_empty() {
                    bail!("--files-from {}: no paths listed", file.display());
                }
                inputs.extend(listed);
            }
            let tree = TreeBackupOptions {
                stdin_name,
                excludes: exclude,
                iexcludes: iexclude,
                exclude_if_present,
                exclude_caches,
                exclude_larger_than,
                follow_symlinks,
                one_file_system,
                parent,
                force,
            };
            let naming = Naming {
                label,
                source,
                host,
                tags,
                compression,
                sort_memory,
            };
            return backup_cmd(&repo, &inputs, input, &tree, naming, json, access);
        }
        Command::Restore {
            repo,
            id,
            output,
            include,
            exclude,
            overwrite,
            delete,
            verify,
            cache,
            cache_size,
            tar,
            skip_damaged,
            json,
        } => {
            let overwrite = overwrite.map(Overwrite::from).unwrap_or_default();
            let r = open(&repo, LockMode::Read, access)?;
            let id = backup_id(&r, &id)?;
            if let Some(tree) = r.snapshot(id)?.tree {
                let restore = RestoreOptions {
                    cache_containers: cache_size,
                    policy: cache,
                    progress: None,
                    skip_damaged,
                };
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
                return tree_restore_cmd(&r, id, &output, options, json);
            } else if tar {
                bail!("backup {id}: --tar applies to tree backups only (restore it to `-` for its bytes)");
            } else if !include.is_empty() || !exclude.is_empty() || delete || verify {
                bail!(
                    "backup {id}: --include, --exclude, --delete and --verify apply to tree backups only"
                );
            } else {
                let existing = existing_file(id, overwrite)?;
                let options = RestoreOptions {
                    cache_containers: cache_size,
                    policy: cache,
                    progress: None,
                    skip_damaged,
                };
                return restore_cmd(&r, id, &output, existing, options, json);
            }
        }
        Command::Ls {
            repo,
            id,
            path,
            long,
            recursive,
            json,
        } => {
            let r = open(&repo, LockMode::Read, access)?;
            let id = backup_id(&r, &id)?;
            ls_cmd(&r, id, path.as_deref(), long, recursive, json)?
        }
        Command::Arrange {
            repo,
            sort_memory,
            json,
        } => {
            let r = open(&repo, LockMode::Exclusive, access)?;
            let options = tessera::layout::lifecycle::ArrangeOptions {
                rounds: None,
                sort_budget: sort_memory,
            };
            let s =
                tessera::layout::lifecycle::arrange_with_options(&r, &options, &Phases::default())?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else if !quiet() {
                println!(
                    "arranged {} round(s): {} categories split, {} volumes written, {} read, {} written, {:.2} s",
                    s.rounds,
                    s.categories_split,
                    s.volumes_written,
                    human(s.bytes_read),
                    human(s.bytes_written),
                    s.seconds
                );
            }
        }
        Command::Space {
            repo,
            ids,
            source,
            json,
        } => {
            let r = open(&repo, LockMode::Read, access)?;
            let freed = if ids.is_empty() {
                0
            } else {
                tessera::layout::lifecycle::space(&r, &ids)?
            };
            let trend = tessera::layout::lifecycle::trend(&r, &source)?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "ids": ids, "freed_bytes": freed, "trend": trend })
                );
            } else {
                if !ids.is_empty() {
                    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
                    println!(
                        "deleting backups {} would free {}",
                        list.join(" "),
                        human(freed)
                    );
                }
                println!(
                    "{:>8} {:>8} {:>12} {:>12}",
                    "version", "backup", "new data", "volume"
                );
                for v in trend {
                    let show = |b: Option<u64>| b.map_or_else(|| "-".into(), human);
                    println!(
                        "{:>8} {:>8} {:>12} {:>12}",
                        v.version,
                        v.backup,
                        show(v.new_bytes),
                        show(v.volume_bytes)
                    );
                }
            }
        }
        Command::List { repo, filter, json } => browse::list(&repo, json, filter, access)?,
        Command::Find {
            repo,
            pattern,
            filter,
            json,
        } => return browse::find_cmd(&repo, &pattern, json, filter, access),
        Command::Diff {
            repo,
            id1,
            id2,
            json,
        } => {
            let r = open(&repo, LockMode::Read, access)?;
            let (from, to) = (backup_id(&r, &id1)?, backup_id(&r, &id2)?);
            browse::diff_cmd(&r, from, to, json)?
        }
        Command::Dump { repo, id, path } => {
            let r = open(&repo, LockMode::Read, access)?;
            let id = backup_id(&r, &id)?;
            browse::dump_cmd(&r, id, &path, &RestoreOptions::default())?
        }
        Command::Tag {
            repo,
            ids,
            add,
            remove,
            set,
            json,
        } => {
            let r = open(&repo, LockMode::Backup, access)?;
            let ids = ids
                .iter()
                .map(|t| backup_id(&r, t))
                .collect::<Result<Vec<_>>>()?;
            let change = TagChange {
                set: (!set.is_empty()).then_some(set),
                add,
                remove,
            };
            browse::tag_cmd(&r, &ids, &change, json)?
        }
        Command::Mount {
            repo,
            mountpoint,
            cache,
        } => {
            let r = open(&repo, LockMode::Read, access)?;
            let cache = parse_size(&cache).map_err(|e| anyhow::anyhow!("--cache: {e}"))?;
            let fs = tessera::commands::mount::MountedRepo::new(r, cache)?;
            mount::serve(fs, &mountpoint, || {
                summary_err!(
                    "mounted {} at {}; `umount {}` or Ctrl-C unmounts",
                    repo,
                    mountpoint.display(),
                    mountpoint.display()
                )
            })?;
        }
        Command::Copy {
            src,
            dst,
            ids,
            to,
            json,
        } => copy_cmd(&src, &dst, &ids, &to, json, access)?,
        Command::Stats { repo, id, json } => stats(&repo, id.as_deref(), json, access)?,
        Command::Delete { repo, id, json } => {
            let r = open(&repo, LockMode::Exclusive, access)?;
            let id = backup_id(&r, &id)?;
            tessera::commands::delete::delete_backup(&r, id)
                .with_context(|| format!("deleting backup {id}"))?;
            if json {
                println!("{}", serde_json::json!({ "deleted": id }));
            } else {
                summary!("deleted backup {id}");
            }
        }
        Command::Check {
            repo,
            read_data,
            sort_memory,
            json,
        } => {
            let options = CheckOptions {
                read_data,
                sort_budget: sort_memory,
            };
            return check_cmd(&repo, options, json, access);
        }
        Command::Repair {
            repo,
            dry_run,
            forget_damaged,
            gc,
            json,
        } => {
            let options = RepairOptions {
                dry_run,
                forget_damaged,
            };
            return repair_cmd(&repo, options, gc, json, access);
        }
        Command::Forget(args) => {
            let mode = if args.dry_run {
                LockMode::Read
            } else {
                LockMode::Exclusive
            };
            let r = open(&args.repo, mode, access)?;
            let report = forget(&r, &args.options()?)?;
            let pruned = if args.prune
                && r.config().layout == Layout::Container
                && !report.removed.is_empty()
            {
                Some(gc_with_progress(
                    &r,
                    GcOptions::default(),
                    &Phases::default(),
                )?)
            } else {
                None
            };
            if args.json {
                let mut v = serde_json::to_value(&report)?;
                v["gc"] = serde_json::to_value(&pruned)?;
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                if !quiet() {
                    print_forget(&report);
                }
                if let Some(s) = &pruned {
                    print_gc(s, false)?;
                }
            }
        }
        Command::Gc {
            repo,
            threshold,
            defrag,
            segment,
            split_threshold,
            no_fill,
            sort_memory,
            json,
        } => {
            let r = open(&repo, LockMode::Exclusive, access)?;
            let options = GcOptions {
                threshold_pct: threshold,
                defrag,
                segment,
                split_threshold,
                fill: !no_fill,
                sort_budget: sort_memory,
            };
            print_gc(&gc_with_progress(&r, options, &Phases::default())?, json)?;
        }
        Command::Prune {
            repo,
            max_unused,
            max_repack,
            defrag,
            dry_run,
            json,
        } => {
            let mode = if dry_run {
                LockMode::Read
            } else {
                LockMode::Exclusive
            };
            let r = open(&repo, mode, access)?;
            let options = tessera::commands::prune::PruneOptions {
                max_unused,
                max_repack,
                defrag,
                dry_run,
            };
            let report =
                tessera::commands::prune::prune_with_progress(&r, &options, &Phases::default())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else if !quiet() {
                print_prune(&report)?;
            }
        }
        Command::Analyze(args) => analyze(args)?,
        Command::Completion { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "tessera", &mut io::stdout());
        }
        Command::Man { dir } => {
            use clap::CommandFactory;
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("{}: cannot create the directory", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("{}: cannot write the manual pages", dir.display()))?;
            summary!("manual pages written to {}", dir.display());
        }
        Command::Gen(a) => {
            let opts = GenOptions {
                versions: a.versions,
                size: a.size,
                change_rate: a.change_rate,
                touch_rate: a.touch_rate,
                growth: a.growth,
                seed: a.seed,
                sources: a.sources,
                trace: a.trace,
                tree: a.tree,
                ..GenOptions::default()
            };
            let total = u64::from(a.versions) * u64::from(a.sources);
            let bar = progress_bar(Some(total));
            let summary = generate_with(&a.outdir, &opts, |_| bar.inc(1))?;
            bar.finish_and_clear();
            let bytes: u64 = summary.versions.iter().map(|v| v.bytes).sum();
            summary!(
                "generated {} versions ({}) in {}; manifest {}",
                summary.versions.len(),
                human(bytes),
                a.outdir.display(),
                summary.manifest.display()
            );
        }
        Command::Experiment { config, out } => {
            let cfg = ExperimentConfig::load(&config)?;
            let out = out.unwrap_or_else(|| PathBuf::from("results").join(&cfg.name));
            let results = experiment::run(&cfg, &out, &mut |line| eprintln!("{line}"))?;
            summary!(
                "experiment {:?}: {} systems x {} versions in {:.1} s; report: {}",
                cfg.name,
                cfg.systems.len(),
                results.versions.len(),
                results.seconds,
                out.join("report.html").display()
            );
        }
        Command::Trace {
            paths,
            output,
            chunking,
        } => {
            let params = chunking.params();
            match output {
                Some(path) => {
                    let f = File::create(&path)
                        .with_context(|| format!("creating {}", path.display()))?;
                    let w = io::BufWriter::with_capacity(1 << 20, f);
                    write_data_trace(&paths, params, chunking.fingerprint, w)?
                        .into_inner()
                        .map_err(|e| e.into_error())
                        .and_then(|f| f.sync_all())
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                None => {
                    let w = io::BufWriter::with_capacity(1 << 20, io::stdout().lock());
                    write_data_trace(&paths, params, chunking.fingerprint, w)?;
                }
            }
        }
        Command::Key { command } => key_cmd(command, access)?,
        Command::Unlock {
            repo,
            remove_all,
            json,
        } => {
            let removed = Repository::unlock_at(&tuned(&repo, access), remove_all)?;
            if json {
                println!("{}", serde_json::json!({ "removed": removed }));
            } else {
                for line in &removed {
                    summary!("removed {line}");
                }
                summary!("{} lock object(s) removed", removed.len());
            }
        }
        Command::Index {
            command: IndexCommand::Rebuild { repo, json },
        } => {
            let r = open(&repo, LockMode::Exclusive, access)?;
            let s = r.rebuild_index().context("rebuilding the index")?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                summary!(
                    "index rebuilt: {} entries from {} containers",
                    s.entries,
                    s.containers_scanned
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `tessera forget`: a retention policy (restic's `--keep-*` rules).
#[derive(Args)]
#[command(group(clap::ArgGroup::new("rules").required(true).multiple(true).args([
    "keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly",
    "keep_within", "keep_tag",
])))]
struct ForgetArgs {
    /// The repository.
    repo: Location,
    /// Keep the N newest backups (`unlimited` keeps all).
    #[arg(long, value_name = "N")]
    keep_last: Option<Count>,
    /// Keep the newest backup of each of the N newest hours that have one.
    #[arg(long, value_name = "N")]
    keep_hourly: Option<Count>,
    /// Keep the newest backup of each of the N newest days that have one.
    #[arg(long, value_name = "N")]
    keep_daily: Option<Count>,
    /// Keep the newest backup of each of the N newest ISO weeks that have one.
    #[arg(long, value_name = "N")]
    keep_weekly: Option<Count>,
    /// Keep the newest backup of each of the N newest months that have one.
    #[arg(long, value_name = "N")]
    keep_monthly: Option<Count>,
    /// Keep the newest backup of each of the N newest years that have one.
    #[arg(long, value_name = "N")]
    keep_yearly: Option<Count>,
    /// Keep every backup made within this span before the group's newest
    /// (e.g. `30d`, `1y 6mo`, `2w`, `P1Y2M`).
    #[arg(long, value_name = "SPAN")]
    keep_within: Option<jiff::Span>,
    /// Keep every backup carrying this tag (repeatable).
    #[arg(long, value_name = "TAG")]
    keep_tag: Vec<String>,
    /// Group backups by these properties (comma-separated: host, paths,
    /// source, tags; empty: one group). The default is restic's host and
    /// paths, and the source lineage, which keeps apart streams of
    /// standard input (they have no paths).
    #[arg(long, value_name = "KEYS", default_value = DEFAULT_GROUP_BY)]
    group_by: String,
    /// Only show what would be deleted.
    #[arg(long)]
    dry_run: bool,
    /// Reclaim the space afterwards (`gc` with default settings; the
    /// lifecycle layout reclaims it anyway).
    #[arg(long, conflicts_with = "dry_run")]
    prune: bool,
    /// Print the decisions as JSON.
    #[arg(long)]
    json: bool,
}

impl ForgetArgs {
    fn options(&self) -> Result<ForgetOptions> {
        let periods = [
            (Period::Hourly, self.keep_hourly),
            (Period::Daily, self.keep_daily),
            (Period::Weekly, self.keep_weekly),
            (Period::Monthly, self.keep_monthly),
            (Period::Yearly, self.keep_yearly),
        ]
        .into_iter()
        .filter_map(|(p, c)| c.map(|c| (p, c)))
        .collect();
        Ok(ForgetOptions {
            policy: Policy {
                last: self.keep_last,
                periods,
                within: self.keep_within,
                tags: self.keep_tag.clone(),
            },
            group_by: parse_group_by(&self.group_by)?,
            dry_run: self.dry_run,
            time_zone: jiff::tz::TimeZone::system(),
        })
    }
}

/// Prints what `gc` did.
fn print_gc(s: &tessera::gc::GcStats, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(s)?);
    } else if !quiet() {
        println!(
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
        );
    }
    Ok(())
}

/// Prints what `prune` planned and did.
fn print_prune(report: &tessera::commands::prune::PruneReport) -> Result<()> {
    if let Some(p) = &report.plan {
        println!(
            "{} containers: {} unused, {} wholly unused (deleted), {} repacked ({} copied); {} unused afterwards (GC threshold {:.1}%)",
            p.containers,
            human(p.unused_before),
            p.containers_dead,
            p.containers_repacked,
            human(p.bytes_repacked),
            human(p.unused_after),
            p.threshold_pct
        );
    }
    if let Some(l) = &report.lifecycle {
        println!(
            "lifecycle layout: deleting a backup frees its space at once, nothing to repack; {} freed by finishing deletions",
            human(l.bytes_freed)
        );
    } else if report.plan.is_none() {
        println!("lifecycle layout: deleting a backup frees its space at once, nothing to repack");
    }
    if let Some(g) = &report.gc {
        print_gc(g, false)?;
    } else if report.dry_run {
        println!("dry run: nothing changed");
    }
    Ok(())
}

/// Prints `forget`'s decisions: what the backups are grouped by, then per
/// group its name and counts and each backup newest first with the rules
/// that keep it.
fn print_forget(report: &ForgetReport) {
    let tz = jiff::tz::TimeZone::system();
    let keys: Vec<&str> = report.group_by.iter().map(|k| k.name()).collect();
    println!(
        "{} group(s) by {}",
        report.groups.len(),
        if keys.is_empty() {
            "nothing (every backup in one group)".to_string()
        } else {
            keys.join(",")
        }
    );
    let mut groups = report.groups.iter();
    let mut group = None;
    for d in &report.decisions {
        if group != Some(&d.group) {
            let counts = groups
                .next()
                .map(|g| format!(": keep {}, remove {}", g.keep.len(), g.remove.len()))
                .unwrap_or_default();
            println!(
                "group {}{counts}",
                if d.group.is_empty() {
                    "(all)"
                } else {
                    &d.group
                }
            );
            group = Some(&d.group);
        }
        let when = jiff::Timestamp::from_second(d.time)
            .map(|t| {
                t.to_zoned_datetime(tz.clone())
                    .strftime("%Y-%m-%d %H:%M:%S")
                    .to_string()
            })
            .unwrap_or_else(|_| d.time.to_string());
        let why: Vec<String> = d.reasons.iter().map(ToString::to_string).collect();
        let verdict = if d.keep() { "keep  " } else { "remove" };
        println!("  {:>6}  {when}  {verdict}  {}", d.id, why.join(", "));
    }
    for id in &report.unreadable {
        println!(
            "backup {id}: snapshot unreadable, left alone (see `tessera check`, `tessera repair`)"
        );
    }
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    println!(
        "{verb} {} of {} backup(s)",
        report.removed.len(),
        report.decisions.len()
    );
    if let Some(f) = &report.freed {
        println!(
            "freed {} at once (lifecycle layout: no gc needed)",
            human(f.bytes_freed)
        );
    }
}

/// Opens the repository at `path` for `mode`, waiting as `access` says
/// for a conflicting holder of its lock, with its password if encrypted.
fn open(location: &Location, mode: LockMode, access: &Access) -> Result<Repository> {
    match open_repo(location, mode, access) {
        Err(e @ tessera::Error::Locked(_)) => {
            let doing = match mode {
                LockMode::Read => "a maintenance command (gc, delete, forget, arrange) is running",
                _ => "a backup or a maintenance command is running",
            };
            bail!("{e}: {doing}; retry later, or pass --wait DURATION to wait longer for it")
        }
        other => Ok(other?),
    }
}

/// Parses a backup id or `latest`.
fn backup_id(repo: &Repository, text: &str) -> Result<BackupId> {
    if text == "latest" {
        return match repo.backups()?.last() {
            Some(&id) => Ok(id),
            None => bail!(
                "{}: the repository holds no backup",
                repo.backend().location()
            ),
        };
    }
    text.parse()
        .with_context(|| format!("{text:?} is not a backup id (a number or `latest`)"))
}

fn init(a: InitArgs, access: &Access) -> Result<()> {
    let mut config = Config::new(random_id(&a.repo.to_string()));
    config.chunker = a.chunking.params();
    config.fingerprint = a.chunking.fingerprint;
    config.container_size = a.container_size;
    config.index = a.index;
    config.layout = a.layout;
    config.arrange = a.arrange;
    config.trace = a.trace;
    config.bloom_fpr = a.bloom_fpr;
    config.index_cache_bytes = a.index_memory;
    config.bloom_bytes = a.bloom_size.unwrap_or(0);
    config.lazy_bft = a.bft;
    config.lazy_prefetch = a.prefetch;
    config.lazy_buffer_pct = a.buffer_share;
    config.ehid_consult_cold = a.consult_cold;
    config.ehid_sparse_pct = a.sparse_threshold;
    config.rewrite = RewriteParams {
        kind: a.rewrite,
        limit: a.rewrite_limit.map(|p| p / 100.0),
        cbr_stream_context: a.cbr_stream_context,
        cbr_min_utility: a.cbr_min_utility / 100.0,
        segment_bytes: a.segment_size,
        segment_chunks: None,
        capping_level: a.capping_level,
        smr_level: a.smr_level,
        har_utilization: a.har_utilization / 100.0,
    };
    config.delta = DeltaParams {
        kind: a.delta,
        features: a.features,
        base_cache_containers: a.base_cache,
        prefetch: a.base_prefetch,
        scope: a.base_scope,
    };
    let plain_only = a.trace || a.chunking.fingerprint == FingerprintAlgo::Sha1;
    let encryption = a.encryption.unwrap_or(match plain_only {
        true => Encryption::None,
        false => Encryption::Aes256Gcm,
    });
    // A trace repository stores no chunk bytes: nothing to compress.
    let compression = a.compression.unwrap_or(match encryption {
        Encryption::XChaCha20Poly1305 | Encryption::Aes256Gcm if !a.trace => Compression::Auto,
        _ => Compression::Off,
    });
    config.set_protection(Encryption::None, compression);
    match encryption {
        Encryption::None => {
            Repository::init_at(&tuned(&a.repo, access), config.clone(), None)?;
        }
        Encryption::XChaCha20Poly1305 | Encryption::Aes256Gcm => {
            // Refuse a configuration that cannot be encrypted before asking for a password.
            config.set_protection(encryption, compression);
            config.validate()?;
            let key = new_repo_key(&access.password, a.kdf)?;
            Repository::init_at(&tuned(&a.repo, access), config.clone(), Some(&key))?;
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "repository": a.repo.to_string(),
                "id": config.id,
                "encryption": encryption.to_string(),
                "compression": compression.to_string(),
                "layout": config.layout,
                "index": config.index,
            })
        );
    } else if encryption == Encryption::None {
        summary!(
            "created unencrypted repository {} (compression {compression})",
            a.repo
        );
    } else {
        summary!(
            "created encrypted repository {} ({encryption}, compression {compression})",
            a.repo
        );
    }
    Ok(())
}

/// Raises the soft limit of open files to the hard one, as Go programs
/// (restic, kopia) do at start: a tree backup keeps up to several hundred
/// directories open while it walks and reads, against a usual soft limit
/// of 1024. Left as it is if it cannot be read or raised.
#[cfg(unix)]
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Standard output for a data stream (a restore, a dump, a tar stream):
/// buffered by 1 MiB, and when it is a pipe, the pipe widened to 1 MiB
/// (the usual limit for a process, `/proc/sys/fs/pipe-max-size`) so that
/// the writer and its reader switch a sixteenth as often as through the
/// default 64 KiB. A pipe that cannot be widened stays as it is.
pub(crate) fn data_stdout() -> io::BufWriter<io::StdoutLock<'static>> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd = io::stdout().as_raw_fd();
        // SAFETY: fstat writes only `st`; F_SETPIPE_SZ only resizes the
        // pipe's buffer (the kernel refuses it on anything but a pipe).
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO {
                libc::fcntl(fd, libc::F_SETPIPE_SZ, 1 << 20);
            }
        }
    }
    io::BufWriter::with_capacity(1 << 20, io::stdout().lock())
}

/// A repository id unlikely to repeat: a hash of the location, time and process.
fn random_id(location: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{location}|{nanos}|{}", std::process::id());
    FingerprintAlgo::Blake3.hash(seed.as_bytes()).hex(16)
}

/// Exit status of a backup that committed but left out objects it could not read.
const EXIT_INCOMPLETE: u8 = 3;

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
    let host = host.unwrap_or_else(tessera::tree::host_name);
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
            None => tessera::tree::default_source(&host, paths)?,
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
    let mut warnings = Vec::new();
    let outcome = match input {
        BackupInput::Trace(path) => backup_trace(&r, &path, &options_for(None))?,
        BackupInput::Tree => {
            let bar = progress::Bar::tree_backup(paths, tree_options);
            let on_progress = |n: u64| bar.set_position(n);
            let done = backup_tree(&r, paths, tree_options, &options_for(Some(&on_progress)))?;
            bar.finish_and_clear();
            for note in &done.notes {
                eprintln!("tessera: note: {note}");
            }
            for warning in &done.warnings {
                eprintln!("tessera: warning: {warning}");
            }
            warnings = done.warnings;
            done.outcome
        }
        BackupInput::Stdin => {
            let bar = progress_bar(stdin_len());
            let on_progress = |n: u64| bar.set_position(n);
            let source = Source::Data {
                input: &mut io::stdin(),
                name: "stdin",
            };
            let done = run_backup(&r, source, &options_for(Some(&on_progress)))?;
            bar.finish_and_clear();
            done
        }
    };
    print_backup(&r, &outcome, &warnings, json)?;
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
fn backup_trace(r: &Repository, path: &Path, options: &BackupOptions) -> Result<Outcome> {
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
        run_backup(r, Source::Trace(&mut chunks), options)
    };
    // A malformed trace is reported as such, with its line or offset.
    match (done, failure) {
        (_, Some(e)) => Err(e.into()),
        (done, None) => Ok(done?),
    }
}

/// Prints what a committed backup stored (`warnings`: the objects a tree
/// backup could not read).
fn print_backup(r: &Repository, outcome: &Outcome, warnings: &[String], json: bool) -> Result<()> {
    let snap = &outcome.snapshot;
    let s = &snap.stats;
    if json {
        let mut v = serde_json::to_value(s)?;
        v["id"] = snap.id.into();
        v["time"] = snap.time.into();
        v["label"] = snap.label.clone().into();
        v["source"] = snap.source.clone().into();
        v["host"] = snap.host.clone().into();
        v["tags"] = snap.tags.clone().into();
        if let Some(a) = &outcome.arrange {
            v["arrange"] = serde_json::to_value(a)?;
        }
        if outcome.arrange_deferred {
            v["arrange_deferred"] = true.into();
        }
        if let Some(t) = &snap.tree {
            v["tree"] = serde_json::to_value(t)?;
            v["warnings"] = serde_json::to_value(warnings)?;
        }
        println!("{v}");
        return Ok(());
    }
    if quiet() {
        return Ok(());
    }
    println!(
        "backup {} committed: {} logical, {} stored (dedup {}), {} chunks ({} new, {} internal duplicates, {} rewritten), {} containers, {:.2} s, {:.0} MB/s",
        snap.id,
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
    );
    let c = &s.compression;
    if r.config().encoding().is_some() {
        println!(
            "compression ({}): {} stored before compression, {} after (compression {}; {} chunks compressed, {} raw)",
            c.setting,
            human(c.bytes_before),
            human(c.bytes_after),
            ratio_text(c.ratio),
            c.compressed_chunks,
            c.raw_chunks
        );
    }
    let d = &s.delta;
    if r.config().delta.kind != DeltaKind::None {
        println!(
            "delta ({}): {} chunks stored as deltas ({} hash-less, {} Edelta), {} saved, {} PFCs, {} containers piggybacked, {} extra base reads",
            d.policy,
            d.delta_chunks,
            d.hashless,
            d.edelta,
            human(d.bytes_saved),
            d.pfc_chunks,
            d.piggybacked_containers,
            d.base_reads
        );
    }
    if let Some(a) = &outcome.arrange {
        println!(
            "arranged: {} categories split, {} volume(s) written, {:.2} s",
            a.categories_split, a.volumes_written, a.seconds
        );
    }
    if outcome.arrange_deferred {
        println!("arranging deferred while other processes read the repository: it runs with the next backup or `tessera arrange`");
    }
    if let Some(t) = &snap.tree {
        println!(
            "tree: {} entries, {} files ({}), catalog {}, {} skipped",
            t.entries,
            t.files,
            human(t.catalog_offset),
            human(t.catalog_bytes),
            t.skipped
        );
        let parent = match t.parent {
            Some(p) => format!("parent backup {p}"),
            None => "no parent".into(),
        };
        println!(
            "files: {} new, {} changed, {} unmodified ({parent}); {} read, {} reused unread",
            t.files_new,
            t.files_changed,
            t.files_unmodified,
            human(t.bytes_read),
            human(t.bytes_reused)
        );
    }
    Ok(())
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
        serde_json::to_string(&stats)?
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

fn stats(repo: &Location, id: Option<&str>, json: bool, access: &Access) -> Result<()> {
    let r = open(repo, LockMode::Read, access)?;
    if let Some(id) = id {
        let id = backup_id(&r, id)?;
        let snap = r.snapshot(id)?;
        if json {
            println!("{}", serde_json::to_string(&snap)?);
        } else {
            println!("{}", serde_json::to_string_pretty(&snap)?);
        }
        return Ok(());
    }
    let t = tessera::commands::stats::totals(&r)?;
    if json {
        let mut v = serde_json::to_value(&t)?;
        v["config"] = serde_json::to_value(r.config())?;
        println!("{v}");
    } else {
        let c = r.config();
        println!(
            "{} backups, {} logical, {} physical in {} containers, dedup {}, compression {}, total {}\nchunker {} {}/{}/{}, fingerprint {}{}, containers {}\nlayout {}, index {}, rewrite {}, delta {}\nencryption {}, compression {}",
            t.backups,
            human(t.logical_bytes),
            human(t.physical_bytes),
            t.containers,
            ratio_text(t.dedup_ratio),
            ratio_text(t.compression_ratio),
            ratio_text(t.total_ratio),
            c.chunker.kind.name(),
            human(c.chunker.min_size.into()),
            human(c.chunker.avg_size.into()),
            human(c.chunker.max_size.into()),
            c.fingerprint.name(),
            if r.is_encrypted() { " (keyed)" } else { "" },
            human(c.container_size.into()),
            format!("{:?}", c.layout).to_lowercase(),
            format!("{:?}", c.index).to_lowercase(),
            c.rewrite.kind.name(),
            c.delta.kind.name(),
            c.encryption,
            c.compression,
        );
    }
    Ok(())
}

fn repair_cmd(
    repo: &Location,
    options: RepairOptions,
    then_gc: bool,
    json: bool,
    access: &Access,
) -> Result<ExitCode> {
    let r = open(repo, LockMode::Exclusive, access)?;
    let report = repair_with_progress(&r, options, &Phases::default())
        .context("repairing the repository")?;
    // Damage no backup uses is garbage: gc clears it (`--gc`), or says how.
    let gc = match then_gc && r.config().layout == Layout::Container {
        true => Some(gc_with_progress(
            &r,
            GcOptions::default(),
            &Phases::default(),
        )?),
        false => None,
    };
    if json {
        let mut v = serde_json::to_value(&report)?;
        v["gc"] = serde_json::to_value(&gc)?;
        println!("{v}");
    } else {
        let verb = if report.dry_run { "would do" } else { "did" };
        for a in &report.actions {
            println!("{} ({verb}): {}: {}", a.kind, a.object, a.detail);
        }
        for u in &report.unrepaired {
            let state = if u.forgotten { "forgotten" } else { "kept" };
            println!("unrepaired: backup {} ({state}): {}", u.backup, u.reason);
        }
        if report.actions.is_empty() && report.unrepaired.is_empty() && !quiet() {
            println!("nothing to repair");
        }
        if let Some(s) = &gc {
            print_gc(s, false)?;
        }
    }
    if gc.is_none() && !report.unused_damage.is_empty() {
        eprintln!(
            "tessera: warning: no backup uses the damage of {}: `check` reports it until \
             `tessera gc {repo}` (or `tessera repair --gc`) clears it",
            report.unused_damage.join(", ")
        );
    }
    if report.unrepaired.iter().any(|u| !u.forgotten) {
        eprintln!(
            "tessera: {} backup(s) still have unrecoverable damage",
            report.unrepaired.iter().filter(|u| !u.forgotten).count()
        );
        return Ok(ExitCode::from(EXIT_INCOMPLETE));
    }
    Ok(ExitCode::SUCCESS)
}

fn check_cmd(
    repo: &Location,
    options: CheckOptions,
    json: bool,
    access: &Access,
) -> Result<ExitCode> {
    let r = open(repo, LockMode::Read, access)?;
    let report = check_with_progress(&r, options, &Phases::default())?;
    for w in &report.warnings {
        eprintln!("tessera: warning: {w}");
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        // Damaged containers no backup uses any damage of: gc clears them.
        let used: std::collections::HashSet<&str> = report
            .problems
            .iter()
            .filter(|p| !p.affected_backups.is_empty())
            .map(|p| p.object.as_str())
            .collect();
        let container_layout = r.config().layout == Layout::Container;
        for p in &report.problems {
            let users: Vec<String> = p.affected_backups.iter().map(|b| b.to_string()).collect();
            println!(
                "problem: {}: {} (affects backups: {})",
                p.object,
                p.detail,
                match (users.is_empty(), p.kind) {
                    (false, _) => users.join(", "),
                    (true, ProblemKind::Derived) =>
                        "none: derived data, rebuilt automatically or by `repair`".into(),
                    (true, ProblemKind::Damaged)
                        if container_layout
                            && p.object.starts_with("containers/")
                            && !used.contains(p.object.as_str()) =>
                        format!("none: no backup uses its damage; `tessera gc {repo}` clears it"),
                    (true, _) => "none".into(),
                }
            );
        }
        if quiet() {
            // Problems are listed above; the summary is chatter.
        } else {
            println!(
                "checked {} containers ({} chunks{}), {} backups ({} references): {}{}",
                report.containers,
                report.stored_chunks,
                if options.read_data {
                    format!(", {} re-hashed", report.chunks_verified)
                } else {
                    String::new()
                },
                report.backups,
                report.references,
                if report.is_ok() {
                    "no problems".to_string()
                } else {
                    format!("{} problem(s)", report.problems.len())
                },
                if report.unreferenced_containers + report.uncommitted_recipes > 0 {
                    format!(
                    "; {} unreferenced container(s) and {} uncommitted recipe(s) left by interrupted backups",
                    report.unreferenced_containers, report.uncommitted_recipes
                )
                } else {
                    String::new()
                }
            );
        }
    }
    if report.is_ok() {
        Ok(ExitCode::SUCCESS)
    } else {
        if !json {
            eprintln!(
                "tessera: error: check found {} problem(s)",
                report.problems.len()
            );
        }
        Ok(ExitCode::FAILURE)
    }
}

fn analyze(a: AnalyzeArgs) -> Result<()> {
    let input = if a.trace {
        Input::Trace
    } else {
        Input::Data {
            chunker: a.chunking.params(),
            fingerprint: a.chunking.fingerprint,
        }
    };
    let json = a.json;
    if !json {
        println!(
            "{:<24} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "version", "bytes", "chunks", "internal", "adjacent", "skip", "unique"
        );
    }
    let mut print_row = |r: &VersionRow| {
        if !json {
            println!(
                "{:<24} {:>12} {:>9} {:>9.4} {:>9.4} {:>9.4} {:>9.4}",
                r.classes.version,
                r.classes.bytes,
                r.classes.chunks,
                r.frac_internal,
                r.frac_adjacent,
                r.frac_skip,
                r.frac_unique
            );
        }
    };
    let analysis = analyze_paths(&a.paths, input, &mut print_row)?;
    if json {
        let mut v = serde_json::to_value(&analysis)?;
        v["chunker"] = if a.trace {
            serde_json::Value::from("trace")
        } else {
            serde_json::to_value(a.chunking.params())?
        };
        if !a.trace {
            v["fingerprint"] = a.chunking.fingerprint.name().into();
        }
        println!("{v}");
    } else {
        println!(
            "all versions: {} bytes, {} chunks ({} distinct); internal {:.4}, adjacent {:.4}, skip {:.4}, unique {:.4}; exact dedup {:.3}x, NDF (skip stored again) {:.3}x",
            analysis.logical_bytes,
            analysis.chunks,
            analysis.distinct_chunks,
            analysis.frac_internal,
            analysis.frac_adjacent,
            analysis.frac_skip,
            analysis.frac_unique,
            analysis.exact_dedup_ratio,
            analysis.ndf_ratio
        );
    }
    Ok(())
}

/// Bytes in human units (powers of 1024).
fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a (nothing stored)".into(), |r| format!("{r:.2}x"))
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
        println!("{}", serde_json::to_string(&stats)?);
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

fn ls_cmd(
    r: &Repository,
    id: BackupId,
    path: Option<&Path>,
    long: bool,
    recursive: bool,
    json: bool,
) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut first = true;
    if json {
        write!(out, "[")?;
    }
    let wanted = path.map(|p| p.as_os_str().as_bytes());
    list_tree(r, id, wanted, recursive, |e| {
        let line = if json {
            let sep = if first { "" } else { "," };
            format!("{sep}{}", entry_json(e))
        } else if long {
            format!("{}\n", entry_long(e))
        } else {
            format!("/{}\n", String::from_utf8_lossy(&e.path))
        };
        first = false;
        out.write_all(line.as_bytes())
            .map_err(|err| tessera::Error::Output {
                what: "stdout".into(),
                source: err,
            })
    })
    .with_context(|| format!("listing backup {id}"))?;
    if json {
        writeln!(out, "]")?;
    }
    out.flush()?;
    Ok(())
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Dir => "dir",
        Kind::File => "file",
        Kind::Symlink => "symlink",
        Kind::Gap => "gap",
        Kind::Hardlink => "hardlink",
        Kind::Fifo => "fifo",
        Kind::CharDevice => "chardev",
        Kind::BlockDevice => "blockdev",
    }
}

/// One entry as a JSON object (a path that is not UTF-8 also as hex).
fn entry_json(e: &Entry) -> serde_json::Value {
    let mut v = serde_json::json!({
        "path": format!("/{}", String::from_utf8_lossy(&e.path)),
        "kind": kind_name(e.kind),
        "mode": e.mode,
        "uid": e.uid,
        "gid": e.gid,
        "size": e.size,
        "mtime": e.mtime,
        "mtime_ns": e.mtime_ns,
    });
    if std::str::from_utf8(&e.path).is_err() {
        v["path_hex"] = e
            .path
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into();
    }
    if matches!(e.kind, Kind::Symlink | Kind::Hardlink) {
        v["target"] = String::from_utf8_lossy(&e.target).into_owned().into();
    }
    v
}

/// One entry as `ls -l` shows it.
fn entry_long(e: &Entry) -> String {
    let kind = match e.kind {
        Kind::Dir => 'd',
        Kind::Symlink => 'l',
        Kind::Fifo => 'p',
        Kind::CharDevice => 'c',
        Kind::BlockDevice => 'b',
        Kind::File | Kind::Gap | Kind::Hardlink => '-',
    };
    let mode = browse::mode_text(kind, e.mode);
    // A device's size column holds its major and minor numbers, as in `ls -l`.
    let size = match e.kind {
        Kind::CharDevice | Kind::BlockDevice => browse::device_text(e.rdev),
        _ => e.size.to_string(),
    };
    let time = u64::try_from(e.mtime)
        .ok()
        .and_then(|s| {
            std::time::UNIX_EPOCH.checked_add(Duration::new(s, e.mtime_ns.min(999_999_999)))
        })
        .map(|t| humantime::format_rfc3339_seconds(t).to_string())
        .unwrap_or_else(|| format!("{}s", e.mtime));
    let mut line = format!(
        "{mode} {:>5} {:>5} {size:>12} {time} /{}",
        e.uid,
        e.gid,
        String::from_utf8_lossy(&e.path)
    );
    if e.kind == Kind::Hardlink {
        line.push_str(" link to /");
        line.push_str(&String::from_utf8_lossy(&e.target));
    } else if e.kind == Kind::Symlink {
        line.push_str(" -> ");
        line.push_str(&String::from_utf8_lossy(&e.target));
    }
    line
}

/// `tessera copy`: each backup copied (or skipped), one line or record each.
fn copy_cmd(
    src: &Location,
    dst: &Location,
    ids: &[String],
    to: &ToPasswordArgs,
    json: bool,
    access: &Access,
) -> Result<()> {
    let same = match (src, dst) {
        (Location::Local(a), Location::Local(b)) => {
            std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
        }
        (a, b) => a == b,
    };
    if same {
        bail!("{src} and {dst} are the same repository: copy needs two");
    }
    let from = open(src, LockMode::Read, access)?;
    let to_access = Access {
        wait: access.wait,
        password: to.password_args(),
        connections: access.connections,
        transfer: access.transfer,
    };
    let into = open(dst, LockMode::Backup, &to_access)?;
    let mut ids: Vec<BackupId> = match ids.is_empty() {
        true => from.backups()?,
        false => ids
            .iter()
            .map(|t| backup_id(&from, t))
            .collect::<Result<_>>()?,
    };
    ids.sort_unstable();
    ids.dedup();
    let mut unclaimed = into.snapshots()?;
    let mut records = Vec::new();
    for id in ids {
        let c = tessera::commands::copy::copy_backup(&from, &into, id, &mut unclaimed)
            .with_context(|| format!("copying backup {id}"))?;
        if !json {
            match c.skipped {
                true => summary!("backup {id}: already copied as {}", c.copy_id),
                false => summary!(
                    "backup {id}: copied as {} ({}, {} stored)",
                    c.copy_id,
                    human(c.logical_bytes),
                    human(c.stored_bytes)
                ),
            }
        }
        records.push(c);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&records)?);
    }
    Ok(())
}
