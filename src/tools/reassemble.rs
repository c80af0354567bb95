//! Reading chunked steps back: the messages of an advantages topic (live or
//! recorded by `hintstream record`) put together into whole steps, never a
//! partial one.
//!
//! The rules are the Python client's (`TrainerClient.wait_advantages`), so
//! both readers see the same steps:
//!
//! - a step's chunks are gathered by message key (`run_id/step`) and
//!   attempt (header `hintstream.attempt`: one publication of the step),
//!   never mixing two attempts; `batch::chunk::ChunkInfo::from_headers`
//!   reads where a message sits (no chunk headers: a whole step, chunk 0 of
//!   1);
//! - chunks without an attempt header (older writers) are one attempt of
//!   their own, where a chunk with a different `chunks` or `rows` than the
//!   chunks gathered so far starts the set over (the step was republished
//!   in another shape) and a chunk index seen before keeps its first copy (a
//!   republished step's chunks are equal to the first copy's);
//! - at most [`MAX_ATTEMPTS_PER_STEP`] attempts of a key are gathered at
//!   once; a further one drops the oldest;
//! - once all `chunks` of an attempt are in, they are concatenated in index
//!   order and the step is returned; when the rows differ from the `rows`
//!   header the step is discarded as unreadable. When several attempts of
//!   a step complete, each is returned when it does, so the last one
//!   returned (the highest offset) is the one that wins
//!   ([`Reassembled::latest`]);
//! - a message whose headers, key or Arrow payload cannot be read is
//!   reported and skipped.

use std::collections::HashMap;

use arrow_array::RecordBatch;

use super::RecordedMessage;
use crate::batch::chunk::{ChunkInfo, ATTEMPT_HEADER};
use crate::batch::ipc;

/// One whole step.
#[derive(Debug, Clone)]
pub struct Step {
    /// Its key, `run_id/step`.
    pub key: String,
    /// Its batches, chunk by chunk in order (an IPC stream may hold several).
    pub batches: Vec<RecordBatch>,
    /// How many messages it came in.
    pub chunks: usize,
}

impl Step {
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// A message that could not be used, or a step whose chunks disagree with
/// its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    pub key: String,
    /// `topic[partition]@offset` of the message that made it unreadable.
    pub at: String,
    pub reason: String,
}

/// A step whose chunks have not all arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    pub key: String,
    pub arrived: usize,
    pub count: usize,
}

/// How many attempts of one step a reader gathers at once (a step
/// republished over and over by crashing workers must not grow a reader
/// without bound); a further attempt drops the oldest one.
pub const MAX_ATTEMPTS_PER_STEP: usize = 4;

/// The chunks of one attempt of a step gathered so far.
struct ChunkSet {
    /// Its `hintstream.attempt`, `None` for chunks without one.
    attempt: Option<Vec<u8>>,
    count: usize,
    rows: Option<usize>,
    parts: HashMap<usize, Vec<RecordBatch>>,
}

/// The attempts of one step being gathered, oldest first.
#[derive(Default)]
struct StepSets {
    attempts: Vec<ChunkSet>,
    /// Whether an attempt of the step completed already: the others left
    /// over are not reported as partial.
    completed: bool,
}

/// Gathers messages into whole steps, one message at a time, in the order
/// they were read.
#[derive(Default)]
pub struct Reassembler {
    partial: HashMap<String, StepSets>,
}

