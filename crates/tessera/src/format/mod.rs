//! The formats of the objects a repository stores, one module per kind:
//! the envelope every object shares, the chunk encoding (compression), and
//! the snapshots and recipes of backups.

pub mod compression;
pub mod dictionary;
pub mod envelope;
pub(crate) mod recipe_reader;
pub mod snapshot;
