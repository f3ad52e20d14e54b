//! `tessera`: the command line over the Tessera engine. It parses
//! arguments, calls the library and prints results (human-readable or JSON).

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use std::ffi::{OsStr, OsString};
use std::process::ExitCode;
use std::time::Duration;
use tessera::backend::{Location, S3Options};
use tessera::parse_size;

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
    repository: Option<OsString>,
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

/// Parses the command line. The repository given by `--repo`/`-r` (or,
/// without them, `TESSERA_REPOSITORY`) takes the place of the REPO argument
/// of the commands whose first argument is the repository: for them, the
/// command line is read without that argument. A REPO argument given
/// although `TESSERA_REPOSITORY` is set wins over it.
fn parse(argv: &[OsString]) -> Result<Cli, clap::Error> {
    // A first reading, tolerant of errors, finds the option (or variable).
    let probe = Cli::command()
        .ignore_errors(true)
        .try_get_matches_from(argv)
        .ok();
    let given = probe.as_ref().and_then(|m| {
        let repo = m.try_get_one::<OsString>("repository").ok().flatten()?;
        Some((repo.clone(), m.value_source("repository")?))
    });
    let from_option = |source: &ValueSource| *source == ValueSource::CommandLine;
    let Some((repo, source)) =
        given.filter(|(repo, source)| !repo.is_empty() || from_option(source))
    else {
        return parse_with(Cli::command(), argv);
    };
    let from_option = from_option(&source);
    if let (true, Err(e)) = (from_option, repo.to_string_lossy().parse::<Location>()) {
        let message = format!(
            "invalid value '{}' for '--repo <REPO>': {e}\n",
            repo.display()
        );
        return Err(clap::Error::raw(ErrorKind::ValueValidation, message));
    }
    match parse_with(without_repo_argument(Cli::command(), &repo), argv) {
        Err(e) if !from_option => parse_with(Cli::command(), argv).map_err(|_| e),
        parsed => parsed,
    }
}

/// `argv` parsed by `cmd` (a form of [`Cli`]'s command line).
fn parse_with(mut cmd: clap::Command, argv: &[OsString]) -> Result<Cli, clap::Error> {
    let mut matches = cmd.try_get_matches_from_mut(argv)?;
    Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))
}

/// `cmd` with the REPO argument of every (sub)command whose first argument
/// is the repository turned into a hidden option whose default is `repo`.
fn without_repo_argument(cmd: clap::Command, repo: &OsStr) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|sub| sub.get_name().to_owned())
        .collect();
    let cmd = names.iter().fold(cmd, |cmd, name| {
        cmd.mut_subcommand(name, |sub| without_repo_argument(sub, repo))
    });
    let first_is_repo = cmd
        .get_positionals()
        .next()
        .is_some_and(|a| a.get_id() == "repo");
    if !first_is_repo {
        return cmd;
    }
    cmd.mut_arg("repo", |a| {
        a.long("repo-argument")
            .hide(true)
            .required(false)
            .default_value(repo.to_os_string())
    })
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
    let argv: Vec<OsString> = std::env::args_os().collect();
    let parsed = parse(&argv);
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
