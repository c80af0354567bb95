//! Step assembly: scored rows arrive one message at a time (a JSON row, or an
//! Arrow batch of many rows) and a `step_end` says how many rows the step has.
//! A step is complete when its `step_end` arrived and that many distinct rows
//! (by `trajectory_id`) are in. The messages stay parked, unfinished, until
//! the step is published or dead-lettered, so a crash redelivers them.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::batch::ScoredRows;

/// Where a message sat: (partition, offset). Rows are put back in this order.
pub type Position = (i32, i64);

/// Rows of one (run_id, step) gathered so far, with the messages they came
/// in (`P`: the stage keeps each message's bytes and its unfinished offset).
pub struct PendingStep<P> {
    pub run_id: String,
    pub step: i64,
    /// `count` of the step's `step_end`, once it arrived.
    pub expected: Option<i64>,
    /// Rows per message, with the message's position for ordering.
    parts: Vec<(Position, ScoredRows)>,
    trajectories: HashSet<String>,
    pub duplicates: usize,
    pub parked: Vec<P>,
    pub first_seen: Instant,
}

impl<P> PendingStep<P> {
    fn new(run_id: &str, step: i64, now: Instant) -> Self {
        PendingStep {
            run_id: run_id.to_string(),
            step,
            expected: None,
            parts: Vec::new(),
            trajectories: HashSet::new(),
            duplicates: 0,
            parked: Vec::new(),
            first_seen: now,
        }
    }

    /// Distinct rows gathered.
    pub fn row_count(&self) -> usize {
        self.trajectories.len()
    }

    /// All rows in input order (partition, then offset, then position).
    pub fn into_rows(mut self) -> (ScoredRows, Vec<P>) {
        self.parts.sort_by_key(|(position, _)| *position);
        let mut rows = ScoredRows::default();
        for (_, part) in self.parts {
            rows.extend(part);
        }
        (rows, self.parked)
    }
}

/// What adding a message did.
pub enum Outcome<P> {
    /// The step is still missing rows or its `step_end`.
    Pending,
    /// Every row is in: publish it.
    Complete(PendingStep<P>),
    /// More distinct rows than `step_end` announced: dead-letter it.
    Overfull(PendingStep<P>),
}

/// Steps in flight, of any number of runs.
pub struct StepAssembler<P> {
    steps: HashMap<(String, i64), PendingStep<P>>,
}

impl<P> Default for StepAssembler<P> {
    fn default() -> Self {
        StepAssembler {
            steps: HashMap::new(),
        }
    }
}

impl<P> StepAssembler<P> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one message's rows, all of one (run_id, step) and at least one.
    /// Rows whose `trajectory_id` the step already has are dropped as
    /// duplicates.
    ///
    /// # Panics
    /// When `rows` is empty (the caller checks).
    pub fn add_rows(&mut self, rows: ScoredRows, position: Position, parked: P, now: Instant) -> Outcome<P> {
        assert!(!rows.is_empty(), "add_rows takes at least one row");
        let run_id = rows.run_id[0].clone();
        let step_no = rows.step[0];
        let key = (run_id.clone(), step_no);
        let step = self
            .steps
            .entry(key.clone())
            .or_insert_with(|| PendingStep::new(&run_id, step_no, now));
        let keep: Vec<usize> = (0..rows.len())
            .filter(|&i| step.trajectories.insert(rows.trajectory_id[i].clone()))
            .collect();
        step.duplicates += rows.len() - keep.len();
        let rows = if keep.len() == rows.len() {
            rows
        } else {
            rows.take(&keep)
        };
        step.parts.push((position, rows));
        step.parked.push(parked);
        self.check(key)
    }

    /// Records a step's `step_end`.
    pub fn end(&mut self, run_id: &str, step_no: i64, count: i64, parked: P, now: Instant) -> Outcome<P> {
        let key = (run_id.to_string(), step_no);
        let step = self
            .steps
            .entry(key.clone())
            .or_insert_with(|| PendingStep::new(run_id, step_no, now));
        step.expected = Some(count);
        step.parked.push(parked);
        self.check(key)
    }

    fn check(&mut self, key: (String, i64)) -> Outcome<P> {
        let state = self
            .steps
            .get(&key)
            .and_then(|s| s.expected.map(|expected| (s.row_count() as i64).cmp(&expected)));
        match state {
            Some(std::cmp::Ordering::Equal) => self
                .steps
                .remove(&key)
                .map_or(Outcome::Pending, Outcome::Complete),
            Some(std::cmp::Ordering::Greater) => self
                .steps
                .remove(&key)
                .map_or(Outcome::Pending, Outcome::Overfull),
            _ => Outcome::Pending,
        }
    }

    /// Removes and returns the steps first seen more than `timeout` ago.
    pub fn expired(&mut self, now: Instant, timeout: Duration) -> Vec<PendingStep<P>> {
        let keys: Vec<(String, i64)> = self
            .steps
            .iter()
            .filter(|(_, s)| now.duration_since(s.first_seen) >= timeout)
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter().filter_map(|k| self.steps.remove(&k)).collect()
    }

    /// Steps in flight.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(run: &str, step: i64, ids: &[&str]) -> ScoredRows {
        let mut r = ScoredRows::default();
        for id in ids {
            r.push(&crate::messages::ScoredRollout {
                schema_version: 1,
                run_id: run.into(),
                step,
                instance_id: "g".into(),
                trajectory_id: (*id).into(),
                reward: 1.0,
                is_hinted: false,
                hint_category: None,
            });
        }
        r
    }

    #[test]
    fn completes_when_step_end_count_is_reached_in_any_order() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        assert!(matches!(
            a.add_rows(rows("r", 1, &["b"]), (0, 5), 1, now),
            Outcome::Pending
        ));
        assert!(matches!(a.end("r", 1, 2, 2, now), Outcome::Pending));
        match a.add_rows(rows("r", 1, &["a"]), (0, 3), 3, now) {
            Outcome::Complete(step) => {
                let (rows, parked) = step.into_rows();
                assert_eq!(rows.trajectory_id, vec!["a", "b"], "rows back in offset order");
                assert_eq!(parked.len(), 3);
            }
            _ => panic!("step should be complete"),
        }
        assert!(a.is_empty());
    }

    #[test]
    fn drops_duplicate_rows_and_flags_overfull_steps() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        a.add_rows(rows("r", 1, &["a", "b"]), (0, 0), 0, now);
        a.add_rows(rows("r", 1, &["a"]), (0, 1), 1, now);
        assert!(matches!(a.end("r", 1, 1, 2, now), Outcome::Overfull(_)));
    }

    #[test]
    fn expires_steps_that_never_complete() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let t0 = Instant::now();
        a.add_rows(rows("r", 1, &["a"]), (0, 0), 0, t0);
        a.add_rows(rows("r", 2, &["a"]), (0, 1), 1, t0 + Duration::from_secs(5));
        let expired = a.expired(t0 + Duration::from_secs(6), Duration::from_secs(6));
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].step, 1);
        assert_eq!(a.len(), 1);
    }
}
