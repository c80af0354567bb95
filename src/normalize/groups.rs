//! Dense group ids: the kernels want `u32` ids in `0..n_groups`, the wire has
//! arbitrary strings (or Arrow dictionary keys, which are dense already).

use std::collections::HashMap;

use foldhash::fast::RandomState;

/// Group ids of a batch, mapped to `0..n_groups` in order of first
/// appearance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DenseGroups {
    pub ids: Vec<u32>,
    pub n_groups: usize,
}

impl DenseGroups {
    /// Maps string ids; equal strings get equal ids.
    pub fn from_strings<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        let iter = values.into_iter();
        // foldhash: ids are trainer-chosen strings, not attacker-chosen, and
        // SipHash was a third of the whole compute path at 1M rows.
        let mut index: HashMap<&'a str, u32, RandomState> =
            HashMap::with_capacity_and_hasher(iter.size_hint().0 / 4 + 1, RandomState::default());
        let ids = iter
            .map(|v| {
                let next = index.len() as u32;
                *index.entry(v).or_insert(next)
            })
            .collect();
        DenseGroups {
            ids,
            n_groups: index.len(),
        }
    }

    /// Uses dictionary keys as they are; `dictionary_len` values exist. Keys
    /// of unused dictionary values just leave empty groups.
    pub fn from_dictionary_keys(keys: impl IntoIterator<Item = u32>, dictionary_len: usize) -> Self {
        DenseGroups {
            ids: keys.into_iter().collect(),
            n_groups: dictionary_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_equal_strings_to_equal_ids_in_first_seen_order() {
        let g = DenseGroups::from_strings(["b", "a", "b", "c", "a"]);
        assert_eq!(g.ids, vec![0, 1, 0, 2, 1]);
        assert_eq!(g.n_groups, 3);
    }
}
