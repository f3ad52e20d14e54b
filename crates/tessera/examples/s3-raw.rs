//! Raw PUT and GET throughput of an object store through the very client
//! stack Tessera's backups and restores use (the S3 backend on OpenDAL,
//! with its retries), as the baseline of scripts/s3-benchmark.sh:
//!
//! ```text
//! cargo run --release -p tessera --example s3-raw -- LOCATION TOTAL_MIB OBJECT_MIB PUT_THREADS GET_THREADS
//! ```
//!
//! writes TOTAL_MIB of incompressible data as OBJECT_MIB objects below
//! LOCATION (created once each, as containers are) from PUT_THREADS
//! threads, reads them back whole from GET_THREADS threads (as a restore
//! reads containers: `read_shared`), deletes them, and prints
//! `put MB/s CPU` and `get MB/s CPU` (1 MB = 10^6 bytes; CPU: the
//! process's processor seconds, user and system, per GiB moved) on two
//! lines. A thread count of 0 is the store's default `--connections`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use tessera::backend::Location;

fn main() {
    if let Err(e) = run() {
        eprintln!("s3-raw: error: {e}");
        std::process::exit(1);
    }
}

fn arg(args: &[String], i: usize, what: &str) -> Result<usize, String> {
    args.get(i)
        .ok_or(format!("missing {what}"))?
        .parse()
        .map_err(|e| format!("{what}: {e}"))
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: cargo run --release -p tessera --example s3-raw -- LOCATION TOTAL_MIB OBJECT_MIB PUT_THREADS GET_THREADS";
    let location: Location = args
        .get(1)
        .ok_or(usage)?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let total = arg(&args, 2, "TOTAL_MIB")? << 20;
    let object = (arg(&args, 3, "OBJECT_MIB")? << 20).max(1);
    let backend = location.backend().map_err(|e| e.to_string())?;
    let threads = |n: usize| match n {
        0 => backend.connections().unwrap_or(1),
        n => n,
    };
    let (puts, gets) = (
        threads(arg(&args, 4, "PUT_THREADS")?),
        threads(arg(&args, 5, "GET_THREADS")?),
    );
    let count = total.div_ceil(object);
    // Distinct incompressible objects (a SplitMix64 stream per object).
    let objects: Vec<Vec<u8>> = (0..count)
        .map(|i| {
            let mut state = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (0..object.div_ceil(8))
                .flat_map(|_| {
                    state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    (z ^ (z >> 31)).to_le_bytes()
                })
                .take(object)
                .collect()
        })
        .collect();
    let key = |i: usize| format!("raw/{i:016x}");
    let bytes = (count * object) as f64;
    let put = timed(puts, count, |i| {
        backend.write_new(&key(i), &[&objects[i]]).map(|_| ())
    })?;
    let get = timed(gets, count, |i| match backend.read_shared(&key(i)) {
        Ok(data) if data.len() == object => Ok(()),
        Ok(data) => Err(tessera::Error::corrupt(
            key(i),
            format!("{} bytes", data.len()),
        )),
        Err(e) => Err(e),
    })?;
    for i in 0..count {
        backend.delete(&key(i)).map_err(|e| e.to_string())?;
    }
    let per_gib = |cpu: f64| cpu * f64::from(1u32 << 30) / bytes;
    println!("put {:.1} {:.2}", bytes / put.0 / 1e6, per_gib(put.1));
    println!("get {:.1} {:.2}", bytes / get.0 / 1e6, per_gib(get.1));
    Ok(())
}

/// Processor seconds (user and system) this process used so far.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Runs `op` for 0..count from `threads` threads; the seconds it took and
/// the processor seconds it used.
fn timed(
    threads: usize,
    count: usize,
    op: impl Fn(usize) -> tessera::Result<()> + Sync,
) -> Result<(f64, f64), String> {
    let next = AtomicUsize::new(0);
    let cpu = cpu_seconds();
    let start = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> tessera::Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            return Ok(());
                        }
                        op(i)?;
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| match w.join() {
            Ok(done) => done.map_err(|e| e.to_string()),
            Err(_) => Err("a thread panicked".to_string()),
        })
    })?;
    Ok((start.elapsed().as_secs_f64(), cpu_seconds() - cpu))
}
