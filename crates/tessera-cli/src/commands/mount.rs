//! `tessera mount`: its arguments, and the FUSE adapter of [`tessera::commands::mount::MountedRepo`]
//! (names, attributes and verified bytes come from the library; this only
//! speaks the FUSE protocol through `fuser`), and the mount's lifetime:
//! mounted in the foreground until `umount`, SIGINT, SIGTERM or SIGHUP,
//! then unmounted.

use anyhow::{bail, Context, Result};
use clap::Args;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, Request, Session,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tessera::backend::{Location, LockMode};
use tessera::commands::mount::{Attr, MountedRepo, NodeKind};
use tessera::parse_size;

use crate::progress::summary_err;
use crate::repo_open::open;
use crate::secrets::Access;

/// The arguments of `tessera mount`.
#[derive(Args)]
pub struct MountArgs {
    /// The repository.
    repo: Location,
    /// An existing directory to mount on.
    mountpoint: PathBuf,
    /// Memory for decoded chunks (e.g. `64MiB`).
    #[arg(long, value_name = "SIZE", default_value = "64MiB")]
    cache: String,
}

/// Runs `tessera mount`.
pub fn run(args: MountArgs, access: &Access) -> Result<ExitCode> {
    let MountArgs {
        repo,
        mountpoint,
        cache,
    } = args;
    // The key derivation's lanes (and parallel reads) run on rayon's pool,
    // started before `serve` blocks the termination signals: its threads
    // block them too, or SIGTERM would kill the process in one of them
    // instead of reaching the thread that waits for it and unmounts.
    let _ = rayon::ThreadPoolBuilder::new()
        .start_handler(|_| {
            let _ = block_signals();
        })
        .build_global();
    let r = open(&repo, LockMode::Read, access)?;
    let cache = parse_size(&cache).map_err(|e| anyhow::anyhow!("--cache: {e}"))?;
    let fs = MountedRepo::new(r, cache)?;
    serve(fs, &mountpoint, || {
        summary_err!(
            "mounted {} at {}; `umount {}` or Ctrl-C unmounts",
            repo,
            mountpoint.display(),
            mountpoint.display()
        )
    })?;
    Ok(ExitCode::SUCCESS)
}

/// How long the kernel may cache names and attributes (backups never change).
const TTL: Duration = Duration::from_secs(60);

/// A directory listing taken at `opendir`: (inode, kind, name).
type Listing = Vec<(u64, FileType, Vec<u8>)>;

struct Fs {
    repo: MountedRepo,
    listings: Mutex<HashMap<u64, Listing>>,
    next_handle: AtomicU64,
}

fn time(secs: i64, nanos: u32) -> SystemTime {
    let whole = Duration::from_secs(secs.unsigned_abs());
    let t = if secs >= 0 {
        UNIX_EPOCH + whole
    } else {
        UNIX_EPOCH - whole
    };
    t + Duration::from_nanos(u64::from(nanos.min(999_999_999)))
}

fn kind(k: NodeKind) -> FileType {
    match k {
        NodeKind::Dir => FileType::Directory,
        NodeKind::File => FileType::RegularFile,
        NodeKind::Symlink => FileType::Symlink,
        NodeKind::Fifo => FileType::NamedPipe,
        NodeKind::CharDevice => FileType::CharDevice,
        NodeKind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    let mtime = time(a.mtime.0, a.mtime.1);
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: mtime,
        mtime,
        ctime: time(a.ctime.0, a.ctime.1),
        crtime: mtime,
        kind: kind(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: if a.kind == NodeKind::Dir { 2 } else { 1 },
        uid: a.uid,
        gid: a.gid,
        // Truncated to the kernel's 32-bit device number; the mount is `nodev`.
        rdev: a.rdev as u32,
        flags: 0,
        blksize: 4096,
    }
}

impl Fs {
    /// `result`'s value, or EIO with the error printed (ENOENT when absent).
    fn ok<T>(&self, what: &str, result: tessera::Result<Option<T>>) -> Result<T, Errno> {
        match result {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(Errno::ENOENT),
            Err(e) => {
                eprintln!("tessera mount: {what}: {e}");
                Err(Errno::EIO)
            }
        }
    }
}

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let what = format!("looking up {}", name.to_string_lossy());
        match self.ok(&what, self.repo.lookup(parent.0, name.as_bytes())) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.ok("reading attributes", self.repo.getattr(ino.0)) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.ok("reading a symbolic link", self.repo.readlink(ino.0)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.ok("reading a file", self.repo.read(ino.0, offset, size)) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let entries = match self.ok("listing a directory", self.repo.readdir(ino.0)) {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        let mut listing: Listing = vec![
            (ino.0, FileType::Directory, b".".to_vec()),
            (ino.0, FileType::Directory, b"..".to_vec()),
        ];
        listing.extend(entries.into_iter().map(|(n, a)| (a.ino, kind(a.kind), n)));
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.listings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, listing);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listings = self.listings.lock().unwrap_or_else(|e| e.into_inner());
        let Some(listing) = listings.get(&fh.0) else {
            return reply.error(Errno::EIO);
        };
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, k, name)) in listing.iter().enumerate().skip(skip) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *k, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.listings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }
}

/// What ended the mount.
enum Event {
    Signal(i32),
    Ended(std::io::Result<()>),
}

/// Blocks the termination signals in this thread and the threads it
/// starts; returns the set, for `sigwait`.
fn block_signals() -> Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use;
    // pthread_sigmask only reads the set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            bail!(
                "blocking signals: {}",
                std::io::Error::from_raw_os_error(rc)
            );
        }
        Ok(set)
    }
}

/// Mounts `repo` at `mountpoint` and serves it until it is unmounted
/// (`umount MOUNTPOINT`) or the process gets SIGINT, SIGTERM or SIGHUP, on
/// which it unmounts. `ready` is called once the file system is mounted.
pub fn serve(repo: MountedRepo, mountpoint: &Path, ready: impl FnOnce()) -> Result<()> {
    let set = block_signals()?;
    let fs = Fs {
        repo,
        listings: Mutex::new(HashMap::new()),
        next_handle: AtomicU64::new(1),
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
        MountOption::FSName("tessera".into()),
        MountOption::Subtype("tessera".into()),
    ];
    let mut session = Session::new(fs, mountpoint, &config).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                " (mounting needs root, or a fusermount3 helper for other users)"
            }
            Some(libc::ENOENT) | Some(libc::ENODEV) => " (is /dev/fuse available?)",
            _ => "",
        };
        anyhow::anyhow!("mounting at {}: {e}{hint}", mountpoint.display())
    })?;
    let mut unmounter = session.unmount_callable();
    let (tx, rx) = mpsc::channel();
    let signals = tx.clone();
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: `set` is an initialised signal set; `sig` a valid out pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            let _ = signals.send(Event::Signal(sig));
        }
    });
    let serving = std::thread::spawn(move || {
        let _ = tx.send(Event::Ended(session.run()));
    });
    ready();
    let ended = match rx.recv().context("waiting for the mount to end")? {
        Event::Signal(sig) => {
            eprintln!("signal {sig}: unmounting {}", mountpoint.display());
            unmounter
                .unmount()
                .with_context(|| format!("unmounting {}", mountpoint.display()))?;
            loop {
                match rx.recv() {
                    Ok(Event::Ended(r)) => break r,
                    Ok(Event::Signal(_)) => continue,
                    Err(_) => break Ok(()),
                }
            }
        }
        Event::Ended(r) => r,
    };
    let _ = serving.join();
    ended.with_context(|| format!("serving the mount at {}", mountpoint.display()))
}
