//! Progress of long maintenance operations (check, GC and prune, arrange,
//! repair), reported through the [`Progress`] trait: the library counts,
//! the caller draws (the command line draws a bar on a terminal). An
//! operation runs in named phases, each counting one [`Unit`] towards a
//! total when it is known beforehand.

use std::sync::Mutex;

/// What a phase counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Repository objects (snapshots, recipes, volumes, categories…).
    Objects,
    /// Containers.
    Containers,
    /// Backups.
    Backups,
    /// Arranging rounds.
    Rounds,
}

impl Unit {
    /// The unit's name in the plural, for display.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Objects => "objects",
            Unit::Containers => "containers",
            Unit::Backups => "backups",
            Unit::Rounds => "rounds",
        }
    }
}

/// Receives the progress of an operation. Within a phase, `advance` is
/// called with counts that never decrease; `end` closes the phase with
/// its final count (the total, when the phase ran to completion).
pub trait Progress: Sync {
    /// Phase `name` begins, counting `unit`s up to `total` when known.
    fn begin(&self, name: &str, unit: Unit, total: Option<u64>);
    /// `done` units of the current phase are done.
    fn advance(&self, done: u64);
    /// The current phase ends, `done` units done.
    fn end(&self, done: u64);
}

/// Receives the progress of a restore in bytes: how many it will write,
/// once known, then how many it wrote so far. A closure `Fn(u64)` receives
/// the counts alone.
pub trait ByteProgress: Sync {
    /// The restore will write `bytes` bytes in all (called before the
    /// first [`ByteProgress::done`] of that restore).
    fn total(&self, bytes: u64) {
        let _ = bytes;
    }
    /// `bytes` bytes are written so far (never decreasing).
    fn done(&self, bytes: u64);
}

impl<F: Fn(u64) + Sync> ByteProgress for F {
    fn done(&self, bytes: u64) {
        self(bytes)
    }
}

/// Progress reported nowhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn begin(&self, _: &str, _: Unit, _: Option<u64>) {}
    fn advance(&self, _: u64) {}
    fn end(&self, _: u64) {}
}

/// One phase being counted: [`Phase::add`] may be called from several
/// threads; the counts reach the [`Progress`] in increasing order.
pub struct Phase<'a> {
    sink: &'a dyn Progress,
    done: Mutex<u64>,
}

impl<'a> Phase<'a> {
    /// Begins phase `name` on `sink`.
    pub fn begin(sink: &'a dyn Progress, name: &str, unit: Unit, total: Option<u64>) -> Self {
        sink.begin(name, unit, total);
        Phase {
            sink,
            done: Mutex::new(0),
        }
    }

    /// `n` more units are done.
    pub fn add(&self, n: u64) {
        // A poisoned count only means another thread panicked mid-report:
        // the count itself is still a number.
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        *done += n;
        self.sink.advance(*done);
    }

    /// Ends the phase.
    pub fn end(self) {
        let done = self.done.into_inner().unwrap_or_else(|e| e.into_inner());
        self.sink.end(done);
    }
}

/// A [`Progress`] that records every call, for tests of the operations
/// that report progress.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Recorder {
    /// Every phase: name, unit, total, counts advanced, final count.
    pub phases: Mutex<Vec<RecordedPhase>>,
}

/// One phase a [`Recorder`] saw.
#[cfg(test)]
#[derive(Clone, Debug)]
pub(crate) struct RecordedPhase {
    pub name: String,
    pub unit: Unit,
    pub total: Option<u64>,
    pub advances: Vec<u64>,
    pub end: Option<u64>,
}

#[cfg(test)]
impl Progress for Recorder {
    fn begin(&self, name: &str, unit: Unit, total: Option<u64>) {
        self.phases.lock().unwrap().push(RecordedPhase {
            name: name.to_string(),
            unit,
            total,
            advances: Vec::new(),
            end: None,
        });
    }
    fn advance(&self, done: u64) {
        let mut phases = self.phases.lock().unwrap();
        let last = phases.last_mut().expect("advance outside a phase");
        assert!(last.end.is_none(), "advance after the end of {}", last.name);
        last.advances.push(done);
    }
    fn end(&self, done: u64) {
        let mut phases = self.phases.lock().unwrap();
        let last = phases.last_mut().expect("end outside a phase");
        assert!(last.end.is_none(), "{} ended twice", last.name);
        last.end = Some(done);
    }
}

