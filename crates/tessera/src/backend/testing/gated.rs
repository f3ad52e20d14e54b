//! A layer whose writes and deletes first ask a gate: a crash at a chosen
//! request, a full disk, a write that fails after some others.

use crate::backend::{Backend, Layer, Local, ObjectImage, WriteMode};
use crate::error::Result;
use std::io::{self, Write};
use std::path::Path;

/// A mutating request a [`Gated`] backend is asked to make.
pub enum Mutation<'a> {
    /// Storing `len` bytes as `key`.
    Write { key: &'a str, len: usize },
    /// Deleting `key`.
    Delete { key: &'a str },
}

impl Mutation<'_> {
    /// The object the request is about.
    pub fn key(&self) -> &str {
        match self {
            Mutation::Write { key, .. } | Mutation::Delete { key } => key,
        }
    }
}

/// Decides whether a [`Gated`] backend's writes and deletes happen.
pub trait Gate: Send + Sync {
    /// `Ok` lets the request through; an error is returned in its place.
    fn check(&self, request: Mutation) -> Result<()>;
}

/// Wraps a backend: every write and delete first asks the gate, with the
/// object's whole length (a write filled or streamed asks once its bytes
/// are known, and a refusal aborts it before anything is stored); reads,
/// listings, locks and hints pass through.
pub struct Gated<G> {
    inner: Box<dyn Backend>,
    gate: G,
}

impl<G: Gate> Gated<G> {
    /// `inner` behind `gate`.
    pub fn new(inner: Box<dyn Backend>, gate: G) -> Self {
        Gated { inner, gate }
    }

    /// The local directory `root` behind `gate`.
    pub fn local(root: &Path, gate: G) -> Self {
        Gated::new(Box::new(Local::new(root)), gate)
    }

    fn check_write(&self, key: &str, len: usize) -> Result<()> {
        self.gate.check(Mutation::Write { key, len })
    }
}

impl<G: Gate> Layer for Gated<G> {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        self.check_write(key, data.len())?;
        self.inner.write(key, data)
    }
    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.check_write(key, parts.iter().map(|p| p.len()).sum())?;
        self.inner.write_parts(key, parts)
    }
    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.check_write(key, parts.iter().map(|p| p.len()).sum())?;
        self.inner.write_new(key, parts)
    }
    fn write_new_filled(
        &self,
        key: &str,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut dyn ObjectImage) -> Result<()>,
    ) -> Result<()> {
        self.inner.write_new_filled(key, len_hint, &mut |image| {
            fill(image)?;
            self.check_write(key, image.len())
        })
    }
    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        self.inner.write_streamed(key, mode, &mut |out| {
            let mut counted = Counted { out, len: 0 };
            produce(&mut counted)?;
            self.check_write(key, counted.len)
        })
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.gate.check(Mutation::Delete { key })?;
        self.inner.delete(key)
    }
}

/// A writer that counts the bytes written through it.
struct Counted<'a> {
    out: &'a mut dyn Write,
    len: usize,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.len += n;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testing::assert_forwards_locks_and_hints;
    use crate::error::Error;
    use std::sync::Mutex;

    /// Refuses every request, noting what it was asked.
    struct Refuse(Mutex<Vec<String>>);

    impl Gate for Refuse {
        fn check(&self, request: Mutation) -> Result<()> {
            let asked = match request {
                Mutation::Write { key, len } => format!("write {key} {len}"),
                Mutation::Delete { key } => format!("delete {key}"),
            };
            self.0.lock().unwrap().push(asked);
            Err(Error::NotFound("refused".into()))
        }
    }

    /// Every way of writing asks the gate with the object's whole length,
    /// and a refusal stores nothing.
    #[test]
    fn every_write_and_delete_asks_the_gate_first() {
        let dir = tempfile::tempdir().unwrap();
        let gated = Gated::local(dir.path(), Refuse(Mutex::default()));
        let b: &dyn Backend = &gated;
        let mut fill = |image: &mut dyn ObjectImage| {
            image.append(b"filled");
            Ok(())
        };
        let mut produce =
            |out: &mut dyn Write| out.write_all(b"streamed").map_err(|e| Error::io("e", e));
        assert!(b.write("a/a", b"x").is_err());
        assert!(b.write_parts("a/b", &[b"x", b"yz"]).is_err());
        assert!(b.write_new("a/c", &[b"xyzw"]).is_err());
        assert!(b.write_new_filled("a/d", 100, &mut fill).is_err());
        for mode in [WriteMode::Replace, WriteMode::CreateNew] {
            assert!(b.write_streamed("a/e", mode, &mut produce).is_err());
        }
        assert!(b.delete("a/a").is_err());
        assert_eq!(
            *gated.gate.0.lock().unwrap(),
            [
                "write a/a 1",
                "write a/b 3",
                "write a/c 4",
                "write a/d 6",
                "write a/e 8",
                "write a/e 8",
                "delete a/a"
            ]
        );
        assert!(b.list("a").unwrap().is_empty());
        // No temporary file of a refused streamed or filled write is left.
        assert_eq!(b.remove_temporaries().unwrap(), 0);
    }

    #[test]
    fn locks_and_hints_reach_the_inner_backend() {
        assert_forwards_locks_and_hints(|inner| {
            Box::new(Gated::new(inner, Refuse(Mutex::default())))
        });
    }
}
