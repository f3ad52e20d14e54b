use super::*;
use crate::backend::testing::{mem, Mem};
use crate::backend::Counting;
use crate::index::test_sim::Sim;
use crate::index::Exact;
use proptest::prelude::*;

/// Fingerprint number `i`: a hash for even numbers, a short trace-like
/// fingerprint (6 significant bytes) for odd ones.
fn fp(i: u32) -> Fingerprint {
    if i.is_multiple_of(2) {
        crate::fingerprint::FingerprintAlgo::Blake3.hash(&i.to_le_bytes())
    } else {
        let mut f = [0u8; 32];
        f[..4].copy_from_slice(&i.to_le_bytes());
        f[4] = 0xa5;
        f[5] = 0x3c;
        Fingerprint(f)
    }
}

fn chunk(seq: u64, i: u32) -> Chunk {
    Chunk {
        seq,
        fp: fp(i),
        len: CHUNK_LEN,
        data: None,
    }
}

fn class(d: Decision) -> u8 {
    match d {
        Decision::Unique => 0,
        Decision::Duplicate(_) => 1,
        Decision::InternalDuplicate => 2,
    }
}

/// Length of the simulated chunks.
const CHUNK_LEN: u32 = 8192;

impl Sim {
    /// Writes a container holding `ids` (as a rewriting policy would: the
    /// fingerprints may be stored already).
    fn extra(&mut self, ids: &[u32]) {
        if ids.is_empty() {
            return;
        }
        let id = self.next;
        self.next += 1;
        let fps: Vec<_> = ids.iter().map(|&i| fp(i)).collect();
        self.write(id, &fps);
    }

    /// Runs one backup of `stream` in batches of `batch` through every index,
    /// checks that they agree, and commits them. Returns each index's decisions.
    fn backup(
        &mut self,
        indexes: &mut [&mut dyn DedupIndex],
        stream: &[u32],
        batch: usize,
    ) -> Vec<Vec<Decision>> {
        let mut all = vec![Vec::new(); indexes.len()];
        let mut filling = self.filling();
        let mut seq = 0u64;
        for part in stream.chunks(batch.max(1)) {
            let chunks: Vec<Chunk> = part
                .iter()
                .map(|&i| {
                    seq += 1;
                    chunk(seq - 1, i)
                })
                .collect();
            let mut outs = Vec::new();
            for idx in indexes.iter_mut() {
                let mut out = Vec::new();
                idx.submit(chunks.clone(), &mut out).unwrap();
                assert_eq!(out.len(), chunks.len(), "an index deferred decisions");
                outs.push(out);
            }
            let mut placed = Vec::new();
            for (k, c) in chunks.iter().enumerate() {
                let first = outs[0][k].1;
                for (n, out) in outs.iter().enumerate() {
                    let d = out[k].1;
                    assert_eq!(out[k].0.seq, c.seq);
                    assert_eq!(
                        class(d),
                        class(first),
                        "index {n} decided {d:?}, index 0 {first:?}, for chunk {} ({:?})",
                        c.seq,
                        c.fp
                    );
                    if let Decision::Duplicate(cid) = d {
                        let holds = self.holds(&filling, cid, &c.fp);
                        assert!(holds, "index {n}: container {cid} does not hold {:?}", c.fp);
                    }
                    all[n].push(d);
                }
                if first == Decision::Unique {
                    placed.push((c.fp, filling.place(c.fp)));
                }
            }
            for idx in indexes.iter_mut() {
                idx.placed(&placed).unwrap();
            }
        }
        self.finish(filling);
        for idx in indexes.iter_mut() {
            idx.finish(&mut Vec::new()).unwrap();
            idx.commit(self.next).unwrap();
        }
        all
    }
}

fn small_params() -> DdfsParams {
    DdfsParams {
        bloom_fpr: 0.01,
        cache_bytes: 1 << 20,
        bucket_bytes: 256,
        part_buckets: 4,
        compaction: Compaction {
            fan_in: 3,
            min_entries: 8,
        },
        bloom_budget: 1 << 30,
    }
}

/// Flips a byte in the middle of the first object of `index/ddfs` whose name starts with `prefix`.
fn damage(backend: &dyn Backend, prefix: char) {
    let names = backend.list(DDFS_PREFIX).unwrap();
    if let Some(name) = names.iter().find(|n| n.starts_with(prefix)) {
        let key = format!("{DDFS_PREFIX}/{name}");
        let mut bytes = backend.read(&key).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x10;
        backend.write(&key, &bytes).unwrap();
    }
}

#[derive(Clone, Debug)]
struct Case {
    backups: Vec<(Vec<u32>, Vec<u32>, usize, u8)>,
    per_container: usize,
    params: DdfsParams,
}

