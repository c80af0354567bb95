//! The CPU kernel: two passes with f64 accumulation, parallel over row chunks
//! (rayon) above [`PARALLEL_MIN_ROWS`].

use rayon::prelude::*;

use super::{AdvantageOptions, Advantages, Batch};

/// Batches with fewer rows run on one thread: below this, splitting costs
/// more than it saves.
pub const PARALLEL_MIN_ROWS: usize = 50_000;

/// Computes the advantages; `batch` must have passed [`Batch::validate`].
pub fn compute(batch: &Batch<'_>, options: &AdvantageOptions) -> Advantages {
    let stats = group_stats(batch, options);
    let n = batch.len();
    let mut out = Advantages {
        advantage: vec![0.0; n],
        group_mean: vec![0.0; n],
        group_std: vec![0.0; n],
    };
    let fill = |start: usize, advantage: &mut [f64], mean_out: &mut [f64], std_out: &mut [f64]| {
        for j in 0..advantage.len() {
            let i = start + j;
            let s = &stats[batch.group[i] as usize];
            let centred = batch.reward[i] - s.mean;
            advantage[j] = if options.norm_by_std {
                centred / (s.std + options.epsilon)
            } else {
                centred
            };
            mean_out[j] = s.mean;
            std_out[j] = s.std;
        }
    };
    if n >= PARALLEL_MIN_ROWS {
        let chunk = chunk_len(n);
        out.advantage
            .par_chunks_mut(chunk)
            .zip(out.group_mean.par_chunks_mut(chunk))
            .zip(out.group_std.par_chunks_mut(chunk))
            .enumerate()
            .for_each(|(k, ((a, m), s))| fill(k * chunk, a, m, s));
    } else {
        fill(0, &mut out.advantage, &mut out.group_mean, &mut out.group_std);
    }
    out
}

/// Baseline statistics of one group.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GroupStats {
    pub mean: f64,
    pub std: f64,
}

/// Per-group accumulator, kept together so one row touches one cache line.
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    sum: f64,
    count: u64,
}

/// Mean and unbiased std of each group's baseline samples (raw samples only
/// when the batch has a hinted one); mean 0 and std 1 for groups with fewer
/// than two baseline samples.
pub fn group_stats(batch: &Batch<'_>, options: &AdvantageOptions) -> Vec<GroupStats> {
    let first_turn = batch.first_turn_baseline();
    let in_baseline = |i: usize| !first_turn || !batch.hinted[i];

    // Pass 1: sums and counts.
    let acc = accumulate(batch.len(), batch.n_groups, |i, acc: &mut [Acc]| {
        if in_baseline(i) {
            let a = &mut acc[batch.group[i] as usize];
            a.sum += batch.reward[i];
            a.count += 1;
        }
    });
    let mean: Vec<f64> = acc
        .iter()
        .map(|a| if a.count >= 2 { a.sum / a.count as f64 } else { 0.0 })
        .collect();

    // Pass 2: squared deviations from the mean (in `sum`).
    let squares = accumulate(batch.len(), batch.n_groups, |i, acc: &mut [Acc]| {
        if in_baseline(i) {
            let g = batch.group[i] as usize;
            let d = batch.reward[i] - mean[g];
            acc[g].sum += d * d;
        }
    });
    acc.iter()
        .zip(&squares)
        .zip(&mean)
        .map(|((a, sq), &mean)| {
            if a.count >= 2 {
                let s = (sq.sum / (a.count - 1) as f64).sqrt();
                GroupStats {
                    mean,
                    std: options.std_floor.map_or(s, |floor| s.max(floor)),
                }
            } else {
                GroupStats { mean: 0.0, std: 1.0 }
            }
        })
        .collect()
}

fn chunk_len(rows: usize) -> usize {
    rows.div_ceil(rayon::current_num_threads().max(1)).max(1)
}

