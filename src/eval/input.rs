//! What an evaluation reads: a recorded failed-trajectory topic (or a plain
//! JSONL of trajectories) gathered into GRPO groups the way stage 1 gathers
//! them, and optionally recorded scored rollouts, assembled into steps.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use thiserror::Error;

use crate::advantages::decode::{decode_scored, ScoredInput};
use crate::batch::ScoredRows;
use crate::hints::group::best_index;
use crate::kafka::RecordMeta;
use crate::messages::{decode, DecodeLimits, FailedTrajectory};
use crate::tools::RecordedMessage;

#[derive(Debug, Error)]
pub enum InputError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// One gathered group; `best` indexes the trajectory the hint is built from.
pub struct Group {
    pub key: String,
    pub members: Vec<(FailedTrajectory, RecordMeta)>,
    pub best: usize,
}

impl Group {
    pub fn best(&self) -> &(FailedTrajectory, RecordMeta) {
        &self.members[self.best]
    }
}

/// The groups of a file, in order of first appearance, and what was rejected
/// (by decode error kind), as stage 1 would have dead-lettered it.
#[derive(Default)]
pub struct FailedInput {
    pub trajectories: u64,
    pub groups: Vec<Group>,
    pub rejected: BTreeMap<String, u64>,
}

/// One line of an input file as a Kafka record: a `hintstream record` line,
/// or any other line taken as the value itself (a plain JSONL of messages).
fn record_of(line: &str, path: &str, number: usize) -> (Option<Vec<u8>>, RecordMeta) {
    match RecordedMessage::from_line(line) {
        Ok(m) => {
            let headers = m
                .headers
                .into_iter()
                .map(|h| (h.key, h.value.bytes.unwrap_or_default()))
                .collect();
            let meta = RecordMeta {
                topic: m.topic.into(),
                partition: m.partition,
                offset: m.offset,
                key: m.key.bytes,
                headers,
            };
            (m.value.bytes, meta)
        }
        Err(_) => (
            Some(line.as_bytes().to_vec()),
            RecordMeta {
                topic: path.into(),
                partition: 0,
                offset: number as i64,
                key: None,
                headers: vec![],
            },
        ),
    }
}

pub(super) fn each_record(
    path: &Path,
    mut f: impl FnMut(Option<Vec<u8>>, RecordMeta),
) -> Result<(), InputError> {
    let name = path.display().to_string();
    let read = |source| InputError::Read {
        path: name.clone(),
        source,
    };
    crate::jsonl::for_each_line(path, read, |number, line| {
        let (value, meta) = record_of(line, &name, number);
        f(value, meta);
        Ok(())
    })
}

/// Reads and groups failed trajectories.
pub fn read_failed(path: &Path, limits: DecodeLimits) -> Result<FailedInput, InputError> {
    let mut input = FailedInput::default();
    let mut index: HashMap<String, usize> = HashMap::new();
    each_record(path, |value, meta| {
        input.trajectories += 1;
        let decoded = match value {
            None => Err("empty".to_string()),
            Some(bytes) => decode::<FailedTrajectory>(&bytes, limits).map_err(|e| e.kind().to_string()),
        };
        let t = match decoded {
            Ok(t) => t,
            Err(kind) => {
                *input.rejected.entry(kind).or_default() += 1;
                return;
            }
        };
        let key = t.group_key();
        let i = *index.entry(key.clone()).or_insert_with(|| {
            input.groups.push(Group {
                key,
                members: vec![],
                best: 0,
            });
            input.groups.len() - 1
        });
        input.groups[i].members.push((t, meta));
    })?;
    for g in &mut input.groups {
        g.best = best_index(&g.members, |(t, _)| t.reward).unwrap_or(0);
    }
    Ok(input)
}

/// Recorded scored rollouts, one `ScoredRows` per (run_id, step) in order of
/// first appearance; JSON rows and Arrow batches alike, decoded by stage 2.
/// A step may come in any number of messages (Arrow chunks, chunk headers
/// or not); as in stage 2, a row whose `trajectory_id` its step already has
/// is a duplicate (a republished message) and is dropped.
#[derive(Default)]
pub struct ScoredInputFile {
    pub steps: Vec<ScoredRows>,
    pub rejected: BTreeMap<String, u64>,
}

