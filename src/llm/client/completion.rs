//! One completion request, with where it asks for prompt caching, and its
//! reply.

use serde_json::Value;

use crate::messages::Usage;

/// One completion request.
#[derive(Debug, Clone)]
pub struct Completion<'a> {
    pub model: &'a str,
    pub system: &'a str,
    pub user: &'a str,
    pub max_tokens: u32,
    pub temperature: f64,
    /// Where the request asks for prompt caching (none by default). Not
    /// part of the cassette key: the text sent is the same.
    pub cache: CacheMarks,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub text: String,
    pub usage: Usage,
    pub stop_reason: Option<String>,
}

/// Where one request asks for caching (`prompt_cache` decides).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheMarks {
    /// Ends (bytes of `system`) of the system blocks that get a
    /// breakpoint; `system` is split into blocks there. Empty: `system`
    /// goes as one string.
    pub system_breaks: Vec<usize>,
    /// The bytes of `user` sent as a block of their own with a breakpoint
    /// (the recurring task); `None`: `user` goes as one string.
    pub task_break: Option<usize>,
    /// `"ttl": "1h"` on the breakpoints.
    pub one_hour: bool,
    /// OpenAI's `prompt_cache_key`.
    pub key: Option<String>,
}

impl CacheMarks {
    /// Whether the request may be billed a cache write (a breakpoint).
    pub fn writes_cache(&self) -> bool {
        !self.system_breaks.is_empty() || self.task_break.is_some()
    }
}

pub(super) fn usage_field(v: &Value, path: &[&str]) -> u64 {
    reported(v, path).unwrap_or(0)
}

/// A usage field when the API reported it (absent or `null`: `None`).
pub(super) fn reported(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, k| v.get(k)).and_then(Value::as_u64)
}
