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

use crate::messages::DecodeLimits;
use crate::normalize::{AdvantageOptions, Device};

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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Kafka bootstrap servers, comma-separated (`--bootstrap-servers`, env
    /// `HINTSTREAM_BOOTSTRAP_SERVERS`).
    pub bootstrap_servers: String,
    /// librdkafka properties passed through as they are (`security.protocol`,
    /// `sasl.mechanism`, `sasl.username`, `sasl.password`, ...). Values whose
    /// names look secret are redacted by `hintstream config`.
    pub kafka: BTreeMap<String, String>,
    pub topics: TopicsConfig,
    pub limits: LimitsConfig,
    /// Stage 1, `hintstream hints`.
    pub hints: StageConfig,
    /// Stage 2, `hintstream advantages`.
    pub advantages: StageConfig,
    /// Stage 2's computation: kernel options, step assembly, step metrics.
    pub normalize: NormalizeConfig,
    /// Stage 1's model calls. Keys come from ANTHROPIC_API_KEY /
    /// OPENAI_API_KEY only, never from this file.
    pub llm: LlmConfig,
}

/// Which model API stage 1 calls and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// `auto`: Anthropic when ANTHROPIC_API_KEY is set, else an
    /// OpenAI-compatible server when OPENAI_API_KEY or OPENAI_BASE_URL is
    /// set, else static hints. `anthropic`, `openai`, or `none` (static only).
    pub provider: String,
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
    /// Requests per minute (0 = no limit).
    pub requests_per_minute: u32,
    /// Tokens per minute, input + output, from the real `usage` (0 = no limit).
    pub tokens_per_minute: u32,
    /// How long a group waits for its `group_size` trajectories (ms).
    pub group_wait_ms: u64,
    /// Dollars per million input / output tokens, by model.
    pub prices: BTreeMap<String, ModelPrice>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

impl Default for LlmConfig {
    fn default() -> Self {
        let price = |input_per_mtok, output_per_mtok| ModelPrice {
            input_per_mtok,
            output_per_mtok,
        };
        LlmConfig {
            provider: "auto".into(),
            models: vec![],
            base_url: String::new(),
            max_tokens: 300,
            temperature: 0.3,
            timeout_secs: 30.0,
            concurrency: 20,
            max_retries: 4,
            requests_per_minute: 0,
            tokens_per_minute: 0,
            group_wait_ms: 2000,
            prices: [
                ("claude-sonnet-4-20250514".to_string(), price(3.0, 15.0)),
                ("claude-3-5-haiku-20241022".to_string(), price(0.8, 4.0)),
                ("gpt-4o-mini".to_string(), price(0.15, 0.6)),
            ]
            .into_iter()
            .collect(),
        }
    }
}

/// How stage 2 computes advantages and step metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NormalizeConfig {
    /// `auto` (CUDA when present and the batch is large), `cpu` or `cuda`.
    pub device: Device,
    /// Divide by the group std (+ epsilon); off: A = s − mean.
    pub norm_by_std: bool,
    pub epsilon: f64,
    /// Opt-in floor for baseline std (0 = off, the reference's behaviour).
    pub std_floor: f64,
    /// A step whose rows have not all arrived this many seconds after its
    /// first row goes to the DLQ (never a silent partial result).
    pub step_timeout_secs: u64,
    /// k values of the pass@k metrics (unbiased estimator over raw samples).
    pub pass_at_k: Vec<u32>,
    /// A rollout succeeded when its reward is above this.
    pub success_threshold: f64,
}

impl Default for NormalizeConfig {
    fn default() -> Self {
        NormalizeConfig {
            device: Device::Auto,
            norm_by_std: true,
            epsilon: crate::normalize::DEFAULT_EPSILON,
            std_floor: 0.0,
            step_timeout_secs: 300,
            pass_at_k: vec![1, 4, 8],
            success_threshold: 0.0,
        }
    }
}

