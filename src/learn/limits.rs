//! The bounds of what hints that learn remember (see `state` for what is
//! forgotten past each): tasks, hints per task, hint text, the ledger of
//! hints, outcomes waiting for their hint, runs tallied; and the lag of the
//! outcomes a choice counts.

/// Tasks `(run_id, instance_id)` whose recent hints are remembered for
/// refinement. The least recently written task is forgotten first.
pub const MAX_TASKS_REMEMBERED: usize = 50_000;
/// Hints remembered per task. Past it, the oldest hint known to have
/// rescued the task is forgotten first, else the oldest.
pub const MAX_HINTS_PER_TASK: usize = 3;
/// Bytes of a hint's text remembered for refinement; longer texts are cut at
/// a character boundary and end with `…`.
pub const MAX_REMEMBERED_HINT_BYTES: usize = 1024;
/// Hints whose outcome can still be joined and replaced. The least recently
/// written is forgotten first; its counts stay in the tallies.
pub const MAX_HINTS_TRACKED: usize = 100_000;
/// Outcomes waiting for their hint record: as many as the ledger holds
/// hints, since a restart reads both topics at once and the smaller outcome
/// records run ahead of their hints; an outcome whose hint the ledger could
/// join waits for it, whatever the order. Past it the oldest is dropped
/// (and counted in [`StateStats::pending_dropped`](super::StateStats::pending_dropped)).
pub const MAX_PENDING_OUTCOMES: usize = MAX_HINTS_TRACKED;
/// Runs whose per-arm tallies are kept; the least recently written is
/// dropped first.
pub const MAX_RUNS_TALLIED: usize = 16;
/// A group of step `s` is hinted with posteriors of outcomes of steps
/// `<= s - OUTCOME_LAG_STEPS`.
pub const OUTCOME_LAG_STEPS: i64 = 2;

/// The bounds of a [`LearnState`](super::LearnState); the defaults are the constants above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLimits {
    pub max_tasks: usize,
    pub max_hints_per_task: usize,
    pub max_hint_bytes: usize,
    pub max_hints_tracked: usize,
    pub max_pending_outcomes: usize,
    pub max_runs: usize,
}

impl Default for StateLimits {
    fn default() -> Self {
        StateLimits {
            max_tasks: MAX_TASKS_REMEMBERED,
            max_hints_per_task: MAX_HINTS_PER_TASK,
            max_hint_bytes: MAX_REMEMBERED_HINT_BYTES,
            max_hints_tracked: MAX_HINTS_TRACKED,
            max_pending_outcomes: MAX_PENDING_OUTCOMES,
            max_runs: MAX_RUNS_TALLIED,
        }
    }
}

/// Bytes [`LearnState::approx_bytes`](super::LearnState::approx_bytes) counts for the fixed part of a
/// remembered hint, a ledger entry and a task, besides their strings.
pub(super) const RECORD_OVERHEAD_BYTES: usize = 160;

impl StateLimits {
    /// The most [`LearnState::approx_bytes`](super::LearnState::approx_bytes) can report with ids of up to
    /// `id_bytes` bytes each (run, instance, hint and arm ids), pending
    /// outcomes and tallies aside.
    pub fn worst_case_bytes(&self, id_bytes: usize) -> usize {
        // A remembered hint: its text (and a 3-byte `…`), hint id and arm.
        let hint = RECORD_OVERHEAD_BYTES + self.max_hint_bytes + 3 + 2 * id_bytes;
        // A task: its two ids, twice (map and LRU order), and its hints.
        let task = RECORD_OVERHEAD_BYTES + 4 * id_bytes + self.max_hints_per_task * hint;
        // A ledger entry: its hint id twice, run, instance and arm.
        let entry = RECORD_OVERHEAD_BYTES + 5 * id_bytes;
        self.max_tasks * task + self.max_hints_tracked * entry
    }
}
