//! Publishing a complete step of stage 2: compute, encode, send the chunks,
//! send the hint outcomes, send the metrics, then acknowledge its messages.
//! A failure of any step dead-letters them, in one place
//! ([`StepOutput::publish`]).
//!
//! A step's advantages go out as one or more Arrow IPC messages of at most
//! `advantages.max_message_bytes` (`batch::chunk`), all with the key
//! `run_id/step`, handed to the producer in index order, a few in flight
//! at a time, and all acknowledged; then one `HintOutcome` per `hint_id` of its hinted rows on the
//! outcomes topic (keyed by the hint's group, all acknowledged; none when
//! the topic is missing and no arms are configured, see
//! [`super::learning`]); the step's metrics follow. Its input messages are
//! acknowledged only then: a worker that dies or stops mid-step leaves them
//! uncommitted, and the step is published whole again (its outcomes too: the
//! latest outcome of a `hint_id` wins downstream).
//!
//! Under `kafka.delivery = "exactly_once"` ([`crate::kafka::transaction`])
//! every one of these is held instead, in this order, and joins the worker's
//! transaction once the offsets of all the step's messages are passed; the
//! messages are acknowledged at once, and a read_committed reader sees the
//! step's chunks, outcomes and metrics once.
//!
//! Every chunk of one publication carries the same `hintstream.attempt`
//! (`batch::chunk::attempt_id` of this process's identity, the time the
//! publication started and the step's key), so that readers never mix its
//! chunks with another publication's, which may be cut elsewhere.

use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime};

use arrow_schema::ArrowError;
use rdkafka::error::KafkaError;
use thiserror::Error;
use tokio::task::JoinError;

use super::assemble::{GatheredRows, PendingStep};
use super::compute::{advantages_rows_batch, check_finite, compute_grouped_beside, ComputeError, StepResult};
use super::learning::Learning;
use super::metrics::AdvantageMetrics;
use super::outcomes::hint_outcomes;
use super::step_metrics::{extreme_count, row_metrics, MetricOptions, StepMetrics};
use crate::batch::chunk::{
    attempt_id, chunk_header_values, encode_chunks, plan_unbuilt, Chunk, Chunks, ATTEMPT_HEADER,
    CHUNKS_HEADER, CHUNK_HEADER, ROWS_HEADER,
};
use crate::batch::{ipc, BatchError, ScoredRows, ARROW_STREAM_CONTENT_TYPE};
use crate::config::AdvantagesConfig;
use crate::health::Lifecycle;
use crate::kafka::produce::headers;
use crate::kafka::{Outgoing, SendError, Settlement, StageProducer, Taken, IDEMPOTENT_IN_FLIGHT};
use crate::messages::{step_key, HintOutcome};
use crate::normalize::{AdvantageOptions, DenseGroups, Device, HintedWeight, Ran};

/// Header that says which kernel computed a published step.
pub const DEVICE_HEADER: &str = "hintstream.device";

/// A step's chunks in the producer at once. Each waits for its own
/// acknowledgement (a produce request's round trip, `linger.ms` included);
/// a few at a time fill the connection instead, while the bytes not yet
/// handed over stay bounded.
///
/// At most [`IDEMPOTENT_IN_FLIGHT`] (5): librdkafka's idempotent producer
/// sends no new request for a partition while that many of its messages
/// are in flight, and a chunk is a request of its own. Past it, a chunk
/// handed over waits in the producer's queue as a batch ready to go, and
/// librdkafka's broker thread polls for it without sleeping until an
/// acknowledgement frees a place. At 8 chunks that was half a core while a
/// 1M-row step's 100 chunks went out (`poll` with a timeout of 0, 60,000
/// times in 20 s), a quarter of the worker's CPU for the step, taken from
/// the broker on a machine of two cores (docs/BENCHMARKS.md, round
/// sixteen). The bound is a step's: two steps published at once whose keys
/// share a partition still put up to twice as many there.
const CHUNKS_IN_FLIGHT: usize = IDEMPOTENT_IN_FLIGHT;
const _: () = assert!(
    CHUNKS_IN_FLIGHT <= IDEMPOTENT_IN_FLIGHT,
    "more chunks than the idempotent producer sends at once spin its broker thread"
);

