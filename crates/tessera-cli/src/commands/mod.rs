//! The commands: one module each (or one per closely related group), each
//! owning its arguments (clap derive), its call into the engine and its
//! printing. [`Command`] lists them in the order `tessera --help` shows
//! them; [`Command::run`] dispatches to them.

use anyhow::Result;
use clap::Subcommand;
use std::process::ExitCode;

use crate::secrets::Access;

mod backup;
mod browse;
mod check;
mod completion;
mod copy;
mod delete;
mod forget;
mod gc;
mod index;
mod init;
mod key;
#[cfg(feature = "lab")]
mod lab;
mod lifecycle;
mod ls;
mod mount;
mod prune;
mod repair;
mod restore;
mod serve;
mod session;
mod stats;
mod unlock;

#[derive(Subcommand)]
pub enum Command {
    /// Create a repository in a local directory (absent or empty).
    Init(init::InitArgs),
    /// Back up directory trees, a file or standard input (`-`) as a new
    /// backup, or replay a fingerprint trace (--trace) into a trace repository.
    Backup(backup::BackupArgs),
    /// Restore a backup into a file, a device or FIFO, or to standard
    /// output (`-`); a tree backup into a directory.
    Restore(restore::RestoreArgs),
    /// List the entries of a tree backup.
    Ls(ls::LsArgs),
    /// Serve a web interface to the repository: browse, download and
    /// compare backups, see where the space goes (docs/API.md).
    Serve(serve::ServeArgs),
    /// Serve the repository's backups as a read-only file system at
    /// MOUNTPOINT (FUSE): `ids/<ID>/…`, `sources/<SOURCE>/<ID>`,
    /// `latest`. Runs in the foreground until `umount MOUNTPOINT` or
    /// Ctrl-C (SIGINT, SIGTERM, SIGHUP), then unmounts.
    Mount(mount::MountArgs),
    /// Copy backups into another repository (its chunking, layout and keys),
    /// deduplicated against what it holds; backups it already holds are
    /// skipped. The source's password comes from the usual options, the
    /// destination's from `--to-password-file`, `--to-password-command` or
    /// `TESSERA_TO_PASSWORD`.
    Copy(copy::CopyArgs),
    /// List the backups: time (local), host, paths or source, tags, files and sizes.
    List(browse::ListArgs),
    /// Find entries by a glob on their path in every tree backup, newest first.
    Find(browse::FindArgs),
    /// Show what changed between two tree backups: added (+), removed (-),
    /// changed contents (M) and metadata only (U).
    Diff(browse::DiffArgs),
    /// Write one file of a tree backup to standard output, or a directory
    /// as a tar stream.
    Dump(browse::DumpArgs),
    /// Change the tags of backups (the snapshot is replaced atomically).
    Tag(browse::TagArgs),
    /// Show repository totals, or one backup's statistics.
    Stats(stats::StatsArgs),
    /// Delete a backup (garbage collection reclaims its space).
    Delete(delete::DeleteArgs),
    /// Delete the backups a retention policy does not keep, group by group
    /// (the newest backup of every group is always kept unless
    /// `--keep-last 0`); space is reclaimed by `gc` (container layout) or at
    /// once (lifecycle layout).
    Forget(forget::ForgetArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    /// to standard output, e.g. `tessera completion bash > /etc/bash_completion.d/tessera`.
    Completion(completion::CompletionArgs),
    /// Write the manual pages (`tessera.1` and one per command, e.g.
    /// `tessera-backup.1`) into a directory.
    Man(completion::ManArgs),
    /// Reclaim the space of deleted backups (mark, select, copy forward, sweep).
    Gc(gc::GcArgs),
    /// Reclaim unused space with restic's knobs: `--max-unused` and
    /// `--max-repack` choose GC's utilization threshold (container layout);
    /// the lifecycle layout only finishes interrupted deletions.
    Prune(prune::PruneArgs),
    /// Verify the repository's objects and references.
    Check(check::CheckArgs),
    /// Repair what can be proven: rewrite damaged derived state, recover
    /// lost snapshots from commit marks and recipes, re-point references to
    /// damaged chunks to intact copies, rebuild the index without damaged
    /// chunks (docs/RECOVERY.md). Exit status 3 when backups with
    /// unrecoverable chunks remain.
    Repair(repair::RepairArgs),
    /// Generate a deterministic versioned dataset (packed tar streams, or
    /// fingerprint traces with --trace) aged by file create/delete/modify/rename.
    #[cfg(feature = "lab")]
    Gen(lab::GenArgs),
    /// Classify the chunks of version files (in order): internal, adjacent and
    /// skip duplicates and unique chunks, with exact and NDF dedup ratios.
    #[cfg(feature = "lab")]
    Analyze(lab::AnalyzeArgs),
    /// Write a Destor text trace (fingerprint and size per chunk) of files or directories.
    #[cfg(feature = "lab")]
    Trace(lab::TraceArgs),
    /// Run an experiment: every system of CONFIG over its dataset, with
    /// results as JSON, CSV and an HTML report with plots.
    #[cfg(feature = "lab")]
    Experiment(lab::ExperimentArgs),
    /// Lifecycle layout: run the pending arranging rounds (AVAR).
    Arrange(lifecycle::ArrangeArgs),
    /// Lifecycle layout: bytes that deleting the given backups would free,
    /// and the per-version trend of new data.
    Space(lifecycle::SpaceArgs),
    /// Maintain the deduplication index.
    #[command(subcommand)]
    Index(index::IndexCommand),
    /// Remove stale lock objects of a repository in object storage (those
    /// whose holder stopped refreshing them or no longer runs); local
    /// repositories use OS locks, which never outlive their holder.
    Unlock(unlock::UnlockArgs),
    /// Manage the password key files of an encrypted repository.
    #[command(subcommand)]
    Key(key::KeyCommand),
    /// Open an encrypted repository once and keep the key derived from the
    /// password in $XDG_RUNTIME_DIR (0600, with an expiry) so that later
    /// commands open it without the password or the key derivation.
    Login(session::LoginArgs),
    /// End the sessions of an encrypted repository (`tessera login`).
    Logout(session::LogoutArgs),
}

impl Command {
    /// Runs the command; its exit status on success (some commands exit
    /// with 3 when their work is incomplete).
    pub fn run(self, access: &Access) -> Result<ExitCode> {
        match self {
            Command::Init(a) => init::run(a, access),
            Command::Backup(a) => backup::run(a, access),
            Command::Restore(a) => restore::run(a, access),
            Command::Ls(a) => ls::run(a, access),
            Command::Serve(a) => serve::run(a, access),
            Command::Mount(a) => mount::run(a, access),
            Command::Copy(a) => copy::run(a, access),
            Command::List(a) => browse::run_list(a, access),
            Command::Find(a) => browse::run_find(a, access),
            Command::Diff(a) => browse::run_diff(a, access),
            Command::Dump(a) => browse::run_dump(a, access),
            Command::Tag(a) => browse::run_tag(a, access),
            Command::Stats(a) => stats::run(a, access),
            Command::Delete(a) => delete::run(a, access),
            Command::Forget(a) => forget::run(a, access),
            Command::Completion(a) => completion::completion(a),
            Command::Man(a) => completion::man(a),
            Command::Gc(a) => gc::run(a, access),
            Command::Prune(a) => prune::run(a, access),
            Command::Check(a) => check::run(a, access),
            Command::Repair(a) => repair::run(a, access),
            #[cfg(feature = "lab")]
            Command::Gen(a) => lab::gen(a),
            #[cfg(feature = "lab")]
            Command::Analyze(a) => lab::analyze(a),
            #[cfg(feature = "lab")]
            Command::Trace(a) => lab::trace(a),
            #[cfg(feature = "lab")]
            Command::Experiment(a) => lab::experiment(a),
            Command::Arrange(a) => lifecycle::arrange(a, access),
            Command::Space(a) => lifecycle::space(a, access),
            Command::Index(a) => index::run(a, access),
            Command::Unlock(a) => unlock::run(a, access),
            Command::Key(a) => key::run(a, access),
            Command::Login(a) => session::login(a, access),
            Command::Logout(a) => session::logout(a, access),
        }
    }
}
