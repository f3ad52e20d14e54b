//! Backing up directory trees: a walk of the given paths feeds their files'
//! bytes, then the catalog, to the backup pipeline as one segmented stream.

use super::catalog::{CatalogBytes, CatalogWriter, Entry, Kind, Xattr};
use super::meta::{read_file_xattrs, read_xattrs, Names};
#[cfg(test)]
use super::stream::for_each_entry;
use super::stream::{for_each_record, tree_of};
use super::walk::{
    examine_batches, At, Excludes, Found, Status, Step, StepBatch, Steps, Walk, Walked,
};
use super::{catalog_order, catalog_path, relative_path};
use crate::backup::refetch::Refetch;
use crate::backup::{self, BackupOptions, Outcome, SegmentRead, Segments, Source};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::snapshot::{BackupId, ChunkRef, TreeRef, CATALOG_VERSION};
use crate::repo::quarantine::Quarantined;
use crate::repo::Repository;
use crate::restore::{restore_selection, RestoreOptions};
use crossbeam_channel::{bounded, Receiver, Sender};
use rustix::fs::FileType;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File, Metadata};
use std::io::{ErrorKind, Read};
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What to back up of the given paths.
#[derive(Clone, Debug, Default)]
pub struct TreeBackupOptions {
    /// Gitignore-style patterns of paths to leave out (`*.tmp`, `cache/`,
    /// `/home/ann/big`: a leading `/` anchors at the file-system root).
    pub excludes: Vec<String>,
    /// Do not descend into directories on other file systems.
    pub one_file_system: bool,
    /// The backup whose unchanged files are reused (default: the latest
    /// tree backup of the same source).
    pub parent: Option<BackupId>,
    /// Read every file, reusing nothing.
    pub force: bool,
    /// Patterns like `excludes`, matched regardless of case.
    pub iexcludes: Vec<String>,
    /// Leave out a directory holding a file of one of these names.
    pub exclude_if_present: Vec<String>,
    /// Leave out a directory holding a `CACHEDIR.TAG` with the standard signature.
    pub exclude_caches: bool,
    /// Leave out regular files larger than this many bytes.
    pub exclude_larger_than: Option<u64>,
    /// Back up what symbolic links point to instead of the links.
    pub follow_symlinks: bool,
    /// Back up standard input as one regular file of this path (relative
    /// or absolute; `backup - --stdin-name NAME`) instead of the paths.
    pub stdin_name: Option<String>,
}

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

/// A committed tree backup and what it left out.
#[derive(Debug)]
pub struct TreeOutcome {
    /// The committed backup.
    pub outcome: Outcome,
    /// One line per object that could not be read (the backup is incomplete).
    pub warnings: Vec<String>,
    /// One line per object left out on purpose (FIFOs, sockets, devices).
    pub notes: Vec<String>,
}

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
pub fn backup_tree(
    repo: &Repository,
    paths: &[PathBuf],
    tree_options: &TreeBackupOptions,
    options: &BackupOptions,
) -> Result<TreeOutcome> {
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
) -> Result<TreeOutcome> {
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
        return backup::run(repo, Source::Segments(feed), options);
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
        let outcome = backup::run_with(repo, Source::Segments(feed), options, Some(refetch));
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

/// Standard input as a file to read, and its catalog entry at `name`:
/// mode 0644, the user's ids, the current time.
fn stdin_file(name: &str) -> Result<(File, Entry)> {
    let path = name.trim_start_matches('/');
    if path.is_empty()
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(Error::InvalidConfig(format!(
            "--stdin-name {name:?}: give a file name or a path of names"
        )));
    }
    use std::os::fd::AsFd;
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::io("reading standard input", e))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut names = Names::default();
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let entry = Entry {
        path: path.as_bytes().to_vec(),
        kind: Kind::File,
        mode: 0o644,
        uid,
        gid,
        mtime: secs,
        mtime_ns: now.subsec_nanos(),
        ctime: secs,
        ctime_ns: now.subsec_nanos(),
        atime: secs,
        atime_ns: now.subsec_nanos(),
        user: names.user(uid),
        group: names.group(gid),
        ..Entry::default()
    };
    Ok((File::from(fd), entry))
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

/// The chunks of the parent backup's unchanged files, and their bytes when
/// a back end must store them after all: restored from the repository
/// (verified against their fingerprints), not read from the files.
struct ParentChunks<'r> {
    repo: &'r Repository,
    parent: BackupId,
    chunks: std::sync::Arc<Vec<ChunkRef>>,
    /// Reused files in stream order: (offset in this stream, first chunk in
    /// the parent's recipe, chunks), dropped once the back end passed them.
    files: Mutex<VecDeque<(u64, usize, usize)>>,
    /// Chunks restored ahead: the first one's recipe position and each one's bytes.
    ahead: Mutex<(usize, Vec<Vec<u8>>)>,
}

