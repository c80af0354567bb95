//! Provider prompt caching (`llm.prompt_cache`): where a request marks
//! cacheable prefixes. Anthropic gets a `cache_control` breakpoint at the
//! end of each system part (the prompt with `system_context_file`, then the
//! `env_class` text) whose prefix reaches `llm.cache_min_tokens`, and one
//! after the task prompt when the same task was sent before within the
//! cache's lifetime (a refinement, a later epoch): a first sighting never
//! pays the write premium. OpenAI-compatible APIs cache prompts of 1,024+
//! tokens on their own; they get `prompt_cache_key` = prompt version + a
//! hash of the task, which routes a task's requests to one cache.
//!
//! Tokens are estimated at one per 4 bytes of text, which undercounts every
//! tokenizer we know of on prose, code and non-Latin text alike: a prefix
//! estimated at the minimum has at least that many tokens. (Anthropic
//! ignores a breakpoint below its minimum, without error or charge.)

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::client::{CacheMarks, Provider};
use crate::config::{CacheTtl, LlmConfig};

/// Bytes per estimated token.
pub const BYTES_PER_TOKEN: usize = 4;
/// The most recent tasks remembered for recurrence; past it, the oldest
/// half is forgotten.
pub const MAX_TRACKED_TASKS: usize = 100_000;

/// The estimated tokens of `text`.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.len() / BYTES_PER_TOKEN) as u64
}

/// A request's prompt: the system prompt (the version's prompt, then the
/// context texts) and the user message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptText {
    pub system: String,
    /// Where each part of `system` ends (bytes): the prompt with the
    /// common context, then the `env_class` text when there is one.
    pub system_parts: Vec<usize>,
    pub user: String,
    /// Where the task section at the start of `user` ends (bytes), when
    /// the user message starts with one.
    pub task_end: Option<usize>,
}

impl PromptText {
    /// `base` with each of `contexts` appended after a blank line.
    pub fn new(base: &str, contexts: &[&str], user: String) -> Self {
        let mut system = base.to_string();
        let mut system_parts = Vec::new();
        for (i, context) in contexts.iter().enumerate() {
            // The common context belongs to the first part.
            if i > 0 {
                system_parts.push(system.len());
            }
            system.push_str("\n\n");
            system.push_str(context);
        }
        system_parts.push(system.len());
        let task_end = super::prompt::task_section_len(&user);
        PromptText {
            system,
            system_parts,
            user,
            task_end,
        }
    }
}

/// The caching policy of one synthesizer's requests, and the tasks it sent
/// recently.
#[derive(Debug)]
pub struct PromptCache {
    enabled: bool,
    ttl: CacheTtl,
    min_tokens: u64,
    /// A hash of (model, system, task) -> when it was last sent.
    recent: Mutex<HashMap<[u8; 16], Instant>>,
}

fn digest(parts: &[&str]) -> [u8; 16] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.len().to_le_bytes());
        hasher.update(part.as_bytes());
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&hasher.finalize()[..16]);
    out
}

