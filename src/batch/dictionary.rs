//! A dictionary array's keys read without arrow's panic on a dictionary of
//! no values, and a column's keys kept beside the strings it decodes to.

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{AnyDictionaryArray, Array, RecordBatch};

/// A dictionary's keys as indices into its values (`normalized_keys`), or
/// `None` when it has no values, where `normalized_keys` panics. pyarrow
/// writes a dictionary-encoded column of nulls only so: every key null.
/// (Keys out of range were refused by the decoder's validation already;
/// `normalized_keys` would give them the last value.)
pub(super) fn value_indices(dict: &dyn AnyDictionaryArray) -> Option<Vec<usize>> {
    (!dict.values().is_empty()).then(|| dict.normalized_keys())
}

/// A dictionary-encoded column's rows by key. Rows of one key hold one
/// string, so a reader that needs each distinct string once (stage 2
/// mapping a step's group ids) can look it up once a key instead of
/// hashing it once a row.
#[derive(Debug, Clone, PartialEq)]
pub struct RowKeys {
    /// Each row's index into the dictionary's values, each below `values`
    /// (4 bytes a row, held while its message is put into its step).
    pub keys: Vec<u32>,
    /// How many values the dictionary holds.
    pub values: usize,
}

impl RowKeys {
    /// The keys of `batch`'s `column` when it is dictionary-encoded, without
    /// a null key, and its rows repeat its values: at least two rows a
    /// value (a trainer's rows of a group side by side, as GRPO samples
    /// them). `None` otherwise: where most rows have a value of their own
    /// (rows shuffled across a step's messages), a look-up a key saves
    /// nothing over a hash a row, which is batched and prefetched.
    pub fn of(batch: &RecordBatch, column: &str) -> Option<Self> {
        let array = batch.column_by_name(column)?;
        let dict = array.as_any_dictionary_opt()?;
        let values = dict.values().len();
        if array.null_count() > 0 || values.saturating_mul(2) > array.len() {
            return None;
        }
        // i32 keys, as pyarrow and this crate write them, read as they are;
        // others through arrow's indices. Each checked in range (the IPC
        // reader's validation refused any other).
        let keys: Vec<u32> = match array.as_dictionary_opt::<Int32Type>() {
            Some(dict) => dict.keys().values().iter().map(|&key| key as u32).collect(),
            None => value_indices(dict)?.into_iter().map(|key| key as u32).collect(),
        };
        keys.iter()
            .all(|&key| (key as usize) < values)
            .then_some(RowKeys { keys, values })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::types::Int32Type;
    use arrow_array::{DictionaryArray, Int32Array, StringArray};

    use super::*;

    fn batch(ids: impl Array + 'static) -> RecordBatch {
        RecordBatch::try_from_iter([("instance_id", Arc::new(ids) as _)]).unwrap()
    }

    fn dictionary(keys: &[Option<i32>], values: &[&str]) -> DictionaryArray<Int32Type> {
        DictionaryArray::new(
            Int32Array::from(keys.to_vec()),
            Arc::new(StringArray::from(values.to_vec())),
        )
    }

    #[test]
    fn a_dictionary_encoded_column_gives_its_rows_keys_and_a_plain_or_odd_one_none() {
        let ids = dictionary(
            &[Some(1), Some(0), Some(1), Some(2), Some(2), Some(0)],
            &["g0", "g1", "g2"],
        );
        let keys = RowKeys::of(&batch(ids), "instance_id").unwrap();
        assert_eq!(
            keys,
            RowKeys {
                keys: vec![1u32, 0, 1, 2, 2, 0],
                values: 3
            }
        );
        let a_value_a_row = dictionary(&[Some(1), Some(0)], &["g0", "g1"]);
        assert_eq!(RowKeys::of(&batch(a_value_a_row), "instance_id"), None);

        assert_eq!(
            RowKeys::of(&batch(StringArray::from(vec!["g0", "g1"])), "instance_id"),
            None
        );
        assert_eq!(
            RowKeys::of(&batch(dictionary(&[Some(0), Some(0)], &["g0"])), "run_id"),
            None,
            "no such column"
        );
        let null_key = dictionary(&[Some(0), None, Some(0)], &["g0"]);
        assert_eq!(RowKeys::of(&batch(null_key), "instance_id"), None);
        let more_values_than_rows = dictionary(&[Some(0), Some(0)], &["g0", "g1", "g2"]);
        assert_eq!(RowKeys::of(&batch(more_values_than_rows), "instance_id"), None);
    }
}
