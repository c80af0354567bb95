//! The CUDA kernel through cudarc: every estimator with the same two-pass f64
//! semantics as [`super::cpu`]. The only module that imports cudarc. Kernels
//! ship as PTX (`kernels/advantage.ptx`: compute_70, PTX ISA 8.0, which CUDA
//! 12.0 and newer drivers JIT for Volta, Turing, Ampere, Ada and Hopper) and
//! libcuda is loaded on first use, so a machine without CUDA builds and runs
//! this crate on the CPU path.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::batch::{Advantages, Batch, NormalizeError};
use super::estimator::{AdvantageOptions, Estimator};

/// The committed PTX of `kernels/advantage.cu`.
pub const ADVANTAGE_PTX: &str = include_str!("../../kernels/advantage.ptx");

/// Threads per block of every launch.
const BLOCK: u32 = 256;
/// Upper bound on blocks per launch; kernels stride over the rest.
const MAX_BLOCKS: u32 = 65_535;
/// Blocks of the whole-step reductions (each block adds one partial sum
/// atomically); `REDUCE_THREADS` in advantage.cu must equal [`BLOCK`].
const REDUCE_BLOCKS: u32 = 1_024;

/// The loaded module and its functions, shared by every call.
struct Kernels {
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    baseline_sums: CudaFunction,
    step_sums: CudaFunction,
    group_means: CudaFunction,
    baseline_squares: CudaFunction,
    step_squares: CudaFunction,
    group_stds: CudaFunction,
    advantages: CudaFunction,
}

static KERNELS: OnceLock<Result<Kernels, String>> = OnceLock::new();

/// True when libcuda loads and reports at least one device. Never panics:
/// `CudaContext::new` panics when libcuda is absent, so presence is checked
/// first.
pub fn available() -> bool {
    // SAFETY: probes for the shared library; no CUDA call is made.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    present && CudaContext::device_count().map(|n| n > 0).unwrap_or(false)
}

/// Loads the module (once per process) and says why it cannot be used.
pub fn check() -> Result<(), NormalizeError> {
    kernels().map(|_| ())
}

/// What a report says about GPU 0: its name, compute capability and the
/// driver's CUDA version (`13000` for 13.0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub driver_cuda_version: i32,
}

/// Describes GPU 0 and its driver.
pub fn device_info() -> Result<DeviceInfo, NormalizeError> {
    if !available() {
        return Err(NormalizeError::CudaUnavailable(
            "no CUDA driver or device on this machine".into(),
        ));
    }
    let ctx = CudaContext::new(0).map_err(device_error)?;
    let mut version = 0;
    // SAFETY: writes one int; CudaContext::new loaded and initialised the
    // driver.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(device_error)?;
    Ok(DeviceInfo {
        name: ctx.name().map_err(device_error)?,
        compute_capability: ctx.compute_capability().map_err(device_error)?,
        driver_cuda_version: version,
    })
}

fn kernels() -> Result<&'static Kernels, NormalizeError> {
    KERNELS
        .get_or_init(|| {
            if !available() {
                return Err("no CUDA driver or device on this machine".to_string());
            }
            let ctx = CudaContext::new(0).map_err(|e| e.to_string())?;
            let module = ctx
                .load_module(Ptx::from_src(ADVANTAGE_PTX))
                .map_err(|e| e.to_string())?;
            let f = |name: &str| module.load_function(name).map_err(|e| format!("{name}: {e}"));
            Ok(Kernels {
                stream: ctx.default_stream(),
                baseline_sums: f("baseline_sums")?,
                step_sums: f("step_sums")?,
                group_means: f("group_means")?,
                baseline_squares: f("baseline_squares")?,
                step_squares: f("step_squares")?,
                group_stds: f("group_stds")?,
                advantages: f("advantages")?,
                _module: module,
            })
        })
        .as_ref()
        .map_err(|e| NormalizeError::CudaUnavailable(e.clone()))
}

fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS as usize) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn device_error(e: cudarc::driver::DriverError) -> NormalizeError {
    NormalizeError::Device(e.to_string())
}

/// The `estimator` argument of the `advantages` kernel.
fn estimator_code(e: Estimator) -> i32 {
    match e {
        Estimator::Grpo => 0,
        Estimator::Drgrpo => 1,
        Estimator::Rloo => 2,
        Estimator::ReinforcePp => 3,
    }
}

/// Computes the advantages on GPU 0; `batch` must have passed
/// [`Batch::validate`]. Outputs may be non-finite for rewards too large for
/// plain sums ([`compute_checked`] says so; `normalize::compute` never lets
/// them out).
pub fn compute(batch: &Batch<'_>, options: &AdvantageOptions) -> Result<Advantages, NormalizeError> {
    compute_checked(batch, options).map(|(advantages, _)| advantages)
}

