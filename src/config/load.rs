//! The layering: built-in defaults (each section's `default_*`), then
//! `hintstream.toml` (or `--config FILE`) with its `${NAME}` references
//! resolved, then env `HINTSTREAM_<SECTION>__<KEY>`, then flags; the result
//! is validated before anyone sees it.

use std::collections::BTreeSet;
use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;

use super::env_refs::{self, KeyPath};
use super::error::ConfigError;
use super::root::Config;

/// The config file read when `--config` is not given and the file exists.
pub const DEFAULT_CONFIG_FILE: &str = "hintstream.toml";
/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "HINTSTREAM_";
/// Environment variables with our prefix that are not settings.
/// (`HINTSTREAM_WORKER_ID` is the `--worker-id` flag's, read by clap.)
const ENV_NOT_SETTINGS: &[&str] = &["test_bootstrap", "log", "log_format", "worker_id"];

/// Values from the command line, applied last. `None` leaves the layer below.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub bootstrap_servers: Option<String>,
    /// `(section, key, value)`, for example `("hints", "group_id", "g")`.
    pub settings: Vec<(String, String, serde_json::Value)>,
}

impl Overrides {
    /// Whether the flags or the environment name the brokers (a config file
    /// does not count): the quick start starts its own broker otherwise.
    pub fn names_brokers(&self) -> bool {
        self.bootstrap_servers.is_some()
            || std::env::var_os(format!("{ENV_PREFIX}BOOTSTRAP_SERVERS")).is_some()
    }
}

impl Config {
    /// Loads the layers. `file` is `--config`; without it
    /// [`DEFAULT_CONFIG_FILE`] is read when present.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        Self::load_with_env(file, overrides, Env::prefixed(ENV_PREFIX))
    }

    fn load_with_env(file: Option<&Path>, overrides: &Overrides, env: Env) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        let mut from_env = BTreeSet::new();
        if let Some(path) = chosen_file(file)? {
            let (table, refs) = read_file(path, &|name| std::env::var(name).ok())?;
            from_env = refs;
            figment = figment.merge(Toml::string(&table));
        }
        figment = figment.merge(env.split("__").ignore(ENV_NOT_SETTINGS));
        if let Some(servers) = &overrides.bootstrap_servers {
            figment = figment.merge(Serialized::default("bootstrap_servers", servers));
        }
        for (section, key, value) in &overrides.settings {
            figment = figment.merge(Serialized::default(&format!("{section}.{key}"), value));
        }
        let mut config: Config = figment.extract().map_err(Box::new)?;
        config.from_env = from_env;
        config.validate()?;
        Ok(config)
    }
}

/// The file to read: `--config`, which must exist, else
/// [`DEFAULT_CONFIG_FILE`] when it exists, else none.
fn chosen_file(file: Option<&Path>) -> Result<Option<&Path>, ConfigError> {
    match file {
        Some(path) if !path.exists() => Err(ConfigError::MissingFile {
            path: path.to_path_buf(),
        }),
        Some(path) => Ok(Some(path)),
        None if Path::new(DEFAULT_CONFIG_FILE).exists() => Ok(Some(Path::new(DEFAULT_CONFIG_FILE))),
        None => Ok(None),
    }
}

