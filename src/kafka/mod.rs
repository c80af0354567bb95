//! Kafka plumbing shared by both stages: client construction, the offset
//! tracker and its commit point, one handle per taken message, the
//! dead-letter producer, producing with bounds, the transactions of
//! exactly-once delivery, the consume loop and the stage contract it drives, and topic administration. The stages see
//! records only through what this module hands them (`Taken`,
//! `RecordMeta`); the tools (`record`, `replay`), `eval` and the quick
//! start's readers read and write topics directly, as a client would.

pub mod acl;
pub mod admin;
pub mod client;
pub mod commit;
pub mod connect;
pub mod contract;
pub mod dlq;
pub mod embedded;
pub mod message;
pub mod produce;
pub mod tail;
pub mod tracker;
pub mod transaction;
pub mod worker;

pub use client::{
    base_config, client_config, create_consumer, create_producer, create_stage_producer,
    create_transactional_producer, AssignmentHook, OutputContext, Partition, StageConsumer, StageContext,
    StageProducer,
};
pub use commit::{Committer, Ticket};
pub use connect::{check_cluster, check_topic_access, partition_count, ConnectError};
pub use contract::{Parked, Stage, Work};
pub use dlq::{DeadLetter, DeadLetters, DlqHeaders};
pub use embedded::EmbeddedBroker;
pub use message::{Delivery, RecordMeta, Rejected, Taken, HANDLER_PANIC};
pub use produce::{send, Outgoing, SendError};
pub use tail::{TailError, TopicTail};
pub use tracker::OffsetTracker;
pub use transaction::{finish_together, send_output, Transactions};
pub use worker::{shutdown_signal, RunOptions, RunSummary, StageLoop};
