//! What the command line says besides its results: progress bars on
//! standard error (only when it is a terminal), silenced by `--quiet`,
//! and with `--verbose` the timing of every phase of a maintenance
//! operation (check, gc, prune, arrange, repair).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tessera::backup::TreeBackupOptions;
use tessera::{ByteProgress, Progress, Unit};

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

/// Prints a summary — what a command did, as opposed to the results it
/// was asked for — on standard output, like `println!`, unless `--quiet`
/// was given. Errors and warnings are not summaries: they go to standard
/// error whatever the verbosity.
macro_rules! summary {
    ($($arg:tt)*) => {
        if !$crate::progress::quiet() {
            println!($($arg)*);
        }
    };
}
pub(crate) use summary;

/// Like [`summary!`], on standard error (the summary of a command whose
/// standard output is data: a restore or a tar stream to `-`).
macro_rules! summary_err {
    ($($arg:tt)*) => {
        if !$crate::progress::quiet() {
            eprintln!($($arg)*);
        }
    };
}
pub(crate) use summary_err;

/// Whether progress is drawn: standard error is a terminal and the
/// command is not quiet.
fn drawn() -> bool {
    !quiet() && io::stderr().is_terminal()
}

/// The style of a bar of bytes whose total is known: bytes, percentage, rate, ETA.
const BYTES_OF_TOTAL: &str =
    "{bar:40} {bytes}/{total_bytes} ({percent}%) {bytes_per_sec} eta {eta}";
/// The style of a bar of bytes whose total is not known (yet).
const BYTES_SO_FAR: &str = "{spinner} {bytes} {bytes_per_sec}";

/// A bar counting bytes towards `total` (or a spinner when unknown), for
/// backups and restores; hidden when progress is not drawn.
pub fn bytes_bar(total: Option<u64>) -> ProgressBar {
    if !drawn() {
        return ProgressBar::hidden();
    }
    match total {
        Some(n) => ProgressBar::new(n).with_style(style(BYTES_OF_TOTAL)),
        None => ProgressBar::new_spinner().with_style(style(BYTES_SO_FAR)),
    }
}

/// Gives `bar` (drawn or hidden) the total `bytes`: from then on it shows
/// the percentage and the estimated time left.
fn set_total(bar: &ProgressBar, bytes: u64) {
    // (A scan that ends after its backup finds the bar finished.)
    if bar.is_hidden() || bar.is_finished() {
        return;
    }
    // A backup's stream also holds its catalog: never below what is done.
    bar.set_length(bytes.max(bar.position()));
    bar.set_style(style(BYTES_OF_TOTAL));
}

/// A bar of bytes that learns its total on the way: a restore tells it
/// ([`ByteProgress::total`]), a tree backup's scan finds it
/// ([`Bar::tree_backup`]). Dereferences to its [`ProgressBar`].
pub struct Bar {
    bar: ProgressBar,
    /// Set when the bar is dropped: a scan still running stops.
    stop: Arc<AtomicBool>,
}

impl Bar {
    /// A bar of bytes towards `total`, when known.
    pub fn new(total: Option<u64>) -> Bar {
        Bar {
            bar: bytes_bar(total),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The bar of a tree backup of `paths` with `options`: when drawn, a
    /// thread walks the paths beside the backup ([`tessera::tree::scan`])
    /// and gives the bar the bytes to read once it has counted them.
    pub fn tree_backup(paths: &[PathBuf], options: &TreeBackupOptions) -> Bar {
        Bar::new(None).scanning(paths, options)
    }

    /// This bar, given its total by a scan of `paths` on a thread of its
    /// own when it is drawn.
    fn scanning(self, paths: &[PathBuf], options: &TreeBackupOptions) -> Bar {
        if !self.bar.is_hidden() {
            let (bar, stop) = (self.bar.clone(), self.stop.clone());
            let (paths, options) = (paths.to_vec(), options.clone());
            // Not joined: it stops at its next object once the bar is dropped.
            std::thread::spawn(move || {
                if let Ok(Some(total)) = tessera::tree::scan::scan(&paths, &options, &stop) {
                    set_total(&bar, total);
                }
            });
        }
        self
    }
}

impl std::ops::Deref for Bar {
    type Target = ProgressBar;
    fn deref(&self) -> &ProgressBar {
        &self.bar
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl ByteProgress for Bar {
    fn total(&self, bytes: u64) {
        set_total(&self.bar, bytes);
    }
    fn done(&self, bytes: u64) {
        self.bar.set_position(bytes);
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

#[cfg(test)]
mod tests {
    use super::*;
    use indicatif::{ProgressDrawTarget, TermLike};

    /// A terminal that keeps what is drawn on it.
    #[derive(Clone, Debug, Default)]
    struct Screen(Arc<Mutex<String>>);

    impl TermLike for Screen {
        fn width(&self) -> u16 {
            120
        }
        fn move_cursor_up(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> io::Result<()> {
            self.write_str(&format!("{s}\n"))
        }
        fn write_str(&self, s: &str) -> io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> io::Result<()> {
            self.write_str("\n")
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A bar of bytes drawn on a [`Screen`], total unknown.
    fn drawn_bar() -> (Bar, Screen) {
        let screen = Screen::default();
        let target = ProgressDrawTarget::term_like(Box::new(screen.clone()));
        let bar = ProgressBar::with_draw_target(None, target).with_style(style(BYTES_SO_FAR));
        let stop = Arc::new(AtomicBool::new(false));
        (Bar { bar, stop }, screen)
    }

    /// The last line drawn.
    fn last_line(screen: &Screen) -> String {
        let text = screen.0.lock().unwrap();
        text.lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn a_restore_that_tells_its_total_shows_bytes_percentage_and_eta() {
        let (bar, screen) = drawn_bar();
        let progress: &dyn ByteProgress = &bar;
        progress.done(1 << 20);
        bar.tick();
        let before = last_line(&screen);
        assert!(
            before.contains("1.00 MiB") && !before.contains('%'),
            "{before}"
        );
        progress.total(4 << 20);
        progress.done(2 << 20);
        bar.tick();
        let line = last_line(&screen);
        assert!(
            line.contains("2.00 MiB/4.00 MiB") && line.contains("(50%)") && line.contains("eta"),
            "{line}"
        );
    }

    #[test]
    fn a_tree_backup_gets_its_total_from_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![0; 3 << 20]).unwrap();
        std::fs::write(dir.path().join("b"), vec![0; 1 << 20]).unwrap();
        let (bar, screen) = drawn_bar();
        let bar = bar.scanning(&[dir.path().to_path_buf()], &TreeBackupOptions::default());
        let waited = Instant::now();
        while bar.length().is_none() {
            assert!(waited.elapsed().as_secs() < 30, "no total from the scan");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(bar.length(), Some(4 << 20));
        bar.set_position(1 << 20);
        bar.tick();
        let line = last_line(&screen);
        assert!(line.contains("(25%)") && line.contains("eta"), "{line}");
    }
}
