//! Backends for tests, shared by the engine's unit tests and the
//! integration tests of every crate: an in-memory store ([`Mem`]), a layer
//! that injects seeded faults into a share of requests ([`Faulty`], the
//! fault campaign's), and a layer whose writes and deletes ask a gate
//! first ([`Gated`]: crashes, full disks). Not part of the engine's API.

mod faulty;
mod gated;
mod mem;

pub use faulty::Faulty;
pub use gated::{Gate, Gated, Mutation};
pub use mem::{assert_forwards_locks_and_hints, mem, Answers, Call, Mem};
