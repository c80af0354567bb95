//! Stage 2's decoding: a message of `rl.rollouts.scored` is a JSON
//! `scored_rollout` or `step_end`, or an Arrow IPC stream of scored rows of
//! one step. `eval` decodes recorded scored rollouts with the same code.
//!
//! The bytes are untrusted: an Arrow message is measured before its strings
//! are copied (`batch::bound`, under `limits.max_decoded_bytes`), and the
//! whole decoding runs under a panic guard, so that a message that panics
//! any of it is dead-lettered and never takes the worker down.

use bytes::Bytes;

use crate::batch::{bound, ipc, RowKeys, ScoredRows, ARROW_STREAM_CONTENT_TYPE};
use crate::config::LimitsConfig;
use crate::kafka::{RecordMeta, Rejected};
use crate::messages::decode::panic_text;
use crate::messages::{decode, DecodeLimits, ScoredMessage, ScoredRollout};

/// One decoded message of `rl.rollouts.scored`.
pub enum ScoredInput {
    /// Rows of one (run_id, step): one Arrow batch; with its
    /// `instance_id`'s keys when the message is one batch whose column came
    /// dictionary-encoded, without a null key and at least two rows a
    /// value, as trainers send a group's rows ([`RowKeys::of`]).
    Rows(Box<ScoredRows>, Option<RowKeys>),
    /// One JSON row.
    Row(Box<ScoredRollout>),
    End {
        run_id: String,
        step: i64,
        count: i64,
    },
}

impl ScoredInput {
    /// The rows it brings, a JSON row as a batch of one; `None` for a
    /// `step_end`.
    pub fn into_rows(self) -> Option<ScoredRows> {
        match self {
            ScoredInput::Rows(rows, _) => Some(*rows),
            ScoredInput::Row(row) => Some(ScoredRows::from_row(&row)),
            ScoredInput::End { .. } => None,
        }
    }
}

/// What decoding needs to know of a message of `topic` that its headers
/// say is an Arrow IPC stream, at offset 0 of partition 0: for bytes that
/// were not consumed (tests, benches, fuzzing).
pub fn arrow_meta(topic: &str) -> RecordMeta {
    RecordMeta {
        topic: topic.into(),
        partition: 0,
        offset: 0,
        key: None,
        headers: vec![(
            "content-type".into(),
            ARROW_STREAM_CONTENT_TYPE.as_bytes().to_vec(),
        )],
    }
}

/// [`decode_scored_bounded`] under the default `limits.max_decoded_bytes`.
pub fn decode_scored(bytes: &[u8], meta: &RecordMeta, limits: DecodeLimits) -> Result<ScoredInput, Rejected> {
    decode_scored_bounded(bytes, meta, limits, LimitsConfig::default().max_decoded_bytes)
}

/// Decodes a message: Arrow IPC when its `content-type` header says so or
/// its bytes start with the IPC continuation marker, JSON otherwise. An
/// Arrow message whose string columns would decode to more than
/// `max_decoded_bytes` is rejected (`bad_arrow`) before any is copied; a
/// panic anywhere in decoding is a rejection too (`bad_arrow` for Arrow,
/// `decode_panic` for JSON).
pub fn decode_scored_bounded(
    bytes: &[u8],
    meta: &RecordMeta,
    limits: DecodeLimits,
    max_decoded_bytes: usize,
) -> Result<ScoredInput, Rejected> {
    decode_guarded(bytes, None, meta, limits, max_decoded_bytes)
}

/// [`decode_scored_bounded`] of a message's shared bytes: an Arrow stream
/// is read in place where it can be ([`ipc::decode_shared`]), not copied
/// first. What is accepted and refused is the same.
pub fn decode_scored_shared(
    payload: &Bytes,
    meta: &RecordMeta,
    limits: DecodeLimits,
    max_decoded_bytes: usize,
) -> Result<ScoredInput, Rejected> {
    decode_guarded(payload, Some(payload), meta, limits, max_decoded_bytes)
}

fn decode_guarded(
    bytes: &[u8],
    shared: Option<&Bytes>,
    meta: &RecordMeta,
    limits: DecodeLimits,
    max_decoded_bytes: usize,
) -> Result<ScoredInput, Rejected> {
    let arrow = meta.header("content-type") == Some(ARROW_STREAM_CONTENT_TYPE.as_bytes())
        || bytes.starts_with(&[0xff, 0xff, 0xff, 0xff]);
    // Decoding only reads `bytes` and builds new values: nothing is left
    // half-changed when it unwinds.
    std::panic::catch_unwind(|| decode_unguarded(bytes, shared, arrow, limits, max_decoded_bytes))
        .unwrap_or_else(|panic| {
            let what = panic_text(panic.as_ref()).unwrap_or("panic");
            Err(Rejected {
                kind: if arrow { "bad_arrow" } else { "decode_panic" },
                reason: format!("decoding the message panicked: {what}"),
            })
        })
}

