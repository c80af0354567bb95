//! The CPU kernel: every estimator in three fused passes over the rows, with
//! f64 accumulation into one contiguous table of 16-byte per-group slots.
//!
//! 1. sums: each baseline row adds its score and 1 to its group's slot;
//! 2. squares: each baseline row adds its squared deviation from the group
//!    mean (two-pass accuracy: no sum-of-squares cancellation);
//! 3. outputs: advantage, group_mean and group_std of every row, in order.
//!
//! Between the passes a loop over the groups (not the rows) turns sums into
//! means and squares into stds. A row touches one slot per pass, so the
//! table (16 bytes a group: 2 MB for 125,000 groups) is the only random
//! access; the row columns are read front to back. Nothing is hashed and
//! nothing is allocated per group or per row beyond the outputs and the
//! table. [`Estimator::BatchWhiten`] has one "group", so its passes are
//! plain reductions.
//!
//! Large batches with few groups per row run the passes in parallel row
//! chunks (rayon), each chunk with its own table, merged after; results then
//! differ from the one-thread ones only by the order of f64 additions.

use rayon::prelude::*;

use super::{AdvantageOptions, Advantages, Batch, Estimator};

/// Batches with fewer rows run on one thread: below this, splitting costs
/// more than it saves.
pub const PARALLEL_MIN_ROWS: usize = 200_000;

/// Computes the advantages; `batch` must have passed [`Batch::validate`].
/// Runs on rayon's pool when the batch is large (see the module docs).
pub fn compute(batch: &Batch<'_>, options: &AdvantageOptions) -> Advantages {
    let threads = rayon::current_num_threads();
    // Per-chunk tables cost n_groups slots each: worth it only when a chunk
    // has several rows per group.
    let parallel = threads > 1 && batch.len() >= PARALLEL_MIN_ROWS && batch.n_groups * 4 <= batch.len();
    run(batch, options, if parallel { threads } else { 1 })
}

/// Computes the advantages on the calling thread only (for benchmarks and
/// callers that manage their own threads); `batch` must have passed
/// [`Batch::validate`].
pub fn compute_one_thread(batch: &Batch<'_>, options: &AdvantageOptions) -> Advantages {
    run(batch, options, 1)
}

/// Baseline statistics of one group, as the kernels use them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GroupStats {
    /// Mean of the baseline rows; 0 with fewer than two.
    pub mean: f64,
    /// Unbiased std of the baseline rows (floored when asked); 1 with fewer
    /// than two.
    pub std: f64,
    /// How many baseline rows the group has.
    pub count: u64,
    /// Sum of the baseline rows' scores.
    pub sum: f64,
}

/// Per-group statistics of `batch`'s baseline rows (raw rows only when a row
/// is hinted) as [`Estimator::Grpo`] uses them. For
/// [`Estimator::BatchWhiten`] the statistics are the step's, over all groups:
/// see [`step_stats`].
pub fn group_stats(batch: &Batch<'_>, options: &AdvantageOptions) -> Vec<GroupStats> {
    let first_turn = batch.first_turn_baseline();
    let sums = group_sums(batch, first_turn, 1);
    let stats = group_spread(batch, first_turn, &sums, options, 1);
    stats
        .iter()
        .zip(&sums.count)
        .zip(&sums.sum)
        .map(|((s, &count), &sum)| GroupStats {
            mean: s.a,
            std: s.b,
            count: count as u64,
            sum,
        })
        .collect()
}

/// Mean and std of the whole batch's baseline rows (one group), as
/// [`Estimator::BatchWhiten`] uses them.
pub fn step_stats(batch: &Batch<'_>, options: &AdvantageOptions) -> GroupStats {
    let first_turn = batch.first_turn_baseline();
    let (sum, count) = step_sum(batch, first_turn);
    let mean = if count >= 2.0 { sum / count } else { 0.0 };
    let std = if count >= 2.0 {
        let m2 = step_squares(batch, first_turn, mean);
        floor(options, (m2 / (count - 1.0)).sqrt())
    } else {
        1.0
    };
    GroupStats {
        mean,
        std,
        count: count as u64,
        sum,
    }
}

