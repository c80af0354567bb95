//! A dictionary array's keys read without arrow's panic on a dictionary of
//! no values.

use arrow_array::AnyDictionaryArray;

/// A dictionary's keys as indices into its values (`normalized_keys`), or
/// `None` when it has no values, where `normalized_keys` panics. pyarrow
/// writes a dictionary-encoded column of nulls only so: every key null.
/// (Keys out of range were refused by the decoder's validation already;
/// `normalized_keys` would give them the last value.)
pub(super) fn value_indices(dict: &dyn AnyDictionaryArray) -> Option<Vec<usize>> {
    (!dict.values().is_empty()).then(|| dict.normalized_keys())
}