impl Reassembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one message (`header(name)` gives a header's value). Returns the
    /// step it completes, if any.
    pub fn push<'a>(
        &mut self,
        key: Option<&[u8]>,
        header: impl Fn(&str) -> Option<&'a [u8]>,
        payload: Option<&[u8]>,
    ) -> Result<Option<Step>, String> {
        let key = std::str::from_utf8(key.unwrap_or_default())
            .map_err(|_| "the key is not UTF-8".to_string())?
            .to_string();
        let info = ChunkInfo::from_headers(&header).map_err(|e| e.to_string())?;
        let batches = ipc::decode_stream(payload.unwrap_or_default())
            .map_err(|e| format!("not an Arrow IPC stream: {e}"))?;
        let attempt = header(ATTEMPT_HEADER).map(<[u8]>::to_vec);
        let sets = self.partial.entry(key.clone()).or_default();
        let at = match sets.attempts.iter().position(|s| s.attempt == attempt) {
            // Within an attempt (or among chunks without one), another shape
            // starts the set over.
            Some(at) if sets.attempts[at].count == info.count && sets.attempts[at].rows == info.rows => at,
            found => {
                let fresh = ChunkSet {
                    attempt,
                    count: info.count,
                    rows: info.rows,
                    parts: HashMap::new(),
                };
                match found {
                    Some(at) => {
                        sets.attempts[at] = fresh;
                        at
                    }
                    None => {
                        if sets.attempts.len() >= MAX_ATTEMPTS_PER_STEP {
                            sets.attempts.remove(0);
                        }
                        sets.attempts.push(fresh);
                        sets.attempts.len() - 1
                    }
                }
            }
        };
        let set = &mut sets.attempts[at];
        set.parts.entry(info.index).or_insert(batches);
        if set.parts.len() < set.count {
            return Ok(None);
        }
        let mut set = sets.attempts.remove(at);
        sets.completed = true;
        if sets.attempts.is_empty() {
            self.partial.remove(&key);
        }
        let batches: Vec<RecordBatch> = (0..set.count)
            .flat_map(|i| set.parts.remove(&i).unwrap_or_default())
            .collect();
        let step = Step {
            key,
            batches,
            chunks: set.count,
        };
        if let Some(rows) = set.rows.filter(|&r| r != step.num_rows()) {
            return Err(format!(
                "chunks of {} hold {} rows, headers say {rows}; step discarded",
                step.key,
                step.num_rows()
            ));
        }
        Ok(Some(step))
    }

    /// Steps whose chunks have not all arrived, by key.
    pub fn partial(&self) -> Vec<Partial> {
        let mut partial: Vec<Partial> = self
            .partial
            .iter()
            .filter(|(_, sets)| !sets.completed)
            .filter_map(|(key, sets)| {
                // The attempt closest to complete.
                let set = sets
                    .attempts
                    .iter()
                    .max_by_key(|s| s.parts.len() * 1_000_000 / s.count.max(1))?;
                Some(Partial {
                    key: key.clone(),
                    arrived: set.parts.len(),
                    count: set.count,
                })
            })
            .collect();
        partial.sort_by(|a, b| a.key.cmp(&b.key));
        partial
    }
}

/// What a recorded advantages topic holds.
#[derive(Debug, Default)]
pub struct Reassembled {
    /// Whole steps, in the order they were completed. A step published twice
    /// (republished after a crash) is here twice.
    pub steps: Vec<Step>,
    /// Steps still missing chunks at the end of the recording.
    pub partial: Vec<Partial>,
    pub unreadable: Vec<Unreadable>,
}

impl Reassembled {
    /// The last whole copy of each step (the attempt completed at the
    /// highest offset), in the order of `steps`.
    pub fn latest(&self) -> Vec<&Step> {
        let last: HashMap<&str, usize> = self
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.key.as_str(), i))
            .collect();
        self.steps
            .iter()
            .enumerate()
            .filter(|(i, s)| last.get(s.key.as_str()) == Some(i))
            .map(|(_, s)| s)
            .collect()
    }
}

