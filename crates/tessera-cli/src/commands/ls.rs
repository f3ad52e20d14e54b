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
use tessera::tree::{list_tree, EntryRecord};
use tessera::Repository;

use crate::output::json_record;
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
        if json {
            let written = json_record(&mut out, first, &EntryRecord::of(e));
            first = false;
            return written;
        }
        let line = if long {
            format!("{}\n", entry_long(e))
        } else {
            format!("/{}\n", String::from_utf8_lossy(&e.path))
        };
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

/// The mode column of `ls -l`: the kind's letter `kind`, then read, write
/// and execute for the owner, the group and others, with setuid and setgid
/// as `s` in the owner's and the group's execute place (`S` without
/// execute) and the sticky bit as `t` in others' (`T`).
fn mode_text(kind: char, mode: u32) -> String {
    let mut text = String::with_capacity(10);
    text.push(kind);
    // (shift of the class's bits, its special bit, the special's letter)
    for (shift, special, letter) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let bits = (mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(match (mode & special != 0, bits & 1 != 0) {
            (true, true) => letter,
            (true, false) => letter.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    text
}

/// A device number (`st_rdev`, Linux's encoding, as backed up) as `ls -l`
/// shows it: `major, minor`.
fn device_text(rdev: u64) -> String {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & 0xffff_f000);
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xffff_ff00);
    format!("{major}, {minor}")
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
    let mode = mode_text(kind, e.mode);
    // A device's size column holds its major and minor numbers, as in `ls -l`.
    let size = match e.kind {
        Kind::CharDevice | Kind::BlockDevice => device_text(e.rdev),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_show_the_special_bits_as_ls_does() {
        for (kind, mode, text) in [
            ('-', 0o644, "-rw-r--r--"),
            ('-', 0o4755, "-rwsr-xr-x"),
            ('-', 0o4644, "-rwSr--r--"),
            ('-', 0o2755, "-rwxr-sr-x"),
            ('-', 0o2745, "-rwxr-Sr-x"),
            ('d', 0o1777, "drwxrwxrwt"),
            ('d', 0o1770, "drwxrwx--T"),
            ('-', 0o7777, "-rwsrwsrwt"),
            ('-', 0o7000, "---S--S--T"),
            ('c', 0o620, "crw--w----"),
        ] {
            assert_eq!(mode_text(kind, mode), text, "{mode:o}");
        }
    }

    #[test]
    fn device_numbers_are_major_and_minor() {
        // /dev/null (1, 3), /dev/sda1 (8, 1), /dev/tty5 (4, 5).
        assert_eq!(device_text(0x103), "1, 3");
        assert_eq!(device_text(0x801), "8, 1");
        assert_eq!(device_text(0x405), "4, 5");
        // Large numbers use the high bits (glibc's makedev).
        let makedev = |major: u64, minor: u64| {
            ((major & 0xfff) << 8)
                | ((major & !0xfff) << 32)
                | (minor & 0xff)
                | ((minor & !0xff) << 12)
        };
        assert_eq!(device_text(makedev(259, 65536)), "259, 65536");
        assert_eq!(device_text(makedev(4097, 300)), "4097, 300");
        assert_eq!(device_text(0), "0, 0");
    }
}
