//! Settings, layered: built-in defaults, then `hintstream.toml` (or
//! `--config FILE`), then env `HINTSTREAM_<SECTION>__<KEY>`, then flags.
//! Unknown keys are errors, so a typo never silently falls back to a default.
//!
//! One file per section, each with its serde struct, the named `default_*`
//! functions its `Default` is made of, and its `validate`; [`Config`] holds
//! the sections and [`Config::validate`] calls theirs. The defaults are the
//! first layer (`load.rs`), so every key reaches serde and no field needs
//! `#[serde(default)]`. This module imports only `messages` and `normalize`.
//!
//! - `load.rs`: the layers and [`Overrides`] (the flags).
//! - `kafka.rs`: `[kafka]`, librdkafka properties by client kind.
//! - `topics.rs`, `limits.rs`, `llm.rs`, `normalize.rs`: their sections;
//!   `llm_context.rs`: models' context windows (`[llm.context_tokens]`).
//! - `stage.rs`: what `[hints]` and `[advantages]` share; `hints.rs` and
//!   `advantages.rs`: the two stages' sections; `arms.rs`: `[[hints.arms]]`.
//! - `env_refs.rs`: `${NAME}` references in the file; `redact.rs`: the
//!   config as `hintstream config` shows it.
//! - `error.rs`: [`ConfigError`].

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

mod advantages;
pub mod arms;
pub mod env_refs;
mod error;
mod hints;
pub mod kafka;
mod limits;
mod llm;
mod llm_context;
mod load;
mod normalize;
mod redact;
mod stage;
mod topics;

pub use advantages::{
    AdvantagesConfig, DEFAULT_ADVANTAGES_MAX_IN_FLIGHT_BYTES, DEFAULT_ADVANTAGES_MAX_MESSAGE_BYTES,
    MIN_ADVANTAGES_MAX_MESSAGE_BYTES,
};
pub use arms::{ArmEntry, ArmSelection, LearnOptions};
pub use env_refs::{EnvRefError, KeyPath};
pub use error::ConfigError;
pub use hints::{HintsConfig, DEFAULT_HINTS_MAX_IN_FLIGHT_BYTES, MAX_CACHE_TTL_SECS};
pub use kafka::{
    ClientKind, DeliveryMode, DrainBound, GroupProtocol, KafkaConfig, KafkaValue,
    LIBRDKAFKA_MESSAGE_MAX_BYTES,
};
pub use limits::LimitsConfig;
pub use llm::{
    CacheTtl, HedgeTo, LlmConfig, LlmProvider, ModelPrice, PromptVersion, UnknownPromptVersion,
    DEFAULT_CACHE_MIN_TOKENS, DEFAULT_REQUESTS_PER_MINUTE, LEDGER_INTERVAL_MS, MAX_HEDGE_WINDOW,
    MAX_LLM_CONCURRENCY, MAX_LLM_TIMEOUT_SECS, MIN_HEDGE_WINDOW, PROMPT_VERSION,
};
pub use llm_context::{context_tokens_of, BUILT_IN_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS};
pub use load::{Overrides, DEFAULT_CONFIG_FILE, ENV_PREFIX};
pub use normalize::{FlagError, NormalizeConfig, NormalizeFlags};
pub use redact::{is_secret_key, REDACTED};
pub use stage::{StageConfig, MAX_IN_FLIGHT_BYTES, MAX_IN_FLIGHT_MESSAGES};
pub use topics::TopicsConfig;

use crate::messages::DecodeLimits;
use error::invalid;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Kafka bootstrap servers, comma-separated (`--bootstrap-servers`, env
    /// `HINTSTREAM_BOOTSTRAP_SERVERS`).
    pub bootstrap_servers: String,
    /// How long a stage may take at start-up to reach the cluster and find
    /// its topics before it exits 1 saying why.
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
        self.advantages.validate(&self.limits, &self.kafka, &drain)
    }

    pub fn decode_limits(&self) -> DecodeLimits {
        self.limits.decode_limits()
    }
}
