//! The aging model of one lineage: a directory tree whose files are created,
//! modified, renamed, touched, copied and deleted from version to version.
//!
//! After Tarasov et al. (USENIX ATC'12): file sizes are lognormal with a
//! Pareto tail; a few "hot" files take most modifications; modifications
//! cluster at file starts, file ends and a few per-file middle regions;
//! new content always comes from fresh seeds, and deleted files never come
//! back, so nothing old reappears (no skip duplicates by construction).

use super::content::{fill, ChunkModel, Content, ContentKind, Piece, Units, BLOCK};
use super::rng::{hash2, mix64, Rng};
use super::tar::{header, TarEntry, TAR_BLOCK, TAR_RECORD};
use crate::trace::{DestorWriter, TraceChunk};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

/// Share of the change rate that deletes files (and as many are created).
const DELETE_SHARE: f64 = 0.1;
/// Share of the change rate that renames or moves files.
const RENAME_SHARE: f64 = 0.05;
/// Fraction of created files that are copies of an existing file.
const COPY_RATE: f64 = 0.03;
/// Chance that a new file gets a new directory.
const NEW_DIR_RATE: f64 = 1.0 / 20.0;
/// Deepest directory level below the lineage root.
const MAX_DEPTH: u32 = 4;
/// Seconds between versions (daily backups).
const DAY: u64 = 86_400;

const DIR_NAMES: [&str; 12] = [
    "src", "docs", "data", "lib", "assets", "logs", "mail", "build", "photos", "projects", "notes",
    "db",
];

/// Parameters of one lineage.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LineageParams {
    pub(crate) target: u64,
    pub(crate) change_rate: f64,
    pub(crate) touch_rate: f64,
    pub(crate) growth: f64,
    pub(crate) units: Units,
}

#[derive(Clone, Debug)]
struct FileEntry {
    id: u64,
    dir: usize,
    gen: u32,
    kind: ContentKind,
    content: Content,
    mtime: u64,
    hot: f64,
    regions: [f64; 2],
}

#[derive(Clone, Debug)]
struct Dir {
    path: String,
    depth: u32,
    mtime: u64,
}

#[derive(Clone, Copy, Debug)]
enum Anchor {
    Start,
    End,
    At(f64),
}

#[derive(Clone, Copy, Debug)]
enum Entry {
    Dir(usize),
    File(usize),
}

/// One event of a version's fingerprint trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceEvent {
    /// A file starts (its path in the tree).
    FileStart(String),
    /// A chunk of the current file: SHA-1 of its id (20 bytes), and its size.
    Chunk(TraceChunk),
    /// The current file ends.
    FileEnd,
}

/// One source of versions: a file tree aged version by version.
#[derive(Clone, Debug)]
pub struct Lineage {
    name: String,
    rng: Rng,
    params: LineageParams,
    files: Vec<FileEntry>,
    dirs: Vec<Dir>,
    next_id: u64,
    version: u32,
    t0: u64,
    now: u64,
    kind_weights: [f64; 4],
    bytes: u64,
}

impl Lineage {
    pub(crate) fn new(name: &str, seed: u64, params: LineageParams) -> Lineage {
        let mut rng = Rng::new(seed);
        let t0 = 1_500_000_000 + rng.below(100_000_000);
        let base = [0.2, 0.45, 0.2, 0.15];
        let mut kind_weights = [0.0; 4];
        for (w, b) in kind_weights.iter_mut().zip(base) {
            *w = b * (0.5 + rng.f64());
        }
        let root = Dir {
            path: format!("{name}/"),
            depth: 0,
            mtime: t0,
        };
        Lineage {
            name: name.to_string(),
            rng,
            params,
            files: Vec::new(),
            dirs: vec![root],
            next_id: 1,
            version: 0,
            t0,
            now: t0,
            kind_weights,
            bytes: 0,
        }
    }

    /// The lineage's name (the root directory of its tree).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Versions made so far (0 before the first [`Lineage::advance`]).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Logical content bytes of the current version (file contents, no archive overhead).
    pub fn logical_bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of files in the current version.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Whether this lineage models chunks (trace mode) rather than bytes.
    pub fn is_trace(&self) -> bool {
        matches!(self.params.units, Units::Chunks(_))
    }

