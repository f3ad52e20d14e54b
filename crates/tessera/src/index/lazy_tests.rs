use super::*;
use crate::backend::testing::{mem, Mem};
use crate::backend::Counting;
use crate::index::test_sim::Sim;
use crate::index::{Exact, Reorder};
use proptest::prelude::*;

fn fp(i: u32) -> Fingerprint {
    crate::fingerprint::FingerprintAlgo::Blake3.hash(&i.to_le_bytes())
}

fn params(mode: Mode) -> LazyParams {
    LazyParams {
        mode,
        memory_bytes: 64 << 10,
        buffer_share: 0.5,
        bloom_bytes: 0,
        bloom_fpr: 0.01,
        bft: 4,
        prefetch: 16,
        avg_chunk: 1024,
        bucket_bytes: 512,
        part_buckets: 4,
        hold_duplicates: false,
    }
}

/// A decision's class as the exact index sees it: a duplicate of a
/// container this backup wrote is an internal duplicate (which of the two a
/// repeat gets depends on when its first occurrence was placed).
fn class(d: Decision, first_new: ContainerId) -> u8 {
    match d {
        Decision::Unique => 0,
        Decision::Duplicate(c) if c < first_new => 1,
        Decision::Duplicate(_) | Decision::InternalDuplicate => 2,
    }
}

/// Length of the simulated chunks.
const CHUNK_LEN: u32 = 1024;

impl Sim {
    /// Runs `stream` through `index` like the pipeline: batches in, decisions
    /// put back in stream order, unique chunks placed into containers.
    /// Returns the decisions and checks every duplicate names a container
    /// holding the chunk.
    fn backup_deferred(
        &mut self,
        index: &mut dyn DedupIndex,
        stream: &[u32],
        batch: usize,
    ) -> Vec<Decision> {
        let mut filling = self.filling();
        let mut reorder = Reorder::default();
        let mut out = Vec::new();
        let chunks: Vec<Chunk> = stream
            .iter()
            .enumerate()
            .map(|(seq, &i)| Chunk {
                seq: seq as u64,
                fp: fp(i),
                len: CHUNK_LEN,
                data: None,
            })
            .collect();
        let mut parts = chunks.chunks(batch.max(1));
        loop {
            let mut decided = Vec::new();
            let last = match parts.next() {
                Some(p) => {
                    index.submit(p.to_vec(), &mut decided).unwrap();
                    false
                }
                None => {
                    index.finish(&mut decided).unwrap();
                    true
                }
            };
            let mut ready = Vec::new();
            reorder.push(decided, &mut ready);
            let mut placed = Vec::new();
            for (c, d) in ready {
                if let Decision::Duplicate(cid) = d {
                    let holds = self.holds(&filling, cid, &c.fp);
                    assert!(holds, "container {cid} does not hold chunk {}", c.seq);
                }
                if d == Decision::Unique {
                    placed.push((c.fp, filling.place(c.fp)));
                }
                out.push(d);
            }
            index.placed(&placed).unwrap();
            if last {
                break;
            }
        }
        assert_eq!(reorder.waiting(), 0, "decisions left undecided");
        assert_eq!(out.len(), stream.len());
        self.finish(filling);
        index.commit(self.next).unwrap();
        out
    }
}

