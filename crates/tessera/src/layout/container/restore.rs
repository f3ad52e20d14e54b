//! Restoring from the container log: the restore is planned over the
//! backup's recipe ([`crate::restore::plan`]), its containers read ahead on
//! reader threads and the chunks verified and assembled in windows
//! (forward assembly, with a cache of containers for the bases of deltas).

use crate::backend::Backend;
use crate::delta;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprinter;
use crate::format::snapshot::{BackupId, ChunkRef};
use crate::layout::container::{self, Container, ContainerId};
use crate::repo::Repository;
use crate::restore::options::{
    finish_stats, report_done, selected_chunks, RestoreOptions, RestoreStats,
};
use crate::restore::plan::{self, Plan, Step};
use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// Restores the chunks `select` picks of backup `id` of a container-layout
/// repository into `out` along the normal (fast, strict) path: any missing
/// or damaged chunk fails it.
pub(crate) fn read(
    repo: &Repository,
    id: BackupId,
    select: Option<&[Range<usize>]>,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    let started = Instant::now();
    let chunks = selected_chunks(repo, id, select, options)?;
    // Bytes read count container reads only, not the recipe.
    let io_before = repo.io_stats();
    let capacity = options.cache_containers;
    let plan = plan::plan(
        &chunks,
        options.policy,
        capacity,
        u64::from(repo.config().container_size),
    );
    let mut stats = if repo.config().trace {
        planned_stats(repo, &chunks, &plan)?
    } else {
        let mut stats = execute(repo, id, &chunks, &plan, out, options)?;
        out.flush().map_err(|e| Error::Output {
            what: "output".into(),
            source: e,
        })?;
        stats.bytes_read = repo.io_stats().since(&io_before).read_bytes;
        stats
    };
    stats.id = id;
    stats.cache_containers = capacity;
    stats.policy = options.policy.name().into();
    stats.containers_read = plan.reads().len() as u64 + stats.base_reads;
    stats.extents = stats.containers_read;
    finish_stats(&mut stats, started);
    Ok(stats)
}

/// Containers read ahead of the assembler, per reader.
const READ_AHEAD_PER_READER: usize = 2;

/// Containers read concurrently from a backend without a setting of its
/// own (more requests in flight than one sequential reader keeps the
/// device busier); an object store reads `--connections` at once
/// ([`crate::backend::Hints::connections`]).
const READERS: usize = 2;

/// Containers announced to the backend ([`crate::backend::Hints::will_read`])
/// ahead of the one being dispatched, so that the device (the kernel's
/// readahead, or an object store's prefetching, which keeps up to 8 by
/// default) fetches them while earlier ones are read and assembled.
const HINT_AHEAD: usize = 4;

/// Bytes of chunks verified together in parallel.
const WINDOW_BYTES: u64 = 8 * 1024 * 1024;

/// Bytes of compressed or delta chunks decoded together in parallel: a
/// window ends early at this many, so that the decoded chunks (each in a
/// buffer of its own) reuse the memory freed by the window before instead
/// of touching fresh pages: on an 8 MB restore of compressed chunks, 45 %
/// fewer page faults, 10 % less CPU and a lower peak (docs/MEASUREMENTS.md).
const DECODED_WINDOW_BYTES: u64 = 1024 * 1024;

/// Memory assumed where `/proc/meminfo` cannot be read: 256 GiB.
pub const FALLBACK_MEMORY_BYTES: u64 = 256 << 30;

/// The machine's memory in bytes and where the figure comes from.
pub(crate) fn machine_memory() -> (u64, &'static str) {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text))
        .map_or((FALLBACK_MEMORY_BYTES, "assumed"), |m| (m, "MemTotal"))
}

