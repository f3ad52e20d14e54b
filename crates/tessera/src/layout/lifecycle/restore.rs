//! Restore of version k: reads the categories Cat.(i,j) with i ≤ k ≤ j — a
//! contiguous prefix of each volume j ≥ k and the active categories with
//! i ≤ k — in order, and places each chunk at every output offset the
//! restore hash table (fingerprint → offsets, built from the recipe) lists.
//! When arranging is behind, version k > arranged needs every active
//! category and the pending categories up to k (read amplification > 1).

use super::format::{self, ReadLog, VolumeHeader};
use super::{require_layout, Lineage, Required};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FingerprintMap, Fingerprinter};
use crate::format::snapshot::{BackupId, Recipe};
use crate::repo::Repository;
use crate::restore::options::{
    announce_total, finish_stats, report_done, RestoreOptions, RestoreStats,
};
use rayon::prelude::*;
use serde::Serialize;
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Default reassembly window of streaming restores: 64 MiB.
pub const DEFAULT_WINDOW_BYTES: u64 = 64 * 1024 * 1024;

/// Options of a lifecycle restore.
pub struct LifecycleRestoreOptions<'a> {
    /// Output bytes assembled in memory at a time when streaming to a `Write`.
    pub window_bytes: u64,
    /// Called with the number of bytes restored so far.
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl Default for LifecycleRestoreOptions<'_> {
    fn default() -> Self {
        LifecycleRestoreOptions {
            window_bytes: DEFAULT_WINDOW_BYTES,
            progress: None,
        }
    }
}

/// Metrics of a lifecycle restore (or restore plan).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LifecycleRestoreStats {
    /// The backup.
    pub id: BackupId,
    /// Its version in its lineage.
    pub version: u64,
    /// The lineage's last arranged version.
    pub arranged: u64,
    /// Whether nothing was read beyond headers (trace repositories).
    pub plan_only: bool,
    /// Bytes restored (logical size).
    pub bytes_restored: u64,
    /// Chunks restored (recipe entries).
    pub chunks: u64,
    /// Bytes read from the backend: headers, chunk metadata and data.
    pub bytes_read: u64,
    /// Chunk data bytes read.
    pub data_bytes_read: u64,
    /// data_bytes_read / bytes_restored (≤ 1.0 when arranging is up to date).
    pub read_amplification: f64,
    /// bytes_read / bytes_restored (includes headers and 36 bytes of metadata per stored chunk).
    pub total_read_amplification: f64,
    /// Distinct read extents (seeks).
    pub extents: u64,
    /// Read requests.
    pub read_requests: u64,
    /// Objects (volumes and categories) read.
    pub objects_read: u64,
    /// Categories read.
    pub categories_read: u64,
    /// Reassembly windows (streaming restores; 1 for restores to a file).
    pub windows: u64,
    /// Wall time.
    pub seconds: f64,
    /// MB (10^6 bytes) restored per second.
    pub throughput_mb_s: f64,
}

impl LifecycleRestoreStats {
    fn finish(&mut self, log: &ReadLog, started: Instant) {
        self.bytes_read = log.bytes;
        self.data_bytes_read = log.data_bytes;
        self.extents = log.extents;
        self.read_requests = log.requests;
        self.objects_read = log.objects.len() as u64;
        let restored = self.bytes_restored.max(1) as f64;
        self.read_amplification = self.data_bytes_read as f64 / restored;
        self.total_read_amplification = self.bytes_read as f64 / restored;
        self.seconds = started.elapsed().as_secs_f64();
        self.throughput_mb_s = self.bytes_restored as f64 / 1e6 / self.seconds.max(1e-9);
    }
}

/// The lineage and version of backup `id` and the objects restoring it reads.
pub(crate) fn locate(repo: &Repository, id: BackupId) -> Result<(Lineage, u64, Vec<Required>)> {
    require_layout(repo)?;
    let snap = repo.snapshot(id)?;
    let backend = repo.backend().as_ref();
    let name = super::lineage_name(&snap.source);
    let lineage =
        Lineage::load(backend, &name)?.ok_or_else(|| Error::NotFound(super::state_key(&name)))?;
    let k = lineage.state.version_of(id).ok_or_else(|| {
        Error::corrupt(
            super::state_key(&name),
            format!("backup {id} is not a version of its lineage"),
        )
    })?;
    let required = lineage.required(backend, k)?;
    Ok((lineage, k, required))
}

