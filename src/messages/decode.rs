//! Turning untrusted bytes into typed messages: every way a payload can be bad
//! has its own [`DecodeError`] kind, and decoding never panics.

use serde::de::DeserializeOwned;
use thiserror::Error;

use super::ordered::OrderedJson;

/// Largest payload accepted by default, in bytes (4 MiB). Larger payloads are
/// rejected with [`DecodeError::TooLarge`] before any parsing happens.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Deepest JSON nesting (arrays and objects) accepted by default. Deeper
/// payloads are rejected with [`DecodeError::TooDeep`] before parsing, so a
/// hostile message cannot exhaust the stack.
pub const DEFAULT_MAX_JSON_DEPTH: usize = 64;

/// Bounds applied to every decoded payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Payloads over this many bytes are rejected.
    pub max_bytes: usize,
    /// Payloads nested deeper than this are rejected.
    pub max_depth: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_depth: DEFAULT_MAX_JSON_DEPTH,
        }
    }
}

/// Why a payload was rejected. [`DecodeError::kind`] is the short name that
/// goes into the dead-letter headers and metric labels.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DecodeError {
    #[error("payload is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("payload is empty")]
    Empty,
    #[error("payload is not valid UTF-8 (first bad byte at index {valid_up_to})")]
    NotUtf8 { valid_up_to: usize },
    #[error("payload nests deeper than {limit} levels")]
    TooDeep { limit: usize },
    #[error("payload is not JSON: {detail}")]
    NotJson { detail: String },
    #[error("payload holds a non-finite number (NaN or Infinity) at line {line} column {column}; JSON has no such numbers")]
    NonFiniteNumber { line: usize, column: usize },
    #[error("payload is JSON but not an object")]
    NotObject,
    #[error("missing field `{field}`")]
    MissingField { field: String },
    #[error("field `{field}` has the wrong type or shape: {detail}")]
    WrongType { field: String, detail: String },
    #[error("field `{field}` is invalid: {reason}")]
    InvalidValue { field: String, reason: String },
    #[error("unsupported schema_version {found}; this build reads version {supported}")]
    UnsupportedSchemaVersion { found: i64, supported: u32 },
}