/// Bytes of the `MemTotal:` line of `/proc/meminfo` text (given in kB).
pub(crate) fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The metrics of a plan without reading data: bytes read are the planned
/// containers' full sizes, read from their headers (not counted as restore I/O).
fn planned_stats(repo: &Repository, chunks: &[ChunkRef], plan: &Plan) -> Result<RestoreStats> {
    let mut sizes: std::collections::HashMap<ContainerId, u64> = Default::default();
    let mut bytes_read = 0;
    for &cid in plan.reads() {
        let size = match sizes.get(&cid) {
            Some(&s) => s,
            None => {
                let head = repo.backend().read_range(
                    &container::key(cid),
                    0,
                    container::HEADER_LEN as u64,
                )?;
                let s = container::Header::parse(cid, &head)?.total_len() as u64;
                sizes.insert(cid, s);
                s
            }
        };
        bytes_read += size;
    }
    Ok(RestoreStats {
        bytes_restored: chunks.iter().map(|c| u64::from(c.len)).sum(),
        chunks: chunks.len() as u64,
        bytes_read,
        plan_only: true,
        ..RestoreStats::default()
    })
}

/// Reads the planned containers (on reader threads, ahead of use) and
/// assembles the backup into `out`.
fn execute(
    repo: &Repository,
    id: BackupId,
    chunks: &[ChunkRef],
    plan: &Plan,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    let algo = repo.fingerprinter();
    let backend = repo.shared_backend();
    let loads = plan.reads();
    let readers = backend.connections().unwrap_or(READERS).max(1);
    // Each load gets a one-slot channel for its result; the slots travel to
    // the assembler in load order, so readers may finish out of order while
    // the assembler works through the containers read before: up to
    // READ_AHEAD_PER_READER per reader are loaded or loading ahead of it.
    let read_ahead = readers * READ_AHEAD_PER_READER;
    let (slot_tx, slot_rx) = bounded::<Receiver<Result<Arc<Container>>>>(read_ahead);
    let (job_tx, job_rx) = bounded::<(ContainerId, Sender<Result<Arc<Container>>>)>(0);

    std::thread::scope(|s| -> Result<RestoreStats> {
        let readers: Vec<_> = (0..readers)
            .map(|_| {
                let (backend, jobs) = (backend.as_ref(), job_rx.clone());
                s.spawn(move || {
                    for (cid, result) in jobs {
                        let loaded = load_container(backend, cid);
                        let failed = loaded.is_err();
                        // A closed slot means the assembler stopped.
                        if result.send(loaded).is_err() || failed {
                            break;
                        }
                    }
                })
            })
            .collect();
        drop(job_rx);
        let hints = backend.as_ref();
        let dispatcher = s.spawn(move || {
            let mut hinted = 0;
            for (k, &cid) in loads.iter().enumerate() {
                let ahead = (k + 1 + HINT_AHEAD).min(loads.len());
                if hinted < ahead {
                    let keys: Vec<String> = loads[hinted.max(k)..ahead]
                        .iter()
                        .map(|&c| container::key(c))
                        .collect();
                    hints.will_read(&keys);
                    hinted = ahead;
                }
                let (result_tx, result_rx) = bounded(1);
                if slot_tx.send(result_rx).is_err() || job_tx.send((cid, result_tx)).is_err() {
                    break;
                }
            }
        });
        let mut next = Loaded { slots: slot_rx };
        // Without delta compression no base is met (a backup made before
        // it was turned off reads its bases on demand).
        let delta = repo.config().delta.kind != delta::DeltaKind::None;
        let mut bases = Bases {
            backend: backend.as_ref(),
            keep_recent: if delta { delta::BASE_CONTAINERS } else { 0 },
            recent: VecDeque::new(),
            wanted: HashMap::new(),
            kept: HashMap::new(),
            reads: 0,
        };
        let mut ctx = Assembly {
            id,
            algo,
            loaded: &mut next,
            bases: &mut bases,
            out,
            options,
        };
        let result = match plan {
            Plan::Cache { steps, .. } => ctx.assemble(chunks, steps),
            Plan::Assembly { windows, .. } => ctx.forward_assemble(chunks, windows),
        }
        .map(|mut stats| {
            stats.base_reads = bases.reads;
            stats
        });
        drop(next);
        let panicked = |_| Error::Pipeline("container reader thread panicked".into());
        dispatcher.join().map_err(panicked)?;
        for r in readers {
            r.join().map_err(panicked)?;
        }
        result
    })
}

