//! The one backup entry point, [`backup`], for every kind of input: a byte
//! stream, directory trees, or a fingerprint trace ([`Input`]).
//!
//! One pipeline serves them all: the front end ([`front`]) reads the input,
//! cuts it into chunks and fingerprints them (in parallel, blocks cut
//! speculatively and stitched in order: [`fused`]); the repository's layout
//! takes the chunk stream from there ([`crate::layout::store_backup`]: the
//! container log deduplicates, fills and writes containers; the lifecycle
//! layout deduplicates against the previous version and arranges). A tree
//! backup ([`tree`]) is a segmented stream: its files' bytes, then its
//! catalog.
//!
//! Stages run on their own threads connected by bounded channels, so memory
//! stays within a few blocks and containers whatever the input size. Commit
//! order (docs/FORMAT.md §15): containers (all durable, in any order), then
//! the index, the recipe and the policy state, then the snapshot; a backup
//! interrupted anywhere before the snapshot write is invisible.

use crate::backend::LockMode;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::format::snapshot::TreeRef;
use crate::index::Chunk;
use crate::layout::stream::{ChunkStream, Refetch, StreamFacts};
use crate::repo::Repository;
use crossbeam_channel::bounded;
use std::io::Read;
use std::path::PathBuf;

mod front;

pub mod options;
pub(crate) mod tree;

pub use options::{BackupOptions, Outcome, TreeBackupOptions};
pub use tree::{default_source, host_name};

/// What a backup reads.
pub enum Input<'a> {
    /// A byte stream, chunked and fingerprinted as it comes (standard
    /// input, a generated stream, a copy's restored bytes).
    Stream {
        /// The stream.
        input: &'a mut (dyn Read + Send),
        /// Its name in errors (a path or `stdin`).
        name: &'a str,
    },
    /// The directory trees, files or symbolic links at `paths`, backed up
    /// as one tree backup (or standard input as one file of a tree, with
    /// [`TreeBackupOptions::stdin_name`]).
    Tree {
        /// What to back up.
        paths: &'a [PathBuf],
        /// How (exclusions, parent, file systems, links).
        options: &'a TreeBackupOptions,
    },
    /// A fingerprint trace: fingerprint and length per chunk, no data
    /// (trace repositories).
    Trace(&'a mut (dyn Iterator<Item = Result<(Fingerprint, u32)>> + Send)),
}

/// Backs up `input` into `repo`, opened for a backup
/// ([`crate::backend::LockMode::Backup`] or `Exclusive`), in the
/// repository's layout, and returns what it committed.
///
/// A tree backup leaves out objects it cannot read, with a warning each
/// ([`Outcome::warnings`]); a path that does not exist fails it before
/// anything is written.
pub fn backup(repo: &Repository, input: Input, options: &BackupOptions) -> Result<Outcome> {
    match input {
        Input::Stream { input, name } => run(repo, Source::Data { input, name }, options),
        Input::Trace(chunks) => run(repo, Source::Trace(chunks), options),
        Input::Tree {
            paths,
            options: tree_options,
        } => tree::backup_tree(repo, paths, tree_options, options),
    }
}

/// Where a backup's chunks come from.
pub(crate) enum Source<'a> {
    /// A byte stream, chunked and fingerprinted by the pipeline.
    Data {
        /// The stream.
        input: &'a mut (dyn Read + Send),
        /// Its name in errors (a path or `stdin`).
        name: &'a str,
    },
    /// A fingerprint trace: fingerprint and length per chunk, no data (trace repositories).
    Trace(&'a mut (dyn Iterator<Item = Result<(Fingerprint, u32)>> + Send)),
    /// A stream of segments, each chunked on its own: the chunker restarts
    /// at every segment and a segment's last chunk ends at its end (a
    /// directory tree: its files, then its catalog).
    Segments(&'a mut dyn Segments),
}

/// What [`Segments::read`] delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentRead {
    /// This many bytes (at least one) of the current segment.
    Data(usize),
    /// The current segment ended; the next read starts the next one.
    SegmentEnd,
    /// The next segment is given whole as chunks, without its bytes
    /// ([`Segments::take_reused`]; an unchanged file of a tree backup). It
    /// comes at a segment boundary and needs no `SegmentEnd`.
    Reused,
    /// This many bytes (at least one, at most the chunker's maximum chunk
    /// size): a whole segment, stored as exactly one chunk (a tree backup's
    /// catalog regions and index pages). It comes at a segment boundary and
    /// needs no `SegmentEnd`; every read is given at least the maximum chunk
    /// size of room.
    Whole(usize),
    /// The stream ended (after its last segment's end).
    End,
}

