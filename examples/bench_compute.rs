//! Times stage 2's compute path (string ids → dense groups → CPU kernel) on
//! a JSONL file of scored rows, as `scripts/bench-python.sh` times the Python
//! and numpy versions of the same algorithm on the same rows. Prints the
//! median of N runs in milliseconds and writes the advantages, one per line.
//!
//!     cargo run --release --example bench_compute -- ROWS.jsonl OUT.txt [RUNS]

use std::io::Write;
use std::time::Instant;

use hintstream::advantages::compute_rows;
use hintstream::advantages::offline::read_jsonl;
use hintstream::messages::DecodeLimits;
use hintstream::normalize::{AdvantageOptions, Device};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: bench_compute ROWS.jsonl OUT.txt [RUNS]");
        std::process::exit(2);
    }
    let runs: usize = args.get(3).map(|r| r.parse()).transpose()?.unwrap_or(5);
    let rows = read_jsonl(std::path::Path::new(&args[1]), DecodeLimits::default())?;
    let options = AdvantageOptions::default();
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let started = Instant::now();
        let result = compute_rows(&rows, &options, Device::Cpu)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        last = Some(result);
    }
    times.sort_by(f64::total_cmp);
    let mut out = std::io::BufWriter::new(std::fs::File::create(&args[2])?);
    for a in last.map(|r| r.advantage).unwrap_or_default() {
        writeln!(out, "{a:.17e}")?;
    }
    println!("rust_ms {:.3}", times[times.len() / 2]);
    Ok(())
}
