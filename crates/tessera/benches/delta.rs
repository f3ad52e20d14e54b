//! Hash-less delta encoding against the Edelta-style encoder on similar
//! chunks whose differences sit at the same positions.
//!
//! Run with `cargo bench -p tessera --bench delta`. The data are pairs of
//! 8 KiB chunks: a random base and a target with a few small edits in place
//! (a changed 16-byte metadata header and two changed bytes elsewhere), the
//! pairs hash-less encoding is meant for. Each run times, over all pairs:
//!
//! * **hash-less** and **edelta**: encoding with each encoder, forced;
//! * **decode** of each encoder's deltas.
//!
//! The four are interleaved within each run, in a rotating order. The output
//! is the mean delta size of each encoder and, for two working sets, the
//! median throughput (target bytes / s) of each task over the runs and the
//! ratio hash-less / edelta (the target: ≥ 2). The working sets are
//! all pairs (64 MiB by default: beyond the caches, so hash-less encoding,
//! one pass over both chunks, runs at memory bandwidth) and the first 64
//! pairs (1 MiB, cache-resident like a target just fingerprinted), repeated
//! to process as many bytes.
//!
//! A last section prices similarity detection, which PFC-delta adds for every
//! chunk it stores: Odess super-features of the targets against the two
//! per-byte stages every backup runs over the same bytes, serial chunking
//! (the default FastCDC, over the targets laid end to end) and BLAKE3
//! fingerprints of the targets; interleaved the same way, with the medians
//! and the ratios of features to each.
//!
//! Options: `DELTA_BENCH_RUNS` (default 5), `DELTA_BENCH_PAIRS` (default 4000).

#[path = "util/mod.rs"]
mod util;
use std::hint::black_box;
use std::time::Instant;
use tessera::chunker::{cut_all, Chunker, ChunkerParams};
use tessera::delta::features::{super_features, FeatureKind};
use tessera::delta::{decode, encode, encode_with, Method};
use tessera::FingerprintAlgo;
use util::{env_num, median, random_bytes};

const CHUNK: usize = 8192;

/// A base chunk and a target with a new 16-byte header near the start and
/// two changed bytes at random positions.
fn pair(seed: u64) -> (Vec<u8>, Vec<u8>) {
    let base = random_bytes(CHUNK, seed);
    let mut target = base.clone();
    let r = random_bytes(24, !seed);
    let at = |i: usize| usize::from(u16::from_le_bytes([r[i], r[i + 1]])) % CHUNK;
    target[64..80].copy_from_slice(&r[..16]);
    target[at(16)] ^= 0x01;
    target[at(18)] ^= 0x80;
    (base, target)
}

/// Encoding and decoding times of `pairs`, whose deltas by each encoder
/// are `deltas`; each timed pass goes over the pairs `repeat` times.
struct Set<'a> {
    label: String,
    pairs: &'a [(Vec<u8>, Vec<u8>)],
    deltas: [&'a [Vec<u8>]; 2],
    repeat: usize,
}

const METHODS: [Method; 2] = [Method::HashLess, Method::Edelta];
const TASKS: [&str; 4] = ["hash-less", "edelta", "decode hash-less", "decode edelta"];

impl Set<'_> {
    /// MB/s of target bytes of task `task` (an index into [`TASKS`]).
    fn time(&self, task: usize) -> f64 {
        let t = Instant::now();
        for _ in 0..self.repeat {
            if task < 2 {
                for (b, t) in self.pairs {
                    black_box(encode_with(METHODS[task], black_box(b), black_box(t)));
                }
            } else {
                for ((b, _), d) in self.pairs.iter().zip(self.deltas[task - 2]) {
                    black_box(decode(black_box(b), black_box(d)).ok());
                }
            }
        }
        let bytes = self.repeat * self.pairs.len() * CHUNK;
        bytes as f64 / 1e6 / t.elapsed().as_secs_f64().max(1e-9)
    }

    /// Runs the tasks and prints their throughput and the encoders' ratio.
    fn report(&self, runs: usize) {
        println!("{}:", self.label);
        let mb_s = interleaved(&TASKS, runs, |task| self.time(task));
        let med: Vec<f64> = mb_s.iter().map(|v| median(v.clone())).collect();
        let per_run: Vec<f64> = mb_s[0].iter().zip(&mb_s[1]).map(|(h, e)| h / e).collect();
        println!(
            "  hash-less / edelta encoding: {:.2} (median per-run ratio {:.2})",
            med[0] / med[1],
            median(per_run)
        );
    }
}

