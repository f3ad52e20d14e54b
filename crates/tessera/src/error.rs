//! Typed errors of the engine.
//!
//! Every error names the object it concerns (a path, a backup id, a container
//! id, an object key) and what is wrong with it, so that the command line can
//! print it as one line.

use std::io;

/// Result type of the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation on a named object failed.
    #[error("{what}: {source}")]
    Io {
        /// The object or operation, e.g. `writing containers/000000000000002a`.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A storage object that must exist does not.
    #[error("{0}: no such object in the repository")]
    NotFound(String),
    /// The path holds no Tessera repository.
    #[error("{0}: not a Tessera repository (no config object)")]
    NotARepository(String),
    /// `init` was asked to create a repository where one (or other files) already exist.
    #[error("{0}: already exists and is not empty")]
    AlreadyExists(String),
    /// An object was written by a format version this build does not understand.
    #[error(
        "{object}: format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The object.
        object: String,
        /// The version found on disk.
        found: u32,
        /// The version this build understands.
        supported: u32,
    },
    /// An object failed to parse or its checksum does not hold.
    #[error("{object}: corrupt: {detail}")]
    Corrupt {
        /// The object.
        object: String,
        /// What is wrong.
        detail: String,
    },
    /// A stored chunk's bytes do not hash to its fingerprint.
    #[error(
        "container {container:016x}: chunk {fingerprint} is corrupt (its bytes hash to {actual})"
    )]
    ChunkMismatch {
        /// The container holding the chunk.
        container: u64,
        /// The fingerprint the recipe and metadata expect.
        fingerprint: String,
        /// The fingerprint of the bytes actually read.
        actual: String,
    },
    /// A recipe references a chunk that is not where it says.
    #[error("backup {backup}: chunk {fingerprint} is missing from container {container:016x}")]
    MissingChunk {
        /// The backup whose recipe holds the reference.
        backup: u64,
        /// The container the recipe names.
        container: u64,
        /// The chunk's fingerprint.
        fingerprint: String,
    },
    /// A chunk of a lifecycle-layout backup is in none of the objects
    /// whose categories cover its version.
    #[error("backup {backup}: chunk {fingerprint} is in none of the objects holding version {version} of {lineage} ({searched}): one of them is missing or damaged")]
    ChunkNotInCategories {
        /// The backup whose recipe holds the chunk.
        backup: u64,
        /// Its version in its lineage.
        version: u64,
        /// The lineage's directory (`lifecycle/s<hex>`).
        lineage: String,
        /// The chunk's fingerprint.
        fingerprint: String,
        /// The objects searched, or the key patterns of those expected.
        searched: String,
    },
    /// A stored chunk's bytes in a lifecycle category or volume object do
    /// not hash to its fingerprint.
    #[error("{object}: chunk {fingerprint} is corrupt (its bytes hash to {actual})")]
    ObjectChunkMismatch {
        /// The category or volume object holding the chunk.
        object: String,
        /// The fingerprint its metadata and the recipe expect.
        fingerprint: String,
        /// The fingerprint of the bytes actually read.
        actual: String,
    },
    /// The repository's configuration object is damaged: nothing can be
    /// read without it.
    #[error("{location}: the repository configuration is damaged ({cause}); no command can use the repository without it: put back an intact copy of its `config` object (written once by init and never changed, so any earlier copy of it will do)")]
    DamagedConfig {
        /// The repository.
        location: String,
        /// What is wrong with `config`.
        cause: String,
    },
    /// A tree operation (listing, restoring into a directory) was asked of
    /// a backup of a single stream.
    #[error("backup {0}: not a tree backup (it holds one stream: restore it to a file)")]
    NotATree(u64),
    /// A path asked for is not in a tree backup.
    #[error("backup {backup}: no {path} in it")]
    NotInBackup {
        /// The backup.
        backup: u64,
        /// The path, as listed (`/home/ann`).
        path: String,
    },
    /// An `--include` pattern of a restore matches no entry of the backup.
    #[error("backup {backup}: --include {pattern:?} matches nothing in it{hint}")]
    NoMatch {
        /// The backup.
        backup: u64,
        /// The pattern, as given.
        pattern: String,
        /// How the pattern was read (`` (taken relative to …)``), or empty.
        hint: String,
    },
    /// No backup with this id exists.
    #[error("backup {0}: no such backup in the repository")]
    NoSuchBackup(u64),
    /// A configuration value is invalid.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// An option of an operation (GC, restore) is outside its valid range;
    /// the message names the option and the range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A restore's output path holds something the restore must not replace.
    #[error("{path}: {reason}")]
    OutputRefused {
        /// The output path.
        path: String,
        /// Why the restore does not write there.
        reason: String,
    },
    /// Reading the backup source failed.
    #[error("reading {what}: {source}")]
    Input {
        /// The input (a path or `stdin`).
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Writing restored data to the output failed.
    #[error("writing {what}: {source}")]
    Output {
        /// The output (a path or `stdout`).
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// An operation was asked of a repository opened for less (e.g. GC on
    /// a handle opened for reading).
    #[error("{location}: {operation} needs the repository opened for {needed}")]
    NotOpenFor {
        /// The repository.
        location: String,
        /// What was attempted.
        operation: String,
        /// The lock mode it needs.
        needed: String,
    },
    /// Another process holds the repository lock.
    #[error("{0}: repository is locked by another process")]
    Locked(String),
    /// An object that is only ever created, never replaced, exists already:
    /// another writer made it (the write changed nothing).
    #[error(
        "{0}: already exists (written by another process at the same time); nothing was replaced"
    )]
    ObjectExists(String),
    /// An encrypted object failed authentication: it was modified or
    /// damaged, or does not belong under its name.
    #[error(
        "{object}: authentication failed: the object was modified or damaged, or does not belong here"
    )]
    Authentication {
        /// The object.
        object: String,
    },
    /// No key file of the repository opens with the password given.
    #[error("{0}: wrong password or no key file matches")]
    WrongPassword(String),
    /// An encrypted repository was opened without a way to get its password.
    #[error("{0}: the repository is encrypted: a password is needed")]
    PasswordRequired(String),
    /// The password could not be obtained (a file, command or prompt failed).
    #[error("getting the password: {0}")]
    Credentials(String),
    /// The last key file of a repository cannot be removed.
    #[error("keys/{0}: the last key of the repository cannot be removed")]
    LastKey(String),
    /// A pipeline stage ended unexpectedly (a worker thread failed).
    #[error("internal pipeline failure: {0}")]
    Pipeline(String),
}

