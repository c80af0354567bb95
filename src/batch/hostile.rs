//! Hostile Arrow messages for tests, fuzz seeds and reproductions: small IPC
//! streams of scored rows that decode to far more than their size (views of
//! one buffer, dictionary keys that repeat one large value).

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int32Array, Int64Array, RecordBatch,
};
use arrow_array::{StringArray, StringViewArray};
use arrow_buffer::{Buffer, ScalarBuffer};
use arrow_schema::ArrowError;

use super::ipc::encode_stream;

/// `rows` views, each of the whole of one `value_bytes`-byte buffer.
pub fn amplified_views(rows: usize, value_bytes: usize) -> Result<StringViewArray, ArrowError> {
    let len = u32::try_from(value_bytes)
        .map_err(|_| ArrowError::InvalidArgumentError("value_bytes must fit u32".into()))?;
    if value_bytes <= 12 {
        return Err(ArrowError::InvalidArgumentError(
            "value_bytes must be > 12".into(),
        ));
    }
    let data = Buffer::from_vec(vec![b'x'; value_bytes]);
    // A view of more than 12 bytes: length, 4-byte prefix, buffer 0, offset 0.
    let view = u128::from(len) | (u128::from(u32::from_le_bytes(*b"xxxx")) << 32);
    StringViewArray::try_new(ScalarBuffer::from(vec![view; rows]), vec![data], None)
}

/// `rows` keys that all name one `value_bytes`-byte dictionary value.
pub fn amplified_dictionary(
    rows: usize,
    value_bytes: usize,
) -> Result<DictionaryArray<Int32Type>, ArrowError> {
    DictionaryArray::try_new(
        Int32Array::from(vec![0; rows]),
        Arc::new(StringArray::from(vec!["y".repeat(value_bytes)])),
    )
}

/// One scored step of `rows` rows of `run_id`/`step` whose `column` is
/// `amplified` (the other columns plain and valid; trajectory ids `t<i>`
/// unless `column` is `trajectory_id`), as one IPC stream.
pub fn scored_stream_with(
    run_id: &str,
    step: i64,
    column: &str,
    amplified: ArrayRef,
) -> Result<Vec<u8>, ArrowError> {
    let rows = amplified.len();
    let plain = |name: &str, values: Vec<String>| -> ArrayRef {
        if name == column {
            amplified.clone()
        } else {
            Arc::new(StringArray::from(values))
        }
    };
    let batch = RecordBatch::try_from_iter([
        ("run_id", plain("run_id", vec![run_id.to_string(); rows])),
        ("step", Arc::new(Int64Array::from(vec![step; rows])) as ArrayRef),
        (
            "instance_id",
            plain("instance_id", (0..rows).map(|i| format!("g{}", i % 4)).collect()),
        ),
        (
            "trajectory_id",
            plain("trajectory_id", (0..rows).map(|i| format!("t{i}")).collect()),
        ),
        ("reward", Arc::new(Float64Array::from(vec![1.0; rows]))),
        ("is_hinted", Arc::new(BooleanArray::from(vec![false; rows]))),
    ])?;
    encode_stream(&[batch])
}

/// The reproduction of issue 21: a ~0.8 MB stream whose `trajectory_id`
/// (`Utf8View`) has 8,000 views of one 512 KiB buffer (4 GiB decoded).
pub fn amplified_views_stream(run_id: &str, step: i64) -> Result<Vec<u8>, ArrowError> {
    scored_stream_with(
        run_id,
        step,
        "trajectory_id",
        Arc::new(amplified_views(8_000, 512 * 1024)?),
    )
}

/// A stream whose `instance_id` dictionary has 10,000 keys of one 512 KiB
/// value (5 GiB once taken).
pub fn amplified_dictionary_stream(run_id: &str, step: i64) -> Result<Vec<u8>, ArrowError> {
    scored_stream_with(
        run_id,
        step,
        "instance_id",
        Arc::new(amplified_dictionary(10_000, 512 * 1024)?),
    )
}
