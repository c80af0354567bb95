//! Kafka plumbing shared by both stages: client construction, the offset
//! tracker and its commit point, the dead-letter producer, the consume loop
//! and topic administration. No other module sees raw Kafka records.

pub mod admin;
pub mod client;
pub mod commit;
pub mod dlq;
pub mod tracker;
pub mod worker;

pub use client::{base_config, create_consumer, create_producer, StageConsumer, StageContext};
pub use commit::{Committer, Ticket};
pub use dlq::{DeadLetters, DlqHeaders};
pub use tracker::OffsetTracker;
pub use worker::{run_stage, Done, RecordMeta, RunOptions, RunSummary, Work};
