//! The lifecycle layout (MFDedup): round trips over many versions, restore
//! after deletions (every live backup byte-identical after every deletion),
//! read amplification, crashes during arranging, arranging that falls
//! behind, multi-source lineages, trace repositories and random sequences.

mod common;

use common::{copy_dir, edit, full_check, Rng};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tessera::backend::testing::{Gate, Gated, Mutation};
use tessera::backend::LockMode;
use tessera::backup::{BackupOptions, Input, Outcome};
use tessera::commands::check::CheckOptions;
use tessera::layout::lifecycle::{self, LifecycleRestoreOptions};
use tessera::repo::config::{Arrange, Config};
use tessera::Repository;
use tessera::{Error, Result};

fn config(arrange: Arrange, trace: bool) -> Config {
    let mut c = common::small_lifecycle_config("lifecycle-test", arrange);
    c.trace = trace;
    c
}

/// Backs up `data` as the next version of `source`: as a stream, or in a
/// trace repository as the trace of its chunks (fingerprints and lengths).
fn backup(repo: &Repository, source: &str, data: &[u8]) -> Outcome {
    let options = BackupOptions {
        source: source.into(),
        ..Default::default()
    };
    backup_with(repo, data, &options).unwrap()
}

fn backup_with(repo: &Repository, data: &[u8], options: &BackupOptions) -> Result<Outcome> {
    if !repo.config().trace {
        let input = Input::Stream {
            input: &mut &data[..],
            name: "data",
        };
        return tessera::backup::backup(repo, input, options);
    }
    let chunker = repo.config().chunker.build().unwrap();
    let algo = repo.config().fingerprint;
    let mut lengths = Vec::new();
    tessera::chunker::cut_all(chunker.as_ref(), data, true, &mut lengths);
    let mut chunks = Vec::new();
    let mut at = 0;
    for len in lengths {
        let end = at + len as usize;
        chunks.push(Ok((algo.hash(&data[at..end]), len)));
        at = end;
    }
    tessera::backup::backup(repo, Input::Trace(&mut chunks.into_iter()), options)
}

/// Restores every live backup to a file and to a writer (small windows) and
/// compares; returns the file restores' stats.
fn verify_all(
    repo: &Repository,
    dir: &Path,
    originals: &BTreeMap<u64, Vec<u8>>,
) -> Vec<lifecycle::LifecycleRestoreStats> {
    let report = full_check(repo);
    assert!(
        report.is_ok(),
        "check found problems: {:?}",
        report.problems
    );
    assert_eq!(
        repo.backups().unwrap(),
        originals.keys().copied().collect::<Vec<_>>()
    );
    let mut all = Vec::new();
    for (&id, data) in originals {
        let path = dir.join(format!("restored-{id}"));
        let stats =
            lifecycle::restore_to_file(repo, id, &path, &LifecycleRestoreOptions::default())
                .unwrap();
        let got = std::fs::read(&path).unwrap();
        assert!(got == *data, "backup {id} restored wrong bytes to a file");
        assert_eq!(stats.bytes_restored, data.len() as u64);
        let mut out = Vec::new();
        let options = LifecycleRestoreOptions {
            window_bytes: 100_000,
            progress: None,
        };
        let s = lifecycle::restore_to_writer(repo, id, &mut out, &options).unwrap();
        assert!(out == *data, "backup {id} restored wrong bytes to a writer");
        assert!(s.windows >= 1);
        let plan = lifecycle::plan_restore(repo, id).unwrap();
        assert_eq!(
            plan.data_bytes_read, stats.data_bytes_read,
            "plan of backup {id}"
        );
        assert_eq!(plan.extents, stats.extents, "plan of backup {id}");
        all.push(stats);
    }
    all
}

fn init(dir: &Path, c: Config) -> Repository {
    Repository::init(&dir.join("repo"), c).unwrap()
}

