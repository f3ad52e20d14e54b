//! The tree backup's stream: the walk's objects, their files' bytes (small
//! files read ahead by a few threads) or, for unchanged files, the parent's
//! chunks, then the catalog, as one segmented stream for the front end.

use super::parent::{ParentChunks, ParentRecord, ParentWalk};
use super::{AHEAD_BYTES, AHEAD_OBJECTS, REUSED_AT_ONCE, SMALL_FILE};
use crate::backup::{Outcome, SegmentRead, Segments};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::snapshot::TreeRef;
use crate::tree::catalog::{CatalogBytes, CatalogWriter, Entry, Kind, Xattr};
use crate::tree::catalog_path;
use crate::tree::meta::{read_file_xattrs, read_xattrs, Names};
use crate::tree::walk::{At, Found, Status, Step, Steps, Walked};
use crossbeam_channel::{bounded, Receiver, Sender};
use rustix::fs::FileType;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{File, Metadata};
use std::io::{ErrorKind, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub(super) enum State {
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
pub(super) struct UnchangedFile {
    pub(super) entry: Entry,
    pub(super) record: Option<ParentRecord>,
    pub(super) first: usize,
    pub(super) count: usize,
}

/// The segmented stream of a tree backup.
pub(super) struct TreeFeed<'a> {
    /// The walk of the roots, from the walk thread.
    pub(super) steps: Steps,
    /// Follow symbolic links (`--follow-symlinks`).
    pub(super) follow: bool,
    /// Leave out regular files larger than this.
    pub(super) larger_than: Option<u64>,
    pub(super) names: Names,
    /// The catalog path of the first link of each multiply-linked file
    /// recorded, by (device, inode).
    pub(super) links: HashMap<(u64, u64), Vec<u8>>,
    /// Parent directories of the roots already recorded.
    pub(super) recorded: HashSet<PathBuf>,
    pub(super) state: State,
    pub(super) catalog: CatalogWriter,
    /// Bytes of files fed so far.
    pub(super) offset: u64,
    pub(super) files: u64,
    pub(super) warnings: Vec<String>,
    pub(super) notes: Vec<String>,
    pub(super) tree: TreeRef,
    /// The parent's catalog (none with `--force` or without a parent).
    pub(super) parent: Option<ParentWalk>,
    /// Chunks of the unchanged file just announced.
    pub(super) reused: Vec<(Fingerprint, u32)>,
    /// Objects walked, not yet in the stream, in walk order.
    pub(super) pending: VecDeque<Pending>,
    /// Bytes of the pending small files.
    pub(super) ahead_bytes: u64,
    /// The walk is done (its last objects may still be pending).
    pub(super) walked: bool,
    /// The reader threads' queue (none: files are read by this thread).
    pub(super) jobs: Option<Sender<Job>>,
    /// Where reused chunks are noted for refetching (with a parent).
    pub(super) refetch: Option<&'a ParentChunks<'a>>,
}

/// A walked object waiting for its turn in the stream.
pub(super) enum Pending {
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
pub(super) struct Job {
    pub(super) at: At,
    pub(super) follow: bool,
    pub(super) done: Sender<Fetched>,
}

/// A small file read whole, its extended attributes and its status after reading.
pub(super) struct Fetched {
    pub(super) bytes: std::io::Result<Vec<u8>>,
    pub(super) after: Option<Metadata>,
    pub(super) xattrs: std::io::Result<Vec<Xattr>>,
}

/// A reader thread: reads the queued small files whole until the queue closes.
pub(super) fn read_small_files(jobs: Receiver<Job>) {
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
    pub(super) fn outcome(self, outcome: Outcome) -> Outcome {
        Outcome {
            warnings: self.warnings,
            notes: self.notes,
            ..outcome
        }
    }

    /// The parent's entry and chunks of the regular file at catalog path
    /// `path` if it is unchanged (same size, modification and status-change
    /// times, device and inode); counts it as new, changed or unmodified.
    pub(super) fn unchanged(&mut self, path: &[u8], status: &Status) -> Option<UnchangedFile> {
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
    pub(super) fn next_object(&mut self) -> Result<Option<Walked>> {
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

    pub(super) fn warn(&mut self, path: &Path, e: &dyn std::fmt::Display) {
        self.tree.skipped += 1;
        self.warnings
            .push(format!("{}: skipped: {e}", path.display()));
    }

    /// The catalog entry of `path` (not yet counting a file's bytes), with
    /// owner names and extended attributes.
    pub(super) fn entry_of(
        &mut self,
        path: &Path,
        status: &Status,
        kind: Kind,
        target: Vec<u8>,
    ) -> Entry {
        let mut entry = self.bare_entry(path, status, kind, target);
        entry.xattrs = self.xattrs_of(path, read_xattrs(path, self.follow));
        entry
    }

    /// The extended attributes read of `path`, or none with a note.
    pub(super) fn xattrs_of(
        &mut self,
        path: &Path,
        read: std::io::Result<Vec<Xattr>>,
    ) -> Vec<Xattr> {
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
    pub(super) fn reused_entry(&mut self, old: Entry, status: &Status) -> (Entry, bool) {
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
    pub(super) fn bare_entry(
        &mut self,
        path: &Path,
        status: &Status,
        kind: Kind,
        target: Vec<u8>,
    ) -> Entry {
        let user = self.names.user(status.uid);
        let group = self.names.group(status.gid);
        status_entry(catalog_path(path), kind, status, target, user, group)
    }

    /// Records a regular file (its bytes fed; as `record` if given, its
    /// record in the parent's catalog), remembered as the first link of its
    /// inode when it has several.
    pub(super) fn push_file(
        &mut self,
        entry: &Entry,
        nlink: u64,
        record: Option<&[u8]>,
    ) -> Result<()> {
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
    pub(super) fn fill(&mut self) -> Result<()> {
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
    pub(super) fn walk_one(&mut self) -> Result<bool> {
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
    pub(super) fn walk_file(&mut self, path: PathBuf, at: At, status: &Status) -> Result<()> {
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
    pub(super) fn start(&mut self, next: Pending) -> Result<Option<SegmentRead>> {
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
    pub(super) fn reuse(
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
    pub(super) fn finish_files(&mut self) -> Result<()> {
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
    pub(super) fn note_changed(&mut self, path: &Path, what: &str) {
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
pub(super) fn changed(now: &Metadata, entry: &Entry, expected: u64, read: u64) -> Option<String> {
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
pub(super) fn status_entry(
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
