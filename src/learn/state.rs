//! What stage 1 knows of past hints, rebuilt by every worker from `rl.hints`
//! (its own and the other workers' hint records) and `rl.hints.outcomes`:
//! per-arm tallies for the posteriors, a ledger that joins each outcome with
//! its hint, and each task's recent hints for refinement.
//!
//! Rules:
//! - **Each `hint_id` counts once; its latest outcome wins.** A second outcome
//!   of one hint (stage 2 redoing a step) replaces the first in the tallies.
//!   Outcomes of one hint share its group key, so they sit on one partition
//!   in order: every worker sees the same latest one.
//! - **Joining.** An outcome names only its `hint_id`; the arm, category,
//!   text, cost, run and step come from the hint record. The two topics are read
//!   concurrently, so an outcome may come first: it waits (at most
//!   [`MAX_PENDING_OUTCOMES`](super::limits::MAX_PENDING_OUTCOMES), oldest dropped first) until its hint arrives.
//! - **The control.** A static fallback written on an LLM arm's turn
//!   (category `static_fallback` or `llm_failed_static_fallback` from an arm
//!   that is not static) counts for the static arm, not for the arm that
//!   tried; with no static arm configured it counts for nobody. Its pull and
//!   spend stay with the arm that tried.
//! - **Posteriors for a group of step `s`** count only outcomes of hints of
//!   steps `<= s - 2` ([`OUTCOME_LAG_STEPS`]) of the same `run_id`, so that a
//!   redelivery, a late member or another worker, which may have read one
//!   step more of outcomes, picks the same arm. With `half_life_steps = h`,
//!   an outcome of step `t` weighs `0.5^((s - t) / h)`. Tallies are integer
//!   counters per (run, arm, step), summed in step order: the posteriors do
//!   not depend on the order the records were read in, and a restart that
//!   reads the same records gets the same posteriors exactly.
//!
//! Memory is bounded (see [`StateLimits`]; defaults in `limits`), as
//! [`LearnState::approx_bytes`] counts it and [`StateLimits::worst_case_bytes`]
//! bounds it. With ids of 40 bytes: the task memory at most 50,000 tasks x
//! (3 hints x ~1.3 KB: 1,024 bytes of text, ids, record) = 206 MB, the ledger
//! 100,000 hints x 360 bytes = 36 MB, so 242 MB in the worst case (every
//! remembered hint of the full length); a typical run (one ~600-byte hint a
//! task, ids of 30 bytes) holds about 55 + 31 MB. Pending outcomes add at
//! most 100,000 x ~300 bytes, and each run's tally a few counters per arm and
//! step. What is forgotten:
//! - a task pushed out of the task memory (least recently written first)
//!   takes its hints' texts with it: they can no longer be refined;
//! - a hint pushed out of the ledger (least recently written first) keeps
//!   its counts in the tallies, but a later outcome of it can no longer be
//!   joined (it waits, then is dropped), and a later duplicate of its record
//!   counts as a new pull. Determinism holds while outcomes arrive within
//!   [`MAX_HINTS_TRACKED`](super::limits::MAX_HINTS_TRACKED) hints of their hint, which any run that keeps up
//!   does by far;
//! - tallies are kept for the [`MAX_RUNS_TALLIED`](super::limits::MAX_RUNS_TALLIED) runs written most
//!   recently (a run's tally is a few counters per arm and step), never
//!   evicting the runs this worker is hinting ([`LearnState::hinting`]). Only
//!   a hint record makes or refreshes a run's tally: an outcome of a run
//!   without one is counted ([`StateStats::outcomes_untracked`]) and
//!   ignored, so outcomes of old runs (a replay, an eval) cannot push out a
//!   live run and reset its arms. α and β never go below their priors.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::arms::{ArmReward, Arms};
use super::limits::{StateLimits, OUTCOME_LAG_STEPS, RECORD_OVERHEAD_BYTES};
use super::lru::Lru;
use super::select::{select_arm, ChoiceKind, Posterior};
use crate::messages::{group_key, Hint, HintCategory, HintLevel, HintOutcome};

