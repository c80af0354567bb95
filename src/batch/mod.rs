//! Arrow batching: the Arrow schemas of scored rollouts and advantages,
//! reading scored columns from whatever encoding a producer chose, building
//! batches, the IPC stream framing used on the wire, and chunked steps (a
//! step as several IPC messages under a byte bound), the decoded size of
//! untrusted batches (`bound`), and synthetic steps for benchmarks (and
//! hostile ones for tests).

pub mod bound;
pub mod chunk;
mod dictionary;
pub mod hostile;
pub mod ipc;
pub mod strings;
pub mod synthetic;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int32Array, Int64Array, RecordBatch,
    StringArray, UInt32Array,
};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use thiserror::Error;

pub use dictionary::RowKeys;
pub use strings::Strings;

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
    /// Decoding would copy more bytes than allowed (`batch::bound`).
    #[error(
        "column `{column}` would decode to {bytes} bytes (with the columns before it), over \
         limits.max_decoded_bytes = {limit}"
    )]
    DecodedTooLarge {
        column: &'static str,
        bytes: u64,
        limit: usize,
    },
    /// An output value that is not finite, found by the last check before
    /// publication: it is never published.
    #[error("column `{column}` row {row} is {value}; a value that is not finite is never published")]
    NonFinite {
        column: &'static str,
        row: usize,
        value: f64,
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
            BatchError::DecodedTooLarge { .. } => "bad_arrow",
            BatchError::NonFinite { .. } => "non_finite_output",
            BatchError::Arrow(_) => "arrow",
        }
    }
}

/// The optional column of response lengths in tokens (≥ 1; read by
/// `reinforce_pp`): any integer type on input, `UInt32` when this crate
/// writes it, which it does only for steps where a row has a length other
/// than 1. A batch without it has length 1 on every row; nulls read as 1.
pub const RESPONSE_LENGTH: &str = "response_length";

/// The optional columns of the hinted rows' log-probs (issue 31): any float
/// type on input, nullable `Float64` when this crate writes them, which it
/// does only for steps where a row has one. A row with a value must have a
/// non-null [`RESPONSE_LENGTH`].
pub const LOGPROB_HINTED: &str = "logprob_hinted";
/// See [`LOGPROB_HINTED`].
pub const LOGPROB_UNHINTED: &str = "logprob_unhinted";

/// Schema of scored rollouts as stage 2 assembles them: one step per batch,
/// `instance_id` dictionary-encoded so group ids are dense already. A step
/// with response lengths adds the [`RESPONSE_LENGTH`] column last.
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
        Field::new("hint_id", DataType::Utf8, true),
    ]))
}

/// Schema of the advantages stage 2 publishes (each chunk of a step is one
/// IPC stream of it: `chunk`).
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
    pub run_id: Strings,
    pub step: Vec<i64>,
    pub instance_id: Strings,
    pub trajectory_id: Strings,
    pub reward: Vec<f64>,
    pub is_hinted: Vec<bool>,
    pub hint_category: Vec<Option<String>>,
    /// The hint each row ran with. May be shorter than the other columns:
    /// rows past its end have none (so steps without hint ids, and code that
    /// fills the columns one by one without this one, cost nothing), and it
    /// never ends with `None`, so that equal rows compare equal. Read it with
    /// [`ScoredRows::hint_id`].
    pub hint_id: Vec<Option<String>>,
    /// Each row's response length in tokens (≥ 1). Like `hint_id`, may be
    /// shorter than the other columns (rows past its end have length 1) and
    /// never ends with a 1. Read it with [`ScoredRows::response_length`].
    pub response_length: Vec<u32>,
    /// Each row's `logprob_hinted`, in `hint_id`'s short form (rows past its
    /// end have none; never ends with `None`).
    pub logprob_hinted: Vec<Option<f64>>,
    /// Each row's `logprob_unhinted`, in the same form.
    pub logprob_unhinted: Vec<Option<f64>>,
}

impl ScoredRows {
    pub fn len(&self) -> usize {
        self.reward.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reward.is_empty()
    }

    /// The hint row `row` ran with, if any.
    pub fn hint_id(&self, row: usize) -> Option<&str> {
        self.hint_id.get(row).and_then(Option::as_deref)
    }

    /// Row `row`'s response length (1 when it has none).
    pub fn response_length(&self, row: usize) -> u32 {
        self.response_length.get(row).copied().unwrap_or(1)
    }

    /// Row `row`'s `(logprob_hinted, logprob_unhinted)` when it is hinted
    /// and carries both (validation saw to its length).
    pub fn logprobs(&self, row: usize) -> Option<(f64, f64)> {
        if !self.is_hinted.get(row).copied().unwrap_or(false) {
            return None;
        }
        let hinted = self.logprob_hinted.get(row).copied().flatten()?;
        let unhinted = self.logprob_unhinted.get(row).copied().flatten()?;
        Some((hinted, unhinted))
    }

    /// ω of row `row` ([`crate::normalize::offpolicy::ratio`]): a hinted
    /// row with both log-probs; `None` otherwise.
    pub fn ratio(&self, row: usize) -> Option<f64> {
        let (hinted, unhinted) = self.logprobs(row)?;
        Some(crate::normalize::offpolicy::ratio(
            hinted,
            unhinted,
            self.response_length(row),
        ))
    }

    /// ρ of row `row` ([`crate::normalize::offpolicy::reliance`]), as
    /// [`ScoredRows::ratio`].
    pub fn reliance(&self, row: usize) -> Option<f64> {
        let (hinted, unhinted) = self.logprobs(row)?;
        Some(crate::normalize::offpolicy::reliance(
            hinted,
            unhinted,
            self.response_length(row),
        ))
    }

    /// Whether any row carries a log-prob.
    pub fn has_logprobs(&self) -> bool {
        !self.logprob_hinted.is_empty() || !self.logprob_unhinted.is_empty()
    }

    /// One row, as a batch of its own.
    pub fn from_row(row: &ScoredRollout) -> Self {
        let mut rows = ScoredRows::default();
        rows.push(row);
        rows
    }

    /// Row `row` as the `scored_rollout` [`ScoredRows::push`] takes: a
    /// response length of 1 (as a row without one is stored) comes back as
    /// none.
    pub fn rollout(&self, row: usize) -> ScoredRollout {
        let short = |column: &[Option<f64>]| column.get(row).copied().flatten();
        ScoredRollout {
            schema_version: i64::from(crate::messages::SCHEMA_VERSION),
            run_id: self.run_id[row].to_string(),
            step: self.step[row],
            instance_id: self.instance_id[row].to_string(),
            trajectory_id: self.trajectory_id[row].to_string(),
            reward: self.reward[row],
            is_hinted: self.is_hinted[row],
            hint_category: self.hint_category[row].clone(),
            hint_id: self.hint_id(row).map(str::to_string),
            response_length: Some(self.response_length(row)).filter(|&l| l > 1).map(i64::from),
            logprob_hinted: short(&self.logprob_hinted),
            logprob_unhinted: short(&self.logprob_unhinted),
        }
    }

