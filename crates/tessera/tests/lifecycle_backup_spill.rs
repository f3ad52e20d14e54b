//! Property: a lifecycle backup classifies every chunk the same way
//! (unique, internal or adjacent duplicate: same counts and bytes, same
//! index entries) and writes byte-identical repository objects whether the
//! previous version's NDF table is looked up in a hash set (the default
//! budget) or from a temporary file with a sparse index and a Bloom filter
//! (a budget of a few KiB or none), over random backups of versioned data
//! of two sources with quarantined chunks, damaged quarantine records
//! (every chunk quarantined) and NDF tables deleted or damaged (rebuilt
//! from the recipe).

mod common;

use common::{damage_ndf_table, edit, files, first_difference, Rng};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tessera::format::snapshot::{recipe_key, BackupStats, Recipe};
use tessera::repo::config::Arrange;
use tessera::Repository;

#[derive(Clone, Debug)]
enum Step {
    Backup {
        source: u8,
        edits: u8,
        seed: u64,
    },
    /// Delete (or, with `flip`, damage a byte of) a stored NDF table.
    Table {
        pick: usize,
        flip: Option<usize>,
    },
    /// Quarantine a chunk of the last backup.
    Quarantine {
        pick: usize,
    },
    /// Damage a source's quarantine record: every chunk is quarantined.
    DamageQuarantine {
        source: u8,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..2, 0u8..8, any::<u64>()).prop_map(|(source, edits, seed)| Step::Backup { source, edits, seed }),
        2 => (any::<usize>(), proptest::option::of(any::<usize>())).prop_map(|(pick, flip)| Step::Table { pick, flip }),
        2 => any::<usize>().prop_map(|pick| Step::Quarantine { pick }),
        1 => (0u8..2).prop_map(|source| Step::DamageQuarantine { source }),
    ]
}

/// A backup's classification of its chunks and its index entries.
fn classes(s: &BackupStats) -> String {
    format!(
        "unique {:?} internal {:?} adjacent {:?} entries {}",
        s.unique, s.internal_duplicates, s.duplicates, s.index.entries
    )
}

/// The repository objects a backup writes: categories, NDF tables,
/// lineage states, quarantine records and recipes (not the snapshots,
/// which record times).
fn objects(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = files(&root.join("lifecycle"));
    for dir in [
        tessera::repo::quarantine::QUARANTINE_DIR,
        tessera::format::snapshot::RECIPE_DIR,
    ] {
        out.extend(
            files(&root.join(dir))
                .into_iter()
                .map(|(p, b)| (Path::new(dir).join(p), b)),
        );
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn backups_classify_the_same_whatever_the_lookup_budget(
        steps in proptest::collection::vec(step(), 1..14),
        small in prop_oneof![Just(0u64), 0u64..4096],
    ) {
        let dir = tempfile::tempdir().unwrap();
        // [hash set, temporary file (beyond a dozen or so fingerprints)]
        let budgets = [tessera::gc::DEFAULT_SORT_BUDGET, small];
        let roots = ["memory", "file"].map(|n| dir.path().join(n));
        let repos: Vec<Repository> = roots
            .iter()
            .map(|r| Repository::init(r, common::small_lifecycle_config("backup-spill", Arrange::Manual)).unwrap())
            .collect();
        let mut current = [Rng(1).bytes(100_000), Rng(2).bytes(100_000)];
        let mut last: Option<u64> = None;
        for s in steps {
            let mut stats = Vec::new();
            if let Step::Backup { source, edits, seed } = &s {
                current[*source as usize] = edit(&current[*source as usize], u32::from(*edits), 6000, *seed);
            }
            for ((repo, root), budget) in repos.iter().zip(&roots).zip(budgets) {
                match &s {
                    Step::Backup { source, .. } => {
                        let options = tessera::backup::BackupOptions {
                            source: format!("src{source}"),
                            sort_budget: Some(budget),
                            ..Default::default()
                        };
                        let data = &current[*source as usize];
                        let input = tessera::backup::Input::Stream { input: &mut &data[..], name: "data" };
                        let o = tessera::backup::backup(repo, input, &options).unwrap();
                        stats.push(classes(&o.snapshot.stats));
                        last = Some(o.snapshot.id);
                    }
                    Step::Table { pick, flip } => damage_ndf_table(root, *pick, *flip),
                    Step::Quarantine { pick } => {
                        if let Some(id) = last {
                            let bytes = std::fs::read(root.join(recipe_key(id))).unwrap();
                            let recipe = Recipe::decode(id, &bytes).unwrap();
                            let snap = repo.snapshot(id).unwrap();
                            let fp = recipe.chunks[pick % recipe.chunks.len()].fp;
                            let lineage = tessera::layout::lifecycle::lineage_name(&snap.source);
                            tessera::repo::quarantine::record_lineage(repo.backend().as_ref(), &lineage, [fp])
                                .unwrap();
                        }
                    }
                    Step::DamageQuarantine { source } => {
                        let lineage = tessera::layout::lifecycle::lineage_name(&format!("src{source}"));
                        let key = tessera::repo::quarantine::lineage_key(&lineage);
                        std::fs::create_dir_all(root.join(&key).parent().unwrap()).unwrap();
                        std::fs::write(root.join(key), b"damaged").unwrap();
                    }
                }
            }
            prop_assert_eq!(&stats.first(), &stats.last(), "classes after {:?}", s);
            let [a, b] = [0, 1].map(|i| objects(&roots[i]));
            prop_assert_eq!(first_difference(&a, &b), None, "objects after {:?}", s);
        }
    }
}