fn run(batch: &Batch<'_>, options: &AdvantageOptions, threads: usize) -> Advantages {
    let n = batch.len();
    let mut out = Advantages {
        advantage: vec![0.0; n],
        group_mean: vec![0.0; n],
        group_std: vec![0.0; n],
    };
    if n == 0 {
        return out;
    }
    let first_turn = batch.first_turn_baseline();
    let estimator = options.estimator;
    if estimator == Estimator::BatchWhiten {
        let stats = step_stats(batch, options);
        for_chunks(&mut out, threads, |start, o| {
            whiten_rows(batch, stats, options.epsilon, start, o)
        });
        return out;
    }
    let sums = group_sums(batch, first_turn, threads);
    let slots = group_spread(batch, first_turn, &sums, options, threads);
    match estimator {
        Estimator::Grpo if options.norm_by_std => {
            let eps = options.epsilon;
            for_chunks(&mut out, threads, |start, o| {
                grpo_rows(batch, &slots, eps, start, o)
            });
        }
        Estimator::Grpo | Estimator::Drgrpo => {
            for_chunks(&mut out, threads, |start, o| {
                centred_rows(batch, &slots, start, o)
            });
        }
        Estimator::Rloo => {
            for_chunks(&mut out, threads, |start, o| {
                rloo_rows(batch, first_turn, &slots, &sums, start, o)
            });
        }
        Estimator::BatchWhiten => unreachable!("handled above"),
    }
    out
}

/// Two f64s of one group, kept together so that a row touches one 16-byte
/// slot: (sum, count) while summing, (mean, squared deviations) while
/// measuring the spread, (mean, std) when writing outputs.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(16))]
struct Slot {
    a: f64,
    b: f64,
}

/// Sums and counts of the baseline rows, per group.
struct Sums {
    sum: Vec<f64>,
    /// Counts as f64 (exact below 2^53 rows).
    count: Vec<f64>,
}

/// The weight of row `i` in the baseline: 1 or 0. A product with it keeps
/// the loops free of a branch the CPU would mispredict on hinted rows; the
/// scores are finite, so 0 × score adds exactly nothing.
#[inline(always)]
fn weight(hinted: bool) -> f64 {
    f64::from(u8::from(!hinted))
}

/// Pass 1 over `range`: adds score and 1 of each baseline row into
/// `table[group]` as (sum, count).
fn add_sums(batch: &Batch<'_>, first_turn: bool, range: std::ops::Range<usize>, table: &mut [Slot]) {
    let group = &batch.group[range.clone()];
    let reward = &batch.reward[range.clone()];
    if first_turn {
        let hinted = &batch.hinted[range];
        for ((&g, &r), &h) in group.iter().zip(reward).zip(hinted) {
            let w = weight(h);
            let s = &mut table[g as usize];
            s.a += w * r;
            s.b += w;
        }
    } else {
        for (&g, &r) in group.iter().zip(reward) {
            let s = &mut table[g as usize];
            s.a += r;
            s.b += 1.0;
        }
    }
}

/// Pass 2 over `range`: adds the squared deviation of each baseline row
/// from its group's mean (`table[group].a`) into `table[group].b`.
fn add_squares(batch: &Batch<'_>, first_turn: bool, range: std::ops::Range<usize>, table: &mut [Slot]) {
    let group = &batch.group[range.clone()];
    let reward = &batch.reward[range.clone()];
    if first_turn {
        let hinted = &batch.hinted[range];
        for ((&g, &r), &h) in group.iter().zip(reward).zip(hinted) {
            let s = &mut table[g as usize];
            let d = weight(h) * (r - s.a);
            s.b += d * d;
        }
    } else {
        for (&g, &r) in group.iter().zip(reward) {
            let s = &mut table[g as usize];
            let d = r - s.a;
            s.b += d * d;
        }
    }
}

/// Splits `0..rows` into `parts` contiguous ranges.
fn ranges(rows: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let len = rows.div_ceil(parts.max(1)).max(1);
    (0..rows).step_by(len).map(|s| s..(s + len).min(rows)).collect()
}

