//! Which of a set of hashes meet another's in their low bits: the few
//! values an exact check then has to compare, out of many that are all
//! distinct (a step's `trajectory_id`s, a dictionary's values).

use std::hash::BuildHasher;

/// Which of a set of hashes share their low bits with another of the set:
/// a bit array a slot, marked when a second hash lands in it. Equal hashes
/// always clash, so what does not clash is distinct; the few that do are
/// left for an exact check. One pass over the hashes into two bit arrays
/// small enough to stay in cache.
pub struct LowBitClashes {
    mask: usize,
    clash: Vec<u64>,
    any: bool,
}

/// [`LowBitClashes`] marked a hash at a time, as hashes come (a step's rows
/// as their messages arrive), sized up front for the hashes expected.
#[derive(Debug)]
pub struct LowBitMarks {
    mask: usize,
    seen: Vec<u64>,
    clash: Vec<u64>,
    any: bool,
    marked: usize,
}

impl LowBitMarks {
    /// Room for `expected` hashes at about `bits_per_hash` bits each,
    /// rounded to a power of two, at least 64 and at most `max_bits`
    /// rounded down to one (two such arrays are held while they are
    /// marked). The more bits, the fewer clashes that are not equal hashes:
    /// with 8 bits a hash about 11% of the hashes clash.
    pub fn with_room(expected: usize, bits_per_hash: usize, max_bits: usize) -> Self {
        let bits = Self::bits_for(expected, bits_per_hash, max_bits);
        LowBitMarks {
            mask: bits - 1,
            seen: vec![0; bits / 64],
            clash: vec![0; bits / 64],
            any: false,
            marked: 0,
        }
    }

    /// The bits [`LowBitMarks::with_room`] takes.
    fn bits_for(expected: usize, bits_per_hash: usize, max_bits: usize) -> usize {
        let cap = match max_bits {
            0..=64 => 64,
            _ => 1 << (usize::BITS - 1 - max_bits.leading_zeros()),
        };
        expected
            .saturating_mul(bits_per_hash)
            .clamp(64, cap)
            .next_power_of_two()
    }

    /// Marks one hash: a clash when its slot was marked before.
    #[inline]
    pub fn mark(&mut self, hash: u64) {
        let slot = (hash as usize) & self.mask;
        let (word, bit) = (slot / 64, 1u64 << (slot % 64));
        if self.seen[word] & bit != 0 {
            self.clash[word] |= bit;
            self.any = true;
        }
        self.seen[word] |= bit;
        self.marked += 1;
    }

    /// Whether the arrays have at least as many bits as
    /// [`LowBitMarks::with_room`] would give for the hashes marked so far:
    /// if so, marked as they came, they clash no more than if marked at
    /// once; if not (more hashes came than expected), too many may clash.
    pub fn enough_bits(&self, bits_per_hash: usize, max_bits: usize) -> bool {
        self.mask + 1 >= Self::bits_for(self.marked, bits_per_hash, max_bits)
    }

    /// The bytes its two arrays hold.
    pub fn footprint(&self) -> usize {
        (self.seen.len() + self.clash.len()) * 8
    }

    /// The clashes among the hashes marked.
    pub fn into_clashes(self) -> LowBitClashes {
        LowBitClashes {
            mask: self.mask,
            clash: self.clash,
            any: self.any,
        }
    }
}

impl LowBitClashes {
    /// The clashes among `hashes` in a bit array of about `bits_per_hash`
    /// bits a hash ([`LowBitMarks::with_room`]).
    pub fn of(hashes: &[u64], bits_per_hash: usize, max_bits: usize) -> Self {
        let mut marks = LowBitMarks::with_room(hashes.len(), bits_per_hash, max_bits);
        for &h in hashes {
            marks.mark(h);
        }
        marks.into_clashes()
    }

    /// Whether any two hashes clash (none: all differ).
    pub fn any(&self) -> bool {
        self.any
    }

    /// Whether `hash`, one of the set, shares its slot with another.
    pub fn contains(&self, hash: u64) -> bool {
        let slot = (hash as usize) & self.mask;
        self.clash[slot / 64] & (1 << (slot % 64)) != 0
    }
}

/// Keeps the `suspects` (hashes that clashed in their low bits, each with
/// what it stands for) whose high 32 bits clash too, in their order: every
/// hash equal to another stays, and of the rest about one in twenty (16
/// bits a suspect), so that sorting what stays costs little. At 1M rows
/// a step's 11% of suspects took 3 ms to sort.
pub fn retain_high_clashes<T>(suspects: &mut Vec<(u64, T)>) {
    let mut marks = LowBitMarks::with_room(suspects.len(), 16, 1 << 21);
    for &(hash, _) in suspects.iter() {
        marks.mark(hash >> 32);
    }
    let clashes = marks.into_clashes();
    suspects.retain(|&(hash, _)| clashes.contains(hash >> 32));
}

