//! Kafka plumbing shared by both stages: client settings and construction
//! (`settings`, `consumer` with its `context` and how long it may stay out of
//! its group, `membership`; `producers`), the offset
//! tracker and its commit point, one handle per taken message and its
//! intake holds, the dead-letter producer, producing with bounds, the
//! delivery guarantee (`guarantee`: at-least-once, or exactly-once over the
//! worker's `transaction`s, their `held` outputs and how each `ending` goes), the consume loop and the stage contract it
//! drives (with the output obligations, `Settlement`, and the `settler`
//! that settles outputs off their handlers; a message's handler future,
//! `handler`; and a pipelined stage's decode and ordered handoff,
//! `pipeline`), whole-topic readers,
//! start-up checks and topic administration. The stages see
//! records only through what this module hands them (`Taken`,
//! `RecordMeta`); the tools (`record`, `replay`), `eval` and the quick
//! start's readers read and write topics directly, as a client would.

pub mod acl;
pub mod admin;
pub mod commit;
pub mod connect;
pub mod consumer;
pub mod context;
pub mod contract;
pub mod dlq;
pub mod embedded;
pub mod ending;
pub mod guarantee;
mod handler;
pub mod held;
pub mod hold;
pub mod membership;
pub mod message;
pub mod partition;
pub mod pipeline;
pub mod produce;
pub mod producers;
pub mod settings;
pub mod settler;
pub mod tail;
pub mod tracker;
pub mod transaction;
pub(crate) mod transient;
pub mod worker;

pub use commit::{Committer, Ticket};
pub use connect::{check_cluster, check_topic_access, partition_count, ConnectError};
pub use consumer::{create_consumer, StageConsumer};
pub use context::{AssignmentHook, RevokeHook, StageContext};
pub use contract::{Published, Settlement, Stage, Work, OUTPUT_REJECTED};
pub use dlq::{DeadLetter, DeadLetters, DlqHeaders};
pub use embedded::EmbeddedBroker;
pub use guarantee::{Guarantee, TransactionalProducer};
pub use hold::{Hold, Holds};
pub use message::{Delivery, RecordMeta, Rejected, Taken, HANDLER_PANIC};
pub use partition::Partition;
pub use produce::{send, Outgoing, SendError};
pub use producers::{
    connect_output, create_dlq_producer, create_producer, create_producer_lingering, create_stage_producer,
    create_transactional_producer, Linger, OutputContext, StageProducer, IDEMPOTENT_IN_FLIGHT,
};
pub use settings::{base_config, client_config};
pub use tail::{TailError, TopicTail};
pub use tracker::OffsetTracker;
pub use transaction::Transactions;
pub use worker::{shutdown_signal, RunOptions, RunSummary, StageLoop, Under};
