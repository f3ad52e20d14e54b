//! Chunks a source gave without their bytes (an unchanged file of a tree
//! backup, known by its parent's chunks), fetched again when a back end must
//! store them after all. Shared by both layouts' back ends.

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;

/// The bytes of chunks a source gave without them ([`crate::backup::SegmentRead::Reused`]),
/// for a back end that must store them (an index that did not find them, a
/// rewriting policy, delta compression).
pub trait Refetch: Sync {
    /// The bytes of the chunk at byte `offset` of the stream, checked to
    /// have fingerprint `fp` and length `len`.
    fn bytes(&self, offset: u64, fp: &Fingerprint, len: u32) -> Result<Vec<u8>>;
}

/// The bytes of a data-less chunk of a data repository, from `refetch`.
pub(crate) fn refetch_bytes(
    refetch: Option<&dyn Refetch>,
    offset: u64,
    fp: &Fingerprint,
    len: u32,
    seq: u64,
) -> Result<Vec<u8>> {
    let refetch = refetch.ok_or_else(|| {
        Error::Pipeline(format!(
            "chunk {seq} has no data in a data repository and no way to fetch it"
        ))
    })?;
    refetch.bytes(offset, fp, len)
}
