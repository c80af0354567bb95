//! The hint cache: every group costs at most one LLM call, whatever the
//! redeliveries. Keyed by `hint_id` (the group key, prompt version and model
//! chain), bounded in the bytes its hints hold in memory
//! ([`CachedHint::weight`]) with a time to live. A redelivered or late member
//! of a group whose hint is cached gets the same hint republished, with the
//! same text; concurrent requests for one `hint_id` wait for a single
//! synthesis.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::messages::Hint;

/// A hint as published: the message and its serialized bytes.
#[derive(Debug)]
pub struct CachedHint {
    pub hint: Hint,
    pub payload: Vec<u8>,
}

/// The most room a thread's encoding buffer ([`ENCODING`]) keeps between
/// hints: a model's long hint grows it, and it goes back to this after.
const ENCODING_KEPT: usize = 64 * 1024;

thread_local! {
    /// Where a thread encodes a hint before the cache keeps a copy of
    /// exactly its length: one allocation a hint. (Encoding into a buffer
    /// made for it, then shrinking that to its length, cost an allocation,
    /// a copy and a free more: 3% of stage 1's CPU on static hints.)
    static ENCODING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl CachedHint {
    pub fn new(hint: Hint) -> Self {
        let payload = ENCODING.with_borrow_mut(|buffer| {
            buffer.clear();
            // A struct of strings and finite numbers always serialises.
            let payload = match serde_json::to_writer(&mut *buffer, &hint) {
                Ok(()) => buffer.to_vec(),
                Err(_) => Vec::new(),
            };
            if buffer.capacity() > ENCODING_KEPT {
                buffer.clear();
                buffer.shrink_to(ENCODING_KEPT);
            }
            payload
        });
        CachedHint { hint, payload }
    }

    /// The bytes it holds in memory as the cache keeps it under `id`: its
    /// encoding, the message's text fields and the struct itself, the id
    /// once (the map's key and the eviction order share it) and what an entry of
    /// each costs ([`ENTRY_OVERHEAD`]). It counts capacities, not lengths,
    /// and leaves out the allocator's rounding, the map's and the order's
    /// room to grow, and the order's stale ids (see [`State::insert`]): a
    /// full cache holds somewhat more than its bound.
    pub fn weight(&self, id: &str) -> u64 {
        let h = &self.hint;
        let optional = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
        let text = [
            &h.hint_id,
            &h.run_id,
            &h.instance_id,
            &h.trajectory_id,
            &h.hint,
            &h.prompt_version,
            &h.source.topic,
            &h.created_at,
            &h.arm,
        ]
        .iter()
        .map(|s| s.capacity())
        .sum::<usize>()
            + optional(&h.model)
            + optional(&h.failure_reason)
            + h.refines.capacity() * std::mem::size_of::<String>()
            + h.refines.iter().map(String::capacity).sum::<usize>();
        (self.payload.capacity() + text + std::mem::size_of::<Self>() + id.len() + ENTRY_OVERHEAD) as u64
    }
}

/// What an entry costs the cache besides its hint and id: its hint's and
/// its id's `Arc` counts, the map's slot (key, entry, control byte, at its load factor)
/// and the eviction order's slot.
const ENTRY_OVERHEAD: usize = {
    use std::mem::size_of;
    4 * size_of::<usize>()
        + (size_of::<Arc<str>>() + size_of::<Entry>() + 1) * 8 / 7
        + size_of::<(Arc<str>, Instant)>()
};

/// A cached hint: when it was made (its time to live counts from then)
/// and what it weighs against the bound.
struct Entry {
    hint: Arc<CachedHint>,
    made: Instant,
    bytes: u64,
}

/// The cache's state, under one lock (each call holds it for a map lookup
/// or an insert: a static or cached hint costs a few microseconds, and
/// moka's upkeep, which this replaced, was a tenth of stage 1's CPU).
#[derive(Default)]
struct State {
    /// Keyed by the id the eviction order shares (one copy an entry).
    /// foldhash, seeded at random as SipHash is: the ids are SHA-256 hex,
    /// not chosen by whoever writes the input (SipHash was 0.6% of stage
    /// 1's CPU on static hints).
    hints: HashMap<Arc<str>, Entry, foldhash::fast::RandomState>,
    /// Ids in the order their hints were made, for the oldest to go first;
    /// an id whose entry was replaced or removed since is skipped (its
    /// `made` differs).
    order: VecDeque<(Arc<str>, Instant)>,
    bytes: u64,
    /// Ids whose hint is being made: the maker's end, dropped when its
    /// turn ends (kept or dropped), which wakes every caller waiting for it.
    /// Its sender is made by the first caller that waits: a hint nobody
    /// waits for (nearly every one) costs no channel.
    making: HashMap<String, Option<watch::Sender<()>>, foldhash::fast::RandomState>,
}

impl State {
    fn remove(&mut self, id: &str) {
        if let Some(old) = self.hints.remove(id) {
            self.bytes -= old.bytes;
        }
    }

    /// Keeps `hint` for `id`, then lets the oldest go until the bound holds
    /// (a hint heavier than the whole bound is not kept).
    fn insert(&mut self, id: &str, hint: Arc<CachedHint>, max_bytes: u64) {
        let bytes = hint.weight(id);
        self.remove(id);
        if bytes > max_bytes {
            return;
        }
        let made = Instant::now();
        let id: Arc<str> = Arc::from(id);
        self.hints.insert(id.clone(), Entry { hint, made, bytes });
        self.order.push_back((id, made));
        self.bytes += bytes;
        while self.bytes > max_bytes {
            let Some((old, at)) = self.order.pop_front() else {
                break;
            };
            if self.hints.get(&*old).is_some_and(|e| e.made == at) {
                self.remove(&old);
            }
        }
        // Ids left over from replaced or expired entries: dropped when they
        // outnumber the entries.
        if self.order.len() > 2 * self.hints.len() + 64 {
            let hints = &self.hints;
            self.order
                .retain(|(id, at)| hints.get(&**id).is_some_and(|e| e.made == *at));
        }
    }
}

/// The hint cache: bounded in bytes (the oldest hints go first), each
/// hint kept for a time to live, one maker at a time for an id.
#[derive(Clone)]
pub struct HintCache {
    state: Arc<Mutex<State>>,
    max_bytes: u64,
    ttl: Duration,
}

/// Ends a maker's turn for an id: should the maker be dropped before its
/// hint was kept, the waiters are woken and one of them makes it.
struct Making<'a> {
    cache: &'a HintCache,
    id: &'a str,
    /// Cleared once the hint is kept (the turn ended with it, in the same
    /// lock).
    armed: bool,
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Dropping the sender wakes every receiver, however late it waits.
        let ended = self.cache.state().making.remove(self.id);
        drop(ended);
    }
}