/// A stream of segments (see [`Source::Segments`]).
pub trait Segments: Send {
    /// Reads the next bytes of the stream into `buf` (never empty).
    fn read(&mut self, buf: &mut [u8]) -> Result<SegmentRead>;
    /// The chunks of the segment announced by [`SegmentRead::Reused`]: the
    /// fingerprints and lengths a read of its bytes would produce.
    fn take_reused(&mut self) -> Vec<(Fingerprint, u32)> {
        Vec::new()
    }
    /// The tree the stream holds, asked once [`Segments::read`] returned
    /// [`SegmentRead::End`]: its snapshot records it.
    fn tree(&mut self) -> Option<TreeRef>;
}

/// Backs up the chunks of `source` into `repo` (opened for a backup).
pub(crate) fn run(repo: &Repository, source: Source, options: &BackupOptions) -> Result<Outcome> {
    run_with(repo, source, options, None)
}

/// [`run`] of a source that may give chunks without their bytes
/// ([`SegmentRead::Reused`]): `refetch` supplies them when a back end must
/// store them. The front end runs on threads of its own and feeds the
/// layout's back end, which commits.
pub(crate) fn run_with(
    repo: &Repository,
    source: Source,
    options: &BackupOptions,
    refetch: Option<&dyn Refetch>,
) -> Result<Outcome> {
    repo.require(LockMode::Backup, "a backup")?;
    repo.write_missing_commit_marks()?;
    let config = repo.config();
    match (&source, config.trace) {
        (Source::Data { .. } | Source::Segments(_), true) => {
            return Err(Error::InvalidConfig(format!(
                "{}: a trace repository takes fingerprint traces, not data",
                repo.backend().location()
            )))
        }
        (Source::Trace(_), false) => {
            return Err(Error::InvalidConfig(format!(
                "{}: fingerprint traces need a trace repository (init --trace)",
                repo.backend().location()
            )))
        }
        _ => {}
    }
    let chunker = config.chunker.build()?;
    let pool = front::BufferPool::new(front::BlockLayout::new(chunker.max_size()));
    let (tx, rx) = bounded::<Vec<Chunk>>(front::QUEUE_DEPTH);
    let facts = StreamFacts::default();
    std::thread::scope(|s| {
        let front = front::spawn_front_end(
            s,
            source,
            chunker.as_ref(),
            repo.fingerprinter(),
            &pool,
            &facts,
            tx,
        );
        let stream = ChunkStream {
            chunks: rx,
            facts: &facts,
            refetch,
            join_front: Box::new(move || front::join_front_end(front)),
        };
        crate::layout::store_backup(repo, stream, options)
    })
}

#[cfg(test)]
mod tests {
    use super::front::*;
    use super::*;
    use crate::chunker::cut_all;
    use crate::chunker::{pseudo_random, ChunkerKind, ChunkerParams};
    use crate::fingerprint::Fingerprinter;
    use crate::format::snapshot::ChunkRef;
    use crate::repo::config::Config;
    use crate::repo::config::Layout;
    use crate::restore::{restore, RestoreOptions};
    use std::time::Instant;