/// What an outcome said, kept with its hint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutcomeCounts {
    pub hinted_rollouts: i64,
    pub successes: i64,
    pub rescued: bool,
    pub mean_reward: f64,
    /// The outcome's `transfer`, when it had one.
    pub transfer: Option<f64>,
    /// The outcome's `reliance`, when it had one.
    pub reliance: Option<f64>,
}

impl From<&HintOutcome> for OutcomeCounts {
    fn from(o: &HintOutcome) -> Self {
        OutcomeCounts {
            hinted_rollouts: o.hinted_rollouts,
            successes: o.successes,
            rescued: o.rescued,
            mean_reward: o.mean_reward,
            transfer: o.transfer,
            reliance: o.reliance,
        }
    }
}

/// What the tallies need of one hint.
#[derive(Debug, Clone)]
struct LedgerEntry {
    run_id: String,
    instance_id: String,
    step: i64,
    arm: String,
    category: HintCategory,
    refined: bool,
    /// The hint repeats an expected value (`Hint::leak`).
    leak: bool,
    cost_usd: f64,
    outcome: Option<OutcomeCounts>,
}

/// A hint kept for refinement.
#[derive(Debug, Clone)]
pub(super) struct RememberedHint {
    pub(super) hint_id: String,
    pub(super) step: i64,
    pub(super) arm: String,
    pub(super) category: HintCategory,
    pub(super) text: String,
    pub(super) outcome: Option<OutcomeCounts>,
    /// The level it was asked at (an arm with levels: `super::levels`).
    pub(super) level: Option<HintLevel>,
}

/// A task's remembered hints, oldest step first.
#[derive(Debug, Clone, Default)]
pub(super) struct TaskMemory {
    pub(super) hints: Vec<RememberedHint>,
}

/// Counters of one (run, arm, step). `hints` and `spend_usd` belong to the
/// arm that wrote the hints; the outcome counts to the arm they count for
/// (the control, for a static fallback on an LLM arm's turn).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Cell {
    pub(super) hints: i64,
    /// Of `hints`, those flagged `leak`.
    pub(super) leaks: i64,
    /// Spend in nano-USD: integers, so that taking a record back and adding
    /// it again leaves no rounding behind, whatever the order.
    pub(super) spend_nano_usd: i64,
    pub(super) trials: i64,
    pub(super) rescues: i64,
    pub(super) refined_trials: i64,
    pub(super) refined_rescues: i64,
    /// Outcomes counted for the arm that carried `transfer`.
    pub(super) transfer_trials: i64,
    /// Their `transfer`s summed, in nano-units (integers, as the spend).
    pub(super) transfer_nano: i64,
    /// Their squares summed, in nano-units (for the interval).
    pub(super) transfer_sq_nano: i64,
    /// Of those outcomes, the ones that rescued their group (what is left
    /// counts as rescue under `arm_reward = "transfer"`).
    pub(super) transfer_rescues: i64,
    /// Outcomes counted for the arm that carried `reliance`, their
    /// reliances and squares summed in nano-units (each clamped to
    /// ±[`MAX_RELIANCE`]).
    pub(super) reliance_trials: i64,
    pub(super) reliance_nano: i64,
    pub(super) reliance_sq_nano: i64,
}

/// The largest |reliance| a tally adds (nats per token): a real hint's
/// reliance is a few nats a token; the clamp keeps the integer sums of
/// squares far from overflow whatever an outcome claims.
pub const MAX_RELIANCE: f64 = 100.0;

