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
//! - `root.rs`: [`Config`], the top-level keys and the sections.
//! - `load.rs`: the layers and [`Overrides`] (the flags).
//! - `kafka.rs`: `[kafka]`, librdkafka properties by client kind.
//! - `topics.rs`, `limits.rs`, `llm.rs`, `normalize.rs`: their sections;
//!   `llm_context.rs`: models' context windows (`[llm.context_tokens]`).
//! - `stage.rs`: what `[hints]` and `[advantages]` share; `hints.rs` and
//!   `advantages.rs`: the two stages' sections; `arms.rs`: `[[hints.arms]]`.
//! - `env_refs.rs`: `${NAME}` references in the file; `redact.rs`: the
//!   config as `hintstream config` shows it; `secrets.rs`: the secret
//!   parts of URLs taken out of shown text.
//! - `error.rs`: [`ConfigError`].

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
mod reference;
mod root;
mod secrets;
mod stage;
mod topics;

pub use advantages::{
    AdvantagesConfig, DEFAULT_ADVANTAGES_MAX_IN_FLIGHT_BYTES, DEFAULT_ADVANTAGES_MAX_MESSAGE_BYTES,
    MIN_ADVANTAGES_MAX_MESSAGE_BYTES,
};
pub use arms::{ArmEntry, ArmReward, ArmSelection, LearnOptions};
pub use env_refs::{EnvRefError, KeyPath};
pub use error::ConfigError;
pub use hints::{HintsConfig, OnLeak, DEFAULT_HINTS_MAX_IN_FLIGHT_BYTES, MAX_CACHE_TTL_SECS};
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
pub use redact::is_secret_key;
pub use reference::{REGENERATE, UNDOCUMENTED};
pub use root::Config;
pub use secrets::{redact_url, redact_urls, REDACTED};
pub use stage::{StageConfig, MAX_IN_FLIGHT_BYTES, MAX_IN_FLIGHT_MESSAGES};
pub use topics::TopicsConfig;

/// The configuration reference as Markdown (`hintstream config
/// reference`, docs/configuration.md): every key, its type, default,
/// environment variable and doc comment.
pub fn reference() -> String {
    reference::markdown::<Config>(ENV_PREFIX)
}
