//! Helpers shared by several parts of the engine: sizes and ratios, bounded
//! pipes, external sorting and spilled maps, source-lineage names.

pub(crate) mod pipe;
pub(crate) mod sorted_pairs;
pub mod source_key;
pub(crate) mod spill;
pub mod units;

/// Joins the thread of a pipeline stage named `stage` (in errors): its
/// result, or an error saying it panicked.
pub(crate) fn join_stage<T>(
    handle: std::thread::ScopedJoinHandle<'_, crate::error::Result<T>>,
    stage: &str,
) -> crate::error::Result<T> {
    handle
        .join()
        .map_err(|_| crate::error::Error::Pipeline(format!("{stage} thread panicked")))?
}