/// Pass 1, on `threads` row chunks; returns the per-group sums and counts.
fn group_sums(batch: &Batch<'_>, first_turn: bool, threads: usize) -> Sums {
    let groups = batch.n_groups;
    let table = if threads <= 1 {
        let mut table = vec![Slot::default(); groups];
        add_sums(batch, first_turn, 0..batch.len(), &mut table);
        table
    } else {
        ranges(batch.len(), threads)
            .into_par_iter()
            .map(|range| {
                let mut table = vec![Slot::default(); groups];
                add_sums(batch, first_turn, range, &mut table);
                table
            })
            .reduce_with(|mut x, y| {
                for (p, q) in x.iter_mut().zip(&y) {
                    p.a += q.a;
                    p.b += q.b;
                }
                x
            })
            .unwrap_or_else(|| vec![Slot::default(); groups])
    };
    let (sum, count) = table.iter().map(|s| (s.a, s.b)).unzip();
    Sums { sum, count }
}

fn floor(options: &AdvantageOptions, std: f64) -> f64 {
    options.std_floor.map_or(std, |f| std.max(f))
}

/// Pass 2 and the per-group finish: returns (mean, std) per group, with the
/// fewer-than-two rule (mean 0, std 1) and the optional floor applied.
fn group_spread(
    batch: &Batch<'_>,
    first_turn: bool,
    sums: &Sums,
    options: &AdvantageOptions,
    threads: usize,
) -> Vec<Slot> {
    let mut table: Vec<Slot> = sums
        .sum
        .iter()
        .zip(&sums.count)
        .map(|(&sum, &count)| Slot {
            a: if count >= 2.0 { sum / count } else { 0.0 },
            b: 0.0,
        })
        .collect();
    if threads <= 1 {
        add_squares(batch, first_turn, 0..batch.len(), &mut table);
    } else {
        let squares = ranges(batch.len(), threads)
            .into_par_iter()
            .map(|range| {
                // Each chunk starts from the means, with squares at 0.
                let mut local = table.clone();
                add_squares(batch, first_turn, range, &mut local);
                local
            })
            .reduce_with(|mut x, y| {
                for (p, q) in x.iter_mut().zip(&y) {
                    p.b += q.b;
                }
                x
            });
        if let Some(squares) = squares {
            table = squares;
        }
    }
    for (s, &count) in table.iter_mut().zip(&sums.count) {
        s.b = if count >= 2.0 {
            floor(options, (s.b / (count - 1.0)).sqrt())
        } else {
            1.0
        };
    }
    table
}

/// Sum and count of the batch's baseline rows, in four interleaved lanes
/// (independent additions the CPU can overlap).
fn step_sum(batch: &Batch<'_>, first_turn: bool) -> (f64, f64) {
    let mut sum = [0.0f64; 4];
    let mut count = [0.0f64; 4];
    if first_turn {
        let rc = batch.reward.chunks_exact(4);
        let hc = batch.hinted.chunks_exact(4);
        let (rt, ht) = (rc.remainder(), hc.remainder());
        for (r, h) in rc.zip(hc) {
            for k in 0..4 {
                let w = weight(h[k]);
                sum[k] += w * r[k];
                count[k] += w;
            }
        }
        for (&r, &h) in rt.iter().zip(ht) {
            let w = weight(h);
            sum[0] += w * r;
            count[0] += w;
        }
    } else {
        let rc = batch.reward.chunks_exact(4);
        let rt = rc.remainder();
        for r in rc {
            for k in 0..4 {
                sum[k] += r[k];
            }
        }
        for &r in rt {
            sum[0] += r;
        }
        count[0] = batch.len() as f64;
    }
    (
        (sum[0] + sum[1]) + (sum[2] + sum[3]),
        (count[0] + count[1]) + (count[2] + count[3]),
    )
}

