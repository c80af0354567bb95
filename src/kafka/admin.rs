//! Topic administration: `hintstream topics create`.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::base_config;
use crate::config::Config;

/// `retention.ms` the outcomes topic is created with: 30 days, long enough
/// for a training run, since stage 1 rebuilds what it learned by reading the
/// topic from the beginning (a shorter retention forgets the run's early
/// outcomes at a restart). Other topics keep the broker's default.
pub const OUTCOMES_RETENTION_MS: i64 = 30 * 24 * 60 * 60 * 1000;

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
        config.hints.dlq_topic.clone(),
        config.advantages.dlq_topic.clone(),
    ];
    names.sort();
    names.dedup();
    names
}

/// Creates `names` with the configured partitions and replication. Topics that
/// exist already are reported as such, not as errors.
pub async fn create_topics(
    config: &Config,
    names: &[String],
    partitions: i32,
) -> Result<Vec<(String, TopicOutcome)>, KafkaError> {
    let admin: AdminClient<DefaultClientContext> = base_config(config).create()?;
    let outcomes_retention = OUTCOMES_RETENTION_MS.to_string();
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| {
            let topic = NewTopic::new(
                n,
                partitions,
                TopicReplication::Fixed(config.topics.replication_factor),
            );
            if *n == config.topics.outcomes {
                topic.set("retention.ms", &outcomes_retention)
            } else {
                topic
            }
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