impl Error {
    /// Whether this error means a chunk's data is lost (missing or
    /// damaged), and which.
    pub(crate) fn lost_reason(&self) -> Option<&'static str> {
        match self {
            Error::NotFound(_) => Some("missing"),
            Error::MissingChunk { .. } | Error::ChunkNotInCategories { .. } => Some("missing"),
            Error::ChunkMismatch { .. }
            | Error::ObjectChunkMismatch { .. }
            | Error::UnsupportedVersion { .. } => Some("damaged"),
            e if e.is_damage() => Some("damaged"),
            _ => None,
        }
    }

    /// Whether this error says an object's bytes are damaged: a failed
    /// checksum or format check, or (encrypted repositories) a failed
    /// authentication, which is how damage shows there.
    pub fn is_damage(&self) -> bool {
        matches!(self, Error::Corrupt { .. } | Error::Authentication { .. })
    }

    /// The object a missing, damaged or unreadable-version error names.
    pub(crate) fn object(&self) -> Option<&str> {
        match self {
            Error::NotFound(o)
            | Error::Corrupt { object: o, .. }
            | Error::Authentication { object: o }
            | Error::UnsupportedVersion { object: o, .. } => Some(o),
            _ => None,
        }
    }

    /// Wraps an I/O error with the object or operation it concerns.
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// A corruption error for `object`.
    pub fn corrupt(object: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            object: object.into(),
            detail: detail.into(),
        }
    }
}
