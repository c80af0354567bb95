//! The `[topics]` section: the pipeline's topic names and how
//! `hintstream topics create` makes them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// Topic names and how `hintstream topics create` makes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopicsConfig {
    /// Failed trajectories, from the trainer: stage 1's input.
    pub failed: String,
    /// Hints, from stage 1; stage 2 and stage 1 read them back too.
    pub hints: String,
    /// Scored rollouts and each step's `step_end`, from the trainer: stage
    /// 2's input.
    pub scored: String,
    /// Advantages (Arrow IPC), from stage 2.
    pub advantages: String,
    /// Step metrics (one JSON object per step), from stage 2.
    pub metrics: String,
    /// What each hint did for its group's hinted retries (`HintOutcome`),
    /// written by stage 2 (or the trainer client) and read back by stage 1
    /// to learn which arm rescues more.
    pub outcomes: String,
    /// Stage 1's spend ledger: each worker's settled LLM spend about every
    /// `llm.ledger_interval_ms`, read back by every worker of its group so
    /// that the hourly budgets are the group's.
    pub spend: String,
    /// Partitions of every topic created by `topics create` (at least 1):
    /// the most workers a stage can keep busy.
    pub partitions: i32,
    /// Replication factor of every topic created by `topics create` (at
    /// least 1; 3 on a cluster, with the brokers' `min.insync.replicas =
    /// 2`).
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
