//! Stage 1's side of hints that learn: the arms' synthesizers, the state
//! rebuilt from `rl.hints` and `rl.hints.outcomes` (read whole by
//! assignment, see `kafka::tail`), the read barrier before a step's first
//! choice, and what a group's hint is written with: its arm, its `hint_id`
//! and, for a task that failed again after an unhelpful hint, the earlier
//! hints shown to the LLM.
//!
//! Determinism: a group's arm depends only on its key and on outcomes of
//! steps at most `s - 2` (the core's rule), and before the first choice of
//! a step the worker reads both topics up to their end offsets at that
//! moment. A redelivery, a late member or another worker so picks the same
//! arm and writes the same `hint_id`; the hint cache gives a redelivery the
//! same text (and so the same refinement). The barrier measures both topics'
//! end offsets in one round trip (`kafka::tail::sync_all`); the readers have
//! usually fetched what was written before it already, so a step's hints
//! wait about that round trip, not a read.
//!
//! Without `[[hints.arms]]` there is one implicit arm, `default`, with
//! today's `hint_id`s; outcomes then only refine hints, and without the
//! outcomes topic, or without a model to refine with (static hints only),
//! nothing is read at all (and the arm gauges are left out).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::Instrument;

use crate::config::{ArmReward, Config, ConfigError, PromptVersion};
use crate::kafka::tail::sync_all;
use crate::kafka::{TailError, TopicTail};
use crate::learn::{refined_prompt_version, ArmSpec, Arms, LearnState, Refinement, RunReport};
use crate::llm::synth::LlmEnv;
use crate::llm::{LlmError, Synthesizer};
use crate::messages::{decode, DecodeLimits, FailedTrajectory, Hint, HintLevel, HintOutcome};
use crate::metrics::{FloatGauge, Labels};

/// How long the read barrier before a step's first choice may wait for the
/// hints and outcomes topics; past it the step is hinted with what was
/// read (a warning says so, and `hintstream_hints_learn_sync_timeouts`
/// counts it).
const LEARN_SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the start-up read of both topics may take before the stage
/// reports ready anyway (it keeps reading; the barrier still applies).
const LEARN_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);
/// Steps whose barrier passed that a worker remembers; older ones are
/// forgotten (a very late member of one then waits on the barrier again).
const MAX_SYNCED_STEPS: usize = 10_000;
/// How often the per-arm gauges are refreshed from the state.
const ARM_GAUGE_INTERVAL: Duration = Duration::from_secs(2);

/// Why the learning side could not start.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error(transparent)]
    Tail(#[from] TailError),
}

/// One arm as stage 1 runs it.
struct ArmRunner {
    name: String,
    /// The arm's `prompt_version` as configured (stamped on fresh hints).
    prompt_version: String,
    /// The arm's synthesizer; for the implicit arm, the stage's own.
    synth: Arc<Synthesizer>,
    /// An arm with levels: a synthesizer per level, asking at it (sharing
    /// the arm's limits); empty otherwise.
    leveled: Vec<(HintLevel, Arc<Synthesizer>)>,
}

impl ArmRunner {
    /// The synthesizer that asks at `level` (the arm's own without one).
    fn synth_at(&self, level: Option<HintLevel>) -> &Arc<Synthesizer> {
        level
            .and_then(|level| self.leveled.iter().find(|(l, _)| *l == level))
            .map_or(&self.synth, |(_, synth)| synth)
    }
}

/// What a group's hint is written with.
pub struct HintPlan {
    pub arm: String,
    pub hint_id: String,
    pub synth: Arc<Synthesizer>,
    /// `prompt_version` of the Hint: the arm's, `+refine` when refined.
    pub prompt_version: String,
    /// Earlier unhelpful hints of the task, shown to the LLM.
    pub refinement: Option<Refinement>,
    /// The level the hint is asked at (an arm with levels; `synth` asks
    /// at it).
    pub level: Option<HintLevel>,
}

