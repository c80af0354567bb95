//! The stage contract: what the consume loop ([`StageLoop`](super::StageLoop))
//! asks of a stage, and what a stage owes its inputs. For each message, in
//! partition order on the loop itself, [`Stage::decode`] and then
//! [`Stage::handle`]; when partitions are revoked, [`Stage::on_revoke`].
//! Inputs that finish together go into a [`Settlement`], the only way a
//! stage sends an output: every output is sent (or joins the transaction)
//! before any of its inputs is acknowledged, and no commit splits them.
//! Defined here, below the stages, so that the loop is generic over it and
//! `kafka/` never imports a stage.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use rdkafka::error::KafkaError;
use rdkafka::producer::DeliveryFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::guarantee::Guarantee;
use super::held::Inputs;
use super::message::{RecordMeta, Rejected, Taken};
use super::partition::Partition;
use super::produce::{self, Outgoing, SendError};
use super::producers::StageProducer;
use super::settler::Settling;
use crate::health::Lifecycle;
use crate::telemetry::{self, TraceParent};

/// One decoded input, handed to the stage with its message.
pub struct Work<T> {
    pub input: T,
    pub message: Taken,
}

/// A stage as the consume loop drives it.
///
/// - `decode` turns a payload (and its record's metadata, headers
///   included) into the stage's input; an `Err` sends the message to the
///   dead-letter topic with its kind and reason.
/// - `handle` takes a decoded input with its message. It is called in
///   message order on the loop itself, so what it does before returning is
///   ordered; the future it returns runs as a task of its own, cancelled
///   when the message's partition is revoked and its drain ends. For a
///   batch stage ([`Stage::TASK_PER_BATCH`]) both `decode` and `handle`
///   are called in the batch's task: in message order within a batch, and
///   batches run side by side. For a pipelined stage ([`Stage::PIPELINED`])
///   `decode` runs in tasks side by side, and `handle` is called in message
///   order from one task beside the loop.
/// - `on_revoke` is called when partitions are revoked, before they drain.
pub trait Stage: Send + Sync + 'static {
    /// What `decode` makes of a payload.
    type Input: Send + 'static;

    /// What the stage parks outside its handler tasks, which `on_revoke`
    /// releases, in plural ("gathering groups", "pending steps"): names
    /// the count in the loop's log line.
    const PARKS: &'static str = "parked messages";

    /// Whether an input may be held decoded beside its message's bytes
    /// (stage 1 keeps a group's best trajectory decoded): the byte bound
    /// then counts a payload twice, near what it holds in memory.
    const HOLDS_DECODED: bool = false;

    /// Whether the consume loop (for a pipelined stage, its ordered task)
    /// polls a handler's future once itself before it spawns it as a task:
    /// for a stage whose handler mostly finishes at once (stage 2 parks most
    /// messages in its assembler), a message then costs no task and no
    /// wakeup of another thread. Such a handler must yield before any slow
    /// work, which would otherwise hold up intake.
    const FIRST_POLL_IN_LOOP: bool = false;

    /// Whether the consume loop runs the handler futures of the messages
    /// that are ready together (those fetched already, up to
    /// [`MAX_BATCH`](super::worker::MAX_BATCH)) in one task instead of one
    /// task each: for a stage whose messages are many and cheap (stage 1's
    /// static or cached hints), a message then costs no task of its own and
    /// no wakeup of another thread. Each message is decoded in that task,
    /// not in the loop (whose one thread then only takes messages), and is
    /// still decoded and handled in order, finishes, is cancelled with its
    /// partition and is dead-lettered on a panic on its own; a slow one
    /// holds up no other.
    const TASK_PER_BATCH: bool = false;

    /// Whether the consume loop only takes messages, and hands the rest on
    /// (see [`pipeline`](super::pipeline)): the messages ready together are
    /// decoded in a task of their own on tokio's workers (one each when
    /// large), such tasks side by side, and `handle` is called from one task
    /// beside the loop, in message order as ever (a small batch, when none
    /// is on its way, is decoded and handed on by the loop itself, as for
    /// any stage). For a stage whose inputs
    /// are large and whose handler is mostly their ordered bookkeeping
    /// (stage 2: a step's Arrow rows decoded, their groups mapped), which
    /// would otherwise all run on the loop's one thread.
    ///
    /// A message may then still be on its way when its partition is
    /// revoked (or reset) and the stage's `on_revoke` runs. The ordered
    /// task drops one revoked before it is handed on (abandoned: its
    /// partition's next owner redoes it); one revoked while `handle` runs
    /// may be parked just after `on_revoke` released the rest, so a stage
    /// that parks inputs checks [`Taken::partition_revoked`] under the same
    /// lock as its `on_revoke`, and drops such a message.
    const PIPELINED: bool = false;

    /// The stage's input, or why the message can never be processed.
    /// `payload` is the message's one copy, shared: what is decoded may
    /// slice it without copying (Arrow buffers), but must not keep those
    /// slices past the message's [`Taken`] (the byte bound counts the
    /// payload only while it is held).
    fn decode(&self, payload: &Bytes, meta: &RecordMeta) -> Result<Self::Input, Rejected>;

    /// Takes one input; the returned future finishes its message.
    fn handle(self: &Arc<Self>, work: Work<Self::Input>) -> impl Future<Output = ()> + Send + 'static;

    /// Releases what the stage parks for `partitions` outside its handler
    /// tasks (stage 2's incomplete steps, stage 1's gathering groups): it
    /// could never finish on this member, and the drain must not wait for
    /// it. The messages it drops are abandoned (uncommitted, redelivered to
    /// the partitions' next owner). Returns how many [`Stage::PARKS`] it
    /// released.
    fn on_revoke(&self, partitions: &[Partition]) -> usize {
        let _ = partitions;
        0
    }
}

