//! The bounded, seeded version of the scale benchmark (issue 25,
//! `benches/trace_scale.rs`): a few-GB generated trace replayed through
//! the default index (DDFS) and the exact index. Checks counts, not
//! timings: deduplication against exact, the index's memory against its
//! configured budget, and no growth of on-disk lookups per GiB from version
//! to version.

use tessera::index::IndexStats;
use tessera::repo::config::{Config, IndexKind};
use tessera_lab::gen::GenOptions;
use tessera_lab::scale::{replay, VersionRun};

/// 12 versions of 200 MiB (2.3 GiB logical, ~27 000 chunks each).
fn workload() -> GenOptions {
    GenOptions {
        versions: 12,
        size: 200 << 20,
        trace: true,
        seed: 25,
        ..GenOptions::default()
    }
}

fn config(index: IndexKind, bloom_bytes: u64, cache_bytes: u64) -> Config {
    let mut c = Config::new("scale-test".into());
    c.index = index;
    c.bloom_bytes = bloom_bytes;
    c.index_cache_bytes = cache_bytes;
    c
}

fn run(config: Config) -> Vec<VersionRun> {
    let dir = tempfile::tempdir().unwrap();
    replay(&workload(), config, &dir.path().join("repo"), |_| {})
        .unwrap()
        .0
}

fn stored(runs: &[VersionRun]) -> u64 {
    runs.iter().map(|r| r.stored).sum()
}

/// Memory of the index beyond its two budgets: this backup's new
/// fingerprints (spilled past 8 MiB) and small fixed structures.
const PENDING_ALLOWANCE: u64 = 9 << 20;

fn within_budget(s: &IndexStats, bloom_budget: u64, cache_budget: u64) -> bool {
    s.bloom_bytes <= bloom_budget
        && s.cache_peak_bytes <= cache_budget
        && s.memory_bytes <= bloom_budget + cache_budget + PENDING_ALLOWANCE
}

#[test]
fn ddfs_matches_exact_in_bounded_memory_without_slowing_down() {
    let exact = run(config(IndexKind::Exact, 0, 64 << 20));
    assert_eq!(exact.len(), 12);

    // The default settings (the Bloom budget does not bind at this size).
    let cache = 4 << 20;
    let ddfs = run(config(IndexKind::Ddfs, 0, cache));
    let ratio = stored(&exact) as f64 / stored(&ddfs) as f64;
    assert!(ratio >= 0.98, "dedup vs exact {ratio}");
    let budget = Config::new(String::new()).ddfs_bloom_budget();
    for r in &ddfs {
        assert!(within_budget(&r.index, budget, cache), "{:?}", r.index);
    }
    // The index's own on-disk reads per GiB (bucket reads that load no
    // container: Bloom false positives) do not grow as the repository
    // does: no more than 1.2× those of the second version (the first has
    // an empty table) plus a small allowance. The reads that load a
    // container follow the versions' fragmentation, not the index size:
    // they stay within 2× the second version's.
    let wasted =
        |r: &VersionRun| r.per_gib(r.index.disk_lookups.saturating_sub(r.index.container_loads));
    let loads = |r: &VersionRun| r.per_gib(r.index.container_loads);
    let (base_wasted, base_loads) = (wasted(&ddfs[1]), loads(&ddfs[1]));
    for r in &ddfs[2..] {
        assert!(
            wasted(r) <= 1.2 * base_wasted + 64.0,
            "version {}: {:.0} wasted reads/GiB vs {base_wasted:.0}",
            r.version,
            wasted(r)
        );
        assert!(
            loads(r) <= 2.0 * base_loads,
            "version {}: {:.0} container loads/GiB vs {base_loads:.0}",
            r.version,
            loads(r)
        );
    }

    // A Bloom budget far below the filters' size: still exact, and the
    // filters held stay within it (runs whose filter does not fit are
    // looked up on disk).
    let tight = 16 << 10;
    let small = run(config(IndexKind::Ddfs, tight, cache));
    assert_eq!(stored(&small), stored(&ddfs));
    for r in &small {
        assert!(within_budget(&r.index, tight, cache), "{:?}", r.index);
    }
    let last = |runs: &[VersionRun]| runs.last().map_or(0, |r| r.index.disk_lookups);
    assert!(last(&small) > last(&ddfs), "the tight budget costs lookups");
}

/// The data mode: generated tar streams piped into real backups, through
/// DDFS and the exact index, store the same bytes version by version.
#[test]
fn data_mode_backs_up_generated_streams_as_the_exact_index_does() {
    let gen = GenOptions {
        versions: 4,
        size: 6 << 20,
        trace: false,
        seed: 25,
        ..GenOptions::default()
    };
    let replay_with = |index| {
        let dir = tempfile::tempdir().unwrap();
        let (runs, repo) = replay(
            &gen,
            config(index, 0, 4 << 20),
            &dir.path().join("repo"),
            |_| {},
        )
        .unwrap();
        assert_eq!(repo.backups().unwrap().len(), 4);
        runs
    };
    let (exact, ddfs) = (replay_with(IndexKind::Exact), replay_with(IndexKind::Ddfs));
    assert_eq!(ddfs.len(), 4);
    for (e, d) in exact.iter().zip(&ddfs) {
        assert!(
            d.logical >= 6 << 20,
            "version {}: {} bytes",
            d.version,
            d.logical
        );
        assert_eq!(e.stored, d.stored, "version {}", d.version);
    }
    // Later versions deduplicate against the first.
    assert!(stored(&ddfs[1..]) < stored(&ddfs[..1]));
}
