//! The decoded size of scored Arrow batches, computed from their buffers
//! before any string is materialised, so that a small message cannot
//! decode to gigabytes.
//!
//! A `Utf8View`/`BinaryView` column stores 16 bytes a row, yet each view may
//! point at the same large buffer: thousands of views of one 512 KiB buffer
//! are a 0.7 MB message that decodes to gigabytes. A dictionary column's
//! keys may all name one large value, which `take` (and the cast to `Utf8`)
//! copies once per key. Both are counted here as they would be copied: the
//! sum of the views' lengths, and the sum over the keys of their value's
//! length.

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;

use super::dictionary::value_indices;
use super::BatchError;

/// The string columns [`ScoredRows::from_batch`](super::ScoredRows::from_batch)
/// materialises.
pub const SCORED_STRING_COLUMNS: [&str; 5] = [
    "run_id",
    "instance_id",
    "trajectory_id",
    "hint_category",
    "hint_id",
];

/// What one decoded row costs beyond its string bytes: where it ends in
/// each of its three [`super::Strings`] columns, the `Option<String>`
/// headers of its two optional ones, step, reward and is_hinted.
pub const ROW_FIXED_BYTES: u64 =
    3 * std::mem::size_of::<usize>() as u64 + 2 * std::mem::size_of::<Option<String>>() as u64 + 8 + 8 + 1;

/// The bytes decoding `batches` into scored rows would take: every string
/// byte of [`SCORED_STRING_COLUMNS`] as it would be copied, plus
/// [`ROW_FIXED_BYTES`] a row. Errors with [`BatchError::DecodedTooLarge`],
/// naming the column at which the total passed `limit`, as soon as it does.
pub fn check_decoded_size(batches: &[RecordBatch], limit: usize) -> Result<u64, BatchError> {
    let limit_bytes = limit as u64;
    let mut total = 0u64;
    let over = |column: &'static str, bytes: u64| BatchError::DecodedTooLarge { column, bytes, limit };
    for batch in batches {
        total = total.saturating_add((batch.num_rows() as u64).saturating_mul(ROW_FIXED_BYTES));
        if total > limit_bytes {
            return Err(over("(rows)", total));
        }
        for name in SCORED_STRING_COLUMNS {
            let Some(array) = batch.column_by_name(name) else {
                continue;
            };
            total = total.saturating_add(decoded_len(array.as_ref()));
            if total > limit_bytes {
                return Err(over(name, total));
            }
        }
    }
    Ok(total)
}

/// Bytes the values of a string or binary array take once copied out of it
/// (views and dictionary keys resolved); 0 for other types. Saturates.
pub fn decoded_len(array: &dyn Array) -> u64 {
    match array.data_type() {
        DataType::Dictionary(_, _) => dictionary_len(array).unwrap_or(0),
        _ => flat_len(array).unwrap_or(0),
    }
}

/// Total value bytes of a non-dictionary string/binary array, from its
/// offsets or views; `None` for other types.
fn flat_len(array: &dyn Array) -> Option<u64> {
    let valid = |i: usize| array.is_valid(i);
    Some(match array.data_type() {
        DataType::Utf8 => offsets_span(array.as_string::<i32>().value_offsets()),
        DataType::LargeUtf8 => offsets_span(array.as_string::<i64>().value_offsets()),
        DataType::Binary => offsets_span(array.as_binary::<i32>().value_offsets()),
        DataType::LargeBinary => offsets_span(array.as_binary::<i64>().value_offsets()),
        DataType::Utf8View => views_len(array.as_string_view().views(), valid),
        DataType::BinaryView => views_len(array.as_binary_view().views(), valid),
        _ => return None,
    })
}

/// Bytes between the first and last offset (what a copy of the slice
/// takes).
fn offsets_span<O: arrow_array::OffsetSizeTrait>(offsets: &[O]) -> u64 {
    match (offsets.first(), offsets.last()) {
        (Some(first), Some(last)) => (last.as_usize().saturating_sub(first.as_usize())) as u64,
        _ => 0,
    }
}

/// Sum of the lengths of the valid views (a view's low 32 bits).
fn views_len(views: &[u128], valid: impl Fn(usize) -> bool) -> u64 {
    views
        .iter()
        .enumerate()
        .filter(|(i, _)| valid(*i))
        .fold(0u64, |sum, (_, &view)| sum.saturating_add(u64::from(view as u32)))
}

