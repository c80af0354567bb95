//! The environment the model endpoints are resolved from: the official SDKs'
//! variables, read once, with a `Debug` that never shows a key, nor a base
//! URL's user info or query.

use std::path::PathBuf;

use crate::config::redact_url;

/// Environment the endpoint is resolved from (the official SDKs' variables).
/// Its `Debug` shows whether a key is set, never the key, and the base
/// URLs without their user info and query.
#[derive(Clone, Default)]
pub struct LlmEnv {
    pub anthropic_api_key: Option<String>,
    pub anthropic_base_url: Option<String>,
    pub openai_api_key: Option<String>,
    pub openai_base_url: Option<String>,
    /// `OPENROUTER_API_KEY` and `OPENROUTER_BASE_URL` (default
    /// `https://openrouter.ai/api/v1`), as litellm reads them.
    pub openrouter_api_key: Option<String>,
    pub openrouter_base_url: Option<String>,
    /// `SSL_CERT_FILE`: a PEM file whose certificates the LLM client trusts
    /// besides the system store. A field rather than a read of the process
    /// environment at client construction, so one process can build clients
    /// with different roots (tests do).
    pub ssl_cert_file: Option<PathBuf>,
}

impl std::fmt::Debug for LlmEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = |k: &Option<String>| if k.is_some() { "<redacted>" } else { "<unset>" };
        let url = |u: &Option<String>| u.as_deref().map(|u| redact_url(u).into_owned());
        f.debug_struct("LlmEnv")
            .field("anthropic_api_key", &key(&self.anthropic_api_key))
            .field("anthropic_base_url", &url(&self.anthropic_base_url))
            .field("openai_api_key", &key(&self.openai_api_key))
            .field("openai_base_url", &url(&self.openai_base_url))
            .field("openrouter_api_key", &key(&self.openrouter_api_key))
            .field("openrouter_base_url", &url(&self.openrouter_base_url))
            .field("ssl_cert_file", &self.ssl_cert_file)
            .finish()
    }
}

impl LlmEnv {
    pub fn from_process() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        LlmEnv {
            anthropic_api_key: var("ANTHROPIC_API_KEY"),
            anthropic_base_url: var("ANTHROPIC_BASE_URL"),
            openai_api_key: var("OPENAI_API_KEY"),
            openai_base_url: var("OPENAI_BASE_URL"),
            openrouter_api_key: var("OPENROUTER_API_KEY"),
            openrouter_base_url: var("OPENROUTER_BASE_URL"),
            ssl_cert_file: var("SSL_CERT_FILE").map(PathBuf::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC_KEY: &str = "sk-ant-api03-synth-unit-secret";
    const OPENAI_KEY: &str = "sk-proj-synth-unit-secret";

    fn env() -> LlmEnv {
        LlmEnv {
            anthropic_api_key: Some(ANTHROPIC_KEY.into()),
            anthropic_base_url: Some("http://127.0.0.1:9".into()),
            openai_api_key: Some(OPENAI_KEY.into()),
            ssl_cert_file: Some("/etc/gateway-ca.pem".into()),
            ..LlmEnv::default()
        }
    }

    #[test]
    fn llm_env_debug_hides_both_keys() {
        let shown = format!("{:?}", env());
        assert!(
            !shown.contains(ANTHROPIC_KEY) && !shown.contains(OPENAI_KEY),
            "{shown}"
        );
        assert!(
            shown.contains("<redacted>") && shown.contains("gateway-ca.pem"),
            "{shown}"
        );
    }
}
