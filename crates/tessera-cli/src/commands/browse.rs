//! Printing of the browsing commands: `list`, `find`, `diff`, `dump`,
//! `restore --tar` and `tag` (the work is done by the library).

use crate::output::{
    data_stdout, human, json_record, json_text, print_json, Keys, EXIT_INCOMPLETE,
};
use crate::progress::{quiet, summary, summary_err};
use crate::repo_open::{backup_id, open};
use crate::secrets::Access;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tessera::backend::{Location, LockMode};
use tessera::commands::list::BackupFilter;
use tessera::commands::tags::{retag, TagChange};
use tessera::format::snapshot::{BackupId, Snapshot};
use tessera::restore::output::write_to_path;
use tessera::restore::{ExistingFile, RestoreOptions};
use tessera::tree::{
    diff, dump, find, write_tar, ChangeKind, ChangeRecord, Dumped, EntryRecord, TarScope,
    TreeRestoreStats,
};
use tessera::Repository;

/// Which backups a command takes.
#[derive(Args, Clone, Debug, Default)]
pub struct FilterArgs {
    /// Only backups made on this host (repeatable: any of them).
    #[arg(long, value_name = "HOST")]
    host: Vec<String>,
    /// Only tree backups of this path, as given to the backup (absolute;
    /// repeatable: any of them).
    #[arg(long, value_name = "PATH")]
    path: Vec<String>,
    /// Only backups with this tag; `a,b` means both (repeatable: any of them).
    #[arg(long, value_name = "TAG[,TAG...]")]
    tag: Vec<String>,
    /// Only backups of this source lineage (repeatable: any of them).
    #[arg(long, value_name = "SOURCE")]
    source: Vec<String>,
}

impl FilterArgs {
    fn filter(self) -> BackupFilter {
        BackupFilter {
            hosts: self.host,
            paths: self.path,
            tags: self.tag,
            sources: self.source,
        }
    }
}

/// `time` (seconds since the epoch) in the local time zone: ISO 8601 with
/// the offset (`2026-11-25T23:04:05+01:00`) when `iso`, else
/// `2026-11-25 23:04:05`.
pub fn local_time(time: i64, iso: bool) -> String {
    let format = if iso {
        "%Y-%m-%dT%H:%M:%S%:z"
    } else {
        "%Y-%m-%d %H:%M:%S"
    };
    match jiff::Timestamp::from_second(time) {
        Ok(t) => t
            .to_zoned_datetime(jiff::tz::TimeZone::system())
            .strftime(format)
            .to_string(),
        Err(_) => format!("{time}s"),
    }
}

fn snapshot_time(s: &Snapshot, iso: bool) -> String {
    local_time(i64::try_from(s.time).unwrap_or(i64::MAX), iso)
}

fn paths_text(s: &Snapshot) -> String {
    s.tree
        .as_ref()
        .map(|t| t.paths.join(","))
        .unwrap_or_else(|| "-".into())
}