/// Runs the same backups through the exact index and `mode`, each on its own
/// repository, and checks that they decide alike.
fn same_as_exact(mode: Mode, p: LazyParams, backups: &[(Vec<u32>, usize)], per_container: usize) {
    let mut sims: Vec<Sim> = (0..2)
        .map(|_| Sim::new(mem(), per_container, CHUNK_LEN))
        .collect();
    for (n, (stream, batch)) in backups.iter().enumerate() {
        let first_new = [sims[0].next, sims[1].next];
        let ids = sims[0].ids();
        let mut exact = Exact::open(sims[0].backend.clone(), &ids).unwrap();
        let want = sims[0].backup_deferred(&mut exact, stream, *batch);
        let ids = sims[1].ids();
        let mut lazy = Lazy::open(sims[1].backend.clone(), &ids, LazyParams { mode, ..p }).unwrap();
        let got = sims[1].backup_deferred(&mut lazy, stream, *batch);
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(
                class(*w, first_new[0]),
                class(*g, first_new[1]),
                "backup {n}, chunk {k}: exact {w:?}, {mode:?} {g:?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Lazy and eager decide every chunk like the exact index, whatever the
    /// batching, cache, buffer, Bloom filter and table shape.
    #[test]
    fn lazy_and_eager_decide_like_the_exact_index(
        backups in prop::collection::vec(
            (prop::collection::vec(0u32..120, 0..300), 1usize..50), 1..6),
        per_container in 1usize..9,
        memory in prop::sample::select(vec![2u64 << 10, 16 << 10, 1 << 20]),
        bft in 1u32..6,
        prefetch in prop::sample::select(vec![1u32, 7, 64]),
        bloom in prop::sample::select(vec![0u64, 16]),
        bucket_bytes in prop::sample::select(vec![table::MIN_BUCKET_BYTES, 512]),
    ) {
        let p = LazyParams {
            memory_bytes: memory,
            bft,
            prefetch,
            bloom_bytes: bloom,
            bucket_bytes,
            ..params(Mode::Lazy)
        };
        same_as_exact(Mode::Lazy, p, &backups, per_container);
        same_as_exact(Mode::Eager, p, &backups, per_container);
    }
}

/// Versions of a 6000-chunk stream whose 8-chunk runs are reordered in
/// every version (files moved around), with a few new chunks in each run.
fn versions(n: usize) -> Vec<Vec<u32>> {
    let mut v: Vec<u32> = (0..6000).collect();
    let mut next = 10_000;
    let mut out = Vec::new();
    let mut state = 0x9e37_79b9_u64;
    let mut rand = move |m: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % m as u64) as usize
    };
    for _ in 0..n {
        let mut runs: Vec<Vec<u32>> = v.chunks(8).map(<[u32]>::to_vec).collect();
        for i in (1..runs.len()).rev() {
            runs.swap(i, rand(i + 1));
        }
        for run in &mut runs {
            if rand(4) == 0 {
                let at = rand(run.len());
                run[at] = next;
                next += 1;
            }
        }
        v = runs.concat();
        out.push(v.clone());
    }
    out
}

fn run_versions(mode: Mode, bloom_bytes: u64) -> IndexStats {
    let counting = Arc::new(Counting::new(Box::new(Mem::default())));
    let mut sim = Sim::new(counting, 64, CHUNK_LEN);
    let p = LazyParams {
        mode,
        // Far below the index (6000+ entries): ~1000 cached fingerprints.
        memory_bytes: 200 << 10,
        bloom_bytes,
        bft: 8,
        prefetch: 64,
        part_buckets: 4096,
        ..params(mode)
    };
    let mut last = IndexStats::default();
    for stream in versions(4) {
        let ids = sim.ids();
        let mut index = Lazy::open(sim.backend.clone(), &ids, p).unwrap();
        sim.backup_deferred(&mut index, &stream, 512);
        last = index.stats();
    }
    last
}

#[test]
fn lazy_needs_fewer_disk_reads_than_eager() {
    let eager = run_versions(Mode::Eager, 0);
    let lazy = run_versions(Mode::Lazy, 0);
    eprintln!("eager {eager:?}\nlazy {lazy:?}");
    assert!(eager.disk_lookups > 0 && lazy.disk_lookups > 0);
    assert!(
        lazy.disk_lookups * 2 < eager.disk_lookups,
        "lazy {} vs eager {} on-disk lookups",
        lazy.disk_lookups,
        eager.disk_lookups
    );
    assert!(lazy.postlookup_hits > 0, "{lazy:?}");
    assert!(lazy.prefetches > 0 && eager.prefetches > 0);
    // A tiny Bloom filter lets unique chunks through: more on-disk work for both.
    let eager_small = run_versions(Mode::Eager, 64);
    let lazy_small = run_versions(Mode::Lazy, 64);
    assert!(eager_small.bloom_false_positives > eager.bloom_false_positives);
    assert!(lazy_small.disk_lookups < eager_small.disk_lookups);
}

