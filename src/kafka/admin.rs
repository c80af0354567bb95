//! Topic administration: `hintstream topics create`.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::base_config;
use crate::config::Config;

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
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| {
            NewTopic::new(
                n,
                partitions,
                TopicReplication::Fixed(config.topics.replication_factor),
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