/// Bytes of reused chunks restored at once when a back end needs them (the
/// rest of the file, up to this much): one restore per run, not per chunk.
const FETCH_AHEAD: u64 = 8 << 20;

impl Refetch for ParentChunks<'_> {
    fn bytes(&self, offset: u64, fp: &Fingerprint, len: u32) -> Result<Vec<u8>> {
        let at = {
            let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
            let mut found = None;
            while let Some(&(start, first, count)) = files.front() {
                let mut o = start;
                let mut hit = None;
                for i in first..first + count {
                    if o == offset {
                        hit = Some((i, first + count));
                        break;
                    }
                    o += u64::from(self.chunks[i].len);
                }
                if hit.is_some() {
                    found = hit;
                    break;
                }
                if o > offset {
                    break;
                }
                // The back end asks in stream order: this file is done.
                files.pop_front();
            }
            found
        };
        let not_reused = || {
            Error::Pipeline(format!(
                "no reused chunk at byte {offset} of the stream (parent backup {})",
                self.parent
            ))
        };
        let (i, file_end) = at.ok_or_else(not_reused)?;
        let c = &self.chunks[i];
        if c.fp != *fp || c.len != len {
            return Err(not_reused());
        }
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let (first, fetched) = &mut *ahead;
        if i < *first || i >= *first + fetched.len() {
            // The chunks from `i` on to the file's end, within FETCH_AHEAD.
            let mut end = i + 1;
            let mut bytes = u64::from(len);
            while end < file_end && bytes + u64::from(self.chunks[end].len) <= FETCH_AHEAD {
                bytes += u64::from(self.chunks[end].len);
                end += 1;
            }
            let mut out = Vec::with_capacity(bytes as usize);
            // Restoring verifies every chunk against its fingerprint.
            restore_selection(
                self.repo,
                self.parent,
                std::slice::from_ref(&(i..end)),
                &mut out,
                &RestoreOptions::default(),
            )?;
            if out.len() as u64 != bytes {
                return Err(not_reused());
            }
            let mut rest = &out[..];
            fetched.clear();
            for c in &self.chunks[i..end] {
                let (one, more) = rest.split_at(c.len as usize);
                fetched.push(one.to_vec());
                rest = more;
            }
            *first = i;
        }
        Ok(std::mem::take(&mut fetched[i - *first]))
    }
}

/// Entries of the parent's catalog, with their records where the catalog
/// is of this build's version: ranges of `records`.
#[derive(Default)]
struct ParentBatch {
    entries: Vec<(Entry, Option<Range<usize>>)>,
    records: Vec<u8>,
}

impl ParentBatch {
    fn push(&mut self, entry: Entry, record: Option<&[u8]>) {
        let range = record.map(|r| {
            let start = self.records.len();
            self.records.extend_from_slice(r);
            start..self.records.len()
        });
        self.entries.push((entry, range));
    }
}

/// A record of the parent's catalog: a range of its batch's records.
struct ParentRecord {
    records: Arc<Vec<u8>>,
    range: Range<usize>,
}

impl ParentRecord {
    fn bytes(&self) -> &[u8] {
        &self.records[self.range.clone()]
    }
}

/// The parent's catalog, walked in step with the file system.
struct ParentWalk {
    /// The parent's entries in batches, from the thread reading its catalog...
    rx: Receiver<ParentBatch>,
    /// ...and the rest of the last batch, with its records.
    batch: std::vec::IntoIter<(Entry, Option<Range<usize>>)>,
    records: Arc<Vec<u8>>,
    /// The next entry not yet passed (of the last batch), and its record.
    next: Option<(Entry, Option<Range<usize>>)>,
    /// Offset of `next` in the parent's stream.
    offset: u64,
    chunks: std::sync::Arc<Vec<ChunkRef>>,
    /// The first chunk at or after `offset` and where it starts.
    chunk: usize,
    chunk_offset: u64,
    usable: Usable,
}

/// Which of the parent's chunks an unchanged file may reuse: not
/// quarantined, and (container layout) in a container that exists;
/// (lifecycle layout) not unusable in the source's lineage
/// ([`crate::layout::lifecycle::Lineage::unusable`]).
struct Usable {
    quarantine: std::collections::HashMap<crate::layout::container::ContainerId, Quarantined>,
    containers: Option<HashSet<crate::layout::container::ContainerId>>,
    lineage: Option<Quarantined>,
}

impl Usable {
    fn of(repo: &Repository, source: &str) -> Result<Usable> {
        let backend = repo.backend().as_ref();
        let (containers, lineage) = match repo.config().layout {
            crate::repo::config::Layout::Container => {
                (Some(repo.containers()?.into_iter().collect()), None)
            }
            crate::repo::config::Layout::Lifecycle => {
                let l = crate::layout::lifecycle::Lineage::load_or_new(backend, source)?;
                (None, Some(l.unusable(backend)?))
            }
        };
        Ok(Usable {
            quarantine: crate::repo::quarantine::load(backend)?,
            containers,
            lineage,
        })
    }

