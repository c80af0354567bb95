//! An intake bound a taken message holds (a message slot, or its bytes)
//! until it ends, or under exactly_once until a commit passes its offset.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use crate::metrics::StageMetrics;

/// What a taken message holds of the intake's bounds: its message slot
/// and, under a byte bound, its bytes; held until it ends (under
/// exactly_once, until a commit passes its offset). One value, not a list:
/// a message has at most these two.
pub struct Holds {
    _slot: OwnedSemaphorePermit,
    _bytes: Option<Hold>,
}

impl Holds {
    pub fn new(slot: OwnedSemaphorePermit, bytes: Option<Hold>) -> Self {
        Holds {
            _slot: slot,
            _bytes: bytes,
        }
    }
}

/// A message's bytes of the byte bound, until it ends. The in-flight bytes
/// gauge is kept current as holds come and go: each adds its bytes to it
/// and takes them away, atomically.
pub struct Hold {
    _permit: OwnedSemaphorePermit,
    bytes: usize,
    metrics: Arc<StageMetrics>,
}

impl Hold {
    /// `bytes` of the byte bound, added to the in-flight bytes gauge of
    /// `metrics` until the hold ends.
    pub fn bytes(permit: OwnedSemaphorePermit, bytes: usize, metrics: Arc<StageMetrics>) -> Self {
        metrics.add_in_flight_bytes(bytes);
        Hold {
            _permit: permit,
            bytes,
            metrics,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.metrics.remove_in_flight_bytes(self.bytes);
    }
}