fn case() -> impl Strategy<Value = Case> {
    let backup = (
        prop::collection::vec(0u32..90, 0..150),
        prop::collection::vec(0u32..90, 0..6),
        1usize..40,
        0u8..8,
    );
    (
        prop::collection::vec(backup, 1..6),
        1usize..7,
        prop::sample::select(vec![0u64, 2500, 1 << 20]),
        prop::sample::select(vec![table::MIN_BUCKET_BYTES, 200, 4096]),
        prop::sample::select(vec![1u32, 3, 4096]),
        prop::sample::select(vec![0.01f64, 0.5]),
        (2u32..5, prop::sample::select(vec![1u64, 10, 4096])),
        prop::sample::select(vec![0u64, 200, 1 << 30]),
    )
        .prop_map(
            |(
                backups,
                per_container,
                cache_bytes,
                bucket_bytes,
                part_buckets,
                bloom_fpr,
                (fan_in, min_entries),
                bloom_budget,
            )| Case {
                backups,
                per_container,
                params: DdfsParams {
                    bloom_fpr,
                    cache_bytes,
                    bucket_bytes,
                    part_buckets,
                    compaction: Compaction {
                        fan_in,
                        min_entries,
                    },
                    bloom_budget,
                },
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// DDFS decides every chunk of random multi-backup streams in the same
    /// class as the exact index, and every duplicate names a container that
    /// holds the chunk, whatever the cache size, bucket size, Bloom filter
    /// accuracy and memory budget (down to no filter in memory),
    /// fingerprints stored twice, and damage to the index objects.
    #[test]
    fn same_decisions_as_the_exact_index(c in case()) {
        let backend = mem();
        let mut sim = Sim::new(backend.clone(), c.per_container, CHUNK_LEN);
        for (stream, extra, batch, harm) in &c.backups {
            sim.extra(extra);
            match harm {
                1 => backend.delete(MANIFEST_KEY).unwrap(),
                2 => damage(backend.as_ref(), 't'),
                3 => damage(backend.as_ref(), 'b'),
                4 => damage(backend.as_ref(), 'm'),
                _ => {}
            }
            let ids = sim.ids();
            let mut exact = Exact::open(backend.clone(), &ids).unwrap();
            let mut ddfs = Ddfs::open(backend.clone(), &ids, c.params).unwrap();
            let out = sim.backup(&mut [&mut exact, &mut ddfs], stream, *batch);
            let s = ddfs.stats();
            prop_assert_eq!(s.lookups, stream.len() as u64);
            let unique = out[1].iter().filter(|d| **d == Decision::Unique).count() as u64;
            prop_assert_eq!(s.bloom_negatives + s.bloom_false_positives, unique);
            prop_assert!(s.bloom_bytes <= c.params.bloom_budget);
            // A fingerprint stored again is in two runs until they merge.
            prop_assert!(s.entries >= exact.stats().entries);
            prop_assert!(ddfs.table_entries() >= exact.len() as u64);
            if c.backups.iter().all(|b| b.1.is_empty()) {
                prop_assert_eq!(ddfs.table_entries(), exact.len() as u64);
            }
        }
        // Everything is in the table after the last commit, and a reopened
        // index answers every fingerprint from it.
        let ids = sim.ids();
        let mut exact = Exact::open(backend.clone(), &ids).unwrap();
        let mut ddfs = Ddfs::open(backend.clone(), &ids, c.params).unwrap();
        prop_assert!(!ddfs.stats().rebuilt);
        let all: Vec<u32> = (0..90).collect();
        sim.backup(&mut [&mut exact, &mut ddfs], &all, 7);
    }
}

fn counting() -> ((), Arc<Counting>) {
    ((), Arc::new(Counting::new(Box::new(Mem::default()))))
}

#[test]
fn repeated_backup_hits_the_cache_after_one_disk_lookup_per_container() {
    let (_dir, backend) = counting();
    let mut sim = Sim::new(backend.clone(), 100, CHUNK_LEN);
    let stream: Vec<u32> = (0..2000).collect();
    let params = DdfsParams {
        bucket_bytes: 4096,
        ..DdfsParams::default()
    };
    let mut first = Ddfs::open(backend.clone(), &[], params).unwrap();
    sim.backup(&mut [&mut first], &stream, 64);
    let s = first.stats();
    assert_eq!(s.bloom_negatives, 2000);
    assert_eq!(s.disk_lookups, 0);
    assert_eq!(s.entries, 2000);
    assert!(s.commit_write_bytes > 0);

    let ids = sim.ids();
    assert_eq!(ids.len(), 20);
    let reads_before = backend.stats().reads;
    let mut second = Ddfs::open(backend.clone(), &ids, params).unwrap();
    // Opening reads the manifest and the Bloom filter only.
    assert_eq!(backend.stats().reads - reads_before, 2);
    let out = sim.backup(&mut [&mut second], &stream, 64);
    assert!(out[0].iter().all(|d| matches!(d, Decision::Duplicate(_))));
    let s = second.stats();
    assert_eq!(s.lookups, 2000);
    assert_eq!(s.disk_lookups, 20);
    assert_eq!(s.container_loads, 20);
    assert_eq!(s.cache_hits, 1980);
    assert_eq!(s.bloom_false_positives, 0);
    assert_eq!(s.bloom_negatives, 0);
    // Nothing new: the commit writes no table.
    assert_eq!(s.commit_write_bytes, 0);
    assert!(s.memory_bytes >= s.bloom_bytes + s.cache_peak_bytes);
    assert!(s.cache_peak_bytes > 0);
}

#[test]
fn a_container_load_reads_the_next_containers_metadata_ahead_once() {
    let mem = Arc::new(Mem::default());
    let backend: Arc<dyn Backend> = mem.clone();
    let mut sim = Sim::new(backend.clone(), 100, CHUNK_LEN);
    let stream: Vec<u32> = (0..2000).collect();
    let mut first = Ddfs::open(backend.clone(), &[], DdfsParams::default()).unwrap();
    sim.backup(&mut [&mut first], &stream, 64);
    let ids = sim.ids();
    assert_eq!(ids.len(), 20);
    assert!(
        mem.heads_hinted().is_empty(),
        "a first backup loads nothing"
    );

    let mut second = Ddfs::open(backend.clone(), &ids, DdfsParams::default()).unwrap();
    sim.backup(&mut [&mut second], &stream, 64);
    assert_eq!(second.stats().container_loads, 20);
    // Each container after the first is hinted once, before its load,
    // with the length its metadata is first read with; none past the last.
    let hints = mem.heads_hinted();
    let expected: Vec<(String, u64)> = ids[1..]
        .iter()
        .map(|&c| (container::key(c), container::META_GUESS))
        .collect();
    assert_eq!(hints, expected);
}

#[test]
fn tiny_cache_evicts_and_still_decides_right() {
    let (_dir, backend) = counting();
    let mut sim = Sim::new(backend.clone(), 50, CHUNK_LEN);
    let stream: Vec<u32> = (0..500).collect();
    let params = DdfsParams {
        cache_bytes: 8 << 10,
        ..small_params()
    };
    let mut first = Ddfs::open(backend.clone(), &[], params).unwrap();
    sim.backup(&mut [&mut first], &stream, 64);
    // Interleave two halves so that the cache (about 60 entries) thrashes.
    let mixed: Vec<u32> = (0..250).flat_map(|i| [i, 499 - i]).collect();
    let ids = sim.ids();
    let mut second = Ddfs::open(backend.clone(), &ids, params).unwrap();
    let out = sim.backup(&mut [&mut second], &mixed, 64);
    assert!(out[0].iter().all(|d| matches!(d, Decision::Duplicate(_))));
    let s = second.stats();
    assert!(s.disk_lookups > 20, "{s:?}");
    assert!(s.cache_peak_bytes <= 8 << 10, "{s:?}");
}

#[test]
fn bloom_false_positives_are_counted_and_unique() {
    let (_dir, backend) = counting();
    let mut sim = Sim::new(backend.clone(), 100, CHUNK_LEN);
    let params = DdfsParams {
        bloom_fpr: 0.5,
        ..small_params()
    };
    let mut first = Ddfs::open(backend.clone(), &[], params).unwrap();
    sim.backup(&mut [&mut first], &(0..3000).collect::<Vec<_>>(), 100);
    let ids = sim.ids();
    let mut second = Ddfs::open(backend.clone(), &ids, params).unwrap();
    let out = sim.backup(&mut [&mut second], &(5000..8000).collect::<Vec<_>>(), 100);
    assert!(out[0].iter().all(|d| *d == Decision::Unique));
    let s = second.stats();
    assert!(s.bloom_false_positives > 300, "{s:?}");
    assert_eq!(s.bloom_false_positives + s.bloom_negatives, 3000);
    assert_eq!(s.disk_lookups, s.bloom_false_positives);
}

#[test]
fn bloom_filters_stay_within_the_budget_and_decisions_stay_exact() {
    let (_dir, backend) = counting();
    let mut sim = Sim::new(backend.clone(), 100, CHUNK_LEN);
    let roomy = DdfsParams {
        bucket_bytes: 4096,
        ..DdfsParams::default()
    };
    let mut first = Ddfs::open(backend.clone(), &[], roomy).unwrap();
    sim.backup(&mut [&mut first], &(0..3000).collect::<Vec<_>>(), 100);
    let full = first.stats().bloom_bytes;
    assert!(full > 0);

    // A budget of half the filter's size: it is not even read, and every
    // lookup that misses the cache reads the run's bucket instead.
    let tight = DdfsParams {
        bloom_budget: full / 2,
        ..roomy
    };
    let ids = sim.ids();
    let reads_before = backend.stats().reads;
    let mut second = Ddfs::open(backend.clone(), &ids, tight).unwrap();
    assert_eq!(backend.stats().reads - reads_before, 1, "the manifest only");
    let mut exact = Exact::open(backend.clone(), &ids).unwrap();
    let stream: Vec<u32> = (2500..4000).collect();
    let out = sim.backup(&mut [&mut exact, &mut second], &stream, 100);
    assert_eq!(out[0], out[1]);
    let s = second.stats();
    // After the commit only this backup's new, small run has a filter.
    assert!(s.bloom_bytes <= tight.bloom_budget / 4, "{s:?}");
    assert_eq!(s.bloom_false_positives, 0);
    assert_eq!(s.bloom_negatives, 1000);
    // 1000 new chunks read a bucket each, the 500 old ones one per container.
    assert_eq!(s.disk_lookups, 1000 + 5);
    assert!(s.memory_bytes <= tight.bloom_budget + s.cache_peak_bytes + PENDING_BUDGET);

    // A new run's filter is sized to its share of the budget: the one this
    // backup wrote fits, the old large run's does not.
    let third = Ddfs::open(backend.clone(), &sim.ids(), tight).unwrap();
    assert_eq!(third.runs(), 2);
    assert!(third.runs[0].bloom.is_none());
    assert!(third.runs[1].bloom.is_some());
    assert!(third.stats().bloom_bytes <= tight.bloom_budget / 4);
}

#[test]
fn open_checks_and_rebuilds() {
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 10, CHUNK_LEN);
    let params = small_params();
    let mut idx = Ddfs::open(backend.clone(), &[], params).unwrap();
    assert!(!idx.stats().rebuilt);
    sim.backup(&mut [&mut idx], &(0..100).collect::<Vec<_>>(), 10);
    let ids = sim.ids();

    // Intact.
    let idx = Ddfs::open(backend.clone(), &ids, params).unwrap();
    assert!(!idx.stats().rebuilt);
    assert_eq!(idx.table_entries(), 100);

    // Bloom filter missing: rebuilt from the table (not from the containers) and written back.
    let gen = idx.runs[0].table.meta().generation;
    backend.delete(&bloom_key(gen)).unwrap();
    let idx = Ddfs::open(backend.clone(), &ids, params).unwrap();
    assert!(!idx.stats().rebuilt);
    assert!(backend.exists(&bloom_key(gen)).unwrap());

    // Manifest damaged: rebuilt from the containers.
    damage(backend.as_ref(), 'm');
    let idx = Ddfs::open(backend.clone(), &ids, params).unwrap();
    assert!(idx.stats().rebuilt);
    assert_eq!(idx.table_entries(), 100);
    // Only the new generation's objects are left.
    let gen = idx.runs[0].table.meta().generation;
    for name in backend.list(DDFS_PREFIX).unwrap() {
        assert!(
            name == "manifest" || object_generation(&name) == Some(gen),
            "{name}"
        );
    }

    // Names a container that is gone: rebuilt from what exists.
    backend.delete(&container::key(ids[0])).unwrap();
    let idx = Ddfs::open(backend.clone(), &ids[1..], params).unwrap();
    assert!(idx.stats().rebuilt);
    assert_eq!(idx.table_entries(), 90);

    // A damaged bucket found by a lookup: the table is rebuilt on the spot.
    // (No cache, so that every lookup reads the table.)
    damage(backend.as_ref(), 't');
    let params = DdfsParams {
        cache_bytes: 0,
        ..params
    };
    let mut idx = Ddfs::open(backend.clone(), &ids[1..], params).unwrap();
    assert!(!idx.stats().rebuilt);
    let mut out = Vec::new();
    idx.submit((0..100).map(|i| chunk(i as u64, i)).collect(), &mut out)
        .unwrap();
    assert!(idx.stats().rebuilt);
    let dups = out
        .iter()
        .filter(|d| matches!(d.1, Decision::Duplicate(_)))
        .count();
    assert_eq!(dups, 90);
}

#[test]
fn relocate_and_commit_follow_garbage_collection() {
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 10, CHUNK_LEN);
    let params = small_params();
    let mut exact = Exact::open(backend.clone(), &[]).unwrap();
    let mut ddfs = Ddfs::open(backend.clone(), &[], params).unwrap();
    sim.backup(
        &mut [&mut exact, &mut ddfs],
        &(0..30).collect::<Vec<_>>(),
        8,
    );
    // Containers 1, 2, 3 hold 0..10, 10..20, 20..30. GC removes 1 and 2:
    // chunks 0..5 move to a new container 4, the rest of them are dropped.
    let mut moved = Relocations::default();
    for i in 0..5 {
        moved.insert((1, fp(i)), 4).unwrap();
    }
    sim.write(4, &(0..5).map(fp).collect::<Vec<_>>());
    sim.next = 5;
    let removed: BTreeSet<ContainerId> = [1, 2].into();
    let ids = sim.ids();
    let mut exact = Exact::open(backend.clone(), &ids).unwrap();
    let mut ddfs = Ddfs::open(backend.clone(), &ids, params).unwrap();
    for idx in [&mut exact as &mut dyn DedupIndex, &mut ddfs] {
        idx.relocate(&removed, &moved).unwrap();
        idx.commit(5).unwrap();
    }
    for id in [1, 2] {
        backend.delete(&container::key(id)).unwrap();
        sim.containers.remove(&id);
    }
    let ids = sim.ids();
    let mut exact = Exact::open(backend.clone(), &ids).unwrap();
    let mut ddfs = Ddfs::open(backend.clone(), &ids, params).unwrap();
    assert!(
        !ddfs.stats().rebuilt,
        "the relocated table names only existing containers"
    );
    assert_eq!(ddfs.table_entries(), 15);
    let out = sim.backup(
        &mut [&mut exact, &mut ddfs],
        &(0..30).collect::<Vec<_>>(),
        8,
    );
    for (i, d) in out[1].iter().enumerate() {
        match i {
            0..5 => assert_eq!(*d, Decision::Duplicate(4)),
            5..20 => assert_eq!(*d, Decision::Unique),
            _ => assert_eq!(*d, Decision::Duplicate(3)),
        }
    }
}

