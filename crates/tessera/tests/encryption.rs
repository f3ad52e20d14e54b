//! Encrypted repositories (docs/FORMAT.md §23): passwords and key files,
//! authentication of every object kind, and no plaintext or unkeyed
//! fingerprint anywhere on disk.

mod common;

use common::{backup_bytes, full_check, Rng};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tessera::backend::LockMode;
use tessera::backup::BackupOptions;
use tessera::crypto::{Credentials, KdfParams, NewKey};
use tessera::repo::config::{Config, Encryption, IndexKind, Layout};
use tessera::restore::{restore, RestoreOptions};
use tessera::rewrite::RewriteKind;
use tessera::FingerprintAlgo;
use tessera::{Error, Repository};
use zeroize::Zeroizing;

const PASSWORD: &str = "open sesame";

/// Cheap key derivation, so that tests stay fast.
const CHEAP: KdfParams = KdfParams {
    memory_kib: 64,
    iterations: 1,
    parallelism: 1,
};

fn new_key(password: &str) -> NewKey {
    NewKey {
        password: Zeroizing::new(password.to_string()),
        kdf: CHEAP,
        insecure_kdf: true,
    }
}

fn open(path: &Path, mode: LockMode, password: &str) -> tessera::Result<Repository> {
    let password = password.to_string();
    Repository::open_unlocking(path, mode, Duration::ZERO, &|| {
        Ok(Credentials::new(Zeroizing::new(password.clone()), None))
    })
}

fn small_config(id: &str) -> Config {
    let mut c = Config::new(id.into());
    c.container_size = 256 * 1024;
    c.lifecycle_part_bytes = 128 * 1024;
    c
}

/// Creates an encrypted repository with `config` and backs up three
/// related versions of some data (two sources); returns the versions.
fn populated(path: &Path, config: Config) -> Vec<Vec<u8>> {
    // A configuration that names no cipher gets the default, AES-256-GCM.
    let cipher = match config.encryption {
        Encryption::None => Encryption::Aes256Gcm,
        chosen => chosen,
    };
    let repo = Repository::init_encrypted(path, config, &new_key(PASSWORD)).unwrap();
    assert!(repo.is_encrypted());
    // Encrypted, not compressed: version 2, or 6 where backups share the
    // repository (FORMAT.md §13.3, §19).
    let shared = match repo.config().shared_writers() {
        true => tessera::repo::config::SHARED_WRITERS,
        false => 0,
    };
    assert_eq!(
        repo.config().version,
        tessera::repo::config::ENCRYPTED_FORMAT_VERSION + shared
    );
    assert_eq!(repo.config().encryption, cipher);
    drop(repo);
    let mut rng = Rng(42);
    let first = [b"TESSERA-PLAINTEXT-MARKER ".repeat(40), rng.bytes(600_000)].concat();
    let second = common::edit(&first, 20, 2000, 7);
    let third = common::edit(&second, 20, 2000, 8);
    let versions = vec![first, second, third];
    let repo = open(path, LockMode::Backup, PASSWORD).unwrap();
    for (i, v) in versions.iter().enumerate() {
        let options = BackupOptions {
            source: if i == 1 { "other" } else { "default" }.into(),
            ..BackupOptions::default()
        };
        backup_bytes(&repo, &v[..], "input", &options)
            .map(|o| o.snapshot)
            .unwrap();
    }
    versions
}

