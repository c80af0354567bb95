//! Compares the CUDA kernel with the CPU kernel for every estimator on fresh
//! random inputs and times both: each estimator under both `hint_baseline`s
//! (`reference`, `raw`), grpo also without `norm_by_std`, and reinforce_pp
//! also with random response lengths (1 to 4096 tokens) and a custom
//! `whiten_epsilon`. Prints the GPU, its compute capability and
//! the driver's CUDA version first, then one line per variant and size:
//! the max relative error over advantage, group_mean and group_std (must be
//! < 1e-9) and, for the per-group estimators with raw-only baselines,
//! whether rows of std-0 groups match exactly. Exit 0 when all agree, 1 on a mismatch or a kernel that
//! fails (including a module this driver cannot load), 2 when there is no
//! CUDA device (or no CUDA support in the build).
//!
//!     cargo run --release --features cuda --example gpu_check [ROWS...]

#[cfg(feature = "cuda")]
mod check {
    use std::time::Instant;

    use hintstream::normalize::{cpu, gpu, AdvantageOptions, Advantages, Batch, Estimator, HintBaseline};
    use rand::{Rng, SeedableRng};

    const SIZES: [usize; 4] = [10_000, 100_000, 1_000_000, 4_000_000];
    const GROUP: usize = 8;
    const RUNS: usize = 5;
    /// Largest relative difference accepted between the two kernels.
    const MAX_REL_ERR: f64 = 1e-9;

