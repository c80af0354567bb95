//! The whole configuration: the top-level keys and one field per section,
//! with the rules that span sections ([`Config::validate`]).

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::advantages::AdvantagesConfig;
use super::env_refs::KeyPath;
use super::error::{invalid, ConfigError};
use super::hints::HintsConfig;
use super::kafka::KafkaConfig;
use super::limits::LimitsConfig;
use super::llm::LlmConfig;
use super::normalize::NormalizeConfig;
use super::topics::TopicsConfig;
use crate::messages::DecodeLimits;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Kafka bootstrap servers, comma-separated (`--bootstrap-servers`, env
    /// `HINTSTREAM_BOOTSTRAP_SERVERS`).
    pub bootstrap_servers: String,
    /// Seconds a stage (and `topics create`, `produce`, `record`, `replay`)
    /// may take at start-up to reach the cluster and find its topics (1 to
    /// 3,600): past it, it exits 1 saying why (unreachable, authentication
    /// or TLS failed); a missing topic exits 2 naming it.
    pub connect_timeout_secs: u64,
    /// librdkafka properties passed through (`security.protocol`,
    /// `sasl.mechanism`, `sasl.username`, `sasl.password`, ...), for every
    /// client, with `[kafka.consumer]` and `[kafka.producer]` tables for one
    /// kind. Values whose names look secret, and values taken from `${NAME}`
    /// references, are redacted by `hintstream config`.
    pub kafka: KafkaConfig,
    pub topics: TopicsConfig,
    pub limits: LimitsConfig,
    /// Stage 1, `hintstream hints`.
    pub hints: HintsConfig,
    /// Stage 2, `hintstream advantages`.
    pub advantages: AdvantagesConfig,
    /// The advantage kernels (stage 2 and `advantages compute`).
    pub normalize: NormalizeConfig,
    /// Stage 1's model calls. Keys come from ANTHROPIC_API_KEY /
    /// OPENAI_API_KEY only, never from this file.
    pub llm: LlmConfig,
    /// Keys of the config file whose values came from `${NAME}` references
    /// (redacted when the config is shown).
    #[serde(skip)]
    pub from_env: BTreeSet<KeyPath>,
}

/// The longest `connect_timeout_secs` accepted (an hour).
const MAX_CONNECT_TIMEOUT_SECS: u64 = 3600;

fn default_bootstrap_servers() -> String {
    "127.0.0.1:9092".into()
}

fn default_connect_timeout_secs() -> u64 {
    30
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bootstrap_servers: default_bootstrap_servers(),
            connect_timeout_secs: default_connect_timeout_secs(),
            kafka: KafkaConfig::default(),
            hints: HintsConfig::default(),
            advantages: AdvantagesConfig::default(),
            topics: TopicsConfig::default(),
            limits: LimitsConfig::default(),
            normalize: NormalizeConfig::default(),
            llm: LlmConfig::default(),
            from_env: BTreeSet::new(),
        }
    }
}

impl Config {
    /// Rules that span fields or need more than a type: the top-level keys,
    /// then each section's own.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.bootstrap_servers.trim().is_empty() {
            return invalid("bootstrap_servers is empty; set --bootstrap-servers HOST:PORT");
        }
        if !(1..=MAX_CONNECT_TIMEOUT_SECS).contains(&self.connect_timeout_secs) {
            return invalid(format!(
                "connect_timeout_secs = {} must be within 1..={MAX_CONNECT_TIMEOUT_SECS}",
                self.connect_timeout_secs
            ));
        }
        self.topics.validate()?;
        self.limits.validate()?;
        self.kafka.validate()?;
        let drain = self.kafka.drain_bound()?;
        self.llm.validate()?;
        self.normalize.validate()?;
        self.hints.validate(&drain)?;
        for arm in &self.hints.arms {
            self.llm
                .every_model_priced(&arm.models, &format!("[[hints.arms]] {:?}", arm.name))?;
        }
        self.advantages.validate(&self.limits, &self.kafka, &drain)
    }

    pub fn decode_limits(&self) -> DecodeLimits {
        self.limits.decode_limits()
    }
}