#[test]
fn round_trip_of_25_versions_with_edits_without_read_amplification() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init(dir.path(), config(Arrange::Auto, false));
    let mut data = Rng(7).bytes(400_000);
    let mut originals = BTreeMap::new();
    for v in 0..25u64 {
        data = edit(&data, 6, 6000, v + 1);
        let out = backup(&repo, "disk", &data);
        let snap = out.snapshot;
        assert_eq!(snap.stats.index.policy, "ndf");
        assert!(snap.stats.index.memory_bytes > 0 && snap.stats.index.entries > 0);
        if v > 0 {
            assert!(snap.stats.duplicates.bytes > 0, "adjacent duplicates found");
            assert!(out.arrange.unwrap().rounds == 1);
        }
        originals.insert(snap.id, data.clone());
    }
    let stats = verify_all(&repo, dir.path(), &originals);
    for s in &stats {
        assert!(
            s.read_amplification <= 1.0,
            "backup {}: read amplification {}",
            s.id,
            s.read_amplification
        );
        // Volumes k..n-1 plus active categories: one extent per object.
        assert!(s.extents <= s.objects_read, "{s:?}");
    }
    let stored: u64 = originals
        .keys()
        .map(|&id| repo.snapshot(id).unwrap().stats.stored_bytes)
        .sum();
    let totals = lifecycle::totals(&repo).unwrap();
    assert_eq!(totals.backups, 25);
    assert!(
        totals.physical_bytes >= stored && totals.physical_bytes < stored + stored / 5,
        "{totals:?} for {stored} stored bytes"
    );
    // Categories and volumes span several parts.
    let objects = walk(&dir.path().join("repo/lifecycle"));
    assert!(
        objects
            .iter()
            .any(|p| p.contains("/vol/") && !p.contains("-00000000-")),
        "multi-part volumes"
    );
    assert!(
        objects
            .iter()
            .any(|p| p.contains("/cat/") && !p.ends_with("-00000000")),
        "multi-part categories"
    );
    // Space trend: every version brought new data; volumes exist for all but the last.
    let trend = lifecycle::trend(&repo, "disk").unwrap();
    assert_eq!(trend.len(), 25);
    assert!(trend.iter().all(|t| t.new_bytes.unwrap() > 0));
    assert!(trend[..24].iter().all(|t| t.volume_bytes.is_some()));
}

#[test]
fn skip_duplicates_are_stored_again() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init(dir.path(), config(Arrange::Auto, false));
    let a = Rng(1).bytes(200_000);
    let b = Rng(2).bytes(200_000);
    let s1 = backup(&repo, "x", &a).snapshot;
    let s2 = backup(&repo, "x", &b).snapshot;
    let s3 = backup(&repo, "x", &a).snapshot;
    assert_eq!(s2.stats.duplicates.bytes, 0);
    // A is a skip duplicate for the third backup: stored again.
    assert_eq!(s3.stats.unique.bytes, s1.stats.unique.bytes);
    let mut twice = a.clone();
    twice.extend_from_slice(&a);
    let s4 = backup(&repo, "x", &twice).snapshot;
    // Chunks at the seam differ; the rest of each copy is a duplicate.
    let most = a.len() as u64 * 9 / 10;
    assert!(s4.stats.internal_duplicates.bytes >= most, "{:?}", s4.stats);
    assert!(s4.stats.duplicates.bytes >= most, "{:?}", s4.stats);
    assert!(
        s4.stats.unique.bytes <= a.len() as u64 / 10,
        "{:?}",
        s4.stats
    );
    let originals = BTreeMap::from([(s1.id, a.clone()), (s2.id, b), (s3.id, a), (s4.id, twice)]);
    verify_all(&repo, dir.path(), &originals);
}

