//! Property: random sequences of backup / forget / gc never lose a chunk a
//! live backup references — nor the base of a delta-encoded chunk: every
//! live backup restores byte-identically and `check --read-data` passes
//! after every step.

mod common;

use common::{backup_bytes, edit, full_check, small_chunker, Rng};
use proptest::prelude::*;
use std::collections::BTreeMap;
use tessera::backup::BackupOptions;
use tessera::commands::check::{check, CheckOptions};
use tessera::delta::DeltaKind;
use tessera::gc::{forget_keep_last, gc, Defrag, GcOptions, DEFAULT_SORT_BUDGET};
use tessera::repo::config::{Config, IndexKind};
use tessera::restore::plan::CachePolicy;
use tessera::restore::{restore, RestoreOptions};
use tessera::rewrite::{RewriteKind, RewriteParams};
use tessera::Repository;

#[derive(Clone, Debug)]
enum Step {
    /// Back up a new version: the previous one with `edits` random edits (seeded).
    Backup { edits: u8, seed: u64 },
    /// Delete all but the newest `keep` backups.
    Forget { keep: usize },
    /// Collect garbage at this utilization threshold with this chunk
    /// ordering, spilling its live pairs and moved chunks to temporary
    /// files from the first few entries on (`spill`) or not.
    Gc {
        threshold: u8,
        defrag: Defrag,
        segment: usize,
        spill: bool,
    },
    /// Delete one backup chosen by index among the live ones.
    Delete { pick: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..6, any::<u64>()).prop_map(|(edits, seed)| Step::Backup { edits, seed }),
        1 => (0usize..4).prop_map(|keep| Step::Forget { keep }),
        2 => (
            prop_oneof![Just(0u8), Just(30), Just(50), Just(100)],
            prop_oneof![
                Just(Defrag::None),
                Just(Defrag::Gccdf),
                Just(Defrag::Random),
                Just(Defrag::Fill)
            ],
            1usize..5,
            any::<bool>(),
        )
            .prop_map(|(threshold, defrag, segment, spill)| Step::Gc {
                threshold,
                defrag,
                segment,
                spill,
            }),
        1 => any::<usize>().prop_map(|pick| Step::Delete { pick }),
    ]
}

fn small_config(rewrite: RewriteKind, delta: DeltaKind) -> Config {
    let mut c = Config::new("gc-property".into());
    // PFC-delta needs an index that loads container metadata and a rewriting policy.
    c.delta.kind = match (delta, rewrite) {
        (DeltaKind::Pfc, RewriteKind::None) => DeltaKind::Greedy,
        (kind, _) => kind,
    };
    if c.delta.kind == DeltaKind::Pfc {
        c.index = IndexKind::Ddfs;
    }
    // Small segments and contexts so that rewriting happens at this scale.
    c.rewrite = RewriteParams {
        kind: rewrite,
        segment_bytes: 32 * 1024,
        capping_level: 2,
        smr_level: 2,
        cbr_stream_context: 16 * 1024,
        limit: Some(0.5),
        ..RewriteParams::default()
    };
    c.chunker = small_chunker();
    c.container_size = 16 * 1024;
    c
}

fn verify(repo: &Repository, originals: &BTreeMap<u64, Vec<u8>>) {
    let report = full_check(repo);
    assert!(
        report.is_ok(),
        "check found problems: {:?}",
        report.problems
    );
    let live = repo.backups().unwrap();
    assert_eq!(live, originals.keys().copied().collect::<Vec<_>>());
    for (&id, data) in originals {
        let mut out = Vec::new();
        for policy in [CachePolicy::Lru, CachePolicy::Opt, CachePolicy::Faa] {
            out.clear();
            let options = RestoreOptions {
                cache_containers: 3,
                policy,
                progress: None,
                skip_damaged: false,
            };
            restore(repo, id, &mut out, &options).unwrap();
            assert!(
                out == *data,
                "backup {id} restored wrong bytes ({policy:?})"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20, ..ProptestConfig::default() })]
    #[test]
    fn gc_never_loses_a_referenced_chunk(
        steps in prop::collection::vec(step(), 4..18),
        seed: u64,
        rewrite in prop_oneof![
            Just(RewriteKind::None),
            Just(RewriteKind::Cbr),
            Just(RewriteKind::Capping),
            Just(RewriteKind::Har),
            Just(RewriteKind::Smr),
        ],
        delta in prop_oneof![Just(DeltaKind::None), Just(DeltaKind::Pfc), Just(DeltaKind::Greedy)],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(&dir.path().join("r"), small_config(rewrite, delta)).unwrap();
        let mut current = Rng(seed | 1).bytes(120_000);
        let mut live: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for s in steps {
            match s {
                Step::Backup { edits, seed } => {
                    current = edit(&current, u32::from(edits), 3000, seed);
                    let snap = backup_bytes(&repo, &current[..], "mem", &BackupOptions::default()).map(|o| o.snapshot).unwrap();
                    live.insert(snap.id, current.clone());
                }
                Step::Forget { keep } => {
                    for id in forget_keep_last(&repo, keep, false).unwrap() {
                        live.remove(&id);
                    }
                }
                Step::Gc { threshold, defrag, segment, spill } => {
                    let options = GcOptions {
                        threshold_pct: f64::from(threshold),
                        defrag,
                        segment,
                        split_threshold: 2048,
                        fill: true,
                        sort_budget: if spill { 0 } else { DEFAULT_SORT_BUDGET },
                    };
                    let stats = gc(&repo, options).unwrap();
                    prop_assert!(stats.containers_reclaimed <= stats.containers_total);
                }
                Step::Delete { pick } => {
                    if !live.is_empty() {
                        let id = *live.keys().nth(pick % live.len()).unwrap();
                        tessera::commands::delete::delete_backup(&repo, id).unwrap();
                        live.remove(&id);
                    }
                }
            }
            verify(&repo, &live);
        }
        // A final perfect GC leaves no dead chunk behind.
        gc(&repo, GcOptions::default()).unwrap();
        verify(&repo, &live);
        let report = check(&repo, CheckOptions::default()).unwrap();
        prop_assert_eq!(report.unreferenced_containers, 0);
    }
}