/// Whether all `values` differ. Each value is hashed once; a bit array of
/// about 16 bits a value, at most 2^21 bits (small enough for the L2 cache),
/// finds the few values whose low hash bits meet another's
/// ([`LowBitClashes`]), and only those are compared, by full hash and then
/// by string. About 4× faster than inserting every value into a hash set,
/// which is what the dictionary of a dictionary-encoded column costs before
/// its keys can serve as group ids.
pub fn all_distinct<'a, I>(values: I) -> bool
where
    I: IntoIterator<Item = &'a str>,
    I::IntoIter: Clone,
{
    let iter = values.into_iter();
    let hasher = foldhash::fast::RandomState::default();
    let hashes: Vec<u64> = iter.clone().map(|v| hasher.hash_one(v.as_bytes())).collect();
    let clashes = LowBitClashes::of(&hashes, 16, 1 << 21);
    if !clashes.any() {
        return true;
    }
    // The values whose low bits clash, by full hash; equal full hashes are
    // settled by the strings.
    let mut suspects: Vec<(u64, &'a str)> = hashes
        .iter()
        .zip(iter)
        .filter(|(&h, _)| clashes.contains(h))
        .map(|(&h, v)| (h, v))
        .collect();
    retain_high_clashes(&mut suspects);
    suspects.sort_unstable();
    !suspects.windows(2).any(|w| w[0] == w[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_hashes_always_clash_and_lone_slots_never_do() {
        let clashes = LowBitClashes::of(&[7, 9, 7, 64 + 9, 3], 8, 64);
        assert!(clashes.any());
        assert!(clashes.contains(7), "equal hashes");
        assert!(clashes.contains(9) && clashes.contains(64 + 9), "equal low bits");
        assert!(!clashes.contains(3));
        assert!(!LowBitClashes::of(&[1, 2, 3], 8, 1 << 23).any());
        assert!(!LowBitClashes::of(&[], 8, 1 << 23).any());
    }

    #[test]
    fn the_bit_array_stays_within_its_bound() {
        // 100 hashes at 8 bits would take 1,024 bits; the bound keeps 64
        // (and 100 rounds down to 64), so 9 and 73 share a slot.
        let hashes: Vec<u64> = (0..100).map(|i| i * 1_000_003).chain([9, 73]).collect();
        for max_bits in [64, 100] {
            let clashes = LowBitClashes::of(&hashes, 8, max_bits);
            assert!(clashes.contains(9) && clashes.contains(73), "max_bits {max_bits}");
        }
        // Unbounded, the two sit apart.
        assert!(!LowBitClashes::of(&[9, 73], 64, 1 << 23).any());
    }

    #[test]
    fn marks_made_a_hash_at_a_time_clash_as_marks_made_at_once() {
        let hasher = foldhash::fast::RandomState::default();
        let hashes: Vec<u64> = (0..5_000u64).map(|i| hasher.hash_one(i)).collect();
        let at_once = LowBitClashes::of(&hashes, 8, 1 << 23);
        let mut marks = LowBitMarks::with_room(hashes.len(), 8, 1 << 23);
        hashes.iter().for_each(|&h| marks.mark(h));
        assert!(marks.enough_bits(8, 1 << 23));
        let one_by_one = marks.into_clashes();
        assert!(at_once.any() && one_by_one.any());
        for &h in &hashes {
            assert_eq!(one_by_one.contains(h), at_once.contains(h), "{h:#x}");
        }
        // Sized for fewer hashes than came: too few bits.
        let mut small = LowBitMarks::with_room(100, 8, 1 << 23);
        hashes.iter().for_each(|&h| small.mark(h));
        assert!(!small.enough_bits(8, 1 << 23));
        assert_eq!(small.footprint(), 2 * 1024 / 8);
    }

    #[test]
    fn high_clashes_keep_every_equal_hash_in_order_and_few_others() {
        // 100,000 distinct hashes that all share their low 32 bits, and
        // three planted twice.
        let mut suspects: Vec<(u64, usize)> = (0..100_000u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) << 32) | 7)
            .enumerate()
            .map(|(row, h)| (h, row))
            .collect();
        let planted = [suspects[10].0, suspects[500].0, suspects[99_999].0];
        suspects.extend(planted.iter().enumerate().map(|(i, &h)| (h, 100_000 + i)));
        retain_high_clashes(&mut suspects);
        for h in planted {
            let rows: Vec<usize> = suspects.iter().filter(|s| s.0 == h).map(|s| s.1).collect();
            assert_eq!(rows.len(), 2, "{h:#x}");
        }
        assert!(suspects.windows(2).all(|w| w[0].1 < w[1].1), "in their order");
        assert!(suspects.len() < 10_000, "{} kept", suspects.len());
    }

    #[test]
    fn tells_apart_prefixes_empty_strings_and_many_values() {
        let input = ["", "a", "ab", "", "abc", "ab"];
        assert!(!all_distinct(input.iter().copied()));
        assert!(all_distinct(["", "a", "ab", "ba", "abc"]));
        assert!(!all_distinct(["x", "y", "x"]));
        // Enough values that low hash bits clash, with and without a
        // repeated one.
        let many: Vec<String> = (0..20_000).map(|i| format!("task-{i}")).collect();
        assert!(all_distinct(many.iter().map(String::as_str)));
        let mut repeated = many.clone();
        repeated.push("task-12345".into());
        assert!(!all_distinct(repeated.iter().map(String::as_str)));
    }
}