    fn target(&self) -> u64 {
        let g = (1.0 + self.params.growth).powi(self.version.saturating_sub(1) as i32);
        (self.params.target as f64 * g).min((1u64 << 50) as f64) as u64
    }

    fn file_path(&self, f: &FileEntry) -> String {
        let h = hash2(f.id, 0x57e4);
        let stems = f.kind.stems();
        let exts = f.kind.extensions();
        let stem = stems[(h % stems.len() as u64) as usize];
        let ext = exts[((h >> 32) % exts.len() as u64) as usize];
        let dir = &self.dirs[f.dir].path;
        if f.gen == 0 {
            format!("{dir}{stem}{:06}.{ext}", f.id)
        } else {
            format!("{dir}{stem}{:06}-r{}.{ext}", f.id, f.gen)
        }
    }

    fn mtime_today(&mut self) -> u64 {
        // Strictly after every earlier version's times: a header never reverts.
        self.now - self.rng.below(DAY / 2)
    }

    /// Makes the next version: the initial tree, then one version's operations.
    pub fn advance(&mut self) {
        self.version += 1;
        self.now = self.t0 + u64::from(self.version) * DAY + self.rng.below(3600);
        if self.version == 1 {
            let target = self.target();
            while self.bytes < target {
                self.create_file();
            }
            return;
        }
        let n = self.files.len() as f64;
        let c = self.params.change_rate;
        let n_mod = self.rng.round(c * n);
        let n_del = self.rng.round(c * n * DELETE_SHARE);
        let n_ren = self.rng.round(c * n * RENAME_SHARE);
        let n_touch = self.rng.round(self.params.touch_rate * n);

        for i in self.pick_weighted(n_mod) {
            self.modify(i);
        }
        for i in self.pick_uniform(n_touch) {
            let t = self.mtime_today();
            self.files[i].mtime = t;
        }
        for i in self.pick_uniform(n_ren) {
            self.rename(i);
        }
        let mut del = self.pick_uniform(n_del);
        del.sort_unstable_by(|a, b| b.cmp(a));
        for i in del {
            let f = self.files.swap_remove(i);
            self.bytes -= f.content.bytes;
            self.dirs[f.dir].mtime = self.now;
        }
        let target = self.target();
        let mut made = 0;
        while made < n_del || self.bytes < target {
            self.create_file();
            made += 1;
        }
    }

    /// Up to `k` distinct files, chosen with probability proportional to hotness.
    fn pick_weighted(&mut self, k: u64) -> Vec<usize> {
        let n = self.files.len();
        let k = (k as usize).min(n);
        if k == 0 {
            return Vec::new();
        }
        let mut cum = Vec::with_capacity(n);
        let mut total = 0.0;
        for f in &self.files {
            total += f.hot;
            cum.push(total);
        }
        let mut taken = vec![false; n];
        let mut out = Vec::with_capacity(k);
        let mut tries = 0;
        while out.len() < k && tries < 20 * k + 100 {
            tries += 1;
            let x = self.rng.f64() * total;
            let i = cum.partition_point(|&c| c <= x).min(n - 1);
            if !taken[i] {
                taken[i] = true;
                out.push(i);
            }
        }
        out
    }

    fn pick_uniform(&mut self, k: u64) -> Vec<usize> {
        let n = self.files.len();
        let k = (k as usize).min(n);
        let mut taken = vec![false; n];
        let mut out = Vec::with_capacity(k);
        while out.len() < k {
            let i = self.rng.below(n as u64) as usize;
            if !taken[i] {
                taken[i] = true;
                out.push(i);
            }
        }
        out
    }

    fn pick_kind(&mut self) -> ContentKind {
        let total: f64 = self.kind_weights.iter().sum();
        let mut x = self.rng.f64() * total;
        for (k, w) in ContentKind::ALL.iter().zip(self.kind_weights) {
            if x < w {
                return *k;
            }
            x -= w;
        }
        ContentKind::Text
    }

