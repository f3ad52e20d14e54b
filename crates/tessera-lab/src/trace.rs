//! Fingerprint traces: a backup stream as (fingerprint, size) per chunk, no data.
//!
//! Two formats are read: Destor's text trace (also written, by
//! [`DestorWriter`]) and the FSL "hashfile" binary format of the Stony Brook
//! traces. Malformed input is an error naming the line or byte offset.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;

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

/// Writes a Destor trace of the files `paths` (directories are walked in
/// name order), chunked with `params` and fingerprinted with `algo`.
pub fn write_data_trace<W: Write>(
    paths: &[std::path::PathBuf],
    params: tessera::chunker::ChunkerParams,
    algo: tessera::FingerprintAlgo,
    out: W,
) -> Result<W, TraceError> {
    let chunker = params.build().map_err(|e| TraceError::Io {
        what: "chunker".into(),
        source: io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
    })?;
    let mut files = Vec::new();
    for p in paths {
        collect_files(p, &mut files)?;
    }
    let mut w = DestorWriter::new(out);
    let fp_len = algo.digest_len();
    for f in &files {
        let what = f.display().to_string();
        let io_err = |e| TraceError::Io {
            what: what.clone(),
            source: e,
        };
        w.file_start(&what).map_err(io_err)?;
        crate::chunks::for_each_chunk(f, chunker.as_ref(), algo, &mut |fp, len| {
            w.chunk(&fp.0[..fp_len], len)
        })
        .map_err(io_err)?;
        w.file_end().map_err(io_err)?;
    }
    w.finish().map_err(|e| TraceError::Io {
        what: "trace output".into(),
        source: e,
    })
}