#[test]
fn restore_after_deleting_oldest_middle_and_newest_backups() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init(dir.path(), config(Arrange::Auto, false));
    let mut data = Rng(3).bytes(300_000);
    let mut originals = BTreeMap::new();
    for v in 0..14u64 {
        data = edit(&data, 8, 6000, 100 + v);
        let s = backup(&repo, "vm", &data).snapshot;
        originals.insert(s.id, data.clone());
    }
    let ids: Vec<u64> = originals.keys().copied().collect();
    let deletions: Vec<Vec<u64>> = vec![
        vec![ids[0]],         // oldest: a whole volume
        vec![ids[6]],         // middle: truncation
        vec![ids[7], ids[5]], // neighbours of the deleted one
        vec![ids[1], ids[2]], // oldest again
        vec![ids[13]],        // newest (active categories: reclaimed by the next arranging)
        vec![ids[10]],
    ];
    for del in deletions {
        let predicted = lifecycle::space(&repo, &del).unwrap();
        let stats = lifecycle::delete_backups(&repo, &del).unwrap();
        assert_eq!(
            stats.bytes_freed, predicted,
            "space() predicted what deleting {del:?} freed"
        );
        for id in &del {
            originals.remove(id);
        }
        verify_all(&repo, dir.path(), &originals);
    }
    // Back up again after deleting the newest: still correct.
    data = edit(&data, 8, 6000, 999);
    let s = backup(&repo, "vm", &data).snapshot;
    originals.insert(s.id, data.clone());
    let stats = verify_all(&repo, dir.path(), &originals);
    assert!(stats.iter().all(|s| s.read_amplification <= 1.0));
    // Forget down to 2, then to 0: the lineage disappears entirely.
    lifecycle::forget_keep_last(&repo, 2).unwrap();
    let keep: Vec<u64> = originals.keys().rev().take(2).copied().collect();
    originals.retain(|id, _| keep.contains(id));
    verify_all(&repo, dir.path(), &originals);
    let freed = lifecycle::forget_keep_last(&repo, 0).unwrap();
    assert_eq!(freed.lineages_removed, 1);
    originals.clear();
    verify_all(&repo, dir.path(), &originals);
    let left = walk(&dir.path().join("repo/lifecycle"));
    assert!(left.is_empty(), "objects left: {left:?}");
}

fn walk(p: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            } else {
                out.push(e.path().display().to_string());
            }
        }
    }
    out
}

/// Writes and deletes fail once `budget` of them were made.
struct FailAfter {
    budget: Arc<AtomicI64>,
}

impl Gate for FailAfter {
    fn check(&self, request: Mutation) -> Result<()> {
        if self.budget.fetch_sub(1, Ordering::SeqCst) <= 0 {
            return Err(Error::io(
                format!("writing {}", request.key()),
                std::io::Error::other("injected crash"),
            ));
        }
        Ok(())
    }
}

/// The repository at `root` opened exclusively through a back end that
/// fails every request after the first `budget`.
fn failing_after(root: &Path, budget: i64) -> Repository {
    let backend = Gated::local(
        root,
        FailAfter {
            budget: Arc::new(AtomicI64::new(budget)),
        },
    );
    Repository::open_with_backend(Box::new(backend), LockMode::Exclusive).unwrap()
}

