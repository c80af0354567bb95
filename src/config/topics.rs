//! The `[topics]` section: the pipeline's topic names and how
//! `hintstream topics create` makes them.

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// Topic names and how `hintstream topics create` makes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicsConfig {
    pub failed: String,
    pub hints: String,
    pub scored: String,
    pub advantages: String,
    pub metrics: String,
    /// What each hint did for its group's hinted retries (`HintOutcome`),
    /// written by stage 2 (or the trainer client) and read back by stage 1
    /// to learn which arm rescues more.
    pub outcomes: String,
    /// Stage 1's spend ledger: each worker's settled LLM spend about every
    /// `llm.ledger_interval_ms`, read back by every worker of its group so
    /// that the hourly budgets are the group's.
    pub spend: String,
    /// Partitions of every topic created by `topics create`.
    pub partitions: i32,
    /// Replication factor of every topic created by `topics create`.
    pub replication_factor: i32,
}

pub(super) fn default_failed() -> String {
    "rl.trajectories.failed".into()
}

pub(super) fn default_hints() -> String {
    "rl.hints".into()
}

pub(super) fn default_scored() -> String {
    "rl.rollouts.scored".into()
}

pub(super) fn default_advantages() -> String {
    "rl.advantages".into()
}

fn default_metrics() -> String {
    "rl.metrics".into()
}

pub(super) fn default_outcomes() -> String {
    "rl.hints.outcomes".into()
}

pub(super) fn default_spend() -> String {
    "rl.hints.spend".into()
}

fn default_partitions() -> i32 {
    6
}

fn default_replication_factor() -> i32 {
    1
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            failed: default_failed(),
            hints: default_hints(),
            scored: default_scored(),
            advantages: default_advantages(),
            metrics: default_metrics(),
            outcomes: default_outcomes(),
            spend: default_spend(),
            partitions: default_partitions(),
            replication_factor: default_replication_factor(),
        }
    }
}

impl TopicsConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.partitions < 1 || self.replication_factor < 1 {
            return invalid("topics.partitions and topics.replication_factor must be >= 1");
        }
        Ok(())
    }
}