    fn allows(&self, c: &ChunkRef) -> bool {
        !crate::repo::quarantine::is_quarantined(&self.quarantine, c.container, &c.fp)
            && self
                .containers
                .as_ref()
                .is_none_or(|set| set.contains(&c.container))
            && self.lineage.as_ref().is_none_or(|q| !q.contains(&c.fp))
    }
}

impl ParentWalk {
    /// The parent's entry of `path` (entries before it are passed), if
    /// any, and its record if the catalog is of this build's version.
    fn find(&mut self, path: &[u8]) -> Option<(Entry, Option<ParentRecord>)> {
        loop {
            if self.next.is_none() {
                self.next = match self.batch.next() {
                    Some(e) => Some(e),
                    None => {
                        let batch = self.rx.recv().ok()?;
                        self.batch = batch.entries.into_iter();
                        self.records = Arc::new(batch.records);
                        continue;
                    }
                };
            }
            let next = self.next.as_ref()?;
            match catalog_order(&next.0.path, path) {
                std::cmp::Ordering::Less => self.pass(),
                std::cmp::Ordering::Equal => {
                    let (e, range) = self.next.take()?;
                    if e.has_bytes() {
                        self.offset += e.size;
                    }
                    let record = range.map(|range| ParentRecord {
                        records: self.records.clone(),
                        range,
                    });
                    return Some((e, record));
                }
                std::cmp::Ordering::Greater => return None,
            }
        }
    }

    fn pass(&mut self) {
        if let Some((e, _)) = self.next.take() {
            if e.has_bytes() {
                self.offset += e.size;
            }
        }
    }

    /// The parent's chunks of the file of `size` bytes at `offset` of its
    /// stream (which must start and end at chunk boundaries, as files are
    /// cut at their ends): the first one's position in its recipe and their count.
    fn chunks_of(&mut self, offset: u64, size: u64) -> Option<(usize, usize)> {
        while self.chunk_offset < offset {
            let c = self.chunks.get(self.chunk)?;
            self.chunk_offset += u64::from(c.len);
            self.chunk += 1;
        }
        if self.chunk_offset != offset {
            return None;
        }
        let first = self.chunk;
        let mut end = offset;
        let mut usable = true;
        while end < offset + size {
            let c = self.chunks.get(self.chunk)?;
            usable &= self.usable.allows(c);
            end += u64::from(c.len);
            self.chunk += 1;
            self.chunk_offset = end;
        }
        if end != offset + size || !usable {
            return None;
        }
        Some((first, self.chunk - first))
    }
}

/// The given paths made absolute (their parent directories resolved, the
/// paths themselves not followed), sorted, without those inside another.
pub(super) fn roots(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
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

enum State {
    /// Between files: the next read walks on.
    Walking,
    /// Feeding a file's bytes; its entry is recorded when it ends.
    Reading {
        file: File,
        entry: Box<Entry>,
        path: PathBuf,
        nlink: u64,
        /// Its length before reading.
        expected: u64,
    },
    /// Feeding a small file read whole by a reader thread.
    Buffered {
        bytes: Vec<u8>,
        at: usize,
        entry: Box<Entry>,
        nlink: u64,
        /// How it changed while it was read, if it did.
        changed: Option<String>,
        path: PathBuf,
    },
    /// Feeding the catalog, then its index.
    Catalog(CatalogBytes),
    Done,
}

/// An unchanged file's entry in the parent (and its record) and its
/// chunks there: `count` from `first` in the parent's recipe.
struct UnchangedFile {
    entry: Entry,
    record: Option<ParentRecord>,
    first: usize,
    count: usize,
}

/// The segmented stream of a tree backup.
struct TreeFeed<'a> {
    /// The walk of the roots, from the walk thread.
    steps: Steps,
    /// Follow symbolic links (`--follow-symlinks`).
    follow: bool,
    /// Leave out regular files larger than this.
    larger_than: Option<u64>,
    names: Names,
    /// The catalog path of the first link of each multiply-linked file
    /// recorded, by (device, inode).
    links: HashMap<(u64, u64), Vec<u8>>,
    /// Parent directories of the roots already recorded.
    recorded: HashSet<PathBuf>,
    state: State,
    catalog: CatalogWriter,
    /// Bytes of files fed so far.
    offset: u64,
    files: u64,
    warnings: Vec<String>,
    notes: Vec<String>,
    tree: TreeRef,
    /// The parent's catalog (none with `--force` or without a parent).
    parent: Option<ParentWalk>,
    /// Chunks of the unchanged file just announced.
    reused: Vec<(Fingerprint, u32)>,
    /// Objects walked, not yet in the stream, in walk order.
    pending: VecDeque<Pending>,
    /// Bytes of the pending small files.
    ahead_bytes: u64,
    /// The walk is done (its last objects may still be pending).
    walked: bool,
    /// The reader threads' queue (none: files are read by this thread).
    jobs: Option<Sender<Job>>,
    /// Where reused chunks are noted for refetching (with a parent).
    refetch: Option<&'a ParentChunks<'a>>,
}

