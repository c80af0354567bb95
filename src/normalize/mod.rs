//! Hint-augmented outcome advantages: one semantics per [`Estimator`], two
//! kernels (CPU and CUDA).
//!
//! *Baseline rows* are the rows a row is measured against. The reference
//! trainer (SkyRL-Fleet `ppo_utils.py`) applies its first-turn rule (if any
//! sample of the batch, one step, is hinted, baselines come from the raw
//! samples only) inside `compute_grpo_outcome_advantage` only, so:
//!
//! - grpo and drgrpo: raw rows only when a row of the step is hinted, every
//!   row otherwise, always (the reference's rule);
//! - rloo and reinforce_pp: every row, hinted or not, under
//!   [`HintBaseline::Reference`] (the default: the reference's RLOO and
//!   REINFORCE++ ignore `is_hinted`); under [`HintBaseline::Raw`] the grpo
//!   rule (ours).
//!
//! Then, with s a row's score:
//!
//! - [`Estimator::Grpo`] (the reference's `compute_grpo_outcome_advantage`):
//!   per group, mean and unbiased std (n − 1) of its baseline rows; a group
//!   with 0 or 1 baseline rows uses mean 0 and std 1; A = (s − mean) /
//!   (std + eps), or s − mean when `norm_by_std` is off.
//! - [`Estimator::Drgrpo`]: A = s − mean with GRPO's group mean, whatever
//!   `norm_by_std` says.
//! - [`Estimator::Rloo`] (`compute_rloo_outcome_advantage`): a baseline row's
//!   baseline is the mean of the *other* baseline rows of its group, a
//!   non-baseline (hinted, under `raw`) row's is the mean of all of them;
//!   A = s − baseline, which for a group of n baseline rows is the
//!   reference's (s − mean)·n/(n − 1). A group with at most one baseline row
//!   gets A = 0 for all its rows.
//! - [`Estimator::ReinforcePp`] (`compute_reinforce_plus_plus_outcome_advantage`
//!   with γ = 1, the outcome score on the last token, so every token's
//!   return is s): the reference's `masked_whiten` over the step's tokens,
//!   groups ignored. A row weighs its `response_length` L (the reference's
//!   `response_mask` sum; 1 when absent). Over the baseline rows, with N =
//!   ΣL: mean = ΣL·s / N, var = ΣL·(s − mean)² / (N − 1) (Bessel's
//!   correction over tokens); A = (s − mean) · rsqrt(var + whiten_eps),
//!   whiten_eps = `whiten_epsilon` (the reference's 1e-8; `epsilon` does not
//!   apply). N < 2, where the reference raises, gives mean 0 and var 1
//!   (ours). `batch_whiten`, its former name, is an alias.
//!
//! The output columns keep one invariant for every estimator: A = (s −
//! `group_mean`) / d, with d = `group_std` + eps for grpo with
//! `norm_by_std`, d = sqrt(`group_std`² + whiten_eps) for reinforce_pp and
//! d = 1 where nothing divides. So `group_mean` is the baseline actually
//! subtracted from the row: the group mean (grpo, drgrpo), the step's token
//! mean (reinforce_pp), or for rloo the leave-one-out mean (baseline rows),
//! the mean of all baseline rows (other rows) or the row's own score (groups
//! with ≤ 1 baseline row, A = 0). `group_std` is the std the row was divided
//! by (for reinforce_pp sqrt(var), floored when asked), or where nothing
//! divides (drgrpo, rloo, grpo without `norm_by_std`) the group's baseline
//! std as grpo computes it, informative only. Both columns are always finite
//! (for epsilons > 0).
//!
//! Output order is input order; accumulation is in f64 with two passes (sums,
//! then squared deviations from the mean), on CPU and GPU alike.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod groups;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use groups::DenseGroups;

/// The reference's epsilon.
pub const DEFAULT_EPSILON: f64 = 1e-6;

/// The reference's `masked_whiten` epsilon: `rsqrt(var + 1e-8)`.
pub const DEFAULT_WHITEN_EPSILON: f64 = 1e-8;

/// |advantage| above this counts as extreme in the step metrics: it happens
/// when a hinted success meets a baseline whose samples all scored the same.
pub const EXTREME_ADVANTAGE: f64 = 1e3;

/// Which advantage estimator a step is computed with (config
/// `normalize.estimator`; names on the wire and in config are `grpo`,
/// `drgrpo`, `rloo` and `reinforce_pp`, with `batch_whiten` read as an
/// alias of `reinforce_pp`). The module docs give the formulas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Estimator {
    /// Group mean and std of the baseline rows; the reference's default.
    #[default]
    Grpo,
    /// GRPO's group mean without the std division (Dr. GRPO).
    Drgrpo,
    /// Leave-one-out group mean (RLOO); 0 for a group of one.
    Rloo,
    /// The reference's REINFORCE++ for outcome rewards (γ = 1): scores
    /// whitened over the step's tokens. `batch_whiten` is read as this.
    #[serde(alias = "batch_whiten")]
    #[value(alias = "batch_whiten")]
    ReinforcePp,
}