#[test]
fn relocate_before_commit_applies_to_lookups() {
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 10, CHUNK_LEN);
    let params = small_params();
    let mut ddfs = Ddfs::open(backend.clone(), &[], params).unwrap();
    sim.backup(&mut [&mut ddfs], &(0..20).collect::<Vec<_>>(), 8);
    let mut moved = Relocations::default();
    moved.insert((1, fp(3)), 7).unwrap();
    sim.write(7, &[fp(3)]);
    let ids = sim.ids();
    let mut ddfs = Ddfs::open(backend.clone(), &ids, params).unwrap();
    ddfs.relocate(&[1].into(), &moved).unwrap();
    let mut out = Vec::new();
    ddfs.submit(vec![chunk(0, 3), chunk(1, 4), chunk(2, 15)], &mut out)
        .unwrap();
    let d: Vec<_> = out.iter().map(|x| x.1).collect();
    assert_eq!(
        d,
        vec![
            Decision::Duplicate(7),
            Decision::Unique,
            Decision::Duplicate(2)
        ]
    );
}

#[test]
fn manifest_round_trip_and_damage() {
    let run = |generation, entries| TableMeta {
        generation,
        buckets: 5,
        bucket_bytes: 4096,
        part_buckets: 4096,
        entries,
    };
    let m = Manifest {
        next_container: 9,
        runs: vec![run(3, 17), run(5, 2)],
        referenced: Ranges::from_sorted([1, 4, 5, 8]),
    };
    let bytes = m.encode();
    assert_eq!(Manifest::decode(&bytes).unwrap(), m);
    // A version-1 manifest (one table) reads as one run.
    let mut v1 = Vec::new();
    table::encode_manifest_head(&run(3, 17), 9, &mut v1);
    table::encode_ids(&[1, 4, 5, 8], &mut v1);
    let old = Manifest::decode(&envelope::seal(MANIFEST_KIND, 1, &v1)).unwrap();
    assert_eq!(
        old,
        Manifest {
            runs: vec![run(3, 17)],
            ..m.clone()
        }
    );
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 2;
        assert!(Manifest::decode(&bad).is_err(), "flip at {i} undetected");
    }
    let mut bloom = new_bloom(100, 0.01);
    bloom.insert_hash(bloom_hash(&fp(1)));
    let enc = encode_bloom(3, &bloom);
    let back = decode_bloom(3, &enc).unwrap();
    assert!(back.contains_hash(bloom_hash(&fp(1))));
    assert!(decode_bloom(4, &enc).is_err());
}

