//! Settings, layered: built-in defaults, then `hintstream.toml` (or
//! `--config FILE`), then env `HINTSTREAM_<SECTION>__<KEY>`, then flags.
//! Unknown keys are errors, so a typo never silently falls back to a default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub mod env_refs;
pub mod kafka;

pub use env_refs::{EnvRefError, KeyPath};
pub use kafka::{ClientKind, KafkaConfig, KafkaValue};

use crate::messages::DecodeLimits;
use crate::normalize::{AdvantageOptions, Device, Estimator};

/// The config file read when `--config` is not given and the file exists.
pub const DEFAULT_CONFIG_FILE: &str = "hintstream.toml";
/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "HINTSTREAM_";
/// Environment variables with our prefix that are not settings.
const ENV_NOT_SETTINGS: &[&str] = &["test_bootstrap", "log", "log_format"];

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("config file {path} does not exist; pass an existing file to --config or drop the flag")]
    MissingFile { path: PathBuf },
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("{0}")]
    Figment(#[from] Box<figment::Error>),
    #[error("cannot read config file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("config file {path}: {source}")]
    EnvRef {
        path: PathBuf,
        #[source]
        source: EnvRefError,
    },
}

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
    pub from_env: std::collections::BTreeSet<KeyPath>,
}

/// Which model API stage 1 calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmProvider {
    /// Anthropic when ANTHROPIC_API_KEY is set, else OpenRouter when
    /// OPENROUTER_API_KEY is, else an OpenAI-compatible server when
    /// OPENAI_API_KEY or OPENAI_BASE_URL is set, else static hints. Model ids
    /// may name their API litellm-style: `openrouter/anthropic/claude-sonnet-4`,
    /// `anthropic/claude-...`, `openai/gpt-...`.
    #[default]
    Auto,
    Anthropic,
    Openai,
    /// OpenRouter's OpenAI-compatible API (OPENROUTER_API_KEY).
    Openrouter,
    /// Static hints only.
    None,
}

/// The longest `llm.timeout_secs` accepted: one hint may not hold its group
/// (and its offsets) longer than this.
pub const MAX_LLM_TIMEOUT_SECS: f64 = 600.0;

/// Which model API stage 1 calls and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    pub provider: LlmProvider,
    /// The model fallback chain, tried in order; empty = the provider's
    /// default (`claude-sonnet-4-20250514`, or `gpt-4o-mini`). After the last
    /// model fails, the static hint is used.
    pub models: Vec<String>,
    /// API base URL; empty = ANTHROPIC_BASE_URL / OPENAI_BASE_URL, else the
    /// official endpoint.
    pub base_url: String,
    pub max_tokens: u32,
    pub temperature: f64,
    /// Time budget of one hint, all retries and models included (seconds).
    pub timeout_secs: f64,
    /// LLM calls in flight at once.
    pub concurrency: usize,
    /// Retries of one model on 429/529/5xx/timeouts/broken connections.
    pub max_retries: u32,
    /// Requests per minute (0 = no limit). The default caps what a flood of
    /// input can buy at 600 calls a minute.
    pub requests_per_minute: u32,
    /// Tokens per minute, input + output, from the real `usage` (0 = no limit).
    pub tokens_per_minute: u32,
    /// Dollars of LLM calls per rolling hour (0 = no budget). When spent,
    /// hints are static with `failure_reason = "budget_exhausted"` until
    /// older spend leaves the window.
    pub budget_usd_per_hour: f64,
    /// Tokens (input + output) per rolling hour (0 = no budget).
    pub budget_tokens_per_hour: u64,
    /// Dollars per million input / output tokens, by model.
    pub prices: BTreeMap<String, ModelPrice>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// Upper bounds of settings that size in-memory structures: beyond them a
/// value is a typo, and exits 2 instead of failing at start-up.
pub const MAX_IN_FLIGHT_MESSAGES: usize = 100_000_000;
pub const MAX_IN_FLIGHT_BYTES: u64 = 1 << 40;
pub const MAX_LLM_CONCURRENCY: usize = 10_000;
pub const MAX_CACHE_TTL_SECS: u64 = 30 * 24 * 3600;

