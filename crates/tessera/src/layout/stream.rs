//! What a layout's back end receives from the backup front end: the
//! fingerprinted chunks in stream order, what the front end learnt of the
//! stream (a tree's catalog, where whole segments begin), and the bytes of
//! chunks the source gave without them (an unchanged file of a tree backup,
//! known by its parent's chunks), fetched again when a back end must store
//! them after all.
//!
//! This is the one interface between the front end (read, chunk,
//! fingerprint: [`crate::backup`]) and the back ends of both layouts
//! ([`super::container::backup`], [`super::lifecycle`]): dependencies point
//! from the front end to the layouts, never back.

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::snapshot::TreeRef;
use crate::index::Chunk;
use crossbeam_channel::Receiver;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;
use std::time::Duration;

/// The input of a layout's back end.
pub(crate) struct ChunkStream<'a> {
    /// Batches of fingerprinted chunks, in stream order; the channel closes
    /// when the stream ends (or the front end failed: the caller reports it).
    pub chunks: Receiver<Vec<Chunk>>,
    /// What the front end learnt of the stream.
    pub facts: &'a StreamFacts,
    /// The bytes of chunks given without them, when a back end must store them.
    pub refetch: Option<&'a dyn Refetch>,
    /// Waits for the front end to end (call it once the chunks ran out):
    /// its busy time reading and chunking, and fingerprinting, or its
    /// error, which explains a stream that ended early.
    pub join_front: JoinFront<'a>,
}

/// See [`ChunkStream::join_front`].
pub(crate) type JoinFront<'a> = Box<dyn FnOnce() -> Result<(Duration, Duration)> + 'a>;

/// What the front end learns of the stream while it runs.
pub(crate) struct StreamFacts {
    /// The tree a segmented source holds (set when it ends).
    pub tree: OnceLock<TreeRef>,
    /// The sequence number of the first chunk of a whole segment
    /// ([`SegmentRead::Whole`]; `u64::MAX`: none yet): it and the chunks
    /// after it (a tree's catalog and index) are never stored as deltas, as
    /// a reader of one would need its base too.
    pub whole_from: AtomicU64,
}

impl Default for StreamFacts {
    fn default() -> Self {
        StreamFacts {
            tree: OnceLock::new(),
            whole_from: AtomicU64::new(u64::MAX),
        }
    }
}

/// The bytes of chunks a source gave without them (an unchanged file of a
/// tree backup), for a back end that must store them (an index that did not
/// find them, a rewriting policy, delta compression).
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
