//! Stage 1 learning from outcomes, on a real broker: a task that fails again
//! after an unhelpful hint gets a refined one (the LLM is shown the earlier
//! hint and what it did, and the Hint names it in `refines`); with arms, a
//! group redelivered after a kill -9 gets the same arm and `hint_id`; and a
//! worker restarted mid-run reports the same per-arm posterior means.

use crate::common;
use crate::common::llm_server;

use std::process::Command;
use std::time::Duration;

use hintstream::config::{ArmEntry, Config};
use hintstream::hints::HintStage;
use hintstream::kafka::create_producer;
use hintstream::messages::{Hint, HintCategory, HintOutcome};
use llm_server::{Behavior, LlmServer};

pub(super) fn trajectory(run: &str, step: i64, instance: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": run, "step": step, "instance_id": instance,
        "trajectory_id": format!("{instance}-{step}"), "task_prompt": format!("Solve {instance}"),
        "reward": 0.0, "group_size": 1,
        "chat_history": [{"role": "user", "content": "go"}],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['check_output failed']\n<<< ERROR_ACCUMULATOR <<<",
    }))
    .unwrap()
}

pub(super) fn outcome(hint: &Hint, hinted_rollouts: i64, successes: i64) -> HintOutcome {
    HintOutcome {
        schema_version: 1,
        hint_id: hint.hint_id.clone(),
        run_id: hint.run_id.clone(),
        step: hint.step,
        instance_id: hint.instance_id.clone(),
        hinted_rollouts,
        successes,
        rescued: successes > 0,
        mean_reward: if successes > 0 { 0.5 } else { 0.0 },
        transfer: None,
        reliance: None,
        created_at: "2026-12-01T00:00:00.000Z".into(),
    }
}

/// Stage 1's topics of its own, the outcomes topic included.
pub(super) async fn learning_config(broker: &str) -> Config {
    let mut config = common::config_for(broker);
    common::own_topics(&mut config.hints, "learn-failed", "learn-hints");
    config.topics.outcomes = common::unique("learn-outcomes");
    config.llm.timeout_secs = 5.0;
    config.hints.group_wait_ms = 100;
    let h = &config.hints;
    common::create_topics(
        &config,
        &[
            &h.input_topic,
            &h.output_topic,
            &h.dlq_topic,
            &config.topics.outcomes,
        ],
        3,
    )
    .await;
    config
}

async fn hints_in(config: &Config) -> Vec<Hint> {
    common::hints_in(config, &config.hints.output_topic).await
}

