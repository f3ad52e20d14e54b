//! Fingerprint traces: a backup stream as (fingerprint, size) per chunk, no data.
//!
//! Two formats are read: Destor's text trace (also written, by
//! [`DestorWriter`]) and the FSL "hashfile" binary format of the Stony Brook
//! traces. Malformed input is an error naming the line or byte offset.

use std::io::{self, BufRead, Write};

/// Errors of trace reading and writing.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The trace could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// The trace file or stream.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The trace is malformed at `at` (a line number or byte offset).
    #[error("{what}: malformed trace at {at}: {detail}")]
    Malformed {
        /// The trace file or stream.
        what: String,
        /// Where: `line N` or `byte N`.
        at: String,
        /// What is wrong.
        detail: String,
    },
}

/// One chunk of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceChunk {
    /// Fingerprint bytes (zero-padded to 32; `fp_len` of them significant).
    pub fp: [u8; 32],
    /// Significant bytes of `fp`.
    pub fp_len: u8,
    /// Chunk size in bytes.
    pub size: u32,
}

/// Writes Destor's text trace format:
/// `file start <name length>`, the name on its own line, one
/// `<hex fingerprint> <size>` line per chunk, `file end`, and `stream end`.
pub struct DestorWriter<W: Write> {
    out: W,
}

impl<W: Write> DestorWriter<W> {
    /// A writer over `out` (wrap files in a `BufWriter`).
    pub fn new(out: W) -> Self {
        DestorWriter { out }
    }

    /// Starts a file of the stream.
    pub fn file_start(&mut self, name: &str) -> io::Result<()> {
        writeln!(self.out, "file start {}", name.len())?;
        writeln!(self.out, "{name}")
    }

