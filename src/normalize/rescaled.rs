//! The rescaled kernel: every estimator on rewards divided by a power of two
//! per group (per step for reinforce_pp), for batches whose rewards are too
//! large for the plain sums of [`super::cpu`] and the CUDA kernel (see
//! [`super::finite`]). `normalize::compute` runs it only when a kernel's
//! outputs were not all finite, on the CPU whichever kernel ran first.
//!
//! With c = 2^k a group's scale and r' = r / c, the group's sums, mean and
//! std are computed on the r' with the same two passes and the same f64
//! operations as [`super::cpu`], then:
//!
//! - group_mean = mean'·c, group_std = max(std'·c, floor) (1 for a group
//!   with fewer than two baseline rows);
//! - grpo: A = (r' − mean') / (std'' + eps/c), with std'' the std as divided
//!   by (floored, or 1) over c; drgrpo, grpo without `norm_by_std` and rloo:
//!   A = (r' − baseline')·c;
//! - reinforce_pp: A = (r' − mean') / hypot(std'', sqrt(whiten_eps)/c),
//!   which is (r − mean) / sqrt(std² + whiten_eps) without its squares
//!   overflowing.
//!
//! A group that is not scaled (c = 1: rewards at most
//! [`super::finite::SCALE_ABOVE`]) gets exactly the operations of the
//! one-thread CPU kernel, so its results are the same bits. A result that is
//! not finite even here (a std beyond f64's range, a hinted success divided
//! by a std of 0 plus an epsilon too small for it) cannot be represented;
//! `normalize::compute` refuses the batch.

use super::batch::{Advantages, Batch};
use super::estimator::{AdvantageOptions, Estimator};
use super::finite::scale_for;

/// One group's baseline statistics on scaled rewards.
#[derive(Debug, Clone, Copy, Default)]
struct Scaled {
    /// c: the power of two the group's rewards are divided by.
    scale: f64,
    /// Sum of the scaled baseline rewards.
    sum: f64,
    /// Baseline rows (tokens for reinforce_pp).
    count: f64,
    /// Mean of the scaled baseline rewards; 0 with fewer than two.
    mean: f64,
    /// Squared deviations from `mean`, then the unfloored scaled std.
    spread: f64,
}

impl Scaled {
    fn counted(&self) -> bool {
        self.count >= 2.0
    }

    /// group_std: the std the row is reported with (floored, or 1).
    fn std(&self, floor: f64) -> f64 {
        if self.counted() {
            (self.spread * self.scale).max(floor)
        } else {
            1.0
        }
    }

    /// [`Scaled::std`] over c, computed without leaving the scaled range.
    fn scaled_std(&self, floor: f64) -> f64 {
        if self.counted() {
            self.spread.max(floor / self.scale)
        } else {
            1.0 / self.scale
        }
    }
}

/// Computes the advantages on rescaled rewards; `batch` must have passed
/// [`Batch::validate`]. One thread: it runs only on batches a kernel could
/// not compute.
pub fn compute(batch: &Batch<'_>, options: &AdvantageOptions) -> Advantages {
    let n = batch.len();
    let mut out = Advantages {
        advantage: vec![0.0; n],
        group_mean: vec![0.0; n],
        group_std: vec![0.0; n],
    };
    if n == 0 {
        return out;
    }
    if options.estimator == Estimator::ReinforcePp {
        whole_step(batch, options, &mut out);
    } else {
        per_group(batch, options, &mut out);
    }
    out
}

/// A row's weight in its group's baseline: 0 for a hinted row when only raw
/// rows are baseline rows, 1 otherwise (as the CPU kernel weighs it).
fn weight(first_turn: bool, hinted: bool) -> f64 {
    if first_turn {
        f64::from(u8::from(!hinted))
    } else {
        1.0
    }
}

