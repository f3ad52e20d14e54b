//! `tessera ls`: the entries of a tree backup.

use anyhow::{Context, Result};
use clap::Args;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tessera::backend::{Location, LockMode};
use tessera::format::snapshot::BackupId;
use tessera::tree::catalog::{Entry, Kind};
use tessera::tree::list_tree;
use tessera::Repository;

use super::browse;
use crate::repo_open::{backup_id, open};
use crate::secrets::Access;

/// The arguments of `tessera ls`.
#[derive(Args)]
pub struct LsArgs {
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
}

/// Runs `tessera ls`.
pub fn run(args: LsArgs, access: &Access) -> Result<ExitCode> {
    let LsArgs {
        repo,
        id,
        path,
        long,
        recursive,
        json,
    } = args;
    let r = open(&repo, LockMode::Read, access)?;
    let id = backup_id(&r, &id)?;
    ls_cmd(&r, id, path.as_deref(), long, recursive, json)?;
    Ok(ExitCode::SUCCESS)
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

/// The name of an entry's kind in `ls --json` and `find`.
pub fn kind_name(k: Kind) -> &'static str {
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
pub fn entry_json(e: &Entry) -> serde_json::Value {
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