/// At most the first 64 characters of an id, for a reason text (dead-letter
/// reasons are cut at 1 KiB: a huge id must not push the advice out).
fn shortened(id: &str) -> String {
    const SHOWN: usize = 64;
    match id.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}… ({} bytes)", &id[..at], id.len()),
        None => id.to_string(),
    }
}

/// Bytes of an advantages message besides its Arrow payload: the key, the
/// headers (chunk numbers at their longest) and the record's framing, which
/// librdkafka counts against `message.max.bytes` too (about 40 bytes; a
/// margin on top).
fn envelope_bytes(key: &str, device: &str) -> usize {
    const RECORD_FRAMING: usize = 512;
    const HEADER_FRAMING: usize = 10;
    const DECIMAL_DIGITS: usize = 20;
    const ATTEMPT_DIGITS: usize = 16;
    let fixed = [
        ("content-type".len(), ARROW_STREAM_CONTENT_TYPE.len()),
        (DEVICE_HEADER.len(), device.len()),
        (CHUNK_HEADER.len(), DECIMAL_DIGITS),
        (CHUNKS_HEADER.len(), DECIMAL_DIGITS),
        (ROWS_HEADER.len(), DECIMAL_DIGITS),
        (ATTEMPT_HEADER.len(), ATTEMPT_DIGITS),
    ];
    key.len() + RECORD_FRAMING + fixed.iter().map(|(k, v)| k + v + HEADER_FRAMING).sum::<usize>()
}

/// Nanoseconds since the Unix epoch (0 before it).
fn unix_nanos(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// This process's identity in attempt ids: host name, process id and the
/// time it first published.
fn worker_identity() -> &'static str {
    static IDENTITY: OnceLock<String> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .unwrap_or_default();
        format!(
            "{}/{}/{}",
            host.trim(),
            std::process::id(),
            unix_nanos(SystemTime::now())
        )
    })
}

/// Rows `range` of a computed step's advantages as one chunk: built as a
/// batch of their own and encoded.
fn encode_rows(
    result: &StepResult,
    range: Range<usize>,
    hinted_weight: HintedWeight,
) -> Result<Chunk, Unpublished> {
    let batch = advantages_rows_batch(&result.rows, &result.advantages, range.clone(), hinted_weight)
        .map_err(Unpublished::EncodeBatch)?;
    let payload = ipc::encode_stream(&[batch]).map_err(Unpublished::EncodeChunks)?;
    Ok(Chunk { rows: range, payload })
}

/// Which step is being published, for reasons and logs.
struct StepId {
    run_id: String,
    step: i64,
}

impl StepId {
    /// `run_id/step`, as reasons name a step.
    fn name(&self) -> String {
        format!("{}/{}", self.run_id, self.step)
    }
}

/// A step's advantages as messages: encoded already (a step that may fit
/// one message, or whose chunks `plan_unbuilt` cannot bound), or planned:
/// the computed step and its chunks' rows, each chunk's batch built from
/// its rows and encoded as the ones before it are sent (the count, which
/// every chunk's headers carry, known first). A large step's advantages are
/// never one batch: the first chunk leaves once its own rows are built.
enum StepChunks {
    Encoded(Chunks),
    Planned {
        result: Arc<StepResult>,
        hinted_weight: HintedWeight,
        ranges: Vec<Range<usize>>,
    },
}

impl StepChunks {
    fn len(&self) -> usize {
        match self {
            StepChunks::Encoded(chunks) => chunks.len(),
            StepChunks::Planned { ranges, .. } => ranges.len(),
        }
    }
}

