//! Tessera: a deduplicating backup engine in which every technique of the
//! papers it implements is a selectable policy over one pipeline.
//!
//! The engine is organised by concept: [`chunker`] finds chunk boundaries,
//! [`fingerprint`] hashes chunks, [`index`] decides what to store,
//! [`container`] is the storage format, [`snapshot`] the per-backup recipe
//! and metadata, [`backend`] the counted storage access, and [`backup`],
//! [`restore`] and [`check`] are the user-facing operations on a
//! [`Repository`].

pub mod backend;
pub mod backup;
pub mod backup_filter;
pub mod check;
pub mod chunker;
pub mod commit;
pub mod compression;
pub mod config;
pub mod container;
pub mod copy;
pub mod crypto;
pub mod delete;
pub mod delta;
pub mod envelope;
pub mod error;
pub mod fingerprint;
pub mod forget;
pub mod gc;
pub mod index;
pub mod key;
pub mod lifecycle;
pub mod lineage_state;
pub mod mount;
pub(crate) mod pipe;
pub mod progress;
pub mod prune;
pub mod quarantine;
pub mod ranges;
pub(crate) mod recipe_reader;
pub mod refetch;
pub mod repair;
pub mod repo;
pub mod restore;
pub mod restore_output;
pub mod restore_plan;
pub mod retention;
pub mod rewrite;
pub mod salvage;
pub mod snapshot;
pub(crate) mod sorted_pairs;
pub mod source_key;
pub(crate) mod spill;
pub mod tags;
pub mod totals;
pub mod tree;
pub mod units;

pub use error::{Error, Result};
pub use repo::Repository;
