//! Hint-augmented GRPO advantages: one semantics, two kernels (CPU and CUDA).
//!
//! The semantics are the reference trainer's `compute_grpo_outcome_advantage`:
//! - if any sample of the batch is hinted, each group's mean and std come from
//!   its raw (unhinted) samples only, and hinted samples are normalised with
//!   that baseline; otherwise standard GRPO over all samples of the group;
//! - a group with 0 or 1 baseline samples uses mean 0 and std 1;
//! - std is unbiased (n − 1); A = (s − mean) / (std + eps), or s − mean when
//!   `norm_by_std` is off; output order is input order;
//! - accumulation is in f64 with two passes, on CPU and GPU alike.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod groups;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use groups::DenseGroups;

/// The reference's epsilon.
pub const DEFAULT_EPSILON: f64 = 1e-6;

/// |advantage| above this counts as extreme in the step metrics: it happens
/// when a hinted success meets a baseline whose samples all scored the same.
pub const EXTREME_ADVANTAGE: f64 = 1e3;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdvantageOptions {
    /// Divide by the group std (+ epsilon); when off, A = s − mean.
    pub norm_by_std: bool,
    pub epsilon: f64,
    /// Opt-in floor for the std of baselines with two or more samples. Off
    /// (`None`) by default for parity with the reference, where a std-0
    /// baseline gives a hinted success an advantage of about 1e6.
    pub std_floor: Option<f64>,
}

impl Default for AdvantageOptions {
    fn default() -> Self {
        AdvantageOptions {
            norm_by_std: true,
            epsilon: DEFAULT_EPSILON,
            std_floor: None,
        }
    }
}

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
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.group.len()
    }

    pub fn is_empty(&self) -> bool {
        self.group.is_empty()
    }

    /// First-turn baseline: only raw samples form the baseline when any
    /// sample is hinted.
    pub fn first_turn_baseline(&self) -> bool {
        self.hinted.iter().any(|&h| h)
    }
}

/// Which kernel ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    Cpu,
    Cuda,
}

/// Computes the advantages of `batch` on `device`.
pub fn compute(
    batch: &Batch<'_>,
    options: &AdvantageOptions,
    device: Device,
) -> Result<(Advantages, Ran), NormalizeError> {
    batch.validate()?;
    match device {
        Device::Cpu => Ok((cpu::compute(batch, options), Ran::Cpu)),
        Device::Cuda => cuda(batch, options).map(|a| (a, Ran::Cuda)),
        Device::Auto if batch.len() >= GPU_MIN_ROWS && cuda_available() => match cuda(batch, options) {
            Ok(a) => Ok((a, Ran::Cuda)),
            Err(e) => {
                tracing::warn!(error = %e, "CUDA kernel failed; computing on the CPU");
                Ok((cpu::compute(batch, options), Ran::Cpu))
            }
        },
        Device::Auto => Ok((cpu::compute(batch, options), Ran::Cpu)),
    }
}

#[cfg(feature = "cuda")]
fn cuda(batch: &Batch<'_>, options: &AdvantageOptions) -> Result<Advantages, NormalizeError> {
    gpu::compute(batch, options)
}

#[cfg(not(feature = "cuda"))]
fn cuda(_batch: &Batch<'_>, _options: &AdvantageOptions) -> Result<Advantages, NormalizeError> {
    Err(NormalizeError::CudaUnavailable(
        "this build has no CUDA support (rebuild with --features cuda)".into(),
    ))
}

/// Whether a CUDA device can be used (never panics without libcuda).
pub fn cuda_available() -> bool {
    #[cfg(feature = "cuda")]
    {
        gpu::available()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch<'a>(group: &'a [u32], reward: &'a [f64], hinted: &'a [bool]) -> Batch<'a> {
        Batch {
            group,
            n_groups: 2,
            reward,
            hinted,
        }
    }

    #[test]
    fn auto_runs_on_the_cpu_without_a_gpu_and_cuda_is_an_error_not_a_panic() {
        let b = batch(&[0, 0, 1], &[1.0, 0.0, 1.0], &[false; 3]);
        let (_, ran) = compute(&b, &AdvantageOptions::default(), Device::Auto).unwrap();
        if !cuda_available() {
            assert_eq!(ran, Ran::Cpu);
            let err = compute(&b, &AdvantageOptions::default(), Device::Cuda).unwrap_err();
            assert!(matches!(err, NormalizeError::CudaUnavailable(_)), "{err}");
        }
    }

    #[test]
    fn rejects_malformed_batches() {
        let err = compute(
            &batch(&[0, 5], &[1.0, 0.0], &[false; 2]),
            &AdvantageOptions::default(),
            Device::Cpu,
        );
        assert!(matches!(err, Err(NormalizeError::GroupOutOfRange { row: 1, .. })));
        let err = compute(
            &batch(&[0], &[f64::NAN], &[false]),
            &AdvantageOptions::default(),
            Device::Cpu,
        );
        assert!(matches!(err, Err(NormalizeError::NonFinite { row: 0 })));
        let err = compute(
            &batch(&[0], &[1.0, 2.0], &[false]),
            &AdvantageOptions::default(),
            Device::Cpu,
        );
        assert!(matches!(err, Err(NormalizeError::LengthMismatch { .. })));
    }
}
