//! From scored rows to advantages: one step (one batch) at a time, or a file
//! of many steps, each step computed on its own and returned in input order.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};

use crate::batch::{advantages_schema, kernel_columns, BatchError, ScoredRows};
use crate::normalize::{
    self, AdvantageOptions, Advantages, Batch, DenseGroups, Device, Estimator, NormalizeError, Ran,
};

/// The result of one step.
#[derive(Debug, Clone)]
pub struct StepResult {
    pub rows: ScoredRows,
    pub advantages: Advantages,
    pub ran: Ran,
}

#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Normalize(#[from] NormalizeError),
}

impl ComputeError {
    pub fn kind(&self) -> &'static str {
        match self {
            ComputeError::Batch(e) => e.kind(),
            ComputeError::Normalize(_) => "compute",
        }
    }
}

/// Computes one step: `rows` all share one (run_id, step). The string group
/// ids are mapped to the dense ids the kernels take.
pub fn compute_step(
    rows: ScoredRows,
    options: &AdvantageOptions,
    device: Device,
) -> Result<StepResult, ComputeError> {
    let groups = step_groups(&rows.instance_id, options);
    let (advantages, ran) = normalize::compute(
        &Batch {
            group: &groups.ids,
            n_groups: groups.n_groups,
            reward: &rows.reward,
            hinted: &rows.is_hinted,
            response_length: &rows.response_length,
        },
        options,
        device,
    )?;
    Ok(StepResult {
        rows,
        advantages,
        ran,
    })
}

/// Dense group ids of a step's rows for `options`' estimator: reinforce_pp
/// ignores groups, so its rows all go to group 0 and no id is mapped.
fn step_groups(instance_ids: &[String], options: &AdvantageOptions) -> DenseGroups {
    if options.estimator == Estimator::ReinforcePp {
        return DenseGroups {
            ids: vec![0; instance_ids.len()],
            n_groups: usize::from(!instance_ids.is_empty()),
        };
    }
    DenseGroups::from_strings(instance_ids.iter().map(String::as_str))
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
        let groups = step_groups(&rows.instance_id, options);
        let batch = Batch {
            group: &groups.ids,
            n_groups: groups.n_groups,
            reward: &rows.reward,
            hinted: &rows.is_hinted,
            response_length: &rows.response_length,
        };
        return Ok(normalize::compute(&batch, options, device)?.0);
    }
    let mut steps: HashMap<(&str, i64), Vec<usize>, foldhash::fast::RandomState> = HashMap::default();
    let mut order = Vec::new();
    for i in 0..rows.len() {
        let key = (rows.run_id[i].as_str(), rows.step[i]);
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
        let result = compute_step(rows.take(indices), options, device)?.advantages;
        for (j, &i) in indices.iter().enumerate() {
            out.advantage[i] = result.advantage[j];
            out.group_mean[i] = result.group_mean[j];
            out.group_std[i] = result.group_std[j];
        }
    }
    Ok(out)
}

/// The advantages batch published for a step ([`advantages_schema`]).
pub fn advantages_batch(rows: &ScoredRows, advantages: &Advantages) -> Result<RecordBatch, BatchError> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(&rows.run_id)),
        Arc::new(Int64Array::from(rows.step.clone())),
        Arc::new(StringArray::from_iter_values(&rows.trajectory_id)),
        Arc::new(StringArray::from_iter_values(&rows.instance_id)),
        Arc::new(Float64Array::from(rows.reward.clone())),
        Arc::new(BooleanArray::from(rows.is_hinted.clone())),
        Arc::new(Float64Array::from(advantages.advantage.clone())),
        Arc::new(Float64Array::from(advantages.group_mean.clone())),
        Arc::new(Float64Array::from(advantages.group_std.clone())),
    ];
    Ok(RecordBatch::try_new(advantages_schema(), columns)?)
}
