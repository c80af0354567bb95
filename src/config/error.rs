//! What can be wrong with a configuration (a missing or unreadable file, an
//! unset `${NAME}` reference, a key serde refuses, a rule a value breaks),
//! and the helpers the sections' `validate` share.

use std::path::PathBuf;

use thiserror::Error;

use super::env_refs::EnvRefError;

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

/// The `Err` of a broken rule, for the sections' `validate`.
pub(super) fn invalid<T>(message: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid(message.into()))
}

/// Finite and not negative.
pub(super) fn non_negative(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}
