//! A small exact LRU map: a hash map of entries stamped with a use counter
//! and an ordered index of the stamps. Eviction order depends only on the
//! order of writes, never on time or hashing.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

#[derive(Debug, Clone)]
pub struct Lru<K, V> {
    entries: HashMap<K, (u64, V)>,
    order: BTreeMap<u64, K>,
    tick: u64,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// Keeps at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        Lru {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            capacity: capacity.max(1),
        }
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|(_, v)| v)
    }

    /// The entry of `key`, marked most recently used; `make` builds it when
    /// absent. Returns the entries evicted to make room (least recently
    /// used first), so that the caller can drop what points at them.
    pub fn touch_or_insert_with(&mut self, key: &K, make: impl FnOnce() -> V) -> (&mut V, Vec<(K, V)>) {
        self.tick += 1;
        let tick = self.tick;
        let mut evicted = Vec::new();
        if let Some((old, _)) = self.entries.get(key) {
            self.order.remove(old);
        } else {
            while self.entries.len() >= self.capacity {
                let Some((_, oldest)) = self.order.pop_first() else {
                    break;
                };
                if let Some((_, v)) = self.entries.remove(&oldest) {
                    evicted.push((oldest, v));
                }
            }
        }
        self.order.insert(tick, key.clone());
        let slot = self.entries.entry(key.clone()).or_insert_with(|| (tick, make()));
        slot.0 = tick;
        (&mut slot.1, evicted)
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, (_, v))| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_written_entry() {
        let mut lru: Lru<&str, u32> = Lru::new(2);
        *lru.touch_or_insert_with(&"a", || 1).0 += 10;
        lru.touch_or_insert_with(&"b", || 2);
        // Touching a makes b the oldest.
        assert!(lru.touch_or_insert_with(&"a", || 0).1.is_empty());
        let (_, evicted) = lru.touch_or_insert_with(&"c", || 3);
        assert_eq!(evicted, vec![("b", 2)]);
        assert_eq!(
            (lru.get(&"a"), lru.get(&"b"), lru.iter().count()),
            (Some(&11), None, 2)
        );
    }
}
