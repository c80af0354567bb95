//! Dense group ids: the kernels want `u32` ids in `0..n_groups`, the wire has
//! arbitrary strings (or Arrow dictionary keys, which are dense already).

use hashbrown::hash_table::HashTable;
use std::hash::BuildHasher;

/// Group ids of a batch, mapped to `0..n_groups` in order of first
/// appearance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DenseGroups {
    pub ids: Vec<u32>,
    pub n_groups: usize,
}

impl DenseGroups {
    /// Maps string ids; equal strings get equal ids. Each string is hashed
    /// once and nothing is allocated per row: see [`StringIds`].
    pub fn from_strings<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        let iter = values.into_iter();
        let rows = iter.size_hint().0;
        let mut map = StringIds::with_capacity(rows / 4 + 1);
        let mut ids = Vec::with_capacity(rows);
        ids.extend(iter.map(|v| map.id(v)));
        DenseGroups {
            ids,
            n_groups: map.len(),
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

/// Strings to dense ids in order of first appearance.
///
/// The table holds ids only; each id's bytes are copied once into a compact
/// arena, with 8 bytes of metadata (32 bits of its hash, where its bytes
/// start). Confirming a match thus reads this map's own memory (a few MB for
/// 100,000s of groups) instead of the first row that had the string, which
/// for rows decoded one by one sits in its own allocation somewhere in the
/// heap: a cache miss per row, the cost that dominated the mapping before
/// (113 ms for 1M rows with a `HashMap<&str, u32>`, 40 ms with this).
/// foldhash: ids are trainer-chosen strings, not attacker-chosen, and SipHash
/// was a third of the whole compute path at 1M rows.
pub struct StringIds {
    table: HashTable<u32>,
    /// Per id below `meta.len()`: its hash bits and arena offset.
    meta: Vec<Meta>,
    /// The strings of the ids in `meta`, back to back.
    bytes: Vec<u8>,
    /// Strings first seen after the arena reached `u32::MAX` bytes (4 GiB
    /// of distinct ids: in practice never), with their ids.
    overflow: std::collections::HashMap<String, u32, foldhash::fast::RandomState>,
    hasher: foldhash::fast::RandomState,
}

#[derive(Clone, Copy)]
struct Meta {
    /// The low 32 bits of the string's hash (the table's control bytes
    /// already hold 7 others): a cheap first check before the bytes.
    hash: u32,
    start: u32,
}

impl StringIds {
    /// A map sized for about `groups` distinct strings.
    pub fn with_capacity(groups: usize) -> Self {
        StringIds {
            table: HashTable::with_capacity(groups),
            meta: Vec::with_capacity(groups),
            bytes: Vec::with_capacity(groups.saturating_mul(16)),
            overflow: Default::default(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// How many distinct strings were seen.
    pub fn len(&self) -> usize {
        self.meta.len() + self.overflow.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id of `value`, a new one (the next integer) if it is new.
    ///
    /// # Panics
    /// On the 2^32nd distinct string: the kernels address groups with `u32`
    /// ids, and a batch with that many groups has at least 2^32 rows (32 GiB
    /// of rewards alone), far past any message or file this crate accepts.
    pub fn id(&mut self, value: &str) -> u32 {
        // Bytes, not str: the rehash below sees bytes.
        let hash = self.hasher.hash_one(value.as_bytes());
        let (meta, bytes) = (&self.meta, &self.bytes);
        let string = |id: u32| {
            let i = id as usize;
            let end = meta.get(i + 1).map_or(bytes.len(), |m| m.start as usize);
            &bytes[meta[i].start as usize..end]
        };
        let eq = |&id: &u32| meta[id as usize].hash == hash as u32 && string(id) == value.as_bytes();
        if let Some(&id) = self.table.find(hash, eq) {
            return id;
        }
        if let Some(&id) = self.overflow.get(value) {
            return id;
        }
        let id = u32::try_from(self.len()).expect("fewer than 2^32 distinct group ids (see # Panics)");
        // Once one string overflowed, every new one does, so that the ids in
        // the table stay the indices of `meta`.
        let fits = self.overflow.is_empty() && u32::try_from(self.bytes.len() + value.len()).is_ok();
        if fits {
            let start = self.bytes.len() as u32;
            let (meta, bytes, hasher) = (&self.meta, &self.bytes, &self.hasher);
            // Rehashing on growth recomputes each hash from the arena.
            let rehash = |&id: &u32| {
                let i = id as usize;
                let end = meta.get(i + 1).map_or(bytes.len(), |m| m.start as usize);
                hasher.hash_one(&bytes[meta[i].start as usize..end])
            };
            self.table.insert_unique(hash, id, rehash);
            self.meta.push(Meta {
                hash: hash as u32,
                start,
            });
            self.bytes.extend_from_slice(value.as_bytes());
        } else {
            self.overflow.insert(value.to_string(), id);
        }
        id
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

    #[test]
    fn tells_apart_prefixes_empty_strings_and_many_ids() {
        let words: Vec<String> = (0..5000).map(|i| format!("g{}", i % 1700)).collect();
        let mut input: Vec<&str> = vec!["", "a", "ab", "", "abc", "ab"];
        input.extend(words.iter().map(String::as_str));
        let g = DenseGroups::from_strings(input.iter().copied());
        assert_eq!(&g.ids[..6], &[0, 1, 2, 0, 3, 2]);
        assert_eq!(g.n_groups, 4 + 1700);
        // Same id exactly when same string, checked pairwise on a sample.
        for i in (0..input.len()).step_by(7) {
            for j in (0..input.len()).step_by(11) {
                assert_eq!(g.ids[i] == g.ids[j], input[i] == input[j], "{i} {j}");
            }
        }
    }
}
