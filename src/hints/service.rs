//! Stage 1's service: build (the shared stage skeleton, the LLM client, the
//! hint cache) and run (group gathering, synthesis, publishing). A slow LLM
//! call holds back nothing but its own group: every message is handled on
//! its own (those fetched together share a task: `Stage::TASK_PER_BATCH`).
//!
//! A hint's trace: the `consume` span of the group's first message (its
//! leader, which continues that message's `traceparent`), then `group_wait`,
//! then `hint` (linked to the other members' traces), with an `llm_attempt`
//! per HTTP attempt and the `produce` of the hint, whose `traceparent`
//! header names this trace.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tracing::field::Empty;
use tracing::Instrument;

use super::cache::{CachedHint, HintCache};
use super::decode::{decode_arrival, Arrival};
use super::group::{Groups, Joined, Ranked};
use super::hint::{build_hint, HintLabels};
use super::leak;
use super::learning::{HintPlan, Learner};
use super::ledger::{rate_share_hook, Ledger, LedgerMetrics};
use super::metrics::HintMetrics;
use crate::config::{Config, OnLeak};
use crate::health::Lifecycle;
use crate::kafka::admin::TopicSpec;
use crate::kafka::produce::headers;
use crate::kafka::{
    partition_count, Linger, Outgoing, Partition, Published, RecordMeta, Rejected, RunSummary, Settlement,
    Stage, StageProducer, Taken, Work,
};
use crate::llm::prompt::truncate_chars;
use crate::llm::synth::LlmEnv;
use crate::llm::Synthesizer;
use crate::messages::{DecodeLimits, FailedTrajectory, HintCategory};
use crate::stage::{BoxFuture, Registered, Service, StageError, StageShell};
use crate::telemetry::{self, TraceParent, TRACEPARENT_HEADER};

/// How often the budget gauges are refreshed while no call changes them.
const BUDGET_GAUGE_INTERVAL: Duration = Duration::from_secs(10);

/// How long one probe of the LLM provider (readiness) may take, and the
/// longest pause between probes until one is answered.
const LLM_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_LLM_PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// Header names on published hints.
pub const CATEGORY_HEADER: &str = "hintstream.category";
pub const PROMPT_VERSION_HEADER: &str = "hintstream.prompt-version";

/// A trajectory waiting in its group: its message (bytes and unfinished
/// offset) and its reward, which picks the best member.
struct Member {
    reward: f64,
    message: Taken,
    /// Decoded when it arrived; kept only while it is the group's best.
    trajectory: Option<Box<FailedTrajectory>>,
}

impl Ranked for Member {
    fn score(&self) -> f64 {
        self.reward
    }

    fn outranked(&mut self) {
        self.trajectory = None;
    }
}

/// Groups are gathered per input partition: a group's messages share a key
/// and so a partition, and a revoked partition takes its open groups with
/// it. (Members of one group on several partitions form one group each; the
/// hint cache still makes them one LLM call and one hint.)
fn gathering_key(partition: i32, group_key: &str) -> String {
    format!("{partition}:{group_key}")
}

/// Whether a gathering key belongs to one of `partitions`.
fn on_partitions(key: &str, partitions: &[i32]) -> bool {
    key.split_once(':')
        .and_then(|(p, _)| p.parse::<i32>().ok())
        .is_some_and(|p| partitions.contains(&p))
}

/// Stage 1's state, which the handler tasks, the revoke and the probes
/// share: the groups gathering members, the synthesizer (the arms' share
/// its limits), the learner that picks each group's arm, the hint cache
/// that writes a gathered group's hint once, and where the hints go.
struct GroupHinter {
    groups: Mutex<Groups<Member>>,
    synth: Arc<Synthesizer>,
    learner: Arc<Learner>,
    cache: HintCache,
    producer: StageProducer,
    lifecycle: Lifecycle,
    /// Shared by the hints' refusals, made off their handlers.
    output_topic: Arc<str>,
    group_wait: Duration,
    reward_threshold: f64,
    /// What the leak guard does with a hint that states an expected value.
    on_leak: OnLeak,
    limits: DecodeLimits,
    metrics: Arc<HintMetrics>,
}

/// Takes a gathering group out of the map if its leader is dropped before
/// the group was taken (its partition was revoked or the stage stopped), so
/// the members are dropped with it (abandoned: redelivered to the next
/// owner) instead of waiting in the map forever. Only the group this
/// leader opened: a newer one under the same key is its own leader's.
struct LeaderGuard<'a> {
    hinter: &'a GroupHinter,
    key: &'a str,
    complete: &'a Arc<Notify>,
    armed: bool,
}

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut groups = self.hinter.groups();
            drop(groups.take_led(self.key, self.complete));
            self.hinter.metrics.set_groups_open(groups.len());
        }
    }
}

