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
//! std as grpo computes it, informative only.
//!
//! Output order is input order; accumulation is in f64 with two passes (sums,
//! then squared deviations from the mean), on CPU and GPU alike.
//!
//! **Finite or refused.** Every advantage, group_mean and group_std that
//! [`compute`] returns is finite, checked. Each kernel flags a non-finite
//! output as it writes it (no extra pass); a flagged batch is computed again
//! on the CPU with each group's rewards divided by a power of two
//! ([`rescaled`], [`finite`]), which gives finite results for any finite
//! rewards whose mean, std and advantages f64 can hold (two rewards of
//! 1.7e308, ±1e200, one huge row among a reinforce_pp step). Where even
//! those are beyond f64's range (a std above 1.8e308; a hinted success over
//! a std-0 baseline that epsilon cannot bring into range), the batch is
//! refused with [`NormalizeError::RewardOutOfRange`], naming the rows. On
//! ordinary rewards nothing changes: the kernels run as before and the
//! flag is their only addition.

pub mod batch;
pub mod clashes;
pub mod cpu;
pub mod estimator;
pub mod finite;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod groups;
pub mod offpolicy;
pub mod rescaled;

pub use batch::{Advantages, Batch, Device, NormalizeError, Ran, GPU_MIN_ROWS, OUT_OF_RANGE_ROWS_SHOWN};
pub use estimator::{
    AdvantageOptions, Estimator, HintBaseline, DEFAULT_EPSILON, DEFAULT_WHITEN_EPSILON, EXTREME_ADVANTAGE,
};
pub use groups::DenseGroups;
pub use offpolicy::HintedWeight;

/// Computes the advantages of `batch` on `device`.
///
/// A CUDA failure never fails the batch: under `cuda` (and under `auto` with
/// a GPU present) the batch is then computed on the CPU and the result says
/// [`Ran::CpuFallback`]. A module that cannot be loaded (no driver, a driver
/// too old for the PTX, no CUDA in this build) is logged once per process; a
/// failure while running is logged each time it happens. The errors are
/// malformed batches ([`Batch::validate`]) and batches without a finite
/// result ([`NormalizeError::RewardOutOfRange`]; see the module docs): every
/// output returned is finite.
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
    let ((advantages, finite), ran) = if try_cuda {
        match cuda(batch, options) {
            Ok(computed) => (computed, Ran::Cuda),
            Err(e) => {
                log_fallback(&e);
                (cpu::compute_checked(batch, options), Ran::CpuFallback)
            }
        }
    } else {
        (cpu::compute_checked(batch, options), Ran::Cpu)
    };
    if finite {
        return Ok((advantages, ran));
    }
    finite_or_refused(batch, options).map(|a| (a, Ran::Cpu))
}

/// The batch computed on rescaled rewards, once a kernel's outputs were
/// not all finite: its results when they are all finite, else the refusal
/// naming the rows that are not.
fn finite_or_refused(batch: &Batch<'_>, options: &AdvantageOptions) -> Result<Advantages, NormalizeError> {
    let advantages = rescaled::compute(batch, options);
    let bad: Vec<usize> = finite::non_finite_rows(&advantages).collect();
    if bad.is_empty() {
        tracing::debug!(
            rows = batch.len(),
            "rewards too large for plain sums; computed on rescaled rewards"
        );
        return Ok(advantages);
    }
    Err(NormalizeError::RewardOutOfRange {
        count: bad.len(),
        rows: bad.into_iter().take(OUT_OF_RANGE_ROWS_SHOWN).collect(),
        max_abs_reward: batch.reward.iter().fold(0.0, |m: f64, r| m.max(r.abs())),
        epsilon: if options.estimator == Estimator::ReinforcePp {
            options.whiten_epsilon
        } else {
            options.epsilon
        },
    })
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

/// The CUDA kernel's outputs, with whether they are all finite.
#[cfg(feature = "cuda")]
fn cuda(batch: &Batch<'_>, options: &AdvantageOptions) -> Result<(Advantages, bool), NormalizeError> {
    gpu::compute_checked(batch, options)
}

#[cfg(not(feature = "cuda"))]
fn cuda(_batch: &Batch<'_>, _options: &AdvantageOptions) -> Result<(Advantages, bool), NormalizeError> {
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
    fn rewards_too_large_for_plain_sums_are_finite_or_refused_on_every_device() {
        let options = AdvantageOptions::default();
        for device in [Device::Cpu, Device::Auto, Device::Cuda] {
            // Two of 1.7e308 (the sum overflows) and ±1e200 (the squares do).
            let b = batch(&[0, 0, 1, 1], &[1.7e308, 1.7e308, 1e200, -1e200], &[false; 4]);
            let (a, _) = compute(&b, &options, device).unwrap();
            assert_eq!(finite::first_non_finite(&a), None, "{device:?}: {a:?}");
            assert_eq!(a.advantage[..2], [0.0, 0.0]);
            assert_eq!(a.group_mean[..2], [1.7e308, 1.7e308]);
            assert!((a.advantage[2] - 0.5f64.sqrt()).abs() < 1e-12, "{a:?}");
            // A std of 2.4e308 cannot be held: refused, naming the rows.
            let b = batch(&[0, 0, 1], &[1.7e308, -1.7e308, 1.0], &[false; 3]);
            let err = compute(&b, &options, device).unwrap_err();
            let NormalizeError::RewardOutOfRange { rows, count, .. } = &err else {
                panic!("{err}");
            };
            assert_eq!((rows.as_slice(), *count), ([0, 1].as_slice(), 2));
            let text = err.to_string();
            assert!(text.contains("rows 0, 1;") && text.contains("1.7e308"), "{text}");
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