/// A walked object waiting for its turn in the stream.
enum Pending {
    /// An entry without bytes.
    Entry(Box<Entry>),
    /// An unchanged file: `count` of the parent's chunks, from `first` in
    /// its recipe; its record when it is the parent's.
    Reused {
        entry: Box<Entry>,
        record: Option<ParentRecord>,
        nlink: u64,
        first: usize,
        count: usize,
    },
    /// A small file being read by a reader thread.
    Fetching {
        entry: Box<Entry>,
        path: PathBuf,
        expected: u64,
        done: Receiver<Fetched>,
    },
    /// A file read by this thread when its turn comes.
    Stream {
        file: File,
        entry: Box<Entry>,
        path: PathBuf,
        nlink: u64,
        expected: u64,
    },
}

/// A small file for a reader thread to read whole.
struct Job {
    at: At,
    follow: bool,
    done: Sender<Fetched>,
}

/// A small file read whole, its extended attributes and its status after reading.
struct Fetched {
    bytes: std::io::Result<Vec<u8>>,
    after: Option<Metadata>,
    xattrs: std::io::Result<Vec<Xattr>>,
}

/// A reader thread: reads the queued small files whole until the queue closes.
fn read_small_files(jobs: Receiver<Job>) {
    for job in jobs {
        let mut after = None;
        // A file growing while read is read up to twice the small-file size
        // (and noted as changed).
        let mut xattrs = Ok(Vec::new());
        let bytes = job.at.open_file(job.follow).and_then(|mut file| {
            let mut bytes = Vec::new();
            (&mut file).take(2 * SMALL_FILE).read_to_end(&mut bytes)?;
            after = file.metadata().ok();
            xattrs = read_file_xattrs(&file);
            Ok(bytes)
        });
        // The feed stopped waiting: its error is reported, not ours.
        let _ = job.done.send(Fetched {
            bytes,
            after,
            xattrs,
        });
    }
}

