//! An intake bound a taken message holds (a message slot, or its bytes)
//! until it ends, or under exactly_once until a commit passes its offset.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use crate::metrics::StageMetrics;

/// An intake bound a message holds (a message slot, or its bytes) until it
/// ends. Byte holds keep the in-flight bytes gauge current as they go.
pub struct Hold {
    _permit: OwnedSemaphorePermit,
    bytes: Option<(usize, Arc<AtomicUsize>, Arc<StageMetrics>)>,
}

impl Hold {
    /// A message slot.
    pub fn slot(permit: OwnedSemaphorePermit) -> Self {
        Hold {
            _permit: permit,
            bytes: None,
        }
    }

    /// `bytes` of the byte bound; `held` sums what every hold has.
    pub fn bytes(
        permit: OwnedSemaphorePermit,
        bytes: usize,
        held: Arc<AtomicUsize>,
        metrics: Arc<StageMetrics>,
    ) -> Self {
        let now = held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        metrics.set_in_flight_bytes(now);
        Hold {
            _permit: permit,
            bytes: Some((bytes, held, metrics)),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some((bytes, held, metrics)) = &self.bytes {
            let now = held.fetch_sub(*bytes, Ordering::Relaxed) - bytes;
            metrics.set_in_flight_bytes(now);
        }
    }
}
