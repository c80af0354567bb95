//! Arrow batching: the Arrow schemas of scored rollouts and advantages,
//! reading scored columns from whatever encoding a producer chose, building
//! batches, and the IPC stream framing used on the wire.

pub mod ipc;

use std::sync::Arc;

use arrow_array::builder::StringDictionaryBuilder;
use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use thiserror::Error;

use crate::messages::ScoredRollout;

/// Content type of Arrow IPC stream payloads (Kafka header `content-type`).
pub const ARROW_STREAM_CONTENT_TYPE: &str = "application/vnd.apache.arrow.stream";

#[derive(Debug, Error)]
pub enum BatchError {
    #[error("column `{0}` is missing")]
    MissingColumn(&'static str),
    #[error("column `{column}` has type {found}, which cannot be read as {wanted}")]
    WrongType {
        column: &'static str,
        found: DataType,
        wanted: &'static str,
    },
    #[error("column `{column}` has {nulls} null value(s); it must have none")]
    Nulls { column: &'static str, nulls: usize },
    #[error("column `{column}` row {row}: {reason}")]
    InvalidValue {
        column: &'static str,
        row: usize,
        reason: String,
    },
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),
}

impl BatchError {
    /// Short kind for DLQ headers and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            BatchError::MissingColumn(_) => "missing_column",
            BatchError::WrongType { .. } => "wrong_type",
            BatchError::Nulls { .. } => "null_values",
            BatchError::InvalidValue { .. } => "invalid_value",
            BatchError::Arrow(_) => "arrow",
        }
    }
}

/// Schema of scored rollouts as stage 2 assembles them: one step per batch,
/// `instance_id` dictionary-encoded so group ids are dense already.
pub fn scored_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("step", DataType::Int64, false),
        Field::new(
            "instance_id",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            false,
        ),
        Field::new("trajectory_id", DataType::Utf8, false),
        Field::new("reward", DataType::Float64, false),
        Field::new("is_hinted", DataType::Boolean, false),
        Field::new("hint_category", DataType::Utf8, true),
    ]))
}

/// Schema of the advantages stage 2 publishes (one IPC stream per step).
pub fn advantages_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("step", DataType::Int64, false),
        Field::new("trajectory_id", DataType::Utf8, false),
        Field::new("instance_id", DataType::Utf8, false),
        Field::new("reward", DataType::Float64, false),
        Field::new("is_hinted", DataType::Boolean, false),
        Field::new("advantage", DataType::Float64, false),
        Field::new("group_mean", DataType::Float64, false),
        Field::new("group_std", DataType::Float64, false),
    ]))
}

/// Scored rollouts, columnar and owned, in input order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScoredRows {
    pub run_id: Vec<String>,
    pub step: Vec<i64>,
    pub instance_id: Vec<String>,
    pub trajectory_id: Vec<String>,
    pub reward: Vec<f64>,
    pub is_hinted: Vec<bool>,
    pub hint_category: Vec<Option<String>>,
}

impl ScoredRows {
    pub fn len(&self) -> usize {
        self.reward.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reward.is_empty()
    }

    pub fn push(&mut self, row: &ScoredRollout) {
        self.run_id.push(row.run_id.clone());
        self.step.push(row.step);
        self.instance_id.push(row.instance_id.clone());
        self.trajectory_id.push(row.trajectory_id.clone());
        self.reward.push(row.reward);
        self.is_hinted.push(row.is_hinted);
        self.hint_category.push(row.hint_category.clone());
    }

    /// Appends every row of `other`.
    pub fn extend(&mut self, other: ScoredRows) {
        self.run_id.extend(other.run_id);
        self.step.extend(other.step);
        self.instance_id.extend(other.instance_id);
        self.trajectory_id.extend(other.trajectory_id);
        self.reward.extend(other.reward);
        self.is_hinted.extend(other.is_hinted);
        self.hint_category.extend(other.hint_category);
    }

