//! Reading a whole topic outside any consumer group: every partition by
//! assignment from the beginning, then following the end, each record
//! handed to a callback (one consumer per topic: librdkafka's partition-EOF
//! event names the partition but not its topic). Stage 1 rebuilds what it learned from `rl.hints`
//! and `rl.hints.outcomes` this way, and stage 2 knows the hints its rows
//! name. Nothing is committed: a restart reads the topics again, so every
//! reader that saw the same records holds the same state.
//!
//! [`TopicTail::sync`] is the read barrier: it measures the end offsets now
//! and waits until every partition has been read up to them. A record
//! counts as read once the callback has returned. Transaction markers take
//! offsets that carry no record, so at a partition-EOF the reader takes
//! librdkafka's position, which is past them (before, a caught-up reader of
//! a topic written in transactions waited out every barrier's bound); a
//! partition with no position there (no record handed on) counts as read
//! when its reader reported partition-EOF after the measurement. A reader
//! is caught up when the barrier taken at its start has passed.
//! [`sync_all`] is the barrier of several readers at once, measured in one
//! round trip.
//!
//! The end offsets are asked for by a second client of the tail (its
//! measurer, made at its first barrier, with no group), never assigned
//! anything: a broker answers one connection's requests in order, and the
//! reader's connection nearly always has a fetch waiting on the broker for
//! new records (`fetch.wait.max.ms`, 500 ms by default) that a ListOffsets
//! sent on it would wait behind. Asked on the reader's own, a barrier on a
//! quiet topic took 450-470 ms where one round trip takes a few
//! (docs/BENCHMARKS.md, round thirty-five).
//!
//! Partitions added to a topic after the tail started are not read (a
//! restart picks them up). [`TopicTail::start_since`] starts at a time
//! instead of the beginning (stage 1's spend ledger: the last hour).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use thiserror::Error;
use tokio::sync::Notify;
use tracing::Instrument;

use super::client_config;
use super::transient::{retry_transient, transient_topic_error};
use crate::config::{ClientKind, Config};

/// How long one metadata or watermark request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The readers' client context: librdkafka reports each partition-EOF (which
/// the reader asks for, to place the end of a partition) to the error
/// callback too, as `KafkaError::Global(PartitionEOF)`; the end of a
/// partition is progress, not an error, and is not logged. A measurer's
/// errors (its connections to the brokers the reader uses, which the
/// reader reports) are logged at debug only.
struct TailContext {
    measurer: bool,
}

impl ClientContext for TailContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if self.measurer {
            tracing::debug!(error = %error, reason, "measuring the end offsets of a whole topic");
        } else if !expected(&error) {
            tracing::warn!(error = %error, reason, "reading a whole topic");
        }
    }
}

impl ConsumerContext for TailContext {}

/// Errors a whole-topic reader expects: the end of a partition (as the
/// consumer reports it, or as the error callback does), and a refused
/// lookup of the group it never joins.
fn expected(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode::{GroupAuthorizationFailed, PartitionEOF};
    matches!(error, KafkaError::PartitionEOF(_))
        || matches!(
            error.rdkafka_error_code(),
            Some(PartitionEOF | GroupAuthorizationFailed)
        )
}

type TailConsumer = StreamConsumer<TailContext>;

/// Why a tail could not start, or a barrier did not pass.
#[derive(Debug, Error)]
pub enum TailError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("topic {0} does not exist; create it with `hintstream topics create`")]
    MissingTopic(String),
    #[error("reading {topic} did not reach its end offsets within {waited:?} ({behind} partitions behind)")]
    Behind {
        topic: String,
        waited: Duration,
        behind: usize,
    },
    #[error("the reader of {0} stopped")]
    Stopped(String),
}

/// What the reader task has read of each partition.
#[derive(Default)]
struct Progress {
    /// partition -> the next offset to read.
    position: HashMap<i32, i64>,
    /// partition -> the event number of its last partition-EOF.
    eof_at: HashMap<i32, u64>,
    /// Counts every event, so that an EOF can be placed after a measurement.
    events: u64,
    stopped: bool,
}

