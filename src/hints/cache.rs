//! The hint cache: every group costs at most one LLM call, whatever the
//! redeliveries. Keyed by `hint_id` (the group key, prompt version and model
//! chain), bounded in bytes with a time to live. A redelivered or late member
//! of a group whose hint is cached gets the same hint republished, with the
//! same text; concurrent requests for one `hint_id` wait for a single
//! synthesis.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;

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

#[derive(Clone)]
pub struct HintCache {
    hints: Cache<String, Arc<CachedHint>>,
}

impl HintCache {
    /// Keeps at most `max_bytes` of hints, each for `ttl`.
    pub fn new(max_bytes: u64, ttl: Duration) -> Self {
        let hints = Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|id: &String, h: &Arc<CachedHint>| {
                u32::try_from(id.len() + h.payload.len() + h.hint.hint.len() + 256).unwrap_or(u32::MAX)
            })
            .time_to_live(ttl)
            .build();
        HintCache { hints }
    }

    /// The cached hint for `hint_id`, or the one `make` builds (and caches).
    /// Returns whether it came from the cache. Concurrent calls for one id
    /// run `make` once.
    pub async fn get_or_make(
        &self,
        hint_id: &str,
        make: impl Future<Output = CachedHint>,
    ) -> (Arc<CachedHint>, bool) {
        let mut made = false;
        let hint = self
            .hints
            .get_with_by_ref(hint_id, async {
                made = true;
                Arc::new(make.await)
            })
            .await;
        (hint, !made)
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
}
