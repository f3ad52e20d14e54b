//! Tessera: a deduplicating backup engine in which every technique of the
//! papers it implements is a selectable policy over one pipeline.
//!
//! The engine is organised by role: [`chunker`] finds chunk boundaries,
//! [`Fingerprint`]s name chunks, [`index`] decides what to store,
//! [`rewrite`] and [`delta`] what to store again or as a delta, [`layout`]
//! holds the two storage layouts (container log, lifecycle volumes),
//! [`format`] the other objects' formats (envelope, chunk encoding,
//! snapshots and recipes), [`backend`] the counted storage access,
//! [`repo`] an open [`Repository`] (configuration, keys, locks, commit),
//! [`backup`] and [`restore`] the pipeline's two directions, [`tree`]
//! directory trees, [`gc`] garbage collection, and [`commands`] the other
//! user commands (check, forget, prune, repair, copy, stats, ...).
//!
//! Errors, fingerprints, progress reporting and the size parser are
//! private modules whose few public items are re-exported here.

pub mod backend;
pub mod backup;
pub mod chunker;
pub mod commands;
pub mod crypto;
pub mod delta;
mod error;
mod fingerprint;
pub mod format;
pub mod gc;
pub mod index;
pub mod layout;
mod progress;
pub mod repo;
pub mod restore;
pub mod rewrite;
pub mod tree;
mod util;

pub use error::{Error, Result};
pub use fingerprint::{Fingerprint, FingerprintAlgo, FingerprintMap};
pub use progress::{ByteProgress, Progress, Silent, Unit};
pub use repo::Repository;
pub use util::units::{parse_size, parse_size_u32};