/// Containers arriving from the readers in plan order.
struct Loaded {
    slots: Receiver<Receiver<Result<Arc<Container>>>>,
}

impl Loaded {
    /// The next planned container, which must be `expected`.
    fn next(&mut self, expected: ContainerId) -> Result<Arc<Container>> {
        let stopped = |_| Error::Pipeline("container reader stopped early".into());
        let ct = self
            .slots
            .recv()
            .map_err(stopped)?
            .recv()
            .map_err(stopped)??;
        if ct.header.id != expected {
            return Err(Error::Pipeline(format!(
                "reader delivered container {:016x}, expected {:016x}",
                ct.header.id, expected
            )));
        }
        Ok(ct)
    }
}

/// Loads container `id` and checks its header and metadata, mapped rather
/// than copied where the backend can (its pages were usually read ahead on
/// a hint). The data section's checksum is not checked: every chunk the
/// restore uses is verified by its fingerprint, which the checksum would
/// only repeat (at 3 % of a restore's processor time).
fn load_container(backend: &dyn Backend, id: ContainerId) -> Result<Arc<Container>> {
    let bytes = backend.read_shared(&container::key(id))?;
    Ok(Arc::new(Container::parse_unchecked_data(id, bytes)?))
}

/// Containers for the bases of delta-encoded chunks. A delta met during a
/// window is decoded when the window is flushed, so that a base container
/// the plan loads later in the window (a file's changed header precedes its
/// unchanged content) costs no extra read: the containers that pending
/// deltas want are kept when loaded, besides the most recently loaded ones;
/// a base found nowhere is read on demand (counted).
struct Bases<'a> {
    backend: &'a dyn Backend,
    /// Loaded containers kept in `recent`.
    keep_recent: usize,
    /// Most recent first.
    recent: VecDeque<Arc<Container>>,
    /// Base containers of the pending deltas, with how many want each.
    wanted: HashMap<ContainerId, usize>,
    /// Wanted containers loaded since they were wanted.
    kept: HashMap<ContainerId, Arc<Container>>,
    reads: u64,
}

impl Bases<'_> {
    /// Remembers a container the restore loaded.
    fn remember(&mut self, ct: &Arc<Container>) {
        let id = ct.header.id;
        if self.wanted.contains_key(&id) {
            self.kept.insert(id, ct.clone());
        }
        if self.recent.front().is_some_and(|c| c.header.id == id) {
            return;
        }
        self.recent.retain(|c| c.header.id != id);
        self.recent.push_front(ct.clone());
        self.recent.truncate(self.keep_recent);
    }

    /// A pending delta will need container `id`, which the caller may hold
    /// now (`held`: its cache may evict it before the delta is decoded).
    fn want(&mut self, id: ContainerId, held: Option<Arc<Container>>) {
        *self.wanted.entry(id).or_default() += 1;
        let found = held.or_else(|| self.recent.iter().find(|c| c.header.id == id).cloned());
        if let Some(ct) = found {
            self.kept.insert(id, ct);
        }
    }

    /// Container `id` for a pending delta (which no longer wants it after
    /// this): `held` by the caller, kept, or read now.
    fn take(&mut self, id: ContainerId, held: Option<Arc<Container>>) -> Result<Arc<Container>> {
        let found = held.or_else(|| self.kept.get(&id).cloned());
        if let Some(n) = self.wanted.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                self.wanted.remove(&id);
                self.kept.remove(&id);
            }
        }
        if let Some(ct) = found {
            return Ok(ct);
        }
        let ct = load_container(self.backend, id)?;
        self.reads += 1;
        self.remember(&ct);
        if self.wanted.contains_key(&id) {
            self.kept.insert(id, ct.clone());
        }
        Ok(ct)
    }
}