#[cfg(test)]
impl Recorder {
    /// Asserts that every phase ended, advanced monotonically, and ended
    /// at its total when it had one; returns the phases.
    pub fn assert_well_formed(&self) -> Vec<RecordedPhase> {
        let phases = self.phases.lock().unwrap().clone();
        assert!(!phases.is_empty(), "no phase reported");
        for p in &phases {
            assert!(
                p.advances.windows(2).all(|w| w[0] <= w[1]),
                "{}: counts decrease: {:?}",
                p.name,
                p.advances
            );
            let end = p.end.unwrap_or_else(|| panic!("{} never ended", p.name));
            assert!(
                p.advances.last().is_none_or(|&l| l <= end),
                "{}: ends below its last count",
                p.name
            );
            if let Some(total) = p.total {
                assert_eq!(end, total, "{}: final count is not the total", p.name);
            }
        }
        phases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_counts_reach_the_sink_in_order_from_many_threads() {
        let rec = Recorder::default();
        let phase = Phase::begin(&rec, "work", Unit::Objects, Some(400));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..100).for_each(|_| phase.add(1)));
            }
        });
        phase.end();
        let phases = rec.assert_well_formed();
        assert_eq!(phases.len(), 1);
        assert_eq!(phases[0].advances.len(), 400);
        assert_eq!(phases[0].end, Some(400));
    }

    /// Backups of three versions of some data into a repository of `layout`.
    fn repo_with_backups(
        dir: &std::path::Path,
        layout: crate::repo::config::Layout,
    ) -> crate::Repository {
        use crate::backup::{backup, BackupOptions};
        let mut config = crate::repo::config::Config::new("t".into());
        config.layout = layout;
        config.arrange = crate::repo::config::Arrange::Manual;
        let repo = crate::Repository::init(&dir.join("r"), config).unwrap();
        for v in 0..3u32 {
            let data: Vec<u8> = (0..200_000u32)
                .map(|i| (i * 7 + v * (i / 50_000)) as u8)
                .collect();
            let options = BackupOptions {
                source: "s".into(),
                ..BackupOptions::default()
            };
            backup(
                &repo,
                crate::backup::Input::Stream {
                    input: &mut &data[..],
                    name: "in",
                },
                &options,
            )
            .map(|o| o.snapshot)
            .unwrap();
        }
        repo
    }

    #[test]
    fn maintenance_operations_report_monotone_phases_ending_at_their_totals() {
        use crate::backend::LockMode;
        use crate::repo::config::Layout;
        let dir = tempfile::tempdir().unwrap();
        let repo = repo_with_backups(dir.path(), Layout::Container);
        let first = repo.backups().unwrap()[0];
        crate::commands::delete::delete_backup(&repo, first).unwrap();
        drop(repo);
        let repo = crate::Repository::open(&dir.path().join("r"), LockMode::Exclusive).unwrap();
        let names = |rec: &Recorder| -> Vec<String> {
            rec.assert_well_formed()
                .into_iter()
                .map(|p| p.name)
                .collect()
        };

        let rec = Recorder::default();
        let options = crate::commands::check::CheckOptions {
            read_data: true,
            ..Default::default()
        };
        let report = crate::commands::check::check_with_progress(&repo, options, &rec).unwrap();
        assert!(report.is_ok());
        let phases = rec.assert_well_formed();
        assert_eq!(phases[0].unit, Unit::Containers);
        assert_eq!(phases[0].end, Some(report.containers));
        assert_eq!(names(&rec), ["containers", "backups"]);

        let rec = Recorder::default();
        let options = crate::commands::prune::PruneOptions {
            max_unused: crate::commands::prune::MaxUnused::Percent(0.0),
            max_repack: None,
            defrag: crate::gc::Defrag::None,
            dry_run: false,
        };
        let report = crate::commands::prune::prune_with_progress(&repo, &options, &rec).unwrap();
        assert!(report.gc.is_some_and(|g| g.containers_reclaimed > 0));
        assert_eq!(
            names(&rec),
            ["mark", "survey", "mark", "select", "sweep", "recipes", "delete"]
        );

        let rec = Recorder::default();
        let options = crate::commands::repair::RepairOptions::default();
        crate::commands::repair::repair_with_progress(&repo, options, &rec).unwrap();
        assert_eq!(names(&rec), ["snapshots", "scan", "recipes"]);

        let dir = tempfile::tempdir().unwrap();
        let repo = repo_with_backups(dir.path(), Layout::Lifecycle);
        drop(repo);
        let repo = crate::Repository::open(&dir.path().join("r"), LockMode::Exclusive).unwrap();
        let rec = Recorder::default();
        let stats = crate::layout::lifecycle::arrange_with_progress(&repo, &rec).unwrap();
        let phases = rec.assert_well_formed();
        assert_eq!(phases.len(), 1);
        assert_eq!(
            (phases[0].unit, phases[0].end),
            (Unit::Rounds, Some(stats.rounds))
        );
        assert!(stats.rounds > 0);
        let rec = Recorder::default();
        let options = crate::commands::check::CheckOptions {
            read_data: true,
            ..Default::default()
        };
        assert!(
            crate::commands::check::check_with_progress(&repo, options, &rec)
                .unwrap()
                .is_ok()
        );
        let phases = rec.assert_well_formed();
        assert!(phases[0].name.starts_with("lineage ") && phases[0].end > Some(0));
    }
}
