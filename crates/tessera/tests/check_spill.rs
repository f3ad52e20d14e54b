//! Property: `check` finds the same problems, with the same counts, whether
//! its stored chunks, references and delta bases stay in memory or are
//! sorted to temporary files from the first few entries on (a zero
//! budget), on repositories damaged at random: containers deleted,
//! truncated or with a flipped byte, recipes deleted.

mod common;

use common::{backup_bytes, copy_dir, edit, small_chunker, Rng};
use proptest::prelude::*;
use tessera::backup::BackupOptions;
use tessera::delta::DeltaKind;
use tessera::gc::DEFAULT_SORT_BUDGET;
use tessera::repo::config::Config;
use tessera::Repository;

#[derive(Clone, Debug)]
enum Damage {
    DeleteContainer(usize),
    TruncateContainer(usize),
    FlipContainerByte(usize, usize),
    DeleteRecipe(usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        any::<usize>().prop_map(Damage::DeleteContainer),
        any::<usize>().prop_map(Damage::TruncateContainer),
        (any::<usize>(), any::<usize>()).prop_map(|(c, b)| Damage::FlipContainerByte(c, b)),
        any::<usize>().prop_map(Damage::DeleteRecipe),
    ]
}

fn config(delta: DeltaKind) -> Config {
    let mut c = Config::new("check-spill".into());
    c.delta.kind = delta;
    c.chunker = small_chunker();
    c.container_size = 16 * 1024;
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn check_finds_the_same_problems_whether_or_not_it_spills(
        versions in prop::collection::vec((0u8..6, any::<u64>()), 1..6),
        seed: u64,
        delta in prop_oneof![Just(DeltaKind::None), Just(DeltaKind::Greedy)],
        damages in prop::collection::vec(damage(), 0..4),
        read_data: bool,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let repo = Repository::init(&path, config(delta)).unwrap();
        let mut current = Rng(seed | 1).bytes(60_000);
        for (edits, seed) in versions {
            current = edit(&current, u32::from(edits), 3000, seed);
            backup_bytes(&repo, &current[..], "mem", &BackupOptions::default()).map(|o| o.snapshot).unwrap();
        }
        let containers = repo.containers().unwrap();
        let backups = repo.backups().unwrap();
        drop(repo);
        for d in damages {
            let container = |i: usize| path.join(tessera::layout::container::key(containers[i % containers.len()]));
            match d {
                Damage::DeleteContainer(i) => {
                    let _ = std::fs::remove_file(container(i));
                }
                Damage::TruncateContainer(i) => {
                    if let Ok(f) = std::fs::OpenOptions::new().write(true).open(container(i)) {
                        let len = f.metadata().unwrap().len();
                        f.set_len(len / 2).unwrap();
                    }
                }
                Damage::FlipContainerByte(i, at) => {
                    if let Ok(mut bytes) = std::fs::read(container(i)) {
                        if !bytes.is_empty() {
                            let at = at % bytes.len();
                            bytes[at] ^= 0x40;
                            std::fs::write(container(i), bytes).unwrap();
                        }
                    }
                }
                Damage::DeleteRecipe(i) => {
                    let id = backups[i % backups.len()];
                    let _ = std::fs::remove_file(path.join(tessera::format::snapshot::recipe_key(id)));
                }
            }
        }
        // Check writes quarantine records: each check runs on its own copy.
        let spilled = dir.path().join("spilled");
        copy_dir(&path, &spilled);
        let in_memory = common::check_report(&path, read_data, DEFAULT_SORT_BUDGET);
        let sorted = common::check_report(&spilled, read_data, 0);
        prop_assert_eq!(in_memory, sorted);
    }
}