#[test]
fn crash_at_every_request_of_arranging_then_resume_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let mut originals = BTreeMap::new();
    {
        let repo = Repository::init(&root, config(Arrange::Manual, false)).unwrap();
        let mut data = Rng(5).bytes(200_000);
        for v in 0..6u64 {
            data = edit(&data, 6, 6000, 50 + v);
            let s = backup(&repo, "db", &data).snapshot;
            originals.insert(s.id, data.clone());
        }
        // Arrange the first rounds so volumes exist, and delete one backup so
        // that arranging also drops dead chunks.
        lifecycle::arrange_rounds(&repo, Some(3)).unwrap();
        let first = *originals.keys().next().unwrap();
        lifecycle::delete_backups(&repo, &[first]).unwrap();
        originals.remove(&first);
    }
    let pristine = dir.path().join("pristine");
    copy_dir(&root, &pristine);
    let mut crashes = 0;
    for budget in 0.. {
        let _ = std::fs::remove_dir_all(&root);
        copy_dir(&pristine, &root);
        let result = {
            let repo = failing_after(&root, budget);
            lifecycle::arrange(&repo)
        };
        let repo = Repository::open(&root, LockMode::Exclusive).unwrap();
        // Before resuming: everything restores.
        verify_all(&repo, dir.path(), &originals);
        let stats = lifecycle::arrange(&repo).unwrap();
        if result.is_ok() {
            assert_eq!(stats.rounds, 0);
            break;
        }
        crashes += 1;
        assert!(
            stats.rounds >= 1 || stats.resumed == 1,
            "budget {budget}: {stats:?}"
        );
        let after = verify_all(&repo, dir.path(), &originals);
        assert!(after.iter().all(|s| s.read_amplification <= 1.0));
    }
    assert!(crashes > 5, "only {crashes} crash points");
}

#[test]
fn crash_during_backup_and_deletion_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let mut originals = BTreeMap::new();
    let mut data = Rng(9).bytes(150_000);
    {
        let repo = Repository::init(&root, config(Arrange::Auto, false)).unwrap();
        for v in 0..4u64 {
            data = edit(&data, 6, 6000, 70 + v);
            let s = backup(&repo, "db", &data).snapshot;
            originals.insert(s.id, data.clone());
        }
    }
    for budget in 0..12 {
        let next = edit(&data, 6, 6000, 500 + budget as u64);
        let committed = {
            let repo = failing_after(&root, budget);
            let options = BackupOptions {
                source: "db".into(),
                ..BackupOptions::default()
            };
            let r = backup_with(&repo, &next, &options);
            let id = repo.next_backup_id().unwrap() - 1;
            (r.is_ok(), id)
        };
        let repo = Repository::open(&root, LockMode::Exclusive).unwrap();
        if repo.backups().unwrap().contains(&committed.1) && !originals.contains_key(&committed.1) {
            originals.insert(committed.1, next.clone());
            data = next;
        }
        lifecycle::arrange(&repo).unwrap();
        lifecycle::reclaim(&repo).unwrap();
        verify_all(&repo, dir.path(), &originals);
    }
    // Deletions (truncations and volume deletions) interrupted at every request.
    for budget in 0..8 {
        let victim = *originals.keys().nth(1 + budget as usize % 3).unwrap();
        {
            let repo = failing_after(&root, budget);
            let _ = lifecycle::delete_backups(&repo, &[victim]);
        }
        let repo = Repository::open(&root, LockMode::Exclusive).unwrap();
        if !repo.backups().unwrap().contains(&victim) {
            originals.remove(&victim);
        }
        verify_all(&repo, dir.path(), &originals);
        lifecycle::reclaim(&repo).unwrap();
        verify_all(&repo, dir.path(), &originals);
        // A new version keeps the chain going.
        data = edit(&data, 6, 6000, 900 + budget as u64);
        let s = backup(&repo, "db", &data).snapshot;
        originals.insert(s.id, data.clone());
    }
    // A crashed deletion: snapshot gone, reclaim not run yet.
    let repo = Repository::open(&root, LockMode::Exclusive).unwrap();
    let first = *originals.keys().next().unwrap();
    tessera::commands::delete::delete_backup(&repo, first).unwrap();
    originals.remove(&first);
    verify_all(&repo, dir.path(), &originals);
    lifecycle::reclaim(&repo).unwrap();
    verify_all(&repo, dir.path(), &originals);
}