/// Waits (bounded) until `done` holds for the hints published so far.
pub(super) async fn wait_hints(
    config: &Config,
    done: impl Fn(&[Hint]) -> bool,
    context: impl Fn() -> String,
) -> Vec<Hint> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let hints = hints_in(config).await;
        if done(&hints) {
            return hints;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out with {} hints\n{}",
            hints.len(),
            context()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub(super) async fn publish_outcome(
    config: &Config,
    producer: &rdkafka::producer::FutureProducer,
    o: &HintOutcome,
) {
    common::send(
        producer,
        &config.topics.outcomes,
        &o.key(),
        &serde_json::to_vec(o).unwrap(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_failing_again_after_an_unhelpful_hint_gets_a_refined_one() {
    let broker = common::shared_kafka();
    let config = learning_config(&broker.bootstrap).await;
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Check the output format before printing.".into(),
        Duration::ZERO,
    ));
    let stage = HintStage::build(config.clone(), &llm_server::anthropic_env(&server, "sk-k"))
        .await
        .unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let producer = create_producer(&config).unwrap();
    let run = common::unique("run-refine");
    let key = |step| hintstream::messages::group_key(&run, step, "task-1");

    common::send(
        &producer,
        &config.hints.input_topic,
        &key(1),
        &trajectory(&run, 1, "task-1"),
    )
    .await;
    let first = wait_hints(&config, |h| !h.is_empty(), String::new)
        .await
        .remove(0);
    assert_eq!(first.category, HintCategory::LlmSynthesized);
    assert!(first.refines.is_empty());
    assert_eq!(first.prompt_version, "v3");
    // Stage 2's word on it: both hinted retries failed.
    publish_outcome(&config, &producer, &outcome(&first, 2, 0)).await;

    common::send(
        &producer,
        &config.hints.input_topic,
        &key(2),
        &trajectory(&run, 2, "task-1"),
    )
    .await;
    let hints = wait_hints(&config, |h| h.len() >= 2, String::new).await;
    running.stop().await;
    let second = hints.iter().find(|h| h.step == 2).expect("the step-2 hint");
    assert_eq!(
        second.refines,
        vec![first.hint_id.clone()],
        "it names the hint it refines"
    );
    assert_eq!(second.prompt_version, "v3+refine");
    assert_eq!(second.arm, "default");
    let requests = server.seen();
    let last = requests.last().expect("two LLM requests").body.to_string();
    assert!(last.contains("Earlier hints that did not help"), "{last}");
    assert!(last.contains(&first.hint), "the earlier hint's text: {last}");
    assert!(
        last.contains("2 hinted retries, 0 succeeded"),
        "what it did: {last}"
    );
    assert!(
        !requests[0].body.to_string().contains("Earlier hints"),
        "the first was fresh"
    );
}

/// Two LLM arms on the loopback server and the static control.
fn three_arms() -> Vec<ArmEntry> {
    let llm = |name: &str, model: &str| ArmEntry {
        name: name.into(),
        prompt_version: None,
        models: vec![model.into()],
        is_static: false,
        weight: 1.0,
        min_share: 0.1,
        prior_alpha: 1.0,
        prior_beta: 1.0,
        levels: vec![],
    };
    vec![
        llm("strong", "claude-strong"),
        llm("weak", "claude-weak"),
        ArmEntry {
            is_static: true,
            models: vec![],
            ..llm("control", "")
        },
    ]
}

fn worker(
    config_file: &std::path::Path,
    server: &LlmServer,
    metrics: common::MetricsEndpoint,
    name: &str,
) -> common::Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
    command
        .args(["hints", "--config"])
        .arg(config_file)
        .args(["--metrics-addr", &metrics.addr()])
        .env("ANTHROPIC_API_KEY", "sk-k")
        .env("ANTHROPIC_BASE_URL", server.base_url())
        .env("RUST_LOG", "info");
    common::Process::spawn(command, name)
}

/// Earlier steps as a run would have left them: hints of every arm with
/// outcomes (the strong arm rescuing), written straight to the topics.
async fn seed_history(config: &Config, producer: &rdkafka::producer::FutureProducer, run: &str) {
    for step in 0..4i64 {
        for (i, arm) in ["strong", "weak", "control"].iter().enumerate() {
            let instance = format!("seed-{step}-{i}");
            let hint = Hint {
                schema_version: 1,
                hint_id: format!("seed-{run}-{step}-{i}"),
                run_id: run.into(),
                step,
                instance_id: instance.clone(),
                trajectory_id: format!("{instance}-t"),
                hint: format!("seeded hint of {arm}"),
                category: if *arm == "control" {
                    HintCategory::StaticFallback
                } else {
                    HintCategory::LlmSynthesized
                },
                model: None,
                prompt_version: "v2".into(),
                latency_ms: 1,
                usage: Default::default(),
                cost_usd: 0.001,
                failure_reason: None,
                source: hintstream::messages::HintSource {
                    topic: "seed".into(),
                    partition: 0,
                    offset: step,
                },
                created_at: "2026-12-01T00:00:00.000Z".into(),
                arm: arm.to_string(),
                refines: vec![],
                hint_truncated: false,
                hedged: false,
                leak: false,
                level: None,
            };
            let key = hintstream::messages::group_key(run, step, &instance);
            common::send(
                producer,
                &config.hints.output_topic,
                &key,
                &serde_json::to_vec(&hint).unwrap(),
            )
            .await;
            let successes = if *arm == "strong" { 2 } else { 0 };
            publish_outcome(config, producer, &outcome(&hint, 2, successes)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivered_group_gets_the_same_arm_and_hint_id_and_a_restart_the_same_posteriors() {
    let broker = common::shared_kafka();
    let mut config = learning_config(&broker.bootstrap).await;
    config.hints.arms = three_arms();
    config.kafka.insert("session.timeout.ms", "6000");
    config.kafka.insert("heartbeat.interval.ms", "500");
    config.hints.drain_timeout_secs = 3;
    config.advantages.drain_timeout_secs = 3;
    // Nothing is committed before the kill: every group comes back.
    config.kafka.insert("auto.commit.interval.ms", "600000");
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Read the failing check's message first.".into(),
        Duration::ZERO,
    ));
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let producer = create_producer(&config).unwrap();
    let run = common::unique("run-arms");
    seed_history(&config, &producer, &run).await;

    let metrics = common::MetricsEndpoint::free();
    let mut first = worker(&file, &server, metrics, "hints-first");
    metrics.wait_assigned("hints", || first.log()).await;
    let groups: Vec<String> = (0..12).map(|i| format!("task-{i}")).collect();
    for g in &groups {
        let key = hintstream::messages::group_key(&run, 6, g);
        common::send(
            &producer,
            &config.hints.input_topic,
            &key,
            &trajectory(&run, 6, g),
        )
        .await;
    }
    let before = wait_hints(
        &config,
        |h| h.iter().filter(|h| h.step == 6).count() == 12,
        || first.log(),
    )
    .await;
    // The arm gauges refresh on a timer: read them once they count every
    // hint of the run (the seeded ones and step 6's), not before.
    let pulls = before.iter().filter(|h| h.run_id == run).count();
    let posteriors_before = posteriors_once_pulled(&metrics, pulls).await;
    first.kill9();

    let metrics_after = common::MetricsEndpoint::free();
    let second = worker(&file, &server, metrics_after, "hints-second");
    metrics_after.wait_assigned("hints", || second.log()).await;
    // The redelivered groups are hinted again (nothing was committed).
    let after = wait_hints(
        &config,
        |h| h.iter().filter(|h| h.step == 6).count() == 24,
        || second.log(),
    )
    .await;
    let posteriors_after = wait_posteriors(&metrics_after, &posteriors_before).await;

    for g in &groups {
        let copies: Vec<&Hint> = after
            .iter()
            .filter(|h| h.step == 6 && &h.instance_id == g)
            .collect();
        assert_eq!(copies.len(), 2, "{g}: once before the kill, once redelivered");
        assert_eq!(copies[0].arm, copies[1].arm, "{g}: the same arm");
        assert_eq!(copies[0].hint_id, copies[1].hint_id, "{g}: the same hint_id");
    }
    let arms: std::collections::BTreeSet<&str> = before
        .iter()
        .filter(|h| h.step == 6)
        .map(|h| h.arm.as_str())
        .collect();
    assert!(
        arms.iter().all(|a| ["strong", "weak", "control"].contains(a)),
        "{arms:?}"
    );
    for (arm, mean) in &posteriors_before {
        let again = posteriors_after
            .iter()
            .find(|(a, _)| a == arm)
            .map(|(_, m)| *m)
            .unwrap();
        assert!(
            (mean - again).abs() < 1e-9,
            "{arm}: {mean} before the restart, {again} after"
        );
    }
    // The strong arm rescued every seeded group: its posterior is the highest.
    let mean = |arm: &str| posteriors_before.iter().find(|(a, _)| a == arm).unwrap().1;
    assert!(
        mean("strong") > mean("weak") && mean("strong") > mean("control"),
        "{posteriors_before:?}"
    );
}

/// Each arm's posterior mean, once the three arms' `arm_pulls` add up to
/// `pulls` (the gauges are refreshed on a timer, behind what was read).
async fn posteriors_once_pulled(metrics: &common::MetricsEndpoint, pulls: usize) -> Vec<(String, f64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((_, text)) = metrics.get("/metrics").await {
            let counted: f64 = ["strong", "weak", "control"]
                .iter()
                .map(|arm| common::metric_value(&text, "hintstream_hints_arm_pulls", &[("arm", arm)]))
                .sum();
            if counted as usize == pulls {
                return posterior_means(metrics).await;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the arms count {counted} pulls, not {pulls}:\n{text}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each arm's `hintstream_hints_arm_posterior_mean`, once all three are set.
async fn posterior_means(metrics: &common::MetricsEndpoint) -> Vec<(String, f64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((_, text)) = metrics.get("/metrics").await {
            let means: Vec<(String, f64)> = ["strong", "weak", "control"]
                .iter()
                .filter(|arm| text.contains(&format!("hintstream_hints_arm_posterior_mean{{arm=\"{arm}\"}}")))
                .map(|arm| {
                    (
                        arm.to_string(),
                        common::metric_value(&text, "hintstream_hints_arm_posterior_mean", &[("arm", arm)]),
                    )
                })
                .collect();
            if means.len() == 3 {
                return means;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no per-arm posterior means on the metrics endpoint"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The restarted worker's means once it has read the topics (they equal
/// the earlier ones then; a bound on the wait, not on the value).
async fn wait_posteriors(metrics: &common::MetricsEndpoint, want: &[(String, f64)]) -> Vec<(String, f64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = posterior_means(metrics).await;
        let same = want
            .iter()
            .all(|(arm, m)| got.iter().any(|(a, g)| a == arm && (g - m).abs() < 1e-9));
        if same || tokio::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_trainer_s_hint_model_is_used_when_allowed_and_counted_when_not() {
    let broker = common::shared_kafka();
    let mut config = learning_config(&broker.bootstrap).await;
    config.llm.models = vec!["claude-chain".into()];
    config.llm.allowed_models = vec!["claude-asked".into()];
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text("Print the result once.".into(), Duration::ZERO));
    let stage = HintStage::build(config.clone(), &llm_server::anthropic_env(&server, "sk-k"))
        .await
        .unwrap();
    let metrics = common::MetricsEndpoint(stage.metrics_addr);
    let running = common::spawn_stage(|stop| stage.run(stop));
    let producer = create_producer(&config).unwrap();
    let run = common::unique("run-model");
    let asking = |instance: &str, model: &str| {
        let mut t: serde_json::Value = serde_json::from_slice(&trajectory(&run, 1, instance)).unwrap();
        t["hint_model"] = model.into();
        serde_json::to_vec(&t).unwrap()
    };
    for (instance, model) in [("allowed", "claude-asked"), ("unlisted", "claude-other")] {
        let key = hintstream::messages::group_key(&run, 1, instance);
        common::send(
            &producer,
            &config.hints.input_topic,
            &key,
            &asking(instance, model),
        )
        .await;
    }
    let hints = wait_hints(&config, |h| h.len() == 2, String::new).await;
    let ignored = metrics
        .wait_for(
            "hintstream_hints_hint_model_ignored_total",
            &[("reason", "not_allowed")],
            |v| v >= 1.0,
            Duration::from_secs(30),
            String::new,
        )
        .await;
    running.stop().await;
    let model_of = |instance: &str| {
        hints
            .iter()
            .find(|h| h.instance_id == instance)
            .unwrap()
            .model
            .clone()
    };
    assert_eq!(
        model_of("allowed").as_deref(),
        Some("claude-asked"),
        "the model the trainer asked for"
    );
    assert_eq!(
        model_of("unlisted").as_deref(),
        Some("claude-chain"),
        "not allowed: the chain"
    );
    assert_eq!(ignored, 1.0);
    let models: Vec<String> = server
        .seen()
        .iter()
        .map(|s| s.body["model"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        models.contains(&"claude-asked".to_string()) && !models.contains(&"claude-other".to_string()),
        "{models:?}"
    );
}