impl TreeFeed<'_> {
    fn outcome(self, outcome: Outcome) -> TreeOutcome {
        TreeOutcome {
            outcome,
            warnings: self.warnings,
            notes: self.notes,
        }
    }

    /// The parent's entry and chunks of the regular file at catalog path
    /// `path` if it is unchanged (same size, modification and status-change
    /// times, device and inode); counts it as new, changed or unmodified.
    fn unchanged(&mut self, path: &[u8], status: &Status) -> Option<UnchangedFile> {
        let Some(parent) = &mut self.parent else {
            self.tree.files_new += 1;
            return None;
        };
        let Some((old, record)) = parent.find(path) else {
            self.tree.files_new += 1;
            return None;
        };
        let parent_offset = parent.offset - old.size;
        let same = old.kind == Kind::File
            && old.size == status.size
            && (old.mtime, old.mtime_ns, old.ctime, old.ctime_ns)
                == (
                    status.mtime.0,
                    status.mtime.1,
                    status.ctime.0,
                    status.ctime.1,
                )
            && (old.dev, old.ino) == (status.dev, status.ino);
        let chunks = same
            .then(|| parent.chunks_of(parent_offset, old.size))
            .flatten()
            .map(|(first, count)| UnchangedFile {
                entry: old,
                record,
                first,
                count,
            });
        if chunks.is_some() {
            self.tree.files_unmodified += 1;
        } else {
            self.tree.files_changed += 1;
        }
        chunks
    }

    /// The next object of the walk, or `None` when every root is done.
    /// The parent directories of each root are queued before it. A walk
    /// that stops before its end (its thread or a stat thread died) fails
    /// the backup rather than commit a tree cut short.
    fn next_object(&mut self) -> Result<Option<Walked>> {
        loop {
            let Some(step) = self
                .steps
                .next()
                .map_err(|e| Error::Pipeline(e.to_string()))?
            else {
                return Ok(None);
            };
            let root = match step {
                Step::Object(walked) => return Ok(Some(walked)),
                Step::Unexamined(path, _) => {
                    let lost = std::io::Error::other("not examined");
                    return Ok(Some(Err((path, lost))));
                }
                Step::End => return Ok(None),
                Step::Root(root) => root,
            };
            for parent in root
                .ancestors()
                .skip(1)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
            {
                if parent.parent().is_some() && self.recorded.insert(parent.to_path_buf()) {
                    match At::path(parent).and_then(|at| at.status(false)) {
                        Ok(status) => {
                            let e = self.entry_of(parent, &status, Kind::Dir, Vec::new());
                            self.pending.push_back(Pending::Entry(Box::new(e)));
                        }
                        Err(e) => self.warn(parent, &e),
                    }
                }
            }
        }
    }

    fn warn(&mut self, path: &Path, e: &dyn std::fmt::Display) {
        self.tree.skipped += 1;
        self.warnings
            .push(format!("{}: skipped: {e}", path.display()));
    }

    /// The catalog entry of `path` (not yet counting a file's bytes), with
    /// owner names and extended attributes.
    fn entry_of(&mut self, path: &Path, status: &Status, kind: Kind, target: Vec<u8>) -> Entry {
        let mut entry = self.bare_entry(path, status, kind, target);
        entry.xattrs = self.xattrs_of(path, read_xattrs(path, self.follow));
        entry
    }

    /// The extended attributes read of `path`, or none with a note.
    fn xattrs_of(&mut self, path: &Path, read: std::io::Result<Vec<Xattr>>) -> Vec<Xattr> {
        read.unwrap_or_else(|e| {
            self.notes.push(format!(
                "{}: extended attributes not backed up: {e}",
                path.display()
            ));
            Vec::new()
        })
    }

    /// The catalog entry of an unchanged regular file: its entry in the
    /// parent (`old`: path, times, size, extended attributes, unchanged as
    /// the status-change time is) with what may change without it (the
    /// access time, owner names) taken from `status` — what [`Self::bare_entry`]
    /// and the parent's attributes make, without allocating again what is
    /// equal; and whether it equals `old` (its record is then the parent's).
    fn reused_entry(&mut self, old: Entry, status: &Status) -> (Entry, bool) {
        let sparse = status.blocks.saturating_mul(512) < status.size;
        let mut same = (old.mode, old.uid, old.gid, old.atime, old.atime_ns)
            == (
                status.mode & 0o7777,
                status.uid,
                status.gid,
                status.atime.0,
                status.atime.1,
            )
            && (old.rdev, old.sparse) == (0, sparse)
            && old.target.is_empty();
        let mut keep = |old: Vec<u8>, now: &[u8]| {
            if old == now {
                old
            } else {
                same = false;
                now.to_vec()
            }
        };
        let user = keep(old.user, self.names.user_ref(status.uid));
        let group = keep(old.group, self.names.group_ref(status.gid));
        let entry = Entry {
            size: status.size,
            xattrs: old.xattrs,
            ..status_entry(old.path, Kind::File, status, Vec::new(), user, group)
        };
        (entry, same)
    }

    /// The catalog entry of `path` without extended attributes.
    fn bare_entry(&mut self, path: &Path, status: &Status, kind: Kind, target: Vec<u8>) -> Entry {
        let user = self.names.user(status.uid);
        let group = self.names.group(status.gid);
        status_entry(catalog_path(path), kind, status, target, user, group)
    }

    /// Records a regular file (its bytes fed; as `record` if given, its
    /// record in the parent's catalog), remembered as the first link of its
    /// inode when it has several.
    fn push_file(&mut self, entry: &Entry, nlink: u64, record: Option<&[u8]>) -> Result<()> {
        self.files += 1;
        match record {
            Some(record) => self.catalog.push_record(entry, record)?,
            None => self.catalog.push(entry)?,
        }
        if nlink > 1 {
            self.links
                .entry((entry.dev, entry.ino))
                .or_insert_with(|| entry.path.clone());
        }
        Ok(())
    }

    /// Walks ahead of the stream, queueing objects in walk order and small
    /// files for the readers, until enough is pending or the walk is done.
    /// A file streamed by this thread ends the walk-ahead, so that a hard
    /// link's first link is recorded before its next links are walked.
    fn fill(&mut self) -> Result<()> {
        while !self.walked
            && self.pending.len() < AHEAD_OBJECTS
            && self.ahead_bytes <= AHEAD_BYTES
            && !matches!(self.pending.back(), Some(Pending::Stream { .. }))
        {
            if !self.walk_one()? {
                // Stop reading the parent's catalog (before the back end
                // commits, and in the lifecycle layout arranges).
                self.walked = true;
                self.parent = None;
            }
        }
        Ok(())
    }

    /// Walks one object, queueing what it contributes; `false` when every
    /// root is done.
    fn walk_one(&mut self) -> Result<bool> {
        let found = match self.next_object()? {
            None => return Ok(false),
            Some(Ok(found)) => found,
            Some(Err((path, e))) => {
                self.warn(&path, &e);
                return Ok(true);
            }
        };
        let Found {
            path,
            at,
            status,
            dir,
        } = found;
        let node = match status.file_type() {
            FileType::Directory => Some(Kind::Dir),
            FileType::Fifo => Some(Kind::Fifo),
            FileType::CharacterDevice => Some(Kind::CharDevice),
            FileType::BlockDevice => Some(Kind::BlockDevice),
            _ => None,
        };
        match (node, dir) {
            // A directory walked into: its attributes read through its descriptor.
            (Some(Kind::Dir), Some(dir)) => {
                let mut e = self.bare_entry(&path, &status, Kind::Dir, Vec::new());
                e.xattrs = self.xattrs_of(&path, read_file_xattrs(&dir));
                self.pending.push_back(Pending::Entry(Box::new(e)));
            }
            (Some(kind), _) => {
                let e = self.entry_of(&path, &status, kind, Vec::new());
                self.pending.push_back(Pending::Entry(Box::new(e)));
            }
            (None, _) => match status.file_type() {
                FileType::Symlink => match at.read_link() {
                    Ok(target) => {
                        let e = self.entry_of(&path, &status, Kind::Symlink, target);
                        self.pending.push_back(Pending::Entry(Box::new(e)));
                    }
                    Err(e) => self.warn(&path, &e),
                },
                FileType::RegularFile => self.walk_file(path, at, &status)?,
                _ => self
                    .notes
                    .push(format!("{}: socket not backed up", path.display())),
            },
        }
        Ok(true)
    }

    /// Queues the regular file at `path` (found `at`): as a hard link to a
    /// file already walked, as the parent's chunks when unchanged, for a
    /// reader when small, or to stream.
    fn walk_file(&mut self, path: PathBuf, at: At, status: &Status) -> Result<()> {
        if self.larger_than.is_some_and(|max| status.size > max) {
            return Ok(());
        }
        let nlink = status.nlink;
        if nlink > 1 {
            if let Some(first) = self.links.get(&(status.dev, status.ino)).cloned() {
                let e = self.entry_of(&path, status, Kind::Hardlink, first);
                self.pending.push_back(Pending::Entry(Box::new(e)));
                return Ok(());
            }
        }
        let bytes = path.as_os_str().as_bytes();
        let catalog_path = bytes.strip_prefix(b"/").unwrap_or(bytes);
        if let Some(unchanged) = self.unchanged(catalog_path, status) {
            let (entry, same) = self.reused_entry(unchanged.entry, status);
            if nlink > 1 {
                // Its next links, walked before it is in the stream, link to it.
                self.links
                    .insert((entry.dev, entry.ino), entry.path.clone());
            }
            self.pending.push_back(Pending::Reused {
                entry: Box::new(entry),
                record: unchanged.record.filter(|_| same),
                nlink,
                first: unchanged.first,
                count: unchanged.count,
            });
            return Ok(());
        }
        let mut entry = self.bare_entry(&path, status, Kind::File, Vec::new());
        let expected = status.size;
        match &self.jobs {
            Some(jobs) if nlink == 1 && expected <= SMALL_FILE => {
                let (done, rx) = bounded(1);
                let job = Job {
                    at,
                    follow: self.follow,
                    done,
                };
                jobs.send(job)
                    .map_err(|_| Error::Pipeline("file reader threads stopped".into()))?;
                self.ahead_bytes += expected;
                self.pending.push_back(Pending::Fetching {
                    entry: Box::new(entry),
                    path,
                    expected,
                    done: rx,
                });
            }
            _ => match at.open_file(self.follow) {
                Ok(file) => {
                    entry.xattrs = self.xattrs_of(&path, read_file_xattrs(&file));
                    self.pending.push_back(Pending::Stream {
                        file,
                        entry: Box::new(entry),
                        path,
                        nlink,
                        expected,
                    })
                }
                Err(e) => self.warn(&path, &e),
            },
        }
        Ok(())
    }

    /// Puts the next pending object in the stream: what the stream reads
    /// at once, if anything (an unchanged file's chunks).
    fn start(&mut self, next: Pending) -> Result<Option<SegmentRead>> {
        match next {
            Pending::Entry(e) => self.catalog.push(&e)?,
            Pending::Reused {
                entry,
                record,
                nlink,
                first,
                count,
            } => {
                self.reuse(&entry, record, nlink, first, count)?;
                // The unchanged files queued right after it go with it:
                // their chunks follow one another, with no bytes between.
                while self.reused.len() < REUSED_AT_ONCE
                    && matches!(self.pending.front(), Some(Pending::Reused { .. }))
                {
                    if let Some(Pending::Reused {
                        entry,
                        record,
                        nlink,
                        first,
                        count,
                    }) = self.pending.pop_front()
                    {
                        self.reuse(&entry, record, nlink, first, count)?;
                    }
                }
                return Ok(Some(SegmentRead::Reused));
            }
            Pending::Fetching {
                mut entry,
                path,
                expected,
                done,
            } => {
                self.ahead_bytes -= expected;
                let fetched = done
                    .recv()
                    .map_err(|_| Error::Pipeline("a file reader thread stopped".into()))?;
                match fetched.bytes {
                    Ok(bytes) => {
                        entry.xattrs = self.xattrs_of(&path, fetched.xattrs);
                        let changed = fetched
                            .after
                            .and_then(|now| changed(&now, &entry, expected, bytes.len() as u64));
                        self.state = State::Buffered {
                            bytes,
                            at: 0,
                            entry,
                            nlink: 1,
                            changed,
                            path,
                        };
                    }
                    Err(e) => self.warn(&path, &e),
                }
            }
            Pending::Stream {
                file,
                entry,
                path,
                nlink,
                expected,
            } => {
                self.state = State::Reading {
                    file,
                    entry,
                    path,
                    nlink,
                    expected,
                }
            }
        }
        Ok(None)
    }

    /// Puts an unchanged file in the stream: records it and adds its
    /// `count` chunks from `first` in the parent's recipe to those announced
    /// next; its record is the parent's `record` if given.
    fn reuse(
        &mut self,
        entry: &Entry,
        record: Option<ParentRecord>,
        nlink: u64,
        first: usize,
        count: usize,
    ) -> Result<()> {
        if count > 0 {
            let refetch = self
                .refetch
                .ok_or_else(|| Error::Pipeline("an unchanged file without a parent".into()))?;
            let chunks = refetch.chunks.get(first..first + count).ok_or_else(|| {
                Error::Pipeline(format!(
                    "chunks {first}..{} beyond the parent's recipe",
                    first + count
                ))
            })?;
            self.reused.extend(chunks.iter().map(|c| (c.fp, c.len)));
            refetch
                .files
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back((self.offset, first, count));
        }
        self.offset += entry.size;
        self.tree.bytes_reused += entry.size;
        self.push_file(entry, nlink, record.as_ref().map(ParentRecord::bytes))
    }

    /// Ends the stream's files: the catalog follows.
    fn finish_files(&mut self) -> Result<()> {
        self.tree.catalog_offset = self.offset;
        self.tree.files = self.files;
        self.tree.entries = self.catalog.count();
        let bytes = std::mem::take(&mut self.catalog).finish()?;
        self.tree.catalog_bytes = bytes.len();
        self.tree.index_bytes = bytes.index.len() as u64;
        self.tree.index_pages = bytes.pages.clone();
        self.state = State::Catalog(bytes);
        Ok(())
    }

    /// Notes that the file at `path` changed while it was read.
    fn note_changed(&mut self, path: &Path, what: &str) {
        self.notes.push(format!(
            "{}: changed while it was read ({what}): backed up as read, read again next time",
            path.display()
        ));
    }
}