impl NormalizeConfig {
    pub fn options(&self) -> AdvantageOptions {
        AdvantageOptions {
            norm_by_std: self.norm_by_std,
            epsilon: self.epsilon,
            std_floor: (self.std_floor > 0.0).then_some(self.std_floor),
            ..AdvantageOptions::default()
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

/// What each stage has in common: where it reads, writes and reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// On SIGTERM/SIGINT, how long to wait for in-flight work before closing.
    pub drain_timeout_secs: u64,
}

impl Default for Config {
    fn default() -> Self {
        let topics = TopicsConfig::default();
        Config {
            bootstrap_servers: "127.0.0.1:9092".into(),
            kafka: BTreeMap::new(),
            hints: StageConfig::new(
                "hintstream-hints",
                &topics.failed,
                &topics.hints,
                "127.0.0.1:9464",
            ),
            advantages: StageConfig::advantages(&topics),
            topics,
            limits: LimitsConfig::default(),
            normalize: NormalizeConfig::default(),
            llm: LlmConfig::default(),
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
            drain_timeout_secs: 20,
        }
    }

    /// Stage 2 parks every row of a step until the step completes, so its
    /// bound must exceed the largest step (in messages).
    fn advantages(topics: &TopicsConfig) -> Self {
        StageConfig {
            max_in_flight: 1_000_000,
            ..StageConfig::new(
                "hintstream-advantages",
                &topics.scored,
                &topics.advantages,
                "127.0.0.1:9465",
            )
        }
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
        match file {
            Some(path) if !path.exists() => {
                return Err(ConfigError::MissingFile {
                    path: path.to_path_buf(),
                })
            }
            Some(path) => figment = figment.merge(Toml::file_exact(path)),
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => {
                figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE))
            }
            None => {}
        }
        figment = figment.merge(env.split("__").ignore(ENV_NOT_SETTINGS));
        if let Some(servers) = &overrides.bootstrap_servers {
            figment = figment.merge(Serialized::default("bootstrap_servers", servers));
        }
        for (section, key, value) in &overrides.settings {
            figment = figment.merge(Serialized::default(&format!("{section}.{key}"), value));
        }
        let config: Config = figment.extract().map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    /// Rules that span fields or need more than a type.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.bootstrap_servers.trim().is_empty() {
            return bad("bootstrap_servers is empty; set --bootstrap-servers HOST:PORT".into());
        }
        if self.topics.partitions < 1 || self.topics.replication_factor < 1 {
            return bad("topics.partitions and topics.replication_factor must be >= 1".into());
        }
        if self.limits.max_message_bytes == 0 || self.limits.max_json_depth == 0 {
            return bad("limits.max_message_bytes and limits.max_json_depth must be > 0".into());
        }
        let session_ms: u64 = match self.kafka.get("session.timeout.ms") {
            Some(v) => v.parse().map_err(|_| {
                ConfigError::Invalid(format!("kafka.\"session.timeout.ms\" = {v:?} is not a number"))
            })?,
            None => 45_000,
        };
        let l = &self.llm;
        if !["auto", "anthropic", "openai", "none"].contains(&l.provider.as_str()) {
            return bad(format!(
                "llm.provider {:?} must be auto, anthropic, openai or none",
                l.provider
            ));
        }
        if !(l.timeout_secs.is_finite() && l.timeout_secs > 0.0) || l.concurrency == 0 || l.max_tokens == 0 {
            return bad("llm.timeout_secs, llm.concurrency and llm.max_tokens must be > 0".into());
        }
        if !(0.0..=2.0).contains(&l.temperature) {
            return bad(format!("llm.temperature {} must be within 0..=2", l.temperature));
        }
        let n = &self.normalize;
        let non_negative = |x: f64| x.is_finite() && x >= 0.0;
        if !(non_negative(n.epsilon) && non_negative(n.std_floor)) {
            return bad("normalize.epsilon and normalize.std_floor must be finite and >= 0".into());
        }
        if n.pass_at_k.contains(&0) || n.step_timeout_secs == 0 {
            return bad("normalize.pass_at_k values and normalize.step_timeout_secs must be >= 1".into());
        }
        for (name, stage) in [("hints", &self.hints), ("advantages", &self.advantages)] {
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
            if stage.max_in_flight == 0 {
                return bad(format!("{name}.max_in_flight must be >= 1"));
            }
            if stage.drain_timeout_secs * 1000 >= session_ms {
                return bad(format!(
                    "{name}.drain_timeout_secs ({}s) must be shorter than kafka.\"session.timeout.ms\" ({session_ms} ms), or the group evicts the member while it drains",
                    stage.drain_timeout_secs
                ));
            }
            stage.metrics_socket()?;
        }
        Ok(())
    }

    /// The effective config as TOML, with secret-looking values replaced.
    pub fn to_redacted_toml(&self) -> String {
        let mut shown = self.clone();
        for (key, value) in shown.kafka.iter_mut() {
            if is_secret_key(key) {
                *value = "<redacted>".into();
            }
        }
        // Serialising plain structs of strings and numbers cannot fail.
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }

    pub fn decode_limits(&self) -> DecodeLimits {
        self.limits.decode_limits()
    }
}

/// Whether a setting's name says it holds a secret.
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
