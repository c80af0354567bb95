//! From scored rows to advantages: one step (one batch) at a time, or a file
//! of many steps, each step computed on its own and returned in input order.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};

use crate::batch::{advantages_schema, kernel_columns, BatchError, ScoredRows, Strings};
use crate::normalize::cpu::PARALLEL_MIN_ROWS;
use crate::normalize::{
    self, AdvantageOptions, Advantages, Batch, DenseGroups, Device, Estimator, HintedWeight, NormalizeError,
    Ran,
};

/// The result of one step.
#[derive(Debug, Clone)]
pub struct StepResult {
    pub rows: ScoredRows,
    /// The rows' `instance_id` groups (whatever the estimator: the step's
    /// metrics count by them).
    pub groups: DenseGroups,
    pub advantages: Advantages,
    pub ran: Ran,
}

#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Normalize(#[from] NormalizeError),
    /// Rows without a finite advantage, group_mean or group_std
    /// ([`NormalizeError::RewardOutOfRange`]), named by trajectory id.
    #[error(
        "{count} row(s) of step {step} have no finite advantage, group_mean or group_std: {rows}; the \
         largest |reward| of the step is {max_abs_reward:e}, and the result is beyond f64's range even with \
         the rewards rescaled; scale the rewards down"
    )]
    RewardOutOfRange {
        /// `run_id/step`.
        step: String,
        /// The first rows, as `row N (trajectory_id "...")`, comma-separated.
        rows: String,
        count: usize,
        max_abs_reward: f64,
    },
}

impl ComputeError {
    pub fn kind(&self) -> &'static str {
        match self {
            ComputeError::Batch(e) => e.kind(),
            ComputeError::RewardOutOfRange { .. } => "reward_out_of_range",
            ComputeError::Normalize(NormalizeError::RewardOutOfRange { .. }) => "reward_out_of_range",
            ComputeError::Normalize(_) => "compute",
        }
    }

    /// A [`NormalizeError`] of `rows`' step, whose row `i` is input row
    /// `input_row(i)`: an out-of-range refusal names its rows by input row
    /// and trajectory id.
    fn of_step(e: NormalizeError, rows: &ScoredRows, input_row: impl Fn(usize) -> usize) -> ComputeError {
        let NormalizeError::RewardOutOfRange {
            rows: bad,
            count,
            max_abs_reward,
            ..
        } = e
        else {
            return ComputeError::Normalize(e);
        };
        let mut named: Vec<String> = bad
            .iter()
            .map(|&i| {
                let id = rows.trajectory_id.get(i).unwrap_or("");
                format!("row {} (trajectory_id {id:?})", input_row(i))
            })
            .collect();
        if count > bad.len() {
            named.push("…".into());
        }
        ComputeError::RewardOutOfRange {
            step: rows
                .run_id
                .first()
                .map_or_else(String::new, |run| format!("{run}/{}", rows.step[0])),
            rows: named.join(", "),
            count,
            max_abs_reward,
        }
    }
}

/// Computes one step: `rows` all share one (run_id, step). The string group
/// ids are mapped to the dense ids the kernels take, once: the result
/// carries them for the step's metrics.
pub fn compute_step(
    rows: ScoredRows,
    options: &AdvantageOptions,
    device: Device,
) -> Result<StepResult, ComputeError> {
    let groups = DenseGroups::from_strings(rows.instance_id.iter());
    compute_grouped(rows, groups, options, device)
}

/// [`compute_step`] with the rows' `instance_id` groups mapped already
/// (`DenseGroups::from_strings` of them: see
/// `GatheredRows::join_with_groups`).
pub fn compute_grouped(
    rows: ScoredRows,
    groups: DenseGroups,
    options: &AdvantageOptions,
    device: Device,
) -> Result<StepResult, ComputeError> {
    let (advantages, ran) = step_kernel(&rows, &groups, options, device)?;
    Ok(StepResult {
        rows,
        groups,
        advantages,
        ran,
    })
}