/// The per-arm gauges (for the run of the hint most recently read or
/// written) and the learning side's counters.
pub struct ArmMetrics {
    pulls: Family<Labels, Gauge>,
    rescues: Family<Labels, Gauge>,
    posterior_mean: Family<Labels, FloatGauge>,
    transfer_rate: Family<Labels, FloatGauge>,
    spend_usd: Family<Labels, FloatGauge>,
    without_transfer: prometheus_client::metrics::counter::Counter,
    sync_timeouts: prometheus_client::metrics::counter::Counter,
    hint_model_used: prometheus_client::metrics::counter::Counter,
    hint_model_ignored: Family<Labels, prometheus_client::metrics::counter::Counter>,
}

/// Topic readers keeping the state current; dropped with the learner.
struct Readers {
    hints: TopicTail,
    outcomes: TopicTail,
}

pub struct Learner {
    state: Arc<Mutex<LearnState>>,
    arms: Vec<ArmRunner>,
    /// Whether the arms are the implicit one (a trainer's `hint_model` can
    /// then be served; with configured arms, arms decide).
    implicit: bool,
    /// `llm.allowed_models`, and the synthesizers made for them on first
    /// request (one model each, the stage's limits).
    allowed_models: Vec<String>,
    model_synths: Mutex<std::collections::HashMap<String, Arc<Synthesizer>>>,
    env: LlmEnv,
    readers: Option<Readers>,
    /// Steps (run, step) whose read barrier passed.
    synced: Mutex<HashSet<(String, i64)>>,
    /// One barrier at a time: the groups of a new step wait for one read.
    sync_lock: tokio::sync::Mutex<()>,
    /// The run of the hint most recently read or written: what the
    /// per-arm gauges show.
    latest_run: Arc<Mutex<Option<String>>>,
    gauges: ArmMetrics,
    caught_up: std::sync::atomic::AtomicBool,
}

impl Learner {
    /// Whether any hint may come from a model: an arm's chain (or one of its
    /// levels'), or, with the implicit arm, a model a trainer may ask for
    /// (`llm.allowed_models`).
    pub fn calls_model(&self) -> bool {
        let arm_calls =
            |arm: &ArmRunner| arm.synth.has_model() || arm.leveled.iter().any(|(_, s)| s.has_model());
        self.arms.iter().any(arm_calls) || (self.implicit && !self.allowed_models.is_empty())
    }

    /// The arms (`[[hints.arms]]`, or the implicit one on `synth`), their
    /// synthesizers, and, when the outcomes topic exists (it must with
    /// arms), readers of the hints and outcomes topics.
    pub async fn build(
        config: &Config,
        env: &LlmEnv,
        synth: Arc<Synthesizer>,
        registry: &mut Registry,
    ) -> Result<Arc<Learner>, LearnError> {
        let hints = &config.hints;
        let version = config.llm.prompt_version.as_str();
        let arms = Arms::for_stage(&hints.arms, hints.learn_options(), &synth.chain_ids(), version)
            .map_err(|e| ConfigError::Invalid(format!("[[hints.arms]]: {e}")))?;
        let runners = arm_runners(&arms, env, &synth)?;
        let implicit = arms.is_implicit();
        let state = Arc::new(Mutex::new(LearnState::new(arms)));
        let latest_run = Arc::new(Mutex::new(None));
        // Without `[[hints.arms]]`, where no plan depends on what the topics
        // hold, there are no arms to show either: nothing is read (reading
        // its own hints back cost a static stage a third of its CPU, and the
        // broker the fetches).
        let reads = hints.has_arms() || plan_reads_state(&runners);
        let readers = if reads {
            readers_of(config, &state, &latest_run).await?
        } else {
            None
        };
        let learner = Arc::new(Learner {
            state,
            arms: runners,
            implicit,
            allowed_models: config.llm.allowed_models.clone(),
            model_synths: Mutex::new(std::collections::HashMap::new()),
            env: env.clone(),
            readers,
            synced: Mutex::new(HashSet::new()),
            sync_lock: tokio::sync::Mutex::new(()),
            latest_run,
            gauges: ArmMetrics::register(registry),
            caught_up: std::sync::atomic::AtomicBool::new(false),
        });
        // In the stage's span, so that their lines say which stage wrote them.
        tokio::spawn(catch_up(Arc::downgrade(&learner)).in_current_span());
        tokio::spawn(refresh_gauges(Arc::downgrade(&learner)).in_current_span());
        Ok(learner)
    }