#[test]
fn entries_kept_in_a_compacted_container_survive_relocation() {
    let removed = BTreeSet::from([4, 5]);
    let mut moved = Relocations::default();
    for (from, to) in [((4, fp(1)), 4), ((5, fp(2)), 9), ((9, fp(2)), 9)] {
        moved.insert(from, to).unwrap();
    }
    let gcs = [(removed, moved)];
    // A delta base GC kept in place (container 4 compacted, same id).
    assert_eq!(super::follow(&gcs, &fp(1), 4).unwrap(), Some(4));
    // A moved chunk follows its move; a dead one is dropped.
    assert_eq!(super::follow(&gcs, &fp(2), 5).unwrap(), Some(9));
    assert_eq!(super::follow(&gcs, &fp(3), 4).unwrap(), None);
}

/// A chunk a rewriting policy stored again is found in its newest copy by
/// later backups, as with the exact index (HAR's design: the rewritten
/// chunk's entry names the active container, not the sparse one).
#[test]
fn a_rewritten_chunk_is_found_in_its_newest_copy() {
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 10, CHUNK_LEN);
    let params = small_params();
    let stream: Vec<u32> = (0..10).collect();
    let mut first = Ddfs::open(backend.clone(), &[], params).unwrap();
    sim.backup(&mut [&mut first], &stream, 10);
    let old = sim.ids()[0];
    // The next backup rewrites chunk 3 into a new container.
    let new = sim.next;
    sim.extra(&[3]);
    let ids = sim.ids();
    let mut second = Ddfs::open(backend.clone(), &ids, params).unwrap();
    let mut exact = Exact::open(backend.clone(), &ids).unwrap();
    for idx in [&mut second as &mut dyn DedupIndex, &mut exact] {
        idx.placed(&[(fp(3), new)]).unwrap();
        idx.commit(sim.next).unwrap();
    }
    let ids = sim.ids();
    let mut third = Ddfs::open(backend.clone(), &ids, params).unwrap();
    let out = sim.backup(&mut [&mut third], &[3, 4], 1);
    assert_eq!(
        out[0],
        vec![Decision::Duplicate(new), Decision::Duplicate(old)]
    );
}

