//! Backing up directory trees: a walk of the given paths feeds their files'
//! bytes, then the catalog, to the backup pipeline as one segmented stream.
mod feed;
mod parent;
mod stdin;

use feed::{read_small_files, Job, State, TreeFeed};
use parent::{ParentBatch, ParentChunks, ParentWalk, Usable};
use stdin::stdin_file;

use super::{run, run_with, BackupOptions, Outcome, Source, TreeBackupOptions};
use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, ChunkRef, TreeRef, CATALOG_VERSION};
use crate::repo::Repository;
use crate::tree::catalog::CatalogWriter;
use crate::tree::meta::Names;
use crate::tree::relative_path;
#[cfg(test)]
use crate::tree::stream::for_each_entry;
use crate::tree::stream::{for_each_record, tree_of};
use crate::tree::walk::{examine_batches, Excludes, StepBatch, Steps, Walk};
use crossbeam_channel::bounded;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Chunks of unchanged files announced at once at most (the files queued
/// one after another go together, not one by one).
const REUSED_AT_ONCE: usize = 1024;
/// Threads reading small files whole, ahead of the stream and in parallel.
const READERS: usize = 3;
/// Files of at most this many bytes are read by the reader threads; larger
/// ones (and files with several links) stream through the backup's own thread.
const SMALL_FILE: u64 = 1 << 20;
/// Objects walked ahead of the stream at most...
const AHEAD_OBJECTS: usize = 512;
/// ...and bytes of small files being read ahead at most.
const AHEAD_BYTES: u64 = 32 << 20;
/// Entries of the parent's catalog sent at once by the thread reading it...
const PARENT_BATCH: usize = 256;
/// ...and batches of them kept ready at most.
const PARENT_AHEAD_BATCHES: usize = 4;
/// Batches of walked objects the walk thread keeps ready or being examined
/// at most (with the pending objects, each may hold its directory open).
const WALK_AHEAD_BATCHES: usize = 8;
/// Threads examining (`statx`) the files the walk finds.
const STAT_THREADS: usize = 2;

/// This machine's host name (`localhost` when it cannot be read).
pub fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// The default source lineage of a backup of `paths` on `host`: the host
/// name and the absolute paths, e.g. `host:/home/ann,/etc`.
pub fn default_source(host: &str, paths: &[PathBuf]) -> Result<String> {
    let roots = roots(paths)?;
    let list: Vec<String> = roots.iter().map(|p| p.display().to_string()).collect();
    Ok(format!("{host}:{}", list.join(",")))
}

/// Backs up the directory trees (or files, or symbolic links) at `paths`
/// into `repo` (opened for a backup) as one tree backup.
///
/// Objects that cannot be read are left out with a warning each; a path
/// that does not exist fails the backup before anything is written.
/// Small files are read by a few threads ahead of the stream; the stream
/// and its catalog keep the walk's order.
pub(crate) fn backup_tree(
    repo: &Repository,
    paths: &[PathBuf],
    tree_options: &TreeBackupOptions,
    options: &BackupOptions,
) -> Result<Outcome> {
    backup_tree_with(repo, paths, tree_options, options, READERS)
}

/// [`backup_tree`] with `readers` threads reading small files (none: every
/// file is read by the stream's thread).
fn backup_tree_with(
    repo: &Repository,
    paths: &[PathBuf],
    tree_options: &TreeBackupOptions,
    options: &BackupOptions,
    readers: usize,
) -> Result<Outcome> {
    let stdin = tree_options
        .stdin_name
        .as_deref()
        .map(stdin_file)
        .transpose()?;
    let roots = match &stdin {
        Some((_, entry)) => vec![Path::new("/").join(relative_path(&entry.path))],
        None => roots(paths)?,
    };
    let excludes = Excludes::new(
        &tree_options.excludes,
        &tree_options.iexcludes,
        &tree_options.exclude_if_present,
        tree_options.exclude_caches,
    )?;
    if let Some(root) = roots
        .iter()
        .find(|r| stdin.is_none() && excludes.excluded(r, r.is_dir()))
    {
        return Err(Error::InvalidConfig(format!(
            "{} is excluded by the exclude options: nothing of it would be backed up",
            root.display()
        )));
    }
    let parent = match (tree_options.force, tree_options.parent) {
        (true, _) => None,
        (false, Some(id)) => Some(id),
        (false, None) => latest_tree(repo, &options.source)?,
    };
    let mut notes = link_notes(&roots, stdin.is_none() && !tree_options.follow_symlinks);
    let parent = match parent {
        // A parent whose snapshot or recipe is damaged is no parent: every
        // file is read.
        Some(id) => match tree_of(repo, id).and_then(|t| Ok((t, repo.recipe(id)?.chunks))) {
            Ok((tree, chunks)) => Some((id, tree, chunks)),
            Err(e) if e.lost_reason().is_some() => {
                notes.push(format!(
                    "parent backup {id} unreadable ({e}): every file was read"
                ));
                None
            }
            Err(e) => return Err(e),
        },
        None => None,
    };
    let parent = parent.map(|(id, tree, chunks)| (id, tree, std::sync::Arc::new(chunks)));
    let refetch = parent.as_ref().map(|(id, _, chunks)| ParentChunks {
        repo,
        parent: *id,
        chunks: chunks.clone(),
        files: Mutex::new(VecDeque::new()),
        ahead: Mutex::new((0, Vec::new())),
    });
    let (roots_walked, state, files_new) = match stdin {
        Some((file, entry)) => (
            Vec::new(),
            State::Reading {
                file,
                path: roots[0].clone(),
                entry: Box::new(entry),
                nlink: 1,
                expected: 0,
            },
            1,
        ),
        None => (roots.clone(), State::Walking, 0),
    };
    let walk = Walk::new(
        excludes,
        tree_options.follow_symlinks,
        tree_options.one_file_system,
    );
    let (steps_tx, steps) = bounded::<StepBatch>(WALK_AHEAD_BATCHES);
    let (examine, to_examine) = bounded(WALK_AHEAD_BATCHES);
    let mut feed = TreeFeed {
        steps: Steps::new(steps),
        follow: tree_options.follow_symlinks,
        larger_than: tree_options.exclude_larger_than,
        names: Names::default(),
        links: HashMap::new(),
        recorded: HashSet::new(),
        state,
        // Regions and index pages of at most one chunk.
        catalog: CatalogWriter::new(repo.config().chunker.build()?.max_size()),
        offset: 0,
        files: 0,
        warnings: Vec::new(),
        notes,
        tree: TreeRef {
            catalog_version: CATALOG_VERSION,
            paths: roots.iter().map(|p| p.display().to_string()).collect(),
            parent: parent.as_ref().map(|p| p.0),
            files_new,
            ..TreeRef::default()
        },
        parent: None,
        reused: Vec::new(),
        pending: VecDeque::new(),
        ahead_bytes: 0,
        walked: false,
        jobs: None,
        refetch: None,
    };
    std::thread::scope(|s| {
        s.spawn(move || walk.send_all(roots_walked, steps_tx, examine));
        for _ in 0..STAT_THREADS {
            let queue = to_examine.clone();
            let follow = tree_options.follow_symlinks;
            s.spawn(move || examine_batches(queue, follow));
        }
        drop(to_examine);
        let (jobs, queue) = bounded::<Job>(AHEAD_OBJECTS);
        for _ in 0..readers {
            let queue = queue.clone();
            s.spawn(move || read_small_files(queue));
        }
        feed.jobs = (readers > 0).then_some(jobs);
        let outcome = run_feed(repo, &mut feed, parent, refetch.as_ref(), options);
        // The readers end when their queue closes, the walk thread when
        // its receiver is gone.
        feed.jobs = None;
        feed.steps.stop();
        outcome.map(|o| feed.outcome(o))
    })
}

/// Runs the backup of `feed`, reusing the unchanged files of `parent`.
fn run_feed<'a>(
    repo: &'a Repository,
    feed: &mut TreeFeed<'a>,
    parent: Option<(BackupId, TreeRef, std::sync::Arc<Vec<ChunkRef>>)>,
    refetch: Option<&'a ParentChunks<'a>>,
    options: &BackupOptions,
) -> Result<Outcome> {
    let (Some((id, tree, chunks)), Some(refetch)) = (parent, refetch) else {
        return run(repo, Source::Segments(feed), options);
    };
    // The parent's catalog is read alongside the walk (both are in the same
    // order), on a thread of its own, entry by entry.
    std::thread::scope(|s| {
        let (tx, rx) = bounded::<ParentBatch>(PARENT_AHEAD_BATCHES);
        let recipe = chunks.clone();
        let reader = s.spawn(move || {
            let mut batch = ParentBatch::default();
            let read = for_each_record(repo, id, &tree, &recipe, |e, record| {
                batch.push(e, record);
                Ok(batch.entries.len() < PARENT_BATCH
                    || tx.send(std::mem::take(&mut batch)).is_ok())
            });
            if !batch.entries.is_empty() {
                let _ = tx.send(batch);
            }
            read
        });
        feed.parent = Some(ParentWalk {
            usable: Usable::of(repo, &options.source)?,
            rx,
            batch: Vec::new().into_iter(),
            records: Arc::default(),
            next: None,
            offset: 0,
            chunks,
            chunk: 0,
            chunk_offset: 0,
        });
        feed.refetch = Some(refetch);
        let outcome = run_with(repo, Source::Segments(feed), options, Some(refetch));
        // Stops the reader if the walk ended first.
        feed.parent = None;
        feed.refetch = None;
        let read = reader
            .join()
            .map_err(|_| Error::Pipeline("parent catalog reader panicked".into()))?;
        let outcome = outcome?;
        if let Err(e) = read {
            // Files after the damage were read again: the backup is whole.
            feed.notes.push(format!(
                "catalog of parent backup {id} unreadable ({e}): unchanged files after it were read"
            ));
        }
        Ok(outcome)
    })
}