/// [`compute_grouped`], with `beside` run on the rows and their groups
/// while the kernel runs: what a step needs of its rows but not of its
/// advantages, such as its metrics, is then ready with them. From
/// [`PARALLEL_MIN_ROWS`] rows both run on rayon's pool, in the caller's
/// span, and a panic in either is resumed once both ended. Below, where
/// the CPU kernel takes one thread, the kernel then `beside` on the
/// caller's thread, as a small step's kernel ran before (no step then waits
/// on another's in the pool; a CUDA kernel of a small step too, before
/// metrics of under a millisecond); a kernel's panic ends it there.
pub fn compute_grouped_beside<R: Send>(
    rows: ScoredRows,
    groups: DenseGroups,
    options: &AdvantageOptions,
    device: Device,
    beside: impl FnOnce(&ScoredRows, &DenseGroups) -> R + Send,
) -> Result<(StepResult, R), ComputeError> {
    let (computed, aside) = if rows.len() < PARALLEL_MIN_ROWS {
        let computed = step_kernel(&rows, &groups, options, device);
        (computed, beside(&rows, &groups))
    } else {
        // A span does not follow work onto rayon's threads by itself: the
        // kernel's lines (a CUDA fallback) name their step.
        let span = tracing::Span::current();
        rayon::join(
            || span.in_scope(|| step_kernel(&rows, &groups, options, device)),
            || span.in_scope(|| beside(&rows, &groups)),
        )
    };
    let (advantages, ran) = computed?;
    let result = StepResult {
        rows,
        groups,
        advantages,
        ran,
    };
    Ok((result, aside))
}

/// The kernel over a step's rows in the groups its estimator takes
/// (reinforce_pp: one group).
fn step_kernel(
    rows: &ScoredRows,
    groups: &DenseGroups,
    options: &AdvantageOptions,
    device: Device,
) -> Result<(Advantages, Ran), ComputeError> {
    debug_assert_eq!(groups.ids.len(), rows.len());
    if options.estimator == Estimator::ReinforcePp {
        kernel(rows, &ungrouped(rows.len()), options, device, |i| i)
    } else {
        kernel(rows, groups, options, device, |i| i)
    }
}

/// Computes `rows`, all of one step, whose row `i` is input row
/// `input_row(i)` (for naming rows in a refusal).
fn compute_one(
    rows: &ScoredRows,
    options: &AdvantageOptions,
    device: Device,
    input_row: impl Fn(usize) -> usize,
) -> Result<(Advantages, Ran), ComputeError> {
    let groups = step_groups(&rows.instance_id, options);
    kernel(rows, &groups, options, device, input_row)
}

/// The kernel over `rows` in the groups the estimator takes.
fn kernel(
    rows: &ScoredRows,
    groups: &DenseGroups,
    options: &AdvantageOptions,
    device: Device,
    input_row: impl Fn(usize) -> usize,
) -> Result<(Advantages, Ran), ComputeError> {
    let batch = Batch {
        group: &groups.ids,
        n_groups: groups.n_groups,
        reward: &rows.reward,
        hinted: &rows.is_hinted,
        response_length: &rows.response_length,
    };
    normalize::compute(&batch, options, device).map_err(|e| ComputeError::of_step(e, rows, input_row))
}

/// `rows` rows all in group 0 (none when there are no rows).
fn ungrouped(rows: usize) -> DenseGroups {
    DenseGroups {
        ids: vec![0; rows],
        n_groups: usize::from(rows > 0),
    }
}

/// Dense group ids of a step's rows for `options`' estimator: reinforce_pp
/// ignores groups, so its rows all go to group 0 and no id is mapped.
fn step_groups(instance_ids: &Strings, options: &AdvantageOptions) -> DenseGroups {
    if options.estimator == Estimator::ReinforcePp {
        return ungrouped(instance_ids.len());
    }
    DenseGroups::from_strings(instance_ids.iter())
}