/// The bytes a dictionary's keys resolve to, summed as they are read (its
/// values' lengths looked up; no length a row kept).
fn dictionary_len(array: &dyn Array) -> Option<u64> {
    let dict = array.as_any_dictionary_opt()?;
    let values = element_lengths(dict.values().as_ref())?;
    let Some(keys) = value_indices(dict) else {
        // No values: every key is null, and names no bytes.
        return Some(0);
    };
    let len = |i: usize, &key: &usize| match array.is_valid(i) {
        true => values.get(key).copied().unwrap_or(0),
        false => 0,
    };
    Some(
        keys.iter()
            .enumerate()
            .fold(0u64, |sum, (i, key)| sum.saturating_add(len(i, key))),
    )
}

/// Each element's byte length (0 for a null), dictionaries resolved through
/// their keys (nested ones too); `None` for types that hold no strings or
/// bytes.
fn element_lengths(array: &dyn Array) -> Option<Vec<u64>> {
    let valid = |i: usize| array.is_valid(i);
    let lengths = |n: usize, len: &dyn Fn(usize) -> u64| -> Vec<u64> {
        (0..n).map(|i| if valid(i) { len(i) } else { 0 }).collect()
    };
    let n = array.len();
    Some(match array.data_type() {
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            lengths(n, &|i| a.value_length(i) as u64)
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            lengths(n, &|i| a.value_length(i) as u64)
        }
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            lengths(n, &|i| a.value_length(i) as u64)
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            lengths(n, &|i| a.value_length(i) as u64)
        }
        DataType::Utf8View => {
            let views = array.as_string_view().views();
            lengths(n, &|i| u64::from(views[i] as u32))
        }
        DataType::BinaryView => {
            let views = array.as_binary_view().views();
            lengths(n, &|i| u64::from(views[i] as u32))
        }
        DataType::Dictionary(_, _) => {
            let dict = array.as_any_dictionary_opt()?;
            let values = element_lengths(dict.values().as_ref())?;
            let Some(keys) = value_indices(dict) else {
                // No values: every key is null.
                return Some(vec![0; n]);
            };
            lengths(n, &|i| {
                keys.get(i).and_then(|&k| values.get(k)).copied().unwrap_or(0)
            })
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::types::Int32Type;
    use arrow_array::{ArrayRef, DictionaryArray, Int32Array, StringArray};

    use super::*;
    use crate::batch::hostile::amplified_views;

    #[test]
    fn views_of_one_buffer_count_once_per_view() {
        let views = amplified_views(10_000, 512 * 1024).unwrap();
        assert_eq!(decoded_len(&views), 10_000 * 512 * 1024);
        let plain = StringArray::from(vec!["ab", "cde", ""]);
        assert_eq!(decoded_len(&plain), 5);
        // A slice counts only its rows.
        assert_eq!(decoded_len(&plain.slice(1, 1)), 3);
    }

    #[test]
    fn dictionary_keys_count_their_value_each_time() {
        let big = "y".repeat(1 << 20);
        let dict = DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(vec![Some(0), Some(0), None, Some(1)]),
            Arc::new(StringArray::from(vec![big.as_str(), "z"])),
        )
        .unwrap();
        assert_eq!(decoded_len(&dict), 2 * (1 << 20) + 1);
    }

    #[test]
    fn an_all_null_dictionary_with_no_values_counts_nothing() {
        // What pyarrow writes for a dictionary-encoded column of nulls only
        // (`pa.array([None, None]).dictionary_encode()`): no values at all.
        let dict = DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(vec![None, None]),
            Arc::new(StringArray::from(Vec::<&str>::new())),
        )
        .unwrap();
        assert_eq!(decoded_len(&dict), 0);
        assert_eq!(element_lengths(&dict), Some(vec![0, 0]));
    }

    #[test]
    fn an_amplified_column_is_refused_by_name_before_decoding() {
        let n = 10_000;
        let views: ArrayRef = Arc::new(amplified_views(n, 512 * 1024).unwrap());
        let batch = RecordBatch::try_from_iter([
            ("run_id", Arc::new(StringArray::from(vec!["r"; n])) as ArrayRef),
            ("trajectory_id", views),
        ])
        .unwrap();
        let err = check_decoded_size(std::slice::from_ref(&batch), 64 << 20).unwrap_err();
        assert!(
            matches!(
                err,
                BatchError::DecodedTooLarge {
                    column: "trajectory_id",
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.kind(), "bad_arrow");
        assert!(err.to_string().contains("trajectory_id"), "{err}");
        // Under the limit, the total is returned.
        let small = batch.slice(0, 10);
        let bytes = check_decoded_size(&[small], 64 << 20).unwrap();
        assert_eq!(bytes, 10 * ROW_FIXED_BYTES + 10 + 10 * 512 * 1024);
    }
}