/// Times each of the tasks `names` (by index, with `time`, in MB/s) `runs`
/// times, interleaved in a rotating order so that load from elsewhere on the
/// machine affects them alike; prints each run and the medians, and returns
/// every run's figure per task.
fn interleaved(names: &[&str], runs: usize, mut time: impl FnMut(usize) -> f64) -> Vec<Vec<f64>> {
    let mut mb_s = vec![Vec::new(); names.len()];
    for r in 0..runs {
        for k in 0..names.len() {
            let task = (r + k) % names.len();
            mb_s[task].push(time(task));
        }
        let line: Vec<String> = names
            .iter()
            .zip(&mb_s)
            .map(|(name, v)| format!("{name} {:.0} MB/s", v[r]))
            .collect();
        println!("  run {r}: {}", line.join(" | "));
    }
    for (name, v) in names.iter().zip(&mb_s) {
        println!("  median {name:<17} {:>8.0} MB/s", median(v.clone()));
    }
    mb_s
}

fn main() {
    let runs = env_num("DELTA_BENCH_RUNS", 5);
    let n = env_num("DELTA_BENCH_PAIRS", 4000);
    let pairs: Vec<_> = (0..n as u64).map(pair).collect();

    // Check the setup: the pairs are hash-less pairs, both encoders round-trip.
    let chosen = pairs
        .iter()
        .filter(|(b, t)| encode(b, t).method == Method::HashLess)
        .count();
    let deltas = METHODS
        .map(|m| -> Vec<Vec<u8>> { pairs.iter().map(|(b, t)| encode_with(m, b, t)).collect() });
    for d in &deltas {
        for ((b, t), d) in pairs.iter().zip(d) {
            assert_eq!(&decode(b, d).expect("delta decodes"), t);
        }
    }
    println!(
        "delta: {n} pairs of {CHUNK}-byte chunks (16-byte header + 2 bytes changed in place), {runs} runs; encode() chose hash-less for {chosen}/{n}"
    );
    for (m, d) in METHODS.iter().zip(&deltas) {
        let mean = d.iter().map(Vec::len).sum::<usize>() as f64 / n as f64;
        println!("mean delta size {m:?}: {mean:.1} bytes");
    }

    let warm = n.min(64);
    let sets = [
        Set {
            label: format!("all {n} pairs ({} MiB)", (2 * n * CHUNK) >> 20),
            pairs: &pairs,
            deltas: [&deltas[0], &deltas[1]],
            repeat: 1,
        },
        Set {
            label: format!("first {warm} pairs in cache, {}x each", n / warm),
            pairs: &pairs[..warm],
            deltas: [&deltas[0][..warm], &deltas[1][..warm]],
            repeat: n / warm,
        },
    ];
    for set in &sets {
        set.report(runs);
    }
    let targets: Vec<&[u8]> = pairs.iter().map(|(_, t)| t.as_slice()).collect();
    report_features(&targets, runs);
}

const STAGES: [&str; 3] = ["odess features", "chunking", "blake3"];

/// The bytes of similarity detection's benchmark: chunks, and the same bytes
/// laid end to end for the chunker.
struct Detection<'a> {
    chunks: &'a [&'a [u8]],
    stream: Vec<u8>,
    chunker: Box<dyn Chunker>,
    lengths: Vec<u32>,
}

/// MB/s of stage `stage` (an index into [`STAGES`]) over the bytes of `d`.
fn time_stage(stage: usize, d: &mut Detection) -> f64 {
    let (chunks, stream) = (d.chunks, &d.stream);
    let t = Instant::now();
    match stage {
        0 => {
            for c in chunks {
                black_box(super_features(FeatureKind::Odess, black_box(c)));
            }
        }
        1 => {
            d.lengths.clear();
            black_box(cut_all(
                d.chunker.as_ref(),
                black_box(stream),
                true,
                &mut d.lengths,
            ));
        }
        _ => {
            for c in chunks {
                black_box(FingerprintAlgo::Blake3.hash(black_box(c)));
            }
        }
    }
    stream.len() as f64 / 1e6 / t.elapsed().as_secs_f64().max(1e-9)
}

/// Times the super-features of `chunks` against chunking and fingerprinting
/// the same bytes, `runs` times interleaved, and prints the medians and ratios.
fn report_features(chunks: &[&[u8]], runs: usize) {
    let mut d = Detection {
        chunks,
        stream: chunks.concat(),
        chunker: ChunkerParams::default().build().expect("default chunker"),
        lengths: Vec::new(),
    };
    println!(
        "similarity detection: {} chunks ({} MiB), one thread:",
        chunks.len(),
        d.stream.len() >> 20
    );
    let mb_s = interleaved(&STAGES, runs, |stage| time_stage(stage, &mut d));
    let med: Vec<f64> = mb_s.iter().map(|v| median(v.clone())).collect();
    // Seconds per byte of features against those of chunking and hashing together.
    let cost = (1.0 / med[0]) / (1.0 / med[1] + 1.0 / med[2]);
    println!(
        "  features / chunking: {:.2}, features / blake3: {:.2}; a byte featured costs {:.2}x a byte chunked and hashed",
        med[0] / med[1],
        med[0] / med[2],
        cost
    );
}