/// The table's commits write this backup's entries, not the table: while
/// the repository grows 8 times over (from 32 to 256 backups), with the same
/// number of new chunks per backup, the bytes the index wrote per backup
/// (all commits so far, so that the compaction's merges are amortized)
/// grow like the number of tiers, not like the table, and stay a small
/// fraction of what rewriting the whole table at each commit writes; a
/// commit that merges nothing writes the same whatever the table's size.
#[test]
fn commit_bytes_stay_flat_as_the_table_grows() {
    const NEW: u32 = 200;
    const BACKUPS: usize = 256;
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 100, CHUNK_LEN);
    let params = DdfsParams {
        bucket_bytes: 4096,
        part_buckets: 64,
        compaction: Compaction {
            fan_in: 4,
            min_entries: u64::from(NEW),
        },
        ..small_params()
    };
    let (mut written, mut table, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..BACKUPS as u32 {
        let ids = sim.ids();
        let mut idx = Ddfs::open(backend.clone(), &ids, params).unwrap();
        // A version: the previous backup's chunks again, and `NEW` new ones.
        let stream: Vec<u32> = (b.saturating_sub(1) * NEW..(b + 1) * NEW).collect();
        sim.backup(&mut [&mut idx], &stream, 64);
        let s = idx.stats();
        assert_eq!(s.entries, u64::from((b + 1) * NEW));
        written.push(s.commit_write_bytes);
        table.push(s.table_bytes);
        runs.push(idx.runs());
    }
    let per_backup = |n: usize| written[..n].iter().sum::<u64>() / n as u64;
    let (early, late) = (per_backup(BACKUPS / 8), per_backup(BACKUPS));
    let rewrite = table.iter().sum::<u64>() / BACKUPS as u64;
    println!(
        "index bytes written per backup: {early} after 32 backups, {late} after 256; \
         whole-table rewrites would average {rewrite}; a plain commit {}",
        written[0]
    );
    // Tiers: log4(32) = 2.5 then log4(256) = 4.
    assert!(
        2 * early >= late,
        "{early} B/backup at 32 backups, {late} at 256"
    );
    assert!(
        8 * late <= rewrite,
        "{late} B/backup vs {rewrite} for whole rewrites"
    );
    // Commits that merge nothing: the same bytes at the start and the end.
    let plain = written[0];
    let same = written
        .iter()
        .filter(|&&w| w.abs_diff(plain) <= 256)
        .count();
    assert!(same >= BACKUPS / 2, "{plain}: {written:?}");
    assert!(written[BACKUPS - 8..]
        .iter()
        .any(|&w| w.abs_diff(plain) <= 256));
    // At most F - 1 runs per tier.
    assert!(runs.iter().all(|&r| r <= 3 * 5), "{runs:?}");
}

