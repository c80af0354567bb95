//! Saturation of a model's server: when most attempts at one model time
//! out in a window of [`WINDOW`] while others wait at it (sent beside calls
//! still in flight there, or held for a call slot), the server serves fewer
//! requests at once than are sent (llama.cpp's server has one slot by
//! default). Said once per [`WARN_EVERY`] in the log, naming what to change,
//! and counted for the `hintstream_hints_llm_saturated` metric.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The window attempts are counted in.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Attempts at one model a window needs before it can say "saturated".
pub const MIN_ATTEMPTS: u32 = 5;
/// The shortest time between two warnings (of any model).
pub const WARN_EVERY: Duration = Duration::from_secs(600);
/// A wait for a call slot or the rate limits this long counts as queueing.
pub const QUEUED_WAIT: Duration = Duration::from_millis(100);

/// Attempts at one model in the current window.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    attempts: u32,
    timeouts: u32,
    /// Attempts that waited: sent while others were in flight at the model,
    /// or held at least [`QUEUED_WAIT`] for a slot.
    queued: u32,
}

#[derive(Debug)]
struct State {
    window_started: Instant,
    counts: HashMap<String, Counts>,
    in_flight: HashMap<String, usize>,
    warned: Option<Instant>,
}

/// The counts of every model, shared by the synthesizers of a stage.
#[derive(Debug)]
pub(super) struct Saturation(Mutex<State>);

impl Default for Saturation {
    fn default() -> Self {
        Saturation(Mutex::new(State {
            window_started: Instant::now(),
            counts: HashMap::new(),
            in_flight: HashMap::new(),
            warned: None,
        }))
    }
}

/// What a window shows of one model when it is saturated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Saturated {
    pub(super) attempts: u32,
    pub(super) timeouts: u32,
    pub(super) queued: u32,
}

/// An attempt at a model, begun: whether it queued.
pub(super) struct Begun {
    queued: bool,
}

impl Saturation {
    /// An attempt at `model` is sent, after waiting `waited` for its slot.
    pub(super) fn begin(&self, model: &str, waited: Duration) -> Begun {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let in_flight = state.in_flight.entry(model.to_string()).or_insert(0);
        let queued = *in_flight > 0 || waited >= QUEUED_WAIT;
        *in_flight += 1;
        Begun { queued }
    }

    /// The attempt ended (`timed_out` or not): `Some` once per
    /// [`WARN_EVERY`] when most attempts of the window at `model` timed out
    /// and most queued.
    pub(super) fn end(&self, model: &str, begun: Begun, timed_out: bool) -> Option<Saturated> {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if let Some(n) = state.in_flight.get_mut(model) {
            *n = n.saturating_sub(1);
        }
        if now.duration_since(state.window_started) >= WINDOW {
            state.window_started = now;
            state.counts.clear();
        }
        let counts = state.counts.entry(model.to_string()).or_default();
        counts.attempts += 1;
        counts.timeouts += u32::from(timed_out);
        counts.queued += u32::from(begun.queued);
        let c = *counts;
        let saturated =
            c.attempts >= MIN_ATTEMPTS && c.timeouts * 2 > c.attempts && c.queued * 2 > c.attempts;
        if !saturated || state.warned.is_some_and(|at| now.duration_since(at) < WARN_EVERY) {
            return None;
        }
        state.warned = Some(now);
        Some(Saturated {
            attempts: c.attempts,
            timeouts: c.timeouts,
            queued: c.queued,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_attempts_timing_out_while_queued_is_said_once() {
        let s = Saturation::default();
        let begun: Vec<Begun> = (0..8).map(|_| s.begin("m", Duration::ZERO)).collect();
        let said: Vec<Option<Saturated>> = begun
            .into_iter()
            .enumerate()
            .map(|(i, b)| s.end("m", b, i >= 2))
            .collect();
        let first = said.iter().position(Option::is_some).expect("saturation is said");
        assert_eq!(said[first].unwrap().attempts, MIN_ATTEMPTS);
        assert_eq!(said.iter().filter(|x| x.is_some()).count(), 1, "once");
    }

    #[test]
    fn timeouts_without_queueing_are_not_saturation() {
        let s = Saturation::default();
        for _ in 0..10 {
            let b = s.begin("m", Duration::ZERO);
            assert!(
                s.end("m", b, true).is_none(),
                "one at a time: the server is slow, not saturated"
            );
        }
    }

    #[test]
    fn queueing_without_timeouts_is_not_saturation() {
        let s = Saturation::default();
        let begun: Vec<Begun> = (0..10).map(|_| s.begin("m", Duration::from_secs(1))).collect();
        for b in begun {
            assert!(s.end("m", b, false).is_none());
        }
    }
}
