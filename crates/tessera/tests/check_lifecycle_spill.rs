//! Property: `check` of a lifecycle repository finds the same problems,
//! with the same counts, whether each version's recipe and the chunks of
//! the objects it reads are sorted in memory or spilled to temporary files
//! from the first few entries on (a zero budget), on repositories built by
//! random backups of two sources, deletions and partial arranging, then
//! damaged at random: category and volume parts deleted, truncated or with
//! a flipped byte, NDF tables deleted or flipped, recipes deleted, flipped
//! or replaced by a sound recipe of another backup's chunks.

mod common;

use common::{copy_dir, edit, paths, Rng};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use tessera::format::snapshot::{recipe_key, Recipe};
use tessera::layout::lifecycle::{self, ArrangeOptions};
use tessera::repo::config::Arrange;
use tessera::Repository;

#[derive(Clone, Debug)]
enum Step {
    Backup { source: u8, edits: u8, seed: u64 },
    Delete { pick: usize },
    Arrange { rounds: Option<u8> },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..2, 0u8..8, any::<u64>()).prop_map(|(source, edits, seed)| Step::Backup { source, edits, seed }),
        1 => any::<usize>().prop_map(|pick| Step::Delete { pick }),
        2 => proptest::option::of(0u8..3).prop_map(|rounds| Step::Arrange { rounds }),
    ]
}

#[derive(Clone, Debug)]
enum Damage {
    DeletePart(usize),
    TruncatePart(usize),
    FlipPart(usize, usize),
    DeleteTable(usize),
    FlipTable(usize, usize),
    DeleteRecipe(usize),
    FlipRecipe(usize, usize),
    /// Backup `.0`'s recipe replaced by a sound one holding backup `.1`'s chunks.
    ForeignRecipe(usize, usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        any::<usize>().prop_map(Damage::DeletePart),
        any::<usize>().prop_map(Damage::TruncatePart),
        (any::<usize>(), any::<usize>()).prop_map(|(p, b)| Damage::FlipPart(p, b)),
        any::<usize>().prop_map(Damage::DeleteTable),
        (any::<usize>(), any::<usize>()).prop_map(|(p, b)| Damage::FlipTable(p, b)),
        any::<usize>().prop_map(Damage::DeleteRecipe),
        (any::<usize>(), any::<usize>()).prop_map(|(p, b)| Damage::FlipRecipe(p, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Damage::ForeignRecipe(a, b)),
    ]
}

fn pick(paths: &[PathBuf], i: usize) -> Option<&PathBuf> {
    (!paths.is_empty()).then(|| &paths[i % paths.len()])
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    if !b.is_empty() {
        let at = at % b.len();
        b[at] ^= 0x20;
        std::fs::write(path, b).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn lifecycle_check_finds_the_same_problems_whether_or_not_it_spills(
        steps in proptest::collection::vec(step(), 1..12),
        damages in proptest::collection::vec(damage(), 0..4),
        read_data: bool,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let config = common::small_lifecycle_config("check-lifecycle-spill", Arrange::Manual);
        let repo = Repository::init(&path, config).unwrap();
        let mut current = [Rng(1).bytes(60_000), Rng(2).bytes(60_000)];
        for s in steps {
            match s {
                Step::Backup { source, edits, seed } => {
                    let k = source as usize;
                    current[k] = edit(&current[k], u32::from(edits), 6000, seed);
                    let options = tessera::backup::BackupOptions {
                        source: format!("src{k}"),
                        ..Default::default()
                    };
                    let input = tessera::backup::Input::Stream { input: &mut &current[k][..], name: "data" };
                    tessera::backup::backup(&repo, input, &options).unwrap();
                }
                Step::Delete { pick } => {
                    let ids = repo.backups().unwrap();
                    if !ids.is_empty() {
                        lifecycle::delete_backups(&repo, &[ids[pick % ids.len()]]).unwrap();
                    }
                }
                Step::Arrange { rounds } => {
                    let options = ArrangeOptions { rounds: rounds.map(u64::from), ..Default::default() };
                    lifecycle::arrange_with_options(&repo, &options, &tessera::Silent).unwrap();
                }
            }
        }
        let backups = repo.backups().unwrap();
        drop(repo);
        let lifecycle_dir = path.join("lifecycle");
        let recipe = |i: usize| (!backups.is_empty()).then(|| backups[i % backups.len()]);
        for d in damages {
            let parts: Vec<PathBuf> = [paths(&lifecycle_dir, "/cat/"), paths(&lifecycle_dir, "/vol/")].concat();
            let tables = paths(&lifecycle_dir, "/ndf/");
            match d {
                Damage::DeletePart(i) => {
                    if let Some(p) = pick(&parts, i) {
                        std::fs::remove_file(p).unwrap();
                    }
                }
                Damage::TruncatePart(i) => {
                    if let Some(p) = pick(&parts, i) {
                        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                        let len = f.metadata().unwrap().len();
                        f.set_len(len / 2).unwrap();
                    }
                }
                Damage::FlipPart(i, at) => {
                    if let Some(p) = pick(&parts, i) {
                        flip(p, at);
                    }
                }
                Damage::DeleteTable(i) => {
                    if let Some(p) = pick(&tables, i) {
                        std::fs::remove_file(p).unwrap();
                    }
                }
                Damage::FlipTable(i, at) => {
                    if let Some(p) = pick(&tables, i) {
                        flip(p, at);
                    }
                }
                Damage::DeleteRecipe(i) => {
                    if let Some(id) = recipe(i) {
                        let _ = std::fs::remove_file(path.join(recipe_key(id)));
                    }
                }
                Damage::FlipRecipe(i, at) => {
                    if let Some(id) = recipe(i) {
                        let p = path.join(recipe_key(id));
                        if p.exists() {
                            flip(&p, at);
                        }
                    }
                }
                Damage::ForeignRecipe(i, j) => {
                    if let (Some(id), Some(other)) = (recipe(i), recipe(j)) {
                        let bytes = std::fs::read(path.join(recipe_key(other))).ok();
                        if let Some(mut r) = bytes.and_then(|b| Recipe::decode(other, &b).ok()) {
                            r.backup = id;
                            // Another version's chunks, in another order.
                            r.chunks.reverse();
                            std::fs::write(path.join(recipe_key(id)), r.encode().unwrap()).unwrap();
                        }
                    }
                }
            }
        }
        // Check writes quarantine records: each check runs on its own copy.
        let spilled = dir.path().join("spilled");
        copy_dir(&path, &spilled);
        let in_memory = common::check_report(&path, read_data, tessera::gc::DEFAULT_SORT_BUDGET);
        let sorted = common::check_report(&spilled, read_data, 0);
        prop_assert_eq!(in_memory, sorted);
    }
}