/// A commit interrupted before its manifest leaves the index as it was:
/// the runs it wrote are ignored, and deleted by the next commit.
#[test]
fn an_interrupted_commit_leaves_the_previous_runs() {
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 10, CHUNK_LEN);
    let params = small_params();
    let mut idx = Ddfs::open(backend.clone(), &[], params).unwrap();
    sim.backup(&mut [&mut idx], &(0..40).collect::<Vec<_>>(), 8);
    let before = backend.read(MANIFEST_KEY).unwrap();
    // The next commit's objects are written, the manifest not switched.
    let ids = sim.ids();
    let mut idx = Ddfs::open(backend.clone(), &ids, params).unwrap();
    sim.backup(&mut [&mut idx], &(40..80).collect::<Vec<_>>(), 8);
    backend.write(MANIFEST_KEY, &before).unwrap();
    let ids = sim.ids();
    let mut exact = Exact::open(backend.clone(), &ids).unwrap();
    let mut idx = Ddfs::open(backend.clone(), &ids, params).unwrap();
    assert!(!idx.stats().rebuilt);
    // The newer containers are scanned: every chunk is still found.
    sim.backup(&mut [&mut exact, &mut idx], &(0..80).collect::<Vec<_>>(), 8);
    let current: BTreeSet<u64> = idx.runs.iter().map(|r| r.table.meta().generation).collect();
    for name in backend.list(DDFS_PREFIX).unwrap() {
        assert!(
            name == "manifest" || object_generation(&name).is_some_and(|g| current.contains(&g)),
            "leftover {name}"
        );
    }
}

