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
    /// A tree operation (listing, restoring into a directory) was asked of
    /// a backup of a single stream.
    #[error("backup {0}: not a tree backup (it holds one stream: restore it to a file)")]
    NotATree(u64),
    /// No backup with this id exists.
    #[error("backup {0}: no such backup in the repository")]
    NoSuchBackup(u64),
    /// A configuration value is invalid.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
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
    /// A pipeline stage ended unexpectedly (a worker thread failed).
    #[error("internal pipeline failure: {0}")]
    Pipeline(String),
}

impl Error {
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