impl Segments for TreeFeed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> Result<SegmentRead> {
        loop {
            match &mut self.state {
                State::Walking => {
                    self.fill()?;
                    // Nothing pending: the walk is done.
                    match self.pending.pop_front() {
                        Some(next) => {
                            if let Some(read) = self.start(next)? {
                                return Ok(read);
                            }
                        }
                        None => self.finish_files()?,
                    }
                }
                State::Buffered {
                    bytes,
                    at,
                    entry,
                    nlink,
                    changed,
                    path,
                } => {
                    if *at < bytes.len() {
                        let n = buf.len().min(bytes.len() - *at);
                        buf[..n].copy_from_slice(&bytes[*at..*at + n]);
                        *at += n;
                        entry.size += n as u64;
                        self.offset += n as u64;
                        self.tree.bytes_read += n as u64;
                        return Ok(SegmentRead::Data(n));
                    }
                    let (entry, nlink) = (std::mem::take(&mut **entry), *nlink);
                    if let Some(what) = changed.take() {
                        let path = std::mem::take(path);
                        self.note_changed(&path, &what);
                    }
                    self.state = State::Walking;
                    self.push_file(&entry, nlink, None)?;
                    return Ok(SegmentRead::SegmentEnd);
                }
                State::Reading {
                    file,
                    entry,
                    path,
                    nlink,
                    expected,
                } => match file.read(buf) {
                    Ok(0) => {
                        let (entry, nlink) = (std::mem::take(&mut **entry), *nlink);
                        let now = file.metadata().ok();
                        let what = now.and_then(|now| changed(&now, &entry, *expected, entry.size));
                        if let Some(what) = what {
                            let path = path.clone();
                            self.note_changed(&path, &what);
                        }
                        self.state = State::Walking;
                        self.push_file(&entry, nlink, None)?;
                        return Ok(SegmentRead::SegmentEnd);
                    }
                    Ok(n) => {
                        entry.size += n as u64;
                        self.offset += n as u64;
                        self.tree.bytes_read += n as u64;
                        return Ok(SegmentRead::Data(n));
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        let mut gap = std::mem::take(&mut **entry);
                        let path = path.clone();
                        self.state = State::Walking;
                        self.warn(&path, &e);
                        if gap.size == 0 {
                            continue;
                        }
                        // Its bytes so far are in the stream: a gap accounts for them.
                        gap.kind = Kind::Gap;
                        self.catalog.push(&gap)?;
                        return Ok(SegmentRead::SegmentEnd);
                    }
                },
                State::Catalog(bytes) => match bytes.feed(buf)? {
                    Some(read) => return Ok(read),
                    None => self.state = State::Done,
                },
                State::Done => return Ok(SegmentRead::End),
            }
        }
    }

    fn take_reused(&mut self) -> Vec<(Fingerprint, u32)> {
        std::mem::take(&mut self.reused)
    }

    fn tree(&mut self) -> Option<TreeRef> {
        Some(self.tree.clone())
    }
}

