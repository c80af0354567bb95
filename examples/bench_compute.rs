//! Times stage 2's computation on a JSONL file of scored rows (one step),
//! for every estimator, as `scripts/bench-python.sh` times the reference's
//! pure-Python loop and a numpy version on the same rows:
//!
//! - `from_dictionary`: from an Arrow batch whose `instance_id` is
//!   dictionary-encoded (built once from the rows, as a trainer sending
//!   Arrow would), `advantages::compute_batch`: group ids are the keys,
//!   rewards read in place;
//! - `from_ipc`: the same from the IPC stream bytes (decode included);
//! - `from_strings`: string ids mapped to dense ids, then the kernel;
//! - `compute_rows`: the offline path of `hintstream advantages compute`
//!   from owned rows (split by step, mapping, kernel).
//!
//! Each on one thread (`1t`) and on rayon's whole pool (`all`); prints
//! `time <path> <threads> <estimator> <median ms>` lines and writes the
//! advantages of each estimator, one per line, to `OUT_PREFIX.<estimator>.txt`.
//!
//!     cargo run --release --example bench_compute -- ROWS.jsonl OUT_PREFIX [RUNS]

use std::io::Write;
use std::time::Instant;

use hintstream::advantages::offline::read_jsonl;
use hintstream::advantages::{compute_batch, compute_rows};
use hintstream::batch::ipc;
use hintstream::messages::DecodeLimits;
use hintstream::normalize::{self, AdvantageOptions, Batch, DenseGroups, Device, Estimator};

/// Median milliseconds of `runs` calls of `f`, and its last result.
fn time<R>(runs: usize, mut f: impl FnMut() -> R) -> (f64, R) {
    let mut times = Vec::with_capacity(runs);
    let mut last = f(); // warm-up, not timed
    for _ in 0..runs {
        let started = Instant::now();
        last = f();
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], last)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: bench_compute ROWS.jsonl OUT_PREFIX [RUNS]");
        std::process::exit(2);
    }
    let runs: usize = args.get(3).map(|r| r.parse()).transpose()?.unwrap_or(5).max(1);
    let rows = read_jsonl(std::path::Path::new(&args[1]), DecodeLimits::default())?;
    let arrow = rows.to_batch()?;
    let bytes = ipc::encode_stream(std::slice::from_ref(&arrow))?;
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let all = rayon::ThreadPoolBuilder::new().build()?;
    println!("rows {} threads_all {}", rows.len(), all.current_num_threads());
    for estimator in Estimator::ALL {
        let options = AdvantageOptions {
            estimator,
            ..AdvantageOptions::default()
        };
        let e = estimator.as_str();
        let mut reference = None;
        for (threads, pool) in [("1t", &one), ("all", &all)] {
            pool.install(|| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                let (ms, result) = time(runs, || compute_batch(&arrow, &options, Device::Cpu));
                let advantages = result?.0;
                println!("time from_dictionary {threads} {e} {ms:.3}");
                let (ms, result) = time(runs, || -> Result<_, Box<dyn std::error::Error + Send + Sync>> {
                    let batches = ipc::decode_stream(&bytes)?;
                    Ok(compute_batch(&batches[0], &options, Device::Cpu)?.0)
                });
                check_same(&advantages.advantage, &result?.advantage, "from_ipc")?;
                println!("time from_ipc {threads} {e} {ms:.3}");
                let (ms, result) = time(runs, || {
                    let groups = DenseGroups::from_strings(rows.instance_id.iter());
                    let batch = Batch {
                        group: &groups.ids,
                        n_groups: groups.n_groups,
                        reward: &rows.reward,
                        hinted: &rows.is_hinted,
                        response_length: &[],
                    };
                    normalize::compute(&batch, &options, Device::Cpu)
                });
                check_same(&advantages.advantage, &result?.0.advantage, "from_strings")?;
                println!("time from_strings {threads} {e} {ms:.3}");
                let (ms, result) = time(runs, || compute_rows(&rows, &options, Device::Cpu));
                check_same(&advantages.advantage, &result?.advantage, "compute_rows")?;
                println!("time compute_rows {threads} {e} {ms:.3}");
                reference.get_or_insert(advantages);
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        }
        let mut out = std::io::BufWriter::new(std::fs::File::create(format!("{}.{e}.txt", args[2]))?);
        for a in reference.map(|r| r.advantage).unwrap_or_default() {
            writeln!(out, "{a:.17e}")?;
        }
    }
    Ok(())
}

/// The paths must agree with each other before they are compared with
/// Python (to the last bits but for the order of f64 additions).
fn check_same(a: &[f64], b: &[f64], path: &str) -> Result<(), String> {
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f64::max);
    if a.len() != b.len() || worst > 1e-12 {
        return Err(format!("{path} disagrees with from_dictionary: {worst:e}"));
    }
    Ok(())
}
