//! `tessera`: the command line over the Tessera engine. It parses
//! arguments, calls the library and prints results (human-readable or JSON).

use clap::Parser;
use std::process::ExitCode;
use std::time::Duration;
use tessera::backend::S3Options;
use tessera::util::units::parse_size;

mod commands;
mod hints;
mod output;
mod progress;
mod repo_open;
mod secrets;
use commands::Command;
use secrets::{Access, PasswordArgs, Transfer};

/// Tessera: a deduplicating backup store.
#[derive(Parser)]
#[command(name = "tessera", version, about, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// When the repository is locked by another process, wait up to this
    /// long for it (e.g. `30s`, `5m`, `1h`) instead of failing at once.
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_wait, default_value = "0s")]
    wait: Duration,
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
    match cli.command.run(&access) {
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
