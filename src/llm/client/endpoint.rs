//! Where a model API is and how to reach it: its provider, base URL (shown
//! without its user info and query), key (never printed) and extra trust
//! roots, and the secrets an error text must not show.

use std::fmt;
use std::path::PathBuf;

use crate::config::redact_url;

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

/// Where and how to call a model API. Its `Debug` shows the base URL
/// without its user info and query, and never the key.
#[derive(Clone)]
pub struct Endpoint {
    pub provider: Provider,
    pub base_url: String,
    pub api_key: Option<ApiKey>,
    /// A PEM file whose certificates are trusted besides the system store
    /// (`SSL_CERT_FILE`): the CA of a private gateway (LiteLLM, vLLM behind
    /// TLS).
    pub ssl_cert_file: Option<PathBuf>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .field("base_url", &redact_url(&self.base_url))
            .field("api_key", &self.api_key)
            .field("ssl_cert_file", &self.ssl_cert_file)
            .finish()
    }
}

/// Secrets shorter than this are not looked for in error texts: too short
/// to tell from other words.
pub const MIN_SECRET_CHARS: usize = 4;

impl Endpoint {
    /// What no error text may show: the key, and the base URL's user,
    /// password and query (the whole and each value), as written and
    /// percent-decoded; longest first, so that a part never leaves a
    /// piece of a longer one. A server that echoes the request (its URL,
    /// who it authenticated) would show them.
    pub fn secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = self.api_key.iter().map(|k| k.0.clone()).collect();
        if let Ok(url) = reqwest::Url::parse(&self.base_url) {
            let decoded = |s: &str| percent_decode(s);
            for part in [
                url.username(),
                url.password().unwrap_or_default(),
                url.query().unwrap_or_default(),
            ] {
                secrets.push(part.to_string());
                secrets.push(decoded(part));
            }
            secrets.extend(url.query_pairs().map(|(_, value)| value.into_owned()));
        }
        secrets.retain(|s| s.chars().count() >= MIN_SECRET_CHARS);
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        secrets
    }
}

/// `s` with its `%XX` escapes decoded (invalid UTF-8 replaced).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
    fn the_secrets_are_the_key_and_the_base_url_s_user_password_and_query() {
        let endpoint = Endpoint {
            provider: Provider::Openai,
            base_url: "http://hs-user:p%40ss-word@127.0.0.1:9/v1?sig=q-s3cret&v=1".into(),
            api_key: Some(ApiKey::new(KEY)),
            ssl_cert_file: None,
        };
        let secrets = endpoint.secrets();
        for s in [
            KEY,
            "hs-user",
            "p%40ss-word",
            "p@ss-word",
            "sig=q-s3cret&v=1",
            "q-s3cret",
        ] {
            assert!(secrets.contains(&s.to_string()), "{s} in {secrets:?}");
        }
        assert!(!secrets.contains(&"1".to_string()), "too short to look for");
        assert!(
            secrets.windows(2).all(|w| w[0].len() >= w[1].len()),
            "longest first"
        );
        let shown = format!("{endpoint:?}");
        assert!(
            shown.contains("http://<redacted>@127.0.0.1:9/v1?<redacted>"),
            "{shown}"
        );
        assert!(!shown.contains("hs-user") && !shown.contains("s3cret"), "{shown}");
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