    /// Whether the start-up read of both topics is done (readiness).
    pub fn caught_up(&self) -> bool {
        self.readers.is_none() || self.caught_up.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn state(&self) -> MutexGuard<'_, LearnState> {
        // The state's methods finish their changes before returning.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The arm, `hint_id` and refinement of the group of `t` (its best
    /// trajectory), after the step's read barrier.
    pub async fn plan(&self, t: &FailedTrajectory) -> HintPlan {
        self.barrier(&t.run_id, t.step).await;
        {
            // Set only when it changes: a run's id copied a message was
            // an allocation and a free for nothing.
            let mut latest = self.latest_run.lock().unwrap_or_else(|p| p.into_inner());
            if latest.as_deref() != Some(t.run_id.as_str()) {
                *latest = Some(t.run_id.clone());
            }
        }
        let (choice, refinement, level) = {
            let mut state = self.state();
            // The run being hinted keeps its tally, whatever others write.
            state.hinting(&t.run_id);
            let choice = state.choose(&t.run_id, t.step, &t.instance_id);
            let arm = &self.arms[choice.index];
            let refinement = if arm.synth.has_model() {
                state.refinement(&t.run_id, t.step, &t.instance_id)
            } else {
                None
            };
            let level = state.level(&t.run_id, t.step, &t.instance_id, &choice.hint_id, choice.index);
            (choice, refinement, level)
        };
        let arm = &self.arms[choice.index];
        let (hint_id, synth) = match self.requested_model(t) {
            Some((model, synth)) => {
                let key = crate::messages::group_key(&t.run_id, t.step, &t.instance_id);
                (
                    crate::learn::hint_id(&key, &arm.prompt_version, &model, &arm.name),
                    synth,
                )
            }
            None => (choice.hint_id, arm.synth_at(level).clone()),
        };
        HintPlan {
            arm: arm.name.clone(),
            hint_id,
            synth,
            prompt_version: if refinement.is_some() {
                refined_prompt_version(&arm.prompt_version)
            } else {
                arm.prompt_version.clone()
            },
            refinement,
            level,
        }
    }

    /// The model a trainer asked for on `t` (`hint_model`) with its
    /// synthesizer, when it may be served: the implicit arm only, a model
    /// of `llm.allowed_models` whose API has a key. Otherwise the request is
    /// counted by why it was ignored, and the arm's chain writes the hint.
    fn requested_model(&self, t: &FailedTrajectory) -> Option<(String, Arc<Synthesizer>)> {
        let model = t.hint_model.as_ref()?;
        let ignored = |reason: &str| {
            let labels: Labels = vec![("reason", reason.to_string())];
            self.gauges.hint_model_ignored.get_or_create(&labels).inc();
            None
        };
        if !self.implicit {
            return ignored("arms_decide");
        }
        if !self.allowed_models.contains(model) {
            return ignored("not_allowed");
        }
        let mut synths = self.model_synths.lock().unwrap_or_else(|p| p.into_inner());
        let synth = match synths.get(model) {
            Some(s) => s.clone(),
            None => {
                let base = &self.arms[0].synth;
                match base.for_arm(std::slice::from_ref(model), base.prompt_version(), &self.env) {
                    Ok(s) => {
                        let s = Arc::new(s);
                        synths.insert(model.clone(), s.clone());
                        s
                    }
                    Err(e) => {
                        tracing::warn!(model = %model, error = %e, "a requested hint_model cannot be served");
                        return ignored("unavailable");
                    }
                }
            }
        };
        if !synth.has_model() {
            return ignored("no_key");
        }
        self.gauges.hint_model_used.inc();
        Some((model.clone(), synth))
    }

    /// Reads both topics up to their end offsets once per step.
    async fn barrier(&self, run_id: &str, step: i64) {
        let Some(readers) = &self.readers else {
            return;
        };
        if !plan_reads_state(&self.arms) {
            return;
        }
        let key = (run_id.to_string(), step);
        if self.synced().contains(&key) {
            return;
        }
        // Boxed: once a step, and inline its future (the reads to both
        // topics' ends) would size every hint's.
        Box::pin(self.sync_step(readers, key)).await;
    }

    /// [`Learner::barrier`] for a step not read up to yet: one reading at
    /// a time, then the step is marked read.
    async fn sync_step(&self, readers: &Readers, key: (String, i64)) {
        let (run_id, step) = (key.0.as_str(), key.1);
        let _one = self.sync_lock.lock().await;
        if self.synced().contains(&key) {
            return;
        }
        let started = std::time::Instant::now();
        match sync_all(&[&readers.hints, &readers.outcomes], LEARN_SYNC_TIMEOUT).await {
            Ok(()) => tracing::debug!(run_id, step, waited = ?started.elapsed(), "read barrier passed"),
            Err(e) => {
                self.gauges.sync_timeouts.inc();
                tracing::warn!(run_id, step, error = %e, "hinting the step with what was read so far");
            }
        }
        let mut synced = self.synced();
        if synced.len() >= MAX_SYNCED_STEPS {
            synced.clear();
        }
        synced.insert(key);
    }

    fn synced(&self) -> MutexGuard<'_, HashSet<(String, i64)>> {
        self.synced.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the per-arm gauges from the state, for the run most recently
    /// hinted (none before the first hint).
    fn refresh(&self) {
        // The gauges show what was read: without readers, nothing (they are
        // left out, not shown as 0).
        if self.readers.is_none() {
            return;
        }
        let Some(run) = self.latest_run.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            return;
        };
        let (report, stats) = {
            let state = self.state();
            (state.run_report(&run), state.stats())
        };
        self.gauges.show(&report, stats.outcomes_without_transfer);
    }
}

