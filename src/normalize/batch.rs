//! What the kernels take and give: one batch, columnar, checked before it
//! reaches a kernel; the per-row results; where they ran and why they could
//! not.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Where the advantages are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// CUDA when it is present and the batch is large enough to win.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

/// Batches below this many rows stay on the CPU under `Device::Auto`: moving
/// them over PCIe costs more than the CPU kernel takes.
pub const GPU_MIN_ROWS: usize = 200_000;

/// One batch, columnar: row i belongs to dense group `group[i]`.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub group: &'a [u32],
    pub n_groups: usize,
    pub reward: &'a [f64],
    pub hinted: &'a [bool],
    /// Each row's response length in tokens (≥ 1), read by reinforce_pp
    /// only. May be shorter than the other columns, empty included: rows
    /// past its end have length 1.
    pub response_length: &'a [u32],
}

/// Per-row results, in input order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Advantages {
    pub advantage: Vec<f64>,
    /// The baseline mean used for the row's group.
    pub group_mean: Vec<f64>,
    /// The baseline std used for the row's group (before epsilon).
    pub group_std: Vec<f64>,
}

#[derive(Debug, Error)]
pub enum NormalizeError {
    #[error("columns differ in length: {groups} group ids, {rewards} rewards, {hinted} hinted flags")]
    LengthMismatch {
        groups: usize,
        rewards: usize,
        hinted: usize,
    },
    #[error("group id {id} at row {row} is not below the group count {n_groups}")]
    GroupOutOfRange { row: usize, id: u32, n_groups: usize },
    #[error("reward at row {row} is not finite")]
    NonFinite { row: usize },
    #[error("{lengths} response lengths for {rows} rows: at most one a row")]
    TooManyLengths { rows: usize, lengths: usize },
    #[error("response length at row {row} is 0; it must be >= 1")]
    ZeroLength { row: usize },
    /// Rows whose advantage, group_mean or group_std is beyond f64's range
    /// even on rescaled rewards ([`super::rescaled`]): the batch has no
    /// finite result and is refused (dead-letter kind
    /// `reward_out_of_range`).
    #[error(
        "{count} row(s) have no finite advantage, group_mean or group_std, even with their rewards \
         rescaled (rows {}; the largest |reward| is {max_abs_reward:e}, epsilon {epsilon:e}): the result \
         is beyond f64's range; scale the rewards down",
        listed(.rows, *.count)
    )]
    RewardOutOfRange {
        /// The first such rows, at most [`OUT_OF_RANGE_ROWS_SHOWN`].
        rows: Vec<usize>,
        /// How many rows in all.
        count: usize,
        max_abs_reward: f64,
        /// The epsilon of the division (grpo's `epsilon`; reinforce_pp's
        /// `whiten_epsilon`).
        epsilon: f64,
    },
    #[error("CUDA device: {0}")]
    Device(String),
    #[error("device `cuda` requested, but {0}")]
    CudaUnavailable(String),
}

impl Batch<'_> {
    /// Checks the shapes and values the kernels rely on.
    pub fn validate(&self) -> Result<(), NormalizeError> {
        if self.group.len() != self.reward.len() || self.group.len() != self.hinted.len() {
            return Err(NormalizeError::LengthMismatch {
                groups: self.group.len(),
                rewards: self.reward.len(),
                hinted: self.hinted.len(),
            });
        }
        if let Some(row) = self.group.iter().position(|&g| g as usize >= self.n_groups) {
            return Err(NormalizeError::GroupOutOfRange {
                row,
                id: self.group[row],
                n_groups: self.n_groups,
            });
        }
        if let Some(row) = self.reward.iter().position(|r| !r.is_finite()) {
            return Err(NormalizeError::NonFinite { row });
        }
        if self.response_length.len() > self.group.len() {
            return Err(NormalizeError::TooManyLengths {
                rows: self.group.len(),
                lengths: self.response_length.len(),
            });
        }
        if let Some(row) = self.response_length.iter().position(|&l| l == 0) {
            return Err(NormalizeError::ZeroLength { row });
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.group.len()
    }

    pub fn is_empty(&self) -> bool {
        self.group.is_empty()
    }

    /// First-turn baseline: only raw samples form the baseline when any
    /// sample is hinted (for the estimators that follow the rule: see
    /// [`Estimator::raw_baselines`]).
    pub fn first_turn_baseline(&self) -> bool {
        self.hinted.iter().any(|&h| h)
    }

    /// Row `row`'s response length (1 past the column's end).
    pub fn length(&self, row: usize) -> u32 {
        self.response_length.get(row).copied().unwrap_or(1)
    }
}

/// How many out-of-range rows [`NormalizeError::RewardOutOfRange`] lists.
pub const OUT_OF_RANGE_ROWS_SHOWN: usize = 8;

/// `rows` as a list, with `, …` when `count` is more.
fn listed(rows: &[usize], count: usize) -> String {
    let list: Vec<String> = rows.iter().map(usize::to_string).collect();
    let more = if count > rows.len() { ", …" } else { "" };
    format!("{}{more}", list.join(", "))
}

/// Which kernel ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    /// The CPU kernel, as asked (`cpu`, or `auto` without a usable GPU or
    /// for a batch below [`GPU_MIN_ROWS`]); or the rescaled CPU kernel
    /// after either kernel's plain sums overflowed (`normalize::rescaled`).
    Cpu,
    /// The CUDA kernel.
    Cuda,
    /// The CPU kernel because the CUDA path failed: the driver, the device
    /// or the build cannot load or run the kernel module. Callers count it;
    /// the step itself is computed and published as usual.
    CpuFallback,
}

impl Ran {
    /// Short name for metric labels, log fields and the device header:
    /// `cpu`, `cuda` or `cpu_fallback`.
    pub fn as_str(self) -> &'static str {
        match self {
            Ran::Cpu => "cpu",
            Ran::Cuda => "cuda",
            Ran::CpuFallback => "cpu_fallback",
        }
    }
}