#[test]
fn crash_while_removing_a_lineage_then_reusing_its_source() {
    for budget in [0, 1, 2, 3, 5, 8, 13] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        let mut data = Rng(13).bytes(120_000);
        {
            let repo = Repository::init(&root, config(Arrange::Auto, false)).unwrap();
            for v in 0..5u64 {
                data = edit(&data, 6, 6000, 800 + v);
                backup(&repo, "vm", &data);
            }
        }
        {
            let repo = failing_after(&root, budget);
            let _ = lifecycle::forget_keep_last(&repo, 0);
        }
        let repo = Repository::open(&root, LockMode::Exclusive).unwrap();
        let mut originals: BTreeMap<u64, Vec<u8>> = repo
            .backups()
            .unwrap()
            .into_iter()
            .map(|id| {
                let path = dir.path().join("survivor");
                lifecycle::restore_to_file(&repo, id, &path, &LifecycleRestoreOptions::default())
                    .unwrap();
                (id, std::fs::read(&path).unwrap())
            })
            .collect();
        verify_all(&repo, dir.path(), &originals);
        // The source goes on: with the old lineage's leftovers, or what is left of it.
        let mut fresh = Rng(14).bytes(100_000);
        for v in 0..4u64 {
            fresh = edit(&fresh, 6, 6000, 850 + v);
            let s = backup(&repo, "vm", &fresh).snapshot;
            originals.insert(s.id, fresh.clone());
            verify_all(&repo, dir.path(), &originals);
        }
        lifecycle::forget_keep_last(&repo, 0).unwrap();
        verify_all(&repo, dir.path(), &BTreeMap::new());
    }
}

#[test]
fn arranging_falls_behind_then_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init(dir.path(), config(Arrange::Manual, false));
    let mut data = Rng(11).bytes(300_000);
    let mut originals = BTreeMap::new();
    for v in 0..10u64 {
        data = edit(&data, 10, 6000, 200 + v);
        let out = backup(&repo, "web", &data);
        assert!(out.arrange.is_none());
        originals.insert(out.snapshot.id, data.clone());
    }
    let behind = verify_all(&repo, dir.path(), &originals);
    let last = behind.last().unwrap();
    assert_eq!(last.arranged, 0);
    assert!(
        last.read_amplification > 1.0,
        "latest needs all pending categories: {last:?}"
    );
    let s = lifecycle::arrange_rounds(&repo, Some(4)).unwrap();
    assert_eq!((s.rounds, s.pending_rounds), (4, 6));
    verify_all(&repo, dir.path(), &originals);
    // Deleting while behind, backing up while behind.
    let second = *originals.keys().nth(1).unwrap();
    lifecycle::delete_backups(&repo, &[second]).unwrap();
    originals.remove(&second);
    data = edit(&data, 10, 6000, 999);
    let s = backup(&repo, "web", &data).snapshot;
    originals.insert(s.id, data.clone());
    verify_all(&repo, dir.path(), &originals);
    let s = lifecycle::arrange(&repo).unwrap();
    assert_eq!((s.rounds, s.pending_rounds), (7, 0));
    let caught_up = verify_all(&repo, dir.path(), &originals);
    assert!(
        caught_up.iter().all(|s| s.read_amplification <= 1.0),
        "{caught_up:?}"
    );
    assert!(caught_up.last().unwrap().read_amplification < last.read_amplification);
}

