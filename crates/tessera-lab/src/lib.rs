//! Tessera's lab: deterministic versioned workloads, fingerprint traces,
//! dataset analysis and the experiment runner, all over the engine library.

pub mod analyze;
pub mod chunks;
pub mod experiment;
pub mod gen;
pub mod report;
pub mod scale;
pub mod trace;
pub mod types;
