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
    /// Maps string ids; equal strings get equal ids. Strings are first told
    /// apart by a 64-bit hash (`by_hash`), then every row is checked
    /// against its group's first string; should two strings share a hash,
    /// the check fails and they are mapped again, exactly, by their bytes
    /// ([`StringIds`]).
    pub fn from_strings<'a, I>(values: I) -> Self
    where
        I: IntoIterator<Item = &'a str>,
        I::IntoIter: Clone,
    {
        Self::from_strings_with(values, foldhash::fast::RandomState::default())
    }

    fn from_strings_with<'a, I>(values: I, hasher: impl BuildHasher) -> Self
    where
        I: IntoIterator<Item = &'a str>,
        I::IntoIter: Clone,
    {
        let iter = values.into_iter();
        by_hash(iter.clone(), hasher).unwrap_or_else(|| by_bytes(iter))
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

/// Dense ids by the strings' bytes ([`StringIds`]): exact whatever the
/// hashes, and [`DenseGroups::from_strings`]' fallback.
fn by_bytes<'a>(values: impl Iterator<Item = &'a str>) -> DenseGroups {
    let rows = values.size_hint().0;
    let mut map = StringIds::with_capacity(rows / 4 + 1);
    let mut ids = Vec::with_capacity(rows);
    ids.extend(values.map(|v| map.id(v)));
    DenseGroups {
        ids,
        n_groups: map.len(),
    }
}

/// Rows whose table slots (then whose groups' first strings) are asked for
/// before any of them is read: see [`by_hash`].
const AHEAD: usize = 16;

/// A slot of [`by_hash`]'s table: a string's 64-bit hash and its id, or
/// `EMPTY`.
#[derive(Clone, Copy)]
struct Slot {
    hash: u64,
    id: u32,
}

const EMPTY: u32 = u32::MAX;

/// A slot that holds no string.
const VACANT: Slot = Slot { hash: 0, id: EMPTY };

/// Dense ids by 64-bit hash: `None` when two different strings share one
/// (the caller then maps by bytes), or when a new group's id would be
/// `EMPTY` (`u32::MAX`: the map by bytes, given it, panics a group later).
/// [`HashedGroups`] over all of `values` at once.
fn by_hash<'a, S: BuildHasher>(values: impl Iterator<Item = &'a str>, hasher: S) -> Option<DenseGroups> {
    let expected = values.size_hint().0;
    // A quarter as many groups, as GRPO's groups of several rollouts give.
    let mut groups = HashedGroups::with_hasher(expected, expected / 4, 0, hasher);
    groups.extend(values);
    groups.finish()
}

/// Dense ids by 64-bit hash, mapped as the strings come (a step's parts as
/// its messages bring them, or a whole column at once: `by_hash`), each
/// row checked as it is mapped (or, mapped by dictionary key, each key at
/// its first row: [`HashedGroups::extend_keyed`]).
///
/// A map of a million strings into a table of 100,000s is a cache miss a
/// row. As [`StringIds`] walks it (its control bytes, its slot, the id's
/// entry, the id's bytes: each read waiting for the one before), it is the
/// longest part of a 1M-row step's compute. Here the table holds the hash
/// beside the id, so a row's lookup is one read, and the reads of `AHEAD`
/// rows are asked for at once (a prefetch each) before the first is used.
/// Each row is then compared with the first string of its group (kept in
/// an arena), prefetched the same way: two strings that share a hash fail
/// the comparison, and the map gives up ([`HashedGroups::finish`] is then
/// `None`, and what it held is freed).
/// `cargo bench --bench advantages -- id_mapping/1000000` (125,000 groups
/// of 8, rows shuffled): 60 ms → 41 ms on one core.
pub struct HashedGroups<S = foldhash::fast::RandomState> {
    hasher: S,
    /// A power of two, at most half full.
    slots: Vec<Slot>,
    ids: Vec<u32>,
    /// The first string of each group, back to back, and where each ends.
    arena: Vec<u8>,
    ends: Vec<usize>,
    /// Two strings shared a hash, or the ids ran out: the map gave up.
    failed: bool,
}