/// A computed step, encoded (or planned): what its messages carry.
struct Encoded {
    key: String,
    /// This publication's `hintstream.attempt`.
    attempt: String,
    /// Which kernel computed it (the device header).
    device: &'static str,
    rows: usize,
}

/// A computed step's metrics and hint outcomes, made beside its kernel
/// (they go out after the chunks, and are ready before the first leaves).
struct Summary {
    metrics: StepMetrics,
    /// One per `hint_id` of the step's hinted rows.
    outcomes: Vec<HintOutcome>,
    /// Each of `outcomes` as its record's key and JSON, in their order
    /// (encoded beside the kernel too: a 10,000-row step's 696 took about
    /// 0.7 ms on its path).
    outcome_records: EncodedRecords,
    /// Advantages beyond the extreme bound, for the step's counter.
    extreme: u64,
}

/// Records as the producer takes them: each one's key and JSON.
type EncodedRecords = Vec<(String, Vec<u8>)>;

/// A step's metrics but `advantage/extreme_count` (added once its
/// advantages are in), and its hint outcomes, each also as its record (key
/// and JSON) when `records` (they have a topic to go to): what its rows
/// alone give.
fn summarize(
    rows: &ScoredRows,
    groups: &DenseGroups,
    stage: &AdvantagesConfig,
    step: i64,
    duplicates: usize,
    records: bool,
) -> (StepMetrics, Vec<HintOutcome>, EncodedRecords) {
    let options = MetricOptions::from(stage);
    let mut metrics = row_metrics(rows, groups, &options);
    metrics.insert("step".into(), step as f64);
    metrics.insert("advantage/duplicate_rows".into(), duplicates as f64);
    let created_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let outcomes = hint_outcomes(rows, options.success_threshold, &created_at);
    let encoded = outcomes
        .iter()
        .filter(|_| records)
        // An outcome of strings and finite numbers always serialises.
        .map(|o| (o.key(), serde_json::to_vec(o).unwrap_or_default()))
        .collect();
    (metrics, outcomes, encoded)
}

/// Why a complete step was not published, each step of publishing failing
/// its own ways: computing (`Compute`, `ComputePanicked`), encoding
/// (`EncodeBatch`, `EncodeChunks`, `EncodePanicked`, `Oversized`), sending
/// the chunks (`ChunkRejected`, `Stopped`), sending the metrics (`Stopped`).
/// Its message is the dead-letter reason.
#[derive(Debug, Error)]
enum Unpublished {
    #[error("computing step {step}: {source}")]
    Compute {
        step: String,
        #[source]
        source: ComputeError,
    },
    #[error("computing step {step} panicked: {source}")]
    ComputePanicked {
        step: String,
        #[source]
        source: JoinError,
    },
    #[error(transparent)]
    EncodeBatch(BatchError),
    #[error(transparent)]
    EncodeChunks(ArrowError),
    #[error("encoding step {step} panicked: {source}")]
    EncodePanicked {
        step: String,
        #[source]
        source: JoinError,
    },
    /// One row alone is more Arrow than a message leaves room for.
    #[error(
        "row {row} (trajectory_id {trajectory_id:?}) of step {step} alone takes {bytes} bytes of Arrow, more \
         than the {room} bytes a message of advantages.max_message_bytes = {max_message_bytes} leaves for \
         it: raise advantages.max_message_bytes (and message.max.bytes in [kafka] and max.message.bytes on \
         {topic})"
    )]
    Oversized {
        row: usize,
        trajectory_id: String,
        step: String,
        bytes: usize,
        room: usize,
        max_message_bytes: usize,
        topic: String,
    },
    #[error(
        "the advantages of step {step} (chunk {index} of {count}, {bytes} bytes) were rejected: {source}; \
         raise message.max.bytes in [kafka] and max.message.bytes on {topic}, or lower \
         advantages.max_message_bytes"
    )]
    ChunkRejected {
        step: String,
        index: usize,
        count: usize,
        bytes: usize,
        #[source]
        source: Box<KafkaError>,
        topic: String,
    },
    /// Shutdown's deadline passed mid-step: the step stays uncommitted and
    /// is published whole again after a restart.
    #[error("the drain deadline passed mid-step")]
    Stopped,
}