/// Logs that a revoke released `count` of what a stage parks (`parks`,
/// its [`Stage::PARKS`]); nothing when 0.
pub(crate) fn log_released(parks: &str, count: usize) {
    if count > 0 {
        tracing::info!(
            released = count,
            parked = parks,
            "{parks} of revoked partitions released"
        );
    }
}

/// Inputs that finish together (a group's members, a step's messages), and
/// what a stage owes them: every output made from them is sent before any
/// of them is acknowledged (under exactly_once: joins the transaction with
/// their offsets), and under exactly_once no commit passes some of them but
/// not the others, whatever becomes of them. It ends in
/// [`Settlement::ack`] (every output sent) or [`Settlement::reject`];
/// [`Settlement::publish`] sends one output and settles in one call.
/// Dropped unsettled, each input is dropped as [`Taken`] says (abandoned
/// on a revoke or at shutdown, else dead-lettered as lost).
pub struct Settlement {
    inputs: Vec<Taken>,
    /// Under exactly_once their tickets, bound, and shared by every output
    /// made from them.
    bound: Option<Inputs>,
}

/// The tickets of `inputs` that are not finished.
fn tickets_of(inputs: &[Taken]) -> Vec<super::tracker::Ticket> {
    inputs.iter().filter_map(Taken::ticket).collect()
}

/// What [`Settlement::publish`] did.
#[derive(Debug)]
pub enum Published {
    /// Sent; the inputs were acknowledged.
    Sent,
    /// The broker refused the output for good; the inputs were
    /// dead-lettered (kind `output_rejected`) with the reason given.
    Rejected(KafkaError),
    /// Shutdown's deadline passed first; the inputs stay uncommitted.
    Stopped,
}

/// The dead-letter kind of inputs whose output the broker refused for good.
pub const OUTPUT_REJECTED: &str = "output_rejected";

impl Settlement {
    /// Binds `inputs` together (see the type's docs).
    pub fn new(inputs: Vec<Taken>) -> Self {
        let bound = inputs
            .first()
            .and_then(Taken::guarantee)
            .and_then(|guarantee| guarantee.bind(|| tickets_of(&inputs)));
        Settlement { inputs, bound }
    }

