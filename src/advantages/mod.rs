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
//! - [`outcomes`]: a step's `HintOutcome`s, one per `hint_id`;
//! - [`learning`]: the outcomes topic's start-up rule and the per-arm step
//!   metrics from a tail of `rl.hints`;
//! - [`trace`]: a step's span and the input trace it continues;
//! - [`offline`]: `advantages compute` on files.

pub mod assemble;
pub mod compute;
pub mod decode;
pub mod learning;
pub mod metrics;
pub mod offline;
pub mod outcomes;
pub mod publish;
pub mod service;
pub mod step_metrics;
pub mod trace;

pub use compute::{compute_batch, compute_rows, compute_step, StepResult};
