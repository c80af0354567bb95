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

    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.entries.get(key).map(|(_, v)| v)
    }

    /// The entry of `key`, marked most recently used; `make` builds it when
    /// absent. Returns the entries evicted to make room (least recently
    /// used first), so that the caller can drop what points at them.
    pub fn touch_or_insert_with(&mut self, key: &K, make: impl FnOnce() -> V) -> (&mut V, Vec<(K, V)>) {
        self.touch_or_insert_keeping(key, make, |_| false)
    }

    /// As [`Lru::touch_or_insert_with`], but an entry `keep` says yes to is
    /// never evicted: the least recently used of the others goes instead
    /// (when every entry is kept, the map holds more than its capacity for
    /// as long as that lasts).
    pub fn touch_or_insert_keeping(
        &mut self,
        key: &K,
        make: impl FnOnce() -> V,
        keep: impl Fn(&K) -> bool,
    ) -> (&mut V, Vec<(K, V)>) {
        let mut evicted = Vec::new();
        if !self.entries.contains_key(key) {
            while self.entries.len() >= self.capacity {
                let Some(oldest) = self.order.values().find(|k| !keep(k)).cloned() else {
                    break;
                };
                if let Some((tick, v)) = self.entries.remove(&oldest) {
                    self.order.remove(&tick);
                    evicted.push((oldest, v));
                }
            }
        }
        self.tick += 1;
        let tick = self.tick;
        if let Some((old, _)) = self.entries.get(key) {
            self.order.remove(old);
        }
        self.order.insert(tick, key.clone());
        let slot = self.entries.entry(key.clone()).or_insert_with(|| (tick, make()));
        slot.0 = tick;
        (&mut slot.1, evicted)
    }

    /// The entry of `key`, to change in place; its place in the order
    /// stays (it is not marked used).
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.entries.get_mut(key).map(|(_, v)| v)
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

    #[test]
    fn a_kept_entry_is_never_evicted_and_get_mut_does_not_touch() {
        let mut lru: Lru<&str, u32> = Lru::new(2);
        lru.touch_or_insert_with(&"live", || 1);
        lru.touch_or_insert_with(&"b", || 2);
        *lru.get_mut(&"live").unwrap() += 10;
        let (_, evicted) = lru.touch_or_insert_keeping(&"c", || 3, |k| *k == "live");
        assert_eq!(evicted, vec![("b", 2)], "the oldest not kept goes");
        let (_, evicted) = lru.touch_or_insert_keeping(&"d", || 4, |k| *k == "live");
        assert_eq!(evicted, vec![("c", 3)]);
        assert_eq!(lru.get(&"live"), Some(&11));
        let (_, evicted) = lru.touch_or_insert_with(&"e", || 5);
        assert_eq!(evicted, vec![("live", 11)], "get_mut did not mark it used");
    }
}