/// A note for each of `roots` that is a symbolic link, when `links` are
/// backed up as links: given by name, it might be meant for what it points to.
fn link_notes(roots: &[PathBuf], links: bool) -> Vec<String> {
    roots
        .iter()
        .filter(|r| links && fs::symlink_metadata(r).is_ok_and(|m| m.file_type().is_symlink()))
        .map(|r| {
            format!(
                "{}: a symbolic link: backed up as the link (--follow-symlinks backs up what it points to)",
                r.display()
            )
        })
        .collect()
}

/// The latest tree backup of `source`, if any.
fn latest_tree(repo: &Repository, source: &str) -> Result<Option<BackupId>> {
    let mut latest = None;
    for id in repo.backups()?.into_iter().rev() {
        let snap = match repo.snapshot(id) {
            Ok(s) => s,
            // A damaged snapshot is not a parent.
            Err(e) if e.is_damage() => continue,
            Err(e) => return Err(e),
        };
        if snap.source == source && snap.tree.is_some() {
            latest = Some(id);
            break;
        }
    }
    Ok(latest)
}

/// The given paths made absolute (their parent directories resolved, the
/// paths themselves not followed), sorted, without those inside another.
pub(crate) fn roots(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut roots = Vec::with_capacity(paths.len());
    for path in paths {
        let input_err = |e| Error::Input {
            what: path.display().to_string(),
            source: e,
        };
        fs::symlink_metadata(path).map_err(input_err)?;
        let root = match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => {
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                fs::canonicalize(parent).map_err(input_err)?.join(name)
            }
            _ => fs::canonicalize(path).map_err(input_err)?,
        };
        roots.push(root);
    }
    roots.sort();
    let mut kept: Vec<PathBuf> = Vec::with_capacity(roots.len());
    for root in roots {
        if !kept.iter().any(|k| root.starts_with(k)) {
            kept.push(root);
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::repo::config::Config;
    use crate::tree::catalog::Kind;
    use crate::tree::catalog_path;
    use std::os::unix::fs::MetadataExt;

    /// Data chunks and catalog entries (without access times, which reading
    /// may change) of tree backup `id`.
    type Listing = (Vec<(Fingerprint, u32)>, Vec<(Vec<u8>, Kind, u64, Vec<u8>)>);

    fn listing(repo: &Repository, id: BackupId) -> Listing {
        let tree = tree_of(repo, id).unwrap();
        let chunks = repo.recipe(id).unwrap().chunks;
        let mut entries = Vec::new();
        for_each_entry(repo, id, &tree, &chunks, |e| {
            entries.push((e.path, e.kind, e.size, e.target));
            Ok(true)
        })
        .unwrap();
        let data = chunks[..tree.catalog_chunk as usize]
            .iter()
            .map(|c| (c.fp, c.len))
            .collect();
        (data, entries)
    }

    #[test]
    fn a_metadata_change_of_an_unchanged_file_lands_in_the_next_catalog() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("d")).unwrap();
        for f in 0..50usize {
            fs::write(src.join(format!("d/f{f:02}")), vec![f as u8; f * 97]).unwrap();
        }
        let repo = Repository::init(&dir.path().join("r"), Config::new("test".into())).unwrap();
        let opts = BackupOptions {
            source: "host:/x".into(),
            ..BackupOptions::default()
        };
        let paths = std::slice::from_ref(&src);
        let tree_opts = TreeBackupOptions::default();
        backup_tree(&repo, paths, &tree_opts, &opts).unwrap();
        // Same bytes, new mode; same bytes and mode, a new attribute (where
        // the file system takes user attributes).
        let (moded, tagged) = (src.join("d/f07"), src.join("d/f31"));
        fs::set_permissions(&moded, fs::Permissions::from_mode(0o600)).unwrap();
        let tagged_ok = xattr::set(&tagged, "user.tessera-test", b"v1").is_ok();
        let t = backup_tree(&repo, paths, &tree_opts, &opts).unwrap();
        let tree = t.snapshot.tree.clone().unwrap();
        let changed = 1 + u64::from(tagged_ok);
        assert_eq!(
            (tree.files_changed, tree.files_unmodified),
            (changed, 50 - changed)
        );
        let id = t.snapshot.id;
        let chunks = repo.recipe(id).unwrap().chunks;
        let mut found = HashMap::new();
        for_each_entry(&repo, id, &tree_of(&repo, id).unwrap(), &chunks, |e| {
            found.insert(e.path.clone(), e);
            Ok(true)
        })
        .unwrap();
        assert_eq!(found[&catalog_path(&moded)].mode, 0o600);
        if tagged_ok {
            let xattrs = &found[&catalog_path(&tagged)].xattrs;
            assert!(xattrs
                .iter()
                .any(|x| x.name == b"user.tessera-test" && x.value == b"v1"));
        }
        // The stream and catalog equal a forced re-read's.
        let forced = TreeBackupOptions {
            force: true,
            ..TreeBackupOptions::default()
        };
        let f = backup_tree(&repo, paths, &forced, &opts).unwrap();
        assert_eq!(listing(&repo, id), listing(&repo, f.snapshot.id));
    }

    /// Every chunk of a re-backup reusing its parent's unchanged files (and
    /// their catalog records) equals a forced re-read's: data, catalog
    /// regions and index pages; files changed in the middle of otherwise
    /// unchanged regions are picked up.
    /// The times of `path`'s parent directories (but the root), which a
    /// tree backup of `path` records.
    fn ancestors_status(path: &Path) -> Vec<[i64; 6]> {
        path.ancestors()
            .skip(1)
            .filter(|p| p.parent().is_some())
            .map(|p| {
                let m = fs::symlink_metadata(p).unwrap();
                [
                    m.mtime(),
                    m.mtime_nsec(),
                    m.ctime(),
                    m.ctime_nsec(),
                    m.atime(),
                    m.atime_nsec(),
                ]
            })
            .collect()
    }

    #[test]
    fn a_re_backup_reusing_records_stores_what_a_forced_one_does() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        // Enough records for several catalog regions.
        for d in 0..3 {
            fs::create_dir_all(src.join(format!("directory-{d}"))).unwrap();
            for f in 0..700usize {
                let name = format!("directory-{d}/a-file-with-a-longish-name-{f:04}");
                fs::write(src.join(name), vec![(d * 7 + f) as u8; f % 50]).unwrap();
            }
        }
        // Settle the directories' access times: with `relatime` a directory
        // read in the clock tick of its last change has its access time
        // updated again by the next read, which would make the directories'
        // records differ between the backups compared below.
        std::thread::sleep(std::time::Duration::from_millis(50));
        for d in 0..3 {
            fs::read_dir(src.join(format!("directory-{d}")))
                .unwrap()
                .for_each(drop);
        }
        fs::read_dir(&src).unwrap().for_each(drop);
        let repo = Repository::init(&dir.path().join("r"), Config::new("test".into())).unwrap();
        let opts = BackupOptions {
            source: "host:/x".into(),
            ..BackupOptions::default()
        };
        let paths = std::slice::from_ref(&src);
        let first = backup_tree(&repo, paths, &TreeBackupOptions::default(), &opts).unwrap();
        let regions = first.snapshot.tree.as_ref().unwrap().catalog_bytes
            / crate::tree::catalog::REGION_MAX as u64;
        assert!(regions >= 2, "{regions} regions");
        // New bytes (same length), a new mode, an access time of its own.
        let grown = src.join("directory-1/a-file-with-a-longish-name-0350");
        fs::write(&grown, vec![0xee; 350 % 50]).unwrap();
        let moded = src.join("directory-1/a-file-with-a-longish-name-0351");
        fs::set_permissions(&moded, fs::Permissions::from_mode(0o600)).unwrap();
        let read = src.join("directory-2/a-file-with-a-longish-name-0100");
        filetime::set_file_atime(&read, filetime::FileTime::from_unix_time(1_000_000, 7)).unwrap();
        let chunks = |t: &Outcome| -> Vec<(Fingerprint, u32)> {
            let id = t.snapshot.id;
            repo.recipe(id)
                .unwrap()
                .chunks
                .iter()
                .map(|c| (c.fp, c.len))
                .collect()
        };
        let from = |parent: &Outcome, force: bool| TreeBackupOptions {
            parent: Some(parent.snapshot.id),
            force,
            ..TreeBackupOptions::default()
        };
        // The catalog records the source's parent directories too, and the
        // temporary directory's changes whenever a test running beside this
        // one makes or removes its own: compare backups made while they
        // stayed as they were.
        let (reused, f, again) = (0..20)
            .find_map(|_| {
                let before = ancestors_status(&src);
                let reused = backup_tree(&repo, paths, &from(&first, false), &opts).unwrap();
                let f = backup_tree(&repo, paths, &from(&first, true), &opts).unwrap();
                // Nothing changed since: every chunk again, none stored.
                let again = backup_tree(&repo, paths, &from(&f, false), &opts).unwrap();
                (ancestors_status(&src) == before).then_some((reused, f, again))
            })
            .expect("the source's parent directories kept changing");
        let tree = reused.snapshot.tree.clone().unwrap();
        assert_eq!((tree.files_changed, tree.files_unmodified), (3, 2097));
        assert_eq!(chunks(&reused), chunks(&f));
        assert_eq!(chunks(&again), chunks(&f));
        assert_eq!(again.snapshot.stats.stored_bytes, 0);
        let id = reused.snapshot.id;
        let mut found = HashMap::new();
        for_each_entry(&repo, id, &tree, &repo.recipe(id).unwrap().chunks, |e| {
            found.insert(e.path.clone(), e);
            Ok(true)
        })
        .unwrap();
        assert_eq!(found[&catalog_path(&moded)].mode, 0o600);
        assert_eq!(found[&catalog_path(&read)].atime_ns, 7);
    }

    #[test]
    fn stream_and_catalog_do_not_depend_on_the_readers() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        // Small files of many sizes (some empty) in several directories, a
        // file streamed for its size, and hard links.
        for d in 0..4 {
            fs::create_dir_all(src.join(format!("d{d}/sub"))).unwrap();
            for f in 0..80usize {
                let byte = (d * 80 + f) as u8;
                fs::write(src.join(format!("d{d}/f{f:02}")), vec![byte; f * 1999]).unwrap();
            }
        }
        let big: Vec<u8> = (0..3u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        fs::write(src.join("d2/sub/big"), big).unwrap();
        fs::hard_link(src.join("d1/f03"), src.join("d3/sub/link")).unwrap();
        fs::hard_link(src.join("d2/sub/big"), src.join("d3/sub/link-big")).unwrap();
        let repo = Repository::init(&dir.path().join("r"), Config::new("test".into())).unwrap();
        let opts = BackupOptions {
            source: "host:/x".into(),
            ..BackupOptions::default()
        };
        let paths = std::slice::from_ref(&src);
        let mut listings = Vec::new();
        for readers in [0, 1, READERS] {
            let force = TreeBackupOptions {
                force: true,
                ..TreeBackupOptions::default()
            };
            let t = backup_tree_with(&repo, paths, &force, &opts, readers).unwrap();
            assert!(t.warnings.is_empty(), "{:?}", t.warnings);
            listings.push(listing(&repo, t.snapshot.id));
        }
        // Unchanged files reused from the parent, walked ahead likewise.
        let t =
            backup_tree_with(&repo, paths, &TreeBackupOptions::default(), &opts, READERS).unwrap();
        let tree = t.snapshot.tree.clone().unwrap();
        assert_eq!((tree.bytes_read, tree.files_unmodified), (0, 321));
        listings.push(listing(&repo, t.snapshot.id));
        assert_eq!(listings[0].1.len(), 332 + src.ancestors().count() - 2);
        assert!(listings.iter().all(|l| l == &listings[0]));
    }
}