/// The default `llm.requests_per_minute`: above what 20 concurrent calls of
/// a few seconds each make (~300/min), so it never slows a healthy stage, and
/// low enough that a flood of input cannot buy unlimited calls.
pub const DEFAULT_REQUESTS_PER_MINUTE: u32 = 600;

impl Default for LlmConfig {
    fn default() -> Self {
        let price = |input_per_mtok, output_per_mtok| ModelPrice {
            input_per_mtok,
            output_per_mtok,
        };
        LlmConfig {
            provider: LlmProvider::Auto,
            models: vec![],
            base_url: String::new(),
            max_tokens: 300,
            temperature: 0.3,
            timeout_secs: 30.0,
            concurrency: 20,
            max_retries: 4,
            requests_per_minute: DEFAULT_REQUESTS_PER_MINUTE,
            tokens_per_minute: 0,
            budget_usd_per_hour: 0.0,
            budget_tokens_per_hour: 0,
            prices: [
                ("claude-sonnet-4-20250514".to_string(), price(3.0, 15.0)),
                ("claude-3-5-haiku-20241022".to_string(), price(0.8, 4.0)),
                ("gpt-4o-mini".to_string(), price(0.15, 0.6)),
                // The reference trainer's model, through OpenRouter.
                (
                    "openrouter/anthropic/claude-sonnet-4".to_string(),
                    price(3.0, 15.0),
                ),
                ("anthropic/claude-sonnet-4".to_string(), price(3.0, 15.0)),
            ]
            .into_iter()
            .collect(),
        }
    }
}

/// How the advantage kernels compute (stage 2 and `advantages compute`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NormalizeConfig {
    /// The advantage estimator: `grpo` (the reference's default), `drgrpo`
    /// (mean baseline, no std division), `rloo` (leave-one-out baseline) or
    /// `batch_whiten` (REINFORCE++'s whitening over the whole step). With
    /// hinted rows in a step, every baseline comes from raw rows only.
    pub estimator: Estimator,
    /// `auto` (CUDA when present and the batch is large), `cpu` or `cuda`.
    pub device: Device,
    /// Divide by the group std (+ epsilon); off: A = s − mean.
    pub norm_by_std: bool,
    pub epsilon: f64,
    /// Opt-in floor for baseline std (0 = off, the reference's behaviour).
    pub std_floor: f64,
}

impl Default for NormalizeConfig {
    fn default() -> Self {
        NormalizeConfig {
            estimator: Estimator::Grpo,
            device: Device::Auto,
            norm_by_std: true,
            epsilon: crate::normalize::DEFAULT_EPSILON,
            std_floor: 0.0,
        }
    }
}

impl NormalizeConfig {
    pub fn options(&self) -> AdvantageOptions {
        AdvantageOptions {
            estimator: self.estimator,
            norm_by_std: self.norm_by_std,
            epsilon: self.epsilon,
            std_floor: (self.std_floor > 0.0).then_some(self.std_floor),
        }
    }
}

/// Topic names and how `hintstream topics create` makes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicsConfig {
    pub failed: String,
    pub hints: String,
    pub scored: String,
    pub advantages: String,
    pub metrics: String,
    /// Partitions of every topic created by `topics create`.
    pub partitions: i32,
    /// Replication factor of every topic created by `topics create`.
    pub replication_factor: i32,
}

/// Bounds on what a stage accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Payloads over this many bytes go to the DLQ (`too_large`).
    pub max_message_bytes: usize,
    /// JSON nested deeper than this goes to the DLQ (`too_deep`).
    pub max_json_depth: usize,
}

/// What each stage has in common: where it reads, writes and reports, and
/// its bounds. (No `deny_unknown_fields` here: it is flattened into each
/// stage's section, which reports unknown keys itself.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageConfig {
    /// Consumer group; processes with the same id share the partitions.
    pub group_id: String,
    pub input_topic: String,
    pub output_topic: String,
    /// Dead-letter topic for input that can never be processed.
    pub dlq_topic: String,
    /// Prometheus endpoint `HOST:PORT`; port 0 picks a free port and logs it.
    pub metrics_addr: String,
    /// Messages taken off Kafka but not yet finished; intake pauses at this
    /// bound, which also bounds redelivery after a crash.
    pub max_in_flight: usize,
    /// Bytes of messages held at once. Stage 1 pauses intake at this bound;
    /// stage 2 dead-letters the oldest incomplete step (`step_evicted`) to
    /// stay under it.
    pub max_in_flight_bytes: u64,
    /// On SIGTERM/SIGINT, and when partitions are revoked, how long in-flight
    /// work may take to finish and commit before it is dropped uncommitted.
    pub drain_timeout_secs: u64,
}