/// Sum of squared deviations of the batch's baseline rows from `mean`.
fn step_squares(batch: &Batch<'_>, first_turn: bool, mean: f64) -> f64 {
    let mut acc = [0.0f64; 4];
    let rc = batch.reward.chunks_exact(4);
    let rt = rc.remainder();
    if first_turn {
        let hc = batch.hinted.chunks_exact(4);
        let ht = hc.remainder();
        for (r, h) in rc.zip(hc) {
            for k in 0..4 {
                let d = weight(h[k]) * (r[k] - mean);
                acc[k] += d * d;
            }
        }
        for (&r, &h) in rt.iter().zip(ht) {
            let d = weight(h) * (r - mean);
            acc[0] += d * d;
        }
    } else {
        for r in rc {
            for k in 0..4 {
                let d = r[k] - mean;
                acc[k] += d * d;
            }
        }
        for &r in rt {
            let d = r - mean;
            acc[0] += d * d;
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// Output columns of one chunk of rows.
struct Out<'a> {
    advantage: &'a mut [f64],
    mean: &'a mut [f64],
    std: &'a mut [f64],
}

/// Pass 3 driver: `fill(start, out)` writes rows `start..start + len`;
/// chunks run in parallel when `threads > 1`.
fn for_chunks<F>(out: &mut Advantages, threads: usize, fill: F)
where
    F: Fn(usize, Out<'_>) + Sync,
{
    let n = out.advantage.len();
    if threads <= 1 {
        fill(
            0,
            Out {
                advantage: &mut out.advantage,
                mean: &mut out.group_mean,
                std: &mut out.group_std,
            },
        );
        return;
    }
    let chunk = n.div_ceil(threads).max(1);
    out.advantage
        .par_chunks_mut(chunk)
        .zip(out.group_mean.par_chunks_mut(chunk))
        .zip(out.group_std.par_chunks_mut(chunk))
        .enumerate()
        .for_each(|(k, ((advantage, mean), std))| fill(k * chunk, Out { advantage, mean, std }));
}

/// grpo with `norm_by_std`: A = (s − mean) / (std + eps).
fn grpo_rows(batch: &Batch<'_>, slots: &[Slot], eps: f64, start: usize, o: Out<'_>) {
    let len = o.advantage.len();
    let group = &batch.group[start..start + len];
    let reward = &batch.reward[start..start + len];
    let rows = o
        .advantage
        .iter_mut()
        .zip(o.mean.iter_mut())
        .zip(o.std.iter_mut());
    for (((a, m), sd), (&g, &r)) in rows.zip(group.iter().zip(reward)) {
        let s = slots[g as usize];
        *a = (r - s.a) / (s.b + eps);
        *m = s.a;
        *sd = s.b;
    }
}

/// drgrpo, and grpo without `norm_by_std`: A = s − mean.
fn centred_rows(batch: &Batch<'_>, slots: &[Slot], start: usize, o: Out<'_>) {
    let len = o.advantage.len();
    let group = &batch.group[start..start + len];
    let reward = &batch.reward[start..start + len];
    let rows = o
        .advantage
        .iter_mut()
        .zip(o.mean.iter_mut())
        .zip(o.std.iter_mut());
    for (((a, m), sd), (&g, &r)) in rows.zip(group.iter().zip(reward)) {
        let s = slots[g as usize];
        *a = r - s.a;
        *m = s.a;
        *sd = s.b;
    }
}

/// rloo: A = s − baseline, the baseline being the mean of the group's other
/// baseline rows (for a baseline row) or of all of them (for a hinted row
/// of a first-turn batch); A = 0 for a group with at most one baseline row.
/// `group_mean` is that baseline (the row's own score when A = 0).
fn rloo_rows(batch: &Batch<'_>, first_turn: bool, slots: &[Slot], sums: &Sums, start: usize, o: Out<'_>) {
    let len = o.advantage.len();
    let group = &batch.group[start..start + len];
    let reward = &batch.reward[start..start + len];
    let hinted = &batch.hinted[start..start + len];
    let rows = o
        .advantage
        .iter_mut()
        .zip(o.mean.iter_mut())
        .zip(o.std.iter_mut());
    for (((a, m), sd), ((&g, &r), &h)) in rows.zip(group.iter().zip(reward).zip(hinted)) {
        let g = g as usize;
        let (count, s) = (sums.count[g], slots[g]);
        let baseline = if count < 2.0 {
            r
        } else if first_turn && h {
            s.a
        } else {
            (sums.sum[g] - r) / (count - 1.0)
        };
        *a = r - baseline;
        *m = baseline;
        *sd = s.b;
    }
}

/// batch_whiten: A = (s − step mean) / (step std + eps).
fn whiten_rows(batch: &Batch<'_>, stats: GroupStats, eps: f64, start: usize, o: Out<'_>) {
    let len = o.advantage.len();
    let reward = &batch.reward[start..start + len];
    let denominator = stats.std + eps;
    for (a, &r) in o.advantage.iter_mut().zip(reward) {
        *a = (r - stats.mean) / denominator;
    }
    o.mean.fill(stats.mean);
    o.std.fill(stats.std);
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPS: f64 = 1e-6;

    fn run_case(groups: &[u32], rewards: &[f64], hinted: &[bool], options: AdvantageOptions) -> Advantages {
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
        let a = run_case(&[0, 0, 0, 0], &r, &[false; 4], AdvantageOptions::default());
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
        let a = run_case(&groups, &r, &hinted, AdvantageOptions::default());
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
        let a = run_case(&groups, &r, &hinted, AdvantageOptions::default());
        let std1 = 2.0f64.sqrt();
        assert!(close(a.advantage[3], (2.0 - 3.0) / (std1 + EPS)));
        // Group 0's raw samples all scored 0: std 0, so the hinted success
        // gets 1 / eps = 1e6 (parity with the reference).
        assert!(close(a.advantage[2], 1.0 / EPS));
        assert_eq!(a.advantage[0], 0.0);
    }

    #[test]
    fn group_with_one_raw_sample_uses_mean_0_std_1() {
        let a = run_case(&[0, 0], &[0.5, 1.0], &[false, true], AdvantageOptions::default());
        assert_all_close(&a.advantage, &[0.5 / (1.0 + EPS), 1.0 / (1.0 + EPS)]);
        assert_all_close(&a.group_mean, &[0.0, 0.0]);
        assert_all_close(&a.group_std, &[1.0, 1.0]);
    }

    #[test]
    fn group_with_only_hinted_samples_uses_mean_0_std_1() {
        let a = run_case(
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
        let a = run_case(&[0], &[0.7], &[false], AdvantageOptions::default());
        assert_all_close(&a.advantage, &[0.7 / (1.0 + EPS)]);
    }

    #[test]
    fn std_zero_group_without_hints_gives_zero() {
        let a = run_case(
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
        let a = run_case(
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
        let a = run_case(&[0, 0, 0], &[0.0, 0.0, 1.0], &[false, false, true], options);
        assert!(close(a.advantage[2], 1.0 / (0.1 + EPS)));
    }

    #[test]
    fn norm_by_std_off_only_centres() {
        let options = AdvantageOptions {
            norm_by_std: false,
            ..AdvantageOptions::default()
        };
        let a = run_case(&[0, 0, 0, 1], &[1.0, 0.0, 0.5, 3.0], &[false; 4], options);
        assert_all_close(&a.advantage, &[0.5, -0.5, 0.0, 3.0]);
    }

    #[test]
    fn non_contiguous_groups_keep_input_order() {
        // Rows of two groups interleaved.
        let a = run_case(
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
        let a = run_case(&[], &[], &[], AdvantageOptions::default());
        assert!(a.advantage.is_empty());
    }

    #[test]
    fn every_estimator_on_one_thread_matches_the_parallel_path() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let n = PARALLEL_MIN_ROWS + 1001;
        let groups: Vec<u32> = (0..n).map(|_| rng.random_range(0..20_000)).collect();
        let rewards: Vec<f64> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
        let hinted: Vec<bool> = (0..n).map(|_| rng.random_bool(0.1)).collect();
        let batch = Batch {
            group: &groups,
            n_groups: 20_000,
            reward: &rewards,
            hinted: &hinted,
        };
        for estimator in Estimator::ALL {
            let options = AdvantageOptions {
                estimator,
                ..AdvantageOptions::default()
            };
            let one = compute_one_thread(&batch, &options);
            let many = run(&batch, &options, 3);
            for (name, x, y) in [
                ("advantage", &one.advantage, &many.advantage),
                ("group_mean", &one.group_mean, &many.group_mean),
                ("group_std", &one.group_std, &many.group_std),
            ] {
                for i in 0..n {
                    assert!(
                        close(x[i], y[i]),
                        "{estimator} {name} row {i}: {} vs {}",
                        x[i],
                        y[i]
                    );
                }
            }
        }
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
        let parallel = run(&batch, &AdvantageOptions::default(), 2);
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