/// How the file just read (`read` bytes, `expected` when opened; `now` its
/// status after reading) differs from its `entry` taken before reading, if
/// it does: its length or its times changed meanwhile.
fn changed(now: &Metadata, entry: &Entry, expected: u64, read: u64) -> Option<String> {
    if !now.is_file() {
        // Standard input: a pipe has no length to compare.
        return None;
    }
    let times = (
        now.mtime(),
        now.mtime_nsec() as u32,
        now.ctime(),
        now.ctime_nsec() as u32,
    );
    if expected != read || now.len() != read {
        Some(format!(
            "{expected} bytes when opened, {read} read, {} now",
            now.len()
        ))
    } else if times != (entry.mtime, entry.mtime_ns, entry.ctime, entry.ctime_ns) {
        Some("modified".into())
    } else {
        None
    }
}

/// The catalog entry at `path` (catalog path bytes) of an object of `kind`
/// with `status`, its link `target` and owner names, without extended
/// attributes and (for a file) with size 0, its bytes not yet counted.
fn status_entry(
    path: Vec<u8>,
    kind: Kind,
    status: &Status,
    target: Vec<u8>,
    user: Vec<u8>,
    group: Vec<u8>,
) -> Entry {
    Entry {
        path,
        kind,
        mode: status.mode & 0o7777,
        uid: status.uid,
        gid: status.gid,
        mtime: status.mtime.0,
        mtime_ns: status.mtime.1,
        ctime: status.ctime.0,
        ctime_ns: status.ctime.1,
        dev: status.dev,
        ino: status.ino,
        size: 0,
        target,
        atime: status.atime.0,
        atime_ns: status.atime.1,
        user,
        group,
        rdev: match kind {
            Kind::CharDevice | Kind::BlockDevice => status.rdev,
            _ => 0,
        },
        sparse: kind == Kind::File && status.blocks.saturating_mul(512) < status.size,
        xattrs: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::config::Config;

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
        let tree = t.outcome.snapshot.tree.clone().unwrap();
        let changed = 1 + u64::from(tagged_ok);
        assert_eq!(
            (tree.files_changed, tree.files_unmodified),
            (changed, 50 - changed)
        );
        let id = t.outcome.snapshot.id;
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
        assert_eq!(listing(&repo, id), listing(&repo, f.outcome.snapshot.id));
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
        let regions = first.outcome.snapshot.tree.as_ref().unwrap().catalog_bytes
            / super::super::catalog::REGION_MAX as u64;
        assert!(regions >= 2, "{regions} regions");
        // New bytes (same length), a new mode, an access time of its own.
        let grown = src.join("directory-1/a-file-with-a-longish-name-0350");
        fs::write(&grown, vec![0xee; 350 % 50]).unwrap();
        let moded = src.join("directory-1/a-file-with-a-longish-name-0351");
        fs::set_permissions(&moded, fs::Permissions::from_mode(0o600)).unwrap();
        let read = src.join("directory-2/a-file-with-a-longish-name-0100");
        filetime::set_file_atime(&read, filetime::FileTime::from_unix_time(1_000_000, 7)).unwrap();
        let chunks = |t: &TreeOutcome| -> Vec<(Fingerprint, u32)> {
            let id = t.outcome.snapshot.id;
            repo.recipe(id)
                .unwrap()
                .chunks
                .iter()
                .map(|c| (c.fp, c.len))
                .collect()
        };
        let from = |parent: &TreeOutcome, force: bool| TreeBackupOptions {
            parent: Some(parent.outcome.snapshot.id),
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
        let tree = reused.outcome.snapshot.tree.clone().unwrap();
        assert_eq!((tree.files_changed, tree.files_unmodified), (3, 2097));
        assert_eq!(chunks(&reused), chunks(&f));
        assert_eq!(chunks(&again), chunks(&f));
        assert_eq!(again.outcome.snapshot.stats.stored_bytes, 0);
        let id = reused.outcome.snapshot.id;
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
            listings.push(listing(&repo, t.outcome.snapshot.id));
        }
        // Unchanged files reused from the parent, walked ahead likewise.
        let t =
            backup_tree_with(&repo, paths, &TreeBackupOptions::default(), &opts, READERS).unwrap();
        let tree = t.outcome.snapshot.tree.clone().unwrap();
        assert_eq!((tree.bytes_read, tree.files_unmodified), (0, 321));
        listings.push(listing(&repo, t.outcome.snapshot.id));
        assert_eq!(listings[0].1.len(), 332 + src.ancestors().count() - 2);
        assert!(listings.iter().all(|l| l == &listings[0]));
    }
}