/// Keys a stage section does not know, collected so that `validate` can name
/// them (serde cannot deny unknown fields next to a flattened struct).
type UnknownKeys = BTreeMap<String, serde_json::Value>;

/// Stage 1's section: the common stage settings plus its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HintsConfig {
    #[serde(flatten)]
    pub stage: StageConfig,
    /// How long a group waits for its `group_size` trajectories (ms).
    pub group_wait_ms: u64,
    /// A group whose best reward is above this gets no LLM call and no hint
    /// (the reference trainer's `hint_reward_threshold`): it did not fail.
    pub reward_threshold: f64,
    /// How long a published hint is kept to answer a redelivered or late
    /// member of its group without an LLM call (seconds).
    pub cache_ttl_secs: u64,
    /// Bytes of hints kept for that; the oldest go first.
    pub cache_max_bytes: u64,
    #[serde(flatten)]
    unknown: UnknownKeys,
}

/// Stage 2's section: the common stage settings plus step assembly and the
/// step metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdvantagesConfig {
    #[serde(flatten)]
    pub stage: StageConfig,
    /// A step whose rows have not all arrived this many seconds after its
    /// first row goes to the DLQ (never a silent partial result).
    pub step_timeout_secs: u64,
    /// k values of the `reward/pass_at_<k>` metrics.
    pub pass_at_k: Vec<u32>,
    /// The n of `reward/avg_pass_at_<n>`: the trainer's samples per prompt
    /// (SkyRL's `generator.n_samples_per_prompt`); 0 = the step's largest
    /// group of raw rows.
    pub samples_per_prompt: u32,
    /// A rollout succeeded when its reward is above this.
    pub success_threshold: f64,
    /// The largest message (Arrow payload, key and headers) published on
    /// the advantages topic. A step whose advantages are larger goes out as
    /// several messages, chunks of contiguous rows (headers
    /// `hintstream.chunk`, `hintstream.chunks`, `hintstream.rows`). Keep it
    /// at most the producer's `message.max.bytes` (`[kafka.producer]` or
    /// `[kafka]`; librdkafka's default 1,000,000) and the topic's
    /// `max.message.bytes`.
    pub max_message_bytes: usize,
    #[serde(flatten)]
    unknown: UnknownKeys,
}

impl std::ops::Deref for HintsConfig {
    type Target = StageConfig;
    fn deref(&self) -> &StageConfig {
        &self.stage
    }
}

impl std::ops::DerefMut for HintsConfig {
    fn deref_mut(&mut self) -> &mut StageConfig {
        &mut self.stage
    }
}

impl std::ops::Deref for AdvantagesConfig {
    type Target = StageConfig;
    fn deref(&self) -> &StageConfig {
        &self.stage
    }
}

impl std::ops::DerefMut for AdvantagesConfig {
    fn deref_mut(&mut self) -> &mut StageConfig {
        &mut self.stage
    }
}

/// Stage 1's default byte bound: 2,000 groups' worth of typical (~250 KB)
/// trajectories, a small share of a 24 GiB machine.
pub const DEFAULT_HINTS_MAX_IN_FLIGHT_BYTES: u64 = 512 * 1024 * 1024;
/// Stage 2's default byte bound: about three pending 1M-row steps of JSON
/// rows (payload and decoded rows are both counted).
pub const DEFAULT_ADVANTAGES_MAX_IN_FLIGHT_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Stage 2's default `max_message_bytes`: below librdkafka's default
/// `message.max.bytes` (1,000,000), with room for the protocol's framing.
pub const DEFAULT_ADVANTAGES_MAX_MESSAGE_BYTES: usize = 900_000;
/// The smallest `advantages.max_message_bytes`: below it a step would be cut
/// into needlessly many messages, and a row with long ids might not fit one.
pub const MIN_ADVANTAGES_MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// librdkafka's default `message.max.bytes`, when `[kafka]` does not set it.
pub const LIBRDKAFKA_MESSAGE_MAX_BYTES: u64 = 1_000_000;