    struct Case {
        group: Vec<u32>,
        reward: Vec<f64>,
        hinted: Vec<bool>,
        /// Response lengths, 1 to 4096 tokens.
        length: Vec<u32>,
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
            length: vec![],
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
            c.length.push(rng.random_range(1..=4096));
            c.std0.push(constant[g].is_some());
        }
        c
    }

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    /// Max over the three columns of |gpu − cpu| / max(|cpu|, 1).
    fn max_rel_err(gpu: &Advantages, cpu: &Advantages) -> f64 {
        let mut max = 0.0f64;
        for (x, y) in [
            (&gpu.advantage, &cpu.advantage),
            (&gpu.group_mean, &cpu.group_mean),
            (&gpu.group_std, &cpu.group_std),
        ] {
            for (a, b) in x.iter().zip(y) {
                max = max.max((a - b).abs() / b.abs().max(1.0));
            }
        }
        max
    }

    /// What is compared: every estimator under both hint baselines; grpo
    /// without `norm_by_std`; reinforce_pp with response lengths, and with
    /// a custom `whiten_epsilon`.
    fn variants<'a>(
        plain: &'a Batch<'a>,
        with_lengths: &'a Batch<'a>,
    ) -> Vec<(String, &'a Batch<'a>, AdvantageOptions)> {
        let mut out = Vec::new();
        for estimator in Estimator::ALL {
            for hint_baseline in [HintBaseline::Reference, HintBaseline::Raw] {
                let options = AdvantageOptions {
                    estimator,
                    hint_baseline,
                    ..AdvantageOptions::default()
                };
                out.push((format!("{estimator} {hint_baseline}"), plain, options));
                if estimator == Estimator::ReinforcePp {
                    out.push((
                        format!("{estimator} {hint_baseline} lengths"),
                        with_lengths,
                        options,
                    ));
                }
            }
        }
        let no_std = AdvantageOptions {
            norm_by_std: false,
            ..AdvantageOptions::default()
        };
        out.push(("grpo no norm_by_std".into(), plain, no_std));
        let whiten = AdvantageOptions {
            estimator: Estimator::ReinforcePp,
            whiten_epsilon: 1e-3,
            ..AdvantageOptions::default()
        };
        out.push(("reinforce_pp lengths weps 1e-3".into(), with_lengths, whiten));
        out
    }

    pub fn main() {
        let info = match gpu::device_info() {
            Ok(info) => info,
            Err(e) => {
                eprintln!("gpu_check: {e}; nothing to compare");
                std::process::exit(2);
            }
        };
        let (major, minor) = info.compute_capability;
        println!(
            "gpu {} | compute capability {major}.{minor} (sm_{major}{minor}) | driver CUDA {}.{}",
            info.name,
            info.driver_cuda_version / 1000,
            (info.driver_cuda_version % 1000) / 10
        );
        if let Err(e) = gpu::check() {
            eprintln!("gpu_check: the kernel module does not load here: {e}");
            std::process::exit(1);
        }
        let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
        let sizes = if sizes.is_empty() { SIZES.to_vec() } else { sizes };
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7);
        println!("seed {seed}");
        println!(
            "{:>34} {:>10} {:>10} {:>10} {:>9} {:>13} {:>10}",
            "estimator", "rows", "cpu ms", "cuda ms", "speedup", "max rel err", "std0 exact"
        );
        let mut ok = true;
        for (k, &n) in sizes.iter().enumerate() {
            let c = case(n, seed + k as u64);
            let plain = Batch {
                group: &c.group,
                n_groups: c.n_groups,
                reward: &c.reward,
                hinted: &c.hinted,
                response_length: &[],
            };
            let with_lengths = Batch {
                response_length: &c.length,
                ..plain
            };
            for batch in [&plain, &with_lengths] {
                if let Err(e) = batch.validate() {
                    eprintln!("gpu_check: bad generated batch: {e}");
                    std::process::exit(1);
                }
            }
            for (label, batch, options) in variants(&plain, &with_lengths) {
                let estimator = options.estimator;
                let (mut cpu_ms, mut gpu_ms) = (vec![], vec![]);
                let (mut cpu_out, mut gpu_out) = (Advantages::default(), Advantages::default());
                for _ in 0..RUNS {
                    let t = Instant::now();
                    cpu_out = cpu::compute(batch, &options);
                    cpu_ms.push(t.elapsed().as_secs_f64() * 1e3);
                    let t = Instant::now();
                    gpu_out = match gpu::compute(batch, &options) {
                        Ok(a) => a,
                        Err(e) => {
                            eprintln!("gpu_check: CUDA kernel failed ({label}, {n} rows): {e}");
                            std::process::exit(1);
                        }
                    };
                    gpu_ms.push(t.elapsed().as_secs_f64() * 1e3);
                }
                let rel = max_rel_err(&gpu_out, &cpu_out);
                // reinforce_pp has no per-group std; its step std is not 0.
                // The std-0 groups are std 0 over their raw rows: only
                // where baselines are raw-only (grpo, drgrpo; rloo under
                // `raw`) is their baseline exact.
                let raw_only = estimator.raw_baselines(batch, &options);
                let std0 = if estimator == Estimator::ReinforcePp || !raw_only {
                    "-".to_string()
                } else {
                    let exact = (0..n).filter(|&i| c.std0[i]).all(|i| {
                        gpu_out.advantage[i] == cpu_out.advantage[i]
                            && gpu_out.group_mean[i] == cpu_out.group_mean[i]
                            && gpu_out.group_std[i] == cpu_out.group_std[i]
                    });
                    ok &= exact;
                    exact.to_string()
                };
                ok &= rel < MAX_REL_ERR && gpu_out.advantage.len() == n;
                let (cm, gm) = (median(cpu_ms), median(gpu_ms));
                println!(
                    "{label:>34} {n:>10} {cm:>10.3} {gm:>10.3} {:>8.1}x {rel:>13.3e} {std0:>10}",
                    cm / gm
                );
            }
        }
        println!("{}", if ok { "all agree" } else { "MISMATCH" });
        std::process::exit(if ok { 0 } else { 1 });
    }
}

#[cfg(feature = "cuda")]
fn main() {
    check::main();
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("gpu_check: this build lacks --features cuda; nothing to compare");
    std::process::exit(2);
}
