//! Kafka plumbing shared by both stages: client construction, the offset
//! tracker and its commit point, one handle per taken message, the
//! dead-letter producer, producing with bounds, the consume loop, the
//! stage's lifecycle and topic administration. No other module sees raw
//! Kafka records.

pub mod acl;
pub mod admin;
pub mod client;
pub mod commit;
pub mod connect;
pub mod dlq;
pub mod lifecycle;
pub mod message;
pub mod produce;
pub mod tracker;
pub mod worker;

pub use client::{
    base_config, client_config, create_consumer, create_producer, create_stage_producer, OutputContext,
    Partition, StageConsumer, StageContext, StageProducer,
};
pub use commit::{Committer, Ticket};
pub use connect::{check_cluster, ConnectError};
pub use dlq::{DeadLetter, DeadLetters, DlqHeaders};
pub use lifecycle::Lifecycle;
pub use message::{Delivery, RecordMeta, Rejected, Taken, HANDLER_PANIC};
pub use produce::{send, Outgoing, SendError};
pub use tracker::OffsetTracker;
pub use worker::{shutdown_signal, RunOptions, RunSummary, StageLoop, Work};