/// Versions of a 6000-chunk stream that keep its order, as releases of a
/// source tree do: each changes about one chunk in 50 in place and appends
/// a few new ones.
fn local_versions(n: usize) -> Vec<Vec<u32>> {
    let mut v: Vec<u32> = (0..6000).collect();
    let mut next = 10_000;
    let mut out = Vec::new();
    for k in 0..n {
        for (i, c) in v.iter_mut().enumerate() {
            if (i * 7 + k * 13) % 50 == 0 {
                *c = next;
                next += 1;
            }
        }
        v.extend(next..next + 20);
        next += 20;
        out.push(v.clone());
    }
    out
}

/// On-disk lookups of `mode` summed over backups of `streams`.
fn total_disk_lookups(mode: Mode, p: LazyParams, streams: &[Vec<u32>]) -> u64 {
    let mut sim = Sim::new(mem(), 64, CHUNK_LEN);
    let p = LazyParams { mode, ..p };
    let mut total = 0;
    for stream in streams {
        let ids = sim.ids();
        let mut index = Lazy::open(sim.backend.clone(), &ids, p).unwrap();
        sim.backup_deferred(&mut index, stream, 512);
        total += index.stats().disk_lookups;
    }
    total
}

/// The adaptive lazy index makes no more on-disk lookups than eager where
/// the cache already serves the stream (a small and a large budget), and at
/// most half as many where the index is forced to disk.
#[test]
fn adaptive_lazy_reads_no_more_than_eager() {
    let local = local_versions(6);
    for memory in [48 << 10, 1 << 20] {
        let p = LazyParams {
            memory_bytes: memory,
            bft: 8,
            prefetch: 64,
            part_buckets: 4096,
            ..params(Mode::Lazy)
        };
        let eager = total_disk_lookups(Mode::Eager, p, &local);
        let lazy = total_disk_lookups(Mode::Lazy, p, &local);
        eprintln!("locality-rich, {memory} bytes: eager {eager}, lazy {lazy}");
        assert!(eager > 0);
        assert!(lazy <= eager, "{memory} bytes: lazy {lazy} > eager {eager}");
    }
    let p = LazyParams {
        memory_bytes: 200 << 10,
        bft: 8,
        prefetch: 64,
        part_buckets: 4096,
        ..params(Mode::Lazy)
    };
    let forced = versions(4);
    let eager = total_disk_lookups(Mode::Eager, p, &forced);
    let lazy = total_disk_lookups(Mode::Lazy, p, &forced);
    eprintln!("forced to disk: eager {eager}, lazy {lazy}");
    assert!(
        2 * lazy <= eager,
        "forced to disk: lazy {lazy}, eager {eager}"
    );
}

#[test]
fn buffer_stays_within_its_budget() {
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 16, CHUNK_LEN);
    let stream: Vec<u32> = (0..3000).collect();
    let mut index = Lazy::open(backend.clone(), &[], params(Mode::Lazy)).unwrap();
    sim.backup_deferred(&mut index, &stream, 100);
    let p = LazyParams {
        memory_bytes: 40 << 10,
        bft: 1000,
        ..params(Mode::Lazy)
    };
    let ids = sim.ids();
    let mut index = Lazy::open(backend, &ids, p).unwrap();
    sim.backup_deferred(&mut index, &stream, 100);
    let s = index.stats();
    // Buckets never fill (bft 1000): every search is forced by the budget.
    assert!(s.forced_flushes > 0, "{s:?}");
    assert!(
        s.buffer_peak_bytes <= 20 << 10,
        "held {} bytes with a 20 KiB buffer",
        s.buffer_peak_bytes
    );
}

/// A lazy index's repository after one backup of 200 chunks.
fn backed_up_once() -> (Arc<dyn Backend>, Sim, Vec<u32>, LazyParams) {
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 8, CHUNK_LEN);
    let stream: Vec<u32> = (0..200).collect();
    let p = params(Mode::Lazy);
    let mut index = Lazy::open(backend.clone(), &[], p).unwrap();
    sim.backup_deferred(&mut index, &stream, 50);
    (backend, sim, stream, p)
}