impl Default for Config {
    fn default() -> Self {
        let topics = TopicsConfig::default();
        Config {
            bootstrap_servers: "127.0.0.1:9092".into(),
            connect_timeout_secs: 30,
            kafka: KafkaConfig::default(),
            hints: HintsConfig {
                stage: StageConfig::new(
                    "hintstream-hints",
                    &topics.failed,
                    &topics.hints,
                    "127.0.0.1:9464",
                ),
                group_wait_ms: 2000,
                reward_threshold: 0.0,
                cache_ttl_secs: 3600,
                cache_max_bytes: 64 * 1024 * 1024,
                unknown: UnknownKeys::new(),
            },
            advantages: AdvantagesConfig {
                stage: StageConfig {
                    max_in_flight: 1_000_000,
                    max_in_flight_bytes: DEFAULT_ADVANTAGES_MAX_IN_FLIGHT_BYTES,
                    ..StageConfig::new(
                        "hintstream-advantages",
                        &topics.scored,
                        &topics.advantages,
                        "127.0.0.1:9465",
                    )
                },
                step_timeout_secs: 300,
                pass_at_k: vec![1, 4, 8],
                samples_per_prompt: 0,
                success_threshold: 0.0,
                max_message_bytes: DEFAULT_ADVANTAGES_MAX_MESSAGE_BYTES,
                unknown: UnknownKeys::new(),
            },
            topics,
            limits: LimitsConfig::default(),
            normalize: NormalizeConfig::default(),
            llm: LlmConfig::default(),
            from_env: Default::default(),
        }
    }
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            failed: "rl.trajectories.failed".into(),
            hints: "rl.hints".into(),
            scored: "rl.rollouts.scored".into(),
            advantages: "rl.advantages".into(),
            metrics: "rl.metrics".into(),
            partitions: 6,
            replication_factor: 1,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let limits = DecodeLimits::default();
        LimitsConfig {
            max_message_bytes: limits.max_bytes,
            max_json_depth: limits.max_depth,
        }
    }
}

impl StageConfig {
    fn new(group_id: &str, input: &str, output: &str, metrics_addr: &str) -> Self {
        StageConfig {
            group_id: group_id.into(),
            input_topic: input.into(),
            output_topic: output.into(),
            dlq_topic: format!("{input}.dlq"),
            metrics_addr: metrics_addr.into(),
            max_in_flight: 1000,
            max_in_flight_bytes: DEFAULT_HINTS_MAX_IN_FLIGHT_BYTES,
            drain_timeout_secs: 20,
        }
    }

    /// `max_in_flight_bytes` as a usize (saturating on 32-bit targets).
    pub fn max_in_flight_bytes(&self) -> usize {
        usize::try_from(self.max_in_flight_bytes).unwrap_or(usize::MAX)
    }

    /// The parsed metrics address.
    pub fn metrics_socket(&self) -> Result<SocketAddr, ConfigError> {
        self.metrics_addr.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "metrics_addr {:?} is not HOST:PORT with a numeric host (for example 127.0.0.1:9464; port 0 picks a free one)",
                self.metrics_addr
            ))
        })
    }
}

impl LimitsConfig {
    pub fn decode_limits(&self) -> DecodeLimits {
        DecodeLimits {
            max_bytes: self.max_message_bytes,
            max_depth: self.max_json_depth,
        }
    }
}

/// Values from the command line, applied last. `None` leaves the layer below.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub bootstrap_servers: Option<String>,
    /// `(section, key, value)`, for example `("hints", "group_id", "g")`.
    pub settings: Vec<(String, String, serde_json::Value)>,
}

