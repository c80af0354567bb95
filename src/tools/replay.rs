//! `hintstream replay`: produces a `record` file back into a topic, with its
//! keys, values and headers, in file order (so per-key order holds), at an
//! optional rate.

use std::path::Path;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use thiserror::Error;

use super::recorded::RecordedMessage;

/// Deliveries awaited at most at once; beyond it replay waits for acks.
const MAX_PENDING_DELIVERIES: usize = 10_000;

#[derive(Debug, Error)]
pub enum ReplayError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}: not a recorded message: {source}")]
    BadLine {
        path: String,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("--speed must be a number > 0")]
    Speed,
}

#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Target topic; `None` replays each message into its recorded topic.
    pub topic: Option<String>,
    /// Messages per second; `None` is as fast as the broker takes them.
    pub rate: Option<f64>,
    /// Keep the recorded pace (message timestamps) sped up this many times.
    pub speed: Option<f64>,
    /// Send each message to its recorded partition instead of by key.
    pub keep_partitions: bool,
    pub progress: bool,
}

impl ReplayOptions {
    /// Refuses options `hintstream replay` cannot honour: a `speed` that is
    /// not a finite number > 0 (which [`replay`] would ignore).
    pub fn check(&self) -> Result<(), ReplayError> {
        match self.speed {
            Some(x) if !(x.is_finite() && x > 0.0) => Err(ReplayError::Speed),
            _ => Ok(()),
        }
    }
}

/// Reads every line first (so a bad file fails before anything is sent), then
/// produces them. Returns how many were acknowledged.
pub async fn replay(
    producer: &FutureProducer,
    file: &Path,
    options: &ReplayOptions,
) -> Result<u64, ReplayError> {
    let messages = read_recorded(file)?;
    send_all(producer, &messages, options, "replaying").await
}

/// Produces `messages` in order and waits for every ack.
pub async fn send_all(
    producer: &FutureProducer,
    messages: &[RecordedMessage],
    options: &ReplayOptions,
    what: &str,
) -> Result<u64, ReplayError> {
    let bar = super::progress_bar(Some(messages.len() as u64), what);
    if !options.progress {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut pacing = options
        .rate
        .filter(|r| *r > 0.0)
        .map(|r| tokio::time::interval(Duration::from_secs_f64(1.0 / r)));
    let mut pending: std::collections::VecDeque<DeliveryFuture> = Default::default();
    let mut acked = 0u64;
    let started = tokio::time::Instant::now();
    let first_timestamp = messages.iter().find_map(|m| m.timestamp);
    for message in messages {
        if let Some(interval) = pacing.as_mut() {
            interval.tick().await;
        }
        if let Some(at) = recorded_pace(options.speed, first_timestamp, message.timestamp) {
            tokio::time::sleep_until(started + at).await;
        }
        let topic = options.topic.as_deref().unwrap_or(&message.topic);
        let mut headers = OwnedHeaders::new();
        for h in &message.headers {
            headers = headers.insert(Header {
                key: &h.key,
                value: h.value.bytes.as_deref(),
            });
        }
        loop {
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers.clone());
            if let Some(key) = message.key_bytes() {
                record = record.key(key);
            }
            if let Some(value) = message.value_bytes() {
                record = record.payload(value);
            }
            if options.keep_partitions {
                record = record.partition(message.partition);
            }
            // `send_result` enqueues synchronously, so file order is send order.
            match producer.send_result(record) {
                Ok(delivery) => {
                    pending.push_back(delivery);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    acked += await_one(&mut pending, &bar).await?;
                    if pending.is_empty() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        while pending.len() >= MAX_PENDING_DELIVERIES {
            acked += await_one(&mut pending, &bar).await?;
        }
    }
    while !pending.is_empty() {
        acked += await_one(&mut pending, &bar).await?;
    }
    let flush = producer.clone();
    tokio::task::spawn_blocking(move || flush.flush(Duration::from_secs(30)))
        .await
        .map_err(|_| KafkaError::Canceled)??;
    bar.finish_and_clear();
    Ok(acked)
}

/// When, after the first message, `timestamp` is due at `speed` times the
/// recorded pace. Messages without a timestamp (or before the first) go at
/// once.
fn recorded_pace(speed: Option<f64>, first: Option<i64>, timestamp: Option<i64>) -> Option<Duration> {
    let speed = speed.filter(|s| s.is_finite() && *s > 0.0)?;
    let since_first_ms = timestamp?.checked_sub(first?)?;
    (since_first_ms > 0).then(|| Duration::from_secs_f64(since_first_ms as f64 / 1000.0 / speed))
}

async fn await_one(
    pending: &mut std::collections::VecDeque<DeliveryFuture>,
    bar: &indicatif::ProgressBar,
) -> Result<u64, ReplayError> {
    let Some(delivery) = pending.pop_front() else {
        return Ok(0);
    };
    match delivery.await {
        Ok(Ok(_)) => {
            bar.inc(1);
            Ok(1)
        }
        Ok(Err((e, _))) => Err(e.into()),
        Err(_) => Err(KafkaError::Canceled.into()),
    }
}

/// Parses a `record` file.
pub fn read_recorded(file: &Path) -> Result<Vec<RecordedMessage>, ReplayError> {
    let path = file.display().to_string();
    let io_error = |source| ReplayError::Read {
        path: path.clone(),
        source,
    };
    let mut messages = Vec::new();
    crate::jsonl::for_each_line(file, io_error, |number, line| {
        messages.push(
            RecordedMessage::from_line(line).map_err(|source| ReplayError::BadLine {
                path: path.clone(),
                line: number,
                source,
            })?,
        );
        Ok(())
    })?;
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_pace_scales_the_gaps() {
        assert_eq!(
            recorded_pace(Some(1.0), Some(1_000), Some(3_000)),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            recorded_pace(Some(10.0), Some(1_000), Some(3_000)),
            Some(Duration::from_millis(200))
        );
        assert_eq!(recorded_pace(None, Some(1_000), Some(3_000)), None);
        assert_eq!(recorded_pace(Some(2.0), Some(1_000), None), None);
        assert_eq!(
            recorded_pace(Some(2.0), Some(5_000), Some(1_000)),
            None,
            "an earlier timestamp goes at once"
        );
    }
}