fn decode_unguarded(
    bytes: &[u8],
    shared: Option<&Bytes>,
    arrow: bool,
    limits: DecodeLimits,
    max_decoded_bytes: usize,
) -> Result<ScoredInput, Rejected> {
    if !arrow {
        return match decode::<ScoredMessage>(bytes, limits)? {
            ScoredMessage::ScoredRollout(row) => Ok(ScoredInput::Row(Box::new(row))),
            ScoredMessage::StepEnd(end) => Ok(ScoredInput::End {
                run_id: end.run_id,
                step: end.step,
                count: end.count,
            }),
        };
    }
    if bytes.len() > limits.max_bytes {
        return Err(crate::messages::DecodeError::TooLarge {
            size: bytes.len(),
            limit: limits.max_bytes,
        }
        .into());
    }
    let reject = |kind: &'static str, reason: String| Rejected { kind, reason };
    let batches = match shared {
        Some(shared) => ipc::decode_shared(shared),
        None => ipc::decode_stream(bytes),
    }
    .map_err(|e| reject("bad_arrow", format!("not an Arrow IPC stream: {e}")))?;
    bound::check_decoded_size(&batches, max_decoded_bytes).map_err(|e| reject(e.kind(), e.to_string()))?;
    let rows = ScoredRows::from_batches(&batches).map_err(|e| reject(e.kind(), e.to_string()))?;
    if rows.is_empty() {
        return Err(reject("empty", "the Arrow stream has no rows".into()));
    }
    let (run, step) = (&rows.run_id[0], rows.step[0]);
    let one_step = rows.step.iter().all(|&s| s == step) && rows.run_id.iter().all(|r| r == run);
    if !one_step {
        return Err(reject(
            "mixed_steps",
            "an Arrow message must hold rows of one run_id/step".into(),
        ));
    }
    let keys = match batches.as_slice() {
        [batch] => RowKeys::of(batch, "instance_id"),
        _ => None,
    };
    Ok(ScoredInput::Rows(Box::new(rows), keys))
}

#[cfg(test)]
mod tests {
    use arrow_array::RecordBatch;

    use super::*;
    use crate::batch::hostile;

    const TOPIC: &str = "rl.rollouts.scored";

    #[test]
    fn views_of_one_buffer_are_rejected_as_bad_arrow_before_they_are_copied() {
        let bytes = hostile::amplified_views_stream("r", 1).unwrap();
        assert!(bytes.len() < 900_000, "{} bytes", bytes.len());
        let Err(rejected) = decode_scored(&bytes, &arrow_meta(TOPIC), DecodeLimits::default()) else {
            panic!("decoded");
        };
        assert_eq!(rejected.kind, "bad_arrow");
        assert!(rejected.reason.contains("`trajectory_id`"), "{}", rejected.reason);
        assert!(
            rejected.reason.contains("max_decoded_bytes"),
            "{}",
            rejected.reason
        );
    }

    #[test]
    fn dictionary_keys_repeating_one_huge_value_are_rejected_as_bad_arrow() {
        let bytes = hostile::amplified_dictionary_stream("r", 1).unwrap();
        let Err(rejected) = decode_scored(&bytes, &arrow_meta(TOPIC), DecodeLimits::default()) else {
            panic!("decoded");
        };
        assert_eq!(rejected.kind, "bad_arrow");
        assert!(rejected.reason.contains("`instance_id`"), "{}", rejected.reason);
    }