/// Every object file of the repository: (key, path), without `config`
/// and the key files (which are not encrypted).
fn objects(root: &Path) -> Vec<(String, PathBuf)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if !e.file_name().to_string_lossy().starts_with('.') {
                let key = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                // Lock files (`locks/`) hold no data: empty, or a holder's
                // plain description (FORMAT.md §13).
                if key != "config" && !key.starts_with("keys/") && !key.starts_with("locks/") {
                    out.push((key, path));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// Policies whose objects together cover every object kind, and the
/// second cipher.
fn configs() -> Vec<(&'static str, Config)> {
    let mut ddfs_har = small_config("ddfs-har");
    ddfs_har.index = IndexKind::Ddfs;
    ddfs_har.rewrite.kind = RewriteKind::Har;
    let mut lazy = small_config("lazy");
    lazy.index = IndexKind::Lazy;
    let mut greedy = small_config("greedy-sha256");
    greedy.delta.kind = tessera::delta::DeltaKind::Greedy;
    greedy.fingerprint = FingerprintAlgo::Sha256;
    let mut lifecycle = small_config("lifecycle");
    lifecycle.layout = Layout::Lifecycle;
    let mut xchacha = small_config("exact-xchacha");
    xchacha.encryption = Encryption::XChaCha20Poly1305;
    vec![
        ("exact", small_config("exact")),
        ("exact-xchacha", xchacha),
        ("ddfs-har", ddfs_har),
        ("lazy", lazy),
        ("greedy-sha256", greedy),
        ("lifecycle", lifecycle),
    ]
}

#[test]
fn round_trip_and_no_plaintext_or_unkeyed_fingerprint_on_disk() {
    for (name, config) in configs() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("repo");
        let versions = populated(&path, config);
        let repo = open(&path, LockMode::Read, PASSWORD).unwrap();
        assert!(full_check(&repo).is_ok(), "{name}");
        let algo = repo.config().fingerprint;
        let mut needles: Vec<Vec<u8>> = Vec::new();
        for (i, v) in versions.iter().enumerate() {
            let id = i as u64 + 1;
            let mut out = Vec::new();
            restore(&repo, id, &mut out, &RestoreOptions::default()).unwrap();
            assert!(out == *v, "{name}: backup {id} restores");
            // The unkeyed fingerprints of the backup's chunks, by the recipe's lengths.
            let mut at = 0usize;
            if repo.config().layout == Layout::Container {
                for c in repo.recipe(id).unwrap().chunks {
                    let chunk = &v[at..at + c.len as usize];
                    at += c.len as usize;
                    let plain = algo.hash(chunk);
                    assert_ne!(plain, c.fp, "{name}: fingerprints are keyed");
                    assert_eq!(repo.fingerprinter().hash(chunk), c.fp);
                    needles.push(plain.0[..16].to_vec());
                }
            } else {
                needles.push(algo.hash(&v[..1000]).0[..16].to_vec());
            }
            for off in [0, 1000, 100_000, v.len() / 2, v.len() - 40] {
                needles.push(v[off..off + 24].to_vec());
            }
        }
        needles.push(b"TESSERA-PLAINTEXT".to_vec());
        needles.push(b"default".to_vec());
        needles.push(b"fastcdc".to_vec());
        let mut files = objects(&path);
        files.push(("config".into(), path.join("config")));
        for (key, file) in files {
            let bytes = std::fs::read(&file).unwrap();
            for n in &needles {
                assert!(
                    !bytes.windows(n.len()).any(|w| w == &n[..]),
                    "{name}: {key} holds plaintext or an unkeyed fingerprint"
                );
            }
        }
    }
}

#[test]
fn a_flipped_byte_in_any_object_fails_authentication_naming_it() {
    for (name, config) in configs() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("repo");
        populated(&path, config);
        let all = objects(&path);
        assert!(all.len() >= 8, "{name}: {all:?}");
        for (key, file) in all {
            let original = std::fs::read(&file).unwrap();
            for at in [0, 20, original.len() / 2, original.len() - 1] {
                let mut bad = original.clone();
                bad[at] ^= 0x04;
                std::fs::write(&file, &bad).unwrap();
                let repo = open(&path, LockMode::Read, PASSWORD).unwrap();
                match repo.backend().read(&key) {
                    Err(Error::Authentication { object }) => assert_eq!(object, key),
                    Err(Error::Corrupt { object, .. }) if at < 4 => assert_eq!(object, key),
                    other => panic!("{name}: {key} flipped at {at}: {other:?}"),
                }
                let primary = [
                    "containers/",
                    "recipes/",
                    "snapshots/",
                    "lifecycle/c",
                    "lifecycle/v",
                ];
                if at == original.len() / 2 && primary.iter().any(|p| key.starts_with(p)) {
                    let report = full_check(&repo);
                    assert!(
                        report.problems.iter().any(|p| (p.object == key
                            || p.detail.starts_with(&format!("{key}:")))
                            && p.detail.contains("authentication failed")),
                        "{name}: check reports {key}: {:?}",
                        report.problems
                    );
                }
            }
            std::fs::write(&file, &original).unwrap();
        }
        // Objects moved to another name fail too.
        let snaps = path.join("snapshots");
        std::fs::copy(
            snaps.join("0000000000000001"),
            snaps.join("0000000000000002"),
        )
        .unwrap();
        let repo = open(&path, LockMode::Read, PASSWORD).unwrap();
        assert!(matches!(
            repo.backend().read("snapshots/0000000000000002"),
            Err(Error::Authentication { .. })
        ));
    }
}

