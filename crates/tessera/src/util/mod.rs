//! Helpers shared by several parts of the engine: sizes and ratios, bounded
//! pipes, external sorting and spilled maps, source-lineage names.

pub(crate) mod pipe;
pub(crate) mod sorted_pairs;
pub mod source_key;
pub(crate) mod spill;
pub mod units;
