//! The consume loop both stages run: take a message, decode it, hand good
//! input to the stage's handler as a concurrent task and bad input to the
//! dead-letter topic, with a bound on messages in flight. On shutdown it stops
//! fetching, drains in-flight work up to a deadline and commits.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::commit::{Committer, Ticket};
use super::dlq::{DeadLetter, DeadLetters};
use super::StageConsumer;
use crate::messages::DecodeError;
use crate::metrics::StageMetrics;

/// Where a record came from, detached from the consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMeta {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl RecordMeta {
    fn of(message: &BorrowedMessage<'_>) -> Self {
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        RecordMeta {
            topic: message.topic().to_string(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The key as text (lossy), for logs.
    pub fn key_text(&self) -> String {
        self.key
            .as_deref()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .unwrap_or_default()
    }

    /// A header's value, if present.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Why an input can never be processed: it goes to the dead-letter topic
/// with this kind and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub kind: &'static str,
    pub reason: String,
}

impl From<DecodeError> for Rejected {
    fn from(e: DecodeError) -> Self {
        Rejected {
            kind: e.kind(),
            reason: e.to_string(),
        }
    }
}

/// The obligation to finish one message. Call [`Done::finish`] once the
/// message's output was acknowledged; dropping it unfinished leaves the offset
/// uncommitted, so the message is redelivered after a restart.
pub struct Done {
    committer: Committer,
    ticket: Option<Ticket>,
    _permit: OwnedSemaphorePermit,
}

impl Done {
    pub fn finish(mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.committer.finish(ticket);
        }
    }

    pub fn offset(&self) -> Option<i64> {
        self.ticket.as_ref().map(|t| t.offset)
    }
}

/// One decoded input, handed to the stage.
pub struct Work<T> {
    pub input: T,
    /// The raw bytes, kept for the dead-letter topic when handling fails
    /// permanently.
    pub payload: Vec<u8>,
    pub meta: RecordMeta,
    pub done: Done,
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Messages taken but not finished; intake waits at this bound.
    pub max_in_flight: usize,
    /// How long shutdown waits for in-flight work.
    pub drain_timeout: Duration,
}

/// What a run did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    pub received: u64,
    pub dead_lettered: u64,
    /// Handler tasks still running at the drain deadline (their messages stay
    /// uncommitted and are redelivered).
    pub abandoned: usize,
}

/// Runs the loop until `shutdown` resolves. `decode` turns a payload (and its
/// record's metadata, headers included) into the stage's input; an `Err` sends
/// the message to the DLQ; `handle` is called in message order on the loop
/// itself (what it does before returning its future is ordered), and the
/// future it returns runs as its own task, which must call [`Done::finish`]
/// when the output is acknowledged.
pub async fn run_stage<T, D, H, F>(
    consumer: Arc<StageConsumer>,
    dlq: DeadLetters,
    metrics: Arc<StageMetrics>,
    options: RunOptions,
    decode: D,
    handle: H,
    shutdown: impl Future<Output = ()>,
) -> RunSummary
where
    T: Send + 'static,
    D: Fn(&[u8], &RecordMeta) -> Result<T, Rejected>,
    H: Fn(Work<T>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let committer = Committer::new(consumer.clone());
    let permits = Arc::new(Semaphore::new(options.max_in_flight));
    let mut tasks = JoinSet::new();
    let mut summary = RunSummary::default();
    tokio::pin!(shutdown);

    loop {
        while tasks.try_join_next().is_some() {}
        let permit = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break, // the semaphore is never closed
            },
        };
        let message = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            message = consumer.recv() => message,
        };
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                metrics.read_error();
                tracing::warn!(error = %e, "kafka read error");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        summary.received += 1;
        metrics.received();
        let meta = RecordMeta::of(&message);
        let ticket = committer.begin(&meta.topic, meta.partition, meta.offset);
        let payload = message.payload().unwrap_or_default();
        match decode(payload, &meta) {
            Ok(input) => {
                let work = Work {
                    input,
                    payload: payload.to_vec(),
                    meta: meta.clone(),
                    done: Done {
                        committer: committer.clone(),
                        ticket: Some(ticket),
                        _permit: permit,
                    },
                };
                let span = tracing::info_span!(
                    "message",
                    topic = %meta.topic, partition = meta.partition, offset = meta.offset, key = %meta.key_text()
                );
                tasks.spawn(handle(work).instrument(span));
            }
            Err(error) => {
                summary.dead_lettered += 1;
                metrics.dead_lettered(error.kind);
                dlq.send(&DeadLetter {
                    key: meta.key.as_deref(),
                    payload: message.payload(),
                    source_topic: &meta.topic,
                    partition: meta.partition,
                    offset: meta.offset,
                    kind: error.kind,
                    reason: &error.reason,
                })
                .await;
                committer.finish(ticket);
                drop(permit);
            }
        }
        metrics.set_in_flight(committer.in_flight());
    }

    tracing::info!(
        in_flight = tasks.len(),
        "stopping intake; draining in-flight work"
    );
    let drained = tokio::time::timeout(options.drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        summary.abandoned = tasks.len();
        tracing::warn!(
            abandoned = tasks.len(),
            "drain deadline reached; unfinished messages will be redelivered"
        );
        tasks.abort_all();
    }
    if let Err(e) = committer.commit_sync().await {
        tracing::warn!(error = %e, "final commit failed; the last stored offsets may be redelivered");
    }
    consumer.unsubscribe();
    summary
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}