impl Config {
    /// Loads the layers. `file` is `--config`; without it
    /// [`DEFAULT_CONFIG_FILE`] is read when present.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        Self::load_with_env(file, overrides, Env::prefixed(ENV_PREFIX))
    }

    fn load_with_env(file: Option<&Path>, overrides: &Overrides, env: Env) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        let file = match file {
            Some(path) if !path.exists() => {
                return Err(ConfigError::MissingFile {
                    path: path.to_path_buf(),
                })
            }
            Some(path) => Some(path),
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => Some(Path::new(DEFAULT_CONFIG_FILE)),
            None => None,
        };
        let mut from_env = std::collections::BTreeSet::new();
        if let Some(path) = file {
            let (table, refs) = read_file(path, &|name| std::env::var(name).ok())?;
            from_env = refs;
            figment = figment.merge(Toml::string(&table));
        }
        figment = figment.merge(env.split("__").ignore(ENV_NOT_SETTINGS));
        if let Some(servers) = &overrides.bootstrap_servers {
            figment = figment.merge(Serialized::default("bootstrap_servers", servers));
        }
        for (section, key, value) in &overrides.settings {
            figment = figment.merge(Serialized::default(&format!("{section}.{key}"), value));
        }
        let mut config: Config = figment.extract().map_err(Box::new)?;
        config.from_env = from_env;
        config.validate()?;
        Ok(config)
    }

    /// Rules that span fields or need more than a type.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.bootstrap_servers.trim().is_empty() {
            return bad("bootstrap_servers is empty; set --bootstrap-servers HOST:PORT".into());
        }
        if !(1..=3600).contains(&self.connect_timeout_secs) {
            return bad(format!(
                "connect_timeout_secs = {} must be within 1..=3600",
                self.connect_timeout_secs
            ));
        }
        if self.topics.partitions < 1 || self.topics.replication_factor < 1 {
            return bad("topics.partitions and topics.replication_factor must be >= 1".into());
        }
        if self.limits.max_message_bytes == 0 || self.limits.max_json_depth == 0 {
            return bad("limits.max_message_bytes and limits.max_json_depth must be > 0".into());
        }
        let session_ms: u64 = match self.kafka.get(ClientKind::Consumer, "session.timeout.ms") {
            Some(v) => v.parse().map_err(|_| {
                ConfigError::Invalid(format!("kafka.\"session.timeout.ms\" = {v:?} is not a number"))
            })?,
            None => 45_000,
        };
        if !(1..=3_600_000).contains(&session_ms) {
            return bad(format!(
                "kafka.\"session.timeout.ms\" = {session_ms} must be within 1..=3600000 (librdkafka's range)"
            ));
        }
        let l = &self.llm;
        if !(l.timeout_secs.is_finite() && l.timeout_secs > 0.0 && l.timeout_secs <= MAX_LLM_TIMEOUT_SECS) {
            return bad(format!(
                "llm.timeout_secs = {} must be within 0 < t <= {MAX_LLM_TIMEOUT_SECS} seconds",
                l.timeout_secs
            ));
        }
        if l.concurrency == 0 || l.max_tokens == 0 {
            return bad("llm.concurrency and llm.max_tokens must be > 0".into());
        }
        if l.concurrency > MAX_LLM_CONCURRENCY {
            return bad(format!(
                "llm.concurrency = {} is over {MAX_LLM_CONCURRENCY}",
                l.concurrency
            ));
        }
        if !(0.0..=2.0).contains(&l.temperature) {
            return bad(format!("llm.temperature {} must be within 0..=2", l.temperature));
        }
        let non_negative = |x: f64| x.is_finite() && x >= 0.0;
        if !non_negative(l.budget_usd_per_hour) {
            return bad(format!(
                "llm.budget_usd_per_hour = {} must be a finite number >= 0 (0 = no budget)",
                l.budget_usd_per_hour
            ));
        }
        if l.budget_usd_per_hour > 0.0 {
            if let Some(model) = l.models.iter().find(|m| !l.prices.contains_key(*m)) {
                return bad(format!(
                    "llm.budget_usd_per_hour is set, but model {model:?} has no price in [llm.prices]: \
                     its calls would cost $0 against the budget. Add llm.prices.\"{model}\" = \
                     {{ input_per_mtok = ..., output_per_mtok = ... }}"
                ));
            }
        }
        for (model, price) in &l.prices {
            if !(non_negative(price.input_per_mtok) && non_negative(price.output_per_mtok)) {
                return bad(format!("llm.prices.\"{model}\" must have finite prices >= 0"));
            }
        }
        let n = &self.normalize;
        if !(non_negative(n.epsilon) && non_negative(n.std_floor)) {
            return bad("normalize.epsilon and normalize.std_floor must be finite and >= 0".into());
        }
        let a = &self.advantages;
        if a.pass_at_k.contains(&0) || a.step_timeout_secs == 0 {
            return bad("advantages.pass_at_k values and advantages.step_timeout_secs must be >= 1".into());
        }
        if !self.hints.reward_threshold.is_finite() {
            return bad("hints.reward_threshold must be finite".into());
        }
        if !(1..=MAX_CACHE_TTL_SECS).contains(&self.hints.cache_ttl_secs) {
            return bad(format!(
                "hints.cache_ttl_secs = {} must be within 1..={MAX_CACHE_TTL_SECS} (30 days)",
                self.hints.cache_ttl_secs
            ));
        }
        let one_message = self.limits.max_message_bytes as u64;
        if a.max_in_flight_bytes < 2 * one_message {
            return bad(format!(
                "advantages.max_in_flight_bytes = {} must be at least twice limits.max_message_bytes ({one_message}), \
                 or every step is evicted at its first message",
                a.max_in_flight_bytes
            ));
        }
        if !a.success_threshold.is_finite() {
            return bad("advantages.success_threshold must be finite".into());
        }
        if a.max_message_bytes < MIN_ADVANTAGES_MAX_MESSAGE_BYTES {
            return bad(format!(
                "advantages.max_message_bytes = {} must be at least {MIN_ADVANTAGES_MAX_MESSAGE_BYTES} (64 KiB)",
                a.max_message_bytes
            ));
        }
        // The producer's own table wins over the common one, as librdkafka
        // gets them.
        let (producer_max, source) = match self.kafka.get(ClientKind::Producer, "message.max.bytes") {
            Some(v) => {
                let table = if self.kafka.producer.contains_key("message.max.bytes") {
                    "kafka.producer"
                } else {
                    "kafka"
                };
                let max: u64 = v.trim().parse().map_err(|_| {
                    ConfigError::Invalid(format!("{table}.\"message.max.bytes\" = {v:?} is not a number"))
                })?;
                (max, table)
            }
            None => (LIBRDKAFKA_MESSAGE_MAX_BYTES, "kafka"),
        };
        if producer_max < a.max_message_bytes as u64 {
            return bad(format!(
                "advantages.max_message_bytes = {} is over the producer's message.max.bytes = {producer_max}{}, \
                 which would refuse every advantages message: raise {source}.\"message.max.bytes\" (and \
                 max.message.bytes of the advantages topic on the broker) or lower advantages.max_message_bytes",
                a.max_message_bytes,
                if self.kafka.get(ClientKind::Producer, "message.max.bytes").is_none() {
                    " (librdkafka's default)"
                } else {
                    ""
                }
            ));
        }
        for (name, unknown) in [
            ("hints", &self.hints.unknown),
            ("advantages", &self.advantages.unknown),
        ] {
            if let Some(key) = unknown.keys().next() {
                return bad(format!(
                    "unknown key `{name}.{key}`; see hintstream.example.toml for the keys of [{name}]"
                ));
            }
        }
        for (name, stage) in [
            ("hints", &self.hints.stage),
            ("advantages", &self.advantages.stage),
        ] {
            for (key, topic) in [
                ("input_topic", &stage.input_topic),
                ("output_topic", &stage.output_topic),
                ("dlq_topic", &stage.dlq_topic),
                ("group_id", &stage.group_id),
            ] {
                if topic.trim().is_empty() {
                    return bad(format!("{name}.{key} is empty"));
                }
            }
            if stage.input_topic == stage.dlq_topic || stage.input_topic == stage.output_topic {
                return bad(format!(
                    "{name}: input_topic {:?} must differ from output_topic and dlq_topic",
                    stage.input_topic
                ));
            }
            if !(1..=MAX_IN_FLIGHT_MESSAGES).contains(&stage.max_in_flight) {
                return bad(format!(
                    "{name}.max_in_flight = {} must be within 1..={MAX_IN_FLIGHT_MESSAGES}",
                    stage.max_in_flight
                ));
            }
            if !(1..=MAX_IN_FLIGHT_BYTES).contains(&stage.max_in_flight_bytes) {
                return bad(format!(
                    "{name}.max_in_flight_bytes = {} must be within 1..={MAX_IN_FLIGHT_BYTES} (1 TiB)",
                    stage.max_in_flight_bytes
                ));
            }
            let drain_ms = stage.drain_timeout_secs.saturating_mul(1000);
            if drain_ms >= session_ms {
                return bad(format!(
                    "{name}.drain_timeout_secs ({}s) must be shorter than kafka.\"session.timeout.ms\" ({session_ms} ms), or the group evicts the member while it drains",
                    stage.drain_timeout_secs
                ));
            }
            stage.metrics_socket()?;
        }
        Ok(())
    }

    /// The effective config as TOML, with every secret replaced: values of
    /// keys whose names say they are secret, and every value that came from
    /// a `${NAME}` reference.
    pub fn to_redacted_toml(&self) -> String {
        // Serialising plain structs of strings and numbers cannot fail.
        let mut value = match toml::Value::try_from(self) {
            Ok(v) => v,
            Err(e) => return format!("# cannot render config: {e}\n"),
        };
        redact(&mut value, &mut Vec::new(), &self.from_env);
        toml::to_string_pretty(&value).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }

    pub fn decode_limits(&self) -> DecodeLimits {
        self.limits.decode_limits()
    }
}