impl Unpublished {
    /// The kind its messages are dead-lettered with; `None` for `Stopped`.
    fn dead_letter_kind(&self) -> Option<&'static str> {
        match self {
            Unpublished::Compute { source, .. } => Some(source.kind()),
            Unpublished::ComputePanicked { .. } | Unpublished::EncodePanicked { .. } => Some("compute_panic"),
            Unpublished::EncodeBatch(e @ BatchError::NonFinite { .. }) => Some(e.kind()),
            Unpublished::EncodeBatch(_) | Unpublished::EncodeChunks(_) => Some("encode"),
            Unpublished::Oversized { .. } | Unpublished::ChunkRejected { .. } => Some("output_rejected"),
            Unpublished::Stopped => None,
        }
    }
}

/// Where a complete step goes, and what computing it takes: the output and
/// metrics topics, the kernels' options and device, and the dead-letter
/// path for its messages.
pub(super) struct StepOutput {
    pub(super) producer: StageProducer,
    pub(super) lifecycle: Lifecycle,
    pub(super) output_topic: String,
    pub(super) metrics_topic: String,
    pub(super) options: AdvantageOptions,
    /// `normalize.hinted_weight`: whether the output carries `weight`.
    pub(super) hinted_weight: HintedWeight,
    pub(super) device: Device,
    pub(super) stage: AdvantagesConfig,
    pub(super) metrics: AdvantageMetrics,
    pub(super) learning: Learning,
}

impl StepOutput {
    /// Publishes a complete step: compute, encode, send the chunks, send
    /// the metrics, then acknowledge its messages. A failure of any of these
    /// dead-letters the messages here, and only here (or, when shutdown's
    /// deadline passed, leaves them uncommitted).
    pub(super) async fn publish(&self, step: PendingStep<Taken>) {
        let id = StepId {
            run_id: step.run_id.clone(),
            step: step.step,
        };
        let duplicates = step.duplicates;
        let (rows, parked) = step.into_gathered();
        // Under exactly_once the step's messages commit together.
        let parked = Settlement::new(parked);
        match self.compute_and_send(&id, rows, duplicates, &parked).await {
            Ok(()) => parked.ack(),
            Err(e) => {
                if let Some(kind) = e.dead_letter_kind() {
                    self.dead_letter_parked(parked, kind, &e.to_string()).await;
                }
            }
        }
    }

