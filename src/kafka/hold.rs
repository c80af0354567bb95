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

/// The gauge of the bytes held now under a byte bound, which every
/// [`Hold`] of one bound adds to and takes from.
pub struct HeldBytes {
    metrics: Arc<StageMetrics>,
}

impl HeldBytes {
    pub fn new(metrics: Arc<StageMetrics>) -> Arc<Self> {
        Arc::new(HeldBytes { metrics })
    }
}

/// A message's bytes of the byte bound, until it ends. The in-flight bytes
/// gauge is kept current as holds come and go.
pub struct Hold {
    _permit: OwnedSemaphorePermit,
    bytes: usize,
    held: Arc<HeldBytes>,
}

impl Hold {
    /// `bytes` of the byte bound; `held` sums what every hold has.
    pub fn bytes(permit: OwnedSemaphorePermit, bytes: usize, held: Arc<HeldBytes>) -> Self {
        held.metrics.add_in_flight_bytes(bytes);
        Hold {
            _permit: permit,
            bytes,
            held,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.held.metrics.remove_in_flight_bytes(self.bytes);
    }
}
