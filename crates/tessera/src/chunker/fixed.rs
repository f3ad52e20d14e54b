//! Fixed-size chunking.

use super::Chunker;

/// Chunks of exactly `size` bytes (the last one may be shorter).
pub struct FixedSize {
    size: usize,
}

impl FixedSize {
    /// A chunker cutting every `size` bytes.
    pub fn new(size: usize) -> Self {
        FixedSize { size }
    }
}

impl Chunker for FixedSize {
    fn cut(&self, data: &[u8]) -> usize {
        data.len().min(self.size)
    }

    fn max_size(&self) -> usize {
        self.size
    }

    /// Cut points are multiples of the size from the start.
    fn content_defined(&self) -> bool {
        false
    }
}
