//! Recorded LLM exchanges, so an evaluation can be rerun deterministically
//! and for free.
//!
//! A cassette is a JSONL file; each line is one *call*: everything the
//! synthesizer did with one model for one hint, keyed by a SHA-256 of the
//! request (provider, model, system and user prompt, max_tokens,
//! temperature; not the endpoint or key). A call lists its attempts in order,
//! each with its outcome (reply or error), how long it took, and how long the
//! synthesizer waited before retrying (`retry_in_ms`; absent on the last).
//! Playback replays those attempts, so retries and fallbacks take the same
//! path as when recorded, without HTTP and without sleeping.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::client::{Completion, LlmError, Provider, Reply};
use crate::messages::Usage;

/// How a cassette is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CassetteMode {
    /// Every call goes to the API and is appended.
    Record,
    /// Calls are answered from the cassette; a request it lacks goes to the
    /// API and is appended.
    Playback,
    /// Calls are answered from the cassette; a request it lacks is an error.
    Strict,
}

#[derive(Debug, Error)]
pub enum CassetteError {
    #[error("cannot open the cassette {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cassette {path} line {line}: {source}")]
    BadLine {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// One attempt of a call, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    #[serde(flatten)]
    pub outcome: AttemptOutcome,
    pub latency_ms: u64,
    /// The wait before the next attempt; `None` when there was none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<u64>,
}

/// How one attempt ended: the model's reply, or the error. (Named for the
/// attempt: the crate has other outcomes.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Reply {
        text: String,
        usage: Usage,
        stop_reason: Option<String>,
    },
    Error(LlmError),
}

impl AttemptOutcome {
    pub fn from_result(result: &Result<Reply, LlmError>) -> Self {
        match result {
            Ok(r) => AttemptOutcome::Reply {
                text: r.text.clone(),
                usage: r.usage,
                stop_reason: r.stop_reason.clone(),
            },
            Err(e) => AttemptOutcome::Error(e.clone()),
        }
    }

    /// `ok`, or the failure reason: the status metrics and logs report.
    pub fn status(&self) -> String {
        match self {
            AttemptOutcome::Reply { .. } => "ok".to_string(),
            AttemptOutcome::Error(e) => e.failure_reason(),
        }
    }
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub key: String,
    pub provider: Provider,
    pub model: String,
    pub attempts: Vec<Attempt>,
    /// The whole call as the synthesizer waited for it: attempts, retry
    /// waits, and waits for a concurrency slot or the rate limits.
    #[serde(default)]
    pub elapsed_ms: u64,
}

/// The key of a request: what decides the model's answer, nothing else.
pub fn request_key(provider: Provider, request: &Completion<'_>) -> String {
    let canonical = serde_json::json!({
        "provider": provider,
        "model": request.model,
        "system": request.system,
        "user": request.user,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
    });
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    hex::encode(digest)
}

struct Recorded {
    calls: Vec<Call>,
    /// The next call to play; identical requests take the calls in turn.
    next: usize,
}

fn add(recorded: &mut HashMap<String, Recorded>, call: Call) {
    recorded
        .entry(call.key.clone())
        .or_insert_with(|| Recorded {
            calls: vec![],
            next: 0,
        })
        .calls
        .push(call);
}

/// A cassette file, loaded and open for appending.
pub struct Cassette {
    mode: CassetteMode,
    path: PathBuf,
    recorded: Mutex<HashMap<String, Recorded>>,
    out: Mutex<std::io::BufWriter<std::fs::File>>,
    played: std::sync::atomic::AtomicU64,
    appended: std::sync::atomic::AtomicU64,
}

/// The file and its counts; a cassette holds no key (see `request_key`).
impl std::fmt::Debug for Cassette {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cassette")
            .field("mode", &self.mode)
            .field("path", &self.path)
            .field("played", &self.played())
            .field("appended", &self.appended())
            .finish_non_exhaustive()
    }
}

