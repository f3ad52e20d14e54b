//! File contents: seekable seeded byte streams of a few content types, and a
//! piece table that describes a file as slices of such streams (data mode) or
//! as runs of chunk ids (trace mode).
//!
//! A stream `src` is cut into 4 KiB blocks, each generated from
//! `hash2(src, block)` alone, so any byte range can be regenerated without
//! generating what precedes it, and a file's bytes never need to be kept.

use super::rng::{hash2, Rng};

/// Block size of the seeded streams (and page size of [`ContentKind::Pages`]).
pub(crate) const BLOCK: usize = 4096;

/// What a file holds: decides its compressibility and internal structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentKind {
    /// Incompressible bytes (media, archives).
    Random,
    /// Prose/source-like text from a word list (compresses about 3:1).
    Text,
    /// Structured log/CSV records with sequential ids and timestamps.
    Records,
    /// Database-like 4 KiB pages: header, rows, zero padding, empty extents.
    Pages,
}

impl ContentKind {
    pub(crate) const ALL: [ContentKind; 4] = [
        ContentKind::Random,
        ContentKind::Text,
        ContentKind::Records,
        ContentKind::Pages,
    ];

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            ContentKind::Random => "random",
            ContentKind::Text => "text",
            ContentKind::Records => "records",
            ContentKind::Pages => "pages",
        }
    }

    pub(crate) fn extensions(self) -> &'static [&'static str] {
        match self {
            ContentKind::Random => &["jpg", "gz", "bin", "png", "zip"],
            ContentKind::Text => &["txt", "md", "c", "rs", "html", "py"],
            ContentKind::Records => &["csv", "log", "tsv"],
            ContentKind::Pages => &["db", "dat", "idx"],
        }
    }

    pub(crate) fn stems(self) -> &'static [&'static str] {
        match self {
            ContentKind::Random => &["img", "photo", "archive", "blob", "scan"],
            ContentKind::Text => &["notes", "readme", "main", "util", "report", "chapter"],
            ContentKind::Records => &["events", "access", "ledger", "metrics"],
            ContentKind::Pages => &["store", "index", "cache", "mail"],
        }
    }
}

const WORDS: &str = "the of and to in is that for it as was with be by on not he this are or his \
from at which but have an they you were her she there one all we their been has would when who will \
more if no out so said what up its about into than them can only other new some could time these two \
may then do first any my now such like our over man me even most made after also did many before must \
through back years where much your way well down should because each just those people how too little \
state good very make world still own see men work long get here between both life being under never day \
same another know while last might us great old year off come since against go came right used take \
three fn let mut struct impl return match self pub use mod const static enum trait where loop break \
continue while else printf include define int char void unsigned size_t buffer index value result error \
config server client request response data file path stream chunk block version backup store table row \
column query select insert update delete commit branch merge release build test debug info warn trace \
cache memory disk network thread lock queue event handler callback timeout retry status offset length";

/// A text token: a word and the separator after it, padded to 16 bytes.
#[derive(Clone, Copy)]
struct Token {
    bytes: [u8; 16],
    len: u8,
}

/// 4096 tokens: frequent words appear in many slots (a Zipf-like skew),
/// each slot with its own separator.
fn tokens() -> &'static [Token; 4096] {
    static T: std::sync::OnceLock<Box<[Token; 4096]>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let words: Vec<&str> = WORDS.split_whitespace().collect();
        let mut t = Box::new(
            [Token {
                bytes: [0; 16],
                len: 0,
            }; 4096],
        );
        for (i, tok) in t.iter_mut().enumerate() {
            let h = hash2(0x7e47, i as u64);
            // The product of two uniforms skews towards the first (frequent) words.
            let a = (h & 0xffff) as usize;
            let b = ((h >> 16) & 0xffff) as usize;
            let w = words[(((a * b) >> 16) * words.len()) >> 16].as_bytes();
            let sep: &[u8] = match (h >> 32) & 0xff {
                0..=5 => b".\n",
                6..=17 => b", ",
                18..=23 => b"\n",
                24..=27 => b"; ",
                _ => b" ",
            };
            let n = (w.len() + sep.len()).min(16);
            let mut bytes = [0u8; 16];
            let wl = w.len().min(n);
            bytes[..wl].copy_from_slice(&w[..wl]);
            bytes[wl..n].copy_from_slice(&sep[..n - wl]);
            *tok = Token {
                bytes,
                len: n as u8,
            };
        }
        t
    })
}

const USERS: [&str; 16] = [
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory",
    "niaj", "olivia", "peggy", "rupert", "sybil",
];
const ACTIONS: [&str; 8] = [
    "GET", "GET", "GET", "PUT", "POST", "DELETE", "LOGIN", "LOGOUT",
];
const STATUS: [&str; 8] = ["200", "200", "200", "200", "201", "304", "404", "500"];