impl PromptCache {
    pub fn new(config: &LlmConfig) -> Self {
        PromptCache {
            enabled: config.prompt_cache,
            ttl: config.cache_ttl,
            min_tokens: u64::from(config.cache_min_tokens),
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// The marks of a request for `prompt` to `model` on `provider`, with
    /// `version` the prompt version; records the task as sent.
    pub fn marks(&self, provider: Provider, model: &str, version: &str, prompt: &PromptText) -> CacheMarks {
        if !self.enabled {
            return CacheMarks::default();
        }
        let task = prompt
            .task_end
            .and_then(|end| prompt.user.get(..end))
            .unwrap_or(&prompt.user);
        match provider {
            Provider::Openai => {
                let hash = digest(&[task]);
                let hex = hex::encode(&hash[..8]);
                CacheMarks {
                    key: Some(format!("hintstream-{version}-{hex}")),
                    ..CacheMarks::default()
                }
            }
            Provider::Anthropic => {
                // An offset off a character boundary (a hand-built
                // `PromptText`) counts as no text: it gets no breakpoint.
                let tokens = |text: &str, end: usize| text.get(..end).map_or(0, estimate_tokens);
                let reaches = |system_end: usize, user_end: usize| {
                    tokens(&prompt.system, system_end) + tokens(&prompt.user, user_end) >= self.min_tokens
                };
                let system_breaks = prompt
                    .system_parts
                    .iter()
                    .copied()
                    .filter(|&end| reaches(end, 0))
                    .collect();
                let task_break = prompt
                    .task_end
                    .filter(|&end| reaches(prompt.system.len(), end))
                    .filter(|_| self.recurs(&[model, &prompt.system, task]));
                CacheMarks {
                    system_breaks,
                    task_break,
                    one_hour: self.ttl == CacheTtl::OneHour,
                    key: None,
                }
            }
        }
    }

    /// Whether `parts` were sent within the cache's lifetime; records them
    /// as sent now.
    fn recurs(&self, parts: &[&str]) -> bool {
        let key = digest(parts);
        let now = Instant::now();
        let ttl: Duration = self.ttl.duration();
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() >= MAX_TRACKED_TASKS {
            recent.retain(|_, at| now.duration_since(*at) < ttl);
            if recent.len() >= MAX_TRACKED_TASKS {
                let mut times: Vec<Instant> = recent.values().copied().collect();
                times.sort_unstable();
                let cut = times[times.len() / 2];
                recent.retain(|_, at| *at > cut);
            }
        }
        recent
            .insert(key, now)
            .is_some_and(|before| now.duration_since(before) < ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(min_tokens: u32) -> PromptCache {
        PromptCache::new(&LlmConfig {
            cache_min_tokens: min_tokens,
            ..LlmConfig::default()
        })
    }

    fn prompt(context: &str, task: &str) -> PromptText {
        PromptText::new(
            "You coach an agent.",
            &[context],
            format!("## Task\n{task}\n\n## Conversation\n[user]: hi"),
        )
    }

    #[test]
    fn a_short_prompt_gets_no_breakpoint_and_a_long_system_gets_one() {
        let c = cache(1024);
        let short = prompt("Tools: bash.", "Fix it.");
        assert_eq!(
            c.marks(Provider::Anthropic, "m", "v2", &short),
            CacheMarks::default()
        );
        let long = prompt(&"tool docs ".repeat(500), "Fix it.");
        let marks = c.marks(Provider::Anthropic, "m", "v2", &long);
        assert_eq!(marks.system_breaks, vec![long.system.len()]);
        assert!(marks.writes_cache() && !marks.one_hour);
    }

    #[test]
    fn a_task_gets_its_breakpoint_once_it_recurs() {
        let c = cache(1024);
        let p = prompt(&"tool docs ".repeat(500), "Fix the parser.");
        assert_eq!(c.marks(Provider::Anthropic, "m", "v2", &p).task_break, None);
        let again = c.marks(Provider::Anthropic, "m", "v2", &p).task_break;
        assert_eq!(again, p.task_end);
        assert_eq!(&p.user[..again.unwrap()], "## Task\nFix the parser.");
        // Another model has its own cache.
        assert_eq!(c.marks(Provider::Anthropic, "n", "v2", &p).task_break, None);
    }

    #[test]
    fn the_env_class_part_gets_its_own_breakpoint() {
        let c = cache(1024);
        let p = PromptText::new(
            "Base.",
            &[&"common ".repeat(700), "sql rules"],
            "## Task\nx".into(),
        );
        let marks = c.marks(Provider::Anthropic, "m", "v2", &p);
        assert_eq!(marks.system_breaks, p.system_parts);
        assert_eq!(p.system_parts.len(), 2);
        assert!(p.system[p.system_parts[0]..].starts_with("\n\nsql rules"));
    }

    #[test]
    fn openai_gets_a_key_of_version_and_task_and_no_breakpoint() {
        let c = cache(1024);
        let a = c.marks(Provider::Openai, "m", "v2", &prompt("x", "Task A"));
        let b = c.marks(Provider::Openai, "m", "v2", &prompt("y", "Task A"));
        let other = c.marks(Provider::Openai, "m", "v2", &prompt("x", "Task B"));
        assert!(!a.writes_cache());
        assert_eq!(a.key, b.key, "the key is the task's, whatever the context");
        assert_ne!(a.key, other.key);
        assert!(a.key.unwrap().starts_with("hintstream-v2-"));
    }

    #[test]
    fn caching_off_marks_nothing() {
        let c = PromptCache::new(&LlmConfig {
            prompt_cache: false,
            ..LlmConfig::default()
        });
        let p = prompt(&"tool docs ".repeat(500), "x");
        assert_eq!(c.marks(Provider::Anthropic, "m", "v2", &p), CacheMarks::default());
        assert_eq!(c.marks(Provider::Openai, "m", "v2", &p), CacheMarks::default());
    }
}
