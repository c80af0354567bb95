//! The `[advantages]` section: stage 2, `hintstream advantages`: the common
//! stage settings, step assembly, the step metrics and the size of the
//! messages it publishes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::kafka::{DrainBound, KafkaConfig, LIBRDKAFKA_MESSAGE_MAX_BYTES};
use super::limits::LimitsConfig;
use super::stage::{deny_unknown, StageConfig, UnknownKeys};
use super::topics;

/// Stage 2's default byte bound: about three pending 1M-row steps of JSON
/// rows (payload and decoded rows are both counted).
pub const DEFAULT_ADVANTAGES_MAX_IN_FLIGHT_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Stage 2's default `max_message_bytes`: below librdkafka's default
/// `message.max.bytes` (1,000,000), with room for the protocol's framing.
pub const DEFAULT_ADVANTAGES_MAX_MESSAGE_BYTES: usize = 900_000;
/// The smallest `advantages.max_message_bytes`: below it a step would be cut
/// into needlessly many messages, and a row with long ids might not fit one.
pub const MIN_ADVANTAGES_MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Stage 2's section: the common stage settings plus step assembly and the
/// step metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AdvantagesConfig {
    #[serde(flatten)]
    pub stage: StageConfig,
    /// A step whose rows have not all arrived this many seconds after its
    /// first row goes to the DLQ (never a silent partial result).
    pub step_timeout_secs: u64,
    /// The k of the `reward/pass_at_<k>` step metrics.
    pub pass_at_k: Vec<u32>,
    /// The n of `reward/avg_pass_at_<n>`: the trainer's samples per prompt
    /// (SkyRL's `generator.n_samples_per_prompt`); 0 = the step's largest
    /// group of raw rows.
    pub samples_per_prompt: u32,
    /// A rollout succeeded when its reward is above this (the reference's
    /// `> 0`), for the step metrics and the hint outcomes.
    pub success_threshold: f64,
    /// The largest message (Arrow payload, key and headers) published on
    /// the advantages topic. A step whose advantages are larger goes out as
    /// several messages, chunks of contiguous rows (headers
    /// `hintstream.chunk`, `hintstream.chunks`, `hintstream.rows`). At
    /// least 65,536, and at most the producer's `message.max.bytes`
    /// (`[kafka.producer]` or `[kafka]`; librdkafka's default 1,000,000),
    /// else the stage exits 2 saying which to raise; keep it under the
    /// topic's `max.message.bytes` too.
    pub max_message_bytes: usize,
    #[serde(flatten)]
    #[schemars(skip)]
    unknown: UnknownKeys,
}

/// Reads the scored rollouts, writes advantages, serves metrics on 9465;
/// holds a whole step, so takes far more messages than stage 1.
fn default_stage() -> StageConfig {
    StageConfig {
        max_in_flight: 1_000_000,
        ..StageConfig::new(
            "hintstream-advantages",
            &topics::default_scored(),
            &topics::default_advantages(),
            "127.0.0.1:9465",
            DEFAULT_ADVANTAGES_MAX_IN_FLIGHT_BYTES,
        )
    }
}

fn default_step_timeout_secs() -> u64 {
    300
}

fn default_pass_at_k() -> Vec<u32> {
    vec![1, 4, 8]
}

fn default_samples_per_prompt() -> u32 {
    0
}

fn default_success_threshold() -> f64 {
    0.0
}

impl Default for AdvantagesConfig {
    fn default() -> Self {
        AdvantagesConfig {
            stage: default_stage(),
            step_timeout_secs: default_step_timeout_secs(),
            pass_at_k: default_pass_at_k(),
            samples_per_prompt: default_samples_per_prompt(),
            success_threshold: default_success_threshold(),
            max_message_bytes: DEFAULT_ADVANTAGES_MAX_MESSAGE_BYTES,
            unknown: UnknownKeys::new(),
        }
    }
}

impl AdvantagesConfig {
    /// The section's rules, with the bounds it must agree with: every input
    /// message must fit `max_in_flight_bytes`, and every output message the
    /// producer's `message.max.bytes`. `drain` as for
    /// [`StageConfig::validate`].
    pub fn validate(
        &self,
        limits: &LimitsConfig,
        kafka: &KafkaConfig,
        drain: &DrainBound,
    ) -> Result<(), ConfigError> {
        if self.pass_at_k.contains(&0) || self.step_timeout_secs == 0 {
            return invalid("advantages.pass_at_k values and advantages.step_timeout_secs must be >= 1");
        }
        let one_message = limits.max_message_bytes as u64;
        if self.stage.max_in_flight_bytes < 2 * one_message {
            return invalid(format!(
                "advantages.max_in_flight_bytes = {} must be at least twice limits.max_message_bytes ({one_message}), \
                 or every step is evicted at its first message",
                self.stage.max_in_flight_bytes
            ));
        }
        if !self.success_threshold.is_finite() {
            return invalid("advantages.success_threshold must be finite");
        }
        self.validate_message_bytes(kafka)?;
        deny_unknown("advantages", &self.unknown)?;
        self.stage.validate("advantages", drain)
    }

    /// `max_message_bytes` is at least the minimum and fits the producer.
    fn validate_message_bytes(&self, kafka: &KafkaConfig) -> Result<(), ConfigError> {
        if self.max_message_bytes < MIN_ADVANTAGES_MAX_MESSAGE_BYTES {
            return invalid(format!(
                "advantages.max_message_bytes = {} must be at least {MIN_ADVANTAGES_MAX_MESSAGE_BYTES} (64 KiB)",
                self.max_message_bytes
            ));
        }
        let set = kafka.producer_message_max_bytes()?;
        let (producer_max, source) = set.unwrap_or((LIBRDKAFKA_MESSAGE_MAX_BYTES, "kafka"));
        if producer_max < self.max_message_bytes as u64 {
            return invalid(format!(
                "advantages.max_message_bytes = {} is over the producer's message.max.bytes = {producer_max}{}, \
                 which would refuse every advantages message: raise {source}.\"message.max.bytes\" (and \
                 max.message.bytes of the advantages topic on the broker) or lower advantages.max_message_bytes",
                self.max_message_bytes,
                if set.is_none() { " (librdkafka's default)" } else { "" }
            ));
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use crate::config::Config;

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
}
