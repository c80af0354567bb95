//! Stage 2's decoding: a message of `rl.rollouts.scored` is a JSON
//! `scored_rollout` or `step_end`, or an Arrow IPC stream of scored rows of
//! one step. `eval` decodes recorded scored rollouts with the same code.

use crate::batch::{ipc, ScoredRows, ARROW_STREAM_CONTENT_TYPE};
use crate::kafka::{RecordMeta, Rejected};
use crate::messages::{decode, DecodeLimits, ScoredMessage};

/// One decoded message of `rl.rollouts.scored`.
pub enum ScoredInput {
    /// Rows of one (run_id, step): one JSON row or one Arrow batch.
    Rows(ScoredRows),
    End {
        run_id: String,
        step: i64,
        count: i64,
    },
}

/// Decodes a message: Arrow IPC when its `content-type` header says so or
/// its bytes start with the IPC continuation marker, JSON otherwise.
pub fn decode_scored(bytes: &[u8], meta: &RecordMeta, limits: DecodeLimits) -> Result<ScoredInput, Rejected> {
    let arrow = meta.header("content-type") == Some(ARROW_STREAM_CONTENT_TYPE.as_bytes())
        || bytes.starts_with(&[0xff, 0xff, 0xff, 0xff]);
    if !arrow {
        return match decode::<ScoredMessage>(bytes, limits)? {
            ScoredMessage::ScoredRollout(row) => {
                let mut rows = ScoredRows::default();
                rows.push(&row);
                Ok(ScoredInput::Rows(rows))
            }
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
    let batches = ipc::decode_stream(bytes)
        .map_err(|e| reject("bad_arrow", format!("not an Arrow IPC stream: {e}")))?;
    let mut rows = ScoredRows::default();
    for batch in &batches {
        rows.extend(ScoredRows::from_batch(batch).map_err(|e| reject(e.kind(), e.to_string()))?);
    }
    if rows.is_empty() {
        return Err(reject("empty", "the Arrow stream has no rows".into()));
    }
    let one_step = rows
        .run_id
        .iter()
        .zip(&rows.step)
        .all(|(r, s)| *r == rows.run_id[0] && *s == rows.step[0]);
    if !one_step {
        return Err(reject(
            "mixed_steps",
            "an Arrow message must hold rows of one run_id/step".into(),
        ));
    }
    Ok(ScoredInput::Rows(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arrow_message_that_panics_the_decoder_is_rejected() {
        let bytes = include_bytes!("../../fuzz/regressions/decode_scored-arrow-slice-panic.bin");
        let meta = RecordMeta {
            topic: "rl.rollouts.scored".into(),
            partition: 0,
            offset: 0,
            key: None,
            headers: vec![(
                "content-type".into(),
                ARROW_STREAM_CONTENT_TYPE.as_bytes().to_vec(),
            )],
        };
        let Err(rejected) = decode_scored(bytes, &meta, DecodeLimits::default()) else {
            panic!("decoded");
        };
        assert_eq!(rejected.kind, "bad_arrow");
        assert!(rejected.reason.contains("malformed IPC"), "{}", rejected.reason);
    }
}