impl Estimator {
    /// Every estimator, in declaration order (for tests, benches and checks).
    pub const ALL: [Estimator; 4] = [
        Estimator::Grpo,
        Estimator::Drgrpo,
        Estimator::Rloo,
        Estimator::ReinforcePp,
    ];

    /// The config and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Estimator::Grpo => "grpo",
            Estimator::Drgrpo => "drgrpo",
            Estimator::Rloo => "rloo",
            Estimator::ReinforcePp => "reinforce_pp",
        }
    }

    /// Whether A is divided by a std (`std + epsilon`, or for reinforce_pp
    /// `sqrt(var + whiten_epsilon)`) under `options`.
    pub fn divides_by_std(self, options: &AdvantageOptions) -> bool {
        match self {
            Estimator::Grpo => options.norm_by_std,
            Estimator::ReinforcePp => true,
            Estimator::Drgrpo | Estimator::Rloo => false,
        }
    }
}

impl Estimator {
    /// Whether the step's baseline rows are its raw rows only when `batch`
    /// has a hinted row: always for grpo and drgrpo (the reference's rule),
    /// for rloo and reinforce_pp only under [`HintBaseline::Raw`].
    pub fn raw_baselines(self, batch: &Batch<'_>, options: &AdvantageOptions) -> bool {
        let rule = match self {
            Estimator::Grpo | Estimator::Drgrpo => true,
            Estimator::Rloo | Estimator::ReinforcePp => options.hint_baseline == HintBaseline::Raw,
        };
        rule && batch.first_turn_baseline()
    }
}

/// Where rloo's and reinforce_pp's baselines come from in a step with hinted
/// rows (config `normalize.hint_baseline`). grpo and drgrpo always use raw
/// rows only, as the reference does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum HintBaseline {
    /// The reference's: rloo and reinforce_pp ignore `is_hinted`.
    #[default]
    Reference,
    /// Ours: rloo and reinforce_pp take baselines from raw rows only.
    Raw,
}

impl HintBaseline {
    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            HintBaseline::Reference => "reference",
            HintBaseline::Raw => "raw",
        }
    }
}

impl std::fmt::Display for HintBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Estimator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdvantageOptions {
    /// Divide by the group std (+ epsilon); when off, A = s − mean. Read by
    /// [`Estimator::Grpo`] only: drgrpo and rloo never divide, reinforce_pp
    /// always does.
    pub norm_by_std: bool,
    /// Added to the std before dividing (grpo only).
    pub epsilon: f64,
    /// Opt-in floor for the std of baselines with two or more samples (for
    /// reinforce_pp: two or more tokens). Off (`None`) by default for parity
    /// with the reference, where a std-0 baseline gives a hinted success an
    /// advantage of about 1e6. Applies to every estimator's `group_std` (so
    /// to the division of grpo and reinforce_pp).
    pub std_floor: Option<f64>,
    /// The estimator; `grpo` when absent.
    #[serde(default)]
    pub estimator: Estimator,
    /// Where rloo's and reinforce_pp's baselines come from in a step with
    /// hinted rows; `reference` when absent.
    #[serde(default)]
    pub hint_baseline: HintBaseline,
    /// reinforce_pp's `rsqrt(var + whiten_epsilon)`; 1e-8 when absent.
    #[serde(default = "default_whiten_epsilon")]
    pub whiten_epsilon: f64,
}

fn default_whiten_epsilon() -> f64 {
    DEFAULT_WHITEN_EPSILON
}