/// `tessera list`.
pub fn list(repo: &Location, json: bool, filter: FilterArgs, access: &Access) -> Result<()> {
    let r = open(repo, LockMode::Read, access)?;
    let filter = filter.filter();
    let listed = r.listing()?;
    let filtering = !(filter.hosts.is_empty()
        && filter.paths.is_empty()
        && filter.tags.is_empty()
        && filter.sources.is_empty());
    // A damaged backup is shown unless filtering (it cannot be matched).
    let shown = listed.into_iter().filter(|l| match &l.snapshot {
        Ok(s) => filter.matches(s),
        Err(_) => !filtering,
    });
    if json {
        let shown: Vec<tessera::repo::Listed> = shown.collect();
        let records: Vec<ListRecord> = shown.iter().map(ListRecord::of).collect();
        return print_json(&records, Keys::Sorted, false);
    }
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "{:>6}  {:<19}  {:<12}  {:>8}  {:>10}  {:>10}  {:<20}  {:<12}  label",
        "id", "time", "host", "files", "size", "stored", "paths", "tags"
    )?;
    for l in shown {
        match l.snapshot {
            Ok(s) => writeln!(
                out,
                "{:>6}  {:<19}  {:<12}  {:>8}  {:>10}  {:>10}  {:<20}  {:<12}  {}",
                s.id,
                snapshot_time(&s, false),
                if s.host.is_empty() { "-" } else { &s.host },
                s.tree
                    .as_ref()
                    .map_or_else(|| "-".into(), |t| t.files.to_string()),
                human(
                    s.tree
                        .as_ref()
                        .map_or(s.logical_bytes, |t| t.catalog_offset)
                ),
                human(s.stats.stored_bytes),
                match s.tree {
                    Some(_) => paths_text(&s),
                    None => format!("({})", s.source),
                },
                if s.tags.is_empty() {
                    "-".into()
                } else {
                    s.tags.join(",")
                },
                s.label
            )?,
            Err(reason) => writeln!(out, "{:>6}  DAMAGED: {reason}", l.id)?,
        }
    }
    Ok(())
}

/// A backup as `list --json` shows it (a damaged one: its id and why).
#[derive(serde::Serialize)]
#[serde(untagged)]
enum ListRecord<'a> {
    Backup {
        id: BackupId,
        time: u64,
        local_time: String,
        label: &'a str,
        source: &'a str,
        host: &'a str,
        tags: &'a [String],
        logical_bytes: u64,
        stored_bytes: u64,
        chunks: u64,
        #[serde(flatten)]
        tree: Option<ListedTree<'a>>,
    },
    Damaged {
        id: BackupId,
        damaged: &'a str,
    },
}

/// What `list --json` adds for a tree backup.
#[derive(serde::Serialize)]
struct ListedTree<'a> {
    paths: &'a [String],
    files: u64,
    entries: u64,
    file_bytes: u64,
}

impl<'a> ListRecord<'a> {
    fn of(l: &'a tessera::repo::Listed) -> Self {
        match &l.snapshot {
            Ok(s) => ListRecord::Backup {
                id: s.id,
                time: s.time,
                local_time: snapshot_time(s, true),
                label: &s.label,
                source: &s.source,
                host: &s.host,
                tags: &s.tags,
                logical_bytes: s.logical_bytes,
                stored_bytes: s.stats.stored_bytes,
                chunks: s.stats.chunks,
                tree: s.tree.as_ref().map(|t| ListedTree {
                    paths: &t.paths,
                    files: t.files,
                    entries: t.entries,
                    file_bytes: t.catalog_offset,
                }),
            },
            Err(reason) => ListRecord::Damaged {
                id: l.id,
                damaged: reason,
            },
        }
    }
}

/// An entry `find --json` found: its record, and the backup it is in.
#[derive(serde::Serialize)]
struct Found {
    #[serde(flatten)]
    entry: EntryRecord,
    backup: BackupId,
    backup_time: String,
}

/// Writes `text` to the buffered stdout, as an engine output error on failure.
fn emit(out: &mut impl Write, text: &str) -> tessera::Result<()> {
    out.write_all(text.as_bytes())
        .map_err(|err| tessera::Error::Output {
            what: "stdout".into(),
            source: err,
        })
}