    /// Appends one row. A `response_length` outside 1..=u32::MAX (which
    /// [`ScoredRollout`]'s validation rejects) is stored as 1.
    pub fn push(&mut self, row: &ScoredRollout) {
        if let Some(id) = &row.hint_id {
            self.hint_id.resize(self.len(), None);
            self.hint_id.push(Some(id.clone()));
        }
        for (column, value) in [
            (&mut self.logprob_hinted, row.logprob_hinted),
            (&mut self.logprob_unhinted, row.logprob_unhinted),
        ] {
            if value.is_some() {
                column.resize(self.reward.len(), None);
                column.push(value);
            }
        }
        match row.response_length.and_then(|l| u32::try_from(l).ok()) {
            Some(length) if length > 1 => {
                self.response_length.resize(self.len(), 1);
                self.response_length.push(length);
            }
            _ => {}
        }
        self.run_id.push(&row.run_id);
        self.step.push(row.step);
        self.instance_id.push(&row.instance_id);
        self.trajectory_id.push(&row.trajectory_id);
        self.reward.push(row.reward);
        self.is_hinted.push(row.is_hinted);
        self.hint_category.push(row.hint_category.clone());
    }

    /// Room for the rows of `more` in the columns every row has, their
    /// strings' text exactly (never guessed from the rows so far: a first
    /// row of a long id and many short ones after it would ask for more
    /// memory than the machine has).
    pub fn reserve_for(&mut self, more: &[ScoredRows]) {
        let additional: usize = more.iter().map(ScoredRows::len).sum();
        self.reserve_rows(additional, Self::text_lens_of(more));
    }

    /// Room for `rows` more rows in the columns every row has, its three
    /// string columns ([`Self::text_lens`]' order) for `text` more bytes.
    fn reserve_rows(&mut self, rows: usize, text: [usize; 3]) {
        for (column, bytes) in [&mut self.run_id, &mut self.instance_id, &mut self.trajectory_id]
            .into_iter()
            .zip(text)
        {
            column.reserve(rows, bytes);
        }
        self.step.reserve(rows);
        self.reward.reserve(rows);
        self.is_hinted.reserve(rows);
        self.hint_category.reserve(rows);
    }

    /// Room for `more` rows like those it holds: as long strings, on
    /// average, up to `most_text` bytes a string, and the columns every row
    /// fills.
    pub fn reserve_alike(&mut self, more: usize, most_text: usize) {
        let held = self.len().max(1);
        let text = self
            .text_lens()
            .map(|bytes| bytes.div_ceil(held).min(most_text) * more);
        self.reserve_rows(more, text);
    }

    /// Empty, with room for `rows` rows whose three string columns
    /// (`run_id`, `instance_id`, `trajectory_id`) hold `text` bytes.
    pub fn with_room(rows: usize, text: [usize; 3]) -> Self {
        let mut room = ScoredRows::default();
        room.reserve_rows(rows, text);
        room
    }

    /// The text bytes of its three string columns, in [`Self::with_room`]'s
    /// order.
    pub fn text_lens(&self) -> [usize; 3] {
        [
            self.run_id.text_len(),
            self.instance_id.text_len(),
            self.trajectory_id.text_len(),
        ]
    }

    /// [`Self::text_lens`] summed over `parts`.
    pub fn text_lens_of(parts: &[ScoredRows]) -> [usize; 3] {
        parts.iter().fold([0; 3], |sum, rows| {
            let lens = rows.text_lens();
            std::array::from_fn(|c| sum[c] + lens[c])
        })
    }

    /// Gives back the room its columns hold beyond their rows.
    pub fn shrink_to_fit(&mut self) {
        for column in [&mut self.run_id, &mut self.instance_id, &mut self.trajectory_id] {
            column.shrink_to_fit();
        }
        self.step.shrink_to_fit();
        self.reward.shrink_to_fit();
        self.is_hinted.shrink_to_fit();
        self.hint_category.shrink_to_fit();
    }

    /// Whether [`Self::extend`] with `other` fits in the room left of the
    /// columns every row has (the short optional ones may still grow).
    pub fn has_room_for(&self, other: &ScoredRows) -> bool {
        let spare = |capacity: usize| capacity - self.len() >= other.len();
        self.run_id.has_room_for(&other.run_id)
            && self.instance_id.has_room_for(&other.instance_id)
            && self.trajectory_id.has_room_for(&other.trajectory_id)
            && spare(self.step.capacity())
            && spare(self.reward.capacity())
            && spare(self.is_hinted.capacity())
            && spare(self.hint_category.capacity())
    }

    /// Appends every row of `other`.
    pub fn extend(&mut self, other: ScoredRows) {
        if !other.hint_id.is_empty() {
            self.hint_id.resize(self.len(), None);
            self.hint_id.extend(other.hint_id);
        }
        if !other.response_length.is_empty() {
            self.response_length.resize(self.len(), 1);
            self.response_length.extend(other.response_length);
        }
        let n = self.len();
        for (column, more) in [
            (&mut self.logprob_hinted, other.logprob_hinted),
            (&mut self.logprob_unhinted, other.logprob_unhinted),
        ] {
            if !more.is_empty() {
                column.resize(n, None);
                column.extend(more);
            }
        }
        self.run_id.append(&other.run_id);
        self.step.extend(other.step);
        self.instance_id.append(&other.instance_id);
        self.trajectory_id.append(&other.trajectory_id);
        self.reward.extend(other.reward);
        self.is_hinted.extend(other.is_hinted);
        self.hint_category.extend(other.hint_category);
    }

    /// Drops the rows whose `gone` is true (one a row), in place: what
    /// [`Self::take`] of the others gives, without a copy of the rest or
    /// the loss of its room.
    pub fn retain_rows(&mut self, gone: &[bool]) {
        fn retain<T>(column: &mut Vec<T>, gone: &[bool]) {
            let mut row = 0;
            column.retain(|_| {
                row += 1;
                !gone[row - 1]
            });
        }
        for column in [&mut self.run_id, &mut self.instance_id, &mut self.trajectory_id] {
            column.retain_rows(gone);
        }
        retain(&mut self.step, gone);
        retain(&mut self.reward, gone);
        retain(&mut self.is_hinted, gone);
        retain(&mut self.hint_category, gone);
        // The short columns hold the rows up to their length (`retain`
        // reads `gone` that far), and keep their short form.
        retain(&mut self.hint_id, gone);
        self.hint_id = without_trailing_none(std::mem::take(&mut self.hint_id));
        retain(&mut self.response_length, gone);
        self.response_length = without_trailing_ones(std::mem::take(&mut self.response_length));
        for column in [&mut self.logprob_hinted, &mut self.logprob_unhinted] {
            retain(column, gone);
            *column = without_trailing_none(std::mem::take(column));
        }
    }