impl Default for AdvantageOptions {
    fn default() -> Self {
        AdvantageOptions {
            norm_by_std: true,
            epsilon: DEFAULT_EPSILON,
            std_floor: None,
            estimator: Estimator::Grpo,
            hint_baseline: HintBaseline::Reference,
            whiten_epsilon: DEFAULT_WHITEN_EPSILON,
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

/// Which kernel ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    /// The CPU kernel, as asked (`cpu`, or `auto` without a usable GPU or
    /// for a batch below [`GPU_MIN_ROWS`]).
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

/// Computes the advantages of `batch` on `device`.
///
/// A CUDA failure never fails the batch: under `cuda` (and under `auto` with
/// a GPU present) the batch is then computed on the CPU and the result says
/// [`Ran::CpuFallback`]. A module that cannot be loaded (no driver, a driver
/// too old for the PTX, no CUDA in this build) is logged once per process; a
/// failure while running is logged each time it happens. The only errors are
/// malformed batches ([`Batch::validate`]).
pub fn compute(
    batch: &Batch<'_>,
    options: &AdvantageOptions,
    device: Device,
) -> Result<(Advantages, Ran), NormalizeError> {
    batch.validate()?;
    let try_cuda = match device {
        Device::Cpu => false,
        Device::Cuda => true,
        Device::Auto => batch.len() >= GPU_MIN_ROWS && cuda_available(),
    };
    if !try_cuda {
        return Ok((cpu::compute(batch, options), Ran::Cpu));
    }
    match cuda(batch, options) {
        Ok(a) => Ok((a, Ran::Cuda)),
        Err(e) => {
            log_fallback(&e);
            Ok((cpu::compute(batch, options), Ran::CpuFallback))
        }
    }
}

/// Logs a CUDA failure that sends a batch to the CPU: once per process when
/// the module cannot be loaded (it will not load on the next step either),
/// every time for a failure while running.
fn log_fallback(e: &NormalizeError) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static UNAVAILABLE_LOGGED: AtomicBool = AtomicBool::new(false);
    match e {
        NormalizeError::CudaUnavailable(_) => {
            if !UNAVAILABLE_LOGGED.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "CUDA kernel cannot be loaded; computing every step on the CPU (logged once)");
            }
        }
        _ => tracing::warn!(error = %e, "CUDA kernel failed; computing this step on the CPU"),
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

/// Whether a CUDA device is present (never panics without libcuda). It does
/// not say the kernel module loads: [`cuda_check`] does.
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

/// Loads the CUDA kernel module (once per process) and says why it cannot be
/// used, if it cannot: for a startup log line or a health check.
pub fn cuda_check() -> Result<(), NormalizeError> {
    #[cfg(feature = "cuda")]
    {
        gpu::check()
    }
    #[cfg(not(feature = "cuda"))]
    {
        cuda(
            &Batch {
                group: &[],
                n_groups: 0,
                reward: &[],
                hinted: &[],
                response_length: &[],
            },
            &AdvantageOptions::default(),
        )
        .map(|_| ())
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
            response_length: &[],
        }
    }

    #[test]
    fn auto_runs_on_the_cpu_without_a_gpu_and_cuda_falls_back_without_failing() {
        let b = batch(&[0, 0, 1], &[1.0, 0.0, 1.0], &[false; 3]);
        let options = AdvantageOptions::default();
        let (want, ran) = compute(&b, &options, Device::Cpu).unwrap();
        assert_eq!(ran, Ran::Cpu);
        let (_, ran) = compute(&b, &options, Device::Auto).unwrap();
        assert_eq!(ran, Ran::Cpu, "a 3-row batch stays on the CPU under auto");
        if cuda_check().is_err() {
            // Twice: the second call must fall back the same way (and, by
            // reading the code, not log again).
            for _ in 0..2 {
                let (got, ran) = compute(&b, &options, Device::Cuda).unwrap();
                assert_eq!(ran, Ran::CpuFallback);
                assert_eq!(got, want);
            }
        }
    }

    /// The committed PTX loads on CUDA 12.0 drivers (ISA ≤ 8.0) and every
    /// GPU from Volta on (sm_70), and has every kernel gpu.rs launches.
    #[test]
    fn committed_ptx_targets_volta_with_an_isa_cuda_12_0_accepts() {
        let ptx = include_str!("../../kernels/advantage.ptx");
        let header = |key: &str| {
            ptx.lines()
                .find_map(|l| l.trim().strip_prefix(key).map(str::trim))
        };
        assert_eq!(header(".version"), Some("8.0"));
        assert_eq!(header(".target"), Some("sm_70"));
        for kernel in [
            "baseline_sums",
            "step_sums",
            "group_means",
            "baseline_squares",
            "step_squares",
            "group_stds",
            "advantages",
        ] {
            assert!(
                ptx.contains(&format!(".visible .entry {kernel}(")),
                "{kernel} missing from the PTX"
            );
        }
    }

    #[test]
    fn estimator_names_are_the_config_names() {
        for e in Estimator::ALL {
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(json, format!("\"{}\"", e.as_str()));
            assert_eq!(serde_json::from_str::<Estimator>(&json).unwrap(), e);
            let value = <Estimator as clap::ValueEnum>::to_possible_value(&e).unwrap();
            assert_eq!(value.get_name(), e.as_str());
        }
        assert_eq!(
            ["grpo", "drgrpo", "rloo", "reinforce_pp"],
            Estimator::ALL.map(Estimator::as_str)
        );
        assert!(serde_json::from_str::<Estimator>("\"reinforce++\"").is_err());
        // The former name is read as an alias, in config and on the CLI.
        assert_eq!(
            serde_json::from_str::<Estimator>("\"batch_whiten\"").unwrap(),
            Estimator::ReinforcePp
        );
        assert_eq!(
            <Estimator as clap::ValueEnum>::from_str("batch_whiten", false),
            Ok(Estimator::ReinforcePp)
        );
    }

    #[test]
    fn options_default_the_estimator_and_reject_unknown_fields() {
        let o: AdvantageOptions =
            serde_json::from_str(r#"{"norm_by_std": true, "epsilon": 1e-6, "std_floor": null}"#).unwrap();
        assert_eq!(o, AdvantageOptions::default());
        let o: AdvantageOptions = serde_json::from_str(
            r#"{"norm_by_std": true, "epsilon": 1e-6, "std_floor": null, "estimator": "batch_whiten"}"#,
        )
        .unwrap();
        assert_eq!(o.estimator, Estimator::ReinforcePp);
        assert!(serde_json::from_str::<AdvantageOptions>(
            r#"{"norm_by_std": true, "epsilon": 1e-6, "std_floor": null, "estimatr": "rloo"}"#
        )
        .is_err());
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
