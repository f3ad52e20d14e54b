//! Helpers shared by the command-line end-to-end tests: running the binary,
//! deterministic pseudo-random data, streaming comparisons and edits.

#![allow(dead_code)]

use rand::rngs::{SmallRng, StdRng};
use rand::{Rng, RngCore, SeedableRng};
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The `tessera` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tessera")
}

/// A `tessera` command with `args`.
pub fn cmd<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    cmd_of(Path::new(bin()), args)
}

/// A command running `program` (a copy of the `tessera` binary) with `args`
/// and the test environment.
pub fn cmd_of<I, S>(program: &Path, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = Command::new(program);
    c.args(args);
    // Repositories are encrypted by default: every command gets the test
    // password, and new keys cheap key derivation so that tests stay fast
    // (below the minimum a real key needs, hence TESSERA_INSECURE_KDF).
    c.env("TESSERA_PASSWORD", TEST_PASSWORD)
        .env("TESSERA_KDF_MEMORY", "64")
        .env("TESSERA_KDF_ITERATIONS", "1")
        .env("TESSERA_INSECURE_KDF", "1")
        .env_remove("TESSERA_NEW_PASSWORD")
        // The per-user cache (object stores' metadata, the last check's
        // record) in the build's scratch directory, not the user's.
        .env(
            "XDG_CACHE_HOME",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("xdg-cache"),
        );
    c
}

/// The password every command of the tests gets (`TESSERA_PASSWORD`).
pub const TEST_PASSWORD: &str = "correct horse battery staple";

/// Runs `tessera` with `args` and returns its output.
pub fn run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    cmd(args)
        .stdin(Stdio::null())
        .output()
        .expect("running tessera")
}

fn describe(args: &[String], out: &Output) -> String {
    format!(
        "tessera {}: {}\nstdout: {}\nstderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn strings<I, S>(args: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    args.into_iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect()
}

/// Runs `tessera` with `args` and the file `input` on standard input
/// (`backup REPO -`: a stream backup of the file's bytes; a path would make
/// a tree backup of the file) and returns its output.
pub fn run_with_input<I, S>(args: I, input: &Path) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    cmd(args)
        .stdin(File::open(input).expect("opening the input"))
        .output()
        .expect("running tessera")
}

/// [`run_with_input`], asserting success; returns stdout.
pub fn ok_with_input<I, S>(args: I, input: &Path) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let args = strings(args);
    let out = run_with_input(&args, input);
    assert!(out.status.success(), "{}", describe(&args, &out));
    assert_no_panic(&out);
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Runs `tessera` with `args`, asserts success and returns stdout.
pub fn ok<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let args = strings(args);
    let out = run(&args);
    assert!(out.status.success(), "{}", describe(&args, &out));
    assert_no_panic(&out);
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Asserts that a failed run printed exactly one `tessera: error:` line on
/// stderr, exited non-zero and did not panic; returns that line.
pub fn assert_one_line_error(args: &[String], out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected failure: {}",
        describe(args, out)
    );
    assert_no_panic(out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one stderr line: {}",
        describe(args, out)
    );
    assert!(
        lines[0].starts_with("tessera: error: "),
        "stderr does not start with `tessera: error:`: {}",
        describe(args, out)
    );
    lines[0].to_string()
}

/// Runs `tessera` with `args`, asserts a one-line error and returns the line.
pub fn fail<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let args = strings(args);
    let out = run(&args);
    assert_one_line_error(&args, &out)
}

/// Asserts that neither output stream mentions a panic.
pub fn assert_no_panic(out: &Output) {
    for stream in [&out.stdout, &out.stderr] {
        let text = String::from_utf8_lossy(stream);
        assert!(!text.contains("panicked"), "panic in output: {text}");
    }
}

/// `tessera init` of `path` with default options (encrypted, with
/// [`TEST_PASSWORD`]).
pub fn init(path: &Path) {
    ok(["init".as_ref(), path.as_os_str()]);
}

/// `tessera init --encryption none` of `path`: for tests of the unencrypted
/// format's own checksums.
pub fn init_plain(path: &Path) {
    ok([
        "init".as_ref(),
        path.as_os_str(),
        "--encryption".as_ref(),
        "none".as_ref(),
    ]);
}

