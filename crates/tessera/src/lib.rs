//! Tessera: a deduplicating backup engine in which every technique of the
//! papers it implements is a selectable policy over one pipeline.
//!
//! The engine is organised by role: [`chunker`] finds chunk boundaries,
//! [`fingerprint`] hashes chunks, [`index`] decides what to store,
//! [`rewrite`] and [`delta`] what to store again or as a delta, [`layout`]
//! holds the two storage layouts (container log, lifecycle volumes),
//! [`format`] the other objects' formats (envelope, chunk encoding,
//! snapshots and recipes), [`backend`] the counted storage access,
//! [`repo`] an open [`Repository`] (configuration, keys, locks, commit),
//! [`backup`] and [`restore`] the pipeline's two directions, [`tree`]
//! directory trees, [`gc`] garbage collection, and [`commands`] the other
//! user commands (check, forget, prune, repair, copy, stats, ...).

pub mod backend;
pub mod backup;
pub mod chunker;
pub mod commands;
pub mod crypto;
pub mod delta;
pub mod error;
pub mod fingerprint;
pub mod format;
pub mod gc;
pub mod index;
pub mod layout;
pub mod progress;
pub mod repo;
pub mod restore;
pub mod rewrite;
pub mod tree;
pub mod util;

pub use error::{Error, Result};
pub use repo::Repository;
