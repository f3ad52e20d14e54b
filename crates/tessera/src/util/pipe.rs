//! An in-memory pipe between a thread that restores (writes) and one that
//! reads, bounded to a few buffers so memory does not grow with the data.
//! The reader sees the end of the data only when the writer called
//! [`PipeWriter::finish`]: a writer that stopped on an error is never
//! mistaken for a complete stream.

use crossbeam_channel::{bounded, Receiver, Sender};
use std::io::{self, Read, Write};

/// A pipe holding at most `depth` writes in flight.
pub(crate) fn pipe(depth: usize) -> (PipeWriter, PipeReader) {
    let (tx, rx) = bounded(depth);
    (
        PipeWriter(tx),
        PipeReader {
            rx,
            buf: Vec::new(),
            at: 0,
            ended: false,
        },
    )
}

/// The writing end.
pub(crate) struct PipeWriter(Sender<Vec<u8>>);

impl PipeWriter {
    /// Ends the data (an empty buffer is the end mark).
    pub(crate) fn finish(self) {
        let _ = self.0.send(Vec::new());
    }
}

impl Write for PipeWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.0
            .send(buf.to_vec())
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the reader stopped"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The reading end: fails with `UnexpectedEof` if the writer went away
/// without finishing.
pub(crate) struct PipeReader {
    rx: Receiver<Vec<u8>>,
    buf: Vec<u8>,
    at: usize,
    ended: bool,
}

impl Read for PipeReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.buf.len() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(next) if next.is_empty() => self.ended = true,
                Ok(next) => {
                    self.buf = next;
                    self.at = 0;
                }
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the writer stopped before the end of the data",
                    ))
                }
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_is_seen_only_when_finished() {
        let (mut w, mut r) = pipe(4);
        w.write_all(b"abc").unwrap();
        w.finish();
        let mut s = Vec::new();
        r.read_to_end(&mut s).unwrap();
        assert_eq!(s, b"abc");
        let (mut w, mut r) = pipe(4);
        w.write_all(b"abc").unwrap();
        drop(w);
        let mut s = Vec::new();
        let e = r.read_to_end(&mut s).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