/// `tessera find`.
pub fn find_cmd(
    repo: &Location,
    pattern: &str,
    json: bool,
    filter: FilterArgs,
    access: &Access,
) -> Result<ExitCode> {
    let r = open(repo, LockMode::Read, access)?;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut first = true;
    if json {
        write!(out, "[")?;
    }
    let stats = find(&r, pattern, &filter.filter(), |snap, e| {
        if json {
            let found = Found {
                entry: EntryRecord::of(e),
                backup: snap.id,
                backup_time: snapshot_time(snap, true),
            };
            let written = json_record(&mut out, first, &found);
            first = false;
            return written;
        }
        let text = format!(
            "{:>6}  {}  {:<7} {:>12}  /{}\n",
            snap.id,
            snapshot_time(snap, false),
            e.kind.name(),
            e.size,
            String::from_utf8_lossy(&e.path)
        );
        emit(&mut out, &text)
    })
    .with_context(|| format!("searching {} for {pattern:?}", repo))?;
    if json {
        writeln!(out, "]")?;
    }
    out.flush()?;
    if !json {
        summary_err!(
            "{} match(es) in {} of {} tree backup(s)",
            stats.matches,
            stats.backups_matching,
            stats.backups_searched
        );
    }
    for (id, why) in &stats.skipped {
        eprintln!("tessera: warning: backup {id} not searched: {why}");
    }
    Ok(match stats.skipped.is_empty() {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(EXIT_INCOMPLETE),
    })
}

fn change_letter(k: ChangeKind) -> char {
    match k {
        ChangeKind::Added => '+',
        ChangeKind::Removed => '-',
        ChangeKind::Changed => 'M',
        ChangeKind::Metadata => 'U',
    }
}

/// `tessera diff`.
pub fn diff_cmd(r: &Repository, from: BackupId, to: BackupId, json: bool) -> Result<()> {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if json {
        write!(out, "{{\"from\":{from},\"to\":{to},\"changes\":[")?;
    }
    let mut first = true;
    let stats = diff(r, from, to, |c| {
        if json {
            let written = json_record(&mut out, first, &ChangeRecord::of(c));
            first = false;
            return written;
        }
        let text = format!(
            "{}    /{}\n",
            change_letter(c.kind),
            String::from_utf8_lossy(c.path())
        );
        emit(&mut out, &text)
    })
    .with_context(|| format!("comparing backups {from} and {to}"))?;
    if json {
        let stats = json_text(&stats, Keys::Declared, false)?;
        writeln!(out, "],\"stats\":{stats}}}")?;
    } else {
        writeln!(
            out,
            "{} added ({}), {} removed ({}), {} changed, {} metadata only, {} unchanged",
            stats.added,
            human(stats.bytes_added),
            stats.removed,
            human(stats.bytes_removed),
            stats.changed,
            stats.metadata,
            stats.unchanged
        )?;
    }
    out.flush()?;
    Ok(())
}

/// `tessera dump`: to standard output, which must not be a terminal for a tar stream.
pub fn dump_cmd(r: &Repository, id: BackupId, path: &Path, options: &RestoreOptions) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = data_stdout();
    let shown = path.display();
    let (kind, _) = dump(r, id, path.as_os_str().as_bytes(), &mut out, options)
        .with_context(|| format!("dumping {shown} of backup {id}"))?;
    out.flush()?;
    if kind == Dumped::Tar && io::stdout().is_terminal() {
        eprintln!("tessera: note: {shown} is a directory: its tar stream was written");
    }
    Ok(())
}

/// `restore ID --tar OUTPUT`: the selected entries as a tar stream to
/// standard output (`-`) or a new file.
pub fn tar_restore_cmd(
    r: &Repository,
    id: BackupId,
    output: &str,
    scope: &TarScope,
    existing: ExistingFile,
    options: &RestoreOptions,
    json: bool,
) -> Result<()> {
    let stats: TreeRestoreStats = if output == "-" {
        if io::stdout().is_terminal() {
            bail!("refusing to write a tar stream to a terminal: redirect standard output");
        }
        let mut out = data_stdout();
        let s = write_tar(r, id, scope, &mut out, options)?;
        out.flush()?;
        s
    } else {
        write_to_path(Path::new(output), existing, |out| {
            write_tar(r, id, scope, out, options)
        })?
    }
    .clone();
    let text = if json {
        json_text(&stats, Keys::Declared, false)?
    } else {
        format!(
            "wrote backup {} as tar to {output}: {} files ({}), {} directories, {} symbolic links, {} containers read ({} for the catalog), {:.2} s",
            stats.id,
            stats.files,
            human(stats.bytes_restored),
            stats.dirs,
            stats.symlinks,
            stats.containers_read,
            stats.catalog_containers_read,
            stats.seconds
        )
    };
    if quiet() && !json {
        // The summary is chatter.
    } else if output == "-" {
        eprintln!("{text}");
    } else {
        println!("{text}");
    }
    Ok(())
}

