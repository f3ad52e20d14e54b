//! What a backup is asked to do, and what it did: the options of every
//! backup, those of a tree backup, and the outcome. A leaf: the front end,
//! both layouts' back ends and the CLI share these types.

use crate::format::compression::Compression;
use crate::format::snapshot::{BackupId, Snapshot};
use crate::layout::lifecycle::ArrangeStats;

/// Options of one backup.
#[derive(Default)]
pub struct BackupOptions<'a> {
    /// Free-form label.
    pub label: String,
    /// Source lineage name.
    pub source: String,
    /// Host name recorded in the snapshot.
    pub host: String,
    /// Tags recorded in the snapshot (sorted and distinct: see
    /// [`crate::commands::tags::normalize`]).
    pub tags: Vec<String>,
    /// Called with the number of input bytes processed so far.
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
    /// The snapshot's time (seconds since the epoch) instead of the
    /// commit's: a copy keeps its original's (`tessera copy`).
    pub time: Option<u64>,
    /// Compression of the chunks this backup stores, instead of the
    /// repository's setting (only in a repository that compresses).
    pub compression: Option<Compression>,
    /// Lifecycle layout: memory of the previous version's NDF table as the
    /// backup looks it up, and of each sort of the arranging that follows
    /// the backup (`None`: [`crate::gc::DEFAULT_SORT_BUDGET`]).
    pub sort_budget: Option<u64>,
}

/// What to back up of the given paths (with the `cli` feature, the tree
/// options of `tessera backup`: their help is the command line's).
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TreeBackupOptions {
    /// Gitignore-style patterns of paths to leave out (`*.tmp`, `cache/`,
    /// `/home/ann/big`: a leading `/` anchors at the file-system root).
    #[cfg_attr(
        feature = "cli",
        arg(
            id = "exclude",
            long = "exclude",
            value_name = "PATTERN",
            help = "Tree backups: leave out paths matching this gitignore-style pattern (repeatable; a leading `/` anchors at the file-system root)"
        )
    )]
    pub excludes: Vec<String>,
    /// Patterns like `excludes`, matched regardless of case.
    #[cfg_attr(
        feature = "cli",
        arg(
            id = "iexclude",
            long = "iexclude",
            value_name = "PATTERN",
            help = "Tree backups: like --exclude, ignoring case (repeatable)"
        )
    )]
    pub iexcludes: Vec<String>,
    /// Leave out a directory holding a file of one of these names.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            value_name = "NAME",
            help = "Tree backups: leave out directories holding a file of this name (repeatable)"
        )
    )]
    pub exclude_if_present: Vec<String>,
    /// Leave out a directory holding a `CACHEDIR.TAG` with the standard signature.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            help = "Tree backups: leave out directories holding a CACHEDIR.TAG with the standard signature"
        )
    )]
    pub exclude_caches: bool,
    /// Leave out regular files larger than this many bytes.
    #[cfg_attr(feature = "cli", arg(
        long,
        value_name = "SIZE",
        value_parser = crate::parse_size,
        help = "Tree backups: leave out regular files larger than SIZE (e.g. 100MiB)"
    ))]
    pub exclude_larger_than: Option<u64>,
    /// Back up what symbolic links point to instead of the links.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            help = "Tree backups: back up what symbolic links point to, not the links"
        )
    )]
    pub follow_symlinks: bool,
    /// Back up standard input as one regular file of this path (relative
    /// or absolute; `backup - --stdin-name NAME`) instead of the paths.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            value_name = "NAME",
            help = "With `-`: back up standard input as a tree backup holding one file of this path (listed, found and restored like any file; restic's --stdin-filename)"
        )
    )]
    pub stdin_name: Option<String>,
    /// Do not descend into directories on other file systems.
    #[cfg_attr(
        feature = "cli",
        arg(long, help = "Tree backups: do not descend into other file systems")
    )]
    pub one_file_system: bool,
    /// The backup whose unchanged files are reused (default: the latest
    /// tree backup of the same source).
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            value_name = "ID",
            conflicts_with = "force",
            help = "Tree backups: reuse the unchanged files of this backup (default: the latest tree backup of the same source)"
        )
    )]
    pub parent: Option<BackupId>,
    /// Read every file, reusing nothing.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            help = "Tree backups: read every file, even those unchanged since the parent"
        )
    )]
    pub force: bool,
}

/// A committed backup: its snapshot, the arranging that followed it
/// (lifecycle layout) and, for a tree backup, what it left out.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The committed snapshot.
    pub snapshot: Snapshot,
    /// Arranging run after the backup (lifecycle layout with automatic arranging).
    pub arrange: Option<ArrangeStats>,
    /// Arranging was due but deferred because other processes were reading
    /// the repository (arranging deletes objects they may read): it runs
    /// with the next backup of the lineage or `tessera arrange`.
    pub arrange_deferred: bool,
    /// One line per object that could not be read (the backup is incomplete).
    pub warnings: Vec<String>,
    /// One line per object left out on purpose (FIFOs, sockets, devices).
    pub notes: Vec<String>,
}

impl Outcome {
    /// The outcome of a backup that committed `snapshot` and did nothing else.
    pub fn of(snapshot: Snapshot) -> Self {
        Outcome {
            snapshot,
            arrange: None,
            arrange_deferred: false,
            warnings: Vec::new(),
            notes: Vec::new(),
        }
    }
}