/// The two passes per group, on scaled rewards.
fn group_stats(batch: &Batch<'_>, first_turn: bool) -> Vec<Scaled> {
    let mut max_abs = vec![0.0f64; batch.n_groups];
    for (&g, &r) in batch.group.iter().zip(batch.reward) {
        let m = &mut max_abs[g as usize];
        *m = m.max(r.abs());
    }
    let mut groups: Vec<Scaled> = max_abs
        .iter()
        .map(|&m| Scaled {
            scale: scale_for(m),
            ..Scaled::default()
        })
        .collect();
    let rows = || batch.group.iter().zip(batch.reward).zip(batch.hinted);
    for ((&g, &r), &h) in rows() {
        let s = &mut groups[g as usize];
        let w = weight(first_turn, h);
        s.sum += w * (r / s.scale);
        s.count += w;
    }
    for s in &mut groups {
        let mean = s.sum / s.count.max(1.0);
        s.mean = if s.counted() { mean } else { 0.0 };
    }
    for ((&g, &r), &h) in rows() {
        let s = &mut groups[g as usize];
        let d = weight(first_turn, h) * (r / s.scale - s.mean);
        s.spread += d * d;
    }
    for s in &mut groups {
        s.spread = (s.spread / (s.count - 1.0).max(1.0)).sqrt();
    }
    groups
}

/// grpo, drgrpo and rloo.
fn per_group(batch: &Batch<'_>, options: &AdvantageOptions, out: &mut Advantages) {
    let first_turn = options.estimator.raw_baselines(batch, options);
    let groups = group_stats(batch, first_turn);
    let floor = options.std_floor.unwrap_or(f64::NEG_INFINITY);
    for i in 0..batch.len() {
        let s = &groups[batch.group[i] as usize];
        let (r, c) = (batch.reward[i], s.scale);
        let scaled = r / c;
        let std = s.std(floor);
        out.group_std[i] = std;
        (out.advantage[i], out.group_mean[i]) = match options.estimator {
            Estimator::Grpo if options.norm_by_std => (
                (scaled - s.mean) / (s.scaled_std(floor) + options.epsilon / c),
                s.mean * c,
            ),
            Estimator::Rloo => {
                if !s.counted() {
                    (0.0, r)
                } else {
                    let baseline = if first_turn && batch.hinted[i] {
                        s.mean
                    } else {
                        (s.sum - scaled) / (s.count - 1.0)
                    };
                    ((scaled - baseline) * c, baseline * c)
                }
            }
            _ => ((scaled - s.mean) * c, s.mean * c),
        };
    }
}

/// reinforce_pp: one scale and one token-weighted mean and std for the step.
fn whole_step(batch: &Batch<'_>, options: &AdvantageOptions, out: &mut Advantages) {
    let first_turn = Estimator::ReinforcePp.raw_baselines(batch, options);
    let max_abs = batch.reward.iter().fold(0.0f64, |m, r| m.max(r.abs()));
    let mut s = Scaled {
        scale: scale_for(max_abs),
        ..Scaled::default()
    };
    let c = s.scale;
    let token_weight = |row: usize| weight(first_turn, batch.hinted[row]) * f64::from(batch.length(row));
    for (row, &r) in batch.reward.iter().enumerate() {
        let w = token_weight(row);
        s.sum += w * (r / c);
        s.count += w;
    }
    s.mean = if s.counted() { s.sum / s.count } else { 0.0 };
    for (row, &r) in batch.reward.iter().enumerate() {
        let d = r / c - s.mean;
        s.spread += token_weight(row) * d * d;
    }
    if s.counted() {
        s.spread = (s.spread / (s.count - 1.0)).sqrt();
    }
    let floor = options.std_floor.unwrap_or(f64::NEG_INFINITY);
    let (mean, std) = (s.mean * c, s.std(floor));
    let we = options.whiten_epsilon;
    // The CPU kernel's rsqrt(var + whiten_eps) where nothing is scaled.
    let denominator = if c == 1.0 {
        (std * std + we).sqrt()
    } else {
        s.scaled_std(floor).hypot(we.sqrt() / c)
    };
    for (row, &r) in batch.reward.iter().enumerate() {
        out.advantage[row] = (r / c - s.mean) / denominator;
        out.group_mean[row] = mean;
        out.group_std[row] = std;
    }
}

#[cfg(test)]
mod tests {
    use super::super::cpu;
    use super::super::estimator::HintBaseline;
    use super::super::finite::first_non_finite;
    use super::*;

    fn batch<'a>(group: &'a [u32], reward: &'a [f64], hinted: &'a [bool], length: &'a [u32]) -> Batch<'a> {
        Batch {
            group,
            n_groups: group.iter().max().map_or(0, |&g| g as usize + 1),
            reward,
            hinted,
            response_length: length,
        }
    }