    /// The rows at `indices`, in that order.
    pub fn take(&self, indices: &[usize]) -> ScoredRows {
        ScoredRows {
            run_id: self.run_id.take(indices),
            step: indices.iter().map(|&i| self.step[i]).collect(),
            instance_id: self.instance_id.take(indices),
            trajectory_id: self.trajectory_id.take(indices),
            reward: indices.iter().map(|&i| self.reward[i]).collect(),
            is_hinted: indices.iter().map(|&i| self.is_hinted[i]).collect(),
            hint_category: indices.iter().map(|&i| self.hint_category[i].clone()).collect(),
            hint_id: if self.hint_id.is_empty() {
                Vec::new()
            } else {
                without_trailing_none(
                    indices
                        .iter()
                        .map(|&i| self.hint_id(i).map(str::to_string))
                        .collect(),
                )
            },
            response_length: if self.response_length.is_empty() {
                Vec::new()
            } else {
                without_trailing_ones(indices.iter().map(|&i| self.response_length(i)).collect())
            },
            logprob_hinted: take_optional(&self.logprob_hinted, indices),
            logprob_unhinted: take_optional(&self.logprob_unhinted, indices),
        }
    }

    /// Builds the assembled batch ([`scored_schema`]).
    pub fn to_batch(&self) -> Result<RecordBatch, BatchError> {
        // Dictionary values in order of first appearance (as arrow's
        // dictionary builder orders them), mapped with the kernels' mapping.
        let groups = crate::normalize::DenseGroups::from_strings(self.instance_id.iter());
        let mut values: Vec<&str> = Vec::with_capacity(groups.n_groups);
        let mut keys: Vec<i32> = Vec::with_capacity(groups.ids.len());
        for (&id, s) in groups.ids.iter().zip(self.instance_id.iter()) {
            if id as usize == values.len() {
                values.push(s);
            }
            keys.push(i32::try_from(id).map_err(|_| ArrowError::DictionaryKeyOverflowError)?);
        }
        let instance = DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(keys),
            Arc::new(StringArray::from_iter_values(values)),
        )?;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.run_id.to_arrow()?),
            Arc::new(Int64Array::from(self.step.clone())),
            Arc::new(instance),
            Arc::new(self.trajectory_id.to_arrow()?),
            Arc::new(Float64Array::from(self.reward.clone())),
            Arc::new(BooleanArray::from(self.is_hinted.clone())),
            Arc::new(StringArray::from(self.hint_category.clone())),
            Arc::new(StringArray::from_iter(
                (0..self.len()).map(|row| self.hint_id(row)),
            )),
        ];
        if self.response_length.is_empty() && !self.has_logprobs() {
            return Ok(RecordBatch::try_new(scored_schema(), columns)?);
        }
        let mut fields: Vec<Field> = scored_schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        // A row with a log-prob needs a length on the wire: the column is
        // written whenever log-probs are.
        fields.push(Field::new(RESPONSE_LENGTH, DataType::UInt32, false));
        columns.push(Arc::new(UInt32Array::from_iter_values(
            (0..self.len()).map(|row| self.response_length(row)),
        )));
        if self.has_logprobs() {
            for (name, column) in [
                (LOGPROB_HINTED, &self.logprob_hinted),
                (LOGPROB_UNHINTED, &self.logprob_unhinted),
            ] {
                fields.push(Field::new(name, DataType::Float64, true));
                columns.push(Arc::new(Float64Array::from_iter(
                    (0..self.len()).map(|row| column.get(row).copied().flatten()),
                )));
            }
        }
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
    }

    /// The rows of `batches` (each as [`ScoredRows::from_batch`] reads
    /// it), in order. The first batch's rows are the result's, not copied
    /// into an empty set: a stream of one batch (as trainers send) costs no
    /// copy.
    pub fn from_batches(batches: &[RecordBatch]) -> Result<ScoredRows, BatchError> {
        let Some((first, more)) = batches.split_first() else {
            return Ok(ScoredRows::default());
        };
        let mut rows = Self::from_batch(first)?;
        for batch in more {
            rows.extend(Self::from_batch(batch)?);
        }
        Ok(rows)
    }

    /// Reads scored rows from a batch with the scored columns in any usual
    /// encoding: strings plain, large, view or dictionary-encoded; reward f32
    /// or f64; step any integer type. `hint_category`, `hint_id` and
    /// [`RESPONSE_LENGTH`] may be absent.
    pub fn from_batch(batch: &RecordBatch) -> Result<ScoredRows, BatchError> {
        let rows = ScoredRows {
            run_id: strings(batch, "run_id")?,
            step: integers(batch, "step")?,
            instance_id: strings(batch, "instance_id")?,
            trajectory_id: strings(batch, "trajectory_id")?,
            reward: floats(batch, "reward")?,
            is_hinted: booleans(batch, "is_hinted")?,
            hint_category: optional_strings(batch, "hint_category")?,
            hint_id: match batch.column_by_name("hint_id") {
                Some(array) if array.null_count() < array.len() => {
                    without_trailing_none(optional_strings_of(array, "hint_id")?)
                }
                _ => Vec::new(),
            },
            response_length: without_trailing_ones(response_lengths(batch)?),
            logprob_hinted: optional_floats(batch, LOGPROB_HINTED)?,
            logprob_unhinted: optional_floats(batch, LOGPROB_UNHINTED)?,
        };
        rows.check()?;
        check_logprob_lengths(batch, &rows)?;
        Ok(rows)
    }

    /// The value rules of the JSON contract, applied to columnar input.
    fn check(&self) -> Result<(), BatchError> {
        if self.all_valid() {
            return Ok(());
        }
        self.first_invalid()
    }

    /// Whether every row passes [`ScoredRows::check`], a column at a time
    /// (a 1M-row step's intake checked row by row for ~20 ms of its one
    /// thread: each row's strings looked up and trimmed, each log-prob
    /// checked through a call).
    fn all_valid(&self) -> bool {
        let logprobs_ok = |column, values: &[Option<f64>]| {
            values
                .iter()
                .all(|&v| crate::messages::check_logprob(column, v).is_ok())
        };
        self.reward.iter().all(|r| r.is_finite())
            && self.step.iter().all(|&s| s >= 0)
            && self.instance_id.iter().all(filled)
            && self.trajectory_id.iter().all(filled)
            && self.run_id.iter().all(filled)
            && self.hint_id.iter().all(|id| id.as_deref().is_none_or(filled))
            && logprobs_ok(LOGPROB_HINTED, &self.logprob_hinted)
            && logprobs_ok(LOGPROB_UNHINTED, &self.logprob_unhinted)
    }

    /// The first invalid row's fault, in row order (each row's columns in
    /// the order below).
    fn first_invalid(&self) -> Result<(), BatchError> {
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
            if !filled(&self.instance_id[row]) {
                return Err(bad("instance_id", row, "must be non-empty"));
            }
            if !filled(&self.trajectory_id[row]) {
                return Err(bad("trajectory_id", row, "must be non-empty"));
            }
            if !filled(&self.run_id[row]) {
                return Err(bad("run_id", row, "must be non-empty"));
            }
            if self.hint_id(row).is_some_and(|id| !filled(id)) {
                return Err(bad("hint_id", row, "must be non-empty when present"));
            }
            for (column, values) in [
                (LOGPROB_HINTED, &self.logprob_hinted),
                (LOGPROB_UNHINTED, &self.logprob_unhinted),
            ] {
                let value = values.get(row).copied().flatten();
                if let Err(e) = crate::messages::check_logprob(column, value) {
                    return Err(bad(column, row, &e.to_string()));
                }
            }
        }
        Ok(())
    }
}

