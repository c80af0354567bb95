//! What an evaluation reads: a recorded failed-trajectory topic (or a plain
//! JSONL of trajectories) gathered into GRPO groups the way stage 1 gathers
//! them, and optionally recorded scored rollouts, assembled into steps.

use std::collections::{BTreeMap, HashMap};
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
                topic: m.topic,
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
                topic: path.to_string(),
                partition: 0,
                offset: number as i64,
                key: None,
                headers: vec![],
            },
        ),
    }
}

fn each_record(path: &Path, mut f: impl FnMut(Option<Vec<u8>>, RecordMeta)) -> Result<(), InputError> {
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
#[derive(Default)]
pub struct ScoredInputFile {
    pub steps: Vec<ScoredRows>,
    pub rejected: BTreeMap<String, u64>,
}

pub fn read_scored(path: &Path, limits: DecodeLimits) -> Result<ScoredInputFile, InputError> {
    let mut input = ScoredInputFile::default();
    let mut index: HashMap<(String, i64), usize> = HashMap::new();
    each_record(path, |value, meta| {
        let decoded = match value {
            None => Err("empty".to_string()),
            Some(bytes) => decode_scored(&bytes, &meta, limits).map_err(|r| r.kind.to_string()),
        };
        match decoded {
            Ok(ScoredInput::Rows(rows)) if !rows.is_empty() => {
                let key = (rows.run_id[0].clone(), rows.step[0]);
                let i = *index.entry(key).or_insert_with(|| {
                    input.steps.push(ScoredRows::default());
                    input.steps.len() - 1
                });
                input.steps[i].extend(rows);
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