/// A chunk on its way to the output: stored whole in a container, stored
/// compressed (decoded with the window's verification, in parallel), a
/// delta waiting for its base, or decoded.
enum Piece {
    Whole(Arc<Container>, usize),
    Encoded(Arc<Container>, usize),
    Delta {
        delta: Vec<u8>,
        base: container::BaseRef,
    },
    Decoded(Vec<u8>),
}

impl Piece {
    /// The chunk's bytes (empty for an undecoded delta, which never reaches
    /// verification: [`Assembly::decode`] runs first).
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Whole(ct, i) => ct.plain(*i).unwrap_or_default(),
            Piece::Encoded(..) | Piece::Delta { .. } => &[],
            Piece::Decoded(bytes) => bytes,
        }
    }

    /// Decodes a compressed piece (see [`Piece::Encoded`]), then verifies
    /// the chunk's bytes against `c`.
    fn decode_and_verify(&mut self, algo: &Fingerprinter, c: &ChunkRef) -> Result<()> {
        if let Piece::Encoded(ct, i) = self {
            *self = Piece::Decoded(ct.entry(*i)?.into_owned());
        }
        c.verify(algo, self.bytes())
    }
}

/// What assembling a backup needs besides the plan.
struct Assembly<'a, 'b> {
    id: BackupId,
    algo: &'a Fingerprinter,
    loaded: &'a mut Loaded,
    bases: &'a mut Bases<'b>,
    out: &'a mut dyn Write,
    options: &'a RestoreOptions<'a>,
}

impl Assembly<'_, '_> {
    /// Chunk `c` in container `ct` (which the plan loaded): whole, or its
    /// delta (whose base the bases now want; `held` may hold it now).
    fn piece(
        &mut self,
        ct: &Arc<Container>,
        c: &ChunkRef,
        held: impl Fn(ContainerId) -> Option<Arc<Container>>,
    ) -> Result<Piece> {
        let i = ct.find(&c.fp).ok_or_else(|| Error::MissingChunk {
            backup: self.id,
            container: c.container,
            fingerprint: c.fp.to_string(),
        })?;
        match ct.base(i) {
            // Stored as it is: used in place; compressed: decoded with
            // the window, in parallel.
            None if ct.plain(i).is_some() => Ok(Piece::Whole(ct.clone(), i)),
            None => Ok(Piece::Encoded(ct.clone(), i)),
            Some(base) => {
                self.bases.want(base.container, held(base.container));
                Ok(Piece::Delta {
                    delta: ct.entry(i)?.into_owned(),
                    base,
                })
            }
        }
    }