    fn every_option() -> Vec<AdvantageOptions> {
        let mut all = Vec::new();
        for estimator in Estimator::ALL {
            for hint_baseline in [HintBaseline::Reference, HintBaseline::Raw] {
                for std_floor in [None, Some(0.25)] {
                    all.push(AdvantageOptions {
                        estimator,
                        hint_baseline,
                        std_floor,
                        ..AdvantageOptions::default()
                    });
                }
            }
        }
        all.push(AdvantageOptions {
            norm_by_std: false,
            ..AdvantageOptions::default()
        });
        all
    }

    /// Unscaled groups get the one-thread CPU kernel's bits, every
    /// estimator and option (reinforce_pp's unweighted sums run in four
    /// lanes there, so it is compared with lengths, summed in order there
    /// too).
    #[test]
    fn ordinary_rewards_give_the_cpu_kernels_bits() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let n = 4000;
        let group: Vec<u32> = (0..n).map(|_| rng.random_range(0..700)).collect();
        let reward: Vec<f64> = (0..n)
            .map(|i| match i % 7 {
                0 => 0.0,
                1 => 1.0,
                2 => -0.0,
                _ => rng.random_range(-5.0..5.0) * 10f64.powi(rng.random_range(-3..100)),
            })
            .collect();
        let hinted: Vec<bool> = (0..n).map(|_| rng.random_bool(0.15)).collect();
        let length: Vec<u32> = (0..n).map(|_| rng.random_range(1..300)).collect();
        for options in every_option() {
            let lengths: &[u32] = if options.estimator == Estimator::ReinforcePp {
                &length
            } else {
                &[]
            };
            let b = batch(&group, &reward, &hinted, lengths);
            let mut want = Advantages::default();
            assert!(cpu::compute_on(&b, &options, 1, &mut want));
            let got = compute(&b, &options);
            for (name, x, y) in [
                ("advantage", &got.advantage, &want.advantage),
                ("group_mean", &got.group_mean, &want.group_mean),
                ("group_std", &got.group_std, &want.group_std),
            ] {
                for i in 0..n {
                    assert_eq!(
                        x[i].to_bits(),
                        y[i].to_bits(),
                        "{options:?} {name} row {i}: {} vs {}",
                        x[i],
                        y[i]
                    );
                }
            }
        }
    }

    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() <= 1e-12 * want.abs().max(1e-300)
    }

    #[test]
    fn two_rewards_of_1_7e308_give_mean_1_7e308_std_0_and_advantage_0() {
        let b = batch(&[0, 0, 1, 1], &[1.7e308, 1.7e308, 1.0, 0.0], &[false; 4], &[]);
        for options in every_option() {
            let (plain, finite) = cpu::compute_checked(&b, &options);
            let a = compute(&b, &options);
            assert_eq!(first_non_finite(&a), None, "{options:?}: {a:?}");
            if options.estimator == Estimator::ReinforcePp {
                assert!(!finite, "the plain sum overflows: {plain:?}");
                continue;
            }
            assert!(
                !finite && plain.group_mean[0].is_infinite(),
                "{options:?}: {plain:?}"
            );
            assert_eq!(&a.group_mean[..2], &[1.7e308, 1.7e308]);
            assert_eq!(&a.advantage[..2], &[0.0, 0.0]);
            let floor = options.std_floor.unwrap_or(0.0);
            assert_eq!(&a.group_std[..2], &[floor, floor]);
            // The ordinary group is untouched.
            assert_eq!(&a.advantage[2..], &plain.advantage[2..]);
        }
    }

    #[test]
    fn plus_and_minus_1e200_give_the_std_the_squares_lost() {
        let b = batch(&[0, 0], &[1e200, -1e200], &[false; 2], &[]);
        let options = AdvantageOptions::default();
        let (plain, finite) = cpu::compute_checked(&b, &options);
        assert!(!finite && plain.group_std[0].is_infinite(), "{plain:?}");
        let a = compute(&b, &options);
        let std = 2f64.sqrt() * 1e200;
        assert!(close(a.group_std[0], std), "{a:?}");
        assert_eq!(a.group_mean, vec![0.0, 0.0]);
        assert!(
            close(a.advantage[0], 1e200 / std) && close(a.advantage[1], -1e200 / std),
            "{a:?}"
        );
        for estimator in [Estimator::Drgrpo, Estimator::Rloo] {
            let options = AdvantageOptions {
                estimator,
                ..AdvantageOptions::default()
            };
            let a = compute(&b, &options);
            assert_eq!(first_non_finite(&a), None, "{estimator}: {a:?}");
        }
        // rloo: each row's baseline is the other row.
        let rloo = compute(
            &b,
            &AdvantageOptions {
                estimator: Estimator::Rloo,
                ..AdvantageOptions::default()
            },
        );
        assert_eq!(rloo.advantage, vec![2e200, -2e200]);
        assert_eq!(rloo.group_mean, vec![-1e200, 1e200]);
    }

    #[test]
    fn one_huge_row_under_reinforce_pp_leaves_the_step_finite() {
        // Three ordinary rows and one of 1.7e308: the plain squares overflow
        // and every row's std is infinite.
        let reward = [0.0, 1.0, 0.5, 1.7e308];
        let b = batch(&[0; 4], &reward, &[false; 4], &[]);
        let options = AdvantageOptions {
            estimator: Estimator::ReinforcePp,
            ..AdvantageOptions::default()
        };
        let (plain, finite) = cpu::compute_checked(&b, &options);
        assert!(
            !finite && plain.group_std.iter().all(|s| s.is_infinite()),
            "{plain:?}"
        );
        let a = compute(&b, &options);
        assert_eq!(first_non_finite(&a), None, "{a:?}");
        // Against the definition in exact-enough arithmetic: scale by hand.
        let scaled: Vec<f64> = reward.iter().map(|r| r / 1e300).collect();
        let mean = scaled.iter().sum::<f64>() / 4.0;
        let var = scaled.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / 3.0;
        for (i, &x) in scaled.iter().enumerate() {
            assert!(close(a.advantage[i], (x - mean) / var.sqrt()), "row {i}: {a:?}");
        }
        assert!(close(a.group_mean[0], mean * 1e300) && close(a.group_std[0], var.sqrt() * 1e300));
    }

    #[test]
    fn what_f64_cannot_hold_stays_non_finite() {
        // A std of 2.4e308 is beyond f64's range.
        let b = batch(&[0, 0], &[1.7e308, -1.7e308], &[false; 2], &[]);
        let a = compute(&b, &AdvantageOptions::default());
        assert!(a.group_std[0].is_infinite(), "{a:?}");
        // A hinted success of 1e303 over a std-0 baseline: 1e303 / 1e-6.
        let b = batch(&[0, 0, 0], &[0.0, 0.0, 1e303], &[false, false, true], &[]);
        let a = compute(&b, &AdvantageOptions::default());
        assert_eq!(first_non_finite(&a), Some(2), "{a:?}");
    }

    #[test]
    fn small_groups_and_floors_keep_their_rules_when_scaled() {
        // A group with one baseline row: mean 0, std 1, A = s / (1 + eps).
        let b = batch(&[0, 0], &[1e300, 1e300], &[false, true], &[]);
        let a = compute(&b, &AdvantageOptions::default());
        assert_eq!(a.group_mean, vec![0.0, 0.0]);
        assert_eq!(a.group_std, vec![1.0, 1.0]);
        assert!(close(a.advantage[0], 1e300 / (1.0 + 1e-6)), "{a:?}");
        // rloo: A = 0 for a group of one.
        let rloo = AdvantageOptions {
            estimator: Estimator::Rloo,
            ..AdvantageOptions::default()
        };
        let a = compute(&batch(&[0], &[1e300], &[false], &[]), &rloo);
        assert_eq!((a.advantage[0], a.group_mean[0]), (0.0, 1e300));
        // A floor above the std is the std divided by.
        let floored = AdvantageOptions {
            std_floor: Some(1e299),
            ..AdvantageOptions::default()
        };
        let a = compute(
            &batch(&[0, 0, 0], &[1e300, 1e300, 0.0], &[false, false, true], &[]),
            &floored,
        );
        assert_eq!(a.group_std[2], 1e299);
        assert!(close(a.advantage[2], -1e300 / 1e299), "{a:?}");
    }
}
