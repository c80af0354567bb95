//! The Kafka side of a stage, built the same way for both: a subscribed
//! group consumer (with its lag gauge), an idempotent producer, the
//! dead-letter producer and the consume loop's metrics and bounds.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaResult;
use rdkafka::producer::FutureProducer;

use super::worker::{run_stage, RecordMeta, Rejected, RunOptions, RunSummary, Work};
use super::{create_consumer, create_producer, DeadLetters, StageConsumer};
use crate::config::{Config, StageConfig};
use crate::metrics::StageMetrics;

pub struct StageIo {
    consumer: Arc<StageConsumer>,
    /// For the stage's outputs (the DLQ has a handle to the same producer).
    pub producer: FutureProducer,
    pub dlq: DeadLetters,
    metrics: Arc<StageMetrics>,
    options: RunOptions,
}

impl StageIo {
    /// Creates the clients of `stage`, subscribes to its input topic and
    /// registers the consume loop's metrics in `registry`.
    pub fn build(config: &Config, stage: &StageConfig, registry: &mut Registry) -> KafkaResult<Self> {
        let metrics = Arc::new(StageMetrics::register(registry));
        let consumer = Arc::new(create_consumer(config, &stage.group_id, metrics.consumer_lag())?);
        consumer.subscribe(&[&stage.input_topic])?;
        let producer = create_producer(config)?;
        Ok(StageIo {
            consumer,
            dlq: DeadLetters::new(producer.clone(), stage.dlq_topic.clone()),
            producer,
            metrics,
            options: RunOptions {
                max_in_flight: stage.max_in_flight,
                drain_timeout: Duration::from_secs(stage.drain_timeout_secs),
            },
        })
    }

    /// Runs the consume loop ([`run_stage`]) until `shutdown` resolves.
    pub async fn run<T, D, H, F>(self, decode: D, handle: H, shutdown: impl Future<Output = ()>) -> RunSummary
    where
        T: Send + 'static,
        D: Fn(&[u8], &RecordMeta) -> Result<T, Rejected>,
        H: Fn(Work<T>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        run_stage(
            self.consumer,
            self.dlq,
            self.metrics,
            self.options,
            decode,
            handle,
            shutdown,
        )
        .await
    }
}
