//! Chunking and fingerprinting of plain files, for analysis and trace writing.

use rayon::prelude::*;
use std::fs::File;
use std::io;
use std::path::Path;
use tessera::chunker::{Blocks, Chunker};
use tessera::{Fingerprint, FingerprintAlgo};

/// Calls `each` with the fingerprint and length of every chunk of the file
/// at `path`, in order (fingerprints are computed in parallel per block).
pub fn for_each_chunk(
    path: &Path,
    chunker: &dyn Chunker,
    algo: FingerprintAlgo,
    each: &mut dyn FnMut(Fingerprint, u32) -> io::Result<()>,
) -> io::Result<()> {
    let mut file = File::open(path)?;
    let mut blocks = Blocks::new(&mut file, chunker, 8 << 20);
    while let Some((data, lengths)) = blocks.next_block()? {
        let mut ranges = Vec::with_capacity(lengths.len());
        let mut off = 0usize;
        for &l in &lengths {
            ranges.push(off..off + l as usize);
            off += l as usize;
        }
        let fps: Vec<Fingerprint> = ranges
            .par_iter()
            .map(|r| algo.hash(&data[r.clone()]))
            .collect();
        for (fp, &l) in fps.into_iter().zip(&lengths) {
            each(fp, l)?;
        }
    }
    Ok(())
}