impl GroupHinter {
    fn groups(&self) -> MutexGuard<'_, Groups<Member>> {
        // Groups' methods complete their change before returning, so a
        // poisoned lock holds consistent data.
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins an arrival to its group; the group's leader waits for the rest
    /// (or the group wait), then hints the gathered group.
    /// (It owns its `Arc`, so that [`Stage::handle`] returns this future
    /// as it is: wrapped in a block of its own, the work was held twice.)
    async fn gather(self: Arc<Self>, work: Work<Arrival>) {
        let Work { input, message } = work;
        let Arrival {
            group_key,
            expected,
            trajectory,
        } = input;
        if expected <= 1 {
            // A group of one is whole as it arrives: nothing to gather,
            // no wait and no entry in the open groups. Its trace still has
            // its (empty) `group_wait`, as every group's has.
            if telemetry::exporting() {
                let wait =
                    tracing::info_span!("group_wait", group = %group_key, expected = 1i64, members = 1i64);
                drop(wait);
            }
            let reward = trajectory.reward;
            return self
                .hint_or_pass(&group_key, reward, trajectory, vec![message])
                .await;
        }
        let key = gathering_key(message.meta().partition, &group_key);
        let joined = {
            let mut groups = self.groups();
            // Under the groups' lock: a revoke marks its partitions before
            // it releases their gathering groups (under this lock), so a
            // member of a revoked partition that comes late (its task had
            // not run yet) never starts a group of its own after the
            // release. It is abandoned: the next owner gathers the group.
            if message.partition_revoked() {
                drop(groups);
                drop(message);
                return;
            }
            let joined = groups.join(
                &key,
                expected,
                Member {
                    reward: trajectory.reward,
                    message,
                    trajectory: Some(trajectory),
                },
            );
            self.metrics.set_groups_open(groups.len());
            joined
        };
        let Joined::Leader(complete) = joined else {
            return;
        };
        let mut guard = LeaderGuard {
            hinter: &self,
            key: &key,
            complete: &complete,
            armed: true,
        };
        let wait = tracing::info_span!(
            "group_wait",
            group = %group_key,
            expected = expected as i64,
            members = Empty,
        );
        async {
            tokio::select! {
                _ = complete.notified() => {}
                _ = tokio::time::sleep(self.group_wait) => {}
            }
        }
        .instrument(wait.clone())
        .await;
        let group = {
            let mut groups = self.groups();
            let group = groups.take_led(&key, &complete);
            self.metrics.set_groups_open(groups.len());
            group
        };
        guard.armed = false;
        let Some(group) = group else {
            return;
        };
        wait.record("members", group.members.len() as i64);
        drop(wait);
        if group.members.len() < group.expected {
            tracing::debug!(group = %group_key, got = group.members.len(), expected = group.expected, "group wait ran out; hinting from what arrived");
        }
        let best_reward = group.members[group.best].reward;
        // The best member first: the hint is built from it, and it kept its
        // decoded trajectory.
        let mut members = group.best_first();
        let Some(trajectory) = members[0].trajectory.take() else {
            unreachable!("the group's best member keeps its trajectory (Gathering::push)")
        };
        let members: Vec<Taken> = members.into_iter().map(|m| m.message).collect();
        self.hint_or_pass(&group_key, best_reward, trajectory, members)
            .await;
    }

    /// Hints a gathered group (`members[0]` its best, with `trajectory`),
    /// or, when its best reward is above the threshold, finishes its
    /// members without a hint.
    async fn hint_or_pass(
        &self,
        group_key: &str,
        best_reward: f64,
        trajectory: Box<FailedTrajectory>,
        members: Vec<Taken>,
    ) {
        if best_reward > self.reward_threshold {
            // The group did not fail: the reference trainer does not hint it.
            tracing::debug!(
                group = %group_key, best_reward, threshold = self.reward_threshold,
                "best reward above hints.reward_threshold; no hint"
            );
            self.metrics.skipped("above_reward_threshold");
            Settlement::new(members).ack();
            return;
        }
        let span = hint_span(group_key, &members);
        // Boxed: the hint's future is large, and would otherwise be copied
        // into every future that awaits it.
        Box::pin(self.hint_group(group_key, trajectory, members).instrument(span)).await;
    }