/// Reassembles the messages of a recorded advantages topic (in recorded
/// order: a partition's messages in offset order) into whole steps.
pub fn reassemble_steps(messages: &[RecordedMessage]) -> Reassembled {
    let mut reassembler = Reassembler::new();
    let mut out = Reassembled::default();
    for m in messages {
        let header = |name: &str| {
            m.headers
                .iter()
                .find(|h| h.key == name)
                .map(|h| h.value.bytes.as_deref().unwrap_or_default())
        };
        match reassembler.push(m.key_bytes(), header, m.value_bytes()) {
            Ok(Some(step)) => out.steps.push(step),
            Ok(None) => {}
            Err(reason) => out.unreadable.push(Unreadable {
                key: crate::kafka::produce::key_text(m.key_bytes()),
                at: format!("{}[{}]@{}", m.topic, m.partition, m.offset),
                reason,
            }),
        }
    }
    out.partial = reassembler.partial();
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Array, ArrayRef, Int64Array};

    use super::*;
    use crate::batch::chunk::{chunk_header_values, encode_chunks, ATTEMPT_HEADER};
    use crate::tools::recorded::{Bytes, RecordedHeader};

    fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from_iter_values(ids)) as ArrayRef)]).unwrap()
    }

    fn message(key: &str, offset: i64, headers: &[(&str, String)], payload: Vec<u8>) -> RecordedMessage {
        RecordedMessage {
            topic: "adv".into(),
            partition: 0,
            offset,
            timestamp: None,
            key: Bytes::new(Some(key.as_bytes().to_vec())),
            value: Bytes::new(Some(payload)),
            headers: headers
                .iter()
                .map(|(k, v)| RecordedHeader {
                    key: (*k).into(),
                    value: Bytes::new(Some(v.clone().into_bytes())),
                })
                .collect(),
        }
    }

    /// The messages of `ids` split into chunks under `max` bytes.
    fn chunked(key: &str, ids: std::ops::Range<i64>, max: usize) -> Vec<RecordedMessage> {
        let input = batch(ids);
        let chunks = encode_chunks(&input, max).unwrap();
        let n = chunks.len();
        chunks
            .chunks
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                message(
                    key,
                    i as i64,
                    &chunk_header_values(i, n, input.num_rows()),
                    c.payload,
                )
            })
            .collect()
    }

    fn ids(step: &Step) -> Vec<i64> {
        step.batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    #[test]
    fn whole_and_chunked_steps_come_back_whole_in_chunk_order() {
        let mut messages = vec![message(
            "r/1",
            0,
            &[],
            ipc::encode_stream(&[batch(0..5)]).unwrap(),
        )];
        let mut step2 = chunked("r/2", 0..3_000, 4_000);
        assert!(step2.len() >= 3);
        step2.swap(0, 2); // out of order
        let repeat = step2[1].clone();
        step2.insert(2, repeat); // and a chunk twice
        messages.extend(step2);
        let out = reassemble_steps(&messages);
        assert!(out.unreadable.is_empty() && out.partial.is_empty(), "{out:?}");
        assert_eq!(out.steps.len(), 2);
        assert_eq!(ids(&out.steps[0]), (0..5).collect::<Vec<_>>());
        assert_eq!(out.steps[1].key, "r/2");
        assert_eq!(ids(&out.steps[1]), (0..3_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_step_missing_a_chunk_is_never_returned() {
        let mut messages = chunked("r/3", 0..3_000, 4_000);
        let count = messages.len();
        let last = messages.pop().unwrap();
        let out = reassemble_steps(&messages);
        assert!(out.steps.is_empty(), "a partial step was returned");
        assert_eq!(
            out.partial,
            vec![Partial {
                key: "r/3".into(),
                arrived: count - 1,
                count
            }]
        );
        messages.push(last);
        assert_eq!(reassemble_steps(&messages).steps.len(), 1);
    }

    #[test]
    fn a_republished_step_completes_the_interrupted_copy_once() {
        // Killed after two chunks, then republished whole: one step.
        let full = chunked("r/4", 0..3_000, 4_000);
        let mut messages: Vec<RecordedMessage> = full[..2].to_vec();
        messages.extend(full.iter().cloned());
        let out = reassemble_steps(&messages);
        assert_eq!(out.steps.len(), 1);
        assert_eq!(ids(&out.steps[0]), (0..3_000).collect::<Vec<_>>());
        assert!(out.partial.is_empty());
    }

    #[test]
    fn a_chunk_set_that_restarts_with_another_shape_starts_over() {
        let first = chunked("r/5", 0..3_000, 4_000);
        let mut messages: Vec<RecordedMessage> = first[..2].to_vec();
        messages.extend(chunked("r/5", 100..1_100, 1 << 20)); // one chunk of 1,000 rows
        let out = reassemble_steps(&messages);
        assert_eq!(out.steps.len(), 1);
        assert_eq!(ids(&out.steps[0]), (100..1_100).collect::<Vec<_>>());
    }

    /// Chunk `index` of 3 of a 3,000-row step, rows `ids`, of `attempt`.
    fn attempt_chunk(
        key: &str,
        offset: i64,
        attempt: &str,
        index: usize,
        ids: std::ops::Range<i64>,
    ) -> RecordedMessage {
        let mut headers = chunk_header_values(index, 3, 3_000).to_vec();
        headers.push((ATTEMPT_HEADER, attempt.to_string()));
        message(key, offset, &headers, ipc::encode_stream(&[batch(ids)]).unwrap())
    }

    #[test]
    fn interleaved_attempts_cut_at_other_boundaries_never_mix() {
        // Attempt a: rows 0..3000 cut at 1000 and 2000; attempt b: other
        // values (10_000..13_000) cut at 500 and 2500. Same count, same rows.
        let a = [0..1_000, 1_000..2_000, 2_000..3_000];
        let b = [10_000..10_500, 10_500..12_500, 12_500..13_000];
        let order = [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)];
        let messages: Vec<RecordedMessage> = order
            .iter()
            .enumerate()
            .map(|(offset, &(attempt, i))| {
                let ids = if attempt == "a" {
                    a[i].clone()
                } else {
                    b[i].clone()
                };
                attempt_chunk("r/10", offset as i64, attempt, i, ids)
            })
            .collect();
        let out = reassemble_steps(&messages);
        assert!(out.unreadable.is_empty() && out.partial.is_empty(), "{out:?}");
        assert_eq!(out.steps.len(), 2, "each attempt whole, when it completes");
        assert_eq!(ids(&out.steps[0]), (0..3_000).collect::<Vec<_>>());
        assert_eq!(ids(&out.steps[1]), (10_000..13_000).collect::<Vec<_>>());
        // The attempt completed last (highest offset) wins.
        let latest = out.latest();
        assert_eq!(latest.len(), 1);
        assert_eq!(ids(latest[0]), (10_000..13_000).collect::<Vec<_>>());

        // The same chunks without attempt headers (older writers) mix,
        // as they always did: what the header is for.
        let legacy: Vec<RecordedMessage> = messages
            .iter()
            .cloned()
            .map(|mut m| {
                m.headers.retain(|h| h.key != ATTEMPT_HEADER);
                m
            })
            .collect();
        let out = reassemble_steps(&legacy);
        assert!(out.steps.iter().all(|s| ids(s) != (0..3_000).collect::<Vec<_>>()));
    }

    #[test]
    fn an_interrupted_attempt_is_not_reported_once_another_completes() {
        // Attempt a killed after two chunks, attempt b published whole.
        let mut messages = vec![
            attempt_chunk("r/11", 0, "a", 0, 0..1_000),
            attempt_chunk("r/11", 1, "a", 1, 1_000..2_000),
        ];
        let out = reassemble_steps(&messages);
        assert_eq!(out.partial.len(), 1);
        for (i, ids) in [0..500, 500..2_500, 2_500..3_000].into_iter().enumerate() {
            messages.push(attempt_chunk("r/11", 2 + i as i64, "b", i, ids));
        }
        let out = reassemble_steps(&messages);
        assert_eq!(out.steps.len(), 1);
        assert_eq!(ids(&out.steps[0]), (0..3_000).collect::<Vec<_>>());
        assert!(out.partial.is_empty(), "{:?}", out.partial);
        // And attempts are gathered at most MAX_ATTEMPTS_PER_STEP at once.
        let many: Vec<RecordedMessage> = (0..10)
            .map(|n| attempt_chunk("r/12", n, &format!("x{n}"), 0, 0..1_000))
            .collect();
        let mut reassembler = Reassembler::new();
        for m in &many {
            let header = |name: &str| {
                m.headers
                    .iter()
                    .find(|h| h.key == name)
                    .map(|h| h.value.bytes.as_deref().unwrap_or_default())
            };
            assert!(reassembler
                .push(m.key_bytes(), header, m.value_bytes())
                .unwrap()
                .is_none());
        }
        assert_eq!(reassembler.partial["r/12"].attempts.len(), MAX_ATTEMPTS_PER_STEP);
    }

    #[test]
    fn chunks_that_disagree_with_their_headers_are_unreadable() {
        let rows = |n: usize| {
            [
                ("hintstream.chunk", "0".to_string()),
                ("hintstream.chunks", "1".into()),
                ("hintstream.rows", n.to_string()),
            ]
        };
        let payload = ipc::encode_stream(&[batch(0..3)]).unwrap();
        let messages = vec![
            message("r/6", 0, &rows(4), payload.clone()),
            message("r/7", 1, &[("hintstream.chunk", "1".into())], payload.clone()),
            message("r/8", 2, &[], b"not arrow".to_vec()),
            message("r/9", 3, &rows(3), payload),
        ];
        let out = reassemble_steps(&messages);
        assert_eq!(out.steps.len(), 1);
        assert_eq!(out.steps[0].key, "r/9");
        let keys: Vec<&str> = out.unreadable.iter().map(|u| u.key.as_str()).collect();
        assert_eq!(keys, ["r/6", "r/7", "r/8"]);
        assert!(
            out.unreadable[0].reason.contains("headers say 4"),
            "{:?}",
            out.unreadable[0]
        );
        assert_eq!(out.unreadable[1].at, "adv[0]@1");
    }

    /// One push of a vector message: the step it completes, or its error.
    fn push_vector(reader: &mut Reassembler, message: &serde_json::Value) -> Result<Option<Step>, String> {
        // A header without a value reads as empty, as `reassemble_steps`
        // takes it.
        let headers: Vec<(&str, &[u8])> = message["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h[0].as_str().unwrap(),
                    h[1].as_str().unwrap_or_default().as_bytes(),
                )
            })
            .collect();
        let payload = match message.get("raw") {
            Some(raw) => raw.as_str().unwrap().as_bytes().to_vec(),
            None => {
                let ids: Vec<i64> = serde_json::from_value(message["ids"].clone()).unwrap();
                let column = Arc::new(Int64Array::from(ids)) as ArrayRef;
                ipc::encode_stream(&[RecordBatch::try_from_iter([("id", column)]).unwrap()]).unwrap()
            }
        };
        reader.push(
            Some(message["key"].as_str().unwrap().as_bytes()),
            |name| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v),
            Some(&payload),
        )
    }

    /// The vectors both languages read (`schemas/vectors/chunks.json`,
    /// `reassembly`; python/tests/test_reassembly.py holds the client's
    /// `Reassembler` to them).
    #[test]
    fn chunks_reassemble_as_the_shared_vectors() {
        let vectors = crate::messages::vectors::shared("chunks.json");
        let cases = vectors["reassembly"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let name = case["case"].as_str().unwrap();
            let mut reader = Reassembler::new();
            for (i, message) in case["messages"].as_array().unwrap().iter().enumerate() {
                let got = push_vector(&mut reader, message);
                let expect = &message["expect"];
                if let Some(error) = expect.get("error") {
                    let error = error.as_str().unwrap();
                    assert!(
                        got.as_ref().is_err_and(|e| e.contains(error)),
                        "{name}, message {i}: want an error with {error:?}, got {got:?}"
                    );
                    continue;
                }
                let got = got.unwrap_or_else(|e| panic!("{name}, message {i}: {e}"));
                let got = got.map(|s| serde_json::json!({"key": s.key, "ids": ids(&s), "chunks": s.chunks}));
                assert_eq!(got.as_ref(), expect.get("step"), "{name}, message {i}");
            }
            let partial: Vec<serde_json::Value> = reader
                .partial()
                .into_iter()
                .map(|p| serde_json::json!({"key": p.key, "arrived": p.arrived, "count": p.count}))
                .collect();
            assert_eq!(&serde_json::Value::from(partial), &case["partial"], "{name}");
        }
    }
}