/// Loading container after container into a full locality cache evicts
/// older ones: once evicting, the map's allocation grows at most once, to
/// the size the budget allows, and never changes again, within the budget.
/// (The churn's cost, a whole-map rehash every few loads when the map was
/// sized fuller than half, is not visible from outside a call: the scale
/// benchmark shows it, docs/MEASUREMENTS.md "Scale benchmark".)
#[test]
fn a_full_cache_keeps_its_map_through_evictions() {
    let mut cache = Cache::new(1 << 20);
    let per = 300u32;
    let mut sizes = Vec::new();
    for id in 0..300u32 {
        let fps = (0..per).map(|k| fp(id * per + k)).collect();
        let before = cache.entries;
        cache.insert(u64::from(id), fps);
        let size = cache.map.allocation_size();
        if (cache.entries <= before || !sizes.is_empty()) && sizes.last() != Some(&size) {
            sizes.push(size);
        }
        assert!(cache.entries <= cache.max_entries);
        assert!(cache.map.len() <= cache.entries);
    }
    assert!(!sizes.is_empty(), "the cache never filled");
    assert!(sizes.len() <= 2 && sizes.is_sorted(), "{sizes:?}");
    assert!(cache.memory() <= 1 << 20, "{}", cache.memory());
    // Every fingerprint of the newest container is found.
    assert!((0..per).all(|k| cache.get(&fp(299 * per + k)) == Some(299)));
}

/// Two backups sharing the repository (FORMAT.md §13.3) open the table at
/// once, each stores its own chunks and commits rebased on the table as
/// the other left it: a later backup finds every chunk in the runs, and no
/// run object the first may still read was deleted by the second. The
/// exact index merges the same way.
#[test]
fn shared_backups_commit_rebased_on_each_other() {
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 8, CHUNK_LEN);
    let fps = |r: std::ops::Range<u32>| r.map(fp).collect::<Vec<_>>();
    sim.write(1, &fps(0..40));
    let mut alone = Ddfs::open(backend.clone(), &[1], small_params()).unwrap();
    alone.commit(2).unwrap();
    let mut exact = Exact::open(backend.clone(), &[1]).unwrap();
    exact.commit(2).unwrap();
    let mut a = Ddfs::open_shared(backend.clone(), &[1], small_params()).unwrap();
    let mut b = Ddfs::open_shared(backend.clone(), &[1], small_params()).unwrap();
    let mut ea = Exact::open(backend.clone(), &[1]).unwrap();
    let mut eb = Exact::open(backend.clone(), &[1]).unwrap();
    let before: BTreeSet<String> = backend.list(DDFS_PREFIX).unwrap().into_iter().collect();
    sim.write(10, &fps(100..140));
    sim.write(20, &fps(200..240));
    let placed = |r: std::ops::Range<u32>, c: ContainerId| -> Vec<(Fingerprint, ContainerId)> {
        r.map(|i| (fp(i), c)).collect()
    };
    for (d, e, r, c) in [
        (&mut a, &mut ea, 100..140, 10),
        (&mut b, &mut eb, 200..240, 20),
    ] {
        d.placed(&placed(r.clone(), c)).unwrap();
        e.placed(&placed(r, c)).unwrap();
    }
    for (d, e, next) in [(&mut a, &mut ea, 11), (&mut b, &mut eb, 21)] {
        d.rebase().unwrap();
        d.commit(next).unwrap();
        e.rebase().unwrap();
        e.commit(next).unwrap();
    }
    let after: BTreeSet<String> = backend.list(DDFS_PREFIX).unwrap().into_iter().collect();
    assert!(before.is_subset(&after), "{before:?} {after:?}");
    let existing = [1, 10, 20];
    let mut later = Ddfs::open(backend.clone(), &existing, small_params()).unwrap();
    let mut later_exact = Exact::open(backend.clone(), &existing).unwrap();
    for index in [&mut later as &mut dyn DedupIndex, &mut later_exact] {
        assert_eq!(index.stats().containers_scanned, 0);
        assert!(!index.stats().rebuilt);
        for (i, want) in (0..40)
            .map(|i| (i, 1))
            .chain((100..140).map(|i| (i, 10)))
            .chain((200..240).map(|i| (i, 20)))
        {
            let mut out = Vec::new();
            index
                .submit(vec![chunk(u64::from(i), i)], &mut out)
                .unwrap();
            assert_eq!(out[0].1, Decision::Duplicate(want), "fingerprint {i}");
        }
    }
}

