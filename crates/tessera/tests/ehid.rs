//! HID/EHID end to end: after a backup that leaves the previous containers
//! sparse, their entries go cold and the next backup stores the fragmented
//! chunks again (FTU); restores stay byte-identical and `check` passes.

mod common;

use common::{backup_bytes, full_check, restored};
use tessera::backup::BackupOptions;
use tessera::chunker::{ChunkerKind, ChunkerParams};
use tessera::format::snapshot::Snapshot;
use tessera::repo::config::{Config, IndexKind};
use tessera::Repository;

const CHUNK: usize = 4096;

struct Rng(u64);

impl Rng {
    fn fill(&mut self, out: &mut [u8]) {
        for b in out.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let w = self.0.to_le_bytes();
            b.copy_from_slice(&w[..b.len()]);
        }
    }
}

/// Version 1: 1024 random chunks. Version 2: in every run of 16 chunks,
/// 12 are replaced (so version 1's containers are used at about 25%).
fn versions() -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut v1 = vec![0u8; 1024 * CHUNK];
    rng.fill(&mut v1);
    let mut v2 = v1.clone();
    for (k, c) in v2.chunks_mut(CHUNK).enumerate() {
        if k % 4 != 0 {
            rng.fill(c);
        }
    }
    (v1, v2)
}

fn repo(index: IndexKind, consult_cold: bool) -> (tempfile::TempDir, Repository) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(format!("ehid-{index:?}"));
    config.chunker = ChunkerParams {
        kind: ChunkerKind::Fixed,
        min_size: CHUNK as u32,
        avg_size: CHUNK as u32,
        max_size: CHUNK as u32,
    };
    config.container_size = 64 * 1024;
    config.index = index;
    config.ehid_consult_cold = consult_cold;
    let repo = Repository::init(dir.path(), config).unwrap();
    (dir, repo)
}

fn run(repo: &Repository, data: &[u8]) -> Snapshot {
    backup_bytes(repo, data, "input", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap()
}

/// Backs up v1, v2, v2, v2; returns the snapshots.
fn scenario(index: IndexKind, consult_cold: bool) -> Vec<Snapshot> {
    let (v1, v2) = versions();
    let (_dir, repo) = repo(index, consult_cold);
    let snaps = vec![
        run(&repo, &v1),
        run(&repo, &v2),
        run(&repo, &v2),
        run(&repo, &v2),
    ];
    assert_eq!(restored(&repo, snaps[0].id), v1);
    for s in &snaps[1..] {
        assert!(restored(&repo, s.id) == v2, "backup {} differs", s.id);
    }
    let report = full_check(&repo);
    assert!(report.is_ok(), "{report:?}");
    snaps
}

#[test]
fn ehid_stores_fragmented_chunks_again_and_restores_exactly() {
    let ddfs = scenario(IndexKind::Ddfs, false);
    for kind in [IndexKind::Ehid, IndexKind::Hid] {
        let ehid = scenario(kind, false);
        let (d, e) = (&ddfs[2].stats, &ehid[2].stats);
        // DDFS deduplicates the repeated version entirely.
        assert_eq!(d.stored_bytes, 0);
        // EHID: the 256 chunks kept from version 1 live in sparse containers:
        // their entries are cold, so they are stored again.
        assert_eq!(e.stored_bytes, 256 * CHUNK as u64, "{kind:?}: {e:?}");
        assert_eq!(e.index.ftu_chunks, 256);
        assert!(e.index.cold_entries > 0);
        // Hot entries: fewer than DDFS keeps.
        assert!(
            e.index.entries < d.index.entries,
            "{kind:?}: {} hot vs {} ddfs",
            e.index.entries,
            d.index.entries
        );
        assert_eq!(
            e.index.policy,
            if kind == IndexKind::Ehid {
                "ehid"
            } else {
                "hid"
            }
        );
        // After that, the rewritten copies are hot: nothing more is stored.
        assert_eq!(ehid[3].stats.stored_bytes, 0);
        assert_eq!(ehid[3].stats.index.ftu_chunks, 0);
    }
}

#[test]
fn consulting_the_cold_index_deduplicates_like_ddfs() {
    let ddfs = scenario(IndexKind::Ddfs, false);
    let ehid = scenario(IndexKind::Ehid, true);
    for (d, e) in ddfs.iter().zip(&ehid) {
        assert_eq!(d.stats.stored_bytes, e.stats.stored_bytes);
    }
    assert!(ehid[2].stats.index.cold_hits > 0);
}