pub fn read_scored(path: &Path, limits: DecodeLimits) -> Result<ScoredInputFile, InputError> {
    let mut input = ScoredInputFile::default();
    let mut index: HashMap<(String, i64), (usize, HashSet<String>)> = HashMap::new();
    each_record(path, |value, meta| {
        let decoded = match value {
            None => Err("empty".to_string()),
            Some(bytes) => decode_scored(&bytes, &meta, limits).map_err(|r| r.kind.to_string()),
        };
        match decoded.map(ScoredInput::into_rows) {
            Ok(Some(rows)) if !rows.is_empty() => {
                let key = (rows.run_id[0].to_string(), rows.step[0]);
                let (i, seen) = index.entry(key).or_insert_with(|| {
                    input.steps.push(ScoredRows::default());
                    (input.steps.len() - 1, HashSet::new())
                });
                let fresh: Vec<usize> = (0..rows.len())
                    .filter(|&r| seen.insert(rows.trajectory_id[r].to_string()))
                    .collect();
                let rows = if fresh.len() == rows.len() {
                    rows
                } else {
                    rows.take(&fresh)
                };
                input.steps[*i].extend(rows);
            }
            Ok(_) => {}
            Err(kind) => *input.rejected.entry(kind).or_default() += 1,
        }
    })?;
    Ok(input)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trajectory(instance: &str, id: &str, reward: f64) -> String {
        serde_json::json!({
            "schema_version": 1, "run_id": "r", "step": 1, "instance_id": instance,
            "trajectory_id": id, "task_prompt": "p", "chat_history": [], "reward": reward,
            "group_size": 2
        })
        .to_string()
    }

    #[test]
    fn a_step_recorded_in_arrow_chunks_is_read_whole() {
        use crate::batch::chunk::{chunk_header_values, encode_chunks};
        use crate::tools::recorded::{Bytes, RecordedHeader};
        let mut rows = ScoredRows::default();
        for i in 0..3_000 {
            rows.push(&crate::messages::ScoredRollout::unhinted(
                "r",
                4,
                &format!("g{}", i / 8),
                &format!("t{i}"),
                f64::from(i % 3),
            ));
        }
        let chunks = encode_chunks(&rows.to_batch().unwrap(), 16 * 1024).unwrap();
        assert!(chunks.len() > 2);
        let header = |key: &str, value: &str| RecordedHeader {
            key: key.into(),
            value: Bytes::new(Some(value.as_bytes().to_vec())),
        };
        let mut lines: Vec<String> = chunks
            .chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut headers = vec![header("content-type", crate::batch::ARROW_STREAM_CONTENT_TYPE)];
                for (k, v) in chunk_header_values(i, chunks.len(), rows.len()) {
                    headers.push(header(k, &v));
                }
                RecordedMessage {
                    topic: "rl.rollouts.scored".into(),
                    partition: 0,
                    offset: i as i64,
                    timestamp: None,
                    key: Bytes::new(Some(b"r/4".to_vec())),
                    value: Bytes::new(Some(c.payload.clone())),
                    headers,
                }
                .to_line()
            })
            .collect();
        lines
            .push(r#"{"type":"step_end","schema_version":1,"run_id":"r","step":4,"count":3000}"#.to_string());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scored.jsonl");
        std::fs::write(&path, lines.join("\n")).unwrap();
        let input = read_scored(&path, DecodeLimits::default()).unwrap();
        assert!(input.rejected.is_empty(), "{:?}", input.rejected);
        assert_eq!(input.steps.len(), 1);
        assert_eq!(input.steps[0], rows, "every row, in order");
        // A chunk recorded twice (republished): its rows count once.
        let again = lines[1].clone();
        lines.insert(2, again);
        std::fs::write(&path, lines.join("\n")).unwrap();
        let input = read_scored(&path, DecodeLimits::default()).unwrap();
        assert_eq!(input.steps[0], rows, "no row twice");
    }

    #[test]
    fn groups_plain_and_recorded_lines_and_counts_rejects() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        let recorded = RecordedMessage {
            topic: "rl.trajectories.failed".into(),
            partition: 3,
            offset: 7,
            timestamp: None,
            key: crate::tools::recorded::Bytes::new(Some(b"k".to_vec())),
            value: crate::tools::recorded::Bytes::new(Some(trajectory("a", "a2", 0.5).into_bytes())),
            headers: vec![],
        };
        let lines = [
            trajectory("a", "a1", 0.0),
            "{not json".to_string(),
            recorded.to_line(),
            trajectory("b", "b1", 0.0),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let input = read_failed(&path, DecodeLimits::default()).unwrap();
        assert_eq!(input.trajectories, 4);
        assert_eq!(input.rejected.get("not_json"), Some(&1));
        assert_eq!(input.groups.len(), 2);
        let (best, meta) = input.groups[0].best();
        assert_eq!(best.trajectory_id, "a2", "the highest reward is the best");
        assert_eq!((meta.partition, meta.offset), (3, 7));
    }
}