/// What a caller of [`HintCache::get_or_make`] does next.
enum Turn {
    Cached(Arc<CachedHint>),
    Make,
    /// Wait for the maker's turn to end, then look again.
    Wait(watch::Receiver<()>),
}

impl HintCache {
    /// Keeps at most `max_bytes` of hints, each for `ttl`.
    pub fn new(max_bytes: u64, ttl: Duration) -> Self {
        HintCache {
            state: Arc::default(),
            max_bytes,
            ttl,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every change completes under the lock: a poisoned one is whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Under the lock: the fresh hint of `id`, or whether to make it or wait
    /// for its maker (subscribed under the lock, so no wakeup is missed).
    fn turn(&self, id: &str) -> Turn {
        let mut state = self.state();
        match state.hints.get(id) {
            Some(e) if e.made.elapsed() < self.ttl => return Turn::Cached(e.hint.clone()),
            Some(_) => state.remove(id),
            None => {}
        }
        match state.making.get_mut(id) {
            Some(maker) => Turn::Wait(maker.get_or_insert_with(|| watch::Sender::new(())).subscribe()),
            None => {
                state.making.insert(id.to_string(), None);
                Turn::Make
            }
        }
    }

    /// The cached hint for `hint_id`, or the one `make` builds (and caches).
    /// Returns whether it came from the cache. Concurrent calls for one id
    /// run `make` once: the others wait for it (and, should its maker be
    /// dropped first, one of them makes it). A hint older than the time to
    /// live is made again.
    pub async fn get_or_make(
        &self,
        hint_id: &str,
        make: impl Future<Output = CachedHint>,
    ) -> (Arc<CachedHint>, bool) {
        loop {
            match self.turn(hint_id) {
                Turn::Cached(hint) => return (hint, true),
                Turn::Make => break,
                Turn::Wait(mut ended) => {
                    // Err once the maker's sender is gone: its turn ended.
                    let _ = ended.changed().await;
                }
            }
        }
        let mut making = Making {
            cache: self,
            id: hint_id,
            armed: true,
        };
        let hint = Arc::new(make.await);
        let ended = {
            let mut state = self.state();
            state.insert(hint_id, hint.clone(), self.max_bytes);
            // Kept, and the turn ends in the same lock: the waiters find it.
            making.armed = false;
            state.making.remove(hint_id)
        };
        // Outside the lock: the waiters wake.
        drop(ended);
        (hint, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{HintCategory, HintSource, Usage};

    fn hint(text: &str) -> CachedHint {
        CachedHint::new(Hint {
            schema_version: 1,
            hint_id: "id".into(),
            run_id: "r".into(),
            step: 1,
            instance_id: "i".into(),
            trajectory_id: "t".into(),
            hint: text.into(),
            category: HintCategory::StaticFallback,
            model: None,
            prompt_version: "v".into(),
            latency_ms: 0,
            usage: Usage::default(),
            cost_usd: 0.0,
            failure_reason: None,
            source: HintSource {
                topic: "t".into(),
                partition: 0,
                offset: 0,
            },
            created_at: "2026-01-01T00:00:00Z".into(),
            arm: crate::messages::DEFAULT_ARM.into(),
            refines: Vec::new(),
            hint_truncated: false,
            hedged: false,
            leak: false,
            level: None,
        })
    }

    #[tokio::test]
    async fn a_second_request_gets_the_first_hint_without_making_one() {
        let cache = HintCache::new(1 << 20, Duration::from_secs(60));
        let (first, hit) = cache.get_or_make("a", async { hint("one") }).await;
        assert!(!hit);
        let (second, hit) = cache.get_or_make("a", async { panic!("made twice") }).await;
        assert!(hit);
        assert_eq!(first.payload, second.payload);
        let (other, hit) = cache.get_or_make("b", async { hint("two") }).await;
        assert!(!hit);
        assert_eq!(other.hint.hint, "two");
    }

    #[tokio::test]
    async fn concurrent_requests_make_one_hint() {
        let cache = HintCache::new(1 << 20, Duration::from_secs(60));
        let made = std::sync::atomic::AtomicUsize::new(0);
        let make = || async {
            made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            hint("slow")
        };
        let (a, b) = tokio::join!(cache.get_or_make("k", make()), cache.get_or_make("k", make()));
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(a.0.payload, b.0.payload);
        assert!(a.1 != b.1, "one made it, the other waited for it");
    }

    #[tokio::test]
    async fn an_entry_past_its_time_to_live_is_made_again() {
        let cache = HintCache::new(1 << 20, Duration::from_millis(1));
        let (first, hit) = cache.get_or_make("a", async { hint("one") }).await;
        assert!(!hit);
        let made = Instant::now();
        while made.elapsed() < Duration::from_millis(2) {
            std::hint::spin_loop();
        }
        let (again, hit) = cache.get_or_make("a", async { hint("two") }).await;
        assert!(!hit, "expired: made again");
        assert_eq!(first.hint.hint, "one");
        assert_eq!(again.hint.hint, "two");
    }

    #[tokio::test]
    async fn a_maker_dropped_midway_lets_a_waiter_make_it() {
        let cache = HintCache::new(1 << 20, Duration::from_secs(60));
        let never = cache.get_or_make("k", async {
            futures::future::pending::<()>().await;
            hint("never")
        });
        let waiter = cache.get_or_make("k", async { hint("second") });
        let (first, second) = tokio::join!(tokio::time::timeout(Duration::from_millis(20), never), waiter);
        assert!(first.is_err(), "the first maker never finishes and is dropped");
        assert_eq!(second.0.hint.hint, "second");
        assert!(!second.1);
        let (third, hit) = cache.get_or_make("k", async { panic!("made twice") }).await;
        assert!(hit);
        assert_eq!(third.hint.hint, "second");
    }

    #[tokio::test]
    async fn a_full_cache_lets_its_oldest_hints_go_and_keeps_the_newest() {
        let one = hint("x").weight("h-000");
        let cache = HintCache::new(16 * one, Duration::from_secs(60));
        for i in 0..64 {
            cache.get_or_make(&format!("h-{i:03}"), async { hint("x") }).await;
        }
        let kept: Vec<usize> = (0..64)
            .filter(|i| cache.state().hints.contains_key(format!("h-{i:03}").as_str()))
            .collect();
        assert_eq!(kept, (48..64).collect::<Vec<_>>(), "the 16 newest");
        let state = cache.state();
        assert_eq!(state.bytes, 16 * one);
        assert!(state.order.len() <= 2 * state.hints.len() + 64);
        assert!(state.making.is_empty());
    }

    #[test]
    fn a_hint_longer_than_the_kept_buffer_encodes_whole_and_the_buffer_shrinks_back() {
        for text in ["x".repeat(3 * ENCODING_KEPT), "short".to_string()] {
            let mut made = hint("x");
            made.hint.hint = text;
            let again = CachedHint::new(made.hint.clone());
            assert_eq!(again.payload, serde_json::to_vec(&made.hint).unwrap());
            assert_eq!(again.payload.capacity(), again.payload.len());
            assert!(ENCODING.with_borrow(Vec::capacity) <= ENCODING_KEPT);
        }
    }

    #[test]
    fn a_kept_hint_weighs_what_it_holds() {
        let plain = hint("x");
        assert_eq!(
            plain.payload.capacity(),
            plain.payload.len(),
            "no room kept past the encoding"
        );
        let base = plain.weight("id");
        let floor = plain.payload.len() + plain.hint.created_at.len() + std::mem::size_of::<CachedHint>() + 2;
        assert!(base as usize > floor, "{base} bytes for at least {floor}");
        // Every text field counts, not only the hint's text and encoding.
        let mut reason = hint("x");
        reason.hint.failure_reason = Some("r".repeat(1000));
        reason.hint.model = Some("m".repeat(100));
        assert!(reason.weight("id") >= base + 1100);
        assert_eq!(
            plain.weight("a-longer-id"),
            base + ("a-longer-id".len() - 2) as u64
        );
    }

    #[tokio::test]
    async fn a_hint_heavier_than_the_bound_is_published_and_not_kept() {
        let cache = HintCache::new(100, Duration::from_secs(60));
        let (big, hit) = cache.get_or_make("big", async { hint("x") }).await;
        assert!(!hit);
        assert_eq!(big.hint.hint, "x");
        assert_eq!(cache.state().bytes, 0);
        assert!(cache.state().hints.is_empty());
    }
}
