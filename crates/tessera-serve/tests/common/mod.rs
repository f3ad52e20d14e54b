//! A repository made with the engine, and a server on it (port 0).

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use tessera::backup::BackupOptions;
use tessera::backup::{backup, Input, TreeBackupOptions};
use tessera::repo::config::{Config, Layout};
use tessera::Repository;
use tessera_serve::{Options, Server};

/// Entries of the big directory `many/`.
pub const MANY: usize = 5000;

/// A served repository: its temporary directory, the backed-up source,
/// the server's base URL (`http://127.0.0.1:PORT`) and token.
pub struct Served {
    pub dir: tempfile::TempDir,
    pub src: PathBuf,
    pub base: String,
    pub token: String,
    pub url: String,
}

impl Served {
    /// The API path of `p` under the backed-up source (`/tmp/…/src/p`).
    pub fn path(&self, p: &str) -> String {
        format!("{}/{p}", self.src.display())
    }
}

/// Bytes that do not repeat (so they are not all one chunk).
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// Two tree backups of a source with `a.txt`, `docs/big.bin` (3 MiB),
/// `docs/deep/x/y/z.txt` and `many/` (`MANY` files); the second changes
/// `a.txt` and adds `new.txt`. Then a server on it.
pub fn served() -> Served {
    served_in(Layout::Container)
}

/// [`served`], in a repository of `layout`.
pub fn served_in(layout: Layout) -> Served {
    served_with(layout, &Options::default())
}

/// [`served`], in a repository of `layout`, with write access (not
/// `--read-only`).
pub fn served_writable(layout: Layout) -> Served {
    let options = Options {
        read_only: false,
        ..Options::default()
    };
    served_with(layout, &options)
}

/// [`served`], in a repository of `layout`, the server run with `options`.
pub fn served_with(layout: Layout, server: &Options) -> Served {
    served_full(layout, server, false)
}

/// [`served`] with also `odd/`: a file named with byte 0xff, a directory
/// named with byte 0xfe holding `in.txt`, a symbolic link `link` to
/// `../a.txt` and a FIFO `fifo` (in both backups).
pub fn served_odd(server: &Options) -> Served {
    served_full(Layout::Container, server, true)
}

/// The bytes of `odd/\xff.bin`.
pub const ODD_BYTES: &[u8] = b"not UTF-8, still a file\n";

fn odd_entries(src: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let odd = src.join("odd");
    write(
        &odd.join(std::ffi::OsStr::from_bytes(b"\xff.bin")),
        ODD_BYTES,
    );
    write(
        &odd.join(std::ffi::OsStr::from_bytes(b"dir\xfe"))
            .join("in.txt"),
        b"inside\n",
    );
    std::os::unix::fs::symlink("../a.txt", odd.join("link")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(odd.join("fifo"))
        .status()
        .unwrap();
    assert!(made.success());
}

/// Another server on the repository of `s` (as after a restart), with
/// `options` and the last check kept where `s`'s server keeps it: its
/// base URL and token.
pub fn serve_again(s: &Served, options: &Options) -> (String, String) {
    let repo =
        Repository::open(&s.dir.path().join("repo"), tessera::backend::LockMode::Read).unwrap();
    let options = Options {
        last_check_dir: Some(s.dir.path().join("cache")),
        ..options.clone()
    };
    let server = Server::bind(repo, &options).unwrap();
    let (addr, token) = (server.addr(), server.token().to_string());
    std::thread::spawn(move || server.run());
    (format!("http://{addr}"), token)
}

fn served_full(layout: Layout, server: &Options, odd: bool) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    if odd {
        odd_entries(&src);
    }
    write(&src.join("a.txt"), b"hello, tessera\n");
    write(&src.join("docs/big.bin"), &noise(3 << 20, 7));
    write(&src.join("docs/deep/x/y/z.txt"), b"deep\n");
    for i in 0..MANY {
        write(
            &src.join(format!("many/f{i:05}")),
            format!("{i}\n").as_bytes(),
        );
    }
    let mut config = Config::new("serve-test".into());
    config.layout = layout;
    let repo = Repository::init(&dir.path().join("repo"), config).unwrap();
    let options = BackupOptions {
        source: "test".into(),
        host: "testhost".into(),
        ..BackupOptions::default()
    };
    let paths = std::slice::from_ref(&src);
    let tree = TreeBackupOptions::default();
    let back_up = || {
        let input = Input::Tree {
            paths,
            options: &tree,
        };
        backup(&repo, input, &options).unwrap()
    };
    back_up();
    write(&src.join("a.txt"), b"hello again, tessera\n");
    write(&src.join("new.txt"), b"new\n");
    back_up();
    drop(repo);
    let repo =
        Repository::open(&dir.path().join("repo"), tessera::backend::LockMode::Read).unwrap();
    // The last check is kept in the test's directory, never the user's cache.
    let server = Options {
        last_check_dir: Some(
            server
                .last_check_dir
                .clone()
                .unwrap_or_else(|| dir.path().join("cache")),
        ),
        ..server.clone()
    };
    let server = Server::bind(repo, &server).unwrap();
    let (addr, token, url) = (server.addr(), server.token().to_string(), server.url());
    std::thread::spawn(move || server.run());
    Served {
        dir,
        src,
        base: format!("http://{addr}"),
        token,
        url,
    }
}
