//! Stage 2, `hintstream advantages`: assembles each training step's scored
//! rollouts into an Arrow batch, computes hint-augmented GRPO advantages
//! (GPU or CPU), and publishes them with the step's metrics.

pub mod assemble;
pub mod compute;
pub mod offline;
pub mod stage;
pub mod step_metrics;

pub use compute::{compute_batch, compute_rows, compute_step, StepResult};
