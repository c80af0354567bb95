//! Where a model API is and how to reach it: its provider, base URL, key
//! (never printed) and extra trust roots.

use std::fmt;
use std::path::PathBuf;

pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// An API key. Its `Debug` and `Display` never show it.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    pub(super) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Anthropic,
    Openai,
}

/// Where and how to call a model API.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub provider: Provider,
    pub base_url: String,
    pub api_key: Option<ApiKey>,
    /// A PEM file whose certificates are trusted besides the system store
    /// (`SSL_CERT_FILE`): the CA of a private gateway (LiteLLM, vLLM behind
    /// TLS).
    pub ssl_cert_file: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-ant-api03-unit-test-secret";

    #[test]
    fn api_key_debug_hides_the_key() {
        let key = ApiKey::new(KEY);
        let shown = format!("{key:?}");
        assert!(!shown.contains(KEY) && shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn endpoint_debug_hides_the_key() {
        let endpoint = Endpoint {
            provider: Provider::Anthropic,
            base_url: "http://127.0.0.1:9".into(),
            api_key: Some(ApiKey::new(KEY)),
            ssl_cert_file: None,
        };
        let shown = format!("{endpoint:?}");
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("127.0.0.1:9"), "{shown}");
    }
}