/// Backs up `data` into `repo`, records it in `live`, then forgets all but
/// the last `keep` backups (dropping them from `live`).
fn back_up_keeping(repo: &Repository, data: &[u8], keep: usize, live: &mut BTreeMap<u64, Vec<u8>>) {
    let snap = backup_bytes(repo, data, "mem", &BackupOptions::default())
        .map(|o| o.snapshot)
        .unwrap();
    live.insert(snap.id, data.to_vec());
    for id in forget_keep_last(repo, keep, false).unwrap() {
        live.remove(&id);
    }
}

/// A chunk that a rewriting policy copied, live both in its old container
/// (through an older backup) and in the rewritten copy (through a newer
/// one), is copied forward once when GC selects both containers, and every
/// backup still restores. (With the DDFS index, whose fingerprint cache
/// finds old copies too, such pairs are common at this scale.)
#[test]
fn two_live_copies_of_a_chunk_are_copied_forward_once() {
    for rewrite in [RewriteKind::Cbr, RewriteKind::Har] {
        let mut config = small_config(rewrite, DeltaKind::None);
        config.index = IndexKind::Ddfs;
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(&dir.path().join("r"), config).unwrap();
        let mut current = Rng(7).bytes(120_000);
        let mut live: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut merged = 0;
        for v in 0..24u64 {
            current = edit(&current, 6, 3000, v);
            back_up_keeping(&repo, &current, 6, &mut live);
            let stats = gc(&repo, GcOptions::default()).unwrap();
            merged += stats.copies_merged;
            verify(&repo, &live);
        }
        assert!(merged > 0, "{rewrite:?}: no two live copies met in one GC");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    /// GCCDF's (and its random ablation's) container fill: backups of small
    /// edits each end with a partly filled container, which GC merges
    /// (copies forward with the other live chunks). Every live backup still
    /// restores byte-identically and `check --read-data` passes, and after
    /// each such GC at most one container is stored below half the
    /// container size (the copy-forward's last one).
    #[test]
    fn gccdf_fill_merges_partial_containers_and_loses_nothing(
        versions in prop::collection::vec((0u8..6, any::<u64>()), 2..10),
        seed: u64,
        keep in 1usize..4,
        threshold in prop_oneof![Just(0u8), Just(30), Just(50)],
        defrag in prop_oneof![Just(Defrag::Gccdf), Just(Defrag::Random), Just(Defrag::Fill)],
        segment in 1usize..5,
    ) {
        let config = small_config(RewriteKind::None, DeltaKind::None);
        let half = u64::from(config.container_size) / 2;
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(&dir.path().join("r"), config).unwrap();
        let mut current = Rng(seed | 1).bytes(120_000);
        let mut live: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for (edits, seed) in versions {
            current = edit(&current, u32::from(edits), 3000, seed);
            back_up_keeping(&repo, &current, keep, &mut live);
            let options = GcOptions {
                threshold_pct: f64::from(threshold),
                defrag,
                segment,
                split_threshold: 2048,
                fill: true,
                sort_budget: 0,
            };
            gc(&repo, options).unwrap();
            verify(&repo, &live);
            let under = tessera::gc::survey(&repo)
                .unwrap()
                .iter()
                .filter(|c| c.size < half)
                .count();
            prop_assert!(under <= 1, "{under} containers below half the container size");
        }
    }
}

/// GCCDF after every backup of small edits: each backup's partial container
/// is merged by the next GC (`containers_refilled`), and at most one
/// container stays below half the container size.
#[test]
fn gccdf_fill_merges_the_partial_containers_of_backups() {
    let config = small_config(RewriteKind::None, DeltaKind::None);
    let half = u64::from(config.container_size) / 2;
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(&dir.path().join("r"), config).unwrap();
    let mut current = Rng(11).bytes(120_000);
    let mut live: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut refilled = 0;
    for v in 0..8u64 {
        current = edit(&current, 3, 3000, v);
        back_up_keeping(&repo, &current, 3, &mut live);
        let options = GcOptions {
            defrag: Defrag::Gccdf,
            ..GcOptions::default()
        };
        refilled += gc(&repo, options).unwrap().containers_refilled;
        verify(&repo, &live);
        let survey = tessera::gc::survey(&repo).unwrap();
        assert!(survey.iter().filter(|c| c.size < half).count() <= 1);
    }
    assert!(refilled > 0, "no partial container was merged");
}