#[test]
fn interleaved_lineages_deduplicate_like_separate_repositories() {
    let dir = tempfile::tempdir().unwrap();
    let shared =
        Repository::init(&dir.path().join("shared"), config(Arrange::Auto, false)).unwrap();
    let alone_a = Repository::init(&dir.path().join("a"), config(Arrange::Auto, false)).unwrap();
    let alone_b = Repository::init(&dir.path().join("b"), config(Arrange::Auto, false)).unwrap();
    let mut a = Rng(21).bytes(250_000);
    let mut b = Rng(22).bytes(250_000);
    let mut originals = BTreeMap::new();
    let (mut stored_shared, mut stored_alone) = (0, 0);
    for v in 0..8u64 {
        a = edit(&a, 5, 6000, 300 + v);
        b = edit(&b, 5, 6000, 400 + v);
        let sa = backup(&shared, "host-a", &a).snapshot;
        let sb = backup(&shared, "", &b).snapshot;
        stored_shared += sa.stats.stored_bytes + sb.stats.stored_bytes;
        stored_alone += backup(&alone_a, "host-a", &a).snapshot.stats.stored_bytes;
        stored_alone += backup(&alone_b, "", &b).snapshot.stats.stored_bytes;
        assert_eq!(
            sa.stats.stored_bytes,
            alone_a
                .snapshot(alone_a.backups().unwrap().last().copied().unwrap())
                .unwrap()
                .stats
                .stored_bytes
        );
        originals.insert(sa.id, a.clone());
        originals.insert(sb.id, b.clone());
    }
    assert_eq!(stored_shared, stored_alone);
    let stats = verify_all(&shared, dir.path(), &originals);
    assert!(stats.iter().all(|s| s.read_amplification <= 1.0));
    // Deleting one lineage's oldest backup leaves the other untouched.
    let oldest_a = *originals.keys().next().unwrap();
    let freed = lifecycle::delete_backups(&shared, &[oldest_a]).unwrap();
    assert!(
        freed.volumes_deleted == 1 && freed.volumes_truncated == 0,
        "{freed:?}"
    );
    originals.remove(&oldest_a);
    verify_all(&shared, dir.path(), &originals);
}