/// Whether `s` is not empty once trimmed (the contract's "non-empty"). A
/// first byte that is a printable ASCII character settles it without a
/// trim (which also takes Unicode spaces and \x0B, which
/// `is_ascii_whitespace` does not).
fn filled(s: &str) -> bool {
    match s.as_bytes().first() {
        Some(b) if b.is_ascii_graphic() => true,
        _ => !s.trim().is_empty(),
    }
}

/// The rows at `indices` of a column in `hint_id`'s short form, in that
/// form.
fn take_optional(column: &[Option<f64>], indices: &[usize]) -> Vec<Option<f64>> {
    if column.is_empty() {
        return Vec::new();
    }
    without_trailing_none(
        indices
            .iter()
            .map(|&i| column.get(i).copied().flatten())
            .collect(),
    )
}

/// A float column that may be absent, in `hint_id`'s short form (nulls as
/// `None`; empty when the column is absent or all null).
fn optional_floats(batch: &RecordBatch, name: &'static str) -> Result<Vec<Option<f64>>, BatchError> {
    let Some(array) = batch.column_by_name(name) else {
        return Ok(Vec::new());
    };
    if array.null_count() == array.len() {
        return Ok(Vec::new());
    }
    if !array.data_type().is_floating() {
        return Err(BatchError::WrongType {
            column: name,
            found: array.data_type().clone(),
            wanted: "float",
        });
    }
    let cast = cast(array, name, &DataType::Float64, "float")?;
    let values = cast
        .as_any()
        .downcast_ref::<Float64Array>()
        .ok_or(BatchError::MissingColumn(name))?;
    let mut out: Vec<Option<f64>> = values.iter().collect();
    while out.last().is_some_and(Option::is_none) {
        out.pop();
    }
    Ok(out)
}

/// A row with a log-prob must have a [`RESPONSE_LENGTH`] that is not null
/// (an absent length reads as 1, which would make the log-prob per token
/// wrong without a word).
fn check_logprob_lengths(batch: &RecordBatch, rows: &ScoredRows) -> Result<(), BatchError> {
    if !rows.has_logprobs() {
        return Ok(());
    }
    let lengths = batch.column_by_name(RESPONSE_LENGTH);
    for row in 0..rows.len() {
        let has = rows.logprob_hinted.get(row).copied().flatten().is_some()
            || rows.logprob_unhinted.get(row).copied().flatten().is_some();
        if has && lengths.is_none_or(|l| l.is_null(row)) {
            return Err(BatchError::InvalidValue {
                column: RESPONSE_LENGTH,
                row,
                reason: "is required on a row with logprob_hinted or logprob_unhinted".into(),
            });
        }
    }
    Ok(())
}

/// `lengths` without its trailing 1s ([`ScoredRows::response_length`]'s
/// form).
fn without_trailing_ones(mut lengths: Vec<u32>) -> Vec<u32> {
    while lengths.last() == Some(&1) {
        lengths.pop();
    }
    lengths
}

/// The [`RESPONSE_LENGTH`] column of `batch` as u32s, nulls as 1; empty when
/// the column is absent. Every value must be an integer from 1 to u32::MAX.
fn response_lengths(batch: &RecordBatch) -> Result<Vec<u32>, BatchError> {
    let Some(array) = batch.column_by_name(RESPONSE_LENGTH) else {
        return Ok(Vec::new());
    };
    if !array.data_type().is_integer() {
        return Err(BatchError::WrongType {
            column: RESPONSE_LENGTH,
            found: array.data_type().clone(),
            wanted: "integer",
        });
    }
    let cast = cast(array, RESPONSE_LENGTH, &DataType::Int64, "integer")?;
    let ints = cast
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or(BatchError::MissingColumn(RESPONSE_LENGTH))?;
    let mut out = Vec::with_capacity(ints.len());
    for (row, value) in ints.iter().enumerate() {
        let length = value.unwrap_or(1);
        match u32::try_from(length) {
            Ok(l) if l >= 1 => out.push(l),
            _ => {
                return Err(BatchError::InvalidValue {
                    column: RESPONSE_LENGTH,
                    row,
                    reason: format!("{length} is not an integer from 1 to 4294967295"),
                })
            }
        }
    }
    Ok(out)
}

/// `values` without its trailing `None`s ([`ScoredRows::hint_id`]'s form,
/// and the log-probs').
fn without_trailing_none<T>(mut values: Vec<Option<T>>) -> Vec<Option<T>> {
    while values.last().is_some_and(Option::is_none) {
        values.pop();
    }
    values
}

/// The columns the advantage kernels read, taken from a scored batch with as
/// little copying as its encoding allows: group ids from `instance_id`
/// (dictionary keys in place when every dictionary value is distinct, see
/// [`instance_groups`] for the rest), rewards in place when they are
/// `Float64`, `is_hinted` unpacked from its bitmap a word at a time.
#[derive(Debug, Clone)]
pub struct KernelColumns<'a> {
    /// Dense group ids, below `n_groups`.
    pub group: arrow_buffer::ScalarBuffer<u32>,
    pub n_groups: usize,
    pub reward: std::borrow::Cow<'a, [f64]>,
    pub hinted: Vec<bool>,
    /// Response lengths ([`RESPONSE_LENGTH`]); empty when the column is
    /// absent (every row 1).
    pub response_length: Vec<u32>,
}

impl KernelColumns<'_> {
    /// The kernels' view of the columns.
    pub fn as_batch(&self) -> crate::normalize::Batch<'_> {
        crate::normalize::Batch {
            group: &self.group,
            n_groups: self.n_groups,
            reward: &self.reward,
            hinted: &self.hinted,
            response_length: &self.response_length,
        }
    }
}

