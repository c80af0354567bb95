//! The CPU kernel: every estimator in three fused passes over the rows, with
//! f64 accumulation into one contiguous table of 16-byte per-group slots.
//!
//! 1. sums: each baseline row adds its score and 1 to its group's slot;
//! 2. squares: each baseline row adds its squared deviation from the group
//!    mean (two-pass accuracy: no sum-of-squares cancellation);
//! 3. outputs: advantage, group_mean and group_std of every row, in order.
//!
//! Between the passes a loop over the groups (not the rows) turns sums into
//! means and squares into stds, branch-free so that it vectorises. A row
//! touches one slot per pass, so the table (16 bytes a group: 2 MB for
//! 125,000 groups) is the only random access; the row columns are read front
//! to back and the outputs written front to back. Nothing is hashed and
//! nothing is allocated per group or per row: the table is kept for the
//! thread's next call, and [`compute_into`] writes into the caller's columns.
//! [`Estimator::ReinforcePp`] has one "group", so its passes are plain
//! reductions (weighted by response length when the batch has lengths).
//!
//! Large batches with several rows per group run the passes in parallel row
//! chunks (rayon): the first chunk adds into the step's table, each other
//! into a spare table of its own, merged after; results then differ from the
//! one-thread ones only by the order of f64 additions.

use rayon::prelude::*;

use super::batch::{Advantages, Batch};
use super::estimator::{AdvantageOptions, Estimator};

/// Batches with fewer rows run on one thread: below this, splitting costs
/// more than it saves.
pub const PARALLEL_MIN_ROWS: usize = 200_000;

/// Computes the advantages into fresh columns; `batch` must have passed
/// [`Batch::validate`]. Runs on rayon's pool when the batch is large (see the
/// module docs). Outputs may be non-finite for rewards too large for plain
/// sums: [`compute_checked`] says so, and `normalize::compute` never lets
/// them out.
pub fn compute(batch: &Batch<'_>, options: &AdvantageOptions) -> Advantages {
    compute_checked(batch, options).0
}

/// [`compute`], with whether every advantage, group_mean and group_std is
/// finite (checked as the rows are written, at no extra pass).
pub fn compute_checked(batch: &Batch<'_>, options: &AdvantageOptions) -> (Advantages, bool) {
    let mut out = fresh(batch.len());
    let finite = compute_into(batch, options, &mut out);
    (out, finite)
}

/// [`compute`] into `out`, reusing its columns' memory: a caller that keeps
/// one `Advantages` across steps of similar size saves the allocation and the
/// page faults of 24 bytes a row (about 1 ms of the 6.5 ms of a 1M-row step
/// on one core here). `out`'s previous contents are overwritten. Returns
/// whether every output is finite.
pub fn compute_into(batch: &Batch<'_>, options: &AdvantageOptions, out: &mut Advantages) -> bool {
    let threads = rayon::current_num_threads();
    // Per-chunk tables cost n_groups slots each: worth it only when a chunk
    // has several rows per group.
    let parallel = threads > 1 && batch.len() >= PARALLEL_MIN_ROWS && batch.n_groups * 4 <= batch.len();
    compute_on(batch, options, if parallel { threads } else { 1 }, out)
}

/// [`compute_into`] on exactly `threads` row chunks of rayon's pool; `1`
/// runs on the calling thread only (for benchmarks and callers that manage
/// their own threads). Returns whether every output is finite.
pub fn compute_on(
    batch: &Batch<'_>,
    options: &AdvantageOptions,
    threads: usize,
    out: &mut Advantages,
) -> bool {
    run(batch, options, threads.max(1), out)
}