    /// Writes the hint `plan` says for `trajectory` (read from `source`):
    /// the synthesis, the leak guard, the counters; what the cache keeps.
    async fn make_hint(
        &self,
        plan: &HintPlan,
        trajectory: &FailedTrajectory,
        source: &RecordMeta,
    ) -> CachedHint {
        let earlier = plan.refinement.as_ref().map_or(&[][..], |r| &r.earlier[..]);
        let first = plan.synth.synthesize_with(trajectory, earlier).await;
        let guarded = leak::guard(self.on_leak, &plan.synth, trajectory, earlier, first).await;
        if let Some(action) = guarded.action {
            self.metrics.leak(&plan.arm, action);
        }
        self.metrics.synthesized(&guarded.synthesis);
        if let Some(level) = plan.level {
            self.metrics.graded(&plan.arm, level);
        }
        let labels = HintLabels {
            arm: plan.arm.clone(),
            prompt_version: plan.prompt_version.clone(),
            refines: plan
                .refinement
                .as_ref()
                .map(|r| r.refines.clone())
                .unwrap_or_default(),
            level: plan.level,
        };
        let mut hint = build_hint(
            plan.hint_id.clone(),
            trajectory,
            source,
            guarded.synthesis,
            labels,
        );
        hint.leak = guarded.leak;
        CachedHint::new(hint)
    }

    /// Publishes the hint of a gathered group from `trajectory`, its best
    /// (`members[0]`), and finishes every member.
    async fn hint_group(&self, group_key: &str, trajectory: Box<FailedTrajectory>, members: Vec<Taken>) {
        // Under exactly_once the group's members commit together, whatever
        // becomes of them.
        let members = Settlement::new(members);
        let best = &members.inputs()[0];
        let plan = self.learner.plan(&trajectory).await;
        // Boxed: the cache passes the future through several of its own,
        // and each would copy it whole.
        let make = Box::pin(self.make_hint(&plan, &trajectory, best.meta()));
        let (cached, from_cache) = self.cache.get_or_make(&plan.hint_id, make).await;
        let hint = &cached.hint;
        if from_cache {
            self.metrics.cache_hit();
        }
        if telemetry::exporting() {
            let span = tracing::Span::current();
            span.record("hint_id", hint.hint_id.as_str());
            span.record("category", hint.category.as_str());
            span.record("from_cache", from_cache);
        }
        // A line a hint a model was asked for (rate-limited, worth reading);
        // a static hint or one from the cache repeats what was logged or
        // the verifier's feedback, at every message: DEBUG.
        macro_rules! hint_line {
            ($level:expr) => {
                tracing::event!(
                    $level,
                    category = hint.category.as_str(), instance = %hint.instance_id, hint_id = %hint.hint_id,
                    failure_reason = hint.failure_reason.as_deref().unwrap_or(""), from_cache,
                    "Hint [{}] for instance {} (best_reward={}): {}",
                    hint.category.as_str(), hint.instance_id, trajectory.reward, truncate_chars(&hint.hint, 500)
                )
            };
        }
        if from_cache || hint.category == HintCategory::StaticFallback {
            hint_line!(tracing::Level::DEBUG);
        } else {
            hint_line!(tracing::Level::INFO);
        }
        // The hint's `traceparent` is its produce span's (`send`), or
        // without the export its input's. Under exactly_once it joins a
        // transaction with its members' offsets.
        let record = Outgoing {
            topic: &self.output_topic,
            key: Some(group_key.as_bytes()),
            payload: Some(&cached.payload),
            headers: headers([
                ("content-type", "application/json"),
                (CATEGORY_HEADER, hint.category.as_str()),
                (PROMPT_VERSION_HEADER, hint.prompt_version.as_str()),
            ]),
        };
        let (group, topic) = (group_key.to_owned(), self.output_topic.clone());
        let (metrics, category) = (self.metrics.clone(), hint.category);
        // Settled off this handler (its acknowledgement awaited by the
        // worker's settler): rejected, dead-lettered; stopped (shutdown's
        // deadline passed), the members stay uncommitted.
        members
            .publish_detached(
                &self.producer,
                record,
                &self.lifecycle,
                move |e| format!("the hint for {group} was rejected by {topic}: {e}"),
                move |published| {
                    if let Published::Sent = published {
                        metrics.published(category);
                    }
                },
            )
            .await;
    }
}

/// Says so when the stage calls a model and no spend budget is set.
fn warn_without_budget(llm: &crate::config::LlmConfig, calls_model: bool) {
    if calls_model && llm.budget_usd_per_hour == 0.0 && llm.budget_tokens_per_hour == 0 {
        tracing::warn!(
            requests_per_minute = llm.requests_per_minute,
            "no LLM spend budget is set (llm.budget_usd_per_hour, llm.budget_tokens_per_hour): \
             whoever can write to the input topic decides what this stage spends, up to \
             llm.requests_per_minute calls a minute"
        );
    }
}