    /// The steps of publishing, in order: the first failure ends them.
    /// `parked`: the step's messages, the inputs of every output (under
    /// exactly_once they join a transaction with their offsets).
    async fn compute_and_send(
        &self,
        id: &StepId,
        rows: GatheredRows,
        duplicates: usize,
        parked: &Settlement,
    ) -> Result<(), Unpublished> {
        // The metrics before any chunk leaves: a failure there must find
        // nothing sent (under exactly_once, nothing registered to commit
        // beside the dead letters).
        let (result, mut summary) = self.compute(id, rows, duplicates).await?;
        let published = async {
            let encoding = Instant::now();
            let (encoded, chunks) = self.encode(id, result).await?;
            let encode_ms = encoding.elapsed().as_millis() as u64;
            let count = chunks.len();
            let sending = Instant::now();
            self.send_chunks(id, &encoded, chunks, parked).await?;
            let chunks_ms = sending.elapsed().as_millis() as u64;
            Ok::<_, Unpublished>((encoded, count, encode_ms, chunks_ms))
        };
        // The per-arm metrics' read barrier (a round trip, and what the
        // hints tail has left to read) runs beside the encoding and the
        // chunks; a failure of those ends the step without waiting for it.
        let barrier = async {
            let waiting = Instant::now();
            self.learning
                .barrier(&id.run_id, id.step, &summary.outcomes)
                .await;
            Ok(waiting.elapsed().as_millis() as u64)
        };
        let ((encoded, count, encode_ms, chunks_ms), barrier_ms) = tokio::try_join!(published, barrier)?;
        // The per-arm metrics are made while the outcomes are on their way
        // (`join!` polls the sends first, which hands them all to the
        // producer): they take the learner's state about 1 ms a 10,000-row
        // step, as long as the outcomes' round trip.
        let sending = Instant::now();
        let sent = self.send_outcomes(id, &summary.outcomes, &summary.outcome_records, parked);
        let learned = async { self.learning.step_metrics(&id.run_id, id.step, &summary.outcomes) };
        let (sent, learned) = tokio::join!(sent, learned);
        sent?;
        summary.metrics.extend(learned);
        let outcomes_ms = sending.elapsed().as_millis() as u64;
        self.send_metrics(id, &encoded.key, &summary.metrics, parked)
            .await?;
        self.metrics.step_published(encoded.rows, summary.extreme);
        tracing::info!(
            run_id = %id.run_id, step = id.step, rows = encoded.rows, chunks = count,
            device = encoded.device, extreme = summary.extreme, encode_ms, chunks_ms, barrier_ms,
            outcomes = summary.outcomes.len(), outcomes_ms,
            "advantages published"
        );
        Ok(())
    }

    /// Puts a step's rows together and computes its advantages, off the
    /// async workers, and beside the kernel its metrics and hint outcomes
    /// (only `advantage/extreme_count` waits for the advantages).
    async fn compute(
        &self,
        id: &StepId,
        rows: GatheredRows,
        duplicates: usize,
    ) -> Result<(StepResult, Summary), Unpublished> {
        let (options, device) = (self.options, self.device);
        let stage = self.stage.clone();
        let step_no = id.step;
        let records = self.learning.outcomes_topic().is_some();
        let started = Instant::now();
        // Number crunching leaves the async workers.
        let span = tracing::info_span!("compute");
        let (result, summary) = tokio::task::spawn_blocking(move || {
            span.in_scope(|| {
                let (rows, groups) = rows.join_with_groups();
                let (result, (mut metrics, outcomes, outcome_records)) =
                    compute_grouped_beside(rows, groups, &options, device, |rows, groups| {
                        summarize(rows, groups, &stage, step_no, duplicates, records)
                    })?;
                let extreme = extreme_count(&result.advantages);
                metrics.insert("advantage/extreme_count".into(), extreme as f64);
                let summary = Summary {
                    metrics,
                    outcomes,
                    outcome_records,
                    extreme: extreme as u64,
                };
                Ok((result, summary))
            })
        })
        .await
        .map_err(|source| Unpublished::ComputePanicked {
            step: id.name(),
            source,
        })?
        .map_err(|source| Unpublished::Compute {
            step: id.name(),
            source,
        })?;
        let device_name = result.ran.as_str();
        if result.ran == Ran::CpuFallback {
            self.metrics.cuda_fell_back();
        }
        self.metrics
            .computed(device_name, started.elapsed().as_secs_f64());
        tracing::debug!(run_id = %id.run_id, step = id.step, rows = result.rows.len(), device = device_name, "step computed; publishing");
        Ok((result, summary))
    }