#[test]
fn open_rebuilds_a_damaged_or_stale_index_and_gc_rebuilds_at_commit() {
    let (backend, mut sim, stream, p) = backed_up_once();
    let ids = sim.ids();

    // Intact: nothing to rebuild, everything is a duplicate.
    let mut index = Lazy::open(backend.clone(), &ids, p).unwrap();
    assert!(!index.stats().rebuilt);
    let d = sim.backup_deferred(&mut index, &stream, 50);
    assert!(d.iter().all(|d| matches!(d, Decision::Duplicate(_))));

    // A damaged log segment: the chunks it covers are stored again (never a
    // wrong container) and the commit rebuilds the index.
    let names = backend.list(LAZY_PREFIX).unwrap();
    let seg = names.iter().find(|n| n.starts_with('l')).unwrap();
    let key = format!("{LAZY_PREFIX}/{seg}");
    let mut bytes = backend.read(&key).unwrap();
    bytes[100] ^= 1;
    backend.write(&key, &bytes).unwrap();
    let ids = sim.ids();
    let mut index = Lazy::open(backend.clone(), &ids, p).unwrap();
    sim.backup_deferred(&mut index, &stream, 50);
    assert!(index.stats().rebuilt);
    let ids = sim.ids();
    let mut index = Lazy::open(backend.clone(), &ids, p).unwrap();
    let d = sim.backup_deferred(&mut index, &stream, 50);
    assert!(d.iter().all(|d| matches!(d, Decision::Duplicate(_))));

    // A missing manifest: rebuilt at open.
    backend.delete(MANIFEST_KEY).unwrap();
    let ids = sim.ids();
    let index = Lazy::open(backend.clone(), &ids, p).unwrap();
    assert!(index.stats().rebuilt);
}

#[test]
fn garbage_collection_makes_the_commit_rebuild() {
    let (backend, mut sim, stream, p) = backed_up_once();
    // GC deleted container 1 (chunks 0..8): relocate, commit, and the index forgets it.
    let gone = 1;
    backend.delete(&container::key(gone)).unwrap();
    sim.containers.remove(&gone);
    let ids = sim.ids();
    let mut index = Lazy::open(backend.clone(), &ids, p).unwrap();
    index
        .relocate(&BTreeSet::from([gone]), &Relocations::default())
        .unwrap();
    index.commit(sim.next).unwrap();
    let d = sim.backup_deferred(&mut index, &stream, 50);
    assert!(d[..8].iter().all(|d| *d == Decision::Unique), "{d:?}");
    assert!(d[8..]
        .iter()
        .all(|d| matches!(d, Decision::Duplicate(c) if *c != gone)));
}

#[test]
fn manifest_round_trip_and_damage() {
    let m = Manifest {
        next_container: 9,
        table: TableMeta {
            generation: 3,
            buckets: 16,
            entries: 40,
            bucket_bytes: 512,
            part_buckets: 4,
        },
        log_generation: 2,
        log_len: 77,
        referenced: vec![1, 4, 8],
    };
    let bytes = m.encode();
    assert_eq!(Manifest::decode(&bytes).unwrap(), m);
    let mut bad = bytes.clone();
    let at = bad.len() / 2;
    bad[at] ^= 1;
    assert!(Manifest::decode(&bad).is_err());
    assert!(Manifest::decode(&bytes[..20]).is_err());
}

proptest! {
    /// The slots' bucket runs tile the table in order, and every
    /// fingerprint's bucket lies in its slot's run.
    #[test]
    fn slots_tile_the_table(slots in 1usize..64, buckets in 1u64..5000, keys in prop::collection::vec(any::<u32>(), 1..50)) {
        let mut next = 0;
        for s in 0..slots {
            let (first, count) = slot_buckets(s, slots, buckets);
            prop_assert!(first <= next && first + count >= next, "slot {s}: {first}+{count}, expected from {next}");
            next = first + count;
        }
        prop_assert_eq!(next, buckets);
        let meta = TableMeta { generation: 1, buckets, entries: 0, bucket_bytes: 512, part_buckets: 4 };
        for k in keys {
            let f = fp(k);
            let slot = ((u128::from(f.key64()) * slots as u128) >> 64) as usize;
            let (first, count) = slot_buckets(slot, slots, buckets);
            let b = meta.bucket_of(&f);
            prop_assert!(first <= b && b < first + count);
        }
    }
}