/// A backup sharing the repository (FORMAT.md §13.3) that meets a damaged
/// table rebuilds it in memory and goes on: its decisions are those of an
/// intact index, its lookups write no index object, and its commits add its
/// entries as new runs without merging (the damaged run stays for
/// `repair`); a lookup after a commit still finds what it committed.
#[test]
fn a_shared_backup_meeting_a_damaged_table_rebuilds_it_in_memory() {
    let backend = mem();
    let mut sim = Sim::new(backend.clone(), 10, CHUNK_LEN);
    let params = DdfsParams {
        cache_bytes: 0,
        ..small_params()
    };
    let mut idx = Ddfs::open(backend.clone(), &[], params).unwrap();
    sim.backup(&mut [&mut idx], &(0..100).collect::<Vec<_>>(), 10);
    let ids = sim.ids();
    damage(backend.as_ref(), 't');
    let objects = |b: &dyn Backend| -> std::collections::BTreeMap<String, Vec<u8>> {
        b.list(DDFS_PREFIX)
            .unwrap()
            .into_iter()
            .map(|n| {
                let key = format!("{DDFS_PREFIX}/{n}");
                let bytes = b.read(&key).unwrap();
                (key, bytes)
            })
            .collect()
    };
    let before = objects(backend.as_ref());
    let mut shared = Ddfs::open_shared(backend.clone(), &ids, params).unwrap();
    assert!(!shared.stats().damaged_left);
    let mut out = Vec::new();
    shared
        .submit((0..120).map(|i| chunk(u64::from(i), i)).collect(), &mut out)
        .unwrap();
    let stats = shared.stats();
    assert!(stats.damaged_left && stats.rebuilt, "{stats:?}");
    assert_eq!(
        objects(backend.as_ref()),
        before,
        "a lookup wrote index objects"
    );
    for (i, (_, d)) in out.iter().enumerate() {
        match i < 100 {
            true => assert!(
                matches!(d, Decision::Duplicate(c) if ids.contains(c)),
                "{i}: {d:?}"
            ),
            false => assert_eq!(*d, Decision::Unique, "{i}"),
        }
    }
    let new_id = ids.last().unwrap() + 1;
    let placed: Vec<_> = (100..120).map(|i| (fp(i), new_id)).collect();
    let written: Vec<_> = (100..120).chain(1000..1040).map(fp).collect();
    sim.write(new_id, &written);
    shared.placed(&placed).unwrap();
    let runs_before = shared.runs();
    for round in 0..4u32 {
        shared.rebase().unwrap();
        shared.commit(new_id + 1).unwrap();
        // Each commit of new entries adds one run; nothing is merged.
        let more: Vec<_> = (0..10)
            .map(|k| (fp(1000 + round * 10 + k), new_id))
            .collect();
        shared.placed(&more).unwrap();
        assert_eq!(shared.runs(), runs_before + round as usize + 1);
    }
    // Every run object that was there is still there, unchanged.
    let after = objects(backend.as_ref());
    for (key, bytes) in &before {
        if key != &format!("{DDFS_PREFIX}/manifest") {
            assert_eq!(after.get(key), Some(bytes), "{key}");
        }
    }
    let mut out = Vec::new();
    shared
        .submit(vec![chunk(0, 105), chunk(1, 1003)], &mut out)
        .unwrap();
    assert_eq!(out[0].1, Decision::Duplicate(new_id));
    assert_eq!(out[1].1, Decision::Duplicate(new_id));
    // A writer alone (repair's way) rebuilds the table on disk.
    let all: Vec<_> = ids.iter().copied().chain([new_id]).collect();
    let mut alone = Ddfs::open(backend.clone(), &all, params).unwrap();
    let mut out = Vec::new();
    alone
        .submit((0..100).map(|i| chunk(u64::from(i), i)).collect(), &mut out)
        .unwrap();
    assert!(alone.stats().rebuilt && !alone.stats().damaged_left);
    assert!(out.iter().all(|(_, d)| matches!(d, Decision::Duplicate(_))));
}