/// The topics stage 1 reads and writes, as `topics create` makes them:
/// the failed trajectories, the hints, its dead-letter topic, and (hints
/// that learn, the group budget) the outcomes and the spend ledger.
pub fn topics(config: &Config) -> Vec<TopicSpec> {
    let t = &config.topics;
    vec![
        TopicSpec::plain(&t.failed),
        TopicSpec::plain(&t.hints),
        TopicSpec::dead_letters(config, &config.hints.dlq_topic),
        TopicSpec::outcomes(&t.outcomes),
        TopicSpec::spend(&t.spend),
    ]
}

/// The learning side's start-up errors as the stage's: a configuration
/// to fix exits 2.
fn learn_error(e: super::learning::LearnError) -> StageError {
    use super::learning::LearnError;
    match e {
        LearnError::Config(e) => StageError::Config(e),
        LearnError::Llm(e) => e.into(),
        LearnError::Tail(e) => StageError::Learn(e.to_string()),
    }
}

/// The `hint` span of a gathered group, inside its leader's trace, linked to
/// the traces of members that came with another `traceparent`.
/// Only when spans are exported (the lines about a group's hint name it
/// themselves).
fn hint_span(group_key: &str, members: &[Taken]) -> tracing::Span {
    if !telemetry::exporting() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "hint",
        group = %group_key,
        members = members.len() as i64,
        hint_id = Empty,
        category = Empty,
        from_cache = Empty,
    );
    let mut linked: Vec<TraceParent> = Vec::new();
    for m in members {
        if let Some(parent) = m.meta().header(TRACEPARENT_HEADER).and_then(TraceParent::parse) {
            if !linked.contains(&parent) {
                telemetry::link(&span, parent);
                linked.push(parent);
            }
        }
    }
    span
}

/// Probes the LLM provider until it answers (readiness), at growing
/// intervals; stops once it did or the stage is gone.
async fn probe_llm(hinter: std::sync::Weak<GroupHinter>) {
    let mut pause = Duration::from_secs(2);
    loop {
        let Some(s) = hinter.upgrade() else {
            return;
        };
        if s.synth.probe(LLM_PROBE_TIMEOUT).await {
            return;
        }
        drop(s);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_LLM_PROBE_INTERVAL);
    }
}

impl Stage for GroupHinter {
    type Input = Arrival;
    const PARKS: &'static str = "gathering groups";
    const HOLDS_DECODED: bool = true;
    /// A static or cached hint takes a few microseconds: a task and a
    /// thread's wakeup each would cost more.
    const TASK_PER_BATCH: bool = true;

    fn decode(&self, payload: &Bytes, meta: &RecordMeta) -> Result<Arrival, Rejected> {
        decode_arrival(payload, meta, self.limits)
    }

    fn handle(self: &Arc<Self>, work: Work<Arrival>) -> impl Future<Output = ()> + Send + 'static {
        self.clone().gather(work)
    }

    /// A revoked partition's groups still gathering members cannot complete
    /// here (the rest goes to the new owner): let them go whole,
    /// uncommitted, rather than hint from part of a group. Groups already
    /// complete drain: their hints are published before the revoke ends.
    fn on_revoke(&self, partitions: &[Partition]) -> usize {
        let numbers: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
        let released = {
            let mut groups = self.groups();
            let released = groups.take_incomplete(|key| on_partitions(key, &numbers));
            self.metrics.set_groups_open(groups.len());
            released
        };
        // Its messages are dropped (abandoned) on return, outside the lock.
        released.len()
    }
}

/// A built stage 1.
pub struct HintStage {
    config: Config,
    shell: StageShell,
    hinter: Arc<GroupHinter>,
    /// The group's spend ledger; `None` without a budget.
    ledger: Option<Ledger>,
    pub metrics_addr: SocketAddr,
}