/// Reads [`KernelColumns`] from a batch with the scored columns (only
/// `instance_id`, `reward`, `is_hinted` and, when present,
/// [`RESPONSE_LENGTH`] are read). Without `with_groups`
/// every row is put in group 0 and `instance_id` is not read, for estimators
/// that ignore groups (reinforce_pp). Values are not checked here
/// ([`crate::normalize::Batch::validate`] does that), except response
/// lengths, which must be integers from 1 to u32::MAX.
pub fn kernel_columns(batch: &RecordBatch, with_groups: bool) -> Result<KernelColumns<'_>, BatchError> {
    let (group, n_groups) = if with_groups {
        group_buffer(batch)?
    } else {
        let rows = batch.num_rows();
        (vec![0u32; rows].into(), usize::from(rows > 0))
    };
    let array = column(batch, "reward")?;
    let reward = match array.as_primitive_opt::<arrow_array::types::Float64Type>() {
        Some(values) if values.null_count() == 0 => std::borrow::Cow::Borrowed(&values.values()[..]),
        _ => std::borrow::Cow::Owned(floats(batch, "reward")?),
    };
    let array = column(batch, "is_hinted")?;
    no_nulls(array, "is_hinted")?;
    let bools = array.as_boolean_opt().ok_or_else(|| BatchError::WrongType {
        column: "is_hinted",
        found: array.data_type().clone(),
        wanted: "boolean",
    })?;
    Ok(KernelColumns {
        group,
        n_groups,
        reward,
        hinted: unpack_bits(bools.values()),
        response_length: response_lengths(batch)?,
    })
}

/// One bool per bit, 64 bits at a time.
fn unpack_bits(bits: &arrow_buffer::BooleanBuffer) -> Vec<bool> {
    let chunks = bits.inner().bit_chunks(bits.offset(), bits.len());
    let mut out = Vec::with_capacity(bits.len());
    for word in chunks.iter() {
        out.extend((0..64).map(|k| (word >> k) & 1 == 1));
    }
    let tail = chunks.remainder_bits();
    out.extend((0..chunks.remainder_len()).map(|k| (tail >> k) & 1 == 1));
    out
}

/// Dense group ids of an assembled batch's `instance_id` column (see
/// [`instance_groups`]); ids mapped from `instance_ids` when the column is
/// missing or unreadable.
pub fn dense_groups(batch: &RecordBatch, instance_ids: &Strings) -> crate::normalize::DenseGroups {
    instance_groups(batch)
        .unwrap_or_else(|_| crate::normalize::DenseGroups::from_strings(instance_ids.iter()))
}

/// Dense group ids from a batch's `instance_id` column, read in place:
/// - dictionary-encoded (any integer keys, string values): the keys
///   themselves when the dictionary has no repeated value, otherwise the
///   keys through a map of the (few) dictionary values; no row is hashed;
/// - plain strings (`Utf8`, `LargeUtf8`, `Utf8View`): each row's string
///   mapped, borrowed from the column (no per-row allocation).
///
/// Equal strings get equal ids either way; unused dictionary values leave
/// empty groups, which the kernels ignore.
pub fn instance_groups(batch: &RecordBatch) -> Result<crate::normalize::DenseGroups, BatchError> {
    let (ids, n_groups) = group_buffer(batch)?;
    Ok(crate::normalize::DenseGroups {
        ids: ids.to_vec(),
        n_groups,
    })
}

/// [`instance_groups`] as a buffer: the `Int32` keys of a dictionary with
/// distinct values are shared, not copied.
fn group_buffer(batch: &RecordBatch) -> Result<(arrow_buffer::ScalarBuffer<u32>, usize), BatchError> {
    const NAME: &str = "instance_id";
    let array = column(batch, NAME)?;
    no_nulls(array, NAME)?;
    let wrong = || BatchError::WrongType {
        column: NAME,
        found: array.data_type().clone(),
        wanted: "string",
    };
    let Some(dict) = array.as_any_dictionary_opt() else {
        let groups = map_strings(array.as_ref()).ok_or_else(wrong)?;
        return Ok((groups.ids.into(), groups.n_groups));
    };
    let values = dict.values();
    let bad_key = |row: usize| BatchError::InvalidValue {
        column: NAME,
        row,
        reason: "dictionary key out of range".into(),
    };
    // The usual case, and always so for dictionaries this crate writes:
    // every value distinct and i32 keys, which are then the ids as they
    // are, checked in one pass.
    if let (Some(true), Some(keys)) = (
        distinct_strings(values.as_ref()),
        dict.keys().as_any().downcast_ref::<Int32Array>(),
    ) {
        let n_values = values.len();
        if let Some(row) = keys.values().iter().position(|&k| k as u32 as usize >= n_values) {
            return Err(bad_key(row));
        }
        // The same bytes read as u32 (every key was just checked to be
        // non-negative). Cannot panic: u32 has i32's size and alignment.
        let ids = arrow_buffer::ScalarBuffer::<u32>::new(keys.values().inner().clone(), 0, keys.len());
        return Ok((ids, n_values));
    }
    // Otherwise through a map of the (few) dictionary values.
    let values = map_strings(values.as_ref()).ok_or_else(wrong)?;
    let mut ids = Vec::with_capacity(dict.keys().len());
    // No values: no row can name one (the column has no nulls).
    let keys = dictionary::value_indices(dict).unwrap_or_default();
    if keys.len() < dict.keys().len() {
        return Err(bad_key(0));
    }
    for (row, k) in keys.into_iter().enumerate() {
        ids.push(*values.ids.get(k).ok_or_else(|| bad_key(row))?);
    }
    Ok((ids.into(), values.n_groups))
}

/// Whether the values of a string array all differ; `None` when it holds no
/// strings.
fn distinct_strings(array: &dyn Array) -> Option<bool> {
    use crate::normalize::clashes::all_distinct;
    match array.data_type() {
        DataType::Utf8 => Some(all_distinct(
            array.as_string::<i32>().iter().map(Option::unwrap_or_default),
        )),
        DataType::LargeUtf8 => Some(all_distinct(
            array.as_string::<i64>().iter().map(Option::unwrap_or_default),
        )),
        DataType::Utf8View => Some(all_distinct(
            array.as_string_view().iter().map(Option::unwrap_or_default),
        )),
        _ => None,
    }
}