/// Reads a config file as TOML and resolves its `${NAME}` references;
/// returns the resolved text and the keys that referenced a variable.
fn read_file(
    path: &Path,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, std::collections::BTreeSet<KeyPath>), ConfigError> {
    let read_error = |reason: String| ConfigError::Read {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| read_error(e.to_string()))?;
    let mut value: toml::Value = toml::from_str(&text).map_err(|e| read_error(e.to_string()))?;
    let from_env = env_refs::resolve(&mut value, lookup).map_err(|source| ConfigError::EnvRef {
        path: path.to_path_buf(),
        source,
    })?;
    let resolved = toml::to_string(&value).map_err(|e| read_error(e.to_string()))?;
    Ok((resolved, from_env))
}

/// The text shown in place of a secret.
pub const REDACTED: &str = "<redacted>";

/// Replaces, in `value`, every leaf whose key says it is secret or whose
/// path is in `from_env`.
fn redact(value: &mut toml::Value, path: &mut Vec<String>, from_env: &std::collections::BTreeSet<KeyPath>) {
    match value {
        toml::Value::Table(table) => {
            for (key, item) in table.iter_mut() {
                path.push(key.clone());
                redact(item, path, from_env);
                path.pop();
            }
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(i.to_string());
                redact(item, path, from_env);
                path.pop();
            }
        }
        leaf => {
            let secret_name = path.last().is_some_and(|k| is_secret_key(k));
            if secret_name || from_env.contains(path) {
                *leaf = toml::Value::String(REDACTED.into());
            }
        }
    }
}