    /// Encodes a computed step, off the async workers too (a large step
    /// takes as long to encode as to compute): its advantages as Arrow
    /// chunks that fit `advantages.max_message_bytes` with their envelope
    /// (a large step's planned, to be encoded as they are sent).
    async fn encode(&self, id: &StepId, result: StepResult) -> Result<(Encoded, StepChunks), Unpublished> {
        let device = result.ran.as_str();
        let key = step_key(&id.run_id, id.step);
        let attempt = attempt_id(worker_identity(), unix_nanos(SystemTime::now()), &key);
        let room = self
            .stage
            .max_message_bytes
            .saturating_sub(envelope_bytes(&key, device));
        let hinted_weight = self.hinted_weight;
        let result = Arc::new(result);
        let for_chunks = result.clone();
        let chunks = tokio::task::spawn_blocking(move || {
            let (rows, advantages) = (&for_chunks.rows, &for_chunks.advantages);
            // Every value checked before any chunk is built.
            check_finite(advantages).map_err(Unpublished::EncodeBatch)?;
            let built = |range| {
                advantages_rows_batch(rows, advantages, range, hinted_weight)
                    .map_err(Unpublished::EncodeBatch)
            };
            let template = built(0..rows.len().min(1))?;
            let strings = [&rows.run_id, &rows.trajectory_id, &rows.instance_id];
            let variable = |range: Range<usize>| {
                strings
                    .iter()
                    .map(|column| column.text_len_of(range.clone()))
                    .sum()
            };
            match plan_unbuilt(&template, rows.len(), variable, room).map_err(Unpublished::EncodeChunks)? {
                Some(ranges) => Ok(StepChunks::Planned {
                    result: for_chunks.clone(),
                    hinted_weight,
                    ranges,
                }),
                None => encode_chunks(&built(0..rows.len())?, room)
                    .map(StepChunks::Encoded)
                    .map_err(Unpublished::EncodeChunks),
            }
        });
        let chunks = chunks.await.map_err(|source| Unpublished::EncodePanicked {
            step: id.name(),
            source,
        })??;
        // A planned step's chunks fit by their bound; an encoded one's
        // may hold a row that alone does not.
        if let Some(big) = match &chunks {
            StepChunks::Encoded(chunks) => chunks.oversized(),
            StepChunks::Planned { .. } => None,
        } {
            let row = big.rows.start;
            return Err(Unpublished::Oversized {
                row,
                trajectory_id: shortened(result.rows.trajectory_id.get(row).unwrap_or("")),
                step: id.name(),
                bytes: big.payload.len(),
                room,
                max_message_bytes: self.stage.max_message_bytes,
                topic: self.output_topic.clone(),
            });
        }
        let encoded = Encoded {
            key,
            attempt,
            device,
            rows: result.rows.len(),
        };
        Ok((encoded, chunks))
    }

    /// Sends the chunks, up to [`CHUNKS_IN_FLIGHT`] at a time, handed to the
    /// producer in index order (which keeps them in order on the key's
    /// partition unless one is retried; a reader gathers a step's chunks by
    /// index, whatever their order). A planned step's chunks are encoded on
    /// a thread of the blocking pool, in order, while the ones before them
    /// are sent (at most [`CHUNKS_IN_FLIGHT`] encoded ahead). A failure ends
    /// the sending at the first chunk, in index order, that failed.
    async fn send_chunks(
        &self,
        id: &StepId,
        encoded: &Encoded,
        chunks: StepChunks,
        parked: &Settlement,
    ) -> Result<(), Unpublished> {
        use futures::StreamExt;
        let count = chunks.len();
        let (items, encoder) = match chunks {
            StepChunks::Encoded(chunks) => {
                let items =
                    futures::stream::iter(chunks.chunks.into_iter().map(Ok::<Chunk, Unpublished>)).boxed();
                (items, None)
            }
            StepChunks::Planned {
                result,
                hinted_weight,
                ranges,
            } => {
                let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
                let encoder = tokio::task::spawn_blocking(move || {
                    for range in ranges {
                        let chunk = encode_rows(&result, range, hinted_weight);
                        let failed = chunk.is_err();
                        // Closed: the sending ended (a failure, a stop).
                        if tx.blocking_send(chunk).is_err() || failed {
                            return;
                        }
                    }
                });
                let items =
                    futures::stream::unfold(
                        rx,
                        |mut rx| async move { rx.recv().await.map(|chunk| (chunk, rx)) },
                    )
                    .boxed();
                (items, Some(encoder))
            }
        };
        let mut sent = items
            .enumerate()
            .map(|(index, chunk)| async move {
                match chunk {
                    Ok(chunk) => {
                        let published = self.send_chunk(encoded, index, count, &chunk, parked).await;
                        (index, chunk.payload.len(), Ok(published))
                    }
                    Err(e) => (index, 0, Err(e)),
                }
            })
            .buffered(CHUNKS_IN_FLIGHT);
        let mut acknowledged = 0;
        while let Some((index, bytes, published)) = sent.next().await {
            match published {
                Ok(Ok(())) => {
                    self.metrics.chunk_published();
                    acknowledged += 1;
                }
                Err(e) => return Err(e),
                Ok(Err(SendError::Permanent(source))) => {
                    return Err(Unpublished::ChunkRejected {
                        step: id.name(),
                        index,
                        count,
                        bytes,
                        source: Box::new(source),
                        topic: self.output_topic.clone(),
                    })
                }
                Ok(Err(SendError::Stopped)) => {
                    tracing::info!(
                        run_id = %id.run_id, step = id.step, acknowledged_in_order = index, chunks = count,
                        "drain deadline passed mid-step; the step stays uncommitted"
                    );
                    return Err(Unpublished::Stopped);
                }
            }
        }
        if acknowledged < count {
            // The encoder ended early without an error: it panicked.
            let source = match encoder {
                Some(encoder) => encoder.await.err(),
                None => None,
            };
            return Err(match source {
                Some(source) => Unpublished::EncodePanicked {
                    step: id.name(),
                    source,
                },
                None => Unpublished::EncodeChunks(ArrowError::ComputeError(format!(
                    "{acknowledged} of {count} chunks were encoded"
                ))),
            });
        }
        Ok(())
    }

