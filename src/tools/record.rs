//! `hintstream record`: copies a topic into JSONL, from the beginning of every
//! partition to its end (or N messages).
//!
//! The end of a partition is the consumer's partition-EOF event, not the high
//! watermark read at start: a `read_committed` reader stops at the last
//! stable offset, and the watermark also counts transaction markers, which
//! are no messages. The watermarks only size the progress bar.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use thiserror::Error;

use super::recorded::RecordedMessage;
use crate::config::Config;
use crate::kafka::client_config;
use crate::kafka::transient::{retry_transient, transient_topic_error};

#[derive(Debug, Error)]
pub enum RecordError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("topic {0:?} does not exist (or has no partitions)")]
    UnknownTopic(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no message arrived for {0:?} although the partitions were not at their end; is the broker up?")]
    Stalled(Duration),
}

#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub topic: String,
    /// Stop after this many messages.
    pub max_messages: Option<u64>,
    /// Give up when nothing arrives for this long before the end is reached.
    pub idle_timeout: Duration,
    pub progress: bool,
}

/// Records `options.topic` into `out`. Returns how many messages were written.
pub async fn record(config: &Config, options: &RecordOptions, out: &Path) -> Result<u64, RecordError> {
    let mut client = client_config(config, crate::config::ClientKind::Consumer);
    client
        .set("group.id", format!("hintstream-record-{}", rand::random::<u64>()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        // Only committed transactional records (librdkafka's default too;
        // set after the passthrough table so that it cannot change it): under
        // exactly_once an aborted output is never recorded.
        .set("isolation.level", "read_committed");
    let consumer: StreamConsumer<EofIsNotAnError> = client.create_with_context(EofIsNotAnError)?;
    // A leader that is moving answers "not leader": asked again for up to
    // the idle bound (each try is bounded by its own 10 s).
    let kafka_of: fn(&RecordError) -> Option<&KafkaError> = |e| match e {
        RecordError::Kafka(k) => Some(k),
        _ => None,
    };
    let ends = retry_transient(options.idle_timeout, kafka_of, || {
        end_offsets(&client, &options.topic)
    })
    .await?;
    let mut tpl = TopicPartitionList::new();
    let mut remaining: HashSet<i32> = HashSet::new();
    for (&partition, &(low, _)) in &ends {
        tpl.add_partition_offset(&options.topic, partition, Offset::Offset(low))?;
        remaining.insert(partition);
    }
    let estimate: u64 = ends.values().map(|(l, h)| (h - l).max(0) as u64).sum();
    let goal = options.max_messages.unwrap_or(u64::MAX);
    let file = std::fs::File::create(out).map_err(|source| RecordError::Write {
        path: out.display().to_string(),
        source,
    })?;
    let mut writer = std::io::BufWriter::new(file);
    let bar = super::progress_bar(
        Some(options.max_messages.unwrap_or(estimate)),
        &format!("recording {}", options.topic),
    );
    if !options.progress {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    if !remaining.is_empty() {
        consumer.assign(&tpl)?;
    }
    let mut written = 0u64;
    while written < goal && !remaining.is_empty() {
        let received = tokio::time::timeout(options.idle_timeout, consumer.recv())
            .await
            .map_err(|_| RecordError::Stalled(options.idle_timeout))?;
        let message = match received {
            Ok(m) => m,
            Err(KafkaError::PartitionEOF(partition)) => {
                remaining.remove(&partition);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let partition = message.partition();
        if !remaining.contains(&partition) {
            continue;
        }
        let recorded = RecordedMessage::of(&message);
        writeln!(writer, "{}", recorded.to_line()).map_err(|source| RecordError::Write {
            path: out.display().to_string(),
            source,
        })?;
        written += 1;
        bar.inc(1);
    }
    writer.flush().map_err(|source| RecordError::Write {
        path: out.display().to_string(),
        source,
    })?;
    bar.finish_and_clear();
    Ok(written)
}

/// Client context of the recorder: with `enable.partition.eof` librdkafka
/// also reports each partition's end through the error callback, which is how
/// `record` knows it is done, not an error worth logging.
struct EofIsNotAnError;

impl rdkafka::ClientContext for EofIsNotAnError {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_))
            && error.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF)
        {
            tracing::error!(error = %error, reason, "kafka client error");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for EofIsNotAnError {}

/// Low and high watermarks of every partition of `topic`. Metadata calls
/// block, so they run on the blocking pool.
async fn end_offsets(
    client: &rdkafka::ClientConfig,
    topic: &str,
) -> Result<HashMap<i32, (i64, i64)>, RecordError> {
    let client = client.clone();
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client.create()?;
        let timeout = Duration::from_secs(10);
        let metadata = consumer.fetch_metadata(Some(&topic), timeout)?;
        let topic_error = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .and_then(|t| t.error());
        if let Some(e) = transient_topic_error(topic_error) {
            return Err(RecordError::Kafka(e));
        }
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(RecordError::UnknownTopic(topic.clone()));
        }
        let mut ends = HashMap::new();
        for partition in partitions {
            ends.insert(partition, consumer.fetch_watermarks(&topic, partition, timeout)?);
        }
        Ok(ends)
    })
    .await
    .map_err(|_| RecordError::Kafka(rdkafka::error::KafkaError::Canceled))?
}
