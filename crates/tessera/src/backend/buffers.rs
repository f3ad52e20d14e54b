//! Reused transfer buffers. A container read from an object store arrives
//! as many pieces (the HTTP client's socket reads) and a container write
//! leaves as a header, metadata and data: either is gathered into one
//! contiguous buffer; an encrypted object is opened in one. A fresh 4 MiB allocation costs a thousand page faults
//! and the kernel's zeroing of every page, more than the copy itself; a
//! buffer taken from the pool was touched before, so gathering into it is
//! a plain copy.

use bytes::Bytes;
use std::sync::{Arc, Mutex};

/// Buffers larger than this are not kept (a stray huge object does not pin
/// its memory).
const MAX_KEPT: usize = 16 << 20;

/// Spare buffers, at most `keep` of them.
pub(crate) struct BufferPool {
    spare: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl BufferPool {
    /// A pool keeping at most `keep` spare buffers.
    pub(crate) fn new(keep: usize) -> Arc<BufferPool> {
        Arc::new(BufferPool {
            spare: Mutex::new(Vec::new()),
            keep,
        })
    }

    /// The bytes of `parts` (of `len` bytes in all) gathered into one
    /// buffer of the pool, to which it returns when the last clone of the
    /// result is dropped.
    pub(crate) fn gather<'p>(
        self: &Arc<Self>,
        len: usize,
        parts: impl IntoIterator<Item = &'p [u8]>,
    ) -> Bytes {
        let filled: Result<Bytes, std::convert::Infallible> = self.lend(len, |buf| {
            for part in parts {
                buf.extend_from_slice(part);
            }
            Ok(())
        });
        match filled {
            Ok(bytes) => bytes,
            Err(never) => match never {},
        }
    }

    /// A buffer of the pool, with room for `len` bytes, as `fill` leaves
    /// it; it returns to the pool when the last clone of the result is
    /// dropped (at once if `fill` fails).
    pub(crate) fn lend<E>(
        self: &Arc<Self>,
        len: usize,
        fill: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Bytes, E> {
        let mut lent = Pooled {
            buf: self.take(),
            pool: self.clone(),
        };
        lent.buf.reserve(len);
        fill(&mut lent.buf)?;
        Ok(Bytes::from_owner(lent))
    }

    /// An empty spare buffer (or a new one).
    fn take(&self) -> Vec<u8> {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        spare.pop().unwrap_or_default()
    }

    /// Keeps `buf` for a later transfer if the pool is not full.
    fn give_back(&self, mut buf: Vec<u8>) {
        if buf.capacity() > MAX_KEPT {
            return;
        }
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < self.keep {
            buf.clear();
            spare.push(buf);
        }
    }
}

/// A buffer of the pool, lent out as the owner of [`Bytes`].
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

/// Alignment of [`AlignedBuf`]s: a page, what direct I/O needs.
pub(crate) const ALIGN: usize = 4096;

/// Size of a transparent huge page (x86-64, AArch64 with 4 KiB pages).
const HUGE_PAGE: usize = 2 * 1024 * 1024;

/// Asks the kernel to back `buf`'s spare capacity from `start` (a huge-page
/// boundary) with huge pages; advisory, so a refusal is ignored.
#[cfg(target_os = "linux")]
fn advise_huge_pages(buf: &mut Vec<u8>, start: usize) {
    let len = (buf.capacity() - start) / HUGE_PAGE * HUGE_PAGE;
    // SAFETY: the range lies within `buf`'s allocation (`start` ≤ capacity);
    // the advice changes only how the kernel backs those pages, not their contents.
    unsafe {
        libc::madvise(
            buf.as_mut_ptr().add(start).cast::<libc::c_void>(),
            len,
            libc::MADV_HUGEPAGE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_buf: &mut Vec<u8>, _start: usize) {}

/// A byte buffer whose contents start at a multiple of [`ALIGN`] in
/// memory, so that the backend can write it with direct I/O. The alignment
/// holds while the buffer stays within the capacity it was made with (it is
/// a matter of speed only: a misaligned buffer is written the ordinary way).
#[derive(Default)]
pub struct AlignedBuf {
    buf: Vec<u8>,
    start: usize,
}

impl AlignedBuf {
    /// An empty buffer with room for `capacity` bytes. A buffer of at
    /// least a huge page starts on one and asks the kernel for huge pages:
    /// fewer page faults, and direct I/O pins a few pages, not a thousand.
    pub fn with_capacity(capacity: usize) -> Self {
        let align = if capacity >= HUGE_PAGE {
            HUGE_PAGE
        } else {
            ALIGN
        };
        let mut buf: Vec<u8> = Vec::with_capacity(capacity + align);
        let start = buf.as_ptr().align_offset(align).min(align);
        if align == HUGE_PAGE {
            advise_huge_pages(&mut buf, start);
        }
        buf.resize(start, 0);
        AlignedBuf { buf, start }
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// The contents, to change in place.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..]
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether the buffer holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes it holds without growing.
    pub fn capacity(&self) -> usize {
        self.buf.capacity() - self.start
    }

    /// Appends `bytes`.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Appends `n` zero bytes.
    pub(crate) fn pad(&mut self, n: usize) {
        self.buf.resize(self.buf.len() + n, 0);
    }

    /// Empties the buffer, keeping its memory.
    pub fn clear(&mut self) {
        self.buf.truncate(self.start);
    }

    /// The vector holding the contents after the alignment gap, to append
    /// to (appending within [`AlignedBuf::capacity`] keeps the alignment;
    /// nothing but appending may change it).
    pub(crate) fn vec_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Makes room for `capacity` bytes in all, in a new aligned allocation if needed.
    pub(crate) fn reserve_total(&mut self, capacity: usize) {
        if self.capacity() < capacity {
            let mut bigger = AlignedBuf::with_capacity(capacity);
            bigger.extend_from_slice(self.as_slice());
            *self = bigger;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_parts_and_reuses_buffers_up_to_the_limit() {
        let pool = BufferPool::new(1);
        let a = pool.gather(5, [&b"ab"[..], b"cde"]);
        assert_eq!(&a[..], b"abcde");
        let b = pool.gather(3, [&b"xyz"[..]]);
        drop(a);
        drop(b);
        // Only one buffer is kept; the next gather reuses one of them.
        assert_eq!(pool.spare.lock().unwrap().len(), 1);
        let c = pool.gather(2, [&b"ok"[..]]);
        assert_eq!(&c[..], b"ok");
        let reused = c.as_ptr();
        drop(c);
        let d = pool.gather(4, [&b"abcd"[..]]);
        assert_eq!(&d[..], b"abcd");
        assert_eq!(d.as_ptr(), reused);
    }

    #[test]
    fn a_clone_keeps_the_buffer_until_it_is_dropped() {
        let pool = BufferPool::new(4);
        let a = pool.gather(3, [&b"abc"[..]]);
        let tail = a.slice(1..);
        drop(a);
        assert!(pool.spare.lock().unwrap().is_empty());
        assert_eq!(&tail[..], b"bc");
        drop(tail);
        assert_eq!(pool.spare.lock().unwrap().len(), 1);
    }
}