impl ArmMetrics {
    /// Registers the metrics under the stage's prefix.
    pub fn register(registry: &mut Registry) -> ArmMetrics {
        let g = ArmMetrics {
            pulls: Family::default(),
            rescues: Family::default(),
            posterior_mean: Family::default(),
            transfer_rate: Family::default(),
            spend_usd: Family::default(),
            without_transfer: Default::default(),
            sync_timeouts: Default::default(),
            hint_model_used: Default::default(),
            hint_model_ignored: Family::default(),
        };
        registry.register(
            "arm_pulls",
            "Hints written by each arm, in the run most recently hinted",
            g.pulls.clone(),
        );
        registry.register(
            "arm_rescues",
            "Outcomes of each arm's hints that rescued their group, in the run most recently hinted",
            g.rescues.clone(),
        );
        registry.register(
            "arm_posterior_mean",
            "Posterior mean of each arm's reward (its rescue rate, or its transfer under \
             arm_reward = transfer) from every outcome known, in the run most recently hinted",
            g.posterior_mean.clone(),
        );
        registry.register(
            "arm_transfer_rate",
            "Mean transfer (success times the per-token ratio of unhinted to hinted likelihood) of \
             each arm's outcomes that carried one, in the run most recently hinted; absent until one did",
            g.transfer_rate.clone(),
        );
        registry.register(
            "learn_outcomes_without_transfer",
            "Under arm_reward = transfer, outcomes read without transfer (counted as rescue)",
            g.without_transfer.clone(),
        );
        registry.register(
            "arm_spend_usd",
            "What each arm's hints cost in USD, in the run most recently hinted",
            g.spend_usd.clone(),
        );
        registry.register(
            "hint_model_used",
            "Groups hinted by the model their trainer asked for (hint_model, in llm.allowed_models)",
            g.hint_model_used.clone(),
        );
        registry.register(
            "hint_model_ignored",
            "Trainer hint_model requests served by the configured chain instead, by reason \
             (arms_decide, not_allowed, no_key, unavailable)",
            g.hint_model_ignored.clone(),
        );
        registry.register(
            "learn_sync_timeouts",
            "Steps hinted before the hints and outcomes topics were read to their end",
            g.sync_timeouts.clone(),
        );
        g
    }

    /// Sets the per-arm gauges to `report`'s totals, and the counter of
    /// outcomes without transfer to the state's.
    pub fn show(&self, report: &RunReport, without_transfer: u64) {
        for arm in &report.arms {
            let labels: Labels = vec![("arm", arm.name.clone())];
            self.pulls.get_or_create(&labels).set(arm.pulls);
            self.rescues.get_or_create(&labels).set(arm.rescues);
            self.posterior_mean.get_or_create(&labels).set(arm.posterior_mean);
            if let Some(rate) = arm.transfer_rate {
                self.transfer_rate.get_or_create(&labels).set(rate);
            }
            self.spend_usd.get_or_create(&labels).set(arm.spend_usd);
        }
        let counted = self.without_transfer.get();
        if without_transfer > counted {
            self.without_transfer.inc_by(without_transfer - counted);
        }
    }
}