/// `tessera backup --json REPO - < INPUT` (a stream backup of the file's
/// bytes), parsed.
pub fn backup_json(repo: &Path, input: &Path) -> serde_json::Value {
    let out = ok_with_input(
        [
            "backup".as_ref(),
            "--json".as_ref(),
            repo.as_os_str(),
            "-".as_ref(),
        ],
        input,
    );
    serde_json::from_str(out.trim()).expect("backup --json prints JSON")
}

/// A numeric field of a JSON object.
pub fn num(v: &serde_json::Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("field {field} missing or not a number in {v}"))
}

/// Ids of the committed backups (`tessera list --json`) of `repo` (a
/// path or a location).
pub fn list_ids(repo: impl AsRef<OsStr>) -> Vec<u64> {
    let out = ok(["list".as_ref(), "--json".as_ref(), repo.as_ref()]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("list --json prints JSON");
    v.as_array()
        .expect("list --json prints an array")
        .iter()
        .map(|s| num(s, "id"))
        .collect()
}

/// `text` (a command's `--json` output) parsed.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `tessera init REPO ARGS…`.
pub fn init_with(repo: &Path, args: &[&str]) {
    let mut all: Vec<&OsStr> = vec!["init".as_ref(), repo.as_os_str()];
    all.extend(args.iter().map(OsStr::new));
    ok(all);
}

/// `tessera init REPO --layout LAYOUT`.
pub fn init_layout(repo: &Path, layout: &str) {
    init_with(repo, &["--layout", layout]);
}

/// `tessera backup REPO PATH` (a tree backup); its text output.
pub fn backup_tree(repo: &Path, path: &Path) -> String {
    ok(["backup".as_ref(), repo.as_os_str(), path.as_os_str()])
}

/// The names in directory `dir`, sorted.
pub fn sorted_names(dir: &Path) -> Vec<OsString> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    v.sort();
    v
}

/// Spawns `tessera backup --json REPO - ARGS…` with its standard streams
/// piped: the caller feeds standard input.
pub fn spawn_stream_backup(repo: &Path, args: &[&str]) -> std::process::Child {
    let mut all: Vec<&OsStr> = vec![
        "backup".as_ref(),
        "--json".as_ref(),
        repo.as_os_str(),
        "-".as_ref(),
    ];
    all.extend(args.iter().map(OsStr::new));
    cmd(all)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts `tessera ARGS… backup --json REPO -` and feeds it `first` bytes,
/// keeping its standard input open: a backup in progress.
pub fn start_backup_with(args: &[&str], repo: &str, first: &[u8]) -> std::process::Child {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["backup", "--json", repo, "-"]);
    let mut child = cmd(all)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tessera backup");
    let stdin = child.stdin.as_mut().expect("piped stdin");
    stdin.write_all(first).expect("feeding the backup");
    stdin.flush().expect("feeding the backup");
    child
}

/// Names of the container objects of `repo` (without hidden temporary files).
pub fn containers(repo: &Path) -> BTreeSet<String> {
    match std::fs::read_dir(repo.join("containers")) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect(),
        Err(_) => BTreeSet::new(),
    }
}

/// A deterministic pseudo-random byte stream of `len` bytes. The generator
/// is drawn in fixed blocks, so the stream does not depend on read sizes.
pub struct PrngReader {
    rng: SmallRng,
    block: Vec<u8>,
    pos: usize,
    remaining: u64,
}

impl PrngReader {
    /// The stream of `seed`, `len` bytes long.
    pub fn new(seed: u64, len: u64) -> Self {
        PrngReader {
            rng: SmallRng::seed_from_u64(seed),
            block: vec![0u8; 1 << 16],
            pos: 1 << 16,
            remaining: len,
        }
    }
}

impl Read for PrngReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        if self.pos == self.block.len() {
            self.rng.fill_bytes(&mut self.block);
            self.pos = 0;
        }
        let n = buf
            .len()
            .min(self.block.len() - self.pos)
            .min(self.remaining.min(usize::MAX as u64) as usize);
        buf[..n].copy_from_slice(&self.block[self.pos..self.pos + n]);
        self.pos += n;
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// `len` pseudo-random bytes of `seed` (the start of the stream of `seed`).
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    PrngReader::new(seed, len as u64)
        .read_to_end(&mut v)
        .unwrap();
    v
}