impl DecodeError {
    /// Short, stable name of the error kind (DLQ header, metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::TooLarge { .. } => "too_large",
            DecodeError::Empty => "empty",
            DecodeError::NotUtf8 { .. } => "not_utf8",
            DecodeError::TooDeep { .. } => "too_deep",
            DecodeError::NotJson { .. } => "not_json",
            DecodeError::NonFiniteNumber { .. } => "non_finite",
            DecodeError::NotObject => "not_object",
            DecodeError::MissingField { .. } => "missing_field",
            DecodeError::WrongType { .. } => "wrong_type",
            DecodeError::InvalidValue { .. } => "invalid_value",
            DecodeError::UnsupportedSchemaVersion { .. } => "schema_version",
        }
    }

    /// The offending field, where there is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            DecodeError::MissingField { field }
            | DecodeError::WrongType { field, .. }
            | DecodeError::InvalidValue { field, .. } => Some(field),
            _ => None,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        DecodeError::InvalidValue {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Rules a message checks after its fields were read (ids non-empty, numbers
/// finite, ...). Structure is checked by serde; meaning is checked here.
pub trait Validate {
    /// Whether [`decode`] reads the payload a second time keeping its
    /// objects' keys in order (a `serde_json::Value` sorts them) and hands
    /// it to [`Validate::restore_key_order`].
    const KEEPS_KEY_ORDER: bool = false;

    /// Takes what needs the keys' order from the payload read with it.
    fn restore_key_order(&mut self, _ordered: &OrderedJson) {}

    fn validate(&self) -> Result<(), DecodeError>;

    /// `text`, a JSON object, parsed straight into `Self` in one pass;
    /// `None` when that pass refuses it ([`decode`] then reads it again to
    /// name what is wrong). A type whose derived reading is slow may read
    /// it another way, provided it accepts nothing the derived one refuses
    /// and reads the same value from anything both accept.
    fn read_direct(text: &str) -> Option<Self>
    where
        Self: DeserializeOwned,
    {
        serde_json::from_str(text).ok()
    }
}

/// Decodes one payload: size, UTF-8, nesting depth, JSON syntax, object shape,
/// fields (with the path of the first bad one), then [`Validate`].
///
/// A good payload is parsed once, straight into `T` (a content block's
/// keys then arrive in their order, so no second reading restores it). A
/// payload that pass refuses is read again through a `serde_json::Value`,
/// which names what is wrong as it always did.
pub fn decode<T: DeserializeOwned + Validate>(bytes: &[u8], limits: DecodeLimits) -> Result<T, DecodeError> {
    let text = checked_text(bytes, limits)?;
    let typed = match direct::<T>(text) {
        Some(typed) => typed,
        None => decode_via_value(text)?,
    };
    typed.validate()?;
    Ok(typed)
}

/// `text` parsed into `T` in one pass, when it is a JSON object that `T`
/// reads; `None` for anything else (the checks of [`decode_via_value`] say
/// why).
fn direct<T: DeserializeOwned + Validate>(text: &str) -> Option<T> {
    if !text.trim_start().starts_with('{') {
        // A struct also reads a JSON array; the payload must be an object.
        return None;
    }
    T::read_direct(text)
}

/// The path that names a bad payload's fault: `text` read as a
/// `serde_json::Value` (its object shape checked), then into `T`, then its
/// keys' order taken from a second reading for `T::KEEPS_KEY_ORDER`.
fn decode_via_value<T: DeserializeOwned + Validate>(text: &str) -> Result<T, DecodeError> {
    let value = parse_object(text)?;
    let mut typed: T = from_value(value)?;
    if T::KEEPS_KEY_ORDER {
        if let Ok(ordered) = serde_json::from_str::<OrderedJson>(text) {
            typed.restore_key_order(&ordered);
        }
    }
    Ok(typed)
}

/// The checks of [`decode`] that come before the message type is known: the
/// result is a JSON object.
pub fn decode_object(bytes: &[u8], limits: DecodeLimits) -> Result<serde_json::Value, DecodeError> {
    parse_object(checked_text(bytes, limits)?)
}

/// The checks before any parsing: size, UTF-8, not empty, nesting depth.
fn checked_text(bytes: &[u8], limits: DecodeLimits) -> Result<&str, DecodeError> {
    if bytes.len() > limits.max_bytes {
        return Err(DecodeError::TooLarge {
            size: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| DecodeError::NotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    if text.trim().is_empty() {
        return Err(DecodeError::Empty);
    }
    if nesting_depth_exceeds(text, limits.max_depth) {
        return Err(DecodeError::TooDeep {
            limit: limits.max_depth,
        });
    }
    Ok(text)
}

/// JSON syntax and object shape.
fn parse_object(text: &str) -> Result<serde_json::Value, DecodeError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| json_error(text, e))?;
    if !value.is_object() {
        return Err(DecodeError::NotObject);
    }
    Ok(value)
}

/// Reads a typed message out of a JSON value, naming the first bad field.
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, DecodeError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let detail = inner.to_string();
        if let Some(field) = missing_field_name(&detail) {
            let field = if path == "." || path.is_empty() {
                field.to_string()
            } else {
                format!("{path}.{field}")
            };
            DecodeError::MissingField { field }
        } else if detail.starts_with("unknown variant") {
            // An enum's value outside its set: at the root, the `type` tag.
            let root = path == "." || path.is_empty();
            DecodeError::InvalidValue {
                field: if root { "type".into() } else { path },
                reason: detail,
            }
        } else {
            DecodeError::WrongType {
                field: if path.is_empty() { ".".into() } else { path },
                detail,
            }
        }
    })
}

fn missing_field_name(detail: &str) -> Option<&str> {
    let rest = detail.strip_prefix("missing field `")?;
    rest.split('`').next()
}

fn json_error(text: &str, e: serde_json::Error) -> DecodeError {
    let (line, column) = (e.line(), e.column());
    // Python's json.dumps writes NaN / Infinity / -Infinity for non-finite
    // floats; serde_json rejects them as syntax errors. Name them for what they
    // are so that the producer knows what to fix.
    if let Some(rest) = text_at(text, line, column) {
        let rest = rest.trim_start_matches('-');
        if rest.starts_with("NaN") || rest.starts_with("Infinity") || rest.starts_with("inf") {
            return DecodeError::NonFiniteNumber { line, column };
        }
    }
    if e.to_string().contains("number out of range") {
        return DecodeError::NonFiniteNumber { line, column };
    }
    DecodeError::NotJson {
        detail: e.to_string(),
    }
}