/// Computes one step straight from an Arrow batch with the scored columns
/// (all rows one (run_id, step); callers check): no row becomes an owned
/// string, a dictionary-encoded `instance_id` gives the group ids in place
/// and `Float64` rewards are read in place ([`kernel_columns`]).
pub fn compute_batch(
    batch: &RecordBatch,
    options: &AdvantageOptions,
    device: Device,
) -> Result<(Advantages, Ran), ComputeError> {
    let columns = kernel_columns(batch, options.estimator != Estimator::ReinforcePp)?;
    Ok(normalize::compute(&columns.as_batch(), options, device)?)
}

/// Computes rows of any number of steps: each (run_id, step) is one batch.
/// Returns advantages aligned with the input rows.
pub fn compute_rows(
    rows: &ScoredRows,
    options: &AdvantageOptions,
    device: Device,
) -> Result<Advantages, ComputeError> {
    let one_step = rows
        .run_id
        .iter()
        .zip(&rows.step)
        .all(|(r, s)| *r == rows.run_id[0] && *s == rows.step[0]);
    if one_step {
        // The common case: no need to split or copy the rows.
        return Ok(compute_one(rows, options, device, |i| i)?.0);
    }
    let mut steps: HashMap<(&str, i64), Vec<usize>, foldhash::fast::RandomState> = HashMap::default();
    let mut order = Vec::new();
    for i in 0..rows.len() {
        let key = (&rows.run_id[i], rows.step[i]);
        steps
            .entry(key)
            .or_insert_with(|| {
                order.push(key);
                Vec::new()
            })
            .push(i);
    }
    let n = rows.len();
    let mut out = Advantages {
        advantage: vec![0.0; n],
        group_mean: vec![0.0; n],
        group_std: vec![0.0; n],
    };
    for key in order {
        let indices = &steps[&key];
        let (result, _) = compute_one(&rows.take(indices), options, device, |i| indices[i])?;
        for (j, &i) in indices.iter().enumerate() {
            out.advantage[i] = result.advantage[j];
            out.group_mean[i] = result.group_mean[j];
            out.group_std[i] = result.group_std[j];
        }
    }
    Ok(out)
}

/// The advantages batch published for a step ([`advantages_schema`]). The
/// last check before any publication or file write: a column with a value
/// that is not finite is refused ([`BatchError::NonFinite`]; never the case
/// for what `normalize::compute` returns). With [`HintedWeight::Ratio`] the
/// batch gains a last Float64 column `weight` ([`weights`]); with
/// [`HintedWeight::None`] it is as it always was.
pub fn advantages_batch(
    rows: &ScoredRows,
    advantages: &Advantages,
    hinted_weight: HintedWeight,
) -> Result<RecordBatch, BatchError> {
    check_finite(advantages)?;
    advantages_rows_batch(rows, advantages, 0..rows.len(), hinted_weight)
}

/// Rows `range` of [`advantages_batch`], as a batch of their own (a chunk
/// built alone). Its advantages are not checked here: [`check_finite`]
/// them all first.
///
/// # Panics
/// When `range` reaches past the last row.
pub fn advantages_rows_batch(
    rows: &ScoredRows,
    advantages: &Advantages,
    range: Range<usize>,
    hinted_weight: HintedWeight,
) -> Result<RecordBatch, BatchError> {
    let floats = |column: &[f64]| Arc::new(Float64Array::from(column[range.clone()].to_vec()));
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(rows.run_id.to_arrow_range(range.clone())?),
        Arc::new(Int64Array::from(rows.step[range.clone()].to_vec())),
        Arc::new(rows.trajectory_id.to_arrow_range(range.clone())?),
        Arc::new(rows.instance_id.to_arrow_range(range.clone())?),
        floats(&rows.reward),
        Arc::new(BooleanArray::from(rows.is_hinted[range.clone()].to_vec())),
        floats(&advantages.advantage),
        floats(&advantages.group_mean),
        floats(&advantages.group_std),
    ];
    if hinted_weight == HintedWeight::None {
        return Ok(RecordBatch::try_new(advantages_schema(), columns)?);
    }
    let mut fields: Vec<Field> = advantages_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(WEIGHT, DataType::Float64, false));
    columns.push(Arc::new(Float64Array::from(weights(rows, range))));
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// The name of the off-policy weight column (`normalize.hinted_weight =
/// "ratio"`).
pub const WEIGHT: &str = "weight";