    /// A file size: lognormal body, Pareto tail, capped relative to the version size.
    fn sample_size(&mut self, kind: ContentKind) -> u64 {
        let scale: f64 = match kind {
            ContentKind::Random => 2.0,
            ContentKind::Text => 0.7,
            ContentKind::Records => 1.5,
            ContentKind::Pages => 3.0,
        };
        let s = if self.rng.chance(0.04) {
            self.rng.pareto(256.0 * 1024.0 * scale.min(1.5), 1.2)
        } else {
            self.rng.lognormal(6.0 * 1024.0 * scale, 1.6)
        };
        let cap = (self.params.target / 10).clamp(64 * 1024, 4 << 30) as f64;
        let s = s.min(cap).max(1.0) as u64;
        if kind == ContentKind::Pages {
            s.div_ceil(BLOCK as u64) * BLOCK as u64
        } else {
            s
        }
    }

    fn new_dir(&mut self) -> usize {
        let candidates: Vec<usize> = (0..self.dirs.len())
            .filter(|&d| self.dirs[d].depth < MAX_DEPTH)
            .collect();
        let parent = candidates[self.rng.below(candidates.len() as u64) as usize];
        let name = DIR_NAMES[self.rng.below(DIR_NAMES.len() as u64) as usize];
        let path = format!("{}{name}_{:03}/", self.dirs[parent].path, self.dirs.len());
        let depth = self.dirs[parent].depth + 1;
        self.dirs[parent].mtime = self.now;
        self.dirs.push(Dir {
            path,
            depth,
            mtime: self.now,
        });
        self.dirs.len() - 1
    }

    fn pick_dir(&mut self) -> usize {
        if self.dirs.len() == 1 || self.rng.chance(NEW_DIR_RATE) {
            self.new_dir()
        } else {
            self.rng.below(self.dirs.len() as u64) as usize
        }
    }

    /// Content of about `bytes` logical bytes from the fresh stream `src`.
    fn make_content(&self, src: u64, bytes: u64) -> Content {
        Content::from_pieces(self.make_pieces(src, 0, bytes, true))
    }

    /// Pieces for `bytes` new bytes; in trace mode, `exact` ends with a
    /// remainder chunk (a file tail), otherwise whole chunks approximate it.
    fn make_pieces(&self, src: u64, off: u64, bytes: u64, exact: bool) -> Vec<Piece> {
        match self.params.units {
            Units::Bytes => {
                if bytes == 0 {
                    Vec::new()
                } else {
                    vec![Piece::new(Units::Bytes, src, off, bytes)]
                }
            }
            Units::Chunks(m) => {
                if exact {
                    chunk_run_exact(&m, src, bytes)
                } else {
                    let n = (bytes as f64 / f64::from(m.avg)).round() as u64;
                    let n = if bytes >= u64::from(m.min) / 2 {
                        n.max(1)
                    } else {
                        n
                    };
                    if n == 0 {
                        Vec::new()
                    } else {
                        vec![Piece::new(self.params.units, src, 0, n)]
                    }
                }
            }
        }
    }

    fn create_file(&mut self) {
        let dir = self.pick_dir();
        let id = self.next_id;
        self.next_id += 1;
        let mtime = self.mtime_today();
        self.dirs[dir].mtime = self.now;
        let hot = self.rng.lognormal(1.0, 1.2);
        let regions = [self.rng.f64(), self.rng.f64()];
        if !self.files.is_empty() && self.rng.chance(COPY_RATE) {
            let i = self.rng.below(self.files.len() as u64) as usize;
            let src = &self.files[i];
            let f = FileEntry {
                id,
                dir,
                gen: 0,
                kind: src.kind,
                content: src.content.clone(),
                mtime,
                hot: src.hot,
                regions,
            };
            self.bytes += f.content.bytes;
            self.files.push(f);
            return;
        }
        let kind = self.pick_kind();
        let hot = hot
            * match kind {
                ContentKind::Random => 0.3,
                ContentKind::Text => 1.0,
                ContentKind::Records => 3.0,
                ContentKind::Pages => 3.0,
            };
        let size = self.sample_size(kind);
        let src = self.rng.next_u64();
        let content = self.make_content(src, size);
        self.bytes += content.bytes;
        self.files.push(FileEntry {
            id,
            dir,
            gen: 0,
            kind,
            content,
            mtime,
            hot,
            regions,
        });
    }