impl Cell {
    /// What the cell adds to its arm's posterior: (successes, trials).
    /// Under `transfer`, an outcome with `transfer` is a fractional trial
    /// (α += transfer, β += 1 − transfer); one without it counts as rescue.
    pub(super) fn reward(&self, reward: ArmReward) -> (f64, f64) {
        match reward {
            ArmReward::Rescue => (self.rescues as f64, self.trials as f64),
            ArmReward::Transfer => {
                let transfer = self.transfer_nano as f64 / 1e9;
                let plain = (self.rescues - self.transfer_rescues) as f64;
                (transfer + plain, self.trials as f64)
            }
        }
    }
}

/// One run's cells by (arm name, step).
#[derive(Debug, Clone, Default)]
pub(super) struct RunTally {
    pub(super) cells: BTreeMap<(String, i64), Cell>,
    /// The newest step any hint of the run had.
    pub(super) newest_step: i64,
}

/// Counters of what the state read and forgot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateStats {
    pub hints_read: u64,
    pub outcomes_read: u64,
    /// Outcomes that replaced an earlier outcome of the same hint.
    pub outcomes_replaced: u64,
    /// Outcomes waiting for their hint now.
    pub pending: usize,
    pub pending_dropped: u64,
    pub tasks_forgotten: u64,
    pub hints_untracked: u64,
    /// Outcomes of hints whose run has no tally (not written lately, or
    /// never seen by this worker): counted and ignored, so that outcomes of
    /// old runs (a replay, an eval) never push out the runs being hinted.
    pub outcomes_untracked: u64,
    /// Under `arm_reward = "transfer"`, outcomes read without `transfer`
    /// (counted as rescue).
    pub outcomes_without_transfer: u64,
}

/// The arm chosen for a group.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmChoice {
    /// Index into [`Arms::specs`].
    pub index: usize,
    pub kind: ChoiceKind,
    /// The group's `hint_id` under that arm.
    pub hint_id: String,
    /// The posteriors the choice was made with, one per arm.
    pub posteriors: Vec<Posterior>,
}

/// The learning state of one stage-1 worker. Feed it every record of
/// `rl.hints` ([`LearnState::observe_hint`]) and `rl.hints.outcomes`
/// ([`LearnState::observe_outcome`]), from the beginning, in any
/// interleaving of the two; ask it for a group's arm
/// ([`LearnState::choose`]) and a task's earlier unhelpful hints
/// (`earlier_unhelpful`, in [`super::refine`]).
#[derive(Debug, Clone)]
pub struct LearnState {
    pub(super) arms: Arms,
    pub(super) limits: StateLimits,
    ledger: Lru<String, LedgerEntry>,
    pub(super) tasks: Lru<(String, String), TaskMemory>,
    pending: HashMap<String, HintOutcome>,
    /// Pending hint ids in arrival order (some may have been joined since).
    pending_order: VecDeque<String>,
    pub(super) runs: Lru<String, RunTally>,
    /// The runs this worker chose arms for most recently (at most
    /// [`MAX_LIVE_RUNS`]): their tallies are never evicted.
    live: VecDeque<String>,
    stats: StateStats,
}

/// Runs a worker keeps as being hinted now: a stage serves a few trainers
/// at once, not more than the runs it tallies.
pub const MAX_LIVE_RUNS: usize = 4;

impl LearnState {
    pub fn new(arms: Arms) -> Self {
        LearnState::with_limits(arms, StateLimits::default())
    }

    pub fn with_limits(arms: Arms, limits: StateLimits) -> Self {
        LearnState {
            arms,
            limits,
            ledger: Lru::new(limits.max_hints_tracked),
            tasks: Lru::new(limits.max_tasks),
            pending: HashMap::new(),
            pending_order: VecDeque::new(),
            runs: Lru::new(limits.max_runs),
            live: VecDeque::new(),
            stats: StateStats::default(),
        }
    }

    pub fn arms(&self) -> &Arms {
        &self.arms
    }

    pub fn stats(&self) -> StateStats {
        StateStats {
            pending: self.pending.len(),
            ..self.stats
        }
    }