impl Cassette {
    /// Opens `path` (created when missing). In record mode an existing file is
    /// truncated; the other modes load it.
    pub fn open(path: &Path, mode: CassetteMode) -> Result<Self, CassetteError> {
        let io = |source| CassetteError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut recorded: HashMap<String, Recorded> = HashMap::new();
        if mode != CassetteMode::Record && path.exists() {
            crate::jsonl::for_each_line(path, io, |number, line| {
                let call: Call = serde_json::from_str(line).map_err(|source| CassetteError::BadLine {
                    path: path.to_path_buf(),
                    line: number,
                    source,
                })?;
                add(&mut recorded, call);
                Ok(())
            })?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(mode != CassetteMode::Record)
            .truncate(mode == CassetteMode::Record)
            .open(path)
            .map_err(io)?;
        Ok(Cassette {
            mode,
            path: path.to_path_buf(),
            recorded: Mutex::new(recorded),
            out: Mutex::new(std::io::BufWriter::new(file)),
            played: Default::default(),
            appended: Default::default(),
        })
    }

    pub fn mode(&self) -> CassetteMode {
        self.mode
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether calls are answered from the file.
    pub fn plays(&self) -> bool {
        self.mode != CassetteMode::Record
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, HashMap<String, Recorded>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The recorded call for `key` (identical requests take turns), or
    /// `None` when the cassette never saw the request.
    pub fn play(&self, key: &str) -> Option<Call> {
        let mut recorded = self.recorded();
        let entry = recorded.get_mut(key)?;
        let call = entry.calls[entry.next % entry.calls.len()].clone();
        entry.next += 1;
        self.played.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(call)
    }

    /// Appends a call made to the API.
    pub fn append(&self, call: Call) -> std::io::Result<()> {
        let line = serde_json::to_string(&call).map_err(std::io::Error::other)?;
        {
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            out.write_all(line.as_bytes())?;
            out.write_all(b"\n")?;
            out.flush()?;
        }
        self.appended.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        add(&mut self.recorded(), call);
        Ok(())
    }

    /// Calls answered from the file so far.
    pub fn played(&self) -> u64 {
        self.played.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Calls appended to the file so far.
    pub fn appended(&self) -> u64 {
        self.appended.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of a played call's reply.
    fn reply_text(call: &Call) -> String {
        call.attempts
            .iter()
            .find_map(|a| match &a.outcome {
                AttemptOutcome::Reply { text, .. } => Some(text.clone()),
                AttemptOutcome::Error(_) => None,
            })
            .expect("the call has a reply")
    }

    fn request<'a>(user: &'a str, model: &'a str) -> Completion<'a> {
        Completion {
            model,
            system: "sys",
            user,
            max_tokens: 300,
            temperature: 0.3,
            cache: Default::default(),
        }
    }

    fn call(key: &str, text: &str) -> Call {
        Call {
            key: key.into(),
            provider: Provider::Anthropic,
            model: "m".into(),
            attempts: vec![
                Attempt {
                    outcome: AttemptOutcome::Error(LlmError::Status {
                        status: 429,
                        kind: "rate_limit_error".into(),
                        message: "slow".into(),
                        retry_after: Some(std::time::Duration::from_secs(1)),
                    }),
                    latency_ms: 5,
                    retry_in_ms: Some(1000),
                },
                Attempt {
                    outcome: AttemptOutcome::Reply {
                        text: text.into(),
                        usage: Usage::new(10, 3),
                        stop_reason: Some("end_turn".into()),
                    },
                    latency_ms: 7,
                    retry_in_ms: None,
                },
            ],
            elapsed_ms: 1015,
        }
    }

    #[test]
    fn the_key_depends_on_what_decides_the_answer() {
        let k = request_key(Provider::Anthropic, &request("u", "m"));
        assert_eq!(k, request_key(Provider::Anthropic, &request("u", "m")));
        assert_ne!(k, request_key(Provider::Openai, &request("u", "m")));
        assert_ne!(k, request_key(Provider::Anthropic, &request("u2", "m")));
        assert_ne!(k, request_key(Provider::Anthropic, &request("u", "m2")));
        let mut hotter = request("u", "m");
        hotter.temperature = 0.9;
        assert_ne!(k, request_key(Provider::Anthropic, &hotter));
    }

    #[test]
    fn a_recorded_file_plays_back_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        let rec = Cassette::open(&path, CassetteMode::Record).unwrap();
        rec.append(call("a", "first")).unwrap();
        rec.append(call("a", "second")).unwrap();
        rec.append(call("b", "other")).unwrap();
        drop(rec);
        let play = Cassette::open(&path, CassetteMode::Strict).unwrap();
        let texts: Vec<String> = (0..3).map(|_| reply_text(&play.play("a").unwrap())).collect();
        assert_eq!(texts, ["first", "second", "first"]);
        assert_eq!(reply_text(&play.play("b").unwrap()), "other");
        assert!(play.play("c").is_none());
        assert_eq!(play.played(), 4);
        assert_eq!(
            play.play("a").unwrap(),
            call("a", "second"),
            "a round trip keeps every field"
        );
    }

    #[test]
    fn record_mode_starts_a_new_file_and_playback_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        Cassette::open(&path, CassetteMode::Record)
            .unwrap()
            .append(call("a", "x"))
            .unwrap();
        Cassette::open(&path, CassetteMode::Playback)
            .unwrap()
            .append(call("b", "y"))
            .unwrap();
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert_eq!(lines, 2);
        Cassette::open(&path, CassetteMode::Record).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    }

    #[test]
    fn cassette_debug_names_the_file_not_its_calls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        let rec = Cassette::open(&path, CassetteMode::Record).unwrap();
        rec.append(call("a", "recorded-reply-text")).unwrap();
        let shown = format!("{rec:?}");
        assert!(
            shown.contains("c.jsonl") && shown.contains("appended: 1"),
            "{shown}"
        );
        assert!(!shown.contains("recorded-reply-text"), "{shown}");
    }

    #[test]
    fn a_bad_line_names_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, "{}\n").unwrap();
        let err = Cassette::open(&path, CassetteMode::Strict).err().unwrap();
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}
