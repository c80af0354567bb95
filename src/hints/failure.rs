//! Stage 1's own reasons not to start, carried by the shell's
//! [`StageError`] without the shell knowing them: its model clients and its
//! spend ledger.

use thiserror::Error;

use crate::llm::LlmError;
use crate::stage::{StageError, StageFailure};

#[derive(Debug, Error)]
pub enum HintsFailure {
    #[error("LLM client: {0}")]
    Llm(#[from] LlmError),
    #[error("the spend ledger: {0}")]
    Ledger(String),
}

impl StageFailure for HintsFailure {
    /// A model client that cannot be made from the configuration (a bad
    /// context file, a bad base URL) is the user's to fix.
    fn exit_code(&self) -> u8 {
        match self {
            HintsFailure::Llm(e) if e.is_config() => 2,
            _ => 1,
        }
    }
}

impl From<HintsFailure> for StageError {
    fn from(failure: HintsFailure) -> Self {
        StageError::own(failure)
    }
}

impl From<LlmError> for StageError {
    fn from(e: LlmError) -> Self {
        HintsFailure::Llm(e).into()
    }
}