    /// The inputs an output is made from, as the transactions hold them.
    fn bound(&self) -> Inputs {
        self.bound
            .clone()
            .unwrap_or_else(|| Inputs::new(tickets_of(&self.inputs)))
    }

    pub fn inputs(&self) -> &[Taken] {
        &self.inputs
    }

    /// Sends one output made from the inputs: produced until the broker
    /// acknowledges it, or under exactly_once held and committed with their
    /// offsets (this returns at once).
    pub async fn send(
        &self,
        producer: &StageProducer,
        record: Outgoing<'_>,
        lifecycle: &Lifecycle,
    ) -> Result<(), SendError> {
        let Some(guarantee) = self.inputs.first().and_then(Taken::guarantee) else {
            // Every input finished already: nothing is owed.
            return Ok(());
        };
        guarantee
            .send_output(producer, record, || self.bound(), lifecycle)
            .await
    }

    /// Sends outputs made from the inputs that go out together (a step's
    /// hint outcomes), under the guarantee [`Settlement::send`] sends one:
    /// at least once, all handed to the producer before any acknowledgement
    /// is awaited ([`crate::kafka::produce::send_all`]); under exactly_once
    /// each held as one. The results in `records`' order.
    pub async fn send_all(
        &self,
        producer: &StageProducer,
        records: Vec<Outgoing<'_>>,
        lifecycle: &Lifecycle,
    ) -> Vec<Result<(), SendError>> {
        let Some(guarantee) = self.inputs.first().and_then(Taken::guarantee) else {
            // Every input finished already: nothing is owed.
            return records.iter().map(|_| Ok(())).collect();
        };
        guarantee
            .send_outputs(producer, records, || self.bound(), lifecycle)
            .await
    }

    /// Every output was sent: the inputs' offsets may commit.
    pub fn ack(self) {
        Taken::ack_all(self.inputs);
    }

    /// The inputs can never be processed: each is dead-lettered with `kind`
    /// and `reason`, all at once.
    pub async fn reject(self, kind: &'static str, reason: &str) {
        futures::future::join_all(self.inputs.into_iter().map(|m| m.reject(kind, reason))).await;
    }

    /// Sends `record`, then settles: acknowledged when sent; dead-lettered
    /// as [`OUTPUT_REJECTED`] with `refused(error)` as the reason when the
    /// broker refused it for good; left uncommitted when shutdown's
    /// deadline passed first.
    pub async fn publish(
        self,
        producer: &StageProducer,
        record: Outgoing<'_>,
        lifecycle: &Lifecycle,
        refused: impl FnOnce(&KafkaError) -> String,
    ) -> Published {
        let sent = self.send(producer, record, lifecycle).await;
        self.settle_sent(sent, refused).await
    }

    /// [`Settlement::publish`] for a handler that does not wait for the
    /// outcome: `record` is handed to the producer now, and its
    /// acknowledgement awaited by the worker's settler
    /// ([`Settler`](super::settler::Settler)), which then settles the
    /// inputs as `publish` does and calls `then` with what it did; the
    /// handler's future ends here. The settling goes on in the input's
    /// trace (what it dead-letters carries it), and is dropped, its
    /// dead letters too, when the inputs' partition's drain ends first
    /// (abandoned, as a cut-off handler's inputs are). Under exactly_once
    /// (where `publish` returns at once), with spans exported (each
    /// output's `produce` span is its hint's child), for inputs of more
    /// than one partition, when the producer cannot take the record now
    /// (its queue full) or with no settler running, it publishes as
    /// `publish` does, then calls `then`.
    pub async fn publish_detached(
        self,
        producer: &StageProducer,
        mut record: Outgoing<'_>,
        lifecycle: &Lifecycle,
        refused: impl FnOnce(&KafkaError) -> String + Send + 'static,
        then: impl FnOnce(&Published) + Send + 'static,
    ) {
        let detachable = self.inputs.first().and_then(|first| {
            let at_least_once = matches!(first.guarantee(), Some(Guarantee::AtLeastOnce));
            // One partition's: what its drain cancels is every input's.
            let one_partition = |(_, work): &(_, &Arc<CancellationToken>)| {
                self.inputs[1..]
                    .iter()
                    .all(|other| other.settler().is_some_and(|(_, own)| Arc::ptr_eq(own, work)))
            };
            first
                .settler()
                .filter(|detached| at_least_once && !telemetry::exporting() && one_partition(detached))
        });
        if let Some((settler, work)) = detachable {
            match produce::queue(producer, record) {
                Ok(delivery) => {
                    let (settler, work) = (settler.clone(), work.clone());
                    let settling = self.settle_delivery(
                        (producer.clone(), delivery, Instant::now()),
                        lifecycle.clone(),
                        (work, telemetry::input_trace()),
                        refused,
                        then,
                    );
                    if let Err(settling) = settler.hand(settling) {
                        settling.await;
                    }
                    return;
                }
                // Produced as `publish` produces it (which waits for room).
                Err(given_back) => record = given_back,
            }
        }
        // Boxed: rare here, and inline its future (the sending's, about
        // 1.9 KB) would size every handler that calls this one, whose hint
        // nearly always goes to the settler above.
        let published = Box::pin(self.publish(producer, record, lifecycle, refused)).await;
        then(&published);
    }

