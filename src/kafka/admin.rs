//! Topic administration: `hintstream topics create` makes every topic of
//! the registered stages (each stage says which it needs, and with which
//! topic configs: [`TopicSpec`]). The dead-letter topics get a
//! `max.message.bytes` that holds every input the stage accepts
//! (`kafka::dlq::dlq_message_max_bytes`).

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
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

/// A topic as a stage needs it made: its name and the topic configs it is
/// created with (an existing topic keeps its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub configs: Vec<(&'static str, String)>,
}

impl TopicSpec {
    /// A topic with the broker's defaults.
    pub fn plain(name: &str) -> Self {
        TopicSpec {
            name: name.to_string(),
            configs: Vec::new(),
        }
    }

    /// A stage's dead-letter topic: `max.message.bytes` =
    /// [`dlq_message_max_bytes`], which holds every input the stage accepts.
    pub fn dead_letters(config: &Config, name: &str) -> Self {
        TopicSpec {
            name: name.to_string(),
            configs: vec![("max.message.bytes", dlq_message_max_bytes(config).to_string())],
        }
    }

    /// The outcomes topic: [`OUTCOMES_RETENTION_MS`].
    pub fn outcomes(name: &str) -> Self {
        TopicSpec {
            name: name.to_string(),
            configs: vec![("retention.ms", OUTCOMES_RETENTION_MS.to_string())],
        }
    }

    /// The spend ledger: [`SPEND_RETENTION_MS`], and each record stamped
    /// with the broker's clock as it is appended
    /// (`message.timestamp.type = LogAppendTime`): a record's age in the
    /// rolling hour is the broker's, whatever the writer's clock says, and
    /// a reader started later finds the same age.
    pub fn spend(name: &str) -> Self {
        TopicSpec {
            name: name.to_string(),
            configs: vec![
                ("retention.ms", SPEND_RETENTION_MS.to_string()),
                ("message.timestamp.type", "LogAppendTime".to_string()),
            ],
        }
    }
}

/// The topics of several stages, each once (by name, the first spec
/// wins), sorted by name.
pub fn union(specs: impl IntoIterator<Item = TopicSpec>) -> Vec<TopicSpec> {
    let mut out: Vec<TopicSpec> = Vec::new();
    for spec in specs {
        if !out.iter().any(|s| s.name == spec.name) {
            out.push(spec);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Creates `topics` with the configured replication and `partitions`.
/// Topics that exist already are reported as such, not as errors (and keep
/// their configs).
pub async fn create_topics(
    config: &Config,
    topics: &[TopicSpec],
    partitions: i32,
) -> Result<Vec<(String, TopicOutcome)>, KafkaError> {
    let topics: Vec<(String, Vec<(&str, &str)>)> = topics
        .iter()
        .map(|t| {
            let configs = t.configs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            (t.name.clone(), configs)
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
    let mut outcomes: Vec<(String, TopicOutcome)> = results
        .into_iter()
        .map(|r| match r {
            Ok(name) => (name, TopicOutcome::Created),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => (name, TopicOutcome::AlreadyExists),
            Err((name, code)) => (name, TopicOutcome::Failed(code.to_string())),
        })
        .collect();
    let created: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| *o == TopicOutcome::Created)
        .map(|(n, _)| n.clone())
        .collect();
    let missing = wait_until_visible(config, created, TOPICS_VISIBLE_TIMEOUT).await;
    for (name, outcome) in &mut outcomes {
        if missing.contains(name) {
            *outcome = TopicOutcome::Failed(format!(
                "created, but not in the brokers' metadata after {} s",
                TOPICS_VISIBLE_TIMEOUT.as_secs()
            ));
        }
    }
    Ok(outcomes)
}

/// How long [`create_topics_with`] waits for the brokers to show the topics
/// it created.
const TOPICS_VISIBLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits, at most `within`, until the metadata shows each of `names` with
/// its partitions: Kafka answers CreateTopics once its controller committed
/// them, and its brokers learn of them a moment later, so a stage started
/// right after `topics create` could otherwise find its topic missing.
/// Returns the names still missing at the deadline.
pub async fn wait_until_visible(config: &Config, names: Vec<String>, within: Duration) -> Vec<String> {
    if names.is_empty() {
        return names;
    }
    let client = base_config(config);
    let waited = tokio::task::spawn_blocking(move || {
        let Ok(consumer) = client.create::<BaseConsumer>() else {
            return names;
        };
        let deadline = std::time::Instant::now() + within;
        loop {
            let missing: Vec<String> = match consumer.fetch_metadata(None, Duration::from_secs(5)) {
                Ok(metadata) => names
                    .iter()
                    .filter(|n| {
                        !metadata.topics().iter().any(|t| {
                            t.name() == n.as_str() && t.error().is_none() && !t.partitions().is_empty()
                        })
                    })
                    .cloned()
                    .collect(),
                Err(_) => names.clone(),
            };
            if missing.is_empty() || std::time::Instant::now() >= deadline {
                return missing;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await;
    waited.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spend_topic_is_stamped_with_the_brokers_clock() {
        let spec = TopicSpec::spend("rl.hints.spend");
        assert!(
            spec.configs
                .iter()
                .any(|(k, v)| *k == "message.timestamp.type" && v == "LogAppendTime"),
            "{:?}",
            spec.configs
        );
        assert!(spec.configs.iter().any(|(k, _)| *k == "retention.ms"));
    }
}
