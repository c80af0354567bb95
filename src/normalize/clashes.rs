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

impl LowBitClashes {
    /// The clashes among `hashes` in a bit array of about `bits_per_hash`
    /// bits a hash, rounded to a power of two, at least 64 and at most
    /// `max_bits` rounded down to one (two such arrays are held while they
    /// are marked). The more bits, the fewer clashes that are not equal
    /// hashes: with 8 bits a hash about 11% of the hashes clash.
    pub fn of(hashes: &[u64], bits_per_hash: usize, max_bits: usize) -> Self {
        let cap = match max_bits {
            0..=64 => 64,
            _ => 1 << (usize::BITS - 1 - max_bits.leading_zeros()),
        };
        let bits = hashes
            .len()
            .saturating_mul(bits_per_hash)
            .clamp(64, cap)
            .next_power_of_two();
        let mask = bits - 1;
        let mut seen = vec![0u64; bits / 64];
        let mut clash = vec![0u64; bits / 64];
        let mut any = false;
        for &h in hashes {
            let slot = (h as usize) & mask;
            let (word, bit) = (slot / 64, 1u64 << (slot % 64));
            if seen[word] & bit != 0 {
                clash[word] |= bit;
                any = true;
            }
            seen[word] |= bit;
        }
        LowBitClashes { mask, clash, any }
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
/// bits a suspect), so that sorting what stays costs little. A 1M-row
/// step's 11% of suspects took 3-5 ms to sort.
pub fn retain_high_clashes<T>(suspects: &mut Vec<(u64, T)>) {
    let high: Vec<u64> = suspects.iter().map(|&(hash, _)| hash >> 32).collect();
    let clashes = LowBitClashes::of(&high, 16, 1 << 21);
    suspects.retain(|&(hash, _)| clashes.contains(hash >> 32));
}

/// The rows of `hashes` (each its index) whose hash may equal another's,
/// as (hash, row), sorted: those whose hash clashes in its low bits in a
/// bit array of `bits_per_hash` bits a hash, at most `max_bits`
/// ([`LowBitClashes`]), and then in its high bits
/// ([`retain_high_clashes`]). Every row whose hash equals another's is
/// among them, in a run of its equals, those in row order; none when no
/// low bits clash.
pub fn clashing_rows(hashes: &[u64], bits_per_hash: usize, max_bits: usize) -> Vec<(u64, u32)> {
    let clashes = LowBitClashes::of(hashes, bits_per_hash, max_bits);
    if !clashes.any() {
        return Vec::new();
    }
    let mut rows: Vec<(u64, u32)> = hashes
        .iter()
        .enumerate()
        .filter(|(_, &hash)| clashes.contains(hash))
        .map(|(row, &hash)| (hash, u32::try_from(row).expect("fewer than 2^32 rows")))
        .collect();
    retain_high_clashes(&mut rows);
    rows.sort_unstable();
    rows
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