/// The off-policy weight of each row of `range`: ω on hinted rows with both log-probs
/// ([`ScoredRows::ratio`]), 1.0 on every other row.
pub fn weights(rows: &ScoredRows, range: Range<usize>) -> Vec<f64> {
    range.map(|i| rows.ratio(i).unwrap_or(1.0)).collect()
}

/// Refuses `advantages` when any advantage, group_mean or group_std is not
/// finite, naming the first such value.
pub fn check_finite(advantages: &Advantages) -> Result<(), BatchError> {
    for (column, values) in [
        ("advantage", &advantages.advantage),
        ("group_mean", &advantages.group_mean),
        ("group_std", &advantages.group_std),
    ] {
        if !normalize::finite::all_finite(values) {
            let row = values.iter().position(|v| !v.is_finite()).unwrap_or(0);
            return Err(BatchError::NonFinite {
                column,
                row,
                value: values.get(row).copied().unwrap_or(f64::NAN),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::synthetic::synthetic_step;
    use crate::normalize::Device;

    #[test]
    fn a_range_of_rows_builds_the_slice_of_the_whole_batch() {
        let mut rows = synthetic_step(200, 8, "run-1", 3, 7);
        // Log-probs on some hinted rows, for the weight column.
        for i in (0..rows.len()).filter(|&i| rows.is_hinted[i]).step_by(2) {
            rows.logprob_hinted.resize(rows.len(), None);
            rows.logprob_unhinted.resize(rows.len(), None);
            rows.logprob_hinted[i] = Some(-1.0);
            rows.logprob_unhinted[i] = Some(-1.5);
        }
        let result = compute_step(rows, &AdvantageOptions::default(), Device::Cpu).unwrap();
        for weight in [HintedWeight::None, HintedWeight::Ratio] {
            let whole = advantages_batch(&result.rows, &result.advantages, weight).unwrap();
            for range in [0..200, 0..1, 17..93, 199..200, 50..50] {
                let own =
                    advantages_rows_batch(&result.rows, &result.advantages, range.clone(), weight).unwrap();
                assert_eq!(
                    own,
                    whole.slice(range.start, range.len()),
                    "{weight:?} rows {range:?}"
                );
            }
        }
    }

    #[test]
    fn what_runs_beside_the_kernel_sees_the_steps_rows_and_groups_and_its_panic_is_the_steps() {
        for n in [4_000, PARALLEL_MIN_ROWS] {
            beside_the_kernel(n);
        }
    }

    /// What [`compute_grouped_beside`] must give for a step of `n` rows.
    fn beside_the_kernel(n: usize) {
        let rows = synthetic_step(n, 8, "run-1", 3, 11);
        let groups = DenseGroups::from_strings(rows.instance_id.iter());
        for estimator in [Estimator::Grpo, Estimator::ReinforcePp] {
            let options = AdvantageOptions {
                estimator,
                ..AdvantageOptions::default()
            };
            let alone = compute_grouped(rows.clone(), groups.clone(), &options, Device::Cpu).unwrap();
            let (result, seen) =
                compute_grouped_beside(rows.clone(), groups.clone(), &options, Device::Cpu, |r, g| {
                    (
                        r.trajectory_id.iter().map(str::to_owned).collect::<Vec<_>>(),
                        g.clone(),
                    )
                })
                .unwrap();
            assert_eq!(result.advantages, alone.advantages, "{n} rows, {estimator:?}");
            assert_eq!(
                seen.0,
                rows.trajectory_id.iter().map(str::to_owned).collect::<Vec<_>>()
            );
            assert_eq!(
                seen.1, groups,
                "{estimator:?}: the step's groups, whatever the estimator's"
            );
        }
        let panicked = std::panic::catch_unwind(|| {
            compute_grouped_beside(rows, groups, &AdvantageOptions::default(), Device::Cpu, |_, _| {
                panic!("the metrics failed")
            })
        });
        assert!(
            panicked.is_err(),
            "a panic beside the kernel ends the step's compute"
        );
    }
}
