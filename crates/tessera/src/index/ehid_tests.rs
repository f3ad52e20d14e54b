use super::*;
use crate::backend::testing::Mem;

fn fp(i: u32) -> Fingerprint {
    crate::fingerprint::FingerprintAlgo::Blake3.hash(&i.to_le_bytes())
}

fn write_container(backend: &dyn Backend, id: ContainerId, fps: &[u32]) {
    let mut b = container::Builder::without_data(id, 1 << 30);
    for &f in fps {
        b.push_len(fp(f), 8192);
    }
    backend.write(&container::key(id), &b.seal()).unwrap();
}

fn params(bloom: bool, consult_cold: bool) -> EhidParams {
    EhidParams {
        ddfs: DdfsParams {
            bucket_bytes: 512,
            part_buckets: 4,
            ..DdfsParams::default()
        },
        bloom,
        sparse_threshold: DEFAULT_SPARSE_THRESHOLD,
        consult_cold,
    }
}

/// Runs one backup of `stream`: new chunks go to container `new_id`.
fn run(
    backend: &dyn Backend,
    index: &mut dyn DedupIndex,
    stream: &[u32],
    new_id: ContainerId,
) -> Vec<Decision> {
    let chunks: Vec<Chunk> = stream
        .iter()
        .enumerate()
        .map(|(k, &i)| Chunk {
            seq: k as u64,
            fp: fp(i),
            len: 8192,
            data: None,
        })
        .collect();
    let mut out = Vec::new();
    index.submit(chunks, &mut out).unwrap();
    index.finish(&mut out).unwrap();
    let new: Vec<u32> = out
        .iter()
        .zip(stream)
        .filter(|(d, _)| d.1 == Decision::Unique)
        .map(|(_, &i)| i)
        .collect();
    if !new.is_empty() {
        write_container(backend, new_id, &new);
        let placed: Vec<_> = new.iter().map(|&i| (fp(i), new_id)).collect();
        index.placed(&placed).unwrap();
    }
    index.commit(new_id + 1).unwrap();
    out.into_iter().map(|(_, d)| d).collect()
}

#[test]
fn cumm_counts_distinct_chunks_and_finds_sparse_containers() {
    let mut m = Cumm::default();
    for i in [0, 1, 2, 0, 1] {
        m.reference(1, fp(i));
    }
    m.reference(2, fp(10));
    m.reference(3, fp(20));
    m.reference(3, fp(21));
    m.wrote(5);
    m.reference(5, fp(30));
    // Intra-backup duplicates do not raise the utilization.
    assert_eq!(m.utilization(1, 4), 0.75);
    assert_eq!(m.utilization(2, 4), 0.25);
    assert_eq!(m.utilization(3, 4), 0.5);
    assert_eq!(m.utilization(9, 4), 0.0);
    let (hot, sparse) = m
        .separate(0.5, |c| Ok(if c == 7 { None } else { Some(4) }))
        .unwrap();
    let mut hot: Vec<_> = hot.into_iter().collect();
    hot.sort_unstable();
    // 3 is exactly at the threshold (not below): hot; 5 was written: hot.
    assert_eq!(hot, vec![1, 3, 5]);
    assert_eq!(sparse, vec![2]);
    // Unknown sizes count as hot.
    let mut m = Cumm::default();
    m.reference(7, fp(1));
    let (hot, sparse) = m.separate(0.5, |_| Ok(None)).unwrap();
    assert!(hot.contains(&7) && sparse.is_empty());
}

/// Containers 1 (chunks 0..8) and 2 (chunks 8..16); a backup that uses all
/// of 1 and one chunk of 2 makes 2 sparse, so its entries go cold.
fn two_container_repo(bloom: bool) -> (Arc<dyn Backend>, Ehid) {
    let backend: Arc<dyn Backend> = Arc::new(Mem::default());
    write_container(backend.as_ref(), 1, &(0..8).collect::<Vec<_>>());
    write_container(backend.as_ref(), 2, &(8..16).collect::<Vec<_>>());
    let mut index = Ehid::rebuild(backend.clone(), &[1, 2], params(bloom, false)).unwrap();
    index.commit(3).unwrap();
    assert_eq!(index.hot_entries(), 16);
    assert_eq!(index.cold_entries(), 0);
    let stream: Vec<u32> = (0..9).chain(100..104).collect();
    let d = run(backend.as_ref(), &mut index, &stream, 3);
    assert!(d[..8].iter().all(|d| *d == Decision::Duplicate(1)));
    assert_eq!(d[8], Decision::Duplicate(2));
    assert!(d[9..].iter().all(|d| *d == Decision::Unique));
    let s = index.stats();
    assert_eq!(s.sparse_containers, 1);
    assert_eq!(s.evicted_entries, 8);
    assert_eq!(index.hot_entries(), 8 + 4);
    assert_eq!(index.cold_entries(), 8);
    assert_eq!(s.entries, 12);
    assert_eq!(s.cold_entries, 8);
    (backend, index)
}