    /// The rows at `indices`, in that order.
    pub fn take(&self, indices: &[usize]) -> ScoredRows {
        ScoredRows {
            run_id: indices.iter().map(|&i| self.run_id[i].clone()).collect(),
            step: indices.iter().map(|&i| self.step[i]).collect(),
            instance_id: indices.iter().map(|&i| self.instance_id[i].clone()).collect(),
            trajectory_id: indices.iter().map(|&i| self.trajectory_id[i].clone()).collect(),
            reward: indices.iter().map(|&i| self.reward[i]).collect(),
            is_hinted: indices.iter().map(|&i| self.is_hinted[i]).collect(),
            hint_category: indices.iter().map(|&i| self.hint_category[i].clone()).collect(),
        }
    }

    /// Builds the assembled batch ([`scored_schema`]).
    pub fn to_batch(&self) -> Result<RecordBatch, BatchError> {
        let mut instance = StringDictionaryBuilder::<Int32Type>::new();
        for id in &self.instance_id {
            instance.append(id)?;
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(&self.run_id)),
            Arc::new(Int64Array::from(self.step.clone())),
            Arc::new(instance.finish()),
            Arc::new(StringArray::from_iter_values(&self.trajectory_id)),
            Arc::new(Float64Array::from(self.reward.clone())),
            Arc::new(BooleanArray::from(self.is_hinted.clone())),
            Arc::new(StringArray::from(self.hint_category.clone())),
        ];
        Ok(RecordBatch::try_new(scored_schema(), columns)?)
    }

    /// Reads scored rows from a batch with the scored columns in any usual
    /// encoding: strings plain, large, view or dictionary-encoded; reward f32
    /// or f64; step any integer type. `hint_category` may be absent.
    pub fn from_batch(batch: &RecordBatch) -> Result<ScoredRows, BatchError> {
        let rows = ScoredRows {
            run_id: strings(batch, "run_id")?,
            step: integers(batch, "step")?,
            instance_id: strings(batch, "instance_id")?,
            trajectory_id: strings(batch, "trajectory_id")?,
            reward: floats(batch, "reward")?,
            is_hinted: booleans(batch, "is_hinted")?,
            hint_category: optional_strings(batch, "hint_category")?,
        };
        rows.check()?;
        Ok(rows)
    }

    /// The value rules of the JSON contract, applied to columnar input.
    fn check(&self) -> Result<(), BatchError> {
        let bad = |column, row, reason: &str| BatchError::InvalidValue {
            column,
            row,
            reason: reason.into(),
        };
        for row in 0..self.len() {
            if !self.reward[row].is_finite() {
                return Err(bad("reward", row, "must be finite"));
            }
            if self.step[row] < 0 {
                return Err(bad("step", row, "must be >= 0"));
            }
            if self.instance_id[row].trim().is_empty() {
                return Err(bad("instance_id", row, "must be non-empty"));
            }
            if self.run_id[row].trim().is_empty() {
                return Err(bad("run_id", row, "must be non-empty"));
            }
        }
        Ok(())
    }
}

/// Dense group ids of an assembled batch's `instance_id` column: the
/// dictionary keys themselves when the dictionary has no repeated value,
/// otherwise ids mapped from the strings.
pub fn dense_groups(batch: &RecordBatch, instance_ids: &[String]) -> crate::normalize::DenseGroups {
    use crate::normalize::DenseGroups;
    if let Some(dict) = batch
        .column_by_name("instance_id")
        .and_then(|c| c.as_any().downcast_ref::<DictionaryArray<Int32Type>>())
    {
        if let Some(values) = dict.values().as_any().downcast_ref::<StringArray>() {
            let unique: std::collections::HashSet<&str> = values.iter().flatten().collect();
            if unique.len() == values.len() && dict.keys().null_count() == 0 {
                return DenseGroups::from_dictionary_keys(
                    dict.keys().values().iter().map(|&k| k as u32),
                    values.len(),
                );
            }
        }
    }
    DenseGroups::from_strings(instance_ids.iter().map(String::as_str))
}

