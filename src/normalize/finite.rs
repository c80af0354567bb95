//! Finite or refused: the checks that keep a non-finite number from ever
//! leaving the kernels, and the power-of-two scaling that lets any finite
//! rewards give finite sums.
//!
//! A sum of finite rewards can overflow (two rewards of 1.7e308 sum to
//! infinity) and so can a square (1e200² = 1e400), though the mean and the
//! std they lead to are representable. Dividing every reward of a group by
//! one power of two 2^k, with 2^k the largest power of two not above the
//! group's largest |reward|, puts every scaled reward under 2 in magnitude:
//! sums and squares stay far from overflow, and multiplying the scaled mean
//! and std by 2^k gives the true ones. Multiplying or dividing by a power of
//! two is exact (unless the result leaves the normal range), so a group
//! whose rewards are all at most [`SCALE_ABOVE`] is not scaled at all
//! (2^0 = 1) and its results are bit for bit the unscaled ones.

use super::batch::Advantages;

/// Groups whose largest |reward| is at most this (2^400, about 2.6e120) are
/// not scaled: their sums and squared deviations cannot overflow (n·2^802
/// is finite for any batch that fits in memory).
pub const SCALE_ABOVE: f64 = f64::from_bits((1023 + 400) << 52);

/// The power of two a group (or a step) whose largest |reward| is
/// `max_abs` is scaled by: 1 up to [`SCALE_ABOVE`], else 2^⌊log2 max_abs⌋
/// (finite: at most 2^1023), so that every scaled reward is below 2 in
/// magnitude.
pub fn scale_for(max_abs: f64) -> f64 {
    if max_abs.is_nan() || max_abs <= SCALE_ABOVE || max_abs.is_infinite() {
        return 1.0;
    }
    // A finite number above 2^400 is normal: its biased exponent field is
    // ⌊log2 x⌋ + 1023, and the same field alone (mantissa 0) is that power.
    f64::from_bits(max_abs.to_bits() & 0x7ff0_0000_0000_0000)
}

/// The mean of finite `values`, always finite: the values summed in order,
/// divided by their count; when that sum overflows, the same on the values
/// divided by [`scale_for`] their largest |value|, multiplied back. `None`
/// for no values. Both suites compute a hint's `mean_reward` this way
/// (`schemas/vectors/outcomes.json`; python/src/hintstream/wire.py).
pub fn mean(values: impl Iterator<Item = f64> + Clone) -> Option<f64> {
    let mut count = 0usize;
    let mut sum = 0.0;
    let mut max_abs = 0.0f64;
    for v in values.clone() {
        count += 1;
        sum += v;
        max_abs = max_abs.max(v.abs());
    }
    if count == 0 {
        return None;
    }
    let n = count as f64;
    if sum.is_finite() {
        return Some(sum / n);
    }
    let scale = scale_for(max_abs);
    let mut scaled = 0.0;
    for v in values {
        scaled += v / scale;
    }
    Some(scaled / n * scale)
}

/// The first row whose advantage, group_mean or group_std is not finite.
pub fn first_non_finite(a: &Advantages) -> Option<usize> {
    non_finite_rows(a).next()
}

/// Every row whose advantage, group_mean or group_std is not finite, in
/// order.
pub fn non_finite_rows(a: &Advantages) -> impl Iterator<Item = usize> + '_ {
    (0..a.advantage.len()).filter(|&i| {
        !(a.advantage[i].is_finite() && a.group_mean[i].is_finite() && a.group_std[i].is_finite())
    })
}

/// Whether every value of `column` is finite, in one branch-free pass
/// (vectorised; no early exit to break it).
pub fn all_finite(column: &[f64]) -> bool {
    column.iter().fold(true, |ok, x| ok & x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_values_are_not_scaled_and_large_ones_fall_under_two() {
        for x in [0.0, 1.0, 1e6, 1e100, SCALE_ABOVE, f64::NAN, f64::INFINITY] {
            assert_eq!(scale_for(x), 1.0, "{x}");
        }
        for x in [SCALE_ABOVE * 1.5, 1e200, 1.7e308, f64::MAX] {
            let s = scale_for(x);
            assert!(s.is_finite() && s > 1.0, "{x}: {s}");
            assert_eq!(s.log2().fract(), 0.0, "a power of two: {s}");
            assert!((1.0..2.0).contains(&(x / s)), "{x} / {s} = {}", x / s);
        }
        assert_eq!(scale_for(f64::MAX), 2f64.powi(1023));
    }

    #[test]
    fn a_mean_of_finite_values_is_finite_and_ordinary_means_are_plain_sums() {
        assert_eq!(mean([1.7e308, 1.7e308].into_iter()), Some(1.7e308));
        assert_eq!(mean([f64::MAX, f64::MAX, f64::MAX].into_iter()), Some(f64::MAX));
        assert_eq!(
            mean([1.7e308, -1.7e308, 1.7e308].into_iter()),
            Some(1.7e308 / 3.0)
        );
        assert_eq!(mean([-1.7e308, -1.7e308].into_iter()), Some(-1.7e308));
        // In order, one addition at a time (the shared vectors' rule).
        assert_eq!(mean(std::iter::repeat_n(0.1, 10)), Some(0.09999999999999999));
        assert_eq!(mean([0.5, -1.5].into_iter()), Some(-0.5));
        assert_eq!(mean(std::iter::empty()), None);
    }

    #[test]
    fn non_finite_outputs_are_found_in_any_column() {
        let mut a = Advantages {
            advantage: vec![0.0; 4],
            group_mean: vec![0.0; 4],
            group_std: vec![1.0; 4],
        };
        assert_eq!(first_non_finite(&a), None);
        assert!(all_finite(&a.advantage));
        a.group_std[2] = f64::INFINITY;
        a.advantage[3] = f64::NAN;
        assert_eq!(first_non_finite(&a), Some(2));
        assert_eq!(non_finite_rows(&a).collect::<Vec<_>>(), vec![2, 3]);
        assert!(!all_finite(&a.group_std) && !all_finite(&a.advantage));
    }
}
