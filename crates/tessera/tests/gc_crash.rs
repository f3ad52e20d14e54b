//! GC interrupted at every step: a backend that stops accepting writes and
//! deletions after N of them (as a crash would) makes `gc` fail part way; the
//! repository must still check clean with every live backup restoring
//! byte-identically, and a later `gc` must finish the job.

mod common;

use common::{backup_bytes, copy_dir, full_check, small_chunker, Rng};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use tessera::backend::testing::{Gate, Gated, Mutation};
use tessera::backend::LockMode;
use tessera::backup::BackupOptions;
use tessera::commands::check::{check, CheckOptions};
use tessera::delta::DeltaKind;
use tessera::gc::{forget_keep_last, gc, Defrag, GcOptions};
use tessera::repo::config::Config;
use tessera::restore::{restore, RestoreOptions};
use tessera::{Error, Repository, Result};

/// After `allowed` mutating requests every further one fails.
struct Crashing {
    allowed: AtomicU64,
}

impl Gate for Crashing {
    fn check(&self, request: Mutation) -> Result<()> {
        let ok = self
            .allowed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if ok {
            Ok(())
        } else {
            Err(Error::io(
                format!("writing {}", request.key()),
                std::io::Error::other("crashed (simulated)"),
            ))
        }
    }
}

fn verify(path: &Path, live: &[(u64, Vec<u8>)]) {
    let repo = Repository::open(path, LockMode::Exclusive).unwrap();
    let report = full_check(&repo);
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(
        repo.backups().unwrap(),
        live.iter().map(|l| l.0).collect::<Vec<_>>()
    );
    for (id, data) in live {
        let mut out = Vec::new();
        restore(&repo, *id, &mut out, &RestoreOptions::default()).unwrap();
        assert!(out == *data, "backup {id} restored wrong bytes");
    }
}

#[test]
fn gc_interrupted_at_every_write_loses_nothing() {
    interrupted_gc_loses_nothing(DeltaKind::None);
}

/// With deltas, GC also keeps bases in place and compacts their containers.
#[test]
fn gc_of_deltas_interrupted_at_every_write_loses_nothing() {
    interrupted_gc_loses_nothing(DeltaKind::Greedy);
}

fn interrupted_gc_loses_nothing(delta: DeltaKind) {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    let mut config = Config::new("gc-crash".into());
    config.delta.kind = delta;
    config.chunker = small_chunker();
    config.container_size = 16 * 1024;
    let repo = Repository::init(&base, config).unwrap();
    let mut data = Rng(1).bytes(150_000);
    let mut versions = Vec::new();
    let mut deltas = 0;
    for v in 0..5u64 {
        let at = (v as usize * 29_000) % data.len();
        data[at..at + 3000].copy_from_slice(&Rng(v + 10).bytes(3000));
        // A few bytes changed in place: chunks similar to stored ones.
        for k in 0..20 {
            let i = (v as usize * 7919 + k * 7001) % data.len();
            data[i] ^= 0x5a;
        }
        let snap = backup_bytes(&repo, &data[..], "mem", &BackupOptions::default())
            .map(|o| o.snapshot)
            .unwrap();
        deltas += snap.stats.delta.delta_chunks;
        versions.push((snap.id, data.clone()));
    }
    assert_eq!(deltas > 0, delta != DeltaKind::None, "{deltas} deltas");
    forget_keep_last(&repo, 2, false).unwrap();
    drop(repo);
    let live: Vec<(u64, Vec<u8>)> = versions[3..].to_vec();

    for defrag in [Defrag::None, Defrag::Gccdf] {
        let options = GcOptions {
            defrag,
            segment: 4,
            ..GcOptions::default()
        };
        let mut n = 0u64;
        loop {
            let work = dir.path().join(format!("{}-{n}", defrag.name()));
            copy_dir(&base, &work);
            let crashing = Gated::local(
                &work,
                Crashing {
                    allowed: AtomicU64::new(n),
                },
            );
            let repo =
                Repository::open_with_backend(Box::new(crashing), LockMode::Exclusive).unwrap();
            let finished = gc(&repo, options).is_ok();
            drop(repo);
            verify(&work, &live);
            // A complete GC afterwards reclaims everything and keeps every live backup.
            let repo = Repository::open(&work, LockMode::Exclusive).unwrap();
            gc(&repo, options).unwrap();
            let report = check(&repo, CheckOptions::default()).unwrap();
            assert_eq!(report.unreferenced_containers, 0);
            drop(repo);
            verify(&work, &live);
            std::fs::remove_dir_all(&work).unwrap();
            if finished {
                assert!(n > 3, "GC made only {n} writes");
                break;
            }
            n += 1;
        }
    }
}