fn column<'a>(batch: &'a RecordBatch, name: &'static str) -> Result<&'a ArrayRef, BatchError> {
    batch.column_by_name(name).ok_or(BatchError::MissingColumn(name))
}

fn cast(
    array: &ArrayRef,
    name: &'static str,
    to: &DataType,
    wanted: &'static str,
) -> Result<ArrayRef, BatchError> {
    if !arrow_cast::can_cast_types(array.data_type(), to) {
        return Err(BatchError::WrongType {
            column: name,
            found: array.data_type().clone(),
            wanted,
        });
    }
    let options = arrow_cast::CastOptions {
        safe: false,
        ..Default::default()
    };
    arrow_cast::cast_with_options(array, to, &options).map_err(|_| BatchError::WrongType {
        column: name,
        found: array.data_type().clone(),
        wanted,
    })
}

fn no_nulls(array: &ArrayRef, name: &'static str) -> Result<(), BatchError> {
    match array.null_count() {
        0 => Ok(()),
        nulls => Err(BatchError::Nulls { column: name, nulls }),
    }
}

fn is_string_like(t: &DataType) -> bool {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, v) => is_string_like(v),
        _ => false,
    }
}

fn strings(batch: &RecordBatch, name: &'static str) -> Result<Vec<String>, BatchError> {
    let array = column(batch, name)?;
    no_nulls(array, name)?;
    Ok(optional_strings_of(array, name)?
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect())
}

fn optional_strings(batch: &RecordBatch, name: &'static str) -> Result<Vec<Option<String>>, BatchError> {
    match batch.column_by_name(name) {
        None => Ok(vec![None; batch.num_rows()]),
        Some(array) => optional_strings_of(array, name),
    }
}

fn optional_strings_of(array: &ArrayRef, name: &'static str) -> Result<Vec<Option<String>>, BatchError> {
    if !is_string_like(array.data_type()) {
        return Err(BatchError::WrongType {
            column: name,
            found: array.data_type().clone(),
            wanted: "string",
        });
    }
    let utf8 = cast(array, name, &DataType::Utf8, "string")?;
    let utf8 = utf8
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or(BatchError::MissingColumn(name))?;
    Ok(utf8.iter().map(|v| v.map(str::to_string)).collect())
}

fn integers(batch: &RecordBatch, name: &'static str) -> Result<Vec<i64>, BatchError> {
    let array = column(batch, name)?;
    no_nulls(array, name)?;
    if !array.data_type().is_integer() {
        return Err(BatchError::WrongType {
            column: name,
            found: array.data_type().clone(),
            wanted: "integer",
        });
    }
    let cast = cast(array, name, &DataType::Int64, "integer")?;
    let ints = cast
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or(BatchError::MissingColumn(name))?;
    Ok(ints.values().to_vec())
}

fn floats(batch: &RecordBatch, name: &'static str) -> Result<Vec<f64>, BatchError> {
    let array = column(batch, name)?;
    no_nulls(array, name)?;
    if !matches!(
        array.data_type(),
        DataType::Float16 | DataType::Float32 | DataType::Float64
    ) {
        return Err(BatchError::WrongType {
            column: name,
            found: array.data_type().clone(),
            wanted: "float",
        });
    }
    let cast = cast(array, name, &DataType::Float64, "float")?;
    let floats = cast
        .as_any()
        .downcast_ref::<Float64Array>()
        .ok_or(BatchError::MissingColumn(name))?;
    Ok(floats.values().to_vec())
}

fn booleans(batch: &RecordBatch, name: &'static str) -> Result<Vec<bool>, BatchError> {
    let array = column(batch, name)?;
    no_nulls(array, name)?;
    let bools = array
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| BatchError::WrongType {
            column: name,
            found: array.data_type().clone(),
            wanted: "boolean",
        })?;
    Ok(bools.values().iter().collect())
}