const DIGITS2: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Writes `v` in decimal at `buf[pos..]`, zero-padded to `width` digits
/// (more if needed); returns the new position. `buf` has room for 20 digits.
#[inline]
fn put_num(buf: &mut [u8], pos: usize, mut v: u64, width: usize) -> usize {
    let mut tmp = [b'0'; 20];
    let mut i = 20;
    while v >= 100 {
        let d = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        tmp[i..i + 2].copy_from_slice(&DIGITS2[d..d + 2]);
    }
    if v >= 10 {
        let d = v as usize * 2;
        i -= 2;
        tmp[i..i + 2].copy_from_slice(&DIGITS2[d..d + 2]);
    } else if v > 0 || i == 20 {
        i -= 1;
        tmp[i] = b'0' + v as u8;
    }
    let start = (20 - width.min(20)).min(i);
    let n = 20 - start;
    buf[pos..pos + n].copy_from_slice(&tmp[start..]);
    pos + n
}

#[inline]
fn put(buf: &mut [u8], pos: usize, s: &[u8]) -> usize {
    buf[pos..pos + s.len()].copy_from_slice(s);
    pos + s.len()
}

/// Generates block `block` of stream `src` of the given kind (`out` is `BLOCK` bytes).
pub(crate) fn gen_block(kind: ContentKind, src: u64, block: u64, out: &mut [u8]) {
    let mut rng = Rng::new(hash2(src, block));
    match kind {
        ContentKind::Random => rng.fill(out),
        ContentKind::Text => gen_text(&mut rng, out),
        ContentKind::Records => gen_records(&mut rng, src, block, out),
        ContentKind::Pages => gen_page(&mut rng, src, block, out),
    }
}

fn gen_text(rng: &mut Rng, out: &mut [u8]) {
    let tokens = tokens();
    let mut buf = [0u8; BLOCK + 16];
    let end = out.len().min(BLOCK);
    let mut pos = 0;
    while pos < end {
        let r = rng.next_u64();
        for k in 0..5 {
            let t = &tokens[((r >> (12 * k)) & 0xfff) as usize];
            buf[pos..pos + 16].copy_from_slice(&t.bytes);
            pos += usize::from(t.len);
            if pos >= end {
                break;
            }
        }
    }
    out[..end].copy_from_slice(&buf[..end]);
}

fn gen_records(rng: &mut Rng, src: u64, block: u64, out: &mut [u8]) {
    // Each block holds about 80 records; ids and times continue across blocks.
    let base_id = (src >> 40) % 10_000 * 1_000_000 + block * 80;
    let base_ts = 1_600_000_000 + (src % 50_000_000) + block * 240;
    let mut buf = [0u8; BLOCK + 128];
    let end = out.len().min(BLOCK);
    let mut pos = 0;
    let mut i = 0u64;
    while pos < end {
        let r = rng.next_u64();
        pos = put_num(&mut buf, pos, base_ts + i * 3 + (r & 3), 10);
        pos = put(&mut buf, pos, b",");
        pos = put_num(&mut buf, pos, base_id + i, 9);
        pos = put(&mut buf, pos, b",");
        pos = put(&mut buf, pos, USERS[((r >> 2) & 15) as usize].as_bytes());
        pos = put(&mut buf, pos, b",");
        pos = put(&mut buf, pos, ACTIONS[((r >> 6) & 7) as usize].as_bytes());
        pos = put(&mut buf, pos, b",");
        pos = put_num(&mut buf, pos, (r >> 9) % 100_000, 1);
        pos = put(&mut buf, pos, b".");
        pos = put_num(&mut buf, pos, (r >> 26) % 100, 2);
        pos = put(&mut buf, pos, b",");
        pos = put(&mut buf, pos, STATUS[((r >> 33) & 7) as usize].as_bytes());
        pos = put(&mut buf, pos, b",");
        pos = put_num(&mut buf, pos, (r >> 36) % 3000, 1);
        pos = put(&mut buf, pos, b"\n");
        i += 1;
    }
    out[..end].copy_from_slice(&buf[..end]);
}

