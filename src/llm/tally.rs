//! What one synthesis has used so far, across the models of the chain.

use std::time::Instant;

use super::link::Link;
use crate::messages::Usage;

/// What one synthesis has used so far: tokens, and time, counted as the
/// recorded time of calls played from a cassette plus real time when any
/// call went to the API.
#[derive(Default)]
pub(super) struct Tally<'a> {
    pub(super) usage: Usage,
    pub(super) played_ms: u64,
    pub(super) live: bool,
    /// The model whose hedged duplicate wrote the answer (`llm::hedge`);
    /// `None` when the first attempt's did.
    pub(super) hedged_by: Option<&'a Link>,
}

impl Tally<'_> {
    pub(super) fn latency_ms(&self, started: Instant) -> u64 {
        let real = if self.live {
            started.elapsed().as_millis() as u64
        } else {
            0
        };
        self.played_ms + real
    }
}
