//! Start-up checks, before a stage takes any work: the cluster answers
//! within a bound, and every topic the stage reads or writes exists. A stage
//! that cannot connect says why and exits; it never loops silently on
//! librdkafka's retries.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use thiserror::Error;

use super::base_config;
use crate::config::Config;

#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("cannot reach the Kafka cluster at {servers} within {within:?}: {cause}. Check bootstrap_servers (--bootstrap-servers) and the [kafka] security settings")]
    Unreachable {
        servers: String,
        within: Duration,
        cause: String,
    },
    #[error("topic {topic:?} does not exist on {servers}; create the pipeline's topics with `hintstream topics create` (or point the stage at an existing topic)")]
    MissingTopic { topic: String, servers: String },
    #[error("kafka client: {0}")]
    Client(#[from] KafkaError),
}

impl ConnectError {
    /// A missing topic is a configuration problem (exit 2); the rest are
    /// runtime failures (exit 1).
    pub fn is_config(&self) -> bool {
        matches!(self, ConnectError::MissingTopic { .. })
    }
}

/// Fetches the cluster's metadata within `within` and checks that every
/// topic of `topics` exists.
pub async fn check_cluster(config: &Config, topics: &[&str], within: Duration) -> Result<(), ConnectError> {
    let client: BaseConsumer = base_config(config).create()?;
    let servers = config.bootstrap_servers.clone();
    let metadata = tokio::task::spawn_blocking(move || client.fetch_metadata(None, within))
        .await
        .map_err(|_| KafkaError::Canceled)?
        .map_err(|e| ConnectError::Unreachable {
            servers: servers.clone(),
            within,
            cause: e.to_string(),
        })?;
    for topic in topics {
        let present = metadata
            .topics()
            .iter()
            .any(|t| t.name() == *topic && t.error().is_none() && !t.partitions().is_empty());
        if !present {
            return Err(ConnectError::MissingTopic {
                topic: topic.to_string(),
                servers,
            });
        }
    }
    Ok(())
}