/// The text from (1-based line, 1-based column) of a serde_json error, moved
/// back to the start of the token that failed.
fn text_at(text: &str, line: usize, column: usize) -> Option<&str> {
    let line_text = text.lines().nth(line.checked_sub(1)?)?;
    let mut start = column.saturating_sub(1).min(line_text.len());
    while !line_text.is_char_boundary(start) {
        start -= 1;
    }
    // Back up over the token characters before the error column.
    let bytes = line_text.as_bytes();
    while start > 0 && (bytes[start - 1].is_ascii_alphabetic() || bytes[start - 1] == b'-') {
        start -= 1;
    }
    line_text.get(start..)
}

/// True when `text` opens more than `limit` arrays/objects at once. Brackets
/// inside strings do not count.
fn nesting_depth_exceeds(text: &str, limit: usize) -> bool {
    // No deeper than it has openers, in strings or not: counted in one
    // pass the compiler vectorises, most payloads need no walk (a JSON row
    // has one; the walk was a tenth of stage 2's intake of JSON rows). Each
    // run of 255 bytes is counted in bytes, which the vectors add 32 or 64
    // at a time (counted straight into a `usize`, it was 3% of stage 2's
    // intake of JSON rows).
    let openers: usize = text
        .as_bytes()
        .chunks(255)
        .map(|run| usize::from(run.iter().fold(0u8, |n, &b| n + u8::from(b == b'[' || b == b'{'))))
        .sum();
    if openers <= limit {
        return false;
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Checks shared by the message types.
pub(crate) mod rules {
    use super::DecodeError;

    pub fn non_empty(field: &str, value: &str) -> Result<(), DecodeError> {
        if value.trim().is_empty() {
            Err(DecodeError::invalid(field, "must be a non-empty string"))
        } else {
            Ok(())
        }
    }

    pub fn step(value: i64) -> Result<(), DecodeError> {
        if value < 0 {
            Err(DecodeError::invalid("step", format!("must be >= 0, got {value}")))
        } else {
            Ok(())
        }
    }

    pub fn finite(field: &str, value: f64) -> Result<(), DecodeError> {
        if value.is_finite() {
            Ok(())
        } else {
            Err(DecodeError::invalid(field, "must be a finite number"))
        }
    }

    pub fn schema_version(found: i64, supported: u32) -> Result<(), DecodeError> {
        if found == i64::from(supported) {
            Ok(())
        } else {
            Err(DecodeError::UnsupportedSchemaVersion { found, supported })
        }
    }

    pub fn rfc3339(field: &str, value: Option<&str>) -> Result<(), DecodeError> {
        match value {
            Some(v) if chrono::DateTime::parse_from_rfc3339(v).is_err() => Err(DecodeError::invalid(
                field,
                format!("must be an RFC 3339 timestamp, got {v:?}"),
            )),
            _ => Ok(()),
        }
    }
}

/// The text of a caught panic's payload (`panic!` with a literal or a
/// formatted message), or `None` for any other payload: for the reason a
/// guarded decode or handler gives.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panics_text_is_read_from_its_payload() {
        let caught = |f: fn()| std::panic::catch_unwind(f).unwrap_err();
        let literal = caught(|| panic!("a literal"));
        let formatted = caught(|| panic!("formatted {}", 7));
        let other = caught(|| std::panic::panic_any(7u8));
        assert_eq!(panic_text(literal.as_ref()), Some("a literal"));
        assert_eq!(panic_text(formatted.as_ref()), Some("formatted 7"));
        assert_eq!(panic_text(other.as_ref()), None);
    }

    #[test]
    fn counts_depth_outside_strings_only() {
        assert!(!nesting_depth_exceeds(r#"{"a": "[[[[[[[["}"#, 2));
        assert!(nesting_depth_exceeds(r#"{"a": [[1]]}"#, 2));
        assert!(!nesting_depth_exceeds(r#"{"a": "\"[[[[", "b": [1]}"#, 2));
    }

    #[test]
    fn depth_at_the_limit_passes_and_one_more_does_not_however_many_openers() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        // No more openers than the limit: passed without the walk.
        assert!(!nesting_depth_exceeds(&nested(3), 3));
        assert!(nesting_depth_exceeds(&nested(4), 3));
        // Openers counted across the runs the count takes (255 bytes),
        // every byte of a run one of them.
        for n in [255, 256, 510, 600] {
            assert!(!nesting_depth_exceeds(&nested(n), n), "{n} deep, limit {n}");
            assert!(
                nesting_depth_exceeds(&nested(n), n - 1),
                "{n} deep, limit {}",
                n - 1
            );
        }
        // More openers than the limit, side by side or in strings: walked.
        assert!(!nesting_depth_exceeds(
            &format!("[{},{},\"[[[[\"]", nested(2), nested(2)),
            3
        ));
        assert!(nesting_depth_exceeds(
            &format!("[{},{}]", nested(1), nested(3)),
            3
        ));
    }

    #[test]
    fn names_python_nan_as_non_finite() {
        let err = decode_object(br#"{"reward": NaN}"#, DecodeLimits::default()).unwrap_err();
        assert_eq!(err.kind(), "non_finite");
        let err = decode_object(br#"{"reward": -Infinity}"#, DecodeLimits::default()).unwrap_err();
        assert_eq!(err.kind(), "non_finite");
        let err = decode_object(br#"{"reward": 1e999}"#, DecodeLimits::default()).unwrap_err();
        assert_eq!(err.kind(), "non_finite");
    }

    #[test]
    fn rejects_before_parsing_when_too_large() {
        let limits = DecodeLimits {
            max_bytes: 10,
            max_depth: 8,
        };
        let err = decode_object(b"{\"a\": \"0123456789\"}", limits).unwrap_err();
        assert_eq!(err, DecodeError::TooLarge { size: 19, limit: 10 });
    }

    /// The vectors both languages read (`schemas/vectors/blank.json`): an
    /// id is blank as Rust's `trim` says, which the Python client's checks
    /// follow.
    #[test]
    fn an_id_is_blank_as_the_shared_vectors_say() {
        let vectors = crate::messages::vectors::shared("blank.json");
        let cases = vectors["cases"].as_array().unwrap();
        assert!(cases.len() >= 10);
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let blank = case["blank"].as_bool().unwrap();
            assert_eq!(
                rules::non_empty("instance_id", text).is_err(),
                blank,
                "{}",
                case["case"]
            );
        }
    }

    #[test]
    fn one_pass_reads_what_the_value_path_reads() {
        use crate::messages::FailedTrajectory;
        // Keys out of order, a repeated key in a content block, a repeated
        // top-level field (the one pass refuses it; the Value path keeps the
        // last), an integer reward and a top-level array.
        let good = br#"{"schema_version": 1, "run_id": "r", "step": 3, "instance_id": "i",
            "trajectory_id": "t", "task_prompt": "p", "reward": 0, "group_size": 2,
            "chat_history": [{"role": "user", "content": "go"},
              {"role": "assistant", "content": [{"type": "tool_use", "name": "bash", "id": "c1",
                "input": {"z": 1, "a": [2, {"y": null, "b": true}]}, "id": "c2"}]}]}"#;
        let text = std::str::from_utf8(good).unwrap();
        let once: FailedTrajectory = direct(text).expect("one pass reads it");
        let via_value: FailedTrajectory = decode_via_value(text).unwrap();
        assert_eq!(once, via_value);
        let decoded = decode::<FailedTrajectory>(good, DecodeLimits::default()).unwrap();
        assert_eq!(decoded, via_value);
        let repeated = text.replacen(r#""step": 3"#, r#""step": 3, "step": 4"#, 1);
        assert!(direct::<FailedTrajectory>(&repeated).is_none());
        let decoded = decode::<FailedTrajectory>(repeated.as_bytes(), DecodeLimits::default()).unwrap();
        assert_eq!(decoded.step, 4);
        let array = format!("[{}]", text);
        assert_eq!(
            decode::<FailedTrajectory>(array.as_bytes(), DecodeLimits::default()).unwrap_err(),
            DecodeError::NotObject
        );
    }
}
