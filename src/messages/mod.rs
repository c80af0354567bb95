//! The wire contract: typed messages of every topic, their validation and the
//! keys they are published under. Field names are exactly the schemas' (schemas/).

pub mod decode;
mod failed;
mod hint;
pub mod keys;
mod level;
mod ordered;
mod outcome;
mod scored;
#[cfg(test)]
pub(crate) mod vectors;
mod version;

pub use decode::{decode, DecodeError, DecodeLimits, Validate};
pub use failed::{ChatContent, ChatMessage, ContentBlock, FailedTrajectory};
pub use hint::{Hint, HintCategory, HintSource, Usage, DEFAULT_ARM};
pub use keys::{group_key, key_for, step_key};
pub use level::HintLevel;
pub use ordered::OrderedJson;
pub use outcome::HintOutcome;
pub use scored::{check_logprob, ScoredMessage, ScoredRollout, StepEnd, LOGPROB_ROUNDING};
pub use version::SCHEMA_VERSION;
