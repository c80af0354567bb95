//! The `[limits]` section: bounds on what a stage accepts from its input
//! topic, beyond which a message is dead-lettered.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use crate::messages::DecodeLimits;

/// Bounds on what a stage accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Payloads over this many bytes go to the DLQ (`too_large`).
    pub max_message_bytes: usize,
    /// JSON nested deeper than this goes to the DLQ (`too_deep`).
    pub max_json_depth: usize,
    /// An Arrow message whose string columns would decode to more bytes than
    /// this (views and dictionary keys resolved, plus a fixed cost a row,
    /// counted before anything is copied) goes to the DLQ (`bad_arrow`,
    /// naming the column) before it is decoded.
    #[serde(default = "default_max_decoded_bytes")]
    pub max_decoded_bytes: usize,
}

/// 64 MiB: far above what a message of `max_message_bytes` holds in plain
/// strings, far below what a worker can afford per message.
const DEFAULT_MAX_DECODED_BYTES: usize = 64 << 20;

fn default_max_decoded_bytes() -> usize {
    DEFAULT_MAX_DECODED_BYTES
}

/// The decoder's own bound on payload bytes.
fn default_max_message_bytes() -> usize {
    DecodeLimits::default().max_bytes
}

/// The decoder's own bound on JSON depth.
fn default_max_json_depth() -> usize {
    DecodeLimits::default().max_depth
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_message_bytes: default_max_message_bytes(),
            max_json_depth: default_max_json_depth(),
            max_decoded_bytes: default_max_decoded_bytes(),
        }
    }
}

impl LimitsConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_message_bytes == 0 || self.max_json_depth == 0 {
            return invalid("limits.max_message_bytes and limits.max_json_depth must be > 0");
        }
        if self.max_decoded_bytes == 0 {
            return invalid("limits.max_decoded_bytes must be > 0");
        }
        Ok(())
    }

    pub fn decode_limits(&self) -> DecodeLimits {
        DecodeLimits {
            max_bytes: self.max_message_bytes,
            max_depth: self.max_json_depth,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_decoded_bytes_defaults_to_64_mib_and_must_be_positive() {
        let limits: LimitsConfig = toml::from_str("max_message_bytes = 100\nmax_json_depth = 4").unwrap();
        assert_eq!(limits.max_decoded_bytes, 64 << 20);
        assert!(limits.validate().is_ok());
        let zero = LimitsConfig {
            max_decoded_bytes: 0,
            ..LimitsConfig::default()
        };
        assert!(zero.validate().is_err());
    }
}