impl HashedGroups {
    /// An empty map, holding nothing until its first rows.
    pub fn new() -> Self {
        Self::empty(foldhash::fast::RandomState::default())
    }

    /// A map with room for `rows` rows of `groups` groups whose first
    /// strings take `text` bytes ([`HashedGroups::room`] of a map as
    /// large): it grows no table and copies no column up to them.
    pub fn with_room(rows: usize, groups: usize, text: usize) -> Self {
        Self::with_hasher(rows, groups, text, foldhash::fast::RandomState::default())
    }
}

impl Default for HashedGroups {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: BuildHasher> HashedGroups<S> {
    /// An empty map that holds nothing yet.
    fn empty(hasher: S) -> Self {
        HashedGroups {
            hasher,
            slots: Vec::new(),
            ids: Vec::new(),
            arena: Vec::new(),
            ends: Vec::new(),
            failed: false,
        }
    }

    /// A map with room for `rows` rows of `groups` groups whose first
    /// strings take `text` bytes; its table is at least [`AHEAD`] * 2
    /// slots, the smallest [`Self::extend`] starts from.
    fn with_hasher(rows: usize, groups: usize, text: usize, hasher: S) -> Self {
        let capacity = (groups + 1).next_power_of_two().max(AHEAD) * 2;
        HashedGroups {
            slots: vec![VACANT; capacity],
            ids: Vec::with_capacity(rows),
            arena: Vec::with_capacity(text),
            ends: Vec::with_capacity(groups),
            ..Self::empty(hasher)
        }
    }

    /// What it holds, as [`HashedGroups::with_room`] takes it: its groups
    /// and their first strings' bytes.
    pub fn room(&self) -> (usize, usize) {
        (self.ends.len(), self.arena.len())
    }

    /// Rows mapped so far (none once the map gave up).
    pub fn rows(&self) -> usize {
        self.ids.len()
    }

    /// Bytes it holds (capacities).
    pub fn footprint(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.ids.capacity() * std::mem::size_of::<u32>()
            + self.arena.capacity()
            + self.ends.capacity() * std::mem::size_of::<usize>()
    }

    /// Maps `values`, the rows after those mapped already.
    pub fn extend<'a>(&mut self, mut values: impl Iterator<Item = &'a str>) {
        if self.slots.is_empty() && !self.failed {
            self.slots = vec![VACANT; AHEAD * 2];
        }
        let mut batch: [(u64, &str); AHEAD] = [(0, ""); AHEAD];
        while !self.failed {
            let mut taken = 0;
            for (at, value) in batch.iter_mut().zip(values.by_ref()) {
                let hash = self.hasher.hash_one(value.as_bytes());
                prefetch(&self.slots[hash as usize & (self.slots.len() - 1)]);
                *at = (hash, value);
                taken += 1;
            }
            if !self.map_and_check(&batch[..taken]) {
                self.give_up();
            }
            if taken < AHEAD {
                break;
            }
        }
    }