/// `tessera tag`.
pub fn tag_cmd(r: &Repository, ids: &[BackupId], change: &TagChange, json: bool) -> Result<()> {
    let done = retag(r, ids, change).context("changing tags")?;
    if json {
        return print_json(&done, Keys::Declared, false);
    }
    for t in done {
        let list = |tags: &[String]| match tags.is_empty() {
            true => "(none)".to_string(),
            false => tags.join(","),
        };
        match t.changed {
            true => summary!(
                "backup {}: tags {} (were {})",
                t.id,
                list(&t.tags),
                list(&t.old)
            ),
            false => summary!("backup {}: tags {} (unchanged)", t.id, list(&t.tags)),
        }
    }
    Ok(())
}

/// The arguments of `tessera list`.
#[derive(Args)]
pub struct ListArgs {
    /// The repository.
    repo: Location,
    #[command(flatten)]
    filter: FilterArgs,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera list`.
pub fn run_list(args: ListArgs, access: &Access) -> Result<ExitCode> {
    let ListArgs { repo, filter, json } = args;
    list(&repo, json, filter, access)?;
    Ok(ExitCode::SUCCESS)
}

/// The arguments of `tessera find`.
#[derive(Args)]
pub struct FindArgs {
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
}

/// Runs `tessera find`.
pub fn run_find(args: FindArgs, access: &Access) -> Result<ExitCode> {
    let FindArgs {
        repo,
        pattern,
        filter,
        json,
    } = args;
    find_cmd(&repo, &pattern, json, filter, access)
}

/// The arguments of `tessera diff`.
#[derive(Args)]
pub struct DiffArgs {
    /// The repository.
    repo: Location,
    /// The first backup (or `latest`).
    id1: String,
    /// The second backup (or `latest`).
    id2: String,
    /// Print one JSON object: the changes and the counts.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera diff`.
pub fn run_diff(args: DiffArgs, access: &Access) -> Result<ExitCode> {
    let DiffArgs {
        repo,
        id1,
        id2,
        json,
    } = args;
    let r = open(&repo, LockMode::Read, access)?;
    let (from, to) = (backup_id(&r, &id1)?, backup_id(&r, &id2)?);
    diff_cmd(&r, from, to, json)?;
    Ok(ExitCode::SUCCESS)
}

/// The arguments of `tessera dump`.
#[derive(Args)]
pub struct DumpArgs {
    /// The repository.
    repo: Location,
    /// The backup id (or `latest`).
    id: String,
    /// The path in the backup (absolute, as `ls` shows it; `/`: the whole tree).
    path: PathBuf,
}

/// Runs `tessera dump`.
pub fn run_dump(args: DumpArgs, access: &Access) -> Result<ExitCode> {
    let DumpArgs { repo, id, path } = args;
    let r = open(&repo, LockMode::Read, access)?;
    let id = backup_id(&r, &id)?;
    dump_cmd(&r, id, &path, &RestoreOptions::default())?;
    Ok(ExitCode::SUCCESS)
}

/// The arguments of `tessera tag`.
#[derive(Args)]
pub struct TagArgs {
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
}

/// Runs `tessera tag`.
pub fn run_tag(args: TagArgs, access: &Access) -> Result<ExitCode> {
    let TagArgs {
        repo,
        ids,
        add,
        remove,
        set,
        json,
    } = args;
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
    tag_cmd(&r, &ids, &change, json)?;
    Ok(ExitCode::SUCCESS)
}