    fn rename(&mut self, i: usize) {
        let old = self.files[i].dir;
        self.dirs[old].mtime = self.now;
        if self.rng.chance(0.5) {
            let d = self.pick_dir();
            self.files[i].dir = d;
            self.dirs[d].mtime = self.now;
        }
        self.files[i].gen += 1;
    }

    fn modify(&mut self, i: usize) {
        let kind = self.files[i].kind;
        let size = self.files[i].content.bytes;
        let regions = self.files[i].regions;
        let n_regions = 1 + u32::from(self.rng.chance(0.5)) + u32::from(self.rng.chance(0.2));
        if size < 4096 && self.rng.chance(0.5) || kind == ContentKind::Random && size < 65536 {
            // Rewritten whole (small files, re-encoded media).
            let new = (size as f64 * self.rng.lognormal(1.0, 0.3)).max(1.0) as u64;
            self.edit(i, Anchor::Start, size, new);
        } else {
            for _ in 0..n_regions {
                let size = self.files[i].content.bytes;
                let (p_start, p_end) = match kind {
                    ContentKind::Text => (0.3, 0.3),
                    ContentKind::Records => (0.05, 0.8),
                    ContentKind::Pages => (0.2, 0.2),
                    ContentKind::Random => (0.5, 0.5),
                };
                let x = self.rng.f64();
                let anchor = if x < p_start {
                    Anchor::Start
                } else if x < p_start + p_end {
                    Anchor::End
                } else {
                    let r = regions[self.rng.below(2) as usize];
                    let jitter = (self.rng.f64() - 0.5) * 0.04;
                    Anchor::At((r + jitter).clamp(0.0, 1.0))
                };
                let cap = (size / 3).max(64) as f64;
                let mut len = self.rng.lognormal(2048.0, 1.0).clamp(16.0, cap) as u64;
                if kind == ContentKind::Pages {
                    len = len.div_ceil(BLOCK as u64) * BLOCK as u64;
                }
                let y = self.rng.f64();
                let (del, ins) = match anchor {
                    Anchor::End if y < 0.5 => (0, len),
                    Anchor::End if y < 0.75 => (len, len),
                    Anchor::End => (len, len / 2),
                    _ if y < 0.6 => (len, len),
                    _ if y < 0.8 => (0, len),
                    _ => (len, 0),
                };
                self.edit(i, anchor, del, ins);
            }
        }
        let t = self.mtime_today();
        self.files[i].mtime = t;
    }

    /// Replaces `del` bytes at `anchor` by `ins` new bytes of a fresh stream.
    fn edit(&mut self, i: usize, anchor: Anchor, del: u64, ins: u64) {
        let src = self.rng.next_u64();
        let units = self.params.units;
        let kind = self.files[i].kind;
        let before = self.files[i].content.bytes;
        let total = self.files[i].content.units;
        match units {
            Units::Bytes => {
                let del = del.min(total);
                let mut start = match anchor {
                    Anchor::Start => 0,
                    Anchor::End => total - del,
                    Anchor::At(f) => ((f * total as f64) as u64).min(total - del),
                };
                if kind == ContentKind::Pages {
                    start -= start % BLOCK as u64;
                }
                // New bytes come from the fresh stream at the same offset,
                // which keeps page numbers of `Pages` files in place.
                let mut ins = ins;
                if del == total && ins == 0 {
                    ins = 1; // files are never empty
                }
                let pieces = self.make_pieces(src, start, ins, true);
                self.files[i].content.replace(units, start, del, pieces);
            }
            Units::Chunks(m) => {
                if total == 0 {
                    let pieces = self.make_pieces(src, 0, ins.max(1), true);
                    self.files[i].content = Content::from_pieces(pieces);
                } else {
                    // The chunks the edited byte range overlaps are replaced,
                    // and the next one as content-defined cuts resynchronise.
                    let k = (2 + del / u64::from(m.avg)).min(total);
                    let start = match anchor {
                        Anchor::Start => 0,
                        Anchor::End => total - k,
                        Anchor::At(f) => ((f * total as f64) as u64).min(total - k),
                    };
                    let c = &self.files[i].content;
                    let old = bytes_of_units(c, &m, start, start + k);
                    let new = (old + ins).saturating_sub(del.min(old));
                    let at_end = start + k == total;
                    let new = if at_end { new.max(1) } else { new };
                    let pieces = self.make_pieces(src, 0, new, at_end);
                    self.files[i].content.replace(units, start, k, pieces);
                }
            }
        }
        let after = self.files[i].content.bytes;
        self.bytes = self.bytes - before + after;
    }

