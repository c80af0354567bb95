//! Message keys: `run_id/step/instance_id` for a GRPO group's messages and
//! `run_id/step` for a training step's. Inside the ids, `%` and `/` are
//! percent-encoded (`%25`, `%2F`) so that different groups never share a key:
//! unencoded, `("r/1", 2, "x")` and `("r", 1, "2/x")` would both be `r/1/2/x`.
//! Nothing else is encoded: ids without `%` or `/` (non-ASCII ones included)
//! keep the keys they always had. The Python client implements the same rule
//! (`python/src/hintstream/keys.py`); both suites check it against one vector
//! file, `schemas/vectors/keys.json`.

use std::borrow::Cow;

/// An id as it appears inside a key: `%` as `%25`, `/` as `%2F`, the rest
/// as it is.
pub fn encode_id(id: &str) -> Cow<'_, str> {
    if !id.contains(['%', '/']) {
        return Cow::Borrowed(id);
    }
    let mut out = String::with_capacity(id.len() + 8);
    for c in id.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Inverse of [`encode_id`]: `%25` and `%2F` (or `%2f`) back to `%` and `/`;
/// every other `%` sequence stays as it is.
pub fn decode_id(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix("25") {
            out.push('%');
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("2F").or_else(|| after.strip_prefix("2f")) {
            out.push('/');
            rest = tail;
        } else {
            out.push('%');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Key of a GRPO group's messages: `run_id/step/instance_id`.
pub fn group_key(run_id: &str, step: i64, instance_id: &str) -> String {
    let instance = encode_id(instance_id);
    let mut key = step_key_with_room(run_id, step, 1 + instance.len());
    key.push('/');
    key.push_str(&instance);
    key
}

/// Key of a training step's messages: `run_id/step`.
pub fn step_key(run_id: &str, step: i64) -> String {
    step_key_with_room(run_id, step, 0)
}

/// `run_id/step`, in a string with room for `more` bytes after it. Built
/// piece by piece: `format!` sized the string from its literals alone and
/// grew it twice or more, 2.4% of stage 1's CPU on static hints (a group
/// key a message, twice).
fn step_key_with_room(run_id: &str, step: i64, more: usize) -> String {
    use std::fmt::Write;
    let run = encode_id(run_id);
    // An i64 is at most 20 characters.
    let mut key = String::with_capacity(run.len() + 1 + 20 + more);
    key.push_str(&run);
    key.push('/');
    // Writing to a String cannot fail.
    let _ = write!(key, "{step}");
    key
}

/// A step as a key writes it: digits only (no sign).
fn parse_step(part: &str) -> Option<i64> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    part.parse().ok()
}

/// The (run_id, step, instance_id) of a group key, or `None` when the key
/// does not have that shape (three parts, non-empty ids, a step of digits).
pub fn parse_group_key(key: &str) -> Option<(String, i64, String)> {
    let parts: Vec<&str> = key.split('/').collect();
    let [run_id, step, instance_id] = parts.as_slice() else {
        return None;
    };
    if run_id.is_empty() || instance_id.is_empty() {
        return None;
    }
    Some((decode_id(run_id), parse_step(step)?, decode_id(instance_id)))
}

/// The (run_id, step) of a step key, or `None` when the key does not have
/// that shape (a non-empty run_id without `/`, a step of digits).
pub fn parse_step_key(key: &str) -> Option<(String, i64)> {
    let (run_id, step) = key.rsplit_once('/')?;
    if run_id.is_empty() || run_id.contains('/') {
        return None;
    }
    Some((decode_id(run_id), parse_step(step)?))
}

/// The Kafka key a JSON message of any known kind is published under, read
/// from its own fields. Used by `hintstream produce`.
pub fn key_for(value: &serde_json::Value) -> Option<String> {
    let run_id = value.get("run_id")?.as_str()?;
    let step = value.get("step")?.as_i64()?;
    match (
        value.get("type").and_then(|t| t.as_str()),
        value.get("instance_id"),
    ) {
        (Some("scored_rollout") | Some("step_end"), _) => Some(step_key(run_id, step)),
        (_, Some(instance)) => Some(group_key(run_id, step, instance.as_str()?)),
        _ => Some(step_key(run_id, step)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_collided_unencoded_get_different_keys() {
        assert_ne!(group_key("r/1", 2, "x"), group_key("r", 1, "2/x"));
        assert_eq!(group_key("r/1", 2, "x"), "r%2F1/2/x");
        assert_eq!(group_key("r", 1, "2/x"), "r/1/2%2Fx");
        assert_ne!(step_key("a%2Fb", 1), step_key("a/b", 1));
    }

    #[test]
    fn plain_ids_keep_their_old_keys() {
        assert_eq!(group_key("run-7", 3, "swe.task:12"), "run-7/3/swe.task:12");
        assert_eq!(step_key("run-7", 3), "run-7/3");
    }

    #[test]
    fn group_keys_read_back() {
        for (run, step, instance) in [
            ("r/1", 2, "x"),
            ("r", 1, "2/x"),
            ("100%", 0, "a%2Fb"),
            ("é", 9, "ü/"),
        ] {
            let key = group_key(run, step, instance);
            assert_eq!(
                parse_group_key(&key),
                Some((run.to_string(), step, instance.to_string())),
                "{key}"
            );
        }
        assert_eq!(parse_group_key("r/x/i"), None);
    }

    /// The vectors both languages read (`schemas/vectors/keys.json`).
    fn vectors() -> serde_json::Value {
        crate::messages::vectors::shared("keys.json")
    }

    #[test]
    fn keys_match_the_shared_vectors() {
        let v = vectors();
        for case in v["encode"].as_array().unwrap() {
            let (run, step, instance) = (
                case["run_id"].as_str().unwrap(),
                case["step"].as_i64().unwrap(),
                case["instance_id"].as_str().unwrap(),
            );
            assert_eq!(
                group_key(run, step, instance),
                case["group_key"].as_str().unwrap(),
                "{case}"
            );
            assert_eq!(step_key(run, step), case["step_key"].as_str().unwrap(), "{case}");
        }
        for case in v["parse_group"].as_array().unwrap() {
            let parsed = parse_group_key(case["key"].as_str().unwrap());
            let expected = case.get("error").is_none().then(|| {
                (
                    case["run_id"].as_str().unwrap().to_string(),
                    case["step"].as_i64().unwrap(),
                    case["instance_id"].as_str().unwrap().to_string(),
                )
            });
            assert_eq!(parsed, expected, "{case}");
        }
        for case in v["parse_step"].as_array().unwrap() {
            let parsed = parse_step_key(case["key"].as_str().unwrap());
            let expected = case.get("error").is_none().then(|| {
                (
                    case["run_id"].as_str().unwrap().to_string(),
                    case["step"].as_i64().unwrap(),
                )
            });
            assert_eq!(parsed, expected, "{case}");
        }
    }

    #[test]
    fn keys_groups_and_steps() {
        use serde_json::json;
        let failed = json!({"run_id": "r", "step": 3, "instance_id": "i-1"});
        assert_eq!(key_for(&failed).as_deref(), Some("r/3/i-1"));
        let row = json!({"type": "scored_rollout", "run_id": "r", "step": 3, "instance_id": "i"});
        assert_eq!(key_for(&row).as_deref(), Some("r/3"));
        assert_eq!(key_for(&json!({"step": 1})), None);
    }
}
