//! Compares the CUDA kernel with the CPU kernel on fresh random inputs and
//! times both: max relative error must stay under 1e-5 and std-0 groups must
//! match exactly. Prints a table. Exit 0 when all agree, 1 on a mismatch,
//! 2 when there is no CUDA device (or no CUDA support in the build).
//!
//!     cargo run --release --features cuda --example gpu_check

use std::time::Instant;

use hintstream::normalize::{self, cpu, AdvantageOptions, Batch, Device};
use rand::{Rng, SeedableRng};

const SIZES: [usize; 4] = [10_000, 100_000, 1_000_000, 4_000_000];
const GROUP: usize = 8;
const RUNS: usize = 5;

struct Case {
    group: Vec<u32>,
    reward: Vec<f64>,
    hinted: Vec<bool>,
    n_groups: usize,
    /// Rows whose group's baseline has std 0 by construction.
    std0: Vec<bool>,
}

fn case(n: usize, seed: u64) -> Case {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n_groups = n.div_ceil(GROUP);
    // Every tenth group scores the same for all its raw samples (std 0).
    let constant: Vec<Option<f64>> = (0..n_groups)
        .map(|g| (g % 10 == 0).then(|| f64::from(rng.random_range(0..3u8))))
        .collect();
    let mut c = Case {
        group: vec![],
        reward: vec![],
        hinted: vec![],
        n_groups,
        std0: vec![],
    };
    for _ in 0..n {
        let g = rng.random_range(0..n_groups);
        let hinted = rng.random_bool(0.1);
        let reward = match constant[g] {
            Some(v) if !hinted => v,
            _ => rng.random_range(-1.0..1.0) * 1000.0 + 1000.0,
        };
        c.group.push(g as u32);
        c.reward.push(reward);
        c.hinted.push(hinted);
        c.std0.push(constant[g].is_some());
    }
    c
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if !normalize::cuda_available() {
        eprintln!("gpu_check: no CUDA device here (or this build lacks --features cuda); nothing to compare");
        std::process::exit(2);
    }
    let options = AdvantageOptions::default();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7);
    println!("seed {seed}");
    println!(
        "{:>10} {:>12} {:>12} {:>9} {:>14} {:>10}",
        "rows", "cpu ms", "cuda ms", "speedup", "max rel err", "std0 exact"
    );
    let mut ok = true;
    for (k, &n) in SIZES.iter().enumerate() {
        let c = case(n, seed + k as u64);
        let batch = Batch {
            group: &c.group,
            n_groups: c.n_groups,
            reward: &c.reward,
            hinted: &c.hinted,
        };
        let mut cpu_ms = vec![];
        let mut gpu_ms = vec![];
        let mut cpu_out = None;
        let mut gpu_out = None;
        for _ in 0..RUNS {
            let t = Instant::now();
            cpu_out = Some(cpu::compute(&batch, &options));
            cpu_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            match normalize::compute(&batch, &options, Device::Cuda) {
                Ok((a, _)) => gpu_out = Some(a),
                Err(e) => {
                    eprintln!("gpu_check: CUDA kernel failed at {n} rows: {e}");
                    std::process::exit(1);
                }
            }
            gpu_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (cpu_a, gpu_a) = (cpu_out.unwrap_or_default(), gpu_out.unwrap_or_default());
        let mut max_rel = 0.0f64;
        let mut std0_exact = true;
        for i in 0..n {
            let (x, y) = (gpu_a.advantage[i], cpu_a.advantage[i]);
            max_rel = max_rel.max((x - y).abs() / y.abs().max(1.0));
            if c.std0[i] && (x != y || gpu_a.group_std[i] != cpu_a.group_std[i]) {
                std0_exact = false;
            }
        }
        ok &= max_rel < 1e-5 && std0_exact;
        let (cm, gm) = (median(cpu_ms), median(gpu_ms));
        println!(
            "{n:>10} {cm:>12.3} {gm:>12.3} {:>8.1}x {max_rel:>14.3e} {std0_exact:>10}",
            cm / gm
        );
    }
    std::process::exit(if ok { 0 } else { 1 });
}