/// A running reader of a whole topic; the reader task stops when the tail
/// is dropped.
pub struct TopicTail {
    /// Asks the end offsets: a client assigned nothing, so no fetch waits
    /// on its connections (module docs), made at the first barrier that
    /// asks through this tail (`sync_all` asks through its first).
    measurer: tokio::sync::OnceCell<Measurer>,
    /// The measurer's settings: the reader's, without a group.
    measurer_config: rdkafka::ClientConfig,
    topic: String,
    partitions: Vec<i32>,
    progress: Arc<Mutex<Progress>>,
    moved: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TopicTail {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A tail's second client, and the task that serves its queue (what
/// librdkafka logs and reports of its connections: it has no records to
/// read) until it is dropped.
struct Measurer {
    client: Arc<TailConsumer>,
    task: tokio::task::JoinHandle<()>,
}

impl Measurer {
    fn start(settings: &rdkafka::ClientConfig, topic: &str) -> Result<Measurer, TailError> {
        let client: Arc<TailConsumer> =
            Arc::new(settings.create_with_context(TailContext { measurer: true })?);
        let task = {
            let (client, topic) = (client.clone(), topic.to_string());
            // Its own: it outlives the barrier that made it.
            tokio::spawn(async move {
                loop {
                    if let Err(e) = client.recv().await {
                        tracing::debug!(error = %e, topic, "measuring the end offsets of a whole topic");
                    }
                }
            })
        };
        Ok(Measurer { client, task })
    }
}

impl Drop for Measurer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TopicTail {
    /// Assigns every partition of `topic` from the beginning and starts
    /// handing each record (key, payload) to `on_record`, on a task of its
    /// own. A topic that does not exist is an error.
    pub async fn start<F>(config: &Config, topic: &str, mut on_record: F) -> Result<TopicTail, TailError>
    where
        F: FnMut(Option<&[u8]>, Option<&[u8]>) + Send + 'static,
    {
        Self::start_at(config, topic, None, move |key, payload, _| {
            on_record(key, payload)
        })
        .await
    }

    /// As [`TopicTail::start`], from the first record of each partition
    /// written at or after `since` (the partition's end when none is);
    /// `on_record` also gets the time the broker appended the record (ms
    /// since the Unix epoch) when the topic stamps records so
    /// (`message.timestamp.type = LogAppendTime`), else `None`.
    pub async fn start_since<F>(
        config: &Config,
        topic: &str,
        since: std::time::SystemTime,
        on_record: F,
    ) -> Result<TopicTail, TailError>
    where
        F: FnMut(Option<&[u8]>, Option<&[u8]>, Option<i64>) + Send + 'static,
    {
        Self::start_at(config, topic, Some(since), on_record).await
    }

    async fn start_at<F>(
        config: &Config,
        topic: &str,
        since: Option<std::time::SystemTime>,
        on_record: F,
    ) -> Result<TopicTail, TailError>
    where
        F: FnMut(Option<&[u8]>, Option<&[u8]>, Option<i64>) + Send + 'static,
    {
        let consumer: Arc<TailConsumer> =
            Arc::new(reader_config(config).create_with_context(TailContext { measurer: false })?);
        let partitions = partitions_of(consumer.clone(), topic.to_string()).await?;
        let mut assignment = TopicPartitionList::new();
        let start = match since {
            None => Offset::Beginning,
            Some(at) => {
                let ms = at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                Offset::Offset(ms)
            }
        };
        for partition in &partitions {
            assignment.add_partition_offset(topic, *partition, start)?;
        }
        let mut progress = Progress::default();
        if since.is_some() {
            // The offsets of those timestamps (a blocking request, off the
            // runtime); `End` where nothing was written since, which is
            // placed at the end offset now so that `sync` counts the
            // partition read up to where it starts.
            let found = retry_transient(METADATA_TIMEOUT, kafka_of, || {
                let (c, asked) = (consumer.clone(), assignment.clone());
                async move {
                    tokio::task::spawn_blocking(move || c.offsets_for_times(asked, METADATA_TIMEOUT))
                        .await
                        .map_err(|_| TailError::Stopped(String::from("offsets for times")))?
                        .map_err(TailError::from)
                }
            })
            .await?;
            // Asked before the reader is assigned: no fetch waits yet.
            let ends = end_offsets(consumer.clone(), topic.to_string(), partitions.clone()).await?;
            assignment = TopicPartitionList::new();
            for e in found.elements() {
                let offset = match e.offset() {
                    Offset::Offset(n) => n,
                    _ => ends.get(&e.partition()).copied().unwrap_or(0),
                };
                assignment.add_partition_offset(topic, e.partition(), Offset::Offset(offset))?;
                progress.position.insert(e.partition(), offset);
            }
        }
        consumer.assign(&assignment)?;
        let progress = Arc::new(Mutex::new(progress));
        let moved = Arc::new(Notify::new());
        let task = spawn_reader(
            consumer,
            topic.to_string(),
            progress.clone(),
            moved.clone(),
            on_record,
        );
        let mut measurer_config = reader_config(config);
        measurer_config.remove("group.id");
        Ok(TopicTail {
            measurer: tokio::sync::OnceCell::new(),
            measurer_config,
            topic: topic.to_string(),
            partitions,
            progress,
            moved,
            task,
        })
    }

    /// Waits until every partition has been read up to the end offsets it
    /// has now, at most `within`.
    pub async fn sync(&self, within: Duration) -> Result<(), TailError> {
        sync_all(&[self], within).await
    }

    /// Waits until every partition is read up to `targets` (partition ->
    /// end offset), or reported partition-EOF after the event numbered
    /// `measured_at`, until `deadline`; `within` is the bound reported.
    async fn read_up_to(
        &self,
        targets: &HashMap<i32, i64>,
        measured_at: u64,
        deadline: Instant,
        within: Duration,
    ) -> Result<(), TailError> {
        loop {
            let waiting = self.moved.notified();
            let behind = {
                let p = lock(&self.progress);
                if p.stopped {
                    return Err(TailError::Stopped(self.topic.clone()));
                }
                targets
                    .iter()
                    .filter(|&(key, &end)| {
                        let read = p.position.get(key).copied().unwrap_or(0) >= end;
                        let eof_after = p.eof_at.get(key).is_some_and(|&at| at > measured_at);
                        !(read || eof_after || end == 0)
                    })
                    .count()
            };
            if behind == 0 {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, waiting).await.is_err() {
                return Err(TailError::Behind {
                    topic: self.topic.clone(),
                    waited: within,
                    behind,
                });
            }
        }
    }
}

/// The read barrier of several tails at once: waits until each has read
/// every partition of its topic up to the end offsets they all have now, at
/// most `within`. The end offsets of every partition are asked for in one
/// request per leader broker (ListOffsets, at the readers' isolation
/// level), sent together: the barrier costs one round trip, then only the
/// reading of what was written before it, which the readers fetch all the
/// time.
pub async fn sync_all(tails: &[&TopicTail], within: Duration) -> Result<(), TailError> {
    let Some(first) = tails.first() else {
        return Ok(());
    };
    let deadline = Instant::now() + within;
    // Events counted before the measurement: an EOF after it is fresh.
    let measured_at: Vec<u64> = tails.iter().map(|t| lock(&t.progress).events).collect();
    let wanted: Vec<(String, Vec<i32>)> = tails
        .iter()
        .map(|t| (t.topic.clone(), t.partitions.clone()))
        .collect();
    let measurer = first
        .measurer
        .get_or_try_init(|| async { Measurer::start(&first.measurer_config, &first.topic) })
        .await?;
    let ends = latest_offsets(measurer.client.clone(), wanted, within.min(METADATA_TIMEOUT)).await?;
    for (tail, at) in tails.iter().zip(measured_at) {
        let targets: HashMap<i32, i64> = ends
            .iter()
            .filter(|((topic, _), _)| *topic == tail.topic)
            .map(|((_, partition), end)| (*partition, *end))
            .collect();
        tail.read_up_to(&targets, at, deadline, within).await?;
    }
    Ok(())
}

fn lock(progress: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    // Every change to Progress completes before the lock is released.
    progress.lock().unwrap_or_else(|e| e.into_inner())
}

/// The reader's task: hands each record of `consumer` to `on_record`, and
/// keeps `progress` (what was read of each partition) and `moved` (woken at
/// each event) for the barrier.
fn spawn_reader<F>(
    consumer: Arc<TailConsumer>,
    topic: String,
    progress: Arc<Mutex<Progress>>,
    moved: Arc<Notify>,
    mut on_record: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnMut(Option<&[u8]>, Option<&[u8]>, Option<i64>) + Send + 'static,
{
    tokio::spawn(
        async move {
            loop {
                let event = consumer.recv().await;
                // At a partition's end, librdkafka's position there: past
                // any transaction marker after the last record (an offset
                // with no record, which a barrier's end offset counts).
                // Asked before the lock: it waits on librdkafka's thread.
                let end = match &event {
                    Err(KafkaError::PartitionEOF(partition)) => position_of(&consumer, &topic, *partition),
                    _ => None,
                };
                let mut p = lock(&progress);
                p.events += 1;
                let n = p.events;
                match event {
                    Ok(m) => {
                        drop(p);
                        let appended = match m.timestamp() {
                            rdkafka::Timestamp::LogAppendTime(ms) => Some(ms),
                            _ => None,
                        };
                        on_record(m.key(), m.payload(), appended);
                        // Read once handed on: a barrier that counts it
                        // finds the record applied.
                        lock(&progress).position.insert(m.partition(), m.offset() + 1);
                    }
                    // Read up to the position, and no further: an end
                    // reported before records fetched after it (still
                    // queued) counts for what was handed on.
                    Err(KafkaError::PartitionEOF(partition)) => match end {
                        Some(end) => {
                            let read = p.position.entry(partition).or_insert(end);
                            *read = (*read).max(end);
                        }
                        // No position (no record handed on, e.g. every
                        // one of the partition deleted): the end reached
                        // after a barrier's measurement counts.
                        None => {
                            p.eof_at.insert(partition, n);
                        }
                    },
                    Err(e) if expected(&e) => tracing::debug!(error = %e, "reading a whole topic"),
                    Err(e) => tracing::warn!(error = %e, "reading a whole topic; retrying"),
                }
                moved.notify_waiters();
            }
        }
        .in_current_span(),
    )
}

/// The reader's position in `partition` of `topic` (the offset after what
/// it was handed, moved past transaction markers), as librdkafka keeps it;
/// `None` when it has none.
fn position_of(consumer: &TailConsumer, topic: &str, partition: i32) -> Option<i64> {
    let positions = consumer.position().ok()?;
    match positions.find_partition(topic, partition)?.offset() {
        Offset::Offset(n) => Some(n),
        _ => None,
    }
}

/// A consumer that reads by assignment: a group id of its own that never
/// joins (assign, no subscribe) and never commits; partition-EOF events on;
/// only committed transactional records. librdkafka still looks up that
/// group's coordinator, which a principal without group ACLs is refused:
/// harmless (nothing is committed), so not reported as a warning.
fn reader_config(config: &Config) -> rdkafka::ClientConfig {
    let mut client = client_config(config, ClientKind::Consumer);
    client
        .set("group.id", format!("hintstream-tail-{}", rand::random::<u64>()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest");
    client
}

/// The Kafka error in a reader's error, for [`retry_transient`].
fn kafka_of(e: &TailError) -> Option<&KafkaError> {
    match e {
        TailError::Kafka(k) => Some(k),
        _ => None,
    }
}

/// Every partition of `topic` (a blocking metadata call, off the runtime;
/// asked again while the broker answers with a transient error, such as a
/// leader being elected, for up to [`METADATA_TIMEOUT`]).
async fn partitions_of(consumer: Arc<TailConsumer>, topic: String) -> Result<Vec<i32>, TailError> {
    retry_transient(METADATA_TIMEOUT, kafka_of, || {
        partitions_now(consumer.clone(), topic.clone())
    })
    .await
}

async fn partitions_now(consumer: Arc<TailConsumer>, topic: String) -> Result<Vec<i32>, TailError> {
    tokio::task::spawn_blocking(move || {
        let metadata = consumer.fetch_metadata(Some(&topic), METADATA_TIMEOUT)?;
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        if let Some(e) = found.and_then(|t| transient_topic_error(t.error())) {
            return Err(TailError::Kafka(e));
        }
        let t = found
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .ok_or_else(|| TailError::MissingTopic(topic.clone()))?;
        Ok(t.partitions().iter().map(|p| p.id()).collect())
    })
    .await
    .map_err(|_| TailError::Stopped(String::from("metadata")))?
}

/// The end offset of each partition of `topic` now.
async fn end_offsets(
    consumer: Arc<TailConsumer>,
    topic: String,
    partitions: Vec<i32>,
) -> Result<HashMap<i32, i64>, TailError> {
    let ends = latest_offsets(consumer, vec![(topic, partitions)], METADATA_TIMEOUT).await?;
    Ok(ends.into_iter().map(|((_, p), end)| (p, end)).collect())
}

/// The end offset of each (topic, partition) of `wanted` now, as the
/// consumer's isolation level sees it (read_committed: the last stable
/// offset): one ListOffsets request (timestamp "latest") per leader
/// broker, sent together (a blocking call, off the runtime).
async fn latest_offsets(
    consumer: Arc<TailConsumer>,
    wanted: Vec<(String, Vec<i32>)>,
    within: Duration,
) -> Result<HashMap<(String, i32), i64>, TailError> {
    // A partition's leader that moved answers "not leader": asked again.
    retry_transient(within, kafka_of, || {
        latest_offsets_now(consumer.clone(), wanted.clone(), within)
    })
    .await
}

async fn latest_offsets_now(
    consumer: Arc<TailConsumer>,
    wanted: Vec<(String, Vec<i32>)>,
    within: Duration,
) -> Result<HashMap<(String, i32), i64>, TailError> {
    let mut list = TopicPartitionList::new();
    for (topic, partitions) in &wanted {
        for partition in partitions {
            list.add_partition_offset(topic, *partition, Offset::End)?;
        }
    }
    tokio::task::spawn_blocking(move || {
        let found = consumer.offsets_for_times(list, within)?;
        let mut out = HashMap::new();
        for e in found.elements() {
            e.error()?;
            let end = match e.offset() {
                Offset::Offset(n) => n,
                // An empty partition: nothing to read up to.
                _ => 0,
            };
            out.insert((e.topic().to_string(), e.partition()), end);
        }
        Ok::<_, TailError>(out)
    })
    .await
    .map_err(|_| TailError::Stopped(String::from("end offsets")))?
}