#[test]
fn trace_repository_plans_restores_from_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let trace = Repository::init(&dir.path().join("trace"), config(Arrange::Auto, true)).unwrap();
    let real = Repository::init(&dir.path().join("real"), config(Arrange::Auto, false)).unwrap();
    let mut data = Rng(31).bytes(200_000);
    let mut ids = Vec::new();
    for v in 0..6u64 {
        data = edit(&data, 5, 6000, 600 + v);
        let t = backup(&trace, "t", &data).snapshot;
        let r = backup(&real, "t", &data).snapshot;
        assert_eq!(t.stats.stored_bytes, r.stats.stored_bytes);
        ids.push((t.id, r.id, data.clone()));
    }
    // The trace repository's totals count the bytes its objects stand for:
    // the same as the real one's, up to the data-section checksums' layout.
    let (tt, rt) = (
        tessera::commands::stats::totals(&trace).unwrap(),
        tessera::commands::stats::totals(&real).unwrap(),
    );
    assert_eq!(tt.logical_bytes, rt.logical_bytes);
    assert_eq!(tt.containers, rt.containers);
    assert_eq!(tt.physical_bytes, rt.physical_bytes, "{tt:?} vs {rt:?}");
    for (tid, rid, data) in &ids {
        let plan = lifecycle::plan_restore(&trace, *tid).unwrap();
        let path = dir.path().join("out");
        let real_stats =
            lifecycle::restore_to_file(&real, *rid, &path, &LifecycleRestoreOptions::default())
                .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), *data);
        assert!(plan.plan_only);
        assert_eq!(plan.bytes_restored, real_stats.bytes_restored);
        assert_eq!(plan.data_bytes_read, real_stats.data_bytes_read);
        assert_eq!(plan.extents, real_stats.extents);
        assert!(plan.read_amplification <= 1.0);
    }
    assert!(lifecycle::restore_to_file(
        &trace,
        ids[0].0,
        &dir.path().join("x"),
        &LifecycleRestoreOptions::default()
    )
    .is_err());
    let report = full_check(&trace);
    assert!(report.is_ok(), "{:?}", report.problems);
    lifecycle::delete_backups(&trace, &[ids[0].0, ids[3].0]).unwrap();
    let report = full_check(&trace);
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn check_finds_a_damaged_volume_and_names_the_affected_backups() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init(dir.path(), config(Arrange::Auto, false));
    let mut data = Rng(41).bytes(200_000);
    let mut ids = Vec::new();
    for v in 0..4u64 {
        data = edit(&data, 6, 6000, 700 + v);
        ids.push(backup(&repo, "s", &data).snapshot.id);
    }
    let vol = dir
        .path()
        .join("repo/lifecycle")
        .join(lifecycle::lineage_name("s"))
        .join("vol/0000000000000002-00000000-0000000000000001");
    let mut bytes = std::fs::read(&vol).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0xff;
    std::fs::write(&vol, bytes).unwrap();
    let quick = tessera::commands::check::check(
        &repo,
        CheckOptions {
            read_data: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(quick.is_ok(), "metadata intact: {:?}", quick.problems);
    let full = full_check(&repo);
    assert_eq!(full.problems.len(), 1, "{:?}", full.problems);
    assert_eq!(full.problems[0].affected_backups, vec![ids[0], ids[1]]);
    let err = lifecycle::restore_to_file(
        &repo,
        ids[1],
        &dir.path().join("o"),
        &LifecycleRestoreOptions::default(),
    );
    assert!(err.is_err());
    let mut sink = Vec::new();
    assert!(lifecycle::restore_to_writer(
        &repo,
        ids[1],
        &mut sink,
        &LifecycleRestoreOptions::default()
    )
    .is_err());
    // Restores that do not need volume 2 still work.
    lifecycle::restore_to_file(
        &repo,
        ids[3],
        &dir.path().join("o"),
        &LifecycleRestoreOptions::default(),
    )
    .unwrap();
}

#[derive(Clone, Debug)]
enum Step {
    Backup { source: u8, edits: u8, seed: u64 },
    Delete { pick: usize },
    Forget { keep: usize },
    Arrange { rounds: Option<u8> },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0u8..2, 0u8..8, any::<u64>()).prop_map(|(source, edits, seed)| Step::Backup { source, edits, seed }),
        2 => any::<usize>().prop_map(|pick| Step::Delete { pick }),
        1 => (0usize..4).prop_map(|keep| Step::Forget { keep }),
        2 => proptest::option::of(0u8..3).prop_map(|rounds| Step::Arrange { rounds }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn random_backup_delete_arrange_sequences_keep_every_live_backup(steps in proptest::collection::vec(step(), 1..14)) {
        let dir = tempfile::tempdir().unwrap();
        let repo = init(dir.path(), config(Arrange::Manual, false));
        let mut current = [Rng(1).bytes(60_000), Rng(2).bytes(60_000)];
        let mut originals: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for s in steps {
            match s {
                Step::Backup { source, edits, seed } => {
                    let k = source as usize;
                    current[k] = edit(&current[k], u32::from(edits), 6000, seed);
                    let snap = backup(&repo, &format!("src{k}"), &current[k]).snapshot;
                    originals.insert(snap.id, current[k].clone());
                }
                Step::Delete { pick } => {
                    if !originals.is_empty() {
                        let id = *originals.keys().nth(pick % originals.len()).unwrap();
                        let predicted = lifecycle::space(&repo, &[id]).unwrap();
                        let stats = lifecycle::delete_backups(&repo, &[id]).unwrap();
                        prop_assert_eq!(stats.bytes_freed, predicted);
                        originals.remove(&id);
                    }
                }
                Step::Forget { keep } => {
                    let stats = lifecycle::forget_keep_last(&repo, keep).unwrap();
                    for id in stats.deleted {
                        originals.remove(&id);
                    }
                }
                Step::Arrange { rounds } => {
                    lifecycle::arrange_rounds(&repo, rounds.map(u64::from)).unwrap();
                }
            }
            verify_all(&repo, dir.path(), &originals);
        }
        let s = lifecycle::arrange(&repo).unwrap();
        prop_assert_eq!(s.pending_rounds, 0);
        let stats = verify_all(&repo, dir.path(), &originals);
        for st in stats {
            prop_assert!(st.read_amplification <= 1.0, "{:?}", st);
        }
    }
}
