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