fn collect_files(path: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<(), TraceError> {
    let io_err = |e| TraceError::Io {
        what: path.display().to_string(),
        source: e,
    };
    let meta = std::fs::metadata(path).map_err(io_err)?;
    if meta.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(io_err)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(io_err)?;
        entries.sort();
        for e in entries {
            collect_files(&e, out)?;
        }
    } else if meta.is_file() {
        out.push(path.to_path_buf());
    }
    Ok(())
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

/// A trace file of either format, detected from its first bytes.
pub enum TraceFile {
    /// Destor's text format.
    Destor(DestorReader<BufReader<File>>),
    /// An FSL hashfile.
    Fsl(Box<FslReader<BufReader<File>>>),
}

impl TraceFile {
    /// Opens the trace at `path`, detecting its format.
    pub fn open(path: &Path) -> Result<TraceFile, TraceError> {
        let what = path.display().to_string();
        let io_err = |e| TraceError::Io {
            what: what.clone(),
            source: e,
        };
        let mut input = BufReader::with_capacity(1 << 20, File::open(path).map_err(io_err)?);
        let head = input.fill_buf().map_err(io_err)?;
        if head.len() >= 4 && head[..4] == FSL_MAGIC.to_le_bytes() {
            Ok(TraceFile::Fsl(Box::new(FslReader::new(input, what)?)))
        } else {
            Ok(TraceFile::Destor(DestorReader::new(input, what)))
        }
    }

    /// The next chunk, `None` at the end of the trace.
    pub fn next_chunk(&mut self) -> Result<Option<TraceChunk>, TraceError> {
        match self {
            TraceFile::Destor(r) => r.next_chunk(),
            TraceFile::Fsl(r) => r.next_chunk(),
        }
    }
}

/// Magic number of FSL hashfiles.
pub const FSL_MAGIC: u32 = 0xDEAD_DEAD;
const FSL_PATH_MAX: usize = 4096;
/// Size of `struct header` (versions 1–2): the part every version starts with.
const FSL_HEADER_V1_LEN: usize = 4176;
/// Size of `struct header_v3` (versions 3–4).
const FSL_HEADER_V3_LEN: usize = 8288;
/// Size of `struct header_v4` (versions 5–7).
const FSL_HEADER_V4_LEN: usize = 8296;
const FSL_FIXED: u32 = 1;
const FSL_VARIABLE: u32 = 2;

/// Reads the FSL "hashfile" binary format (fs-hasher, versions 4 to 7): a
/// packed little-endian header (magic 0xDEADDEAD, version, file count,
/// chunking method and parameters, hash method, hash size in bits), then per
/// file a header (with path length and, for symlinks, a target path) and per
/// chunk its size (u64 in v4–v6, u32 in v7; implied for fixed-size chunking),
/// its hash and, from v6, a compression-ratio byte.
pub struct FslReader<R: Read> {
    input: R,
    what: String,
    offset: u64,
    version: u32,
    files_left: u64,
    chunks_left: u64,
    file_size: u64,
    file_chunks: u64,
    variable: bool,
    fixed_size: u32,
    hash_len: usize,
}

impl<R: Read> FslReader<R> {
    /// Parses the header of the hashfile `input`, named `what` in errors.
    pub fn new(mut input: R, what: impl Into<String>) -> Result<Self, TraceError> {
        let what = what.into();
        let mut head = vec![0u8; FSL_HEADER_V1_LEN];
        read_exact_at(&mut input, &mut head, &what, 0)?;
        let u32_at = |b: &[u8], o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |b: &[u8], o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let malformed = |at: u64, detail: String| TraceError::Malformed {
            what: what.clone(),
            at: format!("byte {at}"),
            detail,
        };
        let magic = u32_at(&head, 0);
        if magic != FSL_MAGIC {
            return Err(malformed(
                0,
                format!("magic {magic:#010x} is not 0xdeaddead"),
            ));
        }
        let version = u32_at(&head, 4);
        let header_len = match version {
            4 => FSL_HEADER_V3_LEN,
            5..=7 => FSL_HEADER_V4_LEN,
            v => {
                return Err(malformed(
                    4,
                    format!("hashfile version {v} is not supported (4 to 7 are)"),
                ))
            }
        };
        let files = u64_at(&head, 8);
        let method = u32_at(&head, 16 + FSL_PATH_MAX + 8);
        let params = 16 + FSL_PATH_MAX + 12;
        let fixed_size = u32_at(&head, params);
        let hash_bits = u32_at(&head, FSL_HEADER_V1_LEN - 4);
        let variable = match method {
            FSL_VARIABLE => true,
            FSL_FIXED if fixed_size > 0 => false,
            FSL_FIXED => return Err(malformed(params as u64, "fixed chunk size 0".into())),
            m => return Err(malformed(4120, format!("unknown chunking method {m}"))),
        };
        if hash_bits == 0 || hash_bits % 8 != 0 || hash_bits > 256 {
            return Err(malformed(
                (FSL_HEADER_V1_LEN - 4) as u64,
                format!("hash size {hash_bits} bits is not a whole number of bytes up to 256"),
            ));
        }
        let mut rest = vec![0u8; header_len - FSL_HEADER_V1_LEN];
        read_exact_at(&mut input, &mut rest, &what, FSL_HEADER_V1_LEN as u64)?;
        Ok(FslReader {
            input,
            what,
            offset: header_len as u64,
            version,
            files_left: files,
            chunks_left: 0,
            file_size: 0,
            file_chunks: 0,
            variable,
            fixed_size,
            hash_len: (hash_bits / 8) as usize,
        })
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), TraceError> {
        read_exact_at(&mut self.input, buf, &self.what, self.offset)?;
        self.offset += buf.len() as u64;
        Ok(())
    }

    fn next_file(&mut self) -> Result<(), TraceError> {
        let len = if self.version == 4 { 88 } else { 96 };
        let mut h = vec![0u8; len];
        let at = self.offset;
        self.read(&mut h)?;
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&h[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let shift = if self.version == 4 { 0 } else { 8 };
        self.file_size = u64_at(0);
        let perm = u64_at(16 + shift);
        self.file_chunks = u64_at(72 + shift);
        let path_len = u32_at(80 + shift) as usize;
        let target_len = u32_at(84 + shift) as usize;
        if path_len > FSL_PATH_MAX || target_len > FSL_PATH_MAX {
            return Err(TraceError::Malformed {
                what: self.what.clone(),
                at: format!("byte {at}"),
                detail: format!("file path length {path_len} or link length {target_len} exceeds {FSL_PATH_MAX}"),
            });
        }
        let is_symlink = perm & 0o170000 == 0o120000;
        let mut skip = vec![0u8; path_len + if is_symlink { target_len } else { 0 }];
        self.read(&mut skip)?;
        self.chunks_left = self.file_chunks;
        self.files_left -= 1;
        Ok(())
    }

    /// The next chunk, or `None` after the last file.
    pub fn next_chunk(&mut self) -> Result<Option<TraceChunk>, TraceError> {
        loop {
            while self.chunks_left == 0 {
                if self.files_left == 0 {
                    return Ok(None);
                }
                self.next_file()?;
            }
            let at = self.offset;
            let size: u64 = if self.variable {
                if self.version >= 7 {
                    let mut b = [0u8; 4];
                    self.read(&mut b)?;
                    u64::from(u32::from_le_bytes(b))
                } else {
                    let mut b = [0u8; 8];
                    self.read(&mut b)?;
                    u64::from_le_bytes(b)
                }
            } else if self.chunks_left == 1 {
                let before = (self.file_chunks - 1).saturating_mul(u64::from(self.fixed_size));
                self.file_size
                    .saturating_sub(before)
                    .min(u64::from(self.fixed_size))
            } else {
                u64::from(self.fixed_size)
            };
            let mut fp = [0u8; 32];
            let hash_len = self.hash_len;
            self.read(&mut fp[..hash_len])?;
            if self.version >= 6 {
                let mut cratio = [0u8; 1];
                self.read(&mut cratio)?;
            }
            self.chunks_left -= 1;
            let size = u32::try_from(size).map_err(|_| TraceError::Malformed {
                what: self.what.clone(),
                at: format!("byte {at}"),
                detail: format!("chunk size {size} exceeds 4 GiB"),
            })?;
            if size > 0 {
                return Ok(Some(TraceChunk {
                    fp,
                    fp_len: hash_len as u8,
                    size,
                }));
            }
        }
    }
}

fn read_exact_at<R: Read>(
    input: &mut R,
    buf: &mut [u8],
    what: &str,
    at: u64,
) -> Result<(), TraceError> {
    input.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            TraceError::Malformed {
                what: what.to_string(),
                at: format!("byte {at}"),
                detail: format!("truncated: expected {} more bytes", buf.len()),
            }
        } else {
            TraceError::Io {
                what: what.to_string(),
                source: e,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of a test hashfile: its path and chunks of (size, hash).
    type TestFile<'a> = (&'a str, Vec<(u32, Vec<u8>)>);

    /// Builds a hashfile of `version` with the given files.
    fn hashfile(version: u32, hash_bits: u32, files: &[TestFile]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&FSL_MAGIC.to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(files.len() as u64).to_le_bytes());
        out.extend_from_slice(&[0u8; FSL_PATH_MAX]);
        let chunks: usize = files.iter().map(|f| f.1.len()).sum();
        out.extend_from_slice(&(chunks as u64).to_le_bytes());
        out.extend_from_slice(&FSL_VARIABLE.to_le_bytes());
        out.extend_from_slice(&[0u8; 44]);
        out.extend_from_slice(&3u32.to_le_bytes()); // MD5_48BIT
        out.extend_from_slice(&hash_bits.to_le_bytes());
        assert_eq!(out.len(), FSL_HEADER_V1_LEN);
        let full = if version == 4 {
            FSL_HEADER_V3_LEN
        } else {
            FSL_HEADER_V4_LEN
        };
        out.resize(full, 0);
        for (path, chunks) in files {
            let size: u64 = chunks.iter().map(|c| u64::from(c.0)).sum();
            out.extend_from_slice(&size.to_le_bytes());
            if version >= 5 {
                out.extend_from_slice(&0u64.to_le_bytes()); // blocks
            }
            out.extend_from_slice(&[0u8; 8]); // uid, gid
            out.extend_from_slice(&0o100644u64.to_le_bytes()); // regular file
            out.extend_from_slice(&[0u8; 48]); // times, links, dev, inode
            out.extend_from_slice(&(chunks.len() as u64).to_le_bytes());
            out.extend_from_slice(&(path.len() as u32).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(path.as_bytes());
            for (size, hash) in chunks {
                if version >= 7 {
                    out.extend_from_slice(&size.to_le_bytes());
                } else {
                    out.extend_from_slice(&u64::from(*size).to_le_bytes());
                }
                out.extend_from_slice(hash);
                if version >= 6 {
                    out.push(1);
                }
            }
        }
        out
    }

    #[test]
    fn reads_fsl_hashfiles_of_every_version() {
        let files = vec![
            ("a", vec![(8192, vec![1u8; 6]), (100, vec![2u8; 6])]),
            ("empty", vec![]),
            ("b", vec![(4096, vec![3u8; 6])]),
        ];
        for version in 4..=7 {
            let bytes = hashfile(version, 48, &files);
            let mut r = FslReader::new(&bytes[..], "t").unwrap();
            let mut got = Vec::new();
            while let Some(c) = r.next_chunk().unwrap() {
                got.push((c.size, c.fp[0], c.fp_len, c.fp[6]));
            }
            assert_eq!(
                got,
                vec![(8192, 1, 6, 0), (100, 2, 6, 0), (4096, 3, 6, 0)],
                "version {version}"
            );
        }
    }

    #[test]
    fn fsl_errors_name_the_byte_offset() {
        let files = vec![("a", vec![(8192, vec![1u8; 6])])];
        let bytes = hashfile(7, 48, &files);
        let mut bad = bytes.clone();
        bad[0] = 0;
        let e = FslReader::new(&bad[..], "t").err().unwrap().to_string();
        assert!(e.contains("byte 0") && e.contains("magic"), "{e}");
        let mut bad = bytes.clone();
        bad[4] = 9;
        let e = FslReader::new(&bad[..], "t").err().unwrap().to_string();
        assert!(e.contains("version 9"), "{e}");
        let truncated = &bytes[..bytes.len() - 3];
        let mut r = FslReader::new(truncated, "t").unwrap();
        let e = r.next_chunk().err().unwrap().to_string();
        assert!(e.contains("truncated") && e.contains("byte"), "{e}");
    }

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
            (
                "file start 3\nabc\nabcd x\nfile end\nstream end\n",
                "line 3",
            ),
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