impl HintStage {
    /// Creates the LLM client (from config and the SDK env variables), checks
    /// the cluster and topics, creates the Kafka clients, and starts the
    /// metrics endpoint.
    pub async fn build(config: Config, env: &LlmEnv) -> Result<Self, StageError> {
        // First, so a bad `SSL_CERT_FILE` exits 2 before any broker is asked.
        let synth = Synthesizer::new(&config.llm, env)?;
        let hints = &config.hints;
        let mut shell =
            StageShell::build(&config, hints, "hintstream_hints", &[], true, Linger::Shared).await?;
        let llm = &config.llm;
        let metrics = Arc::new(HintMetrics::register(
            &mut shell.registry,
            (llm.budget_usd_per_hour > 0.0, llm.budget_tokens_per_hour > 0),
        ));
        let synth = Arc::new(synth.with_observer(metrics.clone()));
        tracing::info!("hints: {}", synth.describe());
        if !synth.system_context().is_empty() {
            tracing::info!(
                prompt_cache = llm.prompt_cache,
                "hints: system context {}",
                synth.system_context().describe()
            );
        }
        let learner = Learner::build(&config, env, synth.clone(), &mut shell.registry)
            .await
            .map_err(learn_error)?;
        // An arm's chain calls a model too, whatever the stage's own.
        let calls_model = learner.calls_model();
        warn_without_budget(llm, calls_model);
        // The limits are the group's: the rates split by partitions held,
        // the budget counted over the group's spend ledger.
        let group_limits = synth.group_limits();
        let ledger_metrics = LedgerMetrics::register(&mut shell.registry, group_limits.has_budget());
        let within = Duration::from_secs(config.connect_timeout_secs);
        let input = &hints.input_topic;
        let total = partition_count(&config, input, within).await?.unwrap_or(0);
        shell.on_assignment(rate_share_hook(
            input,
            total,
            group_limits.clone(),
            ledger_metrics.clone(),
            calls_model,
        ));
        let ledger = Ledger::start(&config, group_limits, shell.producer.clone(), ledger_metrics).await?;
        let metrics_addr = shell.serve_metrics().await?;
        let hinter = Arc::new(GroupHinter {
            groups: Mutex::new(Groups::default()),
            synth,
            learner,
            cache: HintCache::new(hints.cache_max_bytes, Duration::from_secs(hints.cache_ttl_secs)),
            producer: shell.producer.clone(),
            lifecycle: shell.lifecycle(),
            output_topic: Arc::from(hints.output_topic.as_str()),
            group_wait: Duration::from_millis(hints.group_wait_ms),
            reward_threshold: hints.reward_threshold,
            on_leak: hints.on_leak,
            limits: config.decode_limits(),
            metrics,
        });
        // Ready once the LLM provider answered (or hints are static).
        let ready_hinter = Arc::downgrade(&hinter);
        shell
            .readiness
            .require(Box::new(move || match ready_hinter.upgrade() {
                Some(s) if !s.synth.provider_answered() => Err(format!(
                    "the LLM provider has not answered yet ({})",
                    s.synth.models().join(", ")
                )),
                Some(s) if !s.learner.caught_up() => {
                    Err("reading the hints and outcomes topics to learn from them".to_string())
                }
                _ => Ok(()),
            }));
        if !hinter.synth.provider_answered() {
            tokio::spawn(probe_llm(Arc::downgrade(&hinter)).in_current_span());
        }
        // Keep the budget gauges current while idle: spend leaves the window.
        tokio::spawn({
            let hinter = Arc::downgrade(&hinter);
            async move {
                let mut tick = tokio::time::interval(BUDGET_GAUGE_INTERVAL);
                loop {
                    tick.tick().await;
                    let Some(hinter) = hinter.upgrade() else {
                        return;
                    };
                    hinter.synth.report_budget();
                }
            }
        });
        Ok(HintStage {
            config,
            shell,
            hinter,
            ledger,
            metrics_addr,
        })
    }

    /// Runs until `shutdown` resolves (or the stage fails: see
    /// `RunSummary::failure`), then drains and commits.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> RunSummary {
        let stage = &self.config.hints;
        tracing::info!(input = %stage.input_topic, output = %stage.output_topic, group = %stage.group_id, "hint stage running");
        let summary = self.shell.run(self.hinter, shutdown).await;
        // The final totals, for the group's budget (bounded: see
        // `Ledger::close`).
        if let Some(ledger) = self.ledger {
            ledger.close().await;
        }
        summary
    }
}

impl Service for HintStage {
    fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    fn run(self: Box<Self>, shutdown: BoxFuture<()>) -> BoxFuture<RunSummary> {
        Box::pin(HintStage::run(*self, shutdown))
    }
}

/// Stage 1 as the registry of stages lists it: built with the model APIs
/// of the process's environment.
pub const REGISTERED: Registered = Registered {
    name: "hints",
    topics,
    build: |config| {
        Box::pin(async move {
            let stage = HintStage::build(config, &LlmEnv::from_process()).await?;
            Ok(Box::new(stage) as Box<dyn Service>)
        })
    },
    quickstart_workers: 2,
};
