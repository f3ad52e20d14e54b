//! The two storage layouts a repository may have (fixed at `init`): the
//! container log ([`container`]) and MFDedup's lifecycle volumes
//! ([`lifecycle`]).

pub mod container;
pub mod lifecycle;