    /// Sends chunk `index` of the step's `count`.
    async fn send_chunk(
        &self,
        encoded: &Encoded,
        index: usize,
        count: usize,
        chunk: &Chunk,
        parked: &Settlement,
    ) -> Result<(), SendError> {
        let chunk_headers = chunk_header_values(index, count, encoded.rows);
        let outgoing = Outgoing {
            topic: &self.output_topic,
            key: Some(encoded.key.as_bytes()),
            payload: Some(&chunk.payload),
            headers: headers(
                [
                    ("content-type", ARROW_STREAM_CONTENT_TYPE),
                    (DEVICE_HEADER, encoded.device),
                    (ATTEMPT_HEADER, encoded.attempt.as_str()),
                ]
                .into_iter()
                .chain(chunk_headers.iter().map(|(name, value)| (*name, value.as_str()))),
            ),
        };
        parked.send(&self.producer, outgoing, &self.lifecycle).await
    }

    /// Sends the step's hint outcomes, after its last chunk, all at once,
    /// and waits for every acknowledgement. Each is a small JSON object, as
    /// the metrics are: a rejection is a broker or ACL problem, reported and
    /// not worth withholding the step for (stage 1 learns from one outcome
    /// fewer).
    async fn send_outcomes(
        &self,
        id: &StepId,
        outcomes: &[HintOutcome],
        encoded: &[(String, Vec<u8>)],
        parked: &Settlement,
    ) -> Result<(), Unpublished> {
        let Some(topic) = self.learning.outcomes_topic() else {
            return Ok(());
        };
        let records: Vec<Outgoing<'_>> = encoded
            .iter()
            .map(|(key, payload)| Outgoing::json(topic, key.as_bytes(), payload))
            .collect();
        let sent = parked.send_all(&self.producer, records, &self.lifecycle).await;
        let mut stopped = false;
        for (sent, outcome) in sent.into_iter().zip(outcomes) {
            match sent {
                Ok(_) => self.metrics.outcome_published(),
                Err(SendError::Permanent(e)) => {
                    self.metrics.outcome_rejected();
                    tracing::error!(
                        run_id = %id.run_id, step = id.step, hint_id = %outcome.hint_id, error = %e, topic,
                        "hint outcome rejected"
                    );
                }
                Err(SendError::Stopped) => stopped = true,
            }
        }
        if stopped {
            return Err(Unpublished::Stopped);
        }
        Ok(())
    }

