//! `${NAME}` references in the config file, the convention of Vector and
//! Redpanda Connect: any string value may name an environment variable, so
//! secrets stay out of files (`"sasl.password" = "${KAFKA_PASSWORD}"`).
//! `$${` writes a literal `${`. A variable that is not set is a config error
//! naming it and the key. Which keys took a value from the environment is
//! remembered, so `hintstream config` redacts them.

use std::collections::BTreeSet;

use thiserror::Error;

/// A key of the config file, as its path of table names and key.
pub type KeyPath = Vec<String>;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EnvRefError {
    #[error("{key} references ${{{var}}}, but the environment variable {var} is not set: set it, or write $${{ for a literal ${{")]
    Unset { var: String, key: String },
    #[error("{key}: {reason}")]
    Malformed { key: String, reason: String },
}

/// Replaces every `${NAME}` in the string values of `value`, looking names
/// up with `lookup`. Returns the keys whose values referenced a variable.
pub fn resolve(
    value: &mut toml::Value,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeSet<KeyPath>, EnvRefError> {
    let mut from_env = BTreeSet::new();
    walk(value, &mut Vec::new(), lookup, &mut from_env)?;
    Ok(from_env)
}

fn walk(
    value: &mut toml::Value,
    path: &mut Vec<String>,
    lookup: &dyn Fn(&str) -> Option<String>,
    from_env: &mut BTreeSet<KeyPath>,
) -> Result<(), EnvRefError> {
    match value {
        toml::Value::String(text) if text.contains('$') => {
            let (resolved, referenced) = substitute(text, &display(path), lookup)?;
            *text = resolved;
            if referenced {
                from_env.insert(path.clone());
            }
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(i.to_string());
                walk(item, path, lookup, from_env)?;
                path.pop();
            }
        }
        toml::Value::Table(table) => {
            for (key, item) in table.iter_mut() {
                path.push(key.clone());
                walk(item, path, lookup, from_env)?;
                path.pop();
            }
        }
        _ => {}
    }
    Ok(())
}

/// A key path as TOML writes it: `kafka."sasl.password"`.
pub fn display(path: &[String]) -> String {
    path.iter()
        .map(|k| {
            let bare = !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if bare {
                k.clone()
            } else {
                format!("{k:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// `text` with its references resolved and its `$${` escapes undone, and
/// whether it referenced a variable.
fn substitute(
    text: &str,
    key: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, bool), EnvRefError> {
    let mut out = String::with_capacity(text.len());
    let mut referenced = false;
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let end = after.find('}').ok_or_else(|| EnvRefError::Malformed {
                key: key.to_string(),
                reason: "`${` without a closing `}` (write `$${` for a literal `${`)".into(),
            })?;
            let name = &after[..end];
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(EnvRefError::Malformed {
                    key: key.to_string(),
                    reason: format!("`${{{name}}}` is not an environment variable name"),
                });
            }
            let value = lookup(name).ok_or_else(|| EnvRefError::Unset {
                var: name.to_string(),
                key: key.to_string(),
            })?;
            out.push_str(&value);
            referenced = true;
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok((out, referenced))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "KAFKA_PASSWORD" => Some("hunter2".into()),
            "USER" => Some("trainer".into()),
            _ => None,
        }
    }

    #[test]
    fn resolves_references_and_remembers_their_keys() {
        let mut v: toml::Value = toml::from_str(
            r#"
            plain = "no refs, a lone $ and $HOME stay"
            [kafka]
            "sasl.password" = "${KAFKA_PASSWORD}"
            "sasl.username" = "${USER}-svc"
            literal = "$${KAFKA_PASSWORD}"
            "#,
        )
        .unwrap();
        let from_env = resolve(&mut v, &env).unwrap();
        assert_eq!(v["kafka"]["sasl.password"].as_str(), Some("hunter2"));
        assert_eq!(v["kafka"]["sasl.username"].as_str(), Some("trainer-svc"));
        assert_eq!(v["kafka"]["literal"].as_str(), Some("${KAFKA_PASSWORD}"));
        assert_eq!(v["plain"].as_str(), Some("no refs, a lone $ and $HOME stay"));
        let keys: Vec<String> = from_env.iter().map(|p| display(p)).collect();
        assert_eq!(keys, vec!["kafka.\"sasl.password\"", "kafka.\"sasl.username\""]);
    }

    #[test]
    fn an_unset_variable_names_itself_and_the_key() {
        let mut v: toml::Value = toml::from_str("[kafka]\n\"sasl.password\" = \"${NOPE}\"").unwrap();
        let err = resolve(&mut v, &env).unwrap_err();
        assert_eq!(
            err,
            EnvRefError::Unset {
                var: "NOPE".into(),
                key: "kafka.\"sasl.password\"".into()
            }
        );
        assert!(err.to_string().contains("NOPE") && err.to_string().contains("sasl.password"));
    }

    #[test]
    fn malformed_references_are_errors() {
        for text in ["${UNCLOSED", "${1BAD}", "${}"] {
            let mut v = toml::Value::Table(
                [("k".to_string(), toml::Value::String(text.into()))]
                    .into_iter()
                    .collect(),
            );
            assert!(
                matches!(resolve(&mut v, &env), Err(EnvRefError::Malformed { .. })),
                "{text}"
            );
        }
    }
}