/// Each arm's runner: the implicit arm uses the stage's synthesizer; a
/// configured arm gets its own chain and prompt, sharing the stage's limits.
fn arm_runners(arms: &Arms, env: &LlmEnv, synth: &Arc<Synthesizer>) -> Result<Vec<ArmRunner>, LearnError> {
    arms.specs()
        .iter()
        .map(|spec| {
            let synth = if arms.is_implicit() {
                synth.clone()
            } else {
                let prompt: PromptVersion = spec
                    .prompt_version
                    .parse()
                    .map_err(|e| ConfigError::Invalid(format!("[[hints.arms]] {}: {e}", spec.name)))?;
                let models = if spec.is_static { &[][..] } else { &spec.models[..] };
                Arc::new(synth.for_arm(models, prompt, env)?)
            };
            let leveled = leveled_synths(spec, &synth, env)?;
            Ok(ArmRunner {
                name: spec.name.clone(),
                prompt_version: spec.prompt_version.clone(),
                synth,
                leveled,
            })
        })
        .collect()
}

/// Whether a plan depends on what the readers read: with one arm and no
/// model there is no choice to make and nothing to refine (a refinement
/// needs the arm's model), so every plan is the same whatever the topics
/// hold, and no step waits for a read.
fn plan_reads_state(arms: &[ArmRunner]) -> bool {
    arms.len() > 1 || arms.iter().any(|arm| arm.synth.has_model())
}

/// One synthesizer per level of an arm with levels, each on the arm's
/// chain and prompt, asking at its level; none for an arm without.
fn leveled_synths(
    spec: &ArmSpec,
    synth: &Synthesizer,
    env: &LlmEnv,
) -> Result<Vec<(HintLevel, Arc<Synthesizer>)>, LearnError> {
    spec.levels
        .iter()
        .map(|&level| {
            let at = synth.for_arm(&spec.models, synth.prompt_version(), env)?;
            Ok((level, Arc::new(at.at_level(level))))
        })
        .collect()
}

/// The readers of [`start_readers`]; none, with a warning, when the
/// outcomes topic is missing and no arms need it.
async fn readers_of(
    config: &Config,
    state: &Arc<Mutex<LearnState>>,
    latest_run: &Arc<Mutex<Option<String>>>,
) -> Result<Option<Readers>, LearnError> {
    match start_readers(config, state, latest_run).await {
        Ok(readers) => Ok(Some(readers)),
        Err(TailError::MissingTopic(topic)) if !config.hints.has_arms() => {
            tracing::warn!(
                topic = %topic,
                "hints are not refined from their outcomes: {topic} does not exist \
                 (create it with `hintstream topics create`)"
            );
            Ok(None)
        }
        Err(TailError::MissingTopic(topic)) => Err(ConfigError::Invalid(format!(
            "[[hints.arms]] learn from the outcomes topic, and {topic} does not exist; \
             create it with `hintstream topics create`"
        ))
        .into()),
        Err(e) => Err(e.into()),
    }
}

/// Readers of the hints and outcomes topics, feeding `state` (and noting
/// the run of each hint read in `latest_run`).
async fn start_readers(
    config: &Config,
    state: &Arc<Mutex<LearnState>>,
    latest_run: &Arc<Mutex<Option<String>>>,
) -> Result<Readers, TailError> {
    let limits = config.decode_limits();
    let outcomes = {
        let state = state.clone();
        let mut without_transfer =
            (config.hints.arm_reward == ArmReward::Transfer).then(WithoutTransfer::default);
        TopicTail::start(config, &config.topics.outcomes, move |_, payload| {
            if let Some(o) = decoded::<HintOutcome>(payload, limits) {
                if let Some(w) = without_transfer.as_mut() {
                    w.check(&o);
                }
                state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .observe_outcome(&o);
            }
        })
        .await?
    };
    let hints = {
        let (state, latest_run) = (state.clone(), latest_run.clone());
        TopicTail::start(config, &config.hints.output_topic, move |_, payload| {
            if let Some(h) = decoded::<Hint>(payload, limits) {
                state.lock().unwrap_or_else(|p| p.into_inner()).observe_hint(&h);
                *latest_run.lock().unwrap_or_else(|p| p.into_inner()) = Some(h.run_id);
            }
        })
        .await?
    };
    Ok(Readers { hints, outcomes })
}