    /// Sends the step's metrics, after its last chunk and its outcomes.
    /// They are a small JSON object: a rejection here is a broker or ACL
    /// problem, reported and not worth withholding the step for.
    async fn send_metrics(
        &self,
        id: &StepId,
        key: &str,
        metrics: &StepMetrics,
        parked: &Settlement,
    ) -> Result<(), Unpublished> {
        // A map of names to finite numbers always serialises.
        let metrics_json = serde_json::to_vec(metrics).unwrap_or_default();
        let sent = parked
            .send(
                &self.producer,
                Outgoing::json(&self.metrics_topic, key.as_bytes(), &metrics_json),
                &self.lifecycle,
            )
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(SendError::Permanent(e)) => {
                tracing::error!(run_id = %id.run_id, step = id.step, error = %e, topic = %self.metrics_topic, "step metrics rejected");
                Ok(())
            }
            Err(SendError::Stopped) => Err(Unpublished::Stopped),
        }
    }

    pub(super) async fn dead_letter_step(&self, step: PendingStep<Taken>, kind: &'static str, reason: &str) {
        let (_, parked) = step.into_gathered();
        self.dead_letter_parked(Settlement::new(parked), kind, reason)
            .await;
    }

    /// Dead-letters a step's messages, all sends at once, and counts the
    /// step once they are done.
    async fn dead_letter_parked(&self, parked: Settlement, kind: &'static str, reason: &str) {
        tracing::error!(
            kind,
            reason,
            messages = parked.inputs().len(),
            "step sent to the dead-letter topic"
        );
        parked.reject(kind, reason).await;
        self.metrics.step_dead_lettered(kind);
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::types::RDKafkaErrorCode;

    use super::*;

    #[test]
    fn each_failure_dead_letters_with_its_kind_and_reason() {
        let oversized = Unpublished::Oversized {
            row: 7,
            trajectory_id: shortened("t7"),
            step: "run/3".into(),
            bytes: 2_000,
            room: 1_000,
            max_message_bytes: 1_600,
            topic: "rl.advantages".into(),
        };
        assert_eq!(oversized.dead_letter_kind(), Some("output_rejected"));
        assert_eq!(
            oversized.to_string(),
            "row 7 (trajectory_id \"t7\") of step run/3 alone takes 2000 bytes of Arrow, more than the 1000 \
             bytes a message of advantages.max_message_bytes = 1600 leaves for it: raise \
             advantages.max_message_bytes (and message.max.bytes in [kafka] and max.message.bytes on \
             rl.advantages)"
        );
        let rejected = Unpublished::ChunkRejected {
            step: "run/3".into(),
            index: 1,
            count: 4,
            bytes: 900,
            source: Box::new(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageSizeTooLarge,
            )),
            topic: "rl.advantages".into(),
        };
        assert_eq!(rejected.dead_letter_kind(), Some("output_rejected"));
        assert!(
            rejected.to_string().starts_with(
                "the advantages of step run/3 (chunk 1 of 4, 900 bytes) were rejected: Message production error"
            ),
            "{rejected}"
        );
        assert!(rejected.to_string().ends_with(
            "; raise message.max.bytes in [kafka] and max.message.bytes on rl.advantages, or lower \
             advantages.max_message_bytes"
        ));
        let encode = Unpublished::EncodeChunks(ArrowError::ComputeError("no room".into()));
        assert_eq!(encode.dead_letter_kind(), Some("encode"));
        assert_eq!(
            encode.to_string(),
            ArrowError::ComputeError("no room".into()).to_string()
        );
    }

    #[test]
    fn a_step_stopped_by_the_drain_deadline_is_not_dead_lettered() {
        assert_eq!(Unpublished::Stopped.dead_letter_kind(), None);
    }
}