    /// Takes in one hint record of `rl.hints` (a duplicate of a known
    /// `hint_id` replaces the earlier record, counted once).
    pub fn observe_hint(&mut self, hint: &Hint) {
        self.stats.hints_read += 1;
        let mut entry = LedgerEntry {
            run_id: hint.run_id.clone(),
            instance_id: hint.instance_id.clone(),
            step: hint.step,
            arm: hint.arm.clone(),
            category: hint.category,
            refined: !hint.refines.is_empty(),
            leak: hint.leak,
            cost_usd: hint.cost_usd,
            outcome: None,
        };
        if let Some(old) = self.ledger.get(&hint.hint_id).cloned() {
            self.apply(&old, -1);
            entry.outcome = old.outcome;
        } else if let Some(outcome) = self.pending.remove(&hint.hint_id) {
            entry.outcome = Some(OutcomeCounts::from(&outcome));
        }
        self.tally_of_hint(&entry.run_id);
        self.apply(&entry, 1);
        let outcome = entry.outcome;
        let (slot, evicted) = self.ledger.touch_or_insert_with(&hint.hint_id, || entry.clone());
        *slot = entry;
        self.stats.hints_untracked += evicted.len() as u64;
        self.remember(hint, outcome);
    }

    /// Takes in one outcome of `rl.hints.outcomes`.
    pub fn observe_outcome(&mut self, outcome: &HintOutcome) {
        self.stats.outcomes_read += 1;
        if outcome.transfer.is_none() && self.arms.options().arm_reward == ArmReward::Transfer {
            self.stats.outcomes_without_transfer += 1;
        }
        let Some(old) = self.ledger.get(&outcome.hint_id).cloned() else {
            self.hold(outcome);
            return;
        };
        if self.runs.get(&old.run_id).is_none() {
            self.stats.outcomes_untracked += 1;
            return;
        }
        if old.outcome.is_some() {
            self.stats.outcomes_replaced += 1;
        }
        self.apply(&old, -1);
        let counts = OutcomeCounts::from(outcome);
        let entry = LedgerEntry {
            outcome: Some(counts),
            ..old
        };
        self.apply(&entry, 1);
        let task = (entry.run_id.clone(), entry.instance_id.clone());
        let (slot, _) = self
            .ledger
            .touch_or_insert_with(&outcome.hint_id, || entry.clone());
        *slot = entry;
        if let Some(memory) = self.tasks.get(&task) {
            if memory.hints.iter().any(|h| h.hint_id == outcome.hint_id) {
                let (memory, _) = self.tasks.touch_or_insert_with(&task, TaskMemory::default);
                for h in memory.hints.iter_mut().filter(|h| h.hint_id == outcome.hint_id) {
                    h.outcome = Some(counts);
                }
            }
        }
    }

    /// The posteriors for a group of `step` of `run_id`, one per arm:
    /// outcomes of steps `<= step - 2` only, weighed by the half-life.
    pub fn posteriors(&self, run_id: &str, step: i64) -> Vec<Posterior> {
        self.posteriors_through(run_id, step.saturating_sub(OUTCOME_LAG_STEPS), step)
    }

    /// The posteriors from every outcome known now, weighed by the
    /// half-life from the run's newest step (for metrics).
    pub fn current_posteriors(&self, run_id: &str) -> Vec<Posterior> {
        let newest = self.runs.get(run_id).map_or(0, |t| t.newest_step);
        self.posteriors_through(run_id, i64::MAX, newest)
    }

    /// The arm and `hint_id` of the group `(run_id, step, instance_id)`.
    pub fn choose(&self, run_id: &str, step: i64, instance_id: &str) -> ArmChoice {
        let key = group_key(run_id, step, instance_id);
        let posteriors = self.posteriors(run_id, step);
        let (index, kind) = select_arm(&self.arms, &posteriors, &key);
        ArmChoice {
            index,
            kind,
            hint_id: self.arms.hint_id(index, &key),
            posteriors,
        }
    }