/// Writes the stream of `seed` (`len` bytes) to `path`.
pub fn write_random_file(path: &Path, seed: u64, len: u64) {
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path).unwrap());
    io::copy(&mut PrngReader::new(seed, len), &mut w).unwrap();
    w.flush().unwrap();
}

/// Reads exactly `buf.len()` bytes unless the stream ends; returns the count.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Compares two streams without holding either whole; returns the offset of
/// the first difference (or of the end of the shorter stream), or `None`
/// when they are identical.
pub fn first_difference(a: &mut dyn Read, b: &mut dyn Read) -> Option<u64> {
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    loop {
        let na = read_full(a, &mut ba).unwrap();
        let nb = read_full(b, &mut bb).unwrap();
        let common = na.min(nb);
        if ba[..common] != bb[..common] {
            let i = (0..common).find(|&i| ba[i] != bb[i]).unwrap_or(0);
            return Some(offset + i as u64);
        }
        if na != nb {
            return Some(offset + common as u64);
        }
        if na == 0 {
            return None;
        }
        offset += na as u64;
    }
}

/// Asserts that file `path` holds exactly `expected`.
pub fn assert_file_eq(path: &Path, expected: &[u8]) {
    let got = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert_eq!(
        got.len(),
        expected.len(),
        "{}: length differs",
        path.display()
    );
    assert!(got == expected, "{}: content differs", path.display());
}

/// Asserts that file `path` holds exactly the stream `expected`.
pub fn assert_file_matches(path: &Path, expected: &mut dyn Read) {
    let mut f = BufReader::new(File::open(path).unwrap());
    assert_eq!(
        first_difference(&mut f, expected),
        None,
        "{} differs from the expected stream",
        path.display()
    );
}

/// `tessera restore REPO ID OUT` into a new file of `dir`; returns its path.
pub fn restore_to_file(repo: &Path, id: u64, dir: &Path) -> PathBuf {
    let out = dir.join(format!("restored-{id}"));
    let _ = std::fs::remove_file(&out);
    ok([
        "restore".as_ref(),
        repo.as_os_str(),
        id.to_string().as_ref(),
        out.as_os_str(),
    ]);
    out
}

/// Restores backup `id` to standard output and compares the stream with
/// `expected` as it arrives; asserts both success and equality.
pub fn assert_restore_stdout_matches(repo: &Path, id: &str, expected: &mut dyn Read) {
    let mut child = cmd([
        "restore".as_ref(),
        repo.as_os_str(),
        id.as_ref(),
        "-".as_ref(),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        BufReader::new(stderr).read_to_string(&mut s).unwrap();
        s
    });
    let diff = first_difference(
        &mut BufReader::with_capacity(1 << 20, &mut stdout),
        expected,
    );
    // Drain whatever is left so the child never blocks on a full pipe.
    io::copy(&mut stdout, &mut io::sink()).unwrap();
    let status = child.wait().unwrap();
    let stderr = err_reader.join().unwrap();
    assert!(
        status.success(),
        "restore {id} to stdout failed: {status}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        diff, None,
        "restore of {id} to stdout differs from the input"
    );
}

/// Applies one random edit (insertion, deletion or overwrite of up to
/// `max_len` bytes) to `data`; returns its kind.
pub fn random_edit(rng: &mut StdRng, data: &mut Vec<u8>, max_len: usize) -> &'static str {
    let len = rng.random_range(1..=max_len);
    let pos = rng.random_range(0..=data.len());
    match rng.random_range(0..3) {
        0 => {
            let mut new = vec![0u8; len];
            rng.fill_bytes(&mut new);
            data.splice(pos..pos, new);
            "insert"
        }
        1 if !data.is_empty() => {
            let end = (pos + len).min(data.len());
            let pos = pos.min(end);
            data.drain(pos..end);
            "delete"
        }
        _ => {
            let end = (pos + len).min(data.len());
            let pos = pos.min(end);
            rng.fill_bytes(&mut data[pos..end]);
            "overwrite"
        }
    }
}

/// A seeded generator for edits.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Entries of `dir` (names), to prove no stray output was left.
pub fn dir_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}
