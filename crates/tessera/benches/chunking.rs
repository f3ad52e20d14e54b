//! Serial against parallel chunking of one large in-memory buffer.
//!
//! Run with `cargo bench -p tessera --bench chunking`. Each run times, on the
//! same random data and the default chunker (FastCDC 2 / 8 / 64 KiB):
//!
//! * **serial**: `cut_all` over the whole buffer on one thread;
//! * **parallel/2**: `cut_parallel` with 2 segments;
//! * **parallel/N**: `cut_parallel` with rayon's thread count (N) segments.
//!
//! and checks that all three give the same chunks. The three are interleaved
//! within each run, so load from elsewhere on the machine affects them alike;
//! the output is the median throughput of each over the runs and the ratio
//! of each parallel median to the serial one (the target: ≥ 1.7 on
//! 2 cores).
//!
//! Options: `CHUNKING_BENCH_RUNS` (default 5), `CHUNKING_BENCH_MIB` (default 256).

#[path = "util/mod.rs"]
mod util;
use std::time::{Duration, Instant};
use tessera::chunker::{cut_all, cut_parallel, Chunker, ChunkerParams};
use util::{cpu_seconds, env_num, median, random_bytes};

fn mb_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / 1e6 / t.as_secs_f64().max(1e-9)
}

/// One variant: a name and how to cut the whole buffer.
struct Variant {
    name: String,
    segments: usize,
    mb_s: Vec<f64>,
    cpu: Vec<f64>,
}

/// Cuts all of `data` with `segments` (0: serial `cut_all`); returns the
/// lengths, wall time and CPU seconds.
fn run(chunker: &dyn Chunker, data: &[u8], segments: usize) -> (Vec<u32>, Duration, f64) {
    let mut lengths = Vec::with_capacity(data.len() / 4096);
    let cpu = cpu_seconds();
    let t = Instant::now();
    let used = if segments == 0 {
        cut_all(chunker, data, true, &mut lengths)
    } else {
        cut_parallel(chunker, data, true, segments, &mut lengths)
    };
    let elapsed = t.elapsed();
    let cpu = cpu_seconds() - cpu;
    assert_eq!(used, data.len());
    (std::hint::black_box(lengths), elapsed, cpu)
}

fn main() {
    let runs = env_num("CHUNKING_BENCH_RUNS", 5);
    let mib = env_num("CHUNKING_BENCH_MIB", 256);
    let threads = rayon::current_num_threads();
    let params = ChunkerParams::default();
    let chunker = params.build().expect("default chunker");
    let data = random_bytes(mib << 20, 42);
    println!(
        "chunking {mib} MiB of random data, {:?} {}/{}/{} bytes, {runs} runs, {threads} rayon threads, {} CPUs",
        params.kind,
        params.min_size,
        params.avg_size,
        params.max_size,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );

    let mut variants = vec![
        Variant {
            name: "serial cut_all".into(),
            segments: 0,
            mb_s: Vec::new(),
            cpu: Vec::new(),
        },
        Variant {
            name: "cut_parallel/2".into(),
            segments: 2,
            mb_s: Vec::new(),
            cpu: Vec::new(),
        },
    ];
    if threads != 2 {
        variants.push(Variant {
            name: format!("cut_parallel/{threads}"),
            segments: threads,
            mb_s: Vec::new(),
            cpu: Vec::new(),
        });
    }

    // Reference chunks; also warms up the rayon pool and the page tables.
    let (expected, _, _) = run(chunker.as_ref(), &data, 0);
    let _ = run(chunker.as_ref(), &data, 2);

    for r in 0..runs {
        let mut line = format!("run {r}:");
        // Rotate the order so that no variant always runs first.
        let n = variants.len();
        for k in 0..n {
            let v = &mut variants[(r + k) % n];
            let (lengths, t, cpu) = run(chunker.as_ref(), &data, v.segments);
            assert!(lengths == expected, "{} cut different chunks", v.name);
            v.mb_s.push(mb_s(data.len(), t));
            v.cpu.push(cpu);
        }
        for v in &variants {
            line += &format!(
                " {} {:.0} MB/s ({:.2} CPU s) |",
                v.name, v.mb_s[r], v.cpu[r]
            );
        }
        println!("{}", line.trim_end_matches(" |"));
    }

    let serial = median(variants[0].mb_s.clone());
    println!("median over {runs} runs ({} chunks):", expected.len());
    for v in &variants {
        let m = median(v.mb_s.clone());
        let per_run: Vec<f64> = v
            .mb_s
            .iter()
            .zip(&variants[0].mb_s)
            .map(|(p, s)| p / s)
            .collect();
        println!(
            "  {:<16} {:>7.0} MB/s  {:.2} CPU s  ratio to serial {:.2} (median per-run ratio {:.2})",
            v.name,
            m,
            median(v.cpu.clone()),
            m / serial,
            median(per_run),
        );
    }
}
