//! Stage 2, `hintstream advantages`: assembles each training step's scored
//! rollouts into an Arrow batch, computes hint-augmented GRPO advantages
//! (GPU or CPU), and publishes them with the step's metrics.
//!
//! - [`decode`]: messages of `rl.rollouts.scored` (JSON rows, step ends,
//!   Arrow batches);
//! - [`assemble`]: gathering a step's rows, under a byte bound;
//! - [`compute`]: from rows to advantages and the published Arrow batch;
//! - [`step_metrics`]: the per-step metrics published on `rl.metrics`;
//! - [`metrics`]: the stage's Prometheus metrics;
//! - [`service`]: build and run;
//! - [`publish`]: a complete step's compute, encode and sends;
//! - [`trace`]: a step's span and the input trace it continues;
//! - [`offline`]: `advantages compute` on files.

pub mod assemble;
pub mod compute;
pub mod decode;
pub mod metrics;
pub mod offline;
pub mod outcomes;
pub mod publish;
pub mod service;
pub mod step_metrics;
pub mod trace;

pub use compute::{compute_batch, compute_rows, compute_step, StepResult};