    /// Entries (directories and files) in archive order: sorted by path.
    fn entries(&self, with_dirs: bool) -> Vec<(String, Entry)> {
        let mut v: Vec<(String, Entry)> = Vec::with_capacity(self.files.len() + self.dirs.len());
        if with_dirs {
            for (i, d) in self.dirs.iter().enumerate() {
                v.push((d.path.clone(), Entry::Dir(i)));
            }
        }
        for (i, f) in self.files.iter().enumerate() {
            v.push((self.file_path(f), Entry::File(i)));
        }
        v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Writes the current version as a ustar archive; returns its size.
    ///
    /// Fails in trace mode (there are no bytes to write) and on write errors.
    pub fn write_tar<W: Write>(&self, mut out: W) -> io::Result<u64> {
        if self.is_trace() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a trace-mode lineage has no data to archive",
            ));
        }
        const FLUSH: usize = 1 << 20;
        let uid = 1000 + (mix64(self.t0) % 1000) as u32;
        let mut buf: Vec<u8> = Vec::with_capacity(FLUSH + TAR_BLOCK);
        let mut written = 0u64;
        fn flush<W: Write>(buf: &mut Vec<u8>, out: &mut W, written: &mut u64) -> io::Result<()> {
            out.write_all(buf)?;
            *written += buf.len() as u64;
            buf.clear();
            Ok(())
        }
        for (path, e) in self.entries(true) {
            match e {
                Entry::Dir(d) => {
                    let te = TarEntry {
                        path,
                        size: 0,
                        mtime: self.dirs[d].mtime,
                        mode: 0o755,
                        typeflag: b'5',
                    };
                    buf.extend_from_slice(&header(&te, uid, "user")?);
                }
                Entry::File(i) => {
                    let f = &self.files[i];
                    let te = TarEntry {
                        path,
                        size: f.content.bytes,
                        mtime: f.mtime,
                        mode: 0o644,
                        typeflag: b'0',
                    };
                    buf.extend_from_slice(&header(&te, uid, "user")?);
                    for p in &f.content.pieces {
                        let mut done = 0u64;
                        while done < p.len {
                            let n = (p.len - done).min(FLUSH as u64) as usize;
                            let at = buf.len();
                            buf.resize(at + n, 0);
                            fill(f.kind, p.src, p.off + done, &mut buf[at..]);
                            done += n as u64;
                            if buf.len() >= FLUSH {
                                flush(&mut buf, &mut out, &mut written)?;
                            }
                        }
                    }
                    let pad =
                        (TAR_BLOCK as u64 - f.content.bytes % TAR_BLOCK as u64) % TAR_BLOCK as u64;
                    buf.resize(buf.len() + pad as usize, 0);
                }
            }
            if buf.len() >= FLUSH {
                flush(&mut buf, &mut out, &mut written)?;
            }
        }
        flush(&mut buf, &mut out, &mut written)?;
        let end = written + 2 * TAR_BLOCK as u64;
        let padded = end.div_ceil(TAR_RECORD) * TAR_RECORD;
        buf.resize((padded - written) as usize, 0);
        flush(&mut buf, &mut out, &mut written)?;
        Ok(written)
    }

    /// Writes the current version as a directory tree below `root`
    /// (created if missing): its directories and files with their contents,
    /// permissions (0755, 0644) and modification times, as `write_tar`
    /// packs them. Returns the bytes of file contents written.
    ///
    /// Fails in trace mode (there are no bytes to write) and on write errors.
    pub fn write_tree(&self, root: &Path) -> io::Result<u64> {
        if self.is_trace() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a trace-mode lineage has no data to write",
            ));
        }
        let time = |t: u64| UNIX_EPOCH + Duration::from_secs(t);
        let mut buf = vec![0u8; 1 << 20];
        let mut written = 0u64;
        let mut dirs = Vec::new();
        for (path, e) in self.entries(true) {
            let dest = root.join(path.trim_end_matches('/'));
            match e {
                Entry::Dir(d) => {
                    fs::create_dir_all(&dest)?;
                    fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;
                    dirs.push((dest, self.dirs[d].mtime));
                }
                Entry::File(i) => {
                    let f = &self.files[i];
                    if let Some(parent) = dest.parent() {
                        fs::create_dir_all(parent)?;
                    }
                    let mut out = fs::File::create(&dest)?;
                    for p in &f.content.pieces {
                        let mut done = 0u64;
                        while done < p.len {
                            let n = (p.len - done).min(buf.len() as u64) as usize;
                            fill(f.kind, p.src, p.off + done, &mut buf[..n]);
                            out.write_all(&buf[..n])?;
                            done += n as u64;
                        }
                    }
                    out.set_permissions(fs::Permissions::from_mode(0o644))?;
                    out.set_modified(time(f.mtime))?;
                    written += f.content.bytes;
                }
            }
        }
        // Directories last, deepest first: writing inside one changes its mtime.
        for (dest, mtime) in dirs.iter().rev() {
            fs::File::open(dest)?.set_modified(time(*mtime))?;
        }
        Ok(written)
    }

    /// Writes the current version in its mode's format (a ustar archive,
    /// or a Destor trace in trace mode); returns the bytes of the version
    /// (archive size, or sum of chunk sizes).
    pub fn write<W: Write>(&self, out: W) -> io::Result<u64> {
        if self.is_trace() {
            self.write_trace(out)
        } else {
            self.write_tar(out)
        }
    }

    /// The current version's chunks, file by file (trace mode only).
    pub fn chunks(&self) -> io::Result<ChunkIter<'_>> {
        let Units::Chunks(model) = self.params.units else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a data-mode lineage has no chunk model (make it with `trace: true`)",
            ));
        };
        let order: Vec<(String, usize)> = self
            .entries(false)
            .into_iter()
            .filter_map(|(p, e)| match e {
                Entry::File(i) => Some((p, i)),
                Entry::Dir(_) => None,
            })
            .collect();
        let metas = order
            .iter()
            .map(|(p, i)| file_meta(p, &self.files[*i]))
            .collect();
        Ok(ChunkIter {
            lineage: self,
            model,
            order,
            metas,
            file: 0,
            piece: 0,
            chunk: 0,
            in_file: false,
        })
    }

    /// Writes the current version as a Destor text trace; returns its logical bytes.
    pub fn write_trace<W: Write>(&self, out: W) -> io::Result<u64> {
        let mut w = DestorWriter::new(out);
        let mut logical = 0u64;
        for ev in self.chunks()? {
            match ev {
                TraceEvent::FileStart(name) => w.file_start(&name)?,
                TraceEvent::Chunk(c) => {
                    logical += u64::from(c.size);
                    w.chunk(&c.fp[..usize::from(c.fp_len)], c.size)?;
                }
                TraceEvent::FileEnd => w.file_end()?,
            }
        }
        w.finish()?;
        Ok(logical)
    }
}