/// Maps the values of a string array, borrowed in place, to dense ids;
/// `None` when the array holds no strings. Nulls read as "" (callers reject
/// nulls first).
fn map_strings(array: &dyn Array) -> Option<crate::normalize::DenseGroups> {
    use crate::normalize::DenseGroups;
    match array.data_type() {
        DataType::Utf8 => Some(DenseGroups::from_strings(
            array.as_string::<i32>().iter().map(Option::unwrap_or_default),
        )),
        DataType::LargeUtf8 => Some(DenseGroups::from_strings(
            array.as_string::<i64>().iter().map(Option::unwrap_or_default),
        )),
        DataType::Utf8View => Some(DenseGroups::from_strings(
            array.as_string_view().iter().map(Option::unwrap_or_default),
        )),
        _ => None,
    }
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

fn strings(batch: &RecordBatch, name: &'static str) -> Result<Strings, BatchError> {
    let array = column(batch, name)?;
    no_nulls(array, name)?;
    let mut out = Strings::default();
    out.extend_from_arrow(&utf8(array, name)?);
    Ok(out)
}

/// A string-like column as `Utf8` (cast, unless it is already).
fn utf8(array: &ArrayRef, name: &'static str) -> Result<StringArray, BatchError> {
    if !is_string_like(array.data_type()) {
        return Err(BatchError::WrongType {
            column: name,
            found: array.data_type().clone(),
            wanted: "string",
        });
    }
    if let Some(utf8) = array.as_string_opt::<i32>() {
        return Ok(utf8.clone());
    }
    let utf8 = cast(array, name, &DataType::Utf8, "string")?;
    utf8.as_string_opt::<i32>()
        .cloned()
        .ok_or(BatchError::MissingColumn(name))
}

fn optional_strings(batch: &RecordBatch, name: &'static str) -> Result<Vec<Option<String>>, BatchError> {
    match batch.column_by_name(name) {
        None => Ok(vec![None; batch.num_rows()]),
        Some(array) => optional_strings_of(array, name),
    }
}

fn optional_strings_of(array: &ArrayRef, name: &'static str) -> Result<Vec<Option<String>>, BatchError> {
    Ok(utf8(array, name)?.iter().map(|v| v.map(str::to_string)).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_pushed_comes_back_as_it_went_in() {
        let base = ScoredRollout::unhinted("run", 3, "g", "t", 0.5);
        let rollouts = [
            base.clone(),
            ScoredRollout {
                trajectory_id: "u".into(),
                is_hinted: true,
                hint_category: Some("plan".into()),
                hint_id: Some("h1".into()),
                response_length: Some(7),
                logprob_hinted: Some(-1.5),
                logprob_unhinted: Some(-2.5),
                ..base.clone()
            },
            ScoredRollout {
                trajectory_id: "v".into(),
                logprob_unhinted: Some(-0.5),
                ..base.clone()
            },
        ];
        let mut rows = ScoredRows::default();
        rollouts.iter().for_each(|r| rows.push(r));
        for (i, want) in rollouts.iter().enumerate() {
            assert_eq!(&rows.rollout(i), want);
        }
        // A length of 1 is stored as none is.
        rows.push(&ScoredRollout {
            response_length: Some(1),
            ..base.clone()
        });
        assert_eq!(rows.rollout(3), base);
    }

    #[test]
    fn rows_retained_in_place_are_the_rows_taken_and_keep_their_room() {
        // Rows with and without the short columns' values, so that some
        // end each column and some are dropped.
        let rollout = |i: usize| {
            let mut r = ScoredRollout::unhinted("run", 3, &format!("g{}", i % 3), &format!("t{i}"), i as f64);
            if i % 4 == 1 {
                r.is_hinted = true;
                r.hint_category = Some(format!("c{i}"));
                r.hint_id = Some(format!("h{i}"));
                r.logprob_hinted = Some(-(i as f64));
            }
            if i % 5 == 2 {
                r.response_length = Some(i as i64 + 2);
                r.logprob_unhinted = Some(-0.5);
            }
            r
        };
        let mut rows = ScoredRows::default();
        (0..23).for_each(|i| rows.push(&rollout(i)));
        for gone in [
            (0..23).map(|i| i % 3 == 0).collect::<Vec<_>>(),
            (0..23).map(|i| i >= 7).collect(),
            (0..23).map(|i| i == 0).collect(),
            vec![true; 23],
            vec![false; 23],
        ] {
            let keep: Vec<usize> = (0..23).filter(|&i| !gone[i]).collect();
            let mut retained = rows.clone();
            let room = (
                retained.reward.capacity(),
                retained.trajectory_id.capacity_bytes(),
            );
            retained.retain_rows(&gone);
            assert_eq!(retained, rows.take(&keep), "{gone:?}");
            assert_eq!(
                (
                    retained.reward.capacity(),
                    retained.trajectory_id.capacity_bytes()
                ),
                room
            );
        }
    }

    fn batch(instance: ArrayRef, reward: ArrayRef, hinted: ArrayRef) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("instance_id", instance),
            ("reward", reward),
            ("is_hinted", hinted),
        ])
        .unwrap()
    }

    #[test]
    fn kernel_columns_unpack_sliced_booleans_and_cast_f32_rewards() {
        let n = 200;
        let flags: Vec<bool> = (0..n).map(|i| i % 3 == 0 || i % 7 == 0).collect();
        let names: Vec<String> = (0..n).map(|i| format!("g{}", i % 5)).collect();
        let rewards: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let full = batch(
            Arc::new(StringArray::from_iter_values(&names)),
            Arc::new(arrow_array::Float32Array::from(rewards.clone())),
            Arc::new(BooleanArray::from(flags.clone())),
        );
        // A slice starting mid-byte, ending mid-word.
        let (offset, len) = (13, 131);
        let sliced = full.slice(offset, len);
        let columns = kernel_columns(&sliced, true).unwrap();
        assert_eq!(columns.hinted, flags[offset..offset + len]);
        let want: Vec<f64> = rewards[offset..offset + len]
            .iter()
            .map(|&r| f64::from(r))
            .collect();
        assert_eq!(&columns.reward[..], &want[..]);
        assert_eq!(columns.n_groups, 5);
        // Rows with the same name share an id.
        for i in 0..len {
            for j in 0..len {
                let same = names[offset + i] == names[offset + j];
                assert_eq!(columns.group[i] == columns.group[j], same);
            }
        }
        // Float64 rewards are read in place.
        let f64s = batch(
            Arc::new(StringArray::from(vec!["a", "b"])),
            Arc::new(Float64Array::from(vec![1.0, 2.0])),
            Arc::new(BooleanArray::from(vec![false, true])),
        );
        let columns = kernel_columns(&f64s, true).unwrap();
        assert!(matches!(columns.reward, std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn instance_groups_reject_nulls_and_non_strings() {
        let b = batch(
            Arc::new(StringArray::from(vec![Some("a"), None])),
            Arc::new(Float64Array::from(vec![1.0, 2.0])),
            Arc::new(BooleanArray::from(vec![false, true])),
        );
        assert!(matches!(instance_groups(&b), Err(BatchError::Nulls { .. })));
        let b = batch(
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(Float64Array::from(vec![1.0, 2.0])),
            Arc::new(BooleanArray::from(vec![false, true])),
        );
        assert!(matches!(instance_groups(&b), Err(BatchError::WrongType { .. })));
        let keys = arrow_array::Int8Array::from(vec![1, 0, 1]);
        let dict = DictionaryArray::<arrow_array::types::Int8Type>::try_new(
            keys,
            Arc::new(StringArray::from(vec!["x", "y"])),
        )
        .unwrap();
        let b = batch(
            Arc::new(dict),
            Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0])),
            Arc::new(BooleanArray::from(vec![false, true, false])),
        );
        // Int8 keys go through the general path: ids of the values.
        assert_eq!(instance_groups(&b).unwrap().ids, vec![1, 0, 1]);
    }

    fn row(id: &str, hint_id: Option<&str>) -> ScoredRollout {
        ScoredRollout {
            schema_version: 1,
            run_id: "r".into(),
            step: 0,
            instance_id: id.into(),
            trajectory_id: format!("t-{id}"),
            reward: 0.0,
            is_hinted: hint_id.is_some(),
            hint_category: None,
            hint_id: hint_id.map(str::to_string),
            response_length: None,
            logprob_hinted: None,
            logprob_unhinted: None,
        }
    }

    #[test]
    fn the_check_a_column_at_a_time_passes_and_fails_what_the_check_a_row_at_a_time_does() {
        use crate::messages::LOGPROB_ROUNDING;
        type Change = fn(&mut ScoredRollout);
        let changes: [(&str, Change); 19] = [
            ("none", |_| {}),
            ("reward NaN", |r| r.reward = f64::NAN),
            ("reward inf", |r| r.reward = f64::INFINITY),
            ("step -1", |r| r.step = -1),
            ("instance empty", |r| r.instance_id = String::new()),
            ("instance spaces", |r| r.instance_id = " \t ".into()),
            ("instance vertical tab", |r| r.instance_id = "\u{b}".into()),
            ("instance no-break space", |r| {
                r.instance_id = "\u{a0}\u{3000}".into()
            }),
            ("instance after a space", |r| r.instance_id = " i".into()),
            ("instance non-ASCII", |r| r.instance_id = "é".into()),
            ("run empty", |r| r.run_id = "\n".into()),
            ("trajectory empty", |r| r.trajectory_id = String::new()),
            ("trajectory spaces", |r| r.trajectory_id = " ".into()),
            ("hint id empty", |r| r.hint_id = Some(" ".into())),
            ("logprob NaN", |r| {
                r.logprob_hinted = Some(f64::NAN);
                r.response_length = Some(1);
            }),
            ("logprob rounding", |r| {
                r.logprob_unhinted = Some(LOGPROB_ROUNDING);
                r.response_length = Some(1);
            }),
            ("logprob over", |r| {
                r.logprob_unhinted = Some(2.0 * LOGPROB_ROUNDING);
                r.response_length = Some(1);
            }),
            ("logprob -inf", |r| {
                r.logprob_hinted = Some(f64::NEG_INFINITY);
                r.response_length = Some(1);
            }),
            ("logprob fine", |r| {
                r.logprob_hinted = Some(-3.5);
                r.response_length = Some(1);
            }),
        ];
        for (what, change) in changes {
            for at in [0, 2] {
                let mut rows = ScoredRows::default();
                for i in 0..3 {
                    let mut r = row(&format!("g{i}"), (i == 1).then_some("h"));
                    if i == at {
                        change(&mut r);
                    }
                    rows.push(&r);
                }
                let by_row = rows.first_invalid().map_err(|e| e.to_string());
                assert_eq!(rows.all_valid(), by_row.is_ok(), "{what} at row {at}: {by_row:?}");
                assert_eq!(rows.check().map_err(|e| e.to_string()), by_row, "{what}");
            }
        }
    }

    /// A blank id refused in a JSON row is refused in a batch's row too
    /// (a blank `trajectory_id` once went through as Arrow).
    #[test]
    fn a_batch_refuses_the_blank_ids_a_json_row_refuses() {
        use crate::messages::Validate;
        type Change = fn(&mut ScoredRollout);
        let changes: [(&str, Change); 3] = [
            ("trajectory_id", |r| r.trajectory_id = " ".into()),
            ("instance_id", |r| r.instance_id = String::new()),
            ("run_id", |r| r.run_id = "\t".into()),
        ];
        for (field, change) in changes {
            let mut bad = row("g", None);
            change(&mut bad);
            let json = bad.validate().unwrap_err().to_string();
            assert!(json.contains(field), "{json}");
            let rows = ScoredRows::from_row(&bad);
            let batch = rows.check().unwrap_err().to_string();
            assert!(batch.contains(field), "{field}: {batch}");
        }
    }

    /// A batch's ids are blank as the shared vectors say
    /// (`schemas/vectors/blank.json`), as a JSON row's are.
    #[test]
    fn a_batch_id_is_blank_as_the_shared_vectors_say() {
        let vectors = crate::messages::vectors::shared("blank.json");
        for case in vectors["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let blank = case["blank"].as_bool().unwrap();
            assert_eq!(!filled(text), blank, "{}", case["case"]);
        }
    }

    #[test]
    fn hint_ids_round_trip_through_the_batch_and_old_batches_have_none() {
        let mut rows = ScoredRows::default();
        for (id, hint) in [
            ("a", None),
            ("b", Some("h1")),
            ("c", None),
            ("b", Some("h2")),
            ("d", None),
        ] {
            rows.push(&row(id, hint));
        }
        // Stored up to the last row that has one.
        assert_eq!(rows.hint_id.len(), 4);
        assert_eq!(
            (rows.hint_id(1), rows.hint_id(3), rows.hint_id(4)),
            (Some("h1"), Some("h2"), None)
        );
        let batch = rows.to_batch().unwrap();
        assert_eq!(
            batch.schema().field_with_name("hint_id").unwrap().data_type(),
            &DataType::Utf8
        );
        assert_eq!(ScoredRows::from_batch(&batch).unwrap(), rows);
        assert_eq!(rows.take(&[3, 0, 4]).hint_id, vec![Some("h2".to_string())]);
        let mut twice = rows.clone();
        twice.extend(rows.clone());
        assert_eq!(twice.hint_id(6), Some("h1"));
        assert_eq!(twice.hint_id(4), None);
        // A batch written before the column existed reads with no hint ids.
        let mut old = batch.clone();
        old.remove_column(batch.schema().index_of("hint_id").unwrap());
        let read = ScoredRows::from_batch(&old).unwrap();
        assert!(read.hint_id.is_empty());
        assert_eq!(read.reward.len(), 5);
        // Rows without any hint id write a column of nulls.
        let mut plain = ScoredRows::default();
        plain.push(&row("a", None));
        assert_eq!(
            plain
                .to_batch()
                .unwrap()
                .column_by_name("hint_id")
                .unwrap()
                .null_count(),
            1
        );
    }

    #[test]
    fn blank_hint_ids_in_a_batch_are_rejected() {
        let mut rows = ScoredRows::default();
        rows.push(&row("a", Some(" ")));
        let err = ScoredRows::from_batch(&rows.to_batch().unwrap()).unwrap_err();
        assert!(
            matches!(
                err,
                BatchError::InvalidValue {
                    column: "hint_id",
                    row: 0,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn to_batch_dictionary_is_in_first_seen_order() {
        let mut rows = ScoredRows::default();
        for id in ["b", "a", "b", "c"] {
            rows.run_id.push("r");
            rows.step.push(0);
            rows.instance_id.push(id);
            rows.trajectory_id.push("t");
            rows.reward.push(0.0);
            rows.is_hinted.push(false);
            rows.hint_category.push(None);
        }
        let b = rows.to_batch().unwrap();
        let dict = b
            .column_by_name("instance_id")
            .unwrap()
            .as_dictionary::<Int32Type>();
        assert_eq!(dict.keys().values().to_vec(), vec![0, 1, 0, 2]);
        let values: Vec<&str> = dict.values().as_string::<i32>().iter().flatten().collect();
        assert_eq!(values, vec!["b", "a", "c"]);
        assert_eq!(ScoredRows::from_batch(&b).unwrap(), rows);
    }

    #[test]
    fn log_probs_round_trip_through_arrow_and_bad_ones_are_invalid() {
        let mut rows = ScoredRows::default();
        for (id, hinted, unhinted, length) in [
            ("a", Some(-5.0), Some(-25.0), Some(10)),
            ("b", None, None, None),
            ("a", Some(-1.0), None, Some(1)),
            ("c", None, None, None),
        ] {
            rows.push(&ScoredRollout {
                response_length: length,
                logprob_hinted: hinted,
                logprob_unhinted: unhinted,
                ..row(id, Some("h"))
            });
        }
        assert_eq!(rows.logprob_hinted, vec![Some(-5.0), None, Some(-1.0)]);
        assert_eq!(rows.logprob_unhinted, vec![Some(-25.0)]);
        assert_eq!(rows.ratio(0), Some((-2.0f64).exp()));
        assert_eq!(
            (rows.reliance(0), rows.ratio(2), rows.ratio(3)),
            (Some(2.0), None, None)
        );
        let batch = rows.to_batch().unwrap();
        for name in [LOGPROB_HINTED, LOGPROB_UNHINTED] {
            let field = batch.schema().field_with_name(name).unwrap().clone();
            assert_eq!(
                (field.data_type(), field.is_nullable()),
                (&DataType::Float64, true)
            );
        }
        assert_eq!(ScoredRows::from_batch(&batch).unwrap(), rows);
        let taken = rows.take(&[2, 0]);
        assert_eq!(
            (taken.logprob_hinted, taken.logprob_unhinted),
            (vec![Some(-1.0), Some(-5.0)], vec![None, Some(-25.0)])
        );
        // A log-prob above 0, and one on a row without a length: invalid.
        let with = |name: &str, values: Vec<Option<f64>>, lengths: Option<Vec<Option<u32>>>| {
            let mut fields: Vec<Field> = batch
                .schema()
                .fields()
                .iter()
                .take(8)
                .map(|f| f.as_ref().clone())
                .collect();
            let mut columns: Vec<ArrayRef> = batch.columns()[..8].to_vec();
            fields.push(Field::new(name, DataType::Float64, true));
            columns.push(Arc::new(Float64Array::from(values)));
            if let Some(l) = lengths {
                fields.push(Field::new(RESPONSE_LENGTH, DataType::UInt32, true));
                columns.push(Arc::new(UInt32Array::from(l)));
            }
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
        };
        let lengths = Some(vec![Some(3), Some(3), Some(3), Some(3)]);
        let err = ScoredRows::from_batch(&with(LOGPROB_HINTED, vec![None, Some(0.5), None, None], lengths))
            .unwrap_err();
        assert!(
            matches!(
                err,
                BatchError::InvalidValue {
                    column: LOGPROB_HINTED,
                    row: 1,
                    ..
                }
            ),
            "{err}"
        );
        let err = ScoredRows::from_batch(&with(LOGPROB_UNHINTED, vec![Some(-1.0), None, None, None], None))
            .unwrap_err();
        assert!(
            matches!(
                err,
                BatchError::InvalidValue {
                    column: RESPONSE_LENGTH,
                    row: 0,
                    ..
                }
            ),
            "{err}"
        );
        let nulls = Some(vec![Some(3), None, Some(3), Some(3)]);
        let err = ScoredRows::from_batch(&with(LOGPROB_UNHINTED, vec![None, Some(-1.0), None, None], nulls))
            .unwrap_err();
        assert!(
            matches!(
                err,
                BatchError::InvalidValue {
                    column: RESPONSE_LENGTH,
                    row: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.kind(), "invalid_value");
    }

    #[test]
    fn response_lengths_round_trip_and_batches_without_the_column_read_as_1() {
        let mut rows = ScoredRows::default();
        for (id, length) in [
            ("a", Some(3)),
            ("b", None),
            ("a", Some(1)),
            ("c", Some(7)),
            ("b", Some(1)),
        ] {
            rows.push(&ScoredRollout {
                response_length: length,
                logprob_hinted: None,
                logprob_unhinted: None,
                ..row(id, None)
            });
        }
        // Stored up to the last row whose length is not 1.
        assert_eq!(rows.response_length, vec![3, 1, 1, 7]);
        assert_eq!((rows.response_length(0), rows.response_length(4)), (3, 1));
        let batch = rows.to_batch().unwrap();
        let field = batch.schema().field_with_name(RESPONSE_LENGTH).unwrap().clone();
        assert_eq!(field.data_type(), &DataType::UInt32);
        assert_eq!(ScoredRows::from_batch(&batch).unwrap(), rows);
        assert_eq!(rows.take(&[3, 1, 0]).response_length, vec![7, 1, 3]);
        assert!(rows.take(&[1, 2]).response_length.is_empty());
        let columns = kernel_columns(&batch, true).unwrap();
        assert_eq!(columns.as_batch().response_length, &[3, 1, 1, 7, 1]);
        // Steps where every row has length 1 write no column, as before.
        let mut plain = ScoredRows::default();
        plain.push(&row("a", None));
        let batch = plain.to_batch().unwrap();
        assert_eq!(batch.schema(), scored_schema());
        assert!(kernel_columns(&batch, true).unwrap().response_length.is_empty());
    }

    #[test]
    fn response_lengths_of_any_integer_type_read_and_bad_ones_are_errors() {
        let base = || {
            batch(
                Arc::new(StringArray::from(vec!["a", "b", "a"])),
                Arc::new(Float64Array::from(vec![1.0, 0.0, 0.5])),
                Arc::new(BooleanArray::from(vec![false, true, false])),
            )
        };
        let with = |array: ArrayRef| {
            let b = base();
            let mut fields: Vec<Field> = b.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(Field::new(RESPONSE_LENGTH, array.data_type().clone(), true));
            let mut columns = b.columns().to_vec();
            columns.push(array);
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
        };
        let ints = with(Arc::new(arrow_array::Int16Array::from(vec![
            Some(4),
            None,
            Some(2),
        ])));
        assert_eq!(
            kernel_columns(&ints, true).unwrap().response_length,
            vec![4, 1, 2]
        );
        for bad in [
            Arc::new(Int64Array::from(vec![1, 0, 2])) as ArrayRef,
            Arc::new(Int64Array::from(vec![1, -2, 2])),
            Arc::new(Int64Array::from(vec![1, 1 << 33, 2])),
        ] {
            let err = kernel_columns(&with(bad), true).unwrap_err();
            assert!(
                matches!(
                    err,
                    BatchError::InvalidValue {
                        column: RESPONSE_LENGTH,
                        row: 1,
                        ..
                    }
                ),
                "{err}"
            );
        }
        let floats = with(Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0])));
        assert!(matches!(
            kernel_columns(&floats, true),
            Err(BatchError::WrongType {
                column: RESPONSE_LENGTH,
                ..
            })
        ));
    }
}