    /// Maps the rows after those mapped already, given by dictionary key:
    /// row `i` of them has key `keys[i]` (below `values`) and string
    /// `value(i)`, one string a key. Each key is looked up, and its string
    /// checked, once, at its first row: a message whose rows share a few
    /// groups costs a look-up a group instead of a hash a row. The ids are
    /// those [`Self::extend`] gives the same strings.
    pub fn extend_keyed<'a>(&mut self, keys: &[u32], values: usize, value: impl Fn(usize) -> &'a str) {
        if self.failed {
            return;
        }
        if self.slots.is_empty() {
            self.slots = vec![VACANT; AHEAD * 2];
        }
        let mut of_key = vec![EMPTY; values];
        self.ids.reserve(keys.len());
        for (row, &key) in keys.iter().enumerate() {
            let Some(known) = of_key.get_mut(key as usize) else {
                return self.give_up();
            };
            if *known == EMPTY {
                let string = value(row);
                let hash = self.hasher.hash_one(string.as_bytes());
                match self.id_of(hash, string) {
                    Some(id) if self.first(id) == string.as_bytes() => *known = id,
                    _ => return self.give_up(),
                }
            }
            self.ids.push(*known);
        }
    }

    /// Maps a batch of rows (their hashes' slots asked for already), then
    /// checks each against its group's first string. `false` when a new
    /// group's id would be `EMPTY`, or a row is not its group's string.
    fn map_and_check(&mut self, batch: &[(u64, &str)]) -> bool {
        let first_row = self.ids.len();
        for &(hash, value) in batch {
            let Some(id) = self.id_of(hash, value) else {
                return false;
            };
            self.ids.push(id);
        }
        let mapped = &self.ids[first_row..];
        for &id in mapped {
            prefetch(self.first(id).as_ptr());
        }
        mapped
            .iter()
            .zip(batch)
            .all(|(&id, (_, value))| self.first(id) == value.as_bytes())
    }

    /// The id of the string of `hash` (a new one, with `value` its first
    /// string, when the hash is new); `None` when a new id would be `EMPTY`.
    fn id_of(&mut self, hash: u64, value: &str) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut i = hash as usize & mask;
        loop {
            let slot = self.slots[i];
            if slot.id == EMPTY {
                let id = u32::try_from(self.ends.len()).ok().filter(|&id| id != EMPTY)?;
                self.slots[i] = Slot { hash, id };
                self.arena.extend_from_slice(value.as_bytes());
                self.ends.push(self.arena.len());
                // At most half full: linear probing stays a read or two.
                if self.ends.len() * 2 > self.slots.len() {
                    self.slots = grown(&self.slots, self.slots.len() * 2);
                }
                return Some(id);
            }
            if slot.hash == hash {
                return Some(slot.id);
            }
            i = (i + 1) & mask;
        }
    }

    /// The first string of group `id`.
    fn first(&self, id: u32) -> &[u8] {
        let id = id as usize;
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        &self.arena[start..self.ends[id]]
    }

    /// Gives up: frees what it holds, and maps nothing more.
    fn give_up(&mut self) {
        self.failed = true;
        self.slots = Vec::new();
        self.ids = Vec::new();
        self.arena = Vec::new();
        self.ends = Vec::new();
    }

    /// The dense ids of the rows mapped; `None` when the map gave up.
    pub fn finish(self) -> Option<DenseGroups> {
        (!self.failed).then_some(DenseGroups {
            ids: self.ids,
            n_groups: self.ends.len(),
        })
    }
}

/// `slots` moved into a table of `capacity` (a power of two).
fn grown(slots: &[Slot], capacity: usize) -> Vec<Slot> {
    let mut table = vec![VACANT; capacity];
    for slot in slots.iter().filter(|slot| slot.id != EMPTY) {
        let mut i = slot.hash as usize & (capacity - 1);
        while table[i].id != EMPTY {
            i = (i + 1) & (capacity - 1);
        }
        table[i] = *slot;
    }
    table
}

