//! The delivery guarantee a worker runs under (`kafka.delivery`): the one
//! seam between at-least-once and exactly-once. The consume loop, the
//! consumer's context and every taken message hold the same [`Guarantee`];
//! nothing else asks which of the two it is.
//!
//! - **At least once**: an output or dead letter is produced until the
//!   broker acknowledges it, then its inputs finish, and the tracker's
//!   contiguous finished offset is stored and committed by the consumer
//!   ([`commit`](super::commit)).
//! - **Exactly once**: an output or dead letter joins the worker's
//!   transactions with its inputs' offsets (see
//!   [`transaction`](super::transaction)); finished inputs keep their intake
//!   holds until a commit passes them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::error::KafkaError;

use super::dlq::{DeadLetter, DeadLetters};
use super::held::Inputs;
use super::hold::Holds;
use super::partition::Partition;
use super::produce::{send, send_all, Outgoing, SendError};
use super::producers::StageProducer;
use super::tracker::{OffsetTracker, Ticket};
use super::transaction::Transactions;
use crate::health::Lifecycle;
use crate::metrics::StageMetrics;

/// How a worker's outputs, dead letters and input offsets reach the broker;
/// cheap to clone (the transactions are shared).
#[derive(Clone, Default)]
pub enum Guarantee {
    /// Produced until acknowledged, then the offset stored.
    #[default]
    AtLeastOnce,
    /// In the worker's transactions, with the offsets.
    ExactlyOnce(Transactions),
}

/// What exactly-once needs to start: the worker's transactional producer
/// (made by [`create_transactional_producer`](super::create_transactional_producer))
/// and its `transactional.id`.
pub struct TransactionalProducer {
    pub producer: StageProducer,
    pub transactional_id: String,
    /// `kafka.transaction_interval_ms`.
    pub interval: Duration,
    /// `kafka.transaction_timeout_ms`: the bound of each transaction call.
    pub call_timeout: Duration,
    /// Where retried commits and aborts are counted.
    pub metrics: Arc<StageMetrics>,
}

impl Guarantee {
    /// Exactly once over `producer`: initialises its transactions (fencing
    /// an older instance of the same `transactional.id`) within `within`,
    /// off the async workers.
    pub async fn exactly_once(
        producer: TransactionalProducer,
        tracker: Arc<Mutex<OffsetTracker>>,
        lifecycle: Lifecycle,
        within: Duration,
    ) -> Result<Guarantee, KafkaError> {
        let TransactionalProducer {
            producer,
            transactional_id,
            interval,
            call_timeout,
            metrics,
        } = producer;
        let transactions = tokio::task::spawn_blocking(move || {
            Transactions::init(
                producer,
                tracker,
                lifecycle,
                metrics,
                transactional_id,
                interval,
                call_timeout,
                within,
            )
        })
        .await
        .map_err(|_| KafkaError::Canceled)??;
        Ok(Guarantee::ExactlyOnce(transactions))
    }

    /// The worker's transactions, under exactly_once: the loop runs their
    /// timer and rewinds after an abort.
    pub fn transactions(&self) -> Option<&Transactions> {
        match self {
            Guarantee::AtLeastOnce => None,
            Guarantee::ExactlyOnce(t) => Some(t),
        }
    }

    /// A finished input's intake holds: under exactly_once they stay until
    /// a commit passes its offset; otherwise they go now.
    pub(crate) fn keep(&self, ticket: &Ticket, holds: Holds) {
        if let Guarantee::ExactlyOnce(t) = self {
            t.keep(ticket, holds);
        }
    }

    /// Inputs that finish together: under exactly_once no commit passes
    /// some of them but not the others, and they are returned, shared, for
    /// the outputs made from them ([`Guarantee::send_output`]). At least
    /// once they are not read (a step of 100,000 JSON rows collected its
    /// tickets for each of its chunks: 5% of the worker's CPU).
    pub(crate) fn bind(&self, inputs: impl FnOnce() -> Vec<Ticket>) -> Option<Inputs> {
        let Guarantee::ExactlyOnce(t) = self else {
            return None;
        };
        let inputs = Inputs::new(inputs());
        t.bind(inputs.clone());
        Some(inputs)
    }

    /// An output made from `inputs`: produced until acknowledged, or under
    /// exactly_once held until their offsets are passed and then committed
    /// with them (this returns at once). `inputs` are read only then.
    pub(crate) async fn send_output(
        &self,
        producer: &StageProducer,
        record: Outgoing<'_>,
        inputs: impl FnOnce() -> Inputs,
        lifecycle: &Lifecycle,
    ) -> Result<(), SendError> {
        match self {
            Guarantee::ExactlyOnce(t) => {
                t.register(record, inputs());
                Ok(())
            }
            Guarantee::AtLeastOnce => send(producer, record, lifecycle).await.map(|_| ()),
        }
    }

    /// Outputs made from `inputs` that go out together
    /// ([`super::produce::send_all`]), each as [`Guarantee::send_output`]
    /// sends one; the results in their order.
    pub(crate) async fn send_outputs(
        &self,
        producer: &StageProducer,
        records: Vec<Outgoing<'_>>,
        inputs: impl Fn() -> Inputs,
        lifecycle: &Lifecycle,
    ) -> Vec<Result<(), SendError>> {
        match self {
            Guarantee::ExactlyOnce(t) => records
                .into_iter()
                .map(|record| {
                    t.register(record, inputs());
                    Ok(())
                })
                .collect(),
            Guarantee::AtLeastOnce => send_all(producer, records, lifecycle)
                .await
                .into_iter()
                .map(|sent| sent.map(|_| ()))
                .collect(),
        }
    }

    /// A dead letter of the input `ticket`: produced until acknowledged, or
    /// joined to the transactions like an output.
    pub(crate) async fn send_dead_letter(
        &self,
        dlq: &DeadLetters,
        letter: &DeadLetter<'_>,
        ticket: &Ticket,
        lifecycle: &Lifecycle,
    ) -> Result<(), SendError> {
        match self {
            Guarantee::ExactlyOnce(t) => {
                dlq.register_with(letter, |record| {
                    t.register(record, Inputs::new(vec![ticket.clone()]))
                });
                Ok(())
            }
            Guarantee::AtLeastOnce => dlq.send(letter, lifecycle).await,
        }
    }

    /// Reset partitions (revoked, re-assigned, rewound): under exactly_once
    /// their held outputs and holds go.
    pub(crate) fn forget(&self, partitions: &[Partition]) {
        if let Guarantee::ExactlyOnce(t) = self {
            t.forget(partitions);
        }
    }
}