/// Under `arm_reward = "transfer"`, the runs already warned of outcomes
/// without `transfer` (one warning per run; the most recent runs only).
#[derive(Default)]
struct WithoutTransfer {
    warned: std::collections::VecDeque<String>,
}

impl WithoutTransfer {
    fn check(&mut self, o: &HintOutcome) {
        if o.transfer.is_some() || self.warned.contains(&o.run_id) {
            return;
        }
        tracing::warn!(
            run_id = %o.run_id,
            hint_id = %o.hint_id,
            "arm_reward = \"transfer\", but this run's outcomes carry no transfer (its hinted rows \
             lack logprob_hinted, logprob_unhinted or response_length): they count as rescue. \
             To fix: publish the log-probs with the scored rows (see docs/learning.md), or set \
             arm_reward = \"rescue\"; hintstream_hints_learn_outcomes_without_transfer counts them"
        );
        self.warned.push_front(o.run_id.clone());
        self.warned.truncate(crate::learn::state::MAX_LIVE_RUNS * 4);
    }
}

/// A record of a learning topic as `T`, or `None` (a record that does not
/// decode teaches nothing; the topics' writers validate what they write).
fn decoded<T: serde::de::DeserializeOwned + crate::messages::Validate>(
    payload: Option<&[u8]>,
    limits: DecodeLimits,
) -> Option<T> {
    decode::<T>(payload?, limits).ok()
}

/// The start-up read of both topics; the stage is ready after it (or after
/// [`LEARN_CATCH_UP_TIMEOUT`], with a warning).
async fn catch_up(learner: std::sync::Weak<Learner>) {
    let Some(l) = learner.upgrade() else {
        return;
    };
    if let Some(readers) = &l.readers {
        if let Err(e) = sync_all(&[&readers.hints, &readers.outcomes], LEARN_CATCH_UP_TIMEOUT).await {
            tracing::warn!(error = %e, "ready before the learning topics were read whole");
        }
        let stats = l.state().stats();
        tracing::info!(?stats, "read the hints and outcomes topics");
    }
    l.caught_up.store(true, std::sync::atomic::Ordering::Relaxed);
    l.refresh();
}

async fn refresh_gauges(learner: std::sync::Weak<Learner>) {
    let mut tick = tokio::time::interval(ARM_GAUGE_INTERVAL);
    loop {
        tick.tick().await;
        let Some(l) = learner.upgrade() else {
            return;
        };
        l.refresh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A static stage without `[[hints.arms]]` reads neither learning topic:
    /// its learner is built without a broker (here none answers), is ready
    /// at once, and leaves the arm gauges out.
    #[tokio::test]
    async fn a_static_stage_without_arms_reads_no_topic_and_shows_no_arm() {
        let mut config = Config {
            bootstrap_servers: "127.0.0.1:1".into(),
            ..Config::default()
        };
        config.llm.provider = crate::config::LlmProvider::None;
        let env = LlmEnv::default();
        let synth = Arc::new(Synthesizer::new(&config.llm, &env).unwrap());
        assert!(!synth.has_model());
        let mut registry = Registry::default();
        let learner = tokio::time::timeout(
            Duration::from_secs(5),
            Learner::build(&config, &env, synth, &mut registry),
        )
        .await
        .expect("built without asking a broker")
        .unwrap();
        assert!(learner.readers.is_none());
        assert!(learner.caught_up());
        let t: FailedTrajectory = serde_json::from_value(serde_json::json!({
            "schema_version": 1, "run_id": "r", "step": 1, "instance_id": "i", "trajectory_id": "t",
            "task_prompt": "Fix it", "chat_history": [], "reward": 0.0,
        }))
        .unwrap();
        let plan = learner.plan(&t).await;
        assert_eq!(plan.arm, crate::messages::DEFAULT_ARM);
        learner.refresh();
        let text = crate::metrics::render(&registry);
        assert!(!text.contains("arm_pulls{"), "{text}");
    }
}
