//! The `[limits]` section: bounds on what a stage accepts from its input
//! topic, beyond which a message is dead-lettered.

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use crate::messages::DecodeLimits;

/// Bounds on what a stage accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Payloads over this many bytes go to the DLQ (`too_large`).
    pub max_message_bytes: usize,
    /// JSON nested deeper than this goes to the DLQ (`too_deep`).
    pub max_json_depth: usize,
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
        }
    }
}

impl LimitsConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_message_bytes == 0 || self.max_json_depth == 0 {
            return invalid("limits.max_message_bytes and limits.max_json_depth must be > 0");
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