fn gen_page(rng: &mut Rng, src: u64, block: u64, out: &mut [u8]) {
    // One in ten 128 KiB extents is unallocated (all zero), as in sparse
    // database files: long zero runs give identical chunks.
    if out.len() < 16 || hash2(src ^ 0x5a5a, block / 32).is_multiple_of(10) {
        out.fill(0);
        return;
    }
    out[..4].copy_from_slice(b"PGv1");
    out[4..8].copy_from_slice(&(block as u32).to_le_bytes());
    out[8..16].copy_from_slice(&rng.next_u64().to_le_bytes());
    // Rows of 32 bytes: key, random payload, small counters; then free space.
    let rows = 40 + rng.below(88) as usize; // 40..127 rows of 127 slots
    let mut pos = 16;
    for i in 0..rows {
        if pos + 32 > out.len() {
            break;
        }
        out[pos..pos + 8].copy_from_slice(&(block * 128 + i as u64).to_le_bytes());
        rng.fill(&mut out[pos + 8..pos + 20]);
        let c = rng.next_u64();
        out[pos + 20..pos + 24].copy_from_slice(&((c & 0xffff) as u32).to_le_bytes());
        out[pos + 24..pos + 28].copy_from_slice(&(((c >> 16) & 0xff) as u32).to_le_bytes());
        out[pos + 28..pos + 32].copy_from_slice(&[1, 0, 0, 0]);
        pos += 32;
    }
    out[pos..].fill(0);
}

/// Writes bytes `[off, off + out.len())` of stream `src` into `out`.
pub(crate) fn fill(kind: ContentKind, src: u64, off: u64, out: &mut [u8]) {
    let mut scratch = [0u8; BLOCK];
    let mut done = 0usize;
    while done < out.len() {
        let at = off + done as u64;
        let block = at / BLOCK as u64;
        let skip = (at % BLOCK as u64) as usize;
        let take = (BLOCK - skip).min(out.len() - done);
        if skip == 0 && take == BLOCK {
            gen_block(kind, src, block, &mut out[done..done + BLOCK]);
        } else {
            gen_block(kind, src, block, &mut scratch);
            out[done..done + take].copy_from_slice(&scratch[skip..skip + take]);
        }
        done += take;
    }
}

/// How trace mode sizes chunks: a chunk's size is a function of its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkModel {
    /// Smallest chunk (except a file's last).
    pub min: u32,
    /// Mean chunk size.
    pub avg: u32,
    /// Largest chunk.
    pub max: u32,
}

impl Default for ChunkModel {
    fn default() -> Self {
        ChunkModel {
            min: 2048,
            avg: 8192,
            max: 65536,
        }
    }
}

impl ChunkModel {
    /// Size of chunk `idx` of run `src`: `min` plus an exponential tail, capped at `max`.
    #[inline]
    pub(crate) fn size(&self, src: u64, idx: u64) -> u32 {
        let h = hash2(src, idx);
        let u = ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
        let s = f64::from(self.min) - u.ln() * f64::from(self.avg - self.min);
        (s as u32).clamp(self.min, self.max)
    }
}

/// The unit a piece table counts in.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Units {
    /// Data mode: one unit is one byte.
    Bytes,
    /// Trace mode: one unit is one chunk.
    Chunks(ChunkModel),
}

/// A slice `[off, off + len)` of stream (or chunk-id run) `src`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) src: u64,
    pub(crate) off: u64,
    pub(crate) len: u64,
    /// Trace mode: a one-chunk piece of this exact size (a file's tail); 0 otherwise.
    pub(crate) fixed: u32,
    /// Logical bytes.
    pub(crate) bytes: u64,
}

impl Piece {
    pub(crate) fn new(units: Units, src: u64, off: u64, len: u64) -> Piece {
        let mut p = Piece {
            src,
            off,
            len,
            fixed: 0,
            bytes: 0,
        };
        p.bytes = p.measure(units, 0, len);
        p
    }

    pub(crate) fn fixed(src: u64, size: u32) -> Piece {
        Piece {
            src,
            off: 0,
            len: 1,
            fixed: size,
            bytes: u64::from(size),
        }
    }

    /// Size of chunk `i` of this piece (trace mode).
    #[inline]
    pub(crate) fn chunk_size(&self, model: &ChunkModel, i: u64) -> u32 {
        if self.fixed > 0 {
            self.fixed
        } else {
            model.size(self.src, self.off + i)
        }
    }

    /// Bytes of units `[a, b)` of this piece.
    fn measure(&self, units: Units, a: u64, b: u64) -> u64 {
        match units {
            Units::Bytes => b - a,
            Units::Chunks(m) => (a..b).map(|i| u64::from(self.chunk_size(&m, i))).sum(),
        }
    }

