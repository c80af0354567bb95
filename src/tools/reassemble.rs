//! Reading chunked steps back: the messages of an advantages topic (live or
//! recorded by `hintstream record`) put together into whole steps, never a
//! partial one.
//!
//! The rules are the Python client's (`TrainerClient.wait_advantages`), so
//! both readers see the same steps:
//!
//! - a step's chunks are gathered by message key (`run_id/step`);
//!   `batch::chunk::ChunkInfo::from_headers` reads where a message sits (no
//!   chunk headers: a whole step, chunk 0 of 1);
//! - a chunk with a different `chunks` or `rows` than the chunks gathered
//!   so far for its key starts the set over (the step was republished in
//!   another shape); a chunk index seen before keeps its first copy (a
//!   republished step's chunks are equal to the first copy's);
//! - once all `chunks` are in, they are concatenated in index order; when
//!   the rows differ from the `rows` header the step is discarded as
//!   unreadable;
//! - a message whose headers, key or Arrow payload cannot be read is
//!   reported and skipped.

use std::collections::HashMap;

use arrow_array::RecordBatch;

use super::RecordedMessage;
use crate::batch::chunk::ChunkInfo;
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

/// The chunks of one step gathered so far.
struct ChunkSet {
    count: usize,
    rows: Option<usize>,
    parts: HashMap<usize, Vec<RecordBatch>>,
}

/// Gathers messages into whole steps, one message at a time, in the order
/// they were read.
#[derive(Default)]
pub struct Reassembler {
    partial: HashMap<String, ChunkSet>,
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
        let info = ChunkInfo::from_headers(header).map_err(|e| e.to_string())?;
        let batches = ipc::decode_stream(payload.unwrap_or_default())
            .map_err(|e| format!("not an Arrow IPC stream: {e}"))?;
        let set = match self.partial.get_mut(&key) {
            Some(set) if set.count == info.count && set.rows == info.rows => set,
            _ => self
                .partial
                .entry(key.clone())
                .insert_entry(ChunkSet {
                    count: info.count,
                    rows: info.rows,
                    parts: HashMap::new(),
                })
                .into_mut(),
        };
        set.parts.entry(info.index).or_insert(batches);
        if set.parts.len() < set.count {
            return Ok(None);
        }
        let Some(mut set) = self.partial.remove(&key) else {
            return Ok(None);
        };
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
            .map(|(key, set)| Partial {
                key: key.clone(),
                arrived: set.parts.len(),
                count: set.count,
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
                key: String::from_utf8_lossy(m.key_bytes().unwrap_or_default()).into_owned(),
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
    use crate::batch::chunk::{chunk_header_values, encode_chunks};
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
}
