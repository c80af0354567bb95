//! From scored rows to advantages: one step (one batch) at a time, or a file
//! of many steps, each step computed on its own and returned in input order.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};

use crate::batch::{advantages_schema, dense_groups, BatchError, ScoredRows};
use crate::normalize::{self, AdvantageOptions, Advantages, Batch, Device, NormalizeError, Ran};

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

/// Computes one step: `rows` all share one (run_id, step). The rows are
/// assembled into an Arrow batch with dictionary-encoded `instance_id`, whose
/// keys are the dense group ids the kernels take.
pub fn compute_step(
    rows: ScoredRows,
    options: &AdvantageOptions,
    device: Device,
) -> Result<StepResult, ComputeError> {
    let batch = rows.to_batch()?;
    let groups = dense_groups(&batch, &rows.instance_id);
    let (advantages, ran) = normalize::compute(
        &Batch {
            group: &groups.ids,
            n_groups: groups.n_groups,
            reward: &rows.reward,
            hinted: &rows.is_hinted,
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

/// Computes rows of any number of steps: each (run_id, step) is one batch.
/// Returns advantages aligned with the input rows.
pub fn compute_rows(
    rows: &ScoredRows,
    options: &AdvantageOptions,
    device: Device,
) -> Result<Advantages, ComputeError> {
    let mut steps: HashMap<(&str, i64), Vec<usize>> = HashMap::new();
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
        let result = if indices.len() == n {
            // One step: no need to copy the rows.
            let groups =
                crate::normalize::DenseGroups::from_strings(rows.instance_id.iter().map(String::as_str));
            let batch = Batch {
                group: &groups.ids,
                n_groups: groups.n_groups,
                reward: &rows.reward,
                hinted: &rows.is_hinted,
            };
            normalize::compute(&batch, options, device)?.0
        } else {
            compute_step(rows.take(indices), options, device)?.advantages
        };
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