    /// The trace reader's busy time is the time it spent reading, at most
    /// the wall time of the whole read (it was once the sum of the time
    /// since the start at every batch: hours for a minute's read).
    #[test]
    fn the_trace_readers_busy_time_is_at_most_its_wall_time() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut chunks = (0..100_000u32).map(|i| {
            let mut fp = [0u8; crate::fingerprint::FINGERPRINT_LEN];
            fp[..4].copy_from_slice(&i.to_le_bytes());
            Ok((Fingerprint(fp), 4096))
        });
        let started = Instant::now();
        let (busy, read) = std::thread::scope(|s| {
            let reader = s.spawn(|| read_trace(&mut chunks, tx));
            let read: usize = rx.iter().map(|b: Vec<Chunk>| b.len()).sum();
            (reader.join().unwrap().unwrap(), read)
        });
        assert_eq!(read, 100_000);
        assert!(
            busy <= started.elapsed(),
            "{busy:?} busy in {:?}",
            started.elapsed()
        );
    }

    /// A reader that returns at most `piece` bytes per call, then optionally fails.
    struct Trickle<'a> {
        data: &'a [u8],
        piece: usize,
        fail_at_end: bool,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.data.is_empty() && self.fail_at_end {
                return Err(std::io::Error::other("input broke"));
            }
            let n = self.piece.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// Backs `data` up through a trickling reader and checks that the recipe
    /// has the cut points of the whole input and that it restores.
    fn round_trip(chunker: ChunkerParams, data: &[u8], piece: usize) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new("test".into());
        config.chunker = chunker;
        let repo = Repository::init(&dir.path().join("repo"), config).unwrap();
        let mut input = Trickle {
            data,
            piece,
            fail_at_end: false,
        };
        let snap = backup(
            &repo,
            crate::backup::Input::Stream {
                input: &mut input,
                name: "input",
            },
            &BackupOptions::default(),
        )
        .map(|o| o.snapshot)
        .unwrap();
        assert_eq!(snap.logical_bytes, data.len() as u64);

        let mut expected = Vec::new();
        cut_all(chunker.build().unwrap().as_ref(), data, true, &mut expected);
        let recipe = repo.recipe(snap.id).unwrap();
        let lengths: Vec<u32> = recipe.chunks.iter().map(|c| c.len).collect();
        assert_eq!(
            lengths,
            expected,
            "{} bytes in pieces of {piece}",
            data.len()
        );

        let mut out = Vec::new();
        restore(&repo, snap.id, &mut out, &RestoreOptions::default()).unwrap();
        assert!(out == data, "restore of {} bytes differs", data.len());
    }

    #[test]
    fn block_edges_keep_the_cut_points_of_the_whole_input() {
        let params = ChunkerParams::default();
        let read_len = BlockLayout::new(params.max_size as usize).read_len;
        let data = pseudo_random(3 * read_len + 12_345, 11);
        for len in [0, 1, 4095, read_len - 1, read_len, read_len + 1, data.len()] {
            for piece in [777_777, 1000] {
                round_trip(params, &data[..len], piece);
            }
        }
    }

    /// Fixed-size chunking takes the chunking thread and fingerprinting on
    /// the pool (not the fused front end): the same cut points, a chunk
    /// size that does not divide the block size included.
    #[test]
    fn fixed_size_chunking_keeps_the_cut_points_of_the_whole_input() {
        for size in [4096, 5000] {
            let params = ChunkerParams {
                kind: ChunkerKind::Fixed,
                min_size: size,
                avg_size: size,
                max_size: size,
            };
            assert!(!params.build().unwrap().content_defined());
            let data = pseudo_random(3 * BLOCK_SIZE + 777, 13);
            round_trip(params, &data, 100_000);
        }
    }

    #[test]
    fn chunks_larger_than_a_block_are_carried() {
        // max 2 MiB: blocks grow to 8 MiB and the carry to almost 2 MiB.
        let params = ChunkerParams {
            kind: ChunkerKind::Fastcdc,
            min_size: 64 * 1024,
            avg_size: 256 * 1024,
            max_size: 2 * 1024 * 1024,
        };
        let mut data = pseudo_random(20 << 20, 5);
        // Zeros have no content-defined cut point: maximum-size chunks.
        data[3 << 20..9 << 20].fill(0);
        round_trip(params, &data, 1 << 20);
    }

    /// Segments fed in pieces of at most `piece` bytes.
    struct Pieces {
        segments: Vec<Vec<u8>>,
        at: (usize, usize),
        piece: usize,
    }

    impl Segments for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> Result<SegmentRead> {
            let (s, o) = self.at;
            let Some(seg) = self.segments.get(s) else {
                return Ok(SegmentRead::End);
            };
            if o == seg.len() {
                self.at = (s + 1, 0);
                return Ok(SegmentRead::SegmentEnd);
            }
            let n = self.piece.min(buf.len()).min(seg.len() - o);
            buf[..n].copy_from_slice(&seg[o..o + n]);
            self.at.1 += n;
            Ok(SegmentRead::Data(n))
        }

        fn tree(&mut self) -> Option<TreeRef> {
            None
        }
    }

    #[test]
    fn segments_are_cut_on_their_own() {
        let params = ChunkerParams::default();
        let read_len = BlockLayout::new(params.max_size as usize).read_len;
        let data = pseudo_random(3 * read_len, 17);
        let sizes = [
            0,
            1,
            5000,
            read_len - 3,
            0,
            params.max_size as usize,
            70_000,
        ];
        let mut segments = Vec::new();
        let mut at = 0;
        for n in sizes {
            segments.push(data[at..at + n].to_vec());
            at += n;
        }
        let chunker = params.build().unwrap();
        let mut expected = Vec::new();
        for seg in &segments {
            cut_all(chunker.as_ref(), seg, true, &mut expected);
        }
        for piece in [1 << 20, 3000] {
            let dir = tempfile::tempdir().unwrap();
            let repo = Repository::init(&dir.path().join("repo"), Config::new("t".into())).unwrap();
            let mut feed = Pieces {
                segments: segments.clone(),
                at: (0, 0),
                piece,
            };
            let snap = run(
                &repo,
                Source::Segments(&mut feed),
                &BackupOptions::default(),
            )
            .unwrap()
            .snapshot;
            let lengths: Vec<u32> = repo
                .recipe(snap.id)
                .unwrap()
                .chunks
                .iter()
                .map(|c| c.len)
                .collect();
            assert_eq!(lengths, expected, "pieces of {piece}");
            assert_eq!(snap.logical_bytes, at as u64);
        }
    }

    /// Segments of which those with chunks in `reused` are given as chunks.
    struct Reusing {
        pieces: Pieces,
        reused: Vec<Option<Vec<(Fingerprint, u32)>>>,
        taken: Vec<(Fingerprint, u32)>,
    }

    impl Segments for Reusing {
        fn read(&mut self, buf: &mut [u8]) -> Result<SegmentRead> {
            let (s, o) = self.pieces.at;
            if o == 0 {
                if let Some(Some(chunks)) = self.reused.get_mut(s) {
                    self.taken = std::mem::take(chunks);
                    self.reused[s] = None;
                    self.pieces.at = (s + 1, 0);
                    return Ok(SegmentRead::Reused);
                }
            }
            self.pieces.read(buf)
        }

        fn take_reused(&mut self) -> Vec<(Fingerprint, u32)> {
            std::mem::take(&mut self.taken)
        }

        fn tree(&mut self) -> Option<TreeRef> {
            None
        }
    }

    /// Reused chunks (no bytes) between read segments, several per block and
    /// more than a block takes, make the recipe a re-read makes; in the
    /// lifecycle layout too, where a new lineage fetches their bytes back.
    #[test]
    fn reused_segments_are_the_chunks_a_read_makes() {
        /// The bytes of the stream (the segments' concatenation).
        struct Stream<'a>(&'a [u8], &'a Fingerprinter);
        impl Refetch for Stream<'_> {
            fn bytes(&self, offset: u64, fp: &Fingerprint, len: u32) -> Result<Vec<u8>> {
                let bytes = self.0[offset as usize..][..len as usize].to_vec();
                assert_eq!(self.1.hash(&bytes), *fp);
                Ok(bytes)
            }
        }
        let params = ChunkerParams {
            kind: ChunkerKind::Fastcdc,
            min_size: 64,
            avg_size: 256,
            max_size: 1024,
        };
        let data = pseudo_random(4 << 20, 23);
        // Small segments around a large one of more than REUSED_PER_BLOCK chunks.
        let sizes = [5000, 0, 300, 1 << 20, 7, 12_345, 2 << 20, 999];
        let mut segments = Vec::new();
        let mut at = 0;
        for n in sizes {
            segments.push(data[at..at + n].to_vec());
            at += n;
        }
        for layout in [Layout::Container, Layout::Lifecycle] {
            let dir = tempfile::tempdir().unwrap();
            let mut config = Config::new("t".into());
            config.chunker = params;
            config.layout = layout;
            let repo = Repository::init(&dir.path().join("repo"), config).unwrap();
            let feed = |reused| Pieces {
                segments: segments.clone(),
                at: (0, 0),
                piece: if reused { 3000 } else { 1 << 20 },
            };
            let first = run(
                &repo,
                Source::Segments(&mut feed(false)),
                &BackupOptions::default(),
            )
            .unwrap()
            .snapshot;
            let chunks = repo.recipe(first.id).unwrap().chunks;
            let chunker = params.build().unwrap();
            let mut reused = Vec::new();
            let mut next = 0;
            for (i, seg) in segments.iter().enumerate() {
                let mut lengths = Vec::new();
                cut_all(chunker.as_ref(), seg, true, &mut lengths);
                let mine: Vec<_> = chunks[next..next + lengths.len()]
                    .iter()
                    .map(|c| (c.fp, c.len))
                    .collect();
                next += lengths.len();
                reused.push((i % 2 == 0).then_some(mine));
            }
            assert!(reused[6].as_ref().unwrap().len() > REUSED_PER_BLOCK);
            let refetch = Stream(&data[..at], repo.fingerprinter());
            for source in ["", "other lineage"] {
                let mut feed = Reusing {
                    pieces: feed(true),
                    reused: reused.clone(),
                    taken: Vec::new(),
                };
                let options = BackupOptions {
                    source: source.into(),
                    ..BackupOptions::default()
                };
                let snap = run_with(&repo, Source::Segments(&mut feed), &options, Some(&refetch))
                    .unwrap()
                    .snapshot;
                assert_eq!(repo.recipe(snap.id).unwrap().chunks.len(), chunks.len());
                let again: Vec<_> = repo.recipe(snap.id).unwrap().chunks;
                let pairs = |c: &[ChunkRef]| c.iter().map(|c| (c.fp, c.len)).collect::<Vec<_>>();
                assert_eq!(pairs(&again), pairs(&chunks), "{layout:?} {source:?}");
                let mut out = Vec::new();
                restore(&repo, snap.id, &mut out, &RestoreOptions::default()).unwrap();
                assert!(out == data[..at], "{layout:?} {source:?}");
            }
        }
    }

    #[test]
    fn an_input_error_fails_the_backup_without_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(&dir.path().join("repo"), Config::new("t".into())).unwrap();
        let data = pseudo_random(5 << 20, 3);
        let mut input = Trickle {
            data: &data,
            piece: 100_000,
            fail_at_end: true,
        };
        let err = backup(
            &repo,
            crate::backup::Input::Stream {
                input: &mut input,
                name: "broken",
            },
            &BackupOptions::default(),
        )
        .map(|o| o.snapshot)
        .unwrap_err();
        assert!(matches!(err, Error::Input { .. }), "{err}");
        assert!(repo.backups().unwrap().is_empty());
    }

    #[test]
    fn backup_stats_count_the_reads_and_writes_of_the_backend() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new("t".into());
        config.index = crate::repo::config::IndexKind::Ddfs;
        let repo = Repository::init(&dir.path().join("repo"), config).unwrap();
        let data = pseudo_random(3 << 20, 9);
        let options = BackupOptions::default();
        let first = backup(
            &repo,
            crate::backup::Input::Stream {
                input: &mut &data[..],
                name: "a",
            },
            &options,
        )
        .map(|o| o.snapshot)
        .unwrap();
        let before = repo.io_stats();
        let second = backup(
            &repo,
            crate::backup::Input::Stream {
                input: &mut &data[..],
                name: "a",
            },
            &options,
        )
        .map(|o| o.snapshot)
        .unwrap();
        let io = repo.io_stats().since(&before);
        // Every chunk is a duplicate: the second backup finds the first's
        // fingerprints in the on-disk table and loads its containers' metadata.
        let index = &second.stats.index;
        assert!(
            index.disk_lookups > 0 && index.container_loads > 0,
            "{index:?}"
        );
        assert!(second.stats.reads >= index.disk_lookups + index.container_loads);
        // The counts end before the snapshot is written (its size depends on them).
        assert_eq!(second.stats.reads, io.reads);
        assert_eq!(second.stats.bytes_read, io.read_bytes);
        assert!(second.stats.bytes_written < io.write_bytes);
        assert!(first.stats.bytes_written > data.len() as u64);
    }
}