/// [`compute`], with whether every advantage, group_mean and group_std is
/// finite (flagged by the `advantages` kernel as it writes them: one int
/// comes back, no pass over the outputs).
// long-fn: one kernel launch sequence (upload, six launches, download) that
// reads best in one piece: each launch's argument list mirrors its kernel's
// signature in kernels/advantage.cu, and splitting it would only pass the
// dozen device buffers around.
pub fn compute_checked(
    batch: &Batch<'_>,
    options: &AdvantageOptions,
) -> Result<(Advantages, bool), NormalizeError> {
    let n = batch.len();
    if n == 0 {
        return Ok((Advantages::default(), true));
    }
    let k = kernels()?;
    let s = &k.stream;
    let whole_step = options.estimator == Estimator::ReinforcePp;
    // reinforce_pp keeps its statistics in one slot, index 0.
    let groups = if whole_step { 1 } else { batch.n_groups.max(1) };
    let hinted: Vec<u8> = batch.hinted.iter().map(|&h| u8::from(h)).collect();
    let first_turn = i32::from(options.estimator.raw_baselines(batch, options));
    let (n64, g64) = (n as u64, groups as u64);
    // Response lengths (reinforce_pp): rows at or past `n_lengths` weigh 1;
    // one dummy element when there are none, so the buffer is never empty.
    let n_lengths = if whole_step {
        batch.response_length.len() as u64
    } else {
        0
    };
    let lengths: &[u32] = if n_lengths > 0 {
        batch.response_length
    } else {
        &[1]
    };
    // The epsilon of the division: reinforce_pp's sqrt(std² + whiten_eps),
    // grpo's std + eps.
    let epsilon = if whole_step {
        options.whiten_epsilon
    } else {
        options.epsilon
    };

    let group = s.clone_htod(batch.group).map_err(device_error)?;
    let reward = s.clone_htod(batch.reward).map_err(device_error)?;
    let hinted = s.clone_htod(&hinted).map_err(device_error)?;
    let length = s.clone_htod(lengths).map_err(device_error)?;
    let mut sum = s.alloc_zeros::<f64>(groups).map_err(device_error)?;
    let mut count = s.alloc_zeros::<u64>(groups).map_err(device_error)?;
    let mut mean = s.alloc_zeros::<f64>(groups).map_err(device_error)?;
    let mut squares = s.alloc_zeros::<f64>(groups).map_err(device_error)?;
    let mut std = s.alloc_zeros::<f64>(groups).map_err(device_error)?;
    let mut advantage = s.alloc_zeros::<f64>(n).map_err(device_error)?;
    let mut row_mean = s.alloc_zeros::<f64>(n).map_err(device_error)?;
    let mut row_std = s.alloc_zeros::<f64>(n).map_err(device_error)?;
    let mut non_finite = s.alloc_zeros::<i32>(1).map_err(device_error)?;
    let has_floor = i32::from(options.std_floor.is_some());
    let floor = options.std_floor.unwrap_or(0.0);
    let estimator = estimator_code(options.estimator);
    let divide = i32::from(options.estimator.divides_by_std(options));
    let whole = i32::from(whole_step);
    let reduce = LaunchConfig {
        grid_dim: (
            n.div_ceil(BLOCK as usize).clamp(1, REDUCE_BLOCKS as usize) as u32,
            1,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };

    // SAFETY (all launches): argument lists match the kernel signatures in
    // kernels/advantage.cu, every buffer holds at least the n or `groups`
    // elements the kernel indexes (index 0 only when whole_step; `length`
    // below n_lengths only, which validate keeps <= n; `non_finite` at 0
    // only), group ids were checked < n_groups, and the reductions run with
    // BLOCK threads.
    unsafe {
        if whole_step {
            s.launch_builder(&k.step_sums)
                .arg(&reward)
                .arg(&hinted)
                .arg(&length)
                .arg(&n_lengths)
                .arg(&first_turn)
                .arg(&n64)
                .arg(&mut sum)
                .arg(&mut count)
                .launch(reduce)
                .map_err(device_error)?;
        } else {
            s.launch_builder(&k.baseline_sums)
                .arg(&group)
                .arg(&reward)
                .arg(&hinted)
                .arg(&first_turn)
                .arg(&n64)
                .arg(&mut sum)
                .arg(&mut count)
                .launch(grid(n))
                .map_err(device_error)?;
        }
        s.launch_builder(&k.group_means)
            .arg(&sum)
            .arg(&count)
            .arg(&g64)
            .arg(&mut mean)
            .launch(grid(groups))
            .map_err(device_error)?;
        if whole_step {
            s.launch_builder(&k.step_squares)
                .arg(&reward)
                .arg(&hinted)
                .arg(&length)
                .arg(&n_lengths)
                .arg(&first_turn)
                .arg(&n64)
                .arg(&mean)
                .arg(&mut squares)
                .launch(reduce)
                .map_err(device_error)?;
        } else {
            s.launch_builder(&k.baseline_squares)
                .arg(&group)
                .arg(&reward)
                .arg(&hinted)
                .arg(&first_turn)
                .arg(&n64)
                .arg(&mean)
                .arg(&mut squares)
                .launch(grid(n))
                .map_err(device_error)?;
        }
        s.launch_builder(&k.group_stds)
            .arg(&squares)
            .arg(&count)
            .arg(&g64)
            .arg(&has_floor)
            .arg(&floor)
            .arg(&mut std)
            .launch(grid(groups))
            .map_err(device_error)?;
        s.launch_builder(&k.advantages)
            .arg(&group)
            .arg(&reward)
            .arg(&hinted)
            .arg(&first_turn)
            .arg(&n64)
            .arg(&sum)
            .arg(&count)
            .arg(&mean)
            .arg(&std)
            .arg(&estimator)
            .arg(&divide)
            .arg(&epsilon)
            .arg(&whole)
            .arg(&mut advantage)
            .arg(&mut row_mean)
            .arg(&mut row_std)
            .arg(&mut non_finite)
            .launch(grid(n))
            .map_err(device_error)?;
    }
    let advantages = Advantages {
        advantage: s.clone_dtoh(&advantage).map_err(device_error)?,
        group_mean: s.clone_dtoh(&row_mean).map_err(device_error)?,
        group_std: s.clone_dtoh(&row_std).map_err(device_error)?,
    };
    let flag = s.clone_dtoh(&non_finite).map_err(device_error)?;
    Ok((advantages, flag.first() == Some(&0)))
}
