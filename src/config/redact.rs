//! The effective config as `hintstream config` shows it: TOML with every
//! secret replaced.

use std::collections::BTreeSet;

use super::env_refs::KeyPath;
use super::root::Config;
use super::secrets::{redact_urls, REDACTED};

impl Config {
    /// The effective config as TOML, with every secret replaced: values of
    /// keys whose names say they are secret, every value that came from
    /// a `${NAME}` reference, and the user info and query of every URL
    /// (`[llm] base_url`).
    pub fn to_redacted_toml(&self) -> String {
        // Serialising plain structs of strings and numbers cannot fail.
        let mut value = match toml::Value::try_from(self) {
            Ok(v) => v,
            Err(e) => return format!("# cannot render config: {e}\n"),
        };
        redact(&mut value, &mut Vec::new(), &self.from_env);
        toml::to_string_pretty(&value).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

/// Replaces, in `value`, every leaf whose key says it is secret or whose
/// path is in `from_env`.
fn redact(value: &mut toml::Value, path: &mut Vec<String>, from_env: &BTreeSet<KeyPath>) {
    match value {
        toml::Value::Table(table) => {
            for (key, item) in table.iter_mut() {
                path.push(key.clone());
                redact(item, path, from_env);
                path.pop();
            }
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(i.to_string());
                redact(item, path, from_env);
                path.pop();
            }
        }
        leaf => {
            let secret_name = path.last().is_some_and(|k| is_secret_key(k));
            if secret_name || from_env.contains(path) {
                *leaf = toml::Value::String(REDACTED.into());
            } else if let toml::Value::String(text) = leaf {
                if let std::borrow::Cow::Owned(clean) = redact_urls(text) {
                    *text = clean;
                }
            }
        }
    }
}

/// Whether a setting's name says it holds a secret (librdkafka's
/// `sasl.password`, `ssl.key.password`, `sasl.oauthbearer.config`,
/// `sasl.oauthbearer.client.secret`, ...).
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "api_key",
        "apikey",
        "key.pem",
        "credentials",
        "oauthbearer.config",
        "sasl.jaas",
    ]
    .iter()
    .any(|s| key.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_shows_without_its_user_info_and_query() {
        let mut config = Config::default();
        config.llm.base_url = "http://hs-user:hs-pass@127.0.0.1:8000/v1?sig=abc".into();
        let shown = config.to_redacted_toml();
        assert!(
            shown.contains("base_url = \"http://<redacted>@127.0.0.1:8000/v1?<redacted>\""),
            "{shown}"
        );
        assert!(!shown.contains("hs-") && !shown.contains("sig=abc"), "{shown}");
    }
}