/// Bytes of chunks `[a, b)` of `c`.
fn bytes_of_units(c: &Content, m: &ChunkModel, a: u64, b: u64) -> u64 {
    let mut pos = 0;
    let mut sum = 0;
    for p in &c.pieces {
        let (lo, hi) = (a.max(pos), b.min(pos + p.len));
        if lo < hi {
            if lo == pos && hi == pos + p.len {
                sum += p.bytes;
            } else {
                sum += (lo - pos..hi - pos)
                    .map(|i| u64::from(p.chunk_size(m, i)))
                    .sum::<u64>();
            }
        }
        pos += p.len;
        if pos >= b {
            break;
        }
    }
    sum
}

/// Whole chunks of run `src` then a remainder chunk: exactly `bytes` bytes.
fn chunk_run_exact(m: &ChunkModel, src: u64, bytes: u64) -> Vec<Piece> {
    let mut sum = 0u64;
    let mut n = 0u64;
    loop {
        let s = u64::from(m.size(src, n));
        if sum + s >= bytes {
            break;
        }
        sum += s;
        n += 1;
    }
    let mut v = Vec::with_capacity(2);
    if n > 0 {
        v.push(Piece {
            src,
            off: 0,
            len: n,
            fixed: 0,
            bytes: sum,
        });
    }
    let rem = bytes - sum;
    if rem > 0 {
        // rem <= one chunk size <= max, so it fits u32.
        v.push(Piece::fixed(hash2(src, u64::MAX), rem as u32));
    }
    v
}