/// Restore hash table: fingerprint → (length, output offsets).
fn hash_table(recipe: &Recipe) -> (FingerprintMap<(u32, Vec<u64>)>, u64) {
    let mut table: FingerprintMap<(u32, Vec<u64>)> = FingerprintMap::default();
    let mut off = 0u64;
    for c in &recipe.chunks {
        table
            .entry(c.fp)
            .or_insert_with(|| (c.len, Vec::new()))
            .1
            .push(off);
        off += u64::from(c.len);
    }
    (table, off)
}

/// Chunk `fp` of `want` bytes stored as `stored` in object `key` (an
/// encoded entry when `encoded`): decoded, and verified against its
/// length and fingerprint.
fn verify<'a>(
    algo: &Fingerprinter,
    key: &str,
    fp: &Fingerprint,
    want: u32,
    encoded: bool,
    stored: &'a [u8],
) -> Result<std::borrow::Cow<'a, [u8]>> {
    let bytes = format::decode_entry(encoded, key, fp, stored)?;
    if bytes.len() != want as usize {
        return Err(Error::corrupt(
            key,
            format!("chunk {fp} has length {}, recipe says {want}", bytes.len()),
        ));
    }
    let actual = algo.hash(&bytes);
    if actual != *fp {
        return Err(Error::ObjectChunkMismatch {
            object: key.to_string(),
            fingerprint: fp.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(bytes)
}

fn no_trace(repo: &Repository) -> Result<()> {
    if repo.config().trace {
        return Err(Error::InvalidConfig(
            "a trace repository stores no chunk data: use plan_restore".into(),
        ));
    }
    Ok(())
}

/// Restores backup `id` into the file `path` (created or truncated), reading
/// each required category once, sequentially, and writing chunks at their
/// offsets (out of order). Every chunk is verified before it is written.
pub fn restore_to_file(
    repo: &Repository,
    id: BackupId,
    path: &Path,
    options: &LifecycleRestoreOptions,
) -> Result<LifecycleRestoreStats> {
    let started = Instant::now();
    no_trace(repo)?;
    let (lineage, k, required) = locate(repo, id)?;
    let recipe = repo.recipe(id)?;
    let what = path.display().to_string();
    let out_err = |e| Error::Output {
        what: what.clone(),
        source: e,
    };
    let file = File::create(path).map_err(out_err)?;
    let total = recipe.chunks.iter().map(|c| u64::from(c.len)).sum();
    file.set_len(total).map_err(out_err)?;
    let (mut stats, log) = restore_in_one_pass(
        repo,
        id,
        (&lineage, k, &required),
        &recipe,
        options,
        |bytes, offset| file.write_all_at(bytes, offset).map_err(out_err),
    )?;
    file.sync_all().map_err(out_err)?;
    stats.finish(&log, started);
    Ok(stats)
}

/// Reads each required category of backup `id` once, sequentially (one
/// extent per object), and calls `place(bytes, offset)` for every output
/// offset of every chunk, after verifying the chunk. Sets `bytes_restored`.
fn restore_in_one_pass(
    repo: &Repository,
    id: BackupId,
    (lineage, k, required): (&Lineage, u64, &[Required]),
    recipe: &Recipe,
    options: &LifecycleRestoreOptions,
    mut place: impl FnMut(&[u8], u64) -> Result<()>,
) -> Result<(LifecycleRestoreStats, ReadLog)> {
    let algo = repo.fingerprinter();
    let backend = repo.backend().as_ref();
    let (mut table, _) = hash_table(recipe);
    let mut stats = LifecycleRestoreStats {
        id,
        version: k,
        arranged: lineage.state.arranged,
        chunks: recipe.chunks.len() as u64,
        windows: 1,
        ..LifecycleRestoreStats::default()
    };
    let mut restored = 0u64;
    // Reading (a thread of its own) overlaps verifying and placing. Each
    // object's prefix is read in one request after its header (objects are
    // at most a part, `lifecycle_part_bytes`), and its categories are
    // handed over, up to 16 in flight.
    let (tx, rx) = crossbeam_channel::bounded::<Category>(16);
    // Placement is by fingerprint, so objects may be read in any order:
    // several readers (each keeping a volume's parts together, in order)
    // hide the latency of many small reads: 3, or an object store's
    // `--connections`.
    let shares = reader_shares(required, backend.connections().unwrap_or(3).max(1));
    let (read, placed) = std::thread::scope(|s| {
        let readers: Vec<_> = shares
            .into_iter()
            .map(|share| {
                let tx = tx.clone();
                s.spawn(move || read_categories(backend, &share, &tx))
            })
            .collect();
        drop(tx);
        // Chunks to verify and place, gathered over categories so that
        // verification runs in parallel over enough of them.
        // (object body, offset, stored length, fingerprint, recipe length,
        // output offsets, object key, encoded).
        type Needed = (
            Arc<Vec<u8>>,
            usize,
            usize,
            Fingerprint,
            u32,
            Vec<u64>,
            String,
            bool,
        );
        const BATCH_BYTES: usize = 4 << 20;
        let mut batch: Vec<Needed> = Vec::new();
        let mut batch_bytes = 0usize;
        let mut flush = |batch: &mut Vec<Needed>, restored: &mut u64| -> Result<()> {
            let decoded: Vec<std::borrow::Cow<'_, [u8]>> = batch
                .par_iter()
                .map(|(body, at, len, fp, want, _, key, encoded)| {
                    verify(algo, key, fp, *want, *encoded, &body[*at..*at + *len])
                })
                .collect::<Result<_>>()?;
            for (n, bytes) in batch.iter().zip(&decoded) {
                for &o in &n.5 {
                    place(bytes, o)?;
                    *restored += bytes.len() as u64;
                }
            }
            drop(decoded);
            batch.clear();
            if let Some(p) = options.progress {
                p(*restored);
            }
            Ok(())
        };
        let mut placed = Ok(());
        for (key, chunks, body, data, encoded) in &rx {
            let mut at = data;
            for (fp, len) in chunks {
                if let Some((want, offsets)) = table.remove(&fp) {
                    // (An encoded entry's length is checked decoded.)
                    if want != len && !encoded {
                        placed = Err(Error::corrupt(
                            &key,
                            format!("chunk {fp} has length {len}, recipe says {want}"),
                        ));
                        break;
                    }
                    batch.push((
                        Arc::clone(&body),
                        at,
                        len as usize,
                        fp,
                        want,
                        offsets,
                        key.clone(),
                        encoded,
                    ));
                    batch_bytes += want as usize;
                }
                at += len as usize;
            }
            if placed.is_err() {
                break;
            }
            if batch_bytes >= BATCH_BYTES {
                batch_bytes = 0;
                placed = flush(&mut batch, &mut restored);
                if placed.is_err() {
                    break;
                }
            }
        }
        if placed.is_ok() {
            placed = flush(&mut batch, &mut restored);
        }
        // Stops the readers if placing failed.
        drop(rx);
        let read = join_readers(readers);
        (read, placed)
    });
    // A placing error first (the reader then only saw the channel closed).
    placed?;
    let (log, categories) = read?;
    stats.categories_read = categories;
    if let Some(fp) = table.keys().next() {
        return Err(super::not_in_categories(lineage, id, k, required, fp));
    }
    stats.bytes_restored = restored;
    Ok((stats, log))
}

/// A category handed from a reader to the placer: its object's key, its
/// chunks (fingerprint, stored length), the object's body read, where the
/// category's data starts in it, and whether its entries are encoded.
type Category = (String, Vec<(Fingerprint, u32)>, Arc<Vec<u8>>, usize, bool);

/// Splits the required objects over `readers` readers, keeping each
/// group (a volume's parts) together and in order.
fn reader_shares(required: &[Required], readers: usize) -> Vec<Vec<Required>> {
    let mut shares: Vec<Vec<Required>> = vec![Vec::new(); readers];
    let mut next = 0;
    for (i, req) in required.iter().enumerate() {
        let same_group = i > 0 && req.group.is_some() && req.group == required[i - 1].group;
        if !same_group && i > 0 {
            next = (next + 1) % readers;
        }
        shares[next].push(req.clone());
    }
    shares
}

/// One reader: reads the required prefix of each object of `share` and
/// sends its categories to `tx`; returns its read log and the number of
/// categories read.
fn read_categories(
    backend: &dyn Backend,
    share: &[Required],
    tx: &crossbeam_channel::Sender<Category>,
) -> Result<(ReadLog, u64)> {
    let mut log = ReadLog::default();
    let mut categories = 0u64;
    super::for_each_required(backend, share, &mut log, |req, header, prefix, log| {
        if !header.has_data {
            return Err(Error::corrupt(&req.key, "no chunk data"));
        }
        let start = VolumeHeader::len_for(header.categories.len());
        let last = &header.categories[prefix - 1];
        let end = header.data_offset(prefix - 1) + last.data_bytes;
        let body = Arc::new(log.read(backend, &req.key, start, end - start)?);
        for e in &header.categories[..prefix] {
            categories += 1;
            let m = (e.offset - start) as usize;
            let d = m + e.meta_len() as usize;
            let metas = format::parse_meta(&req.key, e, &body[m..d])?;
            // The data section's CRC is not checked here (`check
            // --read-data` does): every chunk this restore uses is
            // verified against its fingerprint, the others are unused.
            log.data_bytes += e.data_bytes;
            let category = (req.key.clone(), metas, Arc::clone(&body), d, header.encoded);
            tx.send(category)
                .map_err(|_| Error::Pipeline("restore stopped".into()))?;
        }
        Ok(())
    })?;
    Ok((log, categories))
}

/// Waits for every reader and merges their logs and counts (the first error wins).
fn join_readers(
    readers: Vec<std::thread::ScopedJoinHandle<'_, Result<(ReadLog, u64)>>>,
) -> Result<(ReadLog, u64)> {
    let mut read: Result<(ReadLog, u64)> = Ok((ReadLog::default(), 0));
    for r in readers {
        let one = r
            .join()
            .unwrap_or_else(|_| Err(Error::Pipeline("a restore reader panicked".into())));
        read = match (read, one) {
            (Ok((mut log, n)), Ok((other, m))) => {
                log.merge(other);
                Ok((log, n + m))
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
    }
    read
}

/// Where a chunk is stored: object index, absolute offset, length.
#[derive(Clone, Copy)]
struct Loc {
    obj: usize,
    offset: u64,
    len: u32,
}

/// Restores backup `id` to `out` in order, assembling `window_bytes` of
/// output at a time. A backup no larger than one window is assembled in
/// memory in one sequential pass over the required categories (one extent
/// per object, as [`restore_to_file`]). Otherwise the chunk metadata of the
/// required categories is read first (a location table for the recipe's chunks); then, per window, the
/// chunks it needs are read in storage order, coalesced into extents. A
/// chunk that several windows need is read once per window, so the read
/// amplification grows as the window shrinks below the backup's size.
pub fn restore_to_writer(
    repo: &Repository,
    id: BackupId,
    out: &mut dyn Write,
    options: &LifecycleRestoreOptions,
) -> Result<LifecycleRestoreStats> {
    restore_selection_to_writer(repo, id, None, out, options)
}

/// [`restore_to_writer`] of the chunks `select` picks (ranges of recipe
/// positions, in order; all when `None`). A selection reads the chunk
/// metadata of the required categories, then only the selected chunks.
pub fn restore_selection_to_writer(
    repo: &Repository,
    id: BackupId,
    select: Option<&[std::ops::Range<usize>]>,
    out: &mut dyn Write,
    options: &LifecycleRestoreOptions,
) -> Result<LifecycleRestoreStats> {
    let started = Instant::now();
    no_trace(repo)?;
    let (lineage, k, required) = locate(repo, id)?;
    let mut recipe = repo.recipe(id)?;
    if select.is_some() {
        recipe.chunks = recipe.selected(select)?;
    }
    let total: u64 = recipe.chunks.iter().map(|c| u64::from(c.len)).sum();
    let out_err = |e| Error::Output {
        what: "output".into(),
        source: e,
    };
    if select.is_none() && total <= options.window_bytes {
        // The whole backup is one window: assemble it in memory reading each
        // required category once, sequentially, as a restore to a file does.
        let mut buf = vec![0u8; total as usize];
        let (mut stats, log) = restore_in_one_pass(
            repo,
            id,
            (&lineage, k, &required),
            &recipe,
            options,
            |bytes, offset| {
                let o = offset as usize;
                buf[o..o + bytes.len()].copy_from_slice(bytes);
                Ok(())
            },
        )?;
        out.write_all(&buf).map_err(out_err)?;
        out.flush().map_err(out_err)?;
        stats.finish(&log, started);
        return Ok(stats);
    }
    let algo = repo.fingerprinter();
    let backend = repo.backend().as_ref();
    let mut stats = LifecycleRestoreStats {
        id,
        version: k,
        arranged: lineage.state.arranged,
        chunks: recipe.chunks.len() as u64,
        ..LifecycleRestoreStats::default()
    };
    let mut log = ReadLog::default();
    let (wanted, objects) = locate_chunks(backend, &required, &recipe, &mut stats, &mut log)?;
    let window = options.window_bytes.max(1);
    let mut restored = 0u64;
    let mut at = 0usize;
    let mut buf: Vec<u8> = Vec::new();
    while at < recipe.chunks.len() {
        // The chunks starting in this window.
        let first = at;
        let mut size = 0u64;
        while at < recipe.chunks.len()
            && (at == first || size + u64::from(recipe.chunks[at].len) <= window)
        {
            size += u64::from(recipe.chunks[at].len);
            at += 1;
        }
        stats.windows += 1;
        buf.clear();
        buf.resize(size as usize, 0);
        // (location, position in the window) in storage order.
        let mut reads: Vec<(Loc, usize, Fingerprint, u32)> = Vec::with_capacity(at - first);
        let mut pos = 0usize;
        for c in &recipe.chunks[first..at] {
            let loc = wanted
                .get(&c.fp)
                .copied()
                .flatten()
                .ok_or_else(|| super::not_in_categories(&lineage, id, k, &required, &c.fp))?;
            if loc.len != c.len && !objects[loc.obj].1 {
                return Err(Error::corrupt(
                    &objects[loc.obj].0,
                    format!(
                        "chunk {} has length {}, recipe says {}",
                        c.fp, loc.len, c.len
                    ),
                ));
            }
            reads.push((loc, pos, c.fp, c.len));
            pos += c.len as usize;
        }
        reads.sort_by_key(|(l, p, _, _)| (l.obj, l.offset, *p));
        read_extents(backend, algo, &objects, &reads, &mut buf, &mut log)?;
        out.write_all(&buf).map_err(|e| Error::Output {
            what: "output".into(),
            source: e,
        })?;
        restored += size;
        if let Some(p) = options.progress {
            p(restored);
        }
    }
    out.flush().map_err(|e| Error::Output {
        what: "output".into(),
        source: e,
    })?;
    stats.bytes_restored = restored;
    stats.finish(&log, started);
    Ok(stats)
}

/// Where each chunk of `recipe` is stored, from the chunk metadata of the
/// required categories (the first place found), and the objects' keys
/// with whether each stores encoded entries.
#[allow(clippy::type_complexity)]
fn locate_chunks(
    backend: &dyn Backend,
    required: &[Required],
    recipe: &Recipe,
    stats: &mut LifecycleRestoreStats,
    log: &mut ReadLog,
) -> Result<(FingerprintMap<Option<Loc>>, Vec<(String, bool)>)> {
    let mut wanted: FingerprintMap<Option<Loc>> =
        recipe.chunks.iter().map(|c| (c.fp, None)).collect();
    let mut objects: Vec<(String, bool)> = Vec::new();
    super::for_each_required(backend, required, log, |req, header, prefix, log| {
        let obj = objects.len();
        objects.push((req.key.clone(), header.encoded));
        for idx in 0..prefix {
            stats.categories_read += 1;
            let metas = format::read_meta(backend, &req.key, header, idx, log)?;
            let mut offset = header.data_offset(idx);
            for (fp, len) in metas {
                if let Some(slot @ None) = wanted.get_mut(&fp) {
                    *slot = Some(Loc { obj, offset, len });
                }
                offset += u64::from(len);
            }
        }
        Ok(())
    })?;
    Ok((wanted, objects))
}

/// Reads the chunks `reads` — (location, position in `buf`, fingerprint,
/// recipe length), in storage order — an extent at a time (consecutive or
/// repeated chunks of one object, up to a piece), verifies each distinct
/// chunk (in parallel, decoded) and places it in `buf`.
fn read_extents(
    backend: &dyn Backend,
    algo: &Fingerprinter,
    objects: &[(String, bool)],
    reads: &[(Loc, usize, Fingerprint, u32)],
    buf: &mut [u8],
    log: &mut ReadLog,
) -> Result<()> {
    let mut r = 0;
    while r < reads.len() {
        let (start, obj) = (reads[r].0.offset, reads[r].0.obj);
        let mut end = start + u64::from(reads[r].0.len);
        let mut e = r + 1;
        while e < reads.len()
            && reads[e].0.obj == obj
            && reads[e].0.offset <= end
            && (reads[e].0.offset + u64::from(reads[e].0.len)).max(end) - start
                <= format::PIECE_BYTES
        {
            end = end.max(reads[e].0.offset + u64::from(reads[e].0.len));
            e += 1;
        }
        let (key, encoded) = (&objects[obj].0, objects[obj].1);
        let data = log.read(backend, key, start, end - start)?;
        log.data_bytes += end - start;
        let mut distinct: Vec<&(Loc, usize, Fingerprint, u32)> = reads[r..e].iter().collect();
        distinct.dedup_by_key(|(loc, _, _, _)| loc.offset);
        let decoded: Vec<(u64, std::borrow::Cow<'_, [u8]>)> = distinct
            .par_iter()
            .map(|(loc, _, fp, want)| {
                let s = (loc.offset - start) as usize;
                let stored = &data[s..s + loc.len as usize];
                verify(algo, key, fp, *want, encoded, stored).map(|b| (loc.offset, b))
            })
            .collect::<Result<_>>()?;
        let mut d = 0;
        for (loc, p, _, want) in &reads[r..e] {
            while decoded[d].0 != loc.offset {
                d += 1;
            }
            buf[*p..*p + *want as usize].copy_from_slice(&decoded[d].1);
        }
        r = e;
    }
    Ok(())
}

/// The metrics a restore of backup `id` to a file would have, computed from
/// the volume headers alone (reading nothing else): for trace repositories
/// and for planning. Restored bytes are the snapshot's logical size.
pub fn plan_restore(repo: &Repository, id: BackupId) -> Result<LifecycleRestoreStats> {
    let started = Instant::now();
    let (lineage, k, required) = locate(repo, id)?;
    let snap = repo.snapshot(id)?;
    let backend = repo.backend().as_ref();
    let mut stats = LifecycleRestoreStats {
        id,
        version: k,
        arranged: lineage.state.arranged,
        plan_only: true,
        bytes_restored: snap.logical_bytes,
        chunks: snap.stats.chunks,
        windows: 1,
        ..LifecycleRestoreStats::default()
    };
    let mut headers = ReadLog::default();
    let mut plan = ReadLog::default();
    super::for_each_required(
        backend,
        &required,
        &mut headers,
        |req, header, prefix, _| {
            // Offsets as if chunk data were stored (trace volumes hold none).
            let mut pos = VolumeHeader::len_for(header.categories.len());
            plan.note(&req.key, 0, pos);
            for c in &header.categories[..prefix] {
                stats.categories_read += 1;
                plan.note(&req.key, pos, c.meta_len());
                pos += c.meta_len();
                plan.note(&req.key, pos, c.data_bytes);
                pos += c.data_bytes;
                plan.data_bytes += c.data_bytes;
            }
            Ok(())
        },
    )?;
    stats.finish(&plan, started);
    Ok(stats)
}

/// Restores a backup of a lifecycle repository (see [`crate::layout::lifecycle`]).
pub(crate) fn read_backup(
    repo: &Repository,
    id: BackupId,
    select: Option<&[Range<usize>]>,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    let started = Instant::now();
    let l = if repo.config().trace {
        plan_restore(repo, id)?
    } else {
        if options.progress.is_some() {
            // Only for a caller that shows progress: the recipe read once more.
            announce_total(options, &repo.recipe(id)?.selected(select)?);
        }
        let done = |n| report_done(options, n);
        let opts = LifecycleRestoreOptions {
            progress: options.progress.map(|_| &done as &(dyn Fn(u64) + Sync)),
            ..LifecycleRestoreOptions::default()
        };
        restore_selection_to_writer(repo, id, select, out, &opts)?
    };
    let mut stats = RestoreStats {
        id,
        bytes_restored: l.bytes_restored,
        chunks: l.chunks,
        bytes_read: l.bytes_read,
        containers_read: l.objects_read,
        extents: l.extents,
        policy: "lifecycle".into(),
        plan_only: l.plan_only,
        ..RestoreStats::default()
    };
    finish_stats(&mut stats, started);
    stats.read_amplification = l.read_amplification;
    Ok(stats)
}
