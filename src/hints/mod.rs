//! Stage 1, `hintstream hints`: groups failed trajectories by
//! `run_id/step/instance_id`, picks each group's best trajectory, asks the LLM
//! for a hint (static fallback otherwise) and publishes one hint per group.

pub mod group;
pub mod stage;

pub use stage::{build_hint, HintStage};