    /// An estimate of the heap the state holds (strings, records and map
    /// entries). Walks every record: call it for a gauge, not per message.
    pub fn approx_bytes(&self) -> usize {
        // Map keys are held twice (the map and the LRU order).
        let tasks: usize = self
            .tasks
            .iter()
            .map(|((run, instance), memory)| {
                RECORD_OVERHEAD_BYTES
                    + 2 * (run.len() + instance.len())
                    + memory
                        .hints
                        .iter()
                        .map(|h| RECORD_OVERHEAD_BYTES + h.text.len() + h.hint_id.len() + h.arm.len())
                        .sum::<usize>()
            })
            .sum();
        let ledger: usize = self
            .ledger
            .iter()
            .map(|(id, e)| {
                RECORD_OVERHEAD_BYTES + 2 * id.len() + e.run_id.len() + e.instance_id.len() + e.arm.len()
            })
            .sum();
        let pending: usize = self
            .pending
            .values()
            .map(|o| RECORD_OVERHEAD_BYTES + 2 * o.hint_id.len() + o.run_id.len() + o.instance_id.len())
            .sum();
        tasks + ledger + pending
    }

    /// The arm an outcome of `entry` counts for.
    fn counting_arm<'a>(&'a self, entry: &'a LedgerEntry) -> Option<&'a str> {
        let fallback = entry.category != HintCategory::LlmSynthesized;
        match self.arms.find(&entry.arm) {
            Some((_, spec)) if fallback && !spec.is_static => self.arms.control().map(|c| c.name.as_str()),
            _ => Some(entry.arm.as_str()),
        }
    }

    /// Marks `run_id` as being hinted by this worker: its tally is never
    /// evicted while it is among the [`MAX_LIVE_RUNS`] marked last.
    pub fn hinting(&mut self, run_id: &str) {
        if self.live.front().is_some_and(|r| r == run_id) {
            return;
        }
        self.live.retain(|r| r != run_id);
        self.live.push_front(run_id.to_string());
        self.live.truncate(MAX_LIVE_RUNS);
    }

    /// A hint of `run_id` was written: its run's tally is made (or marked
    /// used), evicting the least recently written run that is not live.
    fn tally_of_hint(&mut self, run_id: &str) {
        let live = &self.live;
        self.runs
            .touch_or_insert_keeping(&run_id.to_string(), RunTally::default, |r| live.contains(r));
    }

    /// Adds (`sign` 1) or takes back (-1) what `entry` contributes to its
    /// run's tally (only hints make a tally: without one, nothing is done).
    fn apply(&mut self, entry: &LedgerEntry, sign: i64) {
        let counting = entry
            .outcome
            .and_then(|o| self.counting_arm(entry).map(|arm| (arm.to_string(), o)));
        let Some(tally) = self.runs.get_mut(&entry.run_id) else {
            return;
        };
        tally.newest_step = tally.newest_step.max(entry.step);
        let cell = tally.cells.entry((entry.arm.clone(), entry.step)).or_default();
        cell.hints += sign;
        cell.leaks += sign * i64::from(entry.leak);
        cell.spend_nano_usd += sign * nano(entry.cost_usd);
        if let Some((arm, o)) = counting {
            let cell = tally.cells.entry((arm, entry.step)).or_default();
            let rescued = i64::from(o.rescued);
            cell.trials += sign;
            cell.rescues += sign * rescued;
            if let Some(t) = o.transfer {
                cell.transfer_trials += sign;
                cell.transfer_nano += sign * nano(t);
                cell.transfer_sq_nano += sign * nano(t * t);
                cell.transfer_rescues += sign * rescued;
            }
            if let Some(r) = o.reliance {
                let r = r.clamp(-MAX_RELIANCE, MAX_RELIANCE);
                cell.reliance_trials += sign;
                cell.reliance_nano += sign * nano(r);
                cell.reliance_sq_nano += sign * nano(r * r);
            }
            if entry.refined {
                cell.refined_trials += sign;
                cell.refined_rescues += sign * rescued;
            }
        }
    }

