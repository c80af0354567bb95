//! `hintstream advantages compute`: advantages for a file, without Kafka.
//! Input is JSONL of `scored_rollout` rows (rows of one run_id/step form one
//! batch; `step_end` lines are skipped) or Arrow IPC (`.arrow`, file or stream
//! format) with the scored columns in any usual encoding. Output is JSONL
//! `{run_id, step, trajectory_id, instance_id, advantage}` in input order, or
//! Arrow IPC (file format, the advantages schema) when its name ends in
//! `.arrow`.

use std::io::{BufWriter, Write};
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_ipc::writer::FileWriter;
use serde::Serialize;
use thiserror::Error;

use super::compute::{advantages_batch, check_finite, compute_rows, ComputeError};
use crate::batch::{ipc, BatchError, ScoredRows};
use crate::messages::{decode, DecodeLimits, ScoredMessage};
use crate::normalize::{AdvantageOptions, Advantages, Device, HintedWeight};

#[derive(Debug, Error)]
pub enum OfflineError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
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
    #[error("{path}: not an Arrow IPC file or stream: {reason}")]
    BadArrow { path: String, reason: String },
    #[error("{path}: {source}")]
    Columns {
        path: String,
        #[source]
        source: BatchError,
    },
    #[error(transparent)]
    Compute(#[from] ComputeError),
}

/// One output line of the JSONL format.
#[derive(Serialize)]
struct OutputRow<'a> {
    run_id: &'a str,
    step: i64,
    trajectory_id: &'a str,
    instance_id: &'a str,
    advantage: f64,
    /// `normalize.hinted_weight = "ratio"` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    weight: Option<f64>,
}

fn is_arrow(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("arrow"))
}

/// Reads, computes and writes. Returns the number of rows.
pub fn compute_file(
    input: &Path,
    output: &Path,
    options: &AdvantageOptions,
    device: Device,
    hinted_weight: HintedWeight,
    limits: DecodeLimits,
) -> Result<usize, OfflineError> {
    let rows = if is_arrow(input) {
        read_arrow(input)?
    } else {
        read_jsonl(input, limits)?
    };
    let advantages = compute_rows(&rows, options, device)?;
    // The last check before the file is written (none is, when it fails).
    check_finite(&advantages).map_err(|source| OfflineError::Columns {
        path: output.display().to_string(),
        source,
    })?;
    if is_arrow(output) {
        write_arrow(output, &rows, &advantages, hinted_weight)?;
    } else {
        write_jsonl(output, &rows, &advantages, hinted_weight)?;
    }
    Ok(rows.len())
}

/// Reads `scored_rollout` rows from JSONL; `step_end` lines are skipped.
pub fn read_jsonl(path: &Path, limits: DecodeLimits) -> Result<ScoredRows, OfflineError> {
    let name = path.display().to_string();
    let mut rows = ScoredRows::default();
    let io_error = |source| OfflineError::Read {
        path: name.clone(),
        source,
    };
    crate::jsonl::for_each_line(path, io_error, |number, line| {
        // Rows may omit `type`: in a file they are all scored rollouts.
        let message = match decode::<ScoredMessage>(line.as_bytes(), limits) {
            Err(crate::messages::DecodeError::MissingField { field }) if field == "type" => {
                decode::<crate::messages::ScoredRollout>(line.as_bytes(), limits)
                    .map(ScoredMessage::ScoredRollout)
            }
            other => other,
        };
        match message {
            Ok(ScoredMessage::ScoredRollout(row)) => rows.push(&row),
            Ok(ScoredMessage::StepEnd(_)) => {}
            Err(e) => {
                return Err(OfflineError::BadLine {
                    path: name.clone(),
                    line: number,
                    reason: e.to_string(),
                })
            }
        }
        Ok(())
    })?;
    Ok(rows)
}

/// Reads every batch of an Arrow IPC file (or stream) into rows.
pub fn read_arrow(path: &Path) -> Result<ScoredRows, OfflineError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| OfflineError::Read {
        path: name.clone(),
        source,
    })?;
    let bad = |e: arrow_schema::ArrowError| OfflineError::BadArrow {
        path: name.clone(),
        reason: e.to_string(),
    };
    let batches: Vec<RecordBatch> = if bytes.starts_with(b"ARROW1") {
        ipc::decode_file(&bytes).map_err(bad)?
    } else {
        ipc::decode_stream(&bytes).map_err(bad)?
    };
    ScoredRows::from_batches(&batches).map_err(|source| OfflineError::Columns { path: name, source })
}

fn write_jsonl(
    path: &Path,
    rows: &ScoredRows,
    advantages: &Advantages,
    hinted_weight: HintedWeight,
) -> Result<(), OfflineError> {
    let name = path.display().to_string();
    let err = |source| OfflineError::Write {
        path: name.clone(),
        source,
    };
    let mut out = BufWriter::new(std::fs::File::create(path).map_err(err)?);
    for i in 0..rows.len() {
        let row = OutputRow {
            run_id: &rows.run_id[i],
            step: rows.step[i],
            trajectory_id: &rows.trajectory_id[i],
            instance_id: &rows.instance_id[i],
            advantage: advantages.advantage[i],
            weight: (hinted_weight == HintedWeight::Ratio).then(|| rows.ratio(i).unwrap_or(1.0)),
        };
        // A struct of strings and finite numbers (checked above) always
        // serialises.
        let line = serde_json::to_string(&row).unwrap_or_default();
        writeln!(out, "{line}").map_err(err)?;
    }
    out.flush().map_err(err)
}

fn write_arrow(
    path: &Path,
    rows: &ScoredRows,
    advantages: &Advantages,
    hinted_weight: HintedWeight,
) -> Result<(), OfflineError> {
    let name = path.display().to_string();
    let io = |e: arrow_schema::ArrowError| OfflineError::Write {
        path: name.clone(),
        source: std::io::Error::other(e.to_string()),
    };
    let batch =
        advantages_batch(rows, advantages, hinted_weight).map_err(|source| OfflineError::Columns {
            path: name.clone(),
            source,
        })?;
    let file = std::fs::File::create(path).map_err(|source| OfflineError::Write {
        path: name.clone(),
        source,
    })?;
    let mut writer = FileWriter::try_new(BufWriter::new(file), &batch.schema()).map_err(io)?;
    writer.write(&batch).map_err(io)?;
    writer.finish().map_err(io)
}
