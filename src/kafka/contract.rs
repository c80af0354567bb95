//! The stage contract: what the consume loop ([`StageLoop`](super::StageLoop))
//! asks of a stage. For each message, in partition order on the loop itself,
//! [`Stage::decode`] and then [`Stage::handle`]; when partitions are revoked,
//! [`Stage::on_revoke`]. Defined here, below the stages, so that the loop is
//! generic over it and `kafka/` never imports a stage.

use std::future::Future;
use std::sync::Arc;

use super::client::Partition;
use super::message::{RecordMeta, Rejected, Taken};

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
///   when the message's partition is revoked and its drain ends.
/// - `on_revoke` is called when partitions are revoked, before they drain.
pub trait Stage {
    /// What `decode` makes of a payload.
    type Input: Send + 'static;

    /// What the stage parks outside its handler tasks, which `on_revoke`
    /// releases: names the count in the loop's log line.
    const PARKS: Parked = Parked::Nothing;

    /// The stage's input, or why the message can never be processed.
    fn decode(&self, payload: &[u8], meta: &RecordMeta) -> Result<Self::Input, Rejected>;

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

/// What a stage parks outside its handler tasks, named in the loop's log
/// line when a revoke releases some (each with the field and text its stage
/// has always logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// Nothing: every message lives in its handler task.
    Nothing,
    /// Groups still gathering members (stage 1).
    GatheringGroups,
    /// Incomplete steps (stage 2).
    PendingSteps,
}

impl Parked {
    /// Logs that a revoke released `count` of them; nothing when 0.
    pub(crate) fn log_released(self, count: usize) {
        if count == 0 {
            return;
        }
        match self {
            Parked::Nothing => {
                tracing::info!(released = count, "parked work of revoked partitions released")
            }
            Parked::GatheringGroups => {
                tracing::info!(groups = count, "gathering groups of revoked partitions released")
            }
            Parked::PendingSteps => {
                tracing::info!(steps = count, "pending steps of revoked partitions released")
            }
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
    D: Fn(&[u8], &RecordMeta) -> Result<T, Rejected>,
    H: Fn(Work<T>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    type Input = T;

    fn decode(&self, payload: &[u8], meta: &RecordMeta) -> Result<T, Rejected> {
        (self.decode)(payload, meta)
    }

    fn handle(self: &Arc<Self>, work: Work<T>) -> impl Future<Output = ()> + Send + 'static {
        (self.handle)(work)
    }
}