    /// Keeps an outcome until its hint arrives (the latest of one hint).
    fn hold(&mut self, outcome: &HintOutcome) {
        if self
            .pending
            .insert(outcome.hint_id.clone(), outcome.clone())
            .is_some()
        {
            self.stats.outcomes_replaced += 1;
            return;
        }
        self.pending_order.push_back(outcome.hint_id.clone());
        while self.pending.len() > self.limits.max_pending_outcomes {
            let Some(oldest) = self.pending_order.pop_front() else {
                break;
            };
            if self.pending.remove(&oldest).is_some() {
                self.stats.pending_dropped += 1;
            }
        }
        // Ids joined since they were queued: trim them once they pile up.
        if self.pending_order.len() > 2 * self.limits.max_pending_outcomes.max(1) {
            let pending = &self.pending;
            self.pending_order.retain(|id| pending.contains_key(id));
        }
    }

    /// Keeps `hint`'s text in its task's memory.
    fn remember(&mut self, hint: &Hint, outcome: Option<OutcomeCounts>) {
        let task = (hint.run_id.clone(), hint.instance_id.clone());
        let max_hints = self.limits.max_hints_per_task.max(1);
        let record = RememberedHint {
            hint_id: hint.hint_id.clone(),
            step: hint.step,
            arm: hint.arm.clone(),
            category: hint.category,
            text: cut(&hint.hint, self.limits.max_hint_bytes),
            outcome,
            level: hint.level,
        };
        let (memory, evicted) = self.tasks.touch_or_insert_with(&task, TaskMemory::default);
        match memory.hints.iter_mut().find(|h| h.hint_id == record.hint_id) {
            Some(known) => {
                let outcome = record.outcome.or(known.outcome);
                *known = RememberedHint { outcome, ..record };
            }
            None => {
                memory.hints.push(record);
                memory
                    .hints
                    .sort_by(|a, b| a.step.cmp(&b.step).then_with(|| a.hint_id.cmp(&b.hint_id)));
                // Over the bound: a hint that rescued its task goes first
                // (refinement never shows it), then the oldest.
                while memory.hints.len() > max_hints {
                    let rescued = memory
                        .hints
                        .iter()
                        .position(|h| h.outcome.is_some_and(|o| o.rescued));
                    memory.hints.remove(rescued.unwrap_or(0));
                }
            }
        }
        self.stats.tasks_forgotten += evicted.len() as u64;
    }

    fn posteriors_through(&self, run_id: &str, last_step: i64, now: i64) -> Vec<Posterior> {
        let tally = self.runs.get(run_id);
        let half_life = self.arms.options().half_life_steps;
        let reward = self.arms.options().arm_reward;
        self.arms
            .specs()
            .iter()
            .map(|spec| {
                let mut p = Posterior {
                    alpha: spec.prior_alpha,
                    beta: spec.prior_beta,
                };
                let Some(tally) = tally else {
                    return p;
                };
                let range = (spec.name.clone(), i64::MIN)..=(spec.name.clone(), last_step);
                for (&(_, step), cell) in tally.cells.range(range) {
                    let w = half_life.map_or(1.0, |h| 0.5f64.powf((now - step) as f64 / h));
                    let (wins, trials) = cell.reward(reward);
                    p.alpha += w * wins;
                    p.beta += w * (trials - wins);
                }
                // A tally rebuilt after its run was dropped may have taken
                // back what it never had: never below the priors.
                Posterior {
                    alpha: p.alpha.max(spec.prior_alpha),
                    beta: p.beta.max(spec.prior_beta),
                }
            })
            .collect()
    }
}

/// `x` in nano-units, rounded: costs in nano-USD, transfers and reliances
/// in nano-units (all finite and bounded: the decoders check, the tally
/// clamps reliance).
pub(super) fn nano(x: f64) -> i64 {
    (x * 1e9).round() as i64
}

/// `text` cut to at most `max_bytes` bytes (plus `…`) at a char boundary.
fn cut(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
