//! `hintstream produce`: publishes a JSONL file of messages, one per line,
//! keyed from each message's own fields (`run_id/step/instance_id` for failed
//! trajectories, `run_id/step` for scored rollouts and step ends).

use std::path::Path;

use rdkafka::producer::FutureProducer;
use thiserror::Error;

use super::recorded::{Bytes, RecordedMessage};
use super::replay::{send_all, ReplayError, ReplayOptions};
use crate::messages::key_for;

#[derive(Debug, Error)]
pub enum ProduceError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}: {reason}")]
    BadLine {
        path: String,
        line: usize,
        reason: String,
    },
    #[error(transparent)]
    Send(#[from] ReplayError),
}

/// Publishes every non-empty line of `file` to `topic`, in file order, and
/// waits for the acks. Every line is checked (a JSON object with `run_id` and
/// `step`) before the first is sent.
pub async fn produce_file(
    producer: &FutureProducer,
    topic: &str,
    file: &Path,
    progress: bool,
) -> Result<u64, ProduceError> {
    let path = file.display().to_string();
    let io_error = |source| ProduceError::Read {
        path: path.clone(),
        source,
    };
    let mut messages = Vec::new();
    crate::jsonl::for_each_line(file, io_error, |number, line| {
        let bad = |reason: String| ProduceError::BadLine {
            path: path.clone(),
            line: number,
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let key = key_for(&value).ok_or_else(|| {
            bad("cannot derive a key: the message needs string `run_id` and integer `step`".into())
        })?;
        messages.push(RecordedMessage {
            topic: topic.to_string(),
            partition: -1,
            offset: -1,
            timestamp: None,
            key: Bytes::new(Some(key.into_bytes())),
            value: Bytes::new(Some(line.as_bytes().to_vec())),
            headers: vec![],
        });
        Ok(())
    })?;
    let options = ReplayOptions {
        progress,
        ..ReplayOptions::default()
    };
    Ok(send_all(producer, &messages, &options, &format!("producing to {topic}")).await?)
}
