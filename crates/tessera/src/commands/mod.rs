//! The user commands that are not a stage of the backup or restore
//! pipeline, one module each: each takes an open repository and returns a
//! typed result for the CLI (or any caller) to print.

pub mod check;
pub mod copy;
pub mod delete;
pub mod forget;
pub mod key;
pub mod list;
pub mod mount;
pub mod prune;
pub mod repair;
pub mod retention;
pub mod stats;
pub mod tags;
