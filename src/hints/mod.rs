//! Stage 1, `hintstream hints`: groups failed trajectories by
//! `run_id/step/instance_id`, picks each group's best trajectory, asks the LLM
//! for a hint (static fallback otherwise) and publishes one hint per group.
//!
//! - [`decode`]: what a group member keeps of its message;
//! - [`group`]: gathering a group and picking its best member;
//! - [`hint`]: the `Hint` message built from a synthesis;
//! - [`cache`]: one LLM call per group, whatever the redeliveries;
//! - [`failure`]: the stage's own reasons not to start (its model
//!   clients, its ledger), as the shell carries them;
//! - [`leak`]: the leak guard (`hints.on_leak`): a hint that states an
//!   expected value, flagged, or asked for again;
//! - [`learning`]: hints that learn ([`crate::learn`]) in the stage: the arms' synthesizers, the
//!   topic readers, the read barrier, what a group's hint is written with;
//! - [`ledger`]: the group's spend ledger and rate share, which make the
//!   LLM limits the consumer group's;
//! - [`ledger_share`]: the ledger's rounds and the share mode a worker
//!   enters when it cannot read the ledger;
//! - [`metrics`]: the stage's Prometheus metrics;
//! - [`service`]: build and run.

pub mod cache;
pub mod decode;
pub mod failure;
pub mod group;
pub mod hint;
pub mod leak;
pub mod learning;
pub mod ledger;
pub mod ledger_share;
pub mod metrics;
pub mod service;

pub use hint::{build_hint, HintLabels};
pub use service::HintStage;
