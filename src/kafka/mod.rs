//! Kafka plumbing shared by both stages: client construction, the offset
//! tracker and its commit point, the dead-letter producer, the consume loop
//! and topic administration. No other module sees raw Kafka records.

pub mod admin;
pub mod client;
pub mod commit;
pub mod dlq;
pub mod produce;
pub mod stage_io;
pub mod tracker;
pub mod worker;

pub use client::{base_config, create_consumer, create_producer, StageConsumer, StageContext};
pub use commit::{Committer, Ticket};
pub use dlq::{DeadLetter, DeadLetters, DlqHeaders};
pub use produce::{send_until_acked, Outgoing};
pub use stage_io::StageIo;
pub use tracker::OffsetTracker;
pub use worker::{run_stage, shutdown_signal, Done, RecordMeta, Rejected, RunOptions, RunSummary, Work};