    /// The fuzz seeds of `fuzz/fuzz_targets/decode_arrow.rs` (which decodes
    /// under 4 MiB): these amplification cases, written again when
    /// `HINTSTREAM_WRITE_FUZZ_SEEDS` is set.
    #[test]
    fn the_arrow_fuzz_seeds_are_the_amplification_cases() {
        use std::sync::Arc;
        let seeds = [
            (
                "views-of-one-buffer.bin",
                hostile::scored_stream_with(
                    "r",
                    1,
                    "trajectory_id",
                    Arc::new(hostile::amplified_views(1000, 8192).unwrap()),
                ),
            ),
            (
                "dictionary-of-one-value.bin",
                hostile::scored_stream_with(
                    "r",
                    1,
                    "instance_id",
                    Arc::new(hostile::amplified_dictionary(1000, 8192).unwrap()),
                ),
            ),
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/decode_arrow");
        for (name, bytes) in seeds {
            let bytes = bytes.unwrap();
            let path = dir.join(name);
            if std::env::var_os("HINTSTREAM_WRITE_FUZZ_SEEDS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &bytes).unwrap();
            }
            assert_eq!(
                std::fs::read(&path).unwrap(),
                bytes,
                "{name} is stale: set HINTSTREAM_WRITE_FUZZ_SEEDS"
            );
            let Err(rejected) =
                decode_scored_bounded(&bytes, &arrow_meta(TOPIC), DecodeLimits::default(), 4 << 20)
            else {
                panic!("{name} decoded");
            };
            assert_eq!(rejected.kind, "bad_arrow", "{name}");
        }
    }

    #[test]
    fn a_batch_of_a_groups_rows_side_by_side_keeps_its_keys_and_others_none() {
        use crate::batch::synthetic::{in_group_order, synthetic_step};
        let grouped = in_group_order(&synthetic_step(64, 8, "r", 1, 5));
        let batch = grouped.to_batch().unwrap();
        let decode = |batches: &[RecordBatch]| {
            let bytes = ipc::encode_stream(batches).unwrap();
            match decode_scored(&bytes, &arrow_meta(TOPIC), DecodeLimits::default()) {
                Ok(ScoredInput::Rows(rows, keys)) => (rows, keys),
                _ => panic!("rows decode"),
            }
        };
        let (rows, keys) = decode(std::slice::from_ref(&batch));
        let keys = keys.expect("8 rows a value");
        assert_eq!((keys.keys.len(), keys.values), (64, 8));
        for i in 0..64 {
            for j in 0..64 {
                assert_eq!(
                    keys.keys[i] == keys.keys[j],
                    rows.instance_id[i] == rows.instance_id[j],
                    "rows {i} and {j}"
                );
            }
        }
        let (halves, keys) = decode(&[batch.slice(0, 32), batch.slice(32, 32)]);
        assert_eq!((halves.len(), keys), (64, None), "two batches");
        let a_row_a_group: Vec<usize> = (0..8).map(|group| group * 8).collect();
        let (_, keys) = decode(&[grouped.take(&a_row_a_group).to_batch().unwrap()]);
        assert_eq!(keys, None, "a value a row: the hash a row");
    }

    #[test]
    fn a_small_amplification_under_the_limit_decodes_and_a_lower_limit_refuses_it() {
        let views = hostile::amplified_views(8, 1000).unwrap();
        let bytes = hostile::scored_stream_with("r", 1, "trajectory_id", std::sync::Arc::new(views)).unwrap();
        let Ok(ScoredInput::Rows(rows, _)) =
            decode_scored(&bytes, &arrow_meta(TOPIC), DecodeLimits::default())
        else {
            panic!("not decoded");
        };
        assert_eq!(rows.len(), 8);
        let Err(rejected) = decode_scored_bounded(&bytes, &arrow_meta(TOPIC), DecodeLimits::default(), 4000)
        else {
            panic!("decoded over the limit");
        };
        assert_eq!(rejected.kind, "bad_arrow");
    }

    #[test]
    fn optional_columns_of_nulls_only_dictionary_encoded_with_no_values_decode() {
        // pyarrow dictionary-encodes a column of nulls only with no values
        // at all (`pa.array([None] * n).dictionary_encode()`): a step in
        // which no row was hinted, written with categorical hint columns.
        use std::sync::Arc;

        use arrow_array::types::Int32Type;
        use arrow_array::{
            ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int32Array, Int64Array, RecordBatch,
            StringArray,
        };
        let nulls = || -> ArrayRef {
            Arc::new(
                DictionaryArray::<Int32Type>::try_new(
                    Int32Array::from(vec![None; 4]),
                    Arc::new(StringArray::from(Vec::<&str>::new())),
                )
                .unwrap(),
            )
        };
        let batch = RecordBatch::try_from_iter([
            ("run_id", Arc::new(StringArray::from(vec!["r"; 4])) as ArrayRef),
            ("step", Arc::new(Int64Array::from(vec![3; 4]))),
            (
                "instance_id",
                Arc::new(StringArray::from(vec!["a", "a", "b", "b"])),
            ),
            (
                "trajectory_id",
                Arc::new(StringArray::from(vec!["t0", "t1", "t2", "t3"])),
            ),
            ("reward", Arc::new(Float64Array::from(vec![1.0, 0.0, 0.5, 0.0]))),
            ("is_hinted", Arc::new(BooleanArray::from(vec![false; 4]))),
            ("hint_category", nulls()),
            ("hint_id", nulls()),
        ])
        .unwrap();
        let bytes = ipc::encode_stream(&[batch]).unwrap();
        let decoded = decode_scored(&bytes, &arrow_meta(TOPIC), DecodeLimits::default());
        let Ok(ScoredInput::Rows(rows, _)) = decoded else {
            panic!("refused: {:?}", decoded.err());
        };
        assert_eq!(rows.len(), 4);
        assert_eq!(rows.hint_category, vec![None; 4]);
        assert!((0..4).all(|row| rows.hint_id(row).is_none()));
    }

    #[test]
    fn an_arrow_message_that_panics_the_decoder_is_rejected() {
        let bytes = include_bytes!("../../fuzz/regressions/decode_scored-arrow-slice-panic.bin");
        let Err(rejected) = decode_scored(bytes, &arrow_meta(TOPIC), DecodeLimits::default()) else {
            panic!("decoded");
        };
        assert_eq!(rejected.kind, "bad_arrow");
        assert!(rejected.reason.contains("malformed IPC"), "{}", rejected.reason);
    }
}
