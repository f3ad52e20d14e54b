//! Property: the lifecycle arranging leaves byte-identical repository
//! objects (active categories, volumes, NDF tables, lineage states) and the
//! same counts whether its sorts stay in memory or spill to temporary files
//! from the first few entries on (a zero budget), over random sequences of
//! backups of two sources, deletions, partial and automatic arranging, and
//! NDF tables deleted or damaged (rebuilt from the recipe); and every live
//! backup restores byte-identically.

mod common;

use common::{damage_ndf_table, edit, files, first_difference, Rng};
use proptest::prelude::*;
use std::collections::BTreeMap;
use tessera::layout::lifecycle::{self, ArrangeOptions, ArrangeStats, LifecycleRestoreOptions};
use tessera::repo::config::{Arrange, Config};
use tessera::Repository;

fn config(arrange: Arrange, compression: bool) -> Config {
    let mut c = common::small_lifecycle_config("arrange-spill", arrange);
    if compression {
        c.compression = tessera::repo::config::Compression::Auto;
    }
    c
}

#[derive(Clone, Debug)]
enum Step {
    Backup {
        source: u8,
        edits: u8,
        seed: u64,
    },
    Delete {
        pick: usize,
    },
    Arrange {
        rounds: Option<u8>,
    },
    /// Delete (or, with `flip`, damage a byte of) a stored NDF table.
    Table {
        pick: usize,
        flip: Option<usize>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..2, 0u8..8, any::<u64>()).prop_map(|(source, edits, seed)| Step::Backup { source, edits, seed }),
        2 => any::<usize>().prop_map(|pick| Step::Delete { pick }),
        2 => proptest::option::of(0u8..3).prop_map(|rounds| Step::Arrange { rounds }),
        1 => (any::<usize>(), proptest::option::of(any::<usize>())).prop_map(|(pick, flip)| Step::Table { pick, flip }),
    ]
}

/// An arranging run's counts, without its I/O and time (the spilling run
/// reads the active parts' metadata once more).
fn counts(s: &ArrangeStats) -> ArrangeStats {
    ArrangeStats {
        bytes_read: 0,
        bytes_written: 0,
        seconds: 0.0,
        ..s.clone()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn spilled_arranging_writes_the_same_objects(
        steps in proptest::collection::vec(step(), 1..16),
        auto in any::<bool>(),
        compression in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mode = if auto { Arrange::Auto } else { Arrange::Manual };
        // [in memory, spilled from the first entries on]
        let budgets = [tessera::gc::DEFAULT_SORT_BUDGET, 0];
        let roots = ["memory", "spilled"].map(|n| dir.path().join(n));
        let repos: Vec<Repository> = roots
            .iter()
            .map(|r| Repository::init(r, config(mode, compression)).unwrap())
            .collect();
        let mut current = [Rng(1).bytes(60_000), Rng(2).bytes(60_000)];
        let mut originals: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let damaged_tables = steps.iter().any(|s| matches!(s, Step::Table { .. }));
        for s in steps {
            let mut stats: Vec<Option<ArrangeStats>> = Vec::new();
            for ((repo, root), budget) in repos.iter().zip(&roots).zip(budgets) {
                match &s {
                    Step::Backup { source, edits, seed } => {
                        let k = *source as usize;
                        let data = edit(&current[k], u32::from(*edits), 6000, *seed);
                        let options = tessera::backup::BackupOptions {
                            source: format!("src{k}"),
                            sort_budget: Some(budget),
                            ..Default::default()
                        };
                        let source = tessera::backup::Input::Stream {
                            input: &mut &data[..],
                            name: "data",
                        };
                        let o = tessera::backup::backup(repo, source, &options).unwrap();
                        stats.push(o.arrange.as_ref().map(counts));
                        if budget == 0 {
                            originals.insert(o.snapshot.id, data.clone());
                            current[k] = data;
                        }
                    }
                    Step::Delete { pick } => {
                        if let Some(&id) = originals.keys().nth(pick % originals.len().max(1)) {
                            lifecycle::delete_backups(repo, &[id]).unwrap();
                        }
                    }
                    Step::Arrange { rounds } => {
                        let options = ArrangeOptions {
                            rounds: rounds.map(u64::from),
                            sort_budget: budget,
                        };
                        let s = lifecycle::arrange_with_options(repo, &options, &tessera::Silent)
                            .unwrap();
                        stats.push(Some(counts(&s)));
                    }
                    Step::Table { pick, flip } => damage_ndf_table(root, *pick, *flip),
                }
            }
            if let Step::Delete { pick } = &s {
                if let Some(&id) = originals.keys().nth(pick % originals.len().max(1)) {
                    originals.remove(&id);
                }
            }
            prop_assert_eq!(&stats.first(), &stats.last(), "arranging counts after {:?}", s);
            let [a, b] = [0, 1].map(|i| files(&roots[i].join("lifecycle")));
            prop_assert_eq!(first_difference(&a, &b), None, "objects after {:?}", s);
        }
        let last: Vec<ArrangeStats> = repos
            .iter()
            .zip(budgets)
            .map(|(repo, sort_budget)| {
                let options = ArrangeOptions { rounds: None, sort_budget };
                counts(&lifecycle::arrange_with_options(repo, &options, &tessera::Silent).unwrap())
            })
            .collect();
        prop_assert_eq!(&last[0], &last[1]);
        prop_assert!(files(&roots[0].join("lifecycle")) == files(&roots[1].join("lifecycle")));
        for (repo, root) in repos.iter().zip(&roots) {
            for (&id, data) in &originals {
                let out = root.join(format!("restored-{id}"));
                let st = lifecycle::restore_to_file(repo, id, &out, &LifecycleRestoreOptions::default())
                    .unwrap();
                prop_assert!(std::fs::read(&out).unwrap() == *data, "backup {} restored wrong bytes", id);
                // Arranged exactly: a restore reads only chunks it needs
                // (unless a table and its recipe were both lost; encoded
                // entries are a little larger than the chunks).
                prop_assert!(damaged_tables || compression || st.read_amplification <= 1.0, "{:?}", st);
            }
        }
    }
}
