//! What the command line says besides its results: progress bars on
//! standard error (only when it is a terminal), silenced by `--quiet`,
//! and with `--verbose` the timing of every phase of a maintenance
//! operation (check, gc, prune, arrange, repair).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::{self, IsTerminal};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use tessera::progress::{Progress, Unit};

/// How much the command says: `-q` (quiet), default, `-v`, `-vv`….
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    /// Errors and the results asked for only.
    Quiet,
    /// Progress bars and summaries.
    Normal,
    /// Also per-phase timings and counts.
    Verbose,
}

static VERBOSITY: OnceLock<Verbosity> = OnceLock::new();

/// Sets the verbosity from `--quiet` and the count of `--verbose` (once,
/// at start-up).
pub fn set_verbosity(quiet: bool, verbose: u8) {
    let v = match (quiet, verbose) {
        (true, _) => Verbosity::Quiet,
        (false, 0) => Verbosity::Normal,
        (false, _) => Verbosity::Verbose,
    };
    // Set once from main; a second call cannot happen.
    let _ = VERBOSITY.set(v);
}

/// The verbosity chosen on the command line.
pub fn verbosity() -> Verbosity {
    VERBOSITY.get().copied().unwrap_or(Verbosity::Normal)
}

/// Whether `--quiet` was given: summaries and other non-error chatter are
/// left out.
pub fn quiet() -> bool {
    verbosity() == Verbosity::Quiet
}

/// Whether progress is drawn: standard error is a terminal and the
/// command is not quiet.
fn drawn() -> bool {
    !quiet() && io::stderr().is_terminal()
}

/// A bar counting bytes towards `total` (or a spinner when unknown), for
/// backups and restores; hidden when progress is not drawn.
pub fn bytes_bar(total: Option<u64>) -> ProgressBar {
    if !drawn() {
        return ProgressBar::hidden();
    }
    match total {
        Some(n) => ProgressBar::new(n).with_style(style(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )),
        None => ProgressBar::new_spinner().with_style(style("{spinner} {bytes} {bytes_per_sec}")),
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// Draws the phases a library operation reports (one bar a phase, with
/// its unit and, when the total is known, an ETA) and, with `--verbose`,
/// prints each phase's count and time when it ends.
#[derive(Default)]
pub struct Phases {
    current: Mutex<Option<Current>>,
}

struct Current {
    name: String,
    unit: Unit,
    bar: ProgressBar,
    started: Instant,
}

impl Phases {
    fn current(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Progress for Phases {
    fn begin(&self, name: &str, unit: Unit, total: Option<u64>) {
        let bar = if !drawn() {
            ProgressBar::hidden()
        } else {
            let unit = unit.name();
            match total {
                Some(n) => ProgressBar::new(n).with_style(style(&format!(
                    "{{prefix}} {{bar:30}} {{pos}}/{{len}} {unit} {{per_sec}} eta {{eta}}"
                ))),
                None => ProgressBar::new_spinner()
                    .with_style(style(&format!("{{prefix}} {{spinner}} {{pos}} {unit}"))),
            }
            .with_prefix(name.to_string())
        };
        *self.current() = Some(Current {
            name: name.to_string(),
            unit,
            bar,
            started: Instant::now(),
        });
    }

    fn advance(&self, done: u64) {
        if let Some(c) = self.current().as_ref() {
            c.bar.set_position(done);
        }
    }

    fn end(&self, done: u64) {
        if let Some(c) = self.current().take() {
            c.bar.finish_and_clear();
            if verbosity() >= Verbosity::Verbose {
                eprintln!(
                    "{}: {done} {} in {:.2} s",
                    c.name,
                    c.unit.name(),
                    c.started.elapsed().as_secs_f64()
                );
            }
        }
    }
}