    /// Splits at `at` (0 < at < len) into two pieces.
    fn split(&self, units: Units, at: u64) -> (Piece, Piece) {
        let (small, left_small) = if at <= self.len - at {
            (self.measure(units, 0, at), true)
        } else {
            (self.measure(units, at, self.len), false)
        };
        let (lb, rb) = if left_small {
            (small, self.bytes - small)
        } else {
            (self.bytes - small, small)
        };
        (
            Piece {
                src: self.src,
                off: self.off,
                len: at,
                fixed: self.fixed,
                bytes: lb,
            },
            Piece {
                src: self.src,
                off: self.off + at,
                len: self.len - at,
                fixed: self.fixed,
                bytes: rb,
            },
        )
    }
}

/// A file's content as a piece table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Content {
    pub(crate) pieces: Vec<Piece>,
    pub(crate) units: u64,
    pub(crate) bytes: u64,
}

impl Content {
    pub(crate) fn from_pieces(pieces: Vec<Piece>) -> Content {
        let units = pieces.iter().map(|p| p.len).sum();
        let bytes = pieces.iter().map(|p| p.bytes).sum();
        Content {
            pieces,
            units,
            bytes,
        }
    }

    /// Makes a piece boundary at unit `at` and returns the index of the piece starting there.
    fn cut(&mut self, units: Units, at: u64) -> usize {
        let mut pos = 0;
        for i in 0..self.pieces.len() {
            let len = self.pieces[i].len;
            if pos == at {
                return i;
            }
            if at < pos + len {
                let (l, r) = self.pieces[i].split(units, at - pos);
                self.pieces[i] = l;
                self.pieces.insert(i + 1, r);
                return i + 1;
            }
            pos += len;
        }
        self.pieces.len()
    }

    /// Replaces units `[start, start + del)` by `ins`.
    pub(crate) fn replace(&mut self, units: Units, start: u64, del: u64, ins: Vec<Piece>) {
        let start = start.min(self.units);
        let del = del.min(self.units - start);
        let i = self.cut(units, start);
        let j = self.cut(units, start + del);
        self.pieces.splice(i..j, ins);
        self.pieces.retain(|p| p.len > 0);
        self.units = self.pieces.iter().map(|p| p.len).sum();
        self.bytes = self.pieces.iter().map(|p| p.bytes).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(kind: ContentKind, src: u64, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        fill(kind, src, off, &mut v);
        v
    }

    #[test]
    fn streams_are_seekable() {
        for kind in ContentKind::ALL {
            let whole = stream(kind, 7, 0, 3 * BLOCK + 100);
            for (off, len) in [(0, 10), (100, 5000), (4095, 2), (4096, 4096), (5000, 7000)] {
                assert_eq!(
                    stream(kind, 7, off as u64, len),
                    whole[off..off + len],
                    "{kind:?}"
                );
            }
            assert_ne!(stream(kind, 8, 0, 3 * BLOCK), whole[..3 * BLOCK]);
        }
    }

    #[test]
    fn text_and_records_look_right() {
        let t = stream(ContentKind::Text, 1, 0, 8192);
        assert!(t.iter().all(|b| b.is_ascii()));
        assert!(t.windows(4).any(|w| w == b"the "));
        let r = stream(ContentKind::Records, 1, 0, 8192);
        let s = String::from_utf8(r).unwrap();
        let line = s.lines().nth(1).unwrap();
        assert_eq!(line.split(',').count(), 7, "{line}");
    }

    #[test]
    fn put_num_pads() {
        let mut v = [0u8; 64];
        let mut p = put_num(&mut v, 0, 42, 5);
        p = put_num(&mut v, p, 0, 1);
        p = put_num(&mut v, p, 123456, 2);
        p = put_num(&mut v, p, 7, 2);
        p = put_num(&mut v, p, u64::MAX, 1);
        assert_eq!(&v[..p], b"0004201234560718446744073709551615");
    }

    #[test]
    fn piece_table_edits() {
        let u = Units::Bytes;
        let mut c = Content::from_pieces(vec![Piece::new(u, 1, 0, 100)]);
        c.replace(u, 10, 5, vec![Piece::new(u, 2, 10, 3)]);
        assert_eq!((c.units, c.bytes, c.pieces.len()), (98, 98, 3));
        c.replace(u, 98, 0, vec![Piece::new(u, 3, 0, 2)]);
        assert_eq!(c.units, 100);
        c.replace(u, 0, 100, vec![]);
        assert_eq!((c.units, c.pieces.len()), (0, 0));
        let m = ChunkModel::default();
        let u = Units::Chunks(m);
        let mut c = Content::from_pieces(vec![Piece::new(u, 1, 0, 50), Piece::fixed(9, 100)]);
        let total = c.bytes;
        c.replace(u, 20, 1, vec![Piece::new(u, 5, 0, 1)]);
        let expect = total - u64::from(m.size(1, 20)) + u64::from(m.size(5, 0));
        assert_eq!((c.units, c.bytes), (51, expect));
    }
}