thread_local! {
    /// Spill limits of the indexes this thread opens (`None`: the defaults).
    pub(super) static SPILL_LIMITS: std::cell::Cell<Option<SpillLimits>> =
        const { std::cell::Cell::new(None) };
}

/// What a run of [`spill_run`] observed: each backup's decisions and
/// statistics (without timings and memory) and the index objects at the end.
type SpillRun = (Vec<Vec<Decision>>, Vec<String>, Vec<(String, Vec<u8>)>);

/// Backs up [`versions`] with `mode` and the spill `limits`: each backup
/// places its unique chunks and, as a rewriting policy would, every 40th
/// duplicate; a container written behind the index's back before the third
/// backup makes its open scan it.
fn spill_run(mode: Mode, limits: Option<SpillLimits>) -> SpillRun {
    SPILL_LIMITS.with(|l| l.set(limits));
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 64, CHUNK_LEN);
    let p = LazyParams {
        memory_bytes: 200 << 10,
        bft: 8,
        prefetch: 64,
        part_buckets: 4096,
        ..params(mode)
    };
    let (mut decisions, mut stats) = (Vec::new(), Vec::new());
    for (n, stream) in versions(4).into_iter().enumerate() {
        if n == 2 {
            let fps: Vec<Fingerprint> = (0..100).chain(50_000..51_000).map(fp).collect();
            sim.write(sim.next, &fps);
            sim.next += 1;
        }
        let ids = sim.ids();
        let mut index = Lazy::open(backend.clone(), &ids, p).unwrap();
        let mut filling = sim.filling();
        let mut reorder = Reorder::default();
        let mut out = Vec::new();
        let chunks: Vec<Chunk> = (stream.iter().enumerate())
            .map(|(seq, &i)| Chunk {
                seq: seq as u64,
                fp: fp(i),
                len: CHUNK_LEN,
                data: None,
            })
            .collect();
        let mut parts = chunks.chunks(300);
        loop {
            let mut decided = Vec::new();
            let last = match parts.next() {
                Some(part) => {
                    index.submit(part.to_vec(), &mut decided).unwrap();
                    false
                }
                None => {
                    index.finish(&mut decided).unwrap();
                    true
                }
            };
            let mut ready = Vec::new();
            reorder.push(decided, &mut ready);
            let mut placed = Vec::new();
            for (c, d) in ready {
                let rewrite = matches!(d, Decision::Duplicate(_)) && c.seq % 40 == 0;
                if d == Decision::Unique || rewrite {
                    placed.push((c.fp, filling.place(c.fp)));
                }
                out.push(d);
            }
            index.placed(&placed).unwrap();
            if last {
                break;
            }
        }
        sim.finish(filling);
        index.commit(sim.next).unwrap();
        let s = IndexStats {
            memory_bytes: 0,
            disk_seconds: 0.0,
            prefetch_seconds: 0.0,
            ..index.stats()
        };
        stats.push(format!("{s:?}"));
        decisions.push(out);
    }
    SPILL_LIMITS.with(|l| l.set(None));
    let objects = backend
        .list(LAZY_PREFIX)
        .unwrap()
        .into_iter()
        .map(|name| {
            let key = format!("{LAZY_PREFIX}/{name}");
            let bytes = backend.read(&key).unwrap();
            (key, bytes)
        })
        .collect();
    (decisions, stats, objects)
}

#[test]
fn spilling_changes_no_decision_lookup_or_object() {
    for mode in [Mode::Lazy, Mode::Eager] {
        let (d, s, o) = spill_run(mode, None);
        // Tiny maps (~900 entries each in memory) and no tail: the new
        // fingerprints, their log positions, the rewritten duplicates and
        // unplaced log entries all spill.
        let tiny = SpillLimits {
            budget: 0,
            max_tail: 0,
        };
        let (td, ts, to) = spill_run(mode, Some(tiny));
        assert_eq!(d, td, "{mode:?} decisions");
        assert_eq!(s, ts, "{mode:?} statistics");
        assert_eq!(o.len(), to.len());
        for ((k, b), (tk, tb)) in o.iter().zip(&to) {
            assert_eq!(k, tk);
            assert!(b == tb, "{mode:?}: {k} differs");
        }
    }
}