/// Iterator over a trace-mode version's files and chunks.
///
/// A chunk's fingerprint is the SHA-1 of its id (the run and index it comes
/// from). As in a packed stream, where the chunk holding a file's header
/// also holds the end of the file before it, a file's first chunk also
/// hashes the file's metadata (path, mtime, size) and its last chunk the
/// next file's: a metadata change, or a file appearing or leaving between
/// two files, changes the chunks at that junction.
pub struct ChunkIter<'a> {
    lineage: &'a Lineage,
    model: ChunkModel,
    order: Vec<(String, usize)>,
    metas: Vec<u64>,
    file: usize,
    piece: usize,
    chunk: u64,
    in_file: bool,
}

fn file_meta(name: &str, f: &FileEntry) -> u64 {
    let mut h = f.mtime ^ f.content.bytes.rotate_left(32);
    for b in name.bytes() {
        h = mix64(h ^ u64::from(b));
    }
    h
}

impl Iterator for ChunkIter<'_> {
    type Item = TraceEvent;

    fn next(&mut self) -> Option<TraceEvent> {
        use sha1::Digest as _;
        loop {
            let (name, fi) = self.order.get_mut(self.file)?;
            let f = &self.lineage.files[*fi];
            if !self.in_file {
                self.in_file = true;
                self.piece = 0;
                self.chunk = 0;
                return Some(TraceEvent::FileStart(std::mem::take(name)));
            }
            let Some(p) = f.content.pieces.get(self.piece) else {
                self.in_file = false;
                self.file += 1;
                return Some(TraceEvent::FileEnd);
            };
            if self.chunk >= p.len {
                self.piece += 1;
                self.chunk = 0;
                continue;
            }
            let first = self.piece == 0 && self.chunk == 0;
            let last = self.piece + 1 == f.content.pieces.len() && self.chunk + 1 == p.len;
            let mut id = [0u8; 32];
            id[..8].copy_from_slice(&p.src.to_le_bytes());
            id[8..16].copy_from_slice(&(p.off + self.chunk).to_le_bytes());
            let mut n = 16;
            if first {
                id[n..n + 8].copy_from_slice(&self.metas[self.file].to_le_bytes());
                n += 8;
            }
            if last {
                let next = self.metas.get(self.file + 1).copied().unwrap_or(0);
                id[n..n + 8].copy_from_slice(&(next ^ 0x6e65_7874).to_le_bytes());
                n += 8;
            }
            let digest = sha1::Sha1::digest(&id[..n]);
            let mut fp = [0u8; 32];
            fp[..20].copy_from_slice(&digest);
            let size = p.chunk_size(&self.model, self.chunk);
            self.chunk += 1;
            return Some(TraceEvent::Chunk(TraceChunk {
                fp,
                fp_len: 20,
                size,
            }));
        }
    }
}