    /// What settles the inputs off their handler once their record, queued
    /// (the producer, its delivery, when), is acknowledged, or not; see
    /// [`Settlement::publish_detached`].
    fn settle_delivery(
        self,
        (producer, delivery, started): (StageProducer, DeliveryFuture, Instant),
        lifecycle: Lifecycle,
        (work, trace): (Arc<CancellationToken>, Option<TraceParent>),
        refused: impl FnOnce(&KafkaError) -> String + Send + 'static,
        then: impl FnOnce(&Published) + Send + 'static,
    ) -> Settling {
        let settle = async move {
            let published = match produce::delivered(&producer, delivery, started, &lifecycle).await {
                Ok(_) => {
                    self.ack();
                    Published::Sent
                }
                // Boxed: rare, and its future would size every one's.
                Err(e) => Box::pin(self.settle_sent(Err(e), refused)).await,
            };
            then(&published);
        };
        Box::pin(telemetry::scope(trace, async move {
            tokio::select! {
                biased;
                // Dropped, a dead letter on its way too: abandoned, its
                // partition's next owner redoes it.
                _ = work.cancelled() => {}
                _ = settle => {}
            }
        }))
    }

    /// Settles after the output was sent (`sent`), as
    /// [`Settlement::publish`] does.
    async fn settle_sent(
        self,
        sent: Result<(), SendError>,
        refused: impl FnOnce(&KafkaError) -> String,
    ) -> Published {
        match sent {
            Ok(()) => {
                self.ack();
                Published::Sent
            }
            Err(SendError::Permanent(e)) => {
                let reason = refused(&e);
                // Boxed: a dead letter's future is about 2.5 KB, and
                // inline it would size every publish's.
                for input in self.inputs {
                    Box::pin(input.reject(OUTPUT_REJECTED, &reason)).await;
                }
                Published::Rejected(e)
            }
            Err(SendError::Stopped) => Published::Stopped,
        }
    }
}

/// Closures as a stage that parks nothing: what
/// [`StageLoop::run`](super::StageLoop::run) takes.
pub(crate) struct Closures<D, H> {
    pub(crate) decode: D,
    pub(crate) handle: H,
}

impl<T, D, H, F> Stage for Closures<D, H>
where
    T: Send + 'static,
    D: Fn(&[u8], &RecordMeta) -> Result<T, Rejected> + Send + Sync + 'static,
    H: Fn(Work<T>) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    type Input = T;

    fn decode(&self, payload: &Bytes, meta: &RecordMeta) -> Result<T, Rejected> {
        (self.decode)(payload, meta)
    }

    fn handle(self: &Arc<Self>, work: Work<T>) -> impl Future<Output = ()> + Send + 'static {
        (self.handle)(work)
    }
}