/// Asks the CPU for the cache line at `at` ahead of its use. A hint only:
/// nothing is read into the program and no address faults. A no-op off
/// x86-64, whose prefetch is the only one stable Rust offers.
#[inline(always)]
fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` reads no memory the program sees and never
    // faults, whatever the address; it needs SSE, which every x86-64 has.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Strings to dense ids in order of first appearance, by their bytes: what
/// [`DenseGroups::from_strings`] falls back on when two strings share a
/// 64-bit hash (or at 2^32 - 1 groups).
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

    #[test]
    fn the_hash_path_maps_as_the_bytes_do_through_its_growth() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for (rows, groups) in [
            (0, 1),
            (1, 1),
            (15, 3),
            (16, 16),
            (17, 5),
            (1000, 999),
            (50_000, 6_000),
        ] {
            let names: Vec<String> = (0..groups)
                .map(|g| match g % 4 {
                    0 => "x".repeat(g % 70),
                    1 => format!("swe-task-{g:08}"),
                    2 => format!("{}-{g}", "long".repeat(20)),
                    _ => format!("é{g}"),
                })
                .collect();
            let values: Vec<&str> = (0..rows)
                .map(|_| names[rng.random_range(0..groups)].as_str())
                .collect();
            let want = by_bytes(values.iter().copied());
            let hasher = foldhash::fast::RandomState::default();
            // Known to the iterator's size or not (the table then grows
            // from its smallest).
            let known = by_hash(values.iter().copied(), hasher.clone());
            let unknown = by_hash(values.iter().copied().filter(|_| true), hasher.clone());
            assert_eq!(known.as_ref(), Some(&want), "{rows} rows");
            assert_eq!(unknown.as_ref(), Some(&want), "{rows} rows");
            assert_eq!(DenseGroups::from_strings(values.iter().copied()), want);
        }
    }

    /// 5,000 rows of 700 groups mapped by `map` a part at a time, in parts
    /// of `sizes` (cycled; `map` is given each part's number), checked to
    /// have every row mapped after each; and the map finished, with the ids
    /// the whole column should get.
    fn mapped_in_parts(
        sizes: &[usize],
        mut map: impl FnMut(&mut HashedGroups, usize, &[&str]),
    ) -> (Option<DenseGroups>, DenseGroups) {
        let names: Vec<String> = (0..700).map(|g| format!("task-{g}")).collect();
        let values: Vec<&str> = (0..5000)
            .map(|row| names[(row * 31 + row / 9) % 700].as_str())
            .collect();
        let mut groups = HashedGroups::new();
        let mut at = 0;
        for (part, &size) in sizes.iter().cycle().enumerate() {
            let end = (at + size).min(values.len());
            map(&mut groups, part, &values[at..end]);
            assert_eq!(groups.rows(), end);
            at = end;
            if at == values.len() {
                break;
            }
        }
        (groups.finish(), by_bytes(values.iter().copied()))
    }

    #[test]
    fn rows_mapped_a_part_at_a_time_map_as_the_whole_column_does() {
        // Parts of every size around a batch of AHEAD, and empty ones.
        let sizes = [0, 1, AHEAD - 1, AHEAD, AHEAD + 1, 0, 3, 1000];
        let (mapped, want) = mapped_in_parts(&sizes, |groups, _, rows| groups.extend(rows.iter().copied()));
        assert_eq!(mapped, Some(want));
    }

    /// A message's rows as a dictionary: its distinct strings in a
    /// shuffled order, one unused and one repeated, and each row's key.
    fn as_dictionary<'a>(rows: &[&'a str]) -> (Vec<&'a str>, Vec<u32>) {
        let mut values: Vec<&str> = rows.to_vec();
        values.sort_unstable();
        values.dedup();
        values.reverse();
        values.push("never-a-row");
        if let Some(&first) = values.first() {
            values.push(first);
        }
        let keys = rows
            .iter()
            .enumerate()
            // Rows of the repeated string alternate between its two keys.
            .map(|(row, s)| match values.iter().rposition(|v| v == s) {
                Some(last) if row % 2 == 0 => last as u32,
                _ => values.iter().position(|v| v == s).unwrap() as u32,
            })
            .collect();
        (values, keys)
    }

    #[test]
    fn rows_mapped_by_dictionary_key_get_the_ids_their_strings_do_across_parts() {
        // Parts keyed and not, of every size, their groups spanning parts.
        let sizes = [0, 1, 17, 1000, 3, 400, 2000];
        let (mapped, want) = mapped_in_parts(&sizes, |groups, part, rows| {
            if part % 3 == 2 {
                groups.extend(rows.iter().copied());
            } else {
                let (dictionary, keys) = as_dictionary(rows);
                groups.extend_keyed(&keys, dictionary.len(), |row| rows[row]);
            }
        });
        assert_eq!(mapped, Some(want));
    }

    #[test]
    fn a_key_out_of_range_or_a_keyed_string_sharing_a_hash_gives_up() {
        let mut groups = HashedGroups::new();
        groups.extend_keyed(&[0, 1, 0], 2, |row| ["a", "b", "a"][row]);
        assert_eq!(groups.rows(), 3);
        groups.extend_keyed(&[0, 2], 2, |row| ["a", "c"][row]);
        assert_eq!(groups.finish(), None, "key 2 of a dictionary of 2");

        let mut groups = HashedGroups::with_hasher(0, 0, 0, OneHash);
        groups.extend_keyed(&[0, 0], 1, |_| "a");
        assert_eq!(groups.rows(), 2);
        groups.extend_keyed(&[1, 0], 2, |row| ["a", "b"][row]);
        assert_eq!(groups.finish(), None, "b shares a's hash");
    }

    #[test]
    fn a_part_whose_string_shares_a_hash_with_an_earlier_parts_gives_up() {
        let mut groups = HashedGroups::with_hasher(0, 0, 0, OneHash);
        groups.extend(["a", "a"].into_iter());
        assert_eq!(groups.rows(), 2);
        groups.extend(["a", "b", "a"].into_iter());
        assert_eq!(groups.rows(), 0, "freed once it gave up");
        assert_eq!(groups.footprint(), 0);
        groups.extend(["a"].into_iter());
        assert_eq!(groups.finish(), None);
    }

    /// Hashes everything to one value.
    struct OneHash;

    impl BuildHasher for OneHash {
        type Hasher = OneHasher;
        fn build_hasher(&self) -> OneHasher {
            OneHasher
        }
    }

    struct OneHasher;

    impl std::hash::Hasher for OneHasher {
        fn finish(&self) -> u64 {
            7
        }
        fn write(&mut self, _: &[u8]) {}
    }

    /// Hashes each string to its own value, all alike in their low 32 bits:
    /// every string starts probing at one slot.
    struct LowBitsAlike;

    impl BuildHasher for LowBitsAlike {
        type Hasher = Fnv;
        fn build_hasher(&self) -> Fnv {
            Fnv(0xcbf2_9ce4_8422_2325)
        }
    }

    struct Fnv(u64);

    impl std::hash::Hasher for Fnv {
        fn finish(&self) -> u64 {
            (self.0 << 32) | 31
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }

    #[test]
    fn strings_whose_slots_collide_probe_on_through_growth_and_the_tables_end() {
        let names: Vec<String> = (0..100).map(|g| format!("group-{g}")).collect();
        let values: Vec<&str> = (0..300).map(|row| names[(row * 7) % 100].as_str()).collect();
        let want = by_bytes(values.iter().copied());
        assert_eq!(want.n_groups, 100);
        // From the smallest table (32 slots: the probes from slot 31 wrap
        // at once), grown three times, and from one sized for the rows.
        let unknown = by_hash(values.iter().copied().filter(|_| true), LowBitsAlike);
        let known = by_hash(values.iter().copied(), LowBitsAlike);
        assert_eq!(unknown, Some(want.clone()));
        assert_eq!(known, Some(want));
    }

    #[test]
    fn strings_that_share_a_hash_are_told_apart_by_their_bytes() {
        let values = ["b", "a", "b", "c", "a"];
        assert_eq!(by_hash(values.iter().copied(), OneHash), None);
        let g = DenseGroups::from_strings_with(values, OneHash);
        assert_eq!(g.ids, vec![0, 1, 0, 2, 1]);
        assert_eq!(g.n_groups, 3);
        // One string alone has no other to clash with.
        assert_eq!(
            by_hash(["z", "z"].into_iter(), OneHash),
            Some(DenseGroups {
                ids: vec![0, 0],
                n_groups: 1
            })
        );
    }
}