/// Reads a config file as TOML and resolves its `${NAME}` references;
/// returns the resolved text and the keys that referenced a variable.
fn read_file(
    path: &Path,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, BTreeSet<KeyPath>), ConfigError> {
    let read_error = |reason: String| ConfigError::Read {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| read_error(e.to_string()))?;
    let mut value: toml::Value = toml::from_str(&text).map_err(|e| read_error(e.to_string()))?;
    let from_env = env_refs::resolve(&mut value, lookup).map_err(|source| ConfigError::EnvRef {
        path: path.to_path_buf(),
        source,
    })?;
    let resolved = toml::to_string(&value).map_err(|e| read_error(e.to_string()))?;
    Ok((resolved, from_env))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientKind;
    use std::io::Write;

    fn env_from(vars: &[(&str, &str)]) -> Env {
        // figment's Env reads the process environment; a closure-based map is
        // not offered, so the tests use unique prefixes instead.
        let prefix = format!("HSTEST{}_", rand::random::<u32>());
        for (k, v) in vars {
            // SAFETY of set_var: the test sets variables with a prefix no other
            // test reads.
            unsafe { std::env::set_var(format!("{prefix}{k}"), v) };
        }
        Env::prefixed(&prefix)
    }

    #[test]
    fn layers_file_then_env_then_flags() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "bootstrap_servers = \"file:1\"\n[hints]\ngroup_id = \"from-file\"\nmax_in_flight = 7\n[kafka]\n\"sasl.password\" = \"hunter2\""
        )
        .unwrap();
        let env = env_from(&[("HINTS__GROUP_ID", "from-env"), ("BOOTSTRAP_SERVERS", "env:2")]);
        let overrides = Overrides {
            bootstrap_servers: Some("flag:3".into()),
            settings: vec![],
        };
        let config = Config::load_with_env(Some(file.path()), &overrides, env).unwrap();
        assert_eq!(config.bootstrap_servers, "flag:3");
        assert_eq!(config.hints.group_id, "from-env");
        assert_eq!(config.hints.max_in_flight, 7);
        assert_eq!(config.hints.input_topic, "rl.trajectories.failed");
        let shown = config.to_redacted_toml();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn secrets_come_from_env_references_and_never_show() {
        let var = format!("HSTEST_PW_{}", rand::random::<u32>());
        // SAFETY of set_var: a variable name no other test reads.
        unsafe { std::env::set_var(&var, "s3cret-from-env") };
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "[kafka]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.password\" = \"${{{var}}}\"\n\
             \"sasl.username\" = \"${{{var}}}-user\"\n\"sasl.oauthbearer.config\" = \"principal=bob\"\n\
             \"session.timeout.ms\" = 60000\n[kafka.producer]\n\"compression.type\" = \"zstd\""
        )
        .unwrap();
        let config = Config::load_with_env(Some(file.path()), &Overrides::default(), env_from(&[])).unwrap();
        let get = |k| config.kafka.get(ClientKind::Producer, k);
        assert_eq!(get("sasl.password").as_deref(), Some("s3cret-from-env"));
        assert_eq!(get("sasl.username").as_deref(), Some("s3cret-from-env-user"));
        assert_eq!(get("session.timeout.ms").as_deref(), Some("60000"));
        assert_eq!(get("compression.type").as_deref(), Some("zstd"));
        let shown = config.to_redacted_toml();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(!shown.contains("principal=bob"), "{shown}");
        assert!(shown.contains("SASL_SSL") && shown.contains("zstd"), "{shown}");
    }

    #[test]
    fn an_unset_reference_names_the_variable_and_the_key() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "[kafka]\n\"sasl.password\" = \"${{HSTEST_SURELY_UNSET_VAR}}\""
        )
        .unwrap();
        let err = Config::load_with_env(Some(file.path()), &Overrides::default(), env_from(&[])).unwrap_err();
        assert!(matches!(err, ConfigError::EnvRef { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("HSTEST_SURELY_UNSET_VAR") && text.contains("sasl.password"),
            "{text}"
        );
    }

    #[test]
    fn rejects_unknown_keys_naming_them() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "[hints]\ngroup_idd = \"x\"").unwrap();
        let err = Config::load_with_env(Some(file.path()), &Overrides::default(), env_from(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("group_idd"), "{err}");
    }

    #[test]
    fn rejects_missing_explicit_file() {
        let err = Config::load_with_env(
            Some(Path::new("/nonexistent/h.toml")),
            &Overrides::default(),
            env_from(&[]),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::MissingFile { .. }));
    }
}