/// Whether a setting's name says it holds a secret (librdkafka's
/// `sasl.password`, `ssl.key.password`, `sasl.oauthbearer.config`,
/// `sasl.oauthbearer.client.secret`, ...).
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "api_key",
        "apikey",
        "key.pem",
        "credentials",
        "oauthbearer.config",
        "sasl.jaas",
    ]
    .iter()
    .any(|s| key.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn env_from(vars: &[(&str, &str)]) -> Env {
        // figment's Env reads the process environment; a closure-based map is
        // not offered, so the tests use unique prefixes instead.
        let prefix = format!("HSTEST{}_", rand::random::<u32>());
        for (k, v) in vars {
            // SAFETY of set_var: the test sets variables with a prefix no other
            // test reads.
            unsafe { std::env::set_var(format!("{prefix}{k}"), v) };
        }
        Env::prefixed(&prefix)
    }

    #[test]
    fn layers_file_then_env_then_flags() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "bootstrap_servers = \"file:1\"\n[hints]\ngroup_id = \"from-file\"\nmax_in_flight = 7\n[kafka]\n\"sasl.password\" = \"hunter2\""
        )
        .unwrap();
        let env = env_from(&[("HINTS__GROUP_ID", "from-env"), ("BOOTSTRAP_SERVERS", "env:2")]);
        let overrides = Overrides {
            bootstrap_servers: Some("flag:3".into()),
            settings: vec![],
        };
        let config = Config::load_with_env(Some(file.path()), &overrides, env).unwrap();
        assert_eq!(config.bootstrap_servers, "flag:3");
        assert_eq!(config.hints.group_id, "from-env");
        assert_eq!(config.hints.max_in_flight, 7);
        assert_eq!(config.hints.input_topic, "rl.trajectories.failed");
        let shown = config.to_redacted_toml();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn secrets_come_from_env_references_and_never_show() {
        let var = format!("HSTEST_PW_{}", rand::random::<u32>());
        // SAFETY of set_var: a variable name no other test reads.
        unsafe { std::env::set_var(&var, "s3cret-from-env") };
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "[kafka]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.password\" = \"${{{var}}}\"\n\
             \"sasl.username\" = \"${{{var}}}-user\"\n\"sasl.oauthbearer.config\" = \"principal=bob\"\n\
             \"session.timeout.ms\" = 60000\n[kafka.producer]\n\"compression.type\" = \"zstd\""
        )
        .unwrap();
        let config = Config::load_with_env(Some(file.path()), &Overrides::default(), env_from(&[])).unwrap();
        let get = |k| config.kafka.get(ClientKind::Producer, k);
        assert_eq!(get("sasl.password").as_deref(), Some("s3cret-from-env"));
        assert_eq!(get("sasl.username").as_deref(), Some("s3cret-from-env-user"));
        assert_eq!(get("session.timeout.ms").as_deref(), Some("60000"));
        assert_eq!(get("compression.type").as_deref(), Some("zstd"));
        let shown = config.to_redacted_toml();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(!shown.contains("principal=bob"), "{shown}");
        assert!(shown.contains("SASL_SSL") && shown.contains("zstd"), "{shown}");
    }

    #[test]
    fn an_unset_reference_names_the_variable_and_the_key() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "[kafka]\n\"sasl.password\" = \"${{HSTEST_SURELY_UNSET_VAR}}\""
        )
        .unwrap();
        let err = Config::load_with_env(Some(file.path()), &Overrides::default(), env_from(&[])).unwrap_err();
        assert!(matches!(err, ConfigError::EnvRef { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("HSTEST_SURELY_UNSET_VAR") && text.contains("sasl.password"),
            "{text}"
        );
    }

    #[test]
    fn rejects_unknown_keys_naming_them() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "[hints]\ngroup_idd = \"x\"").unwrap();
        let err = Config::load_with_env(Some(file.path()), &Overrides::default(), env_from(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("group_idd"), "{err}");
    }

    #[test]
    fn rejects_drain_longer_than_session() {
        let mut config = Config::default();
        config.hints.drain_timeout_secs = 60;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("session.timeout.ms"), "{err}");
    }

    #[test]
    fn advantages_max_message_bytes_fits_the_producer() {
        let mut config = Config::default();
        assert_eq!(config.advantages.max_message_bytes, 900_000);
        config.validate().unwrap();
        config.advantages.max_message_bytes = 64 * 1024 - 1;
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("advantages.max_message_bytes") && err.contains("64 KiB"),
            "{err}"
        );
        // Over librdkafka's default message.max.bytes: raise it, or lower ours.
        config.advantages.max_message_bytes = 2_000_000;
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("raise kafka.\"message.max.bytes\"") && err.contains("librdkafka's default"),
            "{err}"
        );
        config.kafka.insert("message.max.bytes", 1_999_999);
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("= 1999999,") && err.contains("raise kafka.\""),
            "{err}"
        );
        config.kafka.insert("message.max.bytes", "2000000");
        config.validate().unwrap();
        // The producer's own table wins, and is the one to raise.
        config
            .kafka
            .producer
            .insert("message.max.bytes".into(), 1_000_000.into());
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("raise kafka.producer.\"message.max.bytes\""),
            "{err}"
        );
        config.kafka.producer.clear();
        config.kafka.insert("message.max.bytes", "2MB");
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("not a number"), "{err}");
    }

    #[test]
    fn rejects_missing_explicit_file() {
        let err = Config::load_with_env(
            Some(Path::new("/nonexistent/h.toml")),
            &Overrides::default(),
            env_from(&[]),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::MissingFile { .. }));
    }
}