/// Zeroed output columns for `n` rows. Zeroed rather than merely reserved:
/// fresh zeroed memory costs nothing to zero (calloc), and writing into
/// initialised slices is faster than pushing.
fn fresh(n: usize) -> Advantages {
    Advantages {
        advantage: vec![0.0; n],
        group_mean: vec![0.0; n],
        group_std: vec![0.0; n],
    }
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
/// [`Estimator::ReinforcePp`] the statistics are the step's, over all groups:
/// see [`step_stats`].
pub fn group_stats(batch: &Batch<'_>, options: &AdvantageOptions) -> Vec<GroupStats> {
    let mut t = Tables::default();
    t.build(batch, options, 1, true, batch.first_turn_baseline());
    t.slots
        .iter()
        .zip(&t.counts)
        .zip(&t.sums)
        .map(|((s, &count), &sum)| GroupStats {
            mean: s.a,
            std: s.b,
            count: count as u64,
            sum,
        })
        .collect()
}

/// Token-weighted mean and std of the whole batch's baseline rows (one
/// group), as [`Estimator::ReinforcePp`] uses them: each row counts its
/// response length times; `count` is the number of baseline tokens, `sum`
/// their scores' sum; the std has Bessel's correction over tokens. The
/// baseline rows follow `options.hint_baseline`.
pub fn step_stats(batch: &Batch<'_>, options: &AdvantageOptions) -> GroupStats {
    let first_turn = Estimator::ReinforcePp.raw_baselines(batch, options);
    let (sum, count) = if batch.response_length.is_empty() {
        step_sum(batch, first_turn)
    } else {
        weighted_step_sum(batch, first_turn)
    };
    let mean = if count >= 2.0 { sum / count } else { 0.0 };
    let std = if count >= 2.0 {
        let m2 = if batch.response_length.is_empty() {
            step_squares(batch, first_turn, mean)
        } else {
            weighted_step_squares(batch, first_turn, mean)
        };
        let std = (m2 / (count - 1.0)).sqrt();
        options.std_floor.map_or(std, |floor| std.max(floor))
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

/// The three passes; returns whether every output is finite.
fn run(batch: &Batch<'_>, options: &AdvantageOptions, threads: usize, out: &mut Advantages) -> bool {
    let n = batch.len();
    // No-ops when `out` already has n rows (its values are all overwritten).
    out.advantage.resize(n, 0.0);
    out.group_mean.resize(n, 0.0);
    out.group_std.resize(n, 0.0);
    if n == 0 {
        return true;
    }
    let first_turn = options.estimator.raw_baselines(batch, options);
    let eps = options.epsilon;
    if options.estimator == Estimator::ReinforcePp {
        let stats = step_stats(batch, options);
        // The reference's rsqrt(var + 1e-8), with var = std² (the floored
        // std when a floor is set).
        let (mean, std) = (stats.mean, stats.std);
        let denominator = (std * std + options.whiten_epsilon).sqrt();
        return fill(batch, out, threads, |_, r, _| {
            ((r - mean) / denominator, mean, std)
        });
    }
    let mut tables = Tables::take();
    let rloo = options.estimator == Estimator::Rloo;
    tables.build(batch, options, threads, rloo, first_turn);
    let slots = &tables.slots;
    let finite = match options.estimator {
        Estimator::Grpo if options.norm_by_std => fill(batch, out, threads, |g, r, _| {
            let s = slots[g as usize];
            ((r - s.a) / (s.b + eps), s.a, s.b)
        }),
        // drgrpo, and grpo without norm_by_std: A = s − mean.
        Estimator::Grpo | Estimator::Drgrpo => fill(batch, out, threads, |g, r, _| {
            let s = slots[g as usize];
            (r - s.a, s.a, s.b)
        }),
        Estimator::Rloo => {
            // Everything a row needs in one 32-byte record.
            let table: Vec<RlooSlot> = slots
                .iter()
                .zip(&tables.counts)
                .zip(&tables.sums)
                .map(|((s, &count), &sum)| RlooSlot {
                    sum,
                    count,
                    mean: s.a,
                    std: s.b,
                })
                .collect();
            // A = s − baseline: the mean of the group's other baseline rows
            // for a baseline row, of all of them for a hinted row when only
            // raw rows are baseline rows, the row's own score (A = 0) for a
            // group with at most one.
            fill(batch, out, threads, |g, r, h| {
                let t = table[g as usize];
                let baseline = if t.count < 2.0 {
                    r
                } else if first_turn && h {
                    t.mean
                } else {
                    (t.sum - r) / (t.count - 1.0)
                };
                (r - baseline, baseline, t.std)
            })
        }
        Estimator::ReinforcePp => unreachable!("returned above"),
    };
    tables.give_back();
    finite
}

/// What rloo reads per row.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
struct RlooSlot {
    sum: f64,
    count: f64,
    mean: f64,
    std: f64,
}

/// Pass 3: writes every row's (advantage, group_mean, group_std) as
/// `row(group, score, hinted)` gives them into `out`, whose columns have the
/// batch's length; in `threads` chunks when more than one. Returns whether
/// every value written is finite (a branch-free flag on values already in
/// registers, so the check costs no pass of its own).
fn fill<F>(batch: &Batch<'_>, out: &mut Advantages, threads: usize, row: F) -> bool
where
    F: Fn(u32, f64, bool) -> (f64, f64, f64) + Sync,
{
    let write = |start: usize, advantage: &mut [f64], mean: &mut [f64], std: &mut [f64]| {
        let end = start + advantage.len();
        let inputs = batch.group[start..end]
            .iter()
            .zip(&batch.reward[start..end])
            .zip(&batch.hinted[start..end]);
        let outputs = advantage.iter_mut().zip(mean.iter_mut()).zip(std.iter_mut());
        let mut finite = true;
        for (((a, m), s), ((&g, &r), &h)) in outputs.zip(inputs) {
            (*a, *m, *s) = row(g, r, h);
            finite &= a.is_finite() & m.is_finite() & s.is_finite();
        }
        finite
    };
    if threads <= 1 {
        return write(0, &mut out.advantage, &mut out.group_mean, &mut out.group_std);
    }
    let chunk = out.advantage.len().div_ceil(threads).max(1);
    out.advantage
        .par_chunks_mut(chunk)
        .zip(out.group_mean.par_chunks_mut(chunk))
        .zip(out.group_std.par_chunks_mut(chunk))
        .enumerate()
        .map(|(k, ((advantage, mean), std))| write(k * chunk, advantage, mean, std))
        // Not `all`: it would stop early and leave chunks unwritten.
        .reduce(|| true, |x, y| x & y)
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

/// Per-group state of one computation: 16 bytes a group in `slots` (what a
/// row touches in passes 1 and 2, and grpo's in pass 3), plus the counts
/// and, for rloo, the sums.
#[derive(Default)]
struct Tables {
    /// (sum, count) after pass 1, (mean, squares) during pass 2, (mean,
    /// std) after it.
    slots: Vec<Slot>,
    /// Baseline rows per group, as f64 (exact below 2^53 rows).
    counts: Vec<f64>,
    /// Baseline score sums per group; filled for rloo only.
    sums: Vec<f64>,
}

/// Tables larger than this are not kept for the next call (see
/// [`SPARE_TABLES`]): a step with millions of groups should not pin its
/// memory in every thread that computed one.
const MAX_SPARE_TABLE_BYTES: usize = 64 << 20;

thread_local! {
    /// The tables of this thread's previous call, reused: a fresh 2 MB table
    /// (125,000 groups) costs about as much in page faults as a pass over
    /// the rows.
    static SPARE_TABLES: std::cell::Cell<Tables> = std::cell::Cell::new(Tables::default());
}

/// Spare per-chunk tables of the parallel passes, shared by all threads.
static CHUNK_TABLES: std::sync::Mutex<Vec<Vec<Slot>>> = std::sync::Mutex::new(Vec::new());

/// Spare chunk tables kept at most (each at most
/// [`MAX_SPARE_TABLE_BYTES`]); more are freed.
const MAX_SPARE_CHUNK_TABLES: usize = 8;

/// A zeroed table of `groups` slots, from the spares when there is one.
fn chunk_table(groups: usize) -> Vec<Slot> {
    // A poisoned lock only means another thread panicked while pushing or
    // popping a Vec: the list itself is still a valid list.
    let spare = CHUNK_TABLES.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let mut table = spare.unwrap_or_default();
    table.clear();
    table.resize(groups, Slot::default());
    table
}

fn return_chunk_table(table: Vec<Slot>) {
    let mut spares = CHUNK_TABLES.lock().unwrap_or_else(|e| e.into_inner());
    if spares.len() < MAX_SPARE_CHUNK_TABLES && table.capacity() * 16 <= MAX_SPARE_TABLE_BYTES {
        spares.push(table);
    }
}

impl Tables {
    /// The spare tables of this thread (or new ones), emptied.
    fn take() -> Tables {
        let mut t = SPARE_TABLES.take();
        t.slots.clear();
        t.counts.clear();
        t.sums.clear();
        t
    }

    /// Hands the tables back for the next call on this thread.
    fn give_back(self) {
        if self.slots.capacity() * 32 <= MAX_SPARE_TABLE_BYTES {
            SPARE_TABLES.set(self);
        }
    }

    /// Passes 1 and 2 with their per-group finishes: leaves (mean, std) per
    /// group in `slots`, with the fewer-than-two rule (mean 0, std 1) and the
    /// optional floor applied; keeps the sums when `keep_sums`. Baseline rows
    /// are the raw rows when `first_turn`, every row otherwise.
    fn build(
        &mut self,
        batch: &Batch<'_>,
        options: &AdvantageOptions,
        threads: usize,
        keep_sums: bool,
        first_turn: bool,
    ) {
        let groups = batch.n_groups;
        // Pass 1: (sum, count). In parallel, the first chunk of rows adds
        // into `slots` and each other chunk into a table of its own, merged
        // after.
        self.slots.resize(groups, Slot::default());
        let chunks = ranges(batch.len(), threads);
        let (first, rest) = chunks
            .split_first()
            .map_or((0..0, &[][..]), |(f, r)| (f.clone(), r));
        let mut others: Vec<Vec<Slot>> = rest.iter().map(|_| chunk_table(groups)).collect();
        let slots = &mut self.slots;
        if others.is_empty() {
            // On the calling thread (a join would move it to the pool).
            add_sums(batch, first_turn, first.clone(), slots);
        } else {
            rayon::join(
                || add_sums(batch, first_turn, first.clone(), slots),
                || {
                    others
                        .par_iter_mut()
                        .zip(rest)
                        .for_each(|(table, range)| add_sums(batch, first_turn, range.clone(), table))
                },
            );
        }
        for table in &others {
            for (p, q) in self.slots.iter_mut().zip(table) {
                p.a += q.a;
                p.b += q.b;
            }
        }
        // (sum, count) → (mean, 0), counts and sums aside. Branch-free, so
        // the loops vectorise.
        self.counts.extend(self.slots.iter().map(|s| s.b));
        if keep_sums {
            self.sums.extend(self.slots.iter().map(|s| s.a));
        }
        for s in self.slots.iter_mut() {
            let mean = s.a / s.b.max(1.0);
            *s = Slot {
                a: if s.b >= 2.0 { mean } else { 0.0 },
                b: 0.0,
            };
        }
        // Pass 2: squared deviations from the mean, chunked as pass 1; the
        // other chunks start from a copy of the means, with squares at 0.
        for table in &mut others {
            table.clear();
            table.extend_from_slice(&self.slots);
        }
        let slots = &mut self.slots;
        if others.is_empty() {
            add_squares(batch, first_turn, first, slots);
        } else {
            rayon::join(
                || add_squares(batch, first_turn, first, slots),
                || {
                    others
                        .par_iter_mut()
                        .zip(rest)
                        .for_each(|(table, range)| add_squares(batch, first_turn, range.clone(), table))
                },
            );
        }
        for table in &others {
            for (p, q) in self.slots.iter_mut().zip(table) {
                p.b += q.b;
            }
        }
        others.into_iter().for_each(return_chunk_table);
        // (mean, squares) → (mean, std).
        let floor = options.std_floor.unwrap_or(f64::NEG_INFINITY);
        for (s, &count) in self.slots.iter_mut().zip(&self.counts) {
            let std = (s.b / (count - 1.0).max(1.0)).sqrt().max(floor);
            s.b = if count >= 2.0 { std } else { 1.0 };
        }
    }
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

/// A row's weight in reinforce_pp's token statistics: its response length,
/// 0 for a hinted row when only raw rows are baseline rows.
#[inline(always)]
fn token_weight(batch: &Batch<'_>, first_turn: bool, row: usize) -> f64 {
    let baseline = !(first_turn && batch.hinted[row]);
    f64::from(u8::from(baseline)) * f64::from(batch.length(row))
}

/// Score sum and count of the batch's baseline tokens (rows weighted by
/// their response length).
fn weighted_step_sum(batch: &Batch<'_>, first_turn: bool) -> (f64, f64) {
    let (mut sum, mut count) = (0.0, 0.0);
    for (row, &r) in batch.reward.iter().enumerate() {
        let w = token_weight(batch, first_turn, row);
        sum += w * r;
        count += w;
    }
    (sum, count)
}

/// Sum of squared deviations of the batch's baseline tokens from `mean`.
fn weighted_step_squares(batch: &Batch<'_>, first_turn: bool, mean: f64) -> f64 {
    let mut acc = 0.0;
    for (row, &r) in batch.reward.iter().enumerate() {
        let d = r - mean;
        acc += token_weight(batch, first_turn, row) * d * d;
    }
    acc
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
            response_length: &[],
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
            response_length: &[],
        };
        for estimator in Estimator::ALL {
            let options = AdvantageOptions {
                estimator,
                ..AdvantageOptions::default()
            };
            let mut one = Advantages::default();
            compute_on(&batch, &options, 1, &mut one);
            // Reusing buffers of another size and contents changes nothing.
            let mut many = fresh(17);
            many.advantage.fill(f64::NAN);
            compute_on(&batch, &options, 3, &mut many);
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
            response_length: &[],
        };
        let mut parallel = fresh(n + 5);
        compute_on(&batch, &AdvantageOptions::default(), 2, &mut parallel);
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