/// Runs `add(i, acc)` over every row into per-group accumulators, in
/// parallel chunks (each with its own accumulators, merged after) when the
/// batch is large.
fn accumulate<F>(rows: usize, groups: usize, add: F) -> Vec<Acc>
where
    F: Fn(usize, &mut [Acc]) + Sync,
{
    let run = |range: std::ops::Range<usize>| {
        let mut acc = vec![Acc::default(); groups];
        for i in range {
            add(i, &mut acc);
        }
        acc
    };
    if rows < PARALLEL_MIN_ROWS {
        return run(0..rows);
    }
    let chunk = chunk_len(rows);
    (0..rows)
        .step_by(chunk)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|start| run(start..(start + chunk).min(rows)))
        .reduce(
            || vec![Acc::default(); groups],
            |mut a, b| {
                for (x, y) in a.iter_mut().zip(&b) {
                    x.sum += y.sum;
                    x.count += y.count;
                }
                a
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPS: f64 = 1e-6;

    fn run(groups: &[u32], rewards: &[f64], hinted: &[bool], options: AdvantageOptions) -> Advantages {
        let n_groups = groups.iter().max().map_or(0, |m| *m as usize + 1);
        let batch = Batch {
            group: groups,
            n_groups,
            reward: rewards,
            hinted,
        };
        batch.validate().unwrap();
        compute(&batch, &options)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + b.abs())
    }

    fn assert_all_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(close(*g, *w), "row {i}: got {g}, want {w} (all: {got:?})");
        }
    }

    #[test]
    fn standard_grpo_without_hints() {
        // Group 0: [1, 0, 1, 0] mean 0.5, unbiased std sqrt(1/3).
        let r = [1.0, 0.0, 1.0, 0.0];
        let a = run(&[0, 0, 0, 0], &r, &[false; 4], AdvantageOptions::default());
        let std = (1.0f64 / 3.0).sqrt();
        let want: Vec<f64> = r.iter().map(|s| (s - 0.5) / (std + EPS)).collect();
        assert_all_close(&a.advantage, &want);
        assert_all_close(&a.group_std, &[std; 4]);
    }

    #[test]
    fn first_turn_baseline_uses_raw_samples_only() {
        // Group 0: raw [0, 1, 0], hinted [1]. Baseline mean 1/3, std sqrt(1/3).
        let groups = [0, 0, 0, 0];
        let r = [0.0, 1.0, 0.0, 1.0];
        let hinted = [false, false, false, true];
        let a = run(&groups, &r, &hinted, AdvantageOptions::default());
        let (mean, std) = (1.0 / 3.0, (1.0f64 / 3.0).sqrt());
        let want: Vec<f64> = r.iter().map(|s| (s - mean) / (std + EPS)).collect();
        assert_all_close(&a.advantage, &want);
    }

    #[test]
    fn any_hint_switches_every_group_to_raw_baselines() {
        // Group 1 has no hinted sample, but group 0 does: group 1 still uses
        // its raw samples, which are all of its samples.
        let groups = [0, 0, 0, 1, 1];
        let r = [0.0, 0.0, 1.0, 2.0, 4.0];
        let hinted = [false, false, true, false, false];
        let a = run(&groups, &r, &hinted, AdvantageOptions::default());
        let std1 = 2.0f64.sqrt();
        assert!(close(a.advantage[3], (2.0 - 3.0) / (std1 + EPS)));
        // Group 0's raw samples all scored 0: std 0, so the hinted success
        // gets 1 / eps = 1e6 (parity with the reference).
        assert!(close(a.advantage[2], 1.0 / EPS));
        assert_eq!(a.advantage[0], 0.0);
    }

    #[test]
    fn group_with_one_raw_sample_uses_mean_0_std_1() {
        let a = run(&[0, 0], &[0.5, 1.0], &[false, true], AdvantageOptions::default());
        assert_all_close(&a.advantage, &[0.5 / (1.0 + EPS), 1.0 / (1.0 + EPS)]);
        assert_all_close(&a.group_mean, &[0.0, 0.0]);
        assert_all_close(&a.group_std, &[1.0, 1.0]);
    }

    #[test]
    fn group_with_only_hinted_samples_uses_mean_0_std_1() {
        let a = run(
            &[0, 0, 1, 1],
            &[1.0, 0.0, 0.0, 1.0],
            &[true, true, false, false],
            AdvantageOptions::default(),
        );
        assert_all_close(&a.advantage[..2], &[1.0 / (1.0 + EPS), 0.0]);
        let std1 = 0.5f64.sqrt();
        assert_all_close(&a.advantage[2..], &[-0.5 / (std1 + EPS), 0.5 / (std1 + EPS)]);
    }

    #[test]
    fn size_one_group_is_not_zeroed() {
        let a = run(&[0], &[0.7], &[false], AdvantageOptions::default());
        assert_all_close(&a.advantage, &[0.7 / (1.0 + EPS)]);
    }

    #[test]
    fn std_zero_group_without_hints_gives_zero() {
        let a = run(
            &[0, 0, 0],
            &[1.0, 1.0, 1.0],
            &[false; 3],
            AdvantageOptions::default(),
        );
        assert_eq!(a.advantage, vec![0.0; 3]);
        assert_eq!(a.group_std, vec![0.0; 3]);
    }

    #[test]
    fn std_zero_hinted_failure_gets_minus_one_million() {
        let a = run(
            &[0, 0, 0],
            &[1.0, 1.0, 0.0],
            &[false, false, true],
            AdvantageOptions::default(),
        );
        assert!(close(a.advantage[2], -1.0 / EPS));
    }

    #[test]
    fn std_floor_caps_the_std_zero_case() {
        let options = AdvantageOptions {
            std_floor: Some(0.1),
            ..AdvantageOptions::default()
        };
        let a = run(&[0, 0, 0], &[0.0, 0.0, 1.0], &[false, false, true], options);
        assert!(close(a.advantage[2], 1.0 / (0.1 + EPS)));
    }

    #[test]
    fn norm_by_std_off_only_centres() {
        let options = AdvantageOptions {
            norm_by_std: false,
            ..AdvantageOptions::default()
        };
        let a = run(&[0, 0, 0, 1], &[1.0, 0.0, 0.5, 3.0], &[false; 4], options);
        assert_all_close(&a.advantage, &[0.5, -0.5, 0.0, 3.0]);
    }

    #[test]
    fn non_contiguous_groups_keep_input_order() {
        // Rows of two groups interleaved.
        let a = run(
            &[1, 0, 1, 0],
            &[1.0, 3.0, 0.0, 5.0],
            &[false; 4],
            AdvantageOptions::default(),
        );
        let (s0, s1) = (2.0f64.sqrt(), 0.5f64.sqrt());
        assert_all_close(
            &a.advantage,
            &[
                0.5 / (s1 + EPS),
                -1.0 / (s0 + EPS),
                -0.5 / (s1 + EPS),
                1.0 / (s0 + EPS),
            ],
        );
    }

    #[test]
    fn empty_batch_gives_empty_result() {
        let a = run(&[], &[], &[], AdvantageOptions::default());
        assert!(a.advantage.is_empty());
    }

    #[test]
    fn parallel_path_matches_sequential() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let n = PARALLEL_MIN_ROWS * 3 + 17;
        let groups: Vec<u32> = (0..n).map(|_| rng.random_range(0..5000)).collect();
        let rewards: Vec<f64> = (0..n).map(|_| rng.random_range(0.0..1.0)).collect();
        let hinted: Vec<bool> = (0..n).map(|_| rng.random_bool(0.1)).collect();
        let batch = Batch {
            group: &groups,
            n_groups: 5000,
            reward: &rewards,
            hinted: &hinted,
        };
        let parallel = compute(&batch, &AdvantageOptions::default());
        // A sequential reference built from the definition, row by row.
        let mut raw: Vec<Vec<f64>> = vec![vec![]; 5000];
        for i in 0..n {
            if !hinted[i] {
                raw[groups[i] as usize].push(rewards[i]);
            }
        }
        for i in (0..n).step_by(997) {
            let xs = &raw[groups[i] as usize];
            let (mean, std) = if xs.len() < 2 {
                (0.0, 1.0)
            } else {
                let m = xs.iter().sum::<f64>() / xs.len() as f64;
                (
                    m,
                    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64).sqrt(),
                )
            };
            let want = (rewards[i] - mean) / (std + EPS);
            assert!((parallel.advantage[i] - want).abs() < 1e-9, "row {i}");
        }
    }
}
