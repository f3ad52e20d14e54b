//! Crash safety through the command line: `tessera backup` killed with
//! SIGKILL at random moments, from the start of the run through its commit
//! phase. After every kill the repository checks clean, every backup
//! committed before restores byte-identically, and new backups still work.

mod common;

use common::*;
use rand::Rng;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Size of each killed backup's input: fresh random data every time, so
/// every run writes containers, not only its commit objects.
const BIG: u64 = 200 << 20;
const SMALL: u64 = 8 << 20;
const MIN_KILLS: usize = 20;
const MAX_ATTEMPTS: usize = 40;

struct Committed {
    id: u64,
    seed: u64,
    len: u64,
}

fn verify_all(repo: &std::path::Path, committed: &[Committed]) {
    let ids: Vec<u64> = committed.iter().map(|c| c.id).collect();
    assert_eq!(
        list_ids(repo),
        ids,
        "exactly the committed backups are listed"
    );
    for c in committed {
        assert_restore_stdout_matches(repo, &c.id.to_string(), &mut PrngReader::new(c.seed, c.len));
    }
}

#[test]
fn backup_killed_at_random_moments_leaves_repository_consistent() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init(&repo);
    let mut committed = Vec::new();

    let small = tmp.path().join("small");
    for seed in [1, 2] {
        write_random_file(&small, seed, SMALL);
        let r = backup_json(&repo, &small);
        committed.push(Committed {
            id: num(&r, "id"),
            seed,
            len: SMALL,
        });
    }

    // An uninterrupted run of the same size measures how long a run takes
    // and how many containers it writes.
    // The inputs live in memory when possible (tmpfs), so that writing a
    // fresh input for every attempt does not compete with the backups' fsyncs.
    let input_dir = tempfile::Builder::new()
        .prefix("tessera-crash-input")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let big = input_dir.path().join("big");
    write_random_file(&big, 1000, BIG);
    let started = Instant::now();
    let r = backup_json(&repo, &big);
    let mut estimate = started.elapsed();
    let full_containers = num(&r, "containers_written") as usize;
    committed.push(Committed {
        id: num(&r, "id"),
        seed: 1000,
        len: BIG,
    });
    eprintln!("uninterrupted backup of {BIG} bytes: {estimate:?}, {full_containers} containers");

    let mut rng = rng(0xc0ffee);
    let (mut kills, mut completed, mut mid_run) = (0, 0, 0);
    let (mut commit_phase, mut between_recipe_and_snapshot) = (0, 0);
    let mut last_seed = 0;
    for attempt in 0..MAX_ATTEMPTS {
        if kills >= MIN_KILLS {
            break;
        }
        let seed = 2000 + attempt as u64;
        last_seed = seed;
        write_random_file(&big, seed, BIG);
        let containers_before = containers(&repo);
        let recipes_before = dir_names_or_empty(&repo.join("recipes"));
        // Even attempts: a random moment anywhere in the run (the estimate
        // follows the runs, which get slower as the repository grows). Odd
        // attempts aim at the commit phase: a random moment shortly after the
        // last container, or right after the recipe, appeared on disk.
        let stderr_path = tmp.path().join("backup.stderr");
        let stderr_file = std::fs::File::create(&stderr_path).unwrap();
        let spawned = Instant::now();
        let mut child = cmd(["backup".as_ref(), repo.as_os_str(), "-".as_ref()])
            .stdin(std::fs::File::open(&big).unwrap())
            .stdout(Stdio::null())
            .stderr(stderr_file)
            .spawn()
            .unwrap();
        let mut finished_after = None;
        let mut poll = |until: &mut dyn FnMut() -> bool, limit: Duration| {
            while spawned.elapsed() < limit {
                if finished_after.is_none() && child.try_wait().unwrap().is_some() {
                    finished_after = Some(spawned.elapsed());
                }
                if finished_after.is_some() || until() {
                    return;
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        };
        let aim = match attempt % 4 {
            1 => "after the last container",
            3 => "after the recipe",
            _ => "anywhere",
        };
        if aim == "anywhere" {
            poll(&mut || false, estimate.mul_f64(rng.random_range(0.0..1.0)));
        } else {
            let recipes_dir = repo.join("recipes");
            let limit = estimate * 4;
            if attempt % 4 == 1 {
                poll(
                    &mut || {
                        containers(&repo).difference(&containers_before).count() >= full_containers
                    },
                    limit,
                );
                let now = spawned.elapsed();
                // The last container marks (nearly) the end of the run.
                estimate = (estimate + now) / 2;
                let extra = Duration::from_micros(rng.random_range(0..30_000));
                poll(&mut || false, now + extra);
            } else {
                poll(
                    &mut || dir_names_or_empty(&recipes_dir).len() > recipes_before.len(),
                    limit,
                );
                let extra = Duration::from_micros(rng.random_range(0..2_000));
                let now = spawned.elapsed();
                poll(&mut || false, now + extra);
            }
        }
        let delay = spawned.elapsed();
        // SIGKILL on Unix; harmless if the process already finished.
        let _ = child.kill();
        let status = child.wait().unwrap();
        let killed = match status.signal() {
            Some(9) => true,
            Some(sig) => panic!("backup died of signal {sig}"),
            None => {
                assert!(
                    status.success(),
                    "backup failed on its own: {status}: {}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
                false
            }
        };

        let new_ids: Vec<u64> = list_ids(&repo)
            .into_iter()
            .filter(|id| !committed.iter().any(|c| c.id == *id))
            .collect();
        assert!(new_ids.len() <= 1, "one run committed {new_ids:?}");
        if !killed {
            assert_eq!(new_ids.len(), 1, "a run that exited 0 committed its backup");
        }
        let new_containers = containers(&repo).difference(&containers_before).count();
        let new_recipes = dir_names_or_empty(&repo.join("recipes"))
            .difference(&recipes_before)
            .count();
        if killed {
            kills += 1;
            if new_ids.is_empty() && new_containers > 0 && new_containers < full_containers {
                mid_run += 1;
            }
            if new_ids.is_empty() && new_containers >= full_containers {
                if new_recipes > 0 {
                    between_recipe_and_snapshot += 1;
                }
                // Every container was written: killed while committing
                // (index, recipe or snapshot).
                commit_phase += 1;
            }
        } else {
            completed += 1;
            if let Some(d) = finished_after {
                estimate = (estimate + d) / 2;
            }
        }
        eprintln!(
            "attempt {attempt} (aim {aim}): {} after {:?}; {new_containers} new containers, {new_recipes} new recipes, committed {new_ids:?}",
            if killed { "killed" } else { "finished" },
            finished_after.unwrap_or(delay)
        );
        for id in new_ids {
            committed.push(Committed { id, seed, len: BIG });
        }

        let report = ok(["check".as_ref(), repo.as_os_str()]);
        assert!(report.contains("no problems"), "{report}");
        verify_all(&repo, &committed);
    }
    eprintln!(
        "{kills} kills ({mid_run} while writing containers, {commit_phase} after all containers were written, \
         {between_recipe_and_snapshot} of them after the recipe), {completed} runs finished"
    );
    assert!(kills >= MIN_KILLS, "only {kills} runs were killed");
    assert!(
        mid_run > 0,
        "no kill landed while containers were being written"
    );
    assert!(commit_phase > 0, "no kill landed in the commit phase");

    // New backups still work: a fresh input, then one deduplicating against
    // the data the killed runs left behind.
    write_random_file(&small, 3, SMALL);
    let r = backup_json(&repo, &small);
    committed.push(Committed {
        id: num(&r, "id"),
        seed: 3,
        len: SMALL,
    });
    let r = backup_json(&repo, &big);
    committed.push(Committed {
        id: num(&r, "id"),
        seed: last_seed,
        len: BIG,
    });
    verify_all(&repo, &committed);
    let report = ok(["check".as_ref(), repo.as_os_str(), "--read-data".as_ref()]);
    assert!(report.contains("no problems"), "{report}");

    // GC removes the temporary files the killed writes left behind (and
    // nothing a backup needs).
    let stray = repo.join("containers").join(".tmp.0000000000abcdef.1.0");
    std::fs::write(&stray, b"partial").unwrap();
    let gc: serde_json::Value =
        serde_json::from_str(ok(["gc".as_ref(), "--json".as_ref(), repo.as_os_str()]).trim())
            .unwrap();
    assert!(num(&gc, "temporaries_removed") >= 1, "{gc}");
    assert!(!stray.exists());
    assert_eq!(temporaries(&repo), 0, "temporary files left after gc");
    verify_all(&repo, &committed);
}

/// Temporary files anywhere in the repository.
fn temporaries(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            if e.file_type().unwrap().is_dir() {
                temporaries(&e.path())
            } else {
                usize::from(e.file_name().to_string_lossy().starts_with(".tmp."))
            }
        })
        .sum()
}

fn dir_names_or_empty(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    if dir.exists() {
        dir_names(dir)
            .into_iter()
            .filter(|n| !n.starts_with('.'))
            .collect()
    } else {
        Default::default()
    }
}
