//! Topic administration: `hintstream topics create`. The dead-letter topics
//! get a `max.message.bytes` that holds every input the stage accepts
//! (`kafka::dlq::dlq_message_max_bytes`).

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::base_config;
use super::dlq::dlq_message_max_bytes;
use crate::config::Config;

/// `retention.ms` the outcomes topic is created with: 30 days, long enough
/// for a training run, since stage 1 rebuilds what it learned by reading the
/// topic from the beginning (a shorter retention forgets the run's early
/// outcomes at a restart). Other topics keep the broker's default.
pub const OUTCOMES_RETENTION_MS: i64 = 30 * 24 * 60 * 60 * 1000;

/// `retention.ms` the spend ledger is created with: 2 hours, the rolling
/// hour the budgets count plus an hour's margin (a worker reads the ledger
/// from an hour ago; older records count for nothing).
pub const SPEND_RETENTION_MS: i64 = 2 * 60 * 60 * 1000;

/// What happened to one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicOutcome {
    Created,
    AlreadyExists,
    Failed(String),
}

/// The design's topics and each stage's dead-letter topic.
pub fn design_topics(config: &Config) -> Vec<String> {
    let t = &config.topics;
    let mut names = vec![
        t.failed.clone(),
        t.hints.clone(),
        t.scored.clone(),
        t.advantages.clone(),
        t.metrics.clone(),
        t.outcomes.clone(),
        t.spend.clone(),
        config.hints.dlq_topic.clone(),
        config.advantages.dlq_topic.clone(),
    ];
    names.sort();
    names.dedup();
    names
}

/// Creates `names` with the configured partitions and replication; a
/// stage's dead-letter topic (`hints.dlq_topic`, `advantages.dlq_topic`)
/// with `max.message.bytes` = [`dlq_message_max_bytes`]. Topics that exist
/// already are reported as such, not as errors (and keep their configs).
pub async fn create_topics(
    config: &Config,
    names: &[String],
    partitions: i32,
) -> Result<Vec<(String, TopicOutcome)>, KafkaError> {
    let dlq_bytes = dlq_message_max_bytes(config).to_string();
    let outcomes_retention = OUTCOMES_RETENTION_MS.to_string();
    let spend_retention = SPEND_RETENTION_MS.to_string();
    let topics: Vec<(String, Vec<(&str, &str)>)> = names
        .iter()
        .map(|n| {
            let is_dlq = *n == config.hints.dlq_topic || *n == config.advantages.dlq_topic;
            let configs = if is_dlq {
                vec![("max.message.bytes", dlq_bytes.as_str())]
            } else if *n == config.topics.outcomes {
                vec![("retention.ms", outcomes_retention.as_str())]
            } else if *n == config.topics.spend {
                vec![("retention.ms", spend_retention.as_str())]
            } else {
                vec![]
            };
            (n.clone(), configs)
        })
        .collect();
    create_topics_with(config, &topics, partitions).await
}

/// Creates each named topic with its topic configs (`max.message.bytes`,
/// `retention.ms`, ...), the configured replication and `partitions`.
/// Topics that exist already are reported as such, not as errors.
pub async fn create_topics_with(
    config: &Config,
    topics: &[(String, Vec<(&str, &str)>)],
    partitions: i32,
) -> Result<Vec<(String, TopicOutcome)>, KafkaError> {
    let admin: AdminClient<DefaultClientContext> = base_config(config).create()?;
    let topics: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(n, configs)| {
            configs.iter().fold(
                NewTopic::new(
                    n,
                    partitions,
                    TopicReplication::Fixed(config.topics.replication_factor),
                ),
                |topic, (key, value)| topic.set(key, value),
            )
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin.create_topics(&topics, &options).await?;
    Ok(results
        .into_iter()
        .map(|r| match r {
            Ok(name) => (name, TopicOutcome::Created),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => (name, TopicOutcome::AlreadyExists),
            Err((name, code)) => (name, TopicOutcome::Failed(code.to_string())),
        })
        .collect())
}