#[test]
fn passwords_and_key_files() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    Repository::init_encrypted(&path, small_config("keys"), &new_key(PASSWORD)).unwrap();

    // A wrong password fails cleanly and fast; no password at all too.
    let started = Instant::now();
    let wrong = open(&path, LockMode::Read, "not it");
    assert!(
        matches!(wrong, Err(Error::WrongPassword(_))),
        "{:?}",
        wrong.err()
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(matches!(
        Repository::open(&path, LockMode::Read),
        Err(Error::PasswordRequired(_))
    ));

    // Add a second key; both open; list shows both, the current one marked.
    let repo = open(&path, LockMode::Backup, PASSWORD).unwrap();
    let first = tessera::commands::key::current_key(&repo)
        .unwrap()
        .to_string();
    let second = tessera::commands::key::add_key(&repo, &new_key("second")).unwrap();
    assert_eq!(tessera::commands::key::list_keys(&repo).unwrap().len(), 2);
    drop(repo);
    let repo = open(&path, LockMode::Backup, "second").unwrap();
    assert_eq!(
        tessera::commands::key::current_key(&repo),
        Some(second.as_str())
    );

    // Change the second key's password: the old one no longer opens.
    let third = tessera::commands::key::change_password(&repo, &new_key("third")).unwrap();
    drop(repo);
    assert!(matches!(
        open(&path, LockMode::Read, "second"),
        Err(Error::WrongPassword(_))
    ));
    let repo = open(&path, LockMode::Backup, "third").unwrap();
    assert_eq!(
        tessera::commands::key::current_key(&repo),
        Some(third.as_str())
    );

    // Remove the first key; the last one cannot be removed.
    tessera::commands::key::remove_key(&repo, &first).unwrap();
    assert!(matches!(
        tessera::commands::key::remove_key(&repo, &third),
        Err(Error::LastKey(_))
    ));
    assert!(matches!(
        tessera::commands::key::remove_key(&repo, "0000000000000000"),
        Err(Error::NotFound(_))
    ));
    drop(repo);
    assert!(matches!(
        open(&path, LockMode::Read, PASSWORD),
        Err(Error::WrongPassword(_))
    ));
    // A key hint restricts the search to one key file.
    let only = |id: &str| {
        let id = id.to_string();
        Repository::open_unlocking(&path, LockMode::Read, Duration::ZERO, &move || {
            Ok(Credentials::new(
                Zeroizing::new("third".into()),
                Some(id.clone()),
            ))
        })
    };
    assert!(only(&third).is_ok());
    assert!(only(&first).is_err());
}

#[test]
fn combinations_that_cannot_be_encrypted_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut sha1 = small_config("sha1");
    sha1.fingerprint = FingerprintAlgo::Sha1;
    let mut trace = small_config("trace");
    trace.trace = true;
    for (i, c) in [sha1, trace].into_iter().enumerate() {
        let path = tmp.path().join(i.to_string());
        let err = Repository::init_encrypted(&path, c.clone(), &new_key(PASSWORD)).err();
        assert!(matches!(err, Some(Error::InvalidConfig(_))), "{err:?}");
        assert!(!path.exists(), "nothing is created");
        assert!(!Repository::init(&path, c).unwrap().is_encrypted());
    }
}
