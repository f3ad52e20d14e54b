//! Generator speed: data mode (packed tar to a discarding sink) and trace
//! mode (chunk iteration and Destor text), in one run.
//! `cargo bench -p tessera-lab --bench gen_speed`

use std::io;
use std::time::Instant;
use tessera_lab::gen::{Dataset, GenOptions, TraceEvent};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let mut ds = Dataset::new(&GenOptions {
        versions: 10,
        size: 200 << 20,
        ..GenOptions::default()
    })?;
    let mut total = 0u64;
    while let Some((_, lineage)) = ds.next_version() {
        total += lineage.write_tar(&mut io::sink())?;
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "data:  {total} bytes in {s:.2} s = {:.0} MB/s",
        total as f64 / s / 1e6
    );

    let mut ds = Dataset::new(&GenOptions {
        versions: 3,
        size: 10 << 30,
        trace: true,
        ..GenOptions::default()
    })?;
    let (mut chunks, mut bytes, mut iterate_s, mut write_s) = (0u64, 0u64, 0.0, 0.0);
    while let Some((_, lineage)) = ds.next_version() {
        let t = Instant::now();
        for e in lineage.chunks()? {
            if let TraceEvent::Chunk(c) = e {
                chunks += 1;
                bytes += u64::from(c.size);
            }
        }
        iterate_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        lineage.write_trace(io::BufWriter::new(io::sink()))?;
        write_s += t.elapsed().as_secs_f64();
    }
    println!(
        "trace: {chunks} chunks ({bytes} logical bytes): iterate {:.2} M chunks/s, Destor text {:.2} M chunks/s",
        chunks as f64 / iterate_s / 1e6,
        chunks as f64 / write_s / 1e6
    );
    Ok(())
}
