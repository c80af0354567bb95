//! The hint cache: every group costs at most one LLM call, whatever the
//! redeliveries. Keyed by `hint_id` (the group key, prompt version and model
//! chain), bounded in bytes with a time to live. A redelivered or late member
//! of a group whose hint is cached gets the same hint republished, with the
//! same text; concurrent requests for one `hint_id` wait for a single
//! synthesis.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quick_cache::sync::Cache;
use quick_cache::Weighter;

use crate::messages::Hint;

/// A hint as published: the message and its serialized bytes.
#[derive(Debug)]
pub struct CachedHint {
    pub hint: Hint,
    pub payload: Vec<u8>,
}

impl CachedHint {
    pub fn new(hint: Hint) -> Self {
        // A struct of strings and finite numbers always serialises.
        let payload = serde_json::to_vec(&hint).unwrap_or_default();
        CachedHint { hint, payload }
    }
}

/// A cached hint and when it was made (its time to live counts from then).
#[derive(Clone)]
struct Entry {
    hint: Arc<CachedHint>,
    made: Instant,
}

/// An entry weighs its bytes: the id, the payload, the text, and a margin
/// for the rest of the message.
#[derive(Clone)]
struct Bytes;

impl Weighter<String, Entry> for Bytes {
    fn weight(&self, id: &String, entry: &Entry) -> u64 {
        let h = &entry.hint;
        (id.len() + h.payload.len() + h.hint.hint.len() + 256) as u64
    }
}

/// Entries the cache's table is sized for at first, at most (it grows).
const MAX_ESTIMATED_ENTRIES: u64 = 1 << 16;

#[derive(Clone)]
pub struct HintCache {
    hints: Arc<Cache<String, Entry, Bytes>>,
    ttl: Duration,
}

impl HintCache {
    /// Keeps at most `max_bytes` of hints, each for `ttl`.
    pub fn new(max_bytes: u64, ttl: Duration) -> Self {
        // quick_cache: a sharded map with a light eviction policy and no
        // background upkeep (a static or cached hint costs a few
        // microseconds; the cache's own work should not be most of it).
        let estimated = (max_bytes / 1024).clamp(16, MAX_ESTIMATED_ENTRIES) as usize;
        let hints = Arc::new(Cache::with_weighter(estimated, max_bytes, Bytes));
        HintCache { hints, ttl }
    }

    /// The cached hint for `hint_id`, or the one `make` builds (and caches).
    /// Returns whether it came from the cache. Concurrent calls for one id
    /// run `make` once (the others wait for it; should the maker be
    /// dropped first, one of them makes it). An entry older than the time
    /// to live is made again.
    pub async fn get_or_make(
        &self,
        hint_id: &str,
        make: impl Future<Output = CachedHint>,
    ) -> (Arc<CachedHint>, bool) {
        loop {
            match self.hints.get_value_or_guard_async(hint_id).await {
                Ok(entry) if entry.made.elapsed() < self.ttl => return (entry.hint, true),
                Ok(stale) => {
                    // Only this stale entry: a fresh one another caller
                    // put in meanwhile stays.
                    self.hints
                        .remove_if(hint_id, |e| Arc::ptr_eq(&e.hint, &stale.hint));
                }
                Err(guard) => {
                    let hint = Arc::new(make.await);
                    let entry = Entry {
                        hint: hint.clone(),
                        made: Instant::now(),
                    };
                    // Err: the placeholder was removed meanwhile; the
                    // hint is still this caller's to publish.
                    let _ = guard.insert(entry);
                    return (hint, false);
                }
            }
        }
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
    }
}