#[test]
fn commit_separates_hot_and_cold_entries_and_next_backup_stores_fragmented_chunks() {
    for bloom in [true, false] {
        let (backend, index) = two_container_repo(bloom);
        drop(index);
        let mut index = Ehid::open(backend.clone(), &[1, 2, 3], params(bloom, false)).unwrap();
        assert_eq!(index.hot_entries(), 12);
        assert_eq!(index.cold_entries(), 8);
        // 9 lives only in the sparse container 2: missed, stored again (FTU).
        let d = run(backend.as_ref(), &mut index, &[0, 9, 100, 200], 4);
        assert_eq!(d[0], Decision::Duplicate(1));
        assert_eq!(d[1], Decision::Unique);
        assert_eq!(d[2], Decision::Duplicate(3));
        assert_eq!(d[3], Decision::Unique);
        let s = index.stats();
        assert_eq!(s.policy, if bloom { "ehid" } else { "hid" });
        assert_eq!(s.ftu_chunks, 1);
        if !bloom {
            assert_eq!(s.bloom_negatives, 0);
            assert_eq!(s.bloom_false_positives, 0);
        }
        // The fresh copy of 9 in container 4 is hot.
        let mut index = Ehid::open(backend.clone(), &[1, 2, 3, 4], params(bloom, false)).unwrap();
        let d = run(backend.as_ref(), &mut index, &[9], 5);
        assert_eq!(d[0], Decision::Duplicate(4));
    }
}

#[test]
fn consulting_the_cold_index_deduplicates_fragmented_chunks() {
    let (backend, index) = two_container_repo(true);
    drop(index);
    let mut index = Ehid::open(backend.clone(), &[1, 2, 3], params(true, true)).unwrap();
    let d = run(backend.as_ref(), &mut index, &[9, 10, 9, 300], 4);
    assert_eq!(d[0], Decision::Duplicate(2));
    // The cold container's metadata is cached: its neighbour hits in memory.
    assert_eq!(d[1], Decision::Duplicate(2));
    assert_eq!(d[2], Decision::Duplicate(2));
    assert_eq!(d[3], Decision::Unique);
    let s = index.stats();
    assert_eq!(s.cold_hits, 1);
    assert_eq!(s.ftu_chunks, 0);
}

#[test]
fn commit_without_a_backup_does_not_separate_and_rebuild_makes_all_hot() {
    let (backend, mut index) = two_container_repo(true);
    index
        .relocate(&BTreeSet::new(), &Relocations::default())
        .unwrap();
    index.commit(4).unwrap();
    assert_eq!(index.hot_entries(), 12);
    assert_eq!(index.cold_entries(), 8);
    let index = Ehid::rebuild(backend.clone(), &[1, 2, 3], params(true, false)).unwrap();
    assert_eq!(index.hot_entries(), 20);
    assert_eq!(index.cold_entries(), 0);
    // A damaged cold table starts empty; the hot one is intact.
    backend
        .delete(&format!("{EHID_COLD_PREFIX}/manifest"))
        .unwrap();
    let index = Ehid::open(backend.clone(), &[1, 2, 3], params(true, false)).unwrap();
    assert_eq!(index.hot_entries(), 20);
    assert_eq!(index.cold_entries(), 0);
}

#[test]
fn each_backup_recomputes_the_hot_set() {
    let (backend, index) = two_container_repo(true);
    drop(index);
    let mut index = Ehid::open(backend.clone(), &[1, 2, 3], params(true, false)).unwrap();
    let _ = run(
        backend.as_ref(),
        &mut index,
        &[0, 1, 2, 3, 4, 5, 6, 7, 100],
        4,
    );
    // Container 3 (4 chunks, 1 used) went cold too.
    assert_eq!(index.hot_entries(), 8);
    assert_eq!(index.cold_entries(), 12);
}
