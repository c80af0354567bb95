//! Why an evaluation could not run or write its report.

use std::path::PathBuf;

use thiserror::Error;

use super::arms::ArmsError;
use super::input::InputError;
use crate::llm::cassette::CassetteError;
use crate::llm::LlmError;

#[derive(Debug, Error)]
pub enum EvalError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Cassette(#[from] CassetteError),
    #[error("config {label}: {source}")]
    Llm {
        label: String,
        #[source]
        source: LlmError,
    },
    #[error("{count} LLM request(s) of config {label} are not in the cassette (first: group {group}); the prompt, model or settings changed since it was recorded. Rerun without --strict to record them")]
    CassetteMiss {
        label: String,
        count: usize,
        group: String,
    },
    #[error("the stage-2 computation failed for {step}: {reason}")]
    Outcomes { step: String, reason: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} has no failed trajectories to evaluate")]
    Empty(String),
    #[error(transparent)]
    Arms(#[from] ArmsError),
    #[error("nothing to evaluate: give --input (failed trajectories) or --hints (recorded hints)")]
    NothingToDo,
}