    /// Decodes every delta of `pieces` against its base; `held` may hold
    /// base containers.
    fn decode<'c>(
        &mut self,
        pieces: impl Iterator<Item = (&'c mut Piece, &'c ChunkRef)>,
        held: impl Fn(ContainerId) -> Option<Arc<Container>>,
    ) -> Result<()> {
        for (p, c) in pieces {
            let Piece::Delta { delta, base } = p else {
                continue;
            };
            let bc = self.bases.take(base.container, held(base.container))?;
            let j = bc
                .find(&base.fp)
                .filter(|&j| bc.base(j).is_none())
                .ok_or_else(|| {
                    Error::corrupt(
                        container::key(c.container),
                        format!(
                            "chunk {} is a delta whose base {} is not stored whole in container {:016x}",
                            c.fp, base.fp, base.container
                        ),
                    )
                })?;
            let decoded = delta::decode(&bc.entry(j)?, delta).map_err(|e| {
                Error::corrupt(
                    container::key(c.container),
                    format!("delta of chunk {}: {e}", c.fp),
                )
            })?;
            *p = Piece::Decoded(decoded);
        }
        Ok(())
    }

    /// Follows a cache plan (LRU or OPT) over the recipe, taking loaded
    /// containers from the readers in plan order, verifies windows of chunks
    /// in parallel and writes them.
    fn assemble(&mut self, chunks: &[ChunkRef], steps: &[Step]) -> Result<RestoreStats> {
        let mut cache: HashMap<ContainerId, Arc<Container>> = HashMap::new();
        // A container is dropped from the cache after its last use (the
        // plan never hits it again), so that its memory (an object
        // store's transfer buffer) is free for the next loads at once.
        let mut last_use: HashMap<ContainerId, usize> = HashMap::new();
        for (k, c) in chunks.iter().enumerate() {
            last_use.insert(c.container, k);
        }
        let mut stats = RestoreStats::default();
        let mut window: Vec<(Piece, &ChunkRef)> = Vec::new();
        // The window before, verified and waiting to be written: it is
        // written while the next one is decoded and verified.
        let mut ready: Vec<(Piece, &ChunkRef)> = Vec::new();
        let (mut window_bytes, mut decoded_bytes) = (0u64, 0u64);
        for (k, (c, step)) in chunks.iter().zip(steps).enumerate() {
            if let Step::Load { evict } = step {
                if let Some(victim) = evict {
                    cache.remove(victim);
                }
                let ct = self.loaded.next(c.container)?;
                self.bases.remember(&ct);
                cache.insert(c.container, ct);
            }
            let container = cache.get(&c.container).cloned().ok_or_else(|| {
                Error::Pipeline(format!("plan lost container {:016x}", c.container))
            })?;
            let piece = self.piece(&container, c, |id| cache.get(&id).cloned())?;
            if last_use.get(&c.container) == Some(&k) {
                cache.remove(&c.container);
            }
            if !matches!(piece, Piece::Whole(..)) {
                decoded_bytes += u64::from(c.len);
            }
            window.push((piece, c));
            window_bytes += u64::from(c.len);
            let full = window_bytes >= WINDOW_BYTES || decoded_bytes >= DECODED_WINDOW_BYTES;
            if full || k + 1 == chunks.len() {
                self.decode(window.iter_mut().map(|(p, c)| (p, *c)), |id| {
                    cache.get(&id).cloned()
                })?;
                let (algo, out) = (self.algo, &mut *self.out);
                let (mut verified, mut written) = (Ok(()), Ok(()));
                rayon::in_place_scope(|s| {
                    s.spawn(|_| verified = verify_window(&mut window, algo));
                    written = write_window(&mut ready, out, &mut stats);
                });
                written?;
                verified?;
                std::mem::swap(&mut ready, &mut window);
                (window_bytes, decoded_bytes) = (0, 0);
                report_done(self.options, stats.bytes_restored);
            }
        }
        write_window(&mut ready, self.out, &mut stats)?;
        report_done(self.options, stats.bytes_restored);
        Ok(stats)
    }

    /// Forward assembly: for each window of the recipe, every container it
    /// needs is read once (in first-use order) and all its chunks for the
    /// window are verified and copied into the assembly area (deltas once
    /// every container of the window was read), which is then written.
    fn forward_assemble(
        &mut self,
        chunks: &[ChunkRef],
        windows: &[(usize, usize)],
    ) -> Result<RestoreStats> {
        let mut stats = RestoreStats::default();
        let mut start = 0;
        let mut area: Vec<u8> = Vec::new();
        for &(n, reads) in windows {
            let window = &chunks[start..start + n];
            let mut offsets = Vec::with_capacity(n);
            let mut total = 0usize;
            let mut by_container: HashMap<ContainerId, Vec<usize>> = HashMap::new();
            let mut order = Vec::with_capacity(reads);
            for (k, c) in window.iter().enumerate() {
                offsets.push(total);
                total += c.len as usize;
                let slots = by_container.entry(c.container).or_default();
                if slots.is_empty() {
                    order.push(c.container);
                }
                slots.push(k);
            }
            area.clear();
            area.resize(total, 0);
            let mut deltas: Vec<(Piece, &ChunkRef, usize)> = Vec::new();
            for cid in order {
                let ct = self.loaded.next(cid)?;
                self.bases.remember(&ct);
                let wanted = by_container
                    .get(&cid)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let mut pieces: Vec<(Piece, &ChunkRef, usize)> = Vec::with_capacity(wanted.len());
                for &k in wanted {
                    let p = self.piece(&ct, &window[k], |_| None)?;
                    match p {
                        Piece::Delta { .. } => deltas.push((p, &window[k], k)),
                        _ => pieces.push((p, &window[k], k)),
                    }
                }
                place(&mut pieces, self.algo, &offsets, &mut area)?;
            }
            self.decode(deltas.iter_mut().map(|(p, c, _)| (p, *c)), |_| None)?;
            place(&mut deltas, self.algo, &offsets, &mut area)?;
            self.out.write_all(&area).map_err(|e| Error::Output {
                what: "output".into(),
                source: e,
            })?;
            stats.bytes_restored += total as u64;
            stats.chunks += n as u64;
            report_done(self.options, stats.bytes_restored);
            start += n;
        }
        Ok(stats)
    }
}

