//! Message keys: `run_id/step/instance_id` for a GRPO group's messages and
//! `run_id/step` for a training step's. Inside the ids, `%` and `/` are
//! percent-encoded (`%25`, `%2F`) so that different groups never share a key:
//! unencoded, `("r/1", 2, "x")` and `("r", 1, "2/x")` would both be `r/1/2/x`.
//! Ids without `%` or `/` keep the keys they always had.

use std::borrow::Cow;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet};

/// The two characters that would make a key ambiguous.
const KEY_RESERVED: &AsciiSet = &AsciiSet::EMPTY.add(b'%').add(b'/');

/// An id as it appears inside a key.
pub fn encode_id(id: &str) -> Cow<'_, str> {
    utf8_percent_encode(id, KEY_RESERVED).into()
}

/// Key of a GRPO group's messages: `run_id/step/instance_id`.
pub fn group_key(run_id: &str, step: i64, instance_id: &str) -> String {
    format!("{}/{step}/{}", encode_id(run_id), encode_id(instance_id))
}

/// Key of a training step's messages: `run_id/step`.
pub fn step_key(run_id: &str, step: i64) -> String {
    format!("{}/{step}", encode_id(run_id))
}

/// The (run_id, step, instance_id) of a group key, or `None` when the key
/// does not have that shape. Keys written before ids were encoded read the
/// same when their ids have no `/` or `%`.
pub fn parse_group_key(key: &str) -> Option<(String, i64, String)> {
    let mut parts = key.splitn(3, '/');
    let run_id = decode_id(parts.next()?)?;
    let step = parts.next()?.parse().ok()?;
    let instance_id = decode_id(parts.next()?)?;
    Some((run_id, step, instance_id))
}

fn decode_id(part: &str) -> Option<String> {
    if part.contains('/') {
        return None;
    }
    percent_decode_str(part).decode_utf8().ok().map(Cow::into_owned)
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
}
