//! The endpoint's connection slots: at most `max` connections are served at
//! once, and a new one is always taken. When every slot is held, the
//! connection that has moved no byte for longest loses its slot and is
//! closed.
//!
//! Why evict rather than refuse: a probe cannot be told from any other
//! client before its request is read, so a slot reserve for probes fills
//! with idle connections the same way the cap does. Evicting the least
//! recently active connection gives every newcomer a slot, and the
//! connections that lose theirs are those that send nothing: a liveness
//! probe sends its request as soon as it connects, so idle connections,
//! however many and however often renewed, cannot keep it out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use super::idle::Activity;

/// The slots of one endpoint; shared by its accept loop and its
/// connections.
pub(super) struct Slots {
    max: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    next: u64,
    by_id: HashMap<u64, Holder>,
}

/// A connection holding a slot: when it last moved a byte, and how to tell
/// it to close.
struct Holder {
    activity: Activity,
    evict: CancellationToken,
}

/// One connection's slot, freed when dropped.
pub(super) struct Slot {
    id: u64,
    slots: Arc<Slots>,
    evicted: CancellationToken,
}

impl Slots {
    /// Slots for `max` connections (at least one).
    pub(super) fn new(max: usize) -> Arc<Self> {
        Arc::new(Slots {
            max: max.max(1),
            held: Mutex::new(Held::default()),
        })
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // Every change completes before the lock is released.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for a connection whose bytes `activity` follows. With
    /// every slot held, the holder that moved no byte for longest loses its
    /// slot first (its [`Slot::evicted`] fires); returns whether one did.
    pub(super) fn admit(self: &Arc<Self>, activity: Activity) -> (Slot, bool) {
        let mut held = self.held();
        let mut evicted = false;
        while held.by_id.len() >= self.max {
            let Some(oldest) = held
                .by_id
                .iter()
                .min_by_key(|(_, h)| h.activity.last_active())
                .map(|(id, _)| *id)
            else {
                break;
            };
            if let Some(holder) = held.by_id.remove(&oldest) {
                holder.evict.cancel();
                evicted = true;
            }
        }
        let id = held.next;
        held.next += 1;
        let token = CancellationToken::new();
        held.by_id.insert(
            id,
            Holder {
                activity,
                evict: token.clone(),
            },
        );
        (
            Slot {
                id,
                slots: self.clone(),
                evicted: token,
            },
            evicted,
        )
    }

    /// Connections holding a slot now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.held().by_id.len()
    }
}

impl Slot {
    /// Resolves once this connection lost its slot to a newer one.
    pub(super) async fn evicted(&self) {
        self.evicted.cancelled().await
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.held().by_id.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::idle::Tracked;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_newcomer_at_the_cap_evicts_the_connection_idle_longest() {
        let slots = Slots::new(3);
        let mut clients = Vec::new();
        let mut admitted = Vec::new();
        for _ in 0..3 {
            let (client, server) = tokio::io::duplex(64);
            let (tracked, activity) = Tracked::new(server);
            let (slot, evicted) = slots.admit(activity);
            assert!(!evicted);
            clients.push(client);
            admitted.push((slot, tracked));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // The first moves a byte now: the second is idle longest.
        let (slot, mut tracked) = admitted.remove(0);
        tracked.write_all(b"x").await.unwrap();
        admitted.insert(0, (slot, tracked));
        let (_, activity) = Tracked::new(tokio::io::duplex(64).1);
        let (newcomer, evicted) = slots.admit(activity);
        assert!(evicted);
        assert_eq!(slots.len(), 3);
        let fired = |i: usize| admitted[i].0.evicted.is_cancelled();
        assert_eq!((fired(0), fired(1), fired(2)), (false, true, false));
        // A slot freed by its connection's end is taken without eviction.
        drop(admitted.remove(2));
        let (_, activity) = Tracked::new(tokio::io::duplex(64).1);
        let (_another, evicted) = slots.admit(activity);
        assert!(!evicted);
        assert!(!newcomer.evicted.is_cancelled());
        assert_eq!(slots.len(), 3);
    }
}
