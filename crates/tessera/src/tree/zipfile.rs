//! Writing the entries of a tree backup as a zip archive (the web
//! interface's `?format=zip` download), through the same passes as a tar
//! stream ([`super::tar`]): every chunk verified before a byte of it is
//! written, entries and bytes streamed. The archive is written in one pass
//! to a writer that cannot seek: each file's sizes and CRC-32 follow its
//! bytes (data descriptors), and files of 4 GiB or more are Zip64.
//!
//! Files are stored (method 0, no compression: backups' data is often
//! compressed already, and storing streams at the speed of the restore),
//! with the catalog's permission bits and modification time (UTC, within
//! the DOS range 1980–2107, else 1980-01-01). Symbolic links are stored as
//! links (Unix mode `0o120000` in the external attributes). Zip has no hard
//! links, FIFOs or devices: they are left out, each kind named once in the
//! statistics' notes and in the archive's comment. A name that is not UTF-8 is
//! stored with replacement characters.

use super::catalog::{Entry, Kind};
use super::restore::TreeRestoreStats;
use super::tar::{archive_err, write_archive, Exact, Sink, TarScope};
use crate::error::{Error, Result};
use crate::format::snapshot::BackupId;
use crate::repo::Repository;
use crate::restore::RestoreOptions;
use crate::util::pipe::PipeReader;
use ::zip::write::{SimpleFileOptions, StreamWriter};
use ::zip::{CompressionMethod, ZipWriter};
use std::io::{self, Write};

/// Writes the entries of tree backup `id` that `scope` takes to `out` as a
/// zip archive; as [`super::write_tar`] otherwise.
pub fn write_zip(
    repo: &Repository,
    id: BackupId,
    scope: &TarScope,
    out: &mut dyn Write,
    options: &RestoreOptions,
) -> Result<TreeRestoreStats> {
    let mut sink = ZipSink {
        zip: Some(ZipWriter::new_stream(out)),
        left_out: [0; 2],
    };
    write_archive(repo, id, scope, &mut sink, options)
}

struct ZipSink<'a> {
    zip: Option<ZipWriter<StreamWriter<&'a mut dyn Write>>>,
    /// Hard links, and FIFOs and devices, left out.
    left_out: [u64; 2],
}

fn zip_err(e: ::zip::result::ZipError) -> Error {
    match e {
        ::zip::result::ZipError::Io(e) => archive_err(e, "zip archive"),
        e => Error::Output {
            what: "zip archive".into(),
            source: io::Error::other(e),
        },
    }
}

/// The DOS time of `mtime` (seconds since the epoch, UTC), if in range.
fn dos_time(mtime: i64) -> Option<::zip::DateTime> {
    let t = jiff::Timestamp::from_second(mtime).ok()?;
    let d = jiff::tz::TimeZone::UTC.to_datetime(t);
    let byte = |v: i8| u8::try_from(v).ok();
    ::zip::DateTime::from_date_and_time(
        u16::try_from(d.year()).ok()?,
        byte(d.month())?,
        byte(d.day())?,
        byte(d.hour())?,
        byte(d.minute())?,
        byte(d.second())?,
    )
    .ok()
}

impl Sink for ZipSink<'_> {
    fn append(
        &mut self,
        scope: &TarScope,
        e: &Entry,
        bytes: &mut PipeReader,
        stats: &mut TreeRestoreStats,
    ) -> Result<()> {
        let Some(zip) = self.zip.as_mut() else {
            return Ok(());
        };
        let mut options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .unix_permissions(e.mode & 0o7777);
        if let Some(t) = dos_time(e.mtime) {
            options = options.last_modified_time(t);
        }
        let name = |dir| scope.name(&e.path, dir).to_string_lossy().into_owned();
        match e.kind {
            Kind::Dir => {
                stats.dirs += 1;
                zip.add_directory(name(true), options).map_err(zip_err)
            }
            Kind::Symlink => {
                stats.symlinks += 1;
                let target = String::from_utf8_lossy(&e.target).into_owned();
                zip.add_symlink(name(false), target, options)
                    .map_err(zip_err)
            }
            Kind::File => {
                stats.files += 1;
                let options = options.large_file(e.size >= u64::from(u32::MAX));
                zip.start_file(name(false), options).map_err(zip_err)?;
                let mut data = Exact {
                    inner: bytes,
                    left: e.size,
                    path: &e.path,
                };
                io::copy(&mut data, zip)
                    .map(drop)
                    .map_err(|e| archive_err(e, "zip archive"))
            }
            Kind::Hardlink => {
                self.left_out[0] += 1;
                Ok(())
            }
            Kind::Fifo | Kind::CharDevice | Kind::BlockDevice => {
                self.left_out[1] += 1;
                Ok(())
            }
            Kind::Gap => Ok(()),
        }
    }

    fn finish(&mut self, stats: &mut TreeRestoreStats) -> Result<()> {
        for (n, what) in self.left_out.iter().zip([
            "hard link(s) left out: zip has no hard links (the file is there by its first name)",
            "FIFO(s) and device(s) left out: zip has none",
        ]) {
            if *n > 0 {
                stats.notes.push(format!("{n} {what}"));
            }
        }
        match self.zip.take() {
            Some(mut zip) => {
                // What was left out, said in the archive too (its comment:
                // `unzip -z`), as the headers are sent before it is known.
                if !stats.notes.is_empty() {
                    let comment = format!("tessera: {}", stats.notes.join("; "));
                    zip.set_comment(comment).map_err(zip_err)?;
                }
                zip.finish().map(drop).map_err(zip_err)
            }
            None => Ok(()),
        }
    }
}