    /// Writes one chunk line (fingerprint in lower-case hex).
    pub fn chunk(&mut self, fp: &[u8], size: u32) -> io::Result<()> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut line = Vec::with_capacity(fp.len() * 2 + 12);
        for b in fp {
            line.push(HEX[(b >> 4) as usize]);
            line.push(HEX[(b & 15) as usize]);
        }
        line.push(b' ');
        line.extend_from_slice(size.to_string().as_bytes());
        line.push(b'\n');
        self.out.write_all(&line)
    }

    /// Ends the current file.
    pub fn file_end(&mut self) -> io::Result<()> {
        writeln!(self.out, "file end")
    }

    /// Ends the stream and returns the writer, flushed.
    pub fn finish(mut self) -> io::Result<W> {
        writeln!(self.out, "stream end")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Reads Destor's text trace format chunk by chunk.
pub struct DestorReader<R: BufRead> {
    input: R,
    what: String,
    line_no: u64,
    line: String,
    in_file: bool,
    ended: bool,
}

impl<R: BufRead> DestorReader<R> {
    /// A reader over `input`, named `what` in errors.
    pub fn new(input: R, what: impl Into<String>) -> Self {
        DestorReader {
            input,
            what: what.into(),
            line_no: 0,
            line: String::new(),
            in_file: false,
            ended: false,
        }
    }

    fn malformed(&self, detail: impl Into<String>) -> TraceError {
        TraceError::Malformed {
            what: self.what.clone(),
            at: format!("line {}", self.line_no),
            detail: detail.into(),
        }
    }

    /// Reads the next line without its newline; `None` at end of input.
    fn next_line(&mut self) -> Result<Option<&str>, TraceError> {
        self.line.clear();
        let n = self
            .input
            .read_line(&mut self.line)
            .map_err(|e| TraceError::Io {
                what: self.what.clone(),
                source: e,
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        Ok(Some(self.line.trim_end_matches(['\n', '\r'])))
    }

    /// The next chunk, or `None` after `stream end`.
    pub fn next_chunk(&mut self) -> Result<Option<TraceChunk>, TraceError> {
        loop {
            if self.ended {
                return Ok(None);
            }
            let in_file = self.in_file;
            let line = match self.next_line()? {
                Some(l) => l.to_string(),
                None => return Err(self.malformed("unexpected end of trace (no `stream end`)")),
            };
            if let Some(len) = line.strip_prefix("file start ") {
                if in_file {
                    return Err(self.malformed("`file start` inside a file"));
                }
                let len: usize = len
                    .trim()
                    .parse()
                    .map_err(|_| self.malformed(format!("bad name length {len:?}")))?;
                match self.next_line()? {
                    Some(name) if name.len() == len => {}
                    Some(name) => {
                        let got = name.len();
                        return Err(self.malformed(format!(
                            "file name has {got} bytes, `file start` announced {len}"
                        )));
                    }
                    None => return Err(self.malformed("unexpected end of trace in a file name")),
                }
                self.in_file = true;
            } else if line == "file end" {
                if !in_file {
                    return Err(self.malformed("`file end` outside a file"));
                }
                self.in_file = false;
            } else if line == "stream end" {
                if in_file {
                    return Err(self.malformed("`stream end` inside a file"));
                }
                self.ended = true;
            } else {
                if !in_file {
                    return Err(self.malformed(format!("chunk line outside a file: {line:?}")));
                }
                return self.parse_chunk(&line).map(Some);
            }
        }
    }

    fn parse_chunk(&self, line: &str) -> Result<TraceChunk, TraceError> {
        let mut parts = line.split_whitespace();
        let (hex, size) = match (parts.next(), parts.next(), parts.next()) {
            (Some(h), Some(s), None) => (h, s),
            _ => return Err(self.malformed(format!("expected `<hex> <size>`, got {line:?}"))),
        };
        if hex.len() % 2 != 0 || hex.len() > 64 || hex.is_empty() {
            return Err(self.malformed(format!(
                "fingerprint {hex:?} must be 2 to 64 hex digits, an even number"
            )));
        }
        let mut fp = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => fp[i] = (h * 16 + l) as u8,
                _ => return Err(self.malformed(format!("fingerprint {hex:?} is not hex"))),
            }
        }
        let size: u32 = size
            .parse()
            .map_err(|_| self.malformed(format!("chunk size {size:?} is not a number")))?;
        if size == 0 {
            return Err(self.malformed("chunk size 0"));
        }
        Ok(TraceChunk {
            fp,
            fp_len: (hex.len() / 2) as u8,
            size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destor_round_trip() {
        let mut w = DestorWriter::new(Vec::new());
        w.file_start("a/b.txt").unwrap();
        w.chunk(&[0xab; 20], 8192).unwrap();
        w.chunk(&[0x01; 20], 100).unwrap();
        w.file_end().unwrap();
        let text = w.finish().unwrap();
        let s = String::from_utf8(text.clone()).unwrap();
        assert!(s.starts_with("file start 7\na/b.txt\nabababab"));
        let mut r = DestorReader::new(&text[..], "t");
        let a = r.next_chunk().unwrap().unwrap();
        assert_eq!((a.fp[0], a.fp_len, a.size), (0xab, 20, 8192));
        let b = r.next_chunk().unwrap().unwrap();
        assert_eq!((b.fp[19], b.size), (0x01, 100));
        assert!(r.next_chunk().unwrap().is_none());
    }

    #[test]
    fn destor_errors_name_the_line() {
        let cases = [
            ("file start 3\nabc\nzz 12\nfile end\nstream end\n", "line 3"),
            ("file start 3\nabc\nabcd x\nfile end\nstream end\n", "line 3"),
            ("file start 9\nabc\n", "line 2"),
            ("abcd 12\n", "line 1"),
            ("file start 3\nabc\nabcd 12\n", "line 3"),
        ];
        for (text, at) in cases {
            let mut r = DestorReader::new(text.as_bytes(), "t");
            let err = loop {
                match r.next_chunk() {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("{text:?} accepted"),
                    Err(e) => break e,
                }
            };
            let msg = err.to_string();
            assert!(msg.contains(at), "{text:?}: {msg}");
        }
    }
}