/// Decodes and verifies `pieces` (chunk, reference, index in the window)
/// in parallel, then copies them to their `offsets` in the assembly `area`.
fn place(
    pieces: &mut [(Piece, &ChunkRef, usize)],
    algo: &Fingerprinter,
    offsets: &[usize],
    area: &mut [u8],
) -> Result<()> {
    pieces
        .par_iter_mut()
        .try_for_each(|(p, c, _)| p.decode_and_verify(algo, c))?;
    for (p, _, k) in pieces {
        let bytes = p.bytes();
        area[offsets[*k]..offsets[*k] + bytes.len()].copy_from_slice(bytes);
    }
    Ok(())
}

/// Decodes and verifies every chunk of the window, in parallel.
fn verify_window(window: &mut [(Piece, &ChunkRef)], algo: &Fingerprinter) -> Result<()> {
    window
        .par_iter_mut()
        .try_for_each(|(p, c)| p.decode_and_verify(algo, c))
}

/// Writes a verified window's chunks in order, emptying it: chunks lying
/// back to back in a container in one write (a run of a fresh backup's
/// chunks is a container's whole data section), which passes the output's
/// buffer by instead of being copied into it.
fn write_window(
    window: &mut Vec<(Piece, &ChunkRef)>,
    out: &mut dyn Write,
    stats: &mut RestoreStats,
) -> Result<()> {
    let mut write = |bytes: &[u8]| {
        out.write_all(bytes).map_err(|e| Error::Output {
            what: "output".into(),
            source: e,
        })
    };
    // The container and its first and last entry of the run not yet written.
    let mut run: Option<(Arc<Container>, usize, usize)> = None;
    for (p, _) in window.drain(..) {
        stats.bytes_restored += p.bytes().len() as u64;
        stats.chunks += 1;
        if let (Some((ct, _, last)), Piece::Whole(next, k)) = (&mut run, &p) {
            if Arc::ptr_eq(ct, next) && ct.follows(*last, *k) {
                *last = *k;
                continue;
            }
        }
        if let Some((ct, first, last)) = run.take() {
            write(ct.stored_span(first, last))?;
        }
        match p {
            Piece::Whole(ct, k) if ct.header.has_data() && !ct.header.encoded() => {
                run = Some((ct, k, k));
            }
            other => write(other.bytes())?,
        }
    }
    if let Some((ct, first, last)) = run {
        write(ct.stored_span(first, last))?;
    }
    Ok(())
}

/// Refuses a restore cache of `n` containers larger than the machine's
/// memory (trace repositories hold no data: any size is fine there).
pub(crate) fn check_cache(repo: &Repository, n: u64) -> Result<()> {
    let config = repo.config();
    if config.trace {
        return Ok(());
    }
    let container = u64::from(config.container_size).max(1);
    let (memory, source) = machine_memory();
    let max = (memory / container).max(1);
    if n > max {
        return Err(Error::InvalidOption(format!(
            "restore cache size (--cache-size) {n} containers of {container} bytes exceeds \
             the machine's memory ({memory} bytes, {source}): valid range 1..={max}"
        )));
    }
    Ok(())
}
