//! FastCDC (2020 variant, normalized chunking level 1) on the `fastcdc` crate's cut routine.

use super::Chunker;
use fastcdc::v2020;

/// FastCDC 2020 with normalized chunking.
pub struct FastCdc {
    min: usize,
    avg: usize,
    max: usize,
    mask_s: u64,
    mask_l: u64,
}

impl FastCdc {
    /// A chunker with the given sizes (validated by `ChunkerParams`).
    pub fn new(min: usize, avg: usize, max: usize) -> Self {
        let (mask_s, mask_l) = v2020::select_masks(avg, v2020::Normalization::Level1);
        FastCdc {
            min,
            avg,
            max,
            mask_s,
            mask_l,
        }
    }
}

impl Chunker for FastCdc {
    fn cut(&self, data: &[u8]) -> usize {
        let (_, n) = v2020::cut(
            data,
            self.min,
            self.avg,
            self.max,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
        );
        n
    }

    fn max_size(&self) -> usize {
        self.max
    }
}
