//! Stage 1 on a real broker with a loopback LLM server: hints carry the
//! server's text, a group of three yields one hint from its best trajectory,
//! bad input goes to the DLQ, no key gives static hints, and two `hintstream
//! hints` processes share a 6-partition topic: exactly one hint per group in
//! normal operation, at least one (duplicates sharing their hint_id) when one
//! process is killed with SIGKILL mid-stream.

use crate::common;
use crate::common::llm_server;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::Duration;

use hintstream::config::Config;
use hintstream::hints::HintStage;
use hintstream::kafka::{create_producer, DlqHeaders};
use hintstream::llm::synth::LlmEnv;
use hintstream::messages::{Hint, HintCategory};
use llm_server::{Behavior, LlmServer};
use rdkafka::producer::Producer;

fn trajectory(step: i64, instance: &str, trajectory: &str, reward: f64, group_size: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": "run-h", "step": step, "instance_id": instance,
        "trajectory_id": trajectory, "task_prompt": format!("Solve {instance}"), "reward": reward,
        "group_size": group_size,
        "chat_history": [{"role": "user", "content": "go"}],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['check_output failed']\n<<< ERROR_ACCUMULATOR <<<",
    }))
    .unwrap()
}

use common::send;

/// Waits until `done(hints)` holds.
async fn wait_hints(config: &Config, topic: &str, secs: u64, done: impl Fn(&[Hint]) -> bool) -> Vec<Hint> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let hints = common::hints_in(config, topic).await;
        if done(&hints) {
            return hints;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out with {} hints: {:?}",
            hints.len(),
            hints
                .iter()
                .map(|h| (&h.instance_id, &h.category, &h.failure_reason))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn stage_config(broker: &str, partitions: i32) -> (Config, i32) {
    let mut config = common::config_for(broker);
    common::own_topics(&mut config.hints, "failed", "hints");
    config.llm.timeout_secs = 5.0;
    (config, partitions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_llm_hint_per_group_from_its_best_trajectory() {
    let broker = common::shared_kafka();
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Call the parser on a week date before editing it.".into(),
        Duration::from_millis(20),
    ));
    let (config, partitions) = stage_config(&broker.bootstrap, 2);
    common::create_hints_topics(&config, partitions).await;
    let topic = config.hints.input_topic.clone();
    let producer = create_producer(&config).unwrap();
    // A group of three, out of reward order; two single groups; bad input.
    // (Failed: the best reward is at most hints.reward_threshold, 0.)
    for (t, r) in [("a1", -0.3), ("a2", 0.0), ("a3", -0.1)] {
        send(&producer, &topic, "run-h/1/A", &trajectory(1, "A", t, r, 3)).await;
    }
    send(&producer, &topic, "run-h/1/B", &trajectory(1, "B", "b1", 0.0, 1)).await;
    // D: the LLM keeps failing with 500; E: 429 with retry-after, then fine.
    server.on("Solve D", vec![Behavior::Status(500, "api_error", None)]);
    server.on(
        "Solve E",
        vec![
            Behavior::Status(429, "rate_limit_error", Some(1)),
            Behavior::Text("Retry worked.".into(), Duration::ZERO),
        ],
    );
    send(&producer, &topic, "run-h/1/D", &trajectory(1, "D", "d1", 0.0, 1)).await;
    send(&producer, &topic, "run-h/1/E", &trajectory(1, "E", "e1", 0.0, 1)).await;
    send(&producer, &topic, "x", b"{not json").await;
    send(&producer, &topic, "run-h/1/C", &trajectory(1, "C", "c1", 0.0, 1)).await;
    producer.flush(Duration::from_secs(10)).unwrap();

    let env = llm_server::anthropic_env(&server, "sk-k");
    let stage = HintStage::build(config.clone(), &env).await.unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let hints = wait_hints(&config, &config.hints.output_topic, 60, |h| h.len() >= 5).await;
    // Every input committed: each one's hint (or dead letter) was
    // acknowledged, so a second hint for a group would be on the topic now.
    common::waits::wait_committed_to_end(
        &config,
        &config.hints.group_id,
        &topic,
        partitions,
        Duration::from_secs(60),
        String::new,
    )
    .await;
    let hints_again = common::hints_in(&config, &config.hints.output_topic).await;
    running.stop().await;

    assert_eq!(hints_again.len(), 5, "exactly one hint per group: {hints:?}");
    let by_group: HashMap<&str, &Hint> = hints_again.iter().map(|h| (h.instance_id.as_str(), h)).collect();
    assert_eq!(
        by_group["A"].trajectory_id, "a2",
        "built from the best trajectory"
    );
    for h in hints_again
        .iter()
        .filter(|h| ["A", "B", "C"].contains(&h.instance_id.as_str()))
    {
        assert_eq!(h.category, HintCategory::LlmSynthesized);
        assert_eq!(h.hint, "Call the parser on a week date before editing it.");
        assert_eq!(h.prompt_version, hintstream::llm::prompt::PROMPT_VERSION);
        assert_eq!(h.source.topic, topic);
    }
    let d = by_group["D"];
    assert_eq!(d.category, HintCategory::LlmFailedStaticFallback);
    assert_eq!(d.failure_reason.as_deref(), Some("http_5xx"));
    assert!(d.hint.contains("check_output failed"), "{}", d.hint);
    let e = by_group["E"];
    assert_eq!(
        (e.category, e.hint.as_str()),
        (HintCategory::LlmSynthesized, "Retry worked.")
    );
    let e_calls: Vec<_> = server
        .seen()
        .into_iter()
        .filter(|r| r.body.to_string().contains("Solve E"))
        .collect();
    assert_eq!(e_calls.len(), 2);
    assert!(
        e_calls[1].at.duration_since(e_calls[0].at) >= Duration::from_secs(1),
        "retry honoured retry-after"
    );
    let a_calls = server
        .seen()
        .iter()
        .filter(|r| r.body.to_string().contains("Solve A"))
        .count();
    assert_eq!(a_calls, 1, "one LLM call for the group of three");
    let dead = common::read_topic(&config, &config.hints.dlq_topic).await;
    assert_eq!(dead.len(), 1);
    assert!(dead[0]
        .headers
        .iter()
        .any(|h| h.key == DlqHeaders::ERROR_KIND && h.value.bytes.as_deref() == Some(b"not_json")));
    let hint_headers = &common::read_topic(&config, &config.hints.output_topic).await[0].headers;
    for name in ["hintstream.category", "hintstream.prompt-version", "traceparent"] {
        assert!(
            hint_headers.iter().any(|h| h.key == name),
            "hint lacks header {name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_key_publishes_static_hints() {
    let broker = common::shared_kafka();
    let (config, partitions) = stage_config(&broker.bootstrap, 1);
    common::create_hints_topics(&config, partitions).await;
    let producer = create_producer(&config).unwrap();
    // Traced by its producer: the hint continues the trace, although this
    // stage exports no spans.
    let input = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    common::send_raw(
        &producer,
        &config.hints.input_topic,
        "run-h/1/S",
        Some(&trajectory(1, "S", "s1", 0.0, 1)),
        Some(
            rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                key: "traceparent",
                value: Some(input),
            }),
        ),
    )
    .await;
    producer.flush(Duration::from_secs(10)).unwrap();
    let stage = HintStage::build(config.clone(), &LlmEnv::default())
        .await
        .unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let hints = wait_hints(&config, &config.hints.output_topic, 60, |h| !h.is_empty()).await;
    running.stop().await;
    assert_eq!(hints[0].category, HintCategory::StaticFallback);
    assert!(hints[0].hint.contains("check_output failed"), "{}", hints[0].hint);
    assert_eq!(hints[0].model, None);
    let published = common::read_topic(&config, &config.hints.output_topic).await;
    let header = published[0]
        .headers
        .iter()
        .find(|h| h.key == "traceparent")
        .and_then(|h| h.value.bytes.as_deref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap();
    assert!(
        header.starts_with("00-0af7651916cd43dd8448eb211c80319c-") && !header.contains("b7ad6b7169203331"),
        "the input's trace under a span of its own: {header}"
    );
}

/// `n` single-trajectory failed groups of `step` (`g000`, `g001`, ...),
/// flushed.
async fn send_groups(producer: &rdkafka::producer::FutureProducer, topic: &str, step: i64, n: usize) {
    for i in 0..n {
        let g = format!("g{i:03}");
        send(
            producer,
            topic,
            &format!("run-h/{step}/{g}"),
            &trajectory(step, &g, "t", 0.0, 1),
        )
        .await;
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// A `hintstream hints` process, killed on drop.
fn start_worker(
    config_file: &std::path::Path,
    server: &LlmServer,
    name: &str,
    metrics: common::MetricsEndpoint,
) -> common::Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
    command
        .args(["hints", "--config"])
        .arg(config_file)
        .args(["--metrics-addr", &metrics.addr()])
        .env("ANTHROPIC_API_KEY", "sk-k")
        .env("ANTHROPIC_BASE_URL", server.base_url())
        .env("RUST_LOG", "info");
    common::Process::spawn(command, &format!("hints-{name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_share_partitions_on_kafka() {
    two_processes(&common::shared_kafka().bootstrap, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_survive_a_kill_9_on_kafka() {
    two_processes(&common::shared_kafka().bootstrap, true).await;
}

async fn two_processes(bootstrap: &str, kill: bool) {
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Check the output format first.".into(),
        Duration::from_millis(100),
    ));
    let (config, _) = stage_config(bootstrap, 6);
    common::create_hints_topics(&config, 6).await;
    let mut config = config;
    config.kafka.insert("session.timeout.ms", "6000");
    config.kafka.insert("heartbeat.interval.ms", "500");
    config.hints.drain_timeout_secs = 3;
    config.advantages.drain_timeout_secs = 3;
    config.hints.group_wait_ms = 200;
    config.llm.concurrency = 4;
    let config = config;
    let h = &config.hints;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let (a_metrics, b_metrics) = (common::MetricsEndpoint::free(), common::MetricsEndpoint::free());
    let mut a = start_worker(&file, &server, "a", a_metrics);
    let b = start_worker(&file, &server, "b", b_metrics);
    // Let both join and the group settle before any input exists, so that a
    // rebalance does not hand in-flight work from one to the other.
    let assigned = "hintstream_hints_assigned_partitions";
    let logs = || format!("--- a\n{}\n--- b\n{}", a.log(), b.log());
    for endpoint in [a_metrics, b_metrics] {
        endpoint.wait_assigned("hints", logs).await;
    }
    // Settled: both hold partitions and together all six (a cooperative
    // rebalance takes partitions from one before it gives them the other).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (on_a, on_b) = (
            a_metrics.value(assigned, &[]).await,
            b_metrics.value(assigned, &[]).await,
        );
        if on_a > 0.0 && on_b > 0.0 && on_a + on_b == 6.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the group did not settle: a holds {on_a}, b {on_b} of 6 partitions\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The kill below makes the survivor resume from committed offsets.
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    // 60 single-trajectory groups per step.
    let send_steps = |steps: &'static [i64]| {
        let (producer, topic) = (&producer, &h.input_topic);
        async move {
            for &step in steps {
                send_groups(producer, topic, step, 60).await;
            }
        }
    };
    send_steps(&[1]).await;
    let hints = wait_hints(&config, &h.output_topic, 90, |h| h.len() >= 60).await;
    // Step 1 committed to its end: a duplicate hint would be on the topic.
    common::waits::wait_committed_to_end(
        &config,
        &h.group_id,
        &h.input_topic,
        6,
        Duration::from_secs(60),
        logs,
    )
    .await;
    let hints_settled = common::hints_in(&config, &h.output_topic).await;
    let step1: Vec<&Hint> = hints_settled.iter().filter(|h| h.step == 1).collect();
    assert_eq!(
        step1.len(),
        60,
        "exactly one hint per group in normal operation ({} seen first)",
        hints.len()
    );
    assert_eq!(
        step1.iter().map(|h| &h.instance_id).collect::<HashSet<_>>().len(),
        60
    );
    let published = "hintstream_hints_hints_published_total";
    let llm = [("category", "llm_synthesized")];
    assert!(
        a_metrics.value(published, &llm).await > 0.0 && b_metrics.value(published, &llm).await > 0.0,
        "both processes worked"
    );

    if !kill {
        return;
    }
    // Kill -9 one process mid-stream: slower answers keep both busy.
    server.default(Behavior::Text(
        "Check the output format first.".into(),
        Duration::from_millis(300),
    ));
    let assigned_before = b_metrics.value(assigned, &[]).await;
    send_steps(&[2, 3]).await;
    wait_hints(&config, &h.output_topic, 60, |h| h.len() >= 60 + 20).await;
    let by_a_before_kill = a_metrics.value(published, &[]).await;
    a.kill9();
    let hints = wait_hints(&config, &h.output_topic, 120, |hints| {
        let groups: HashSet<(i64, &str)> = hints.iter().map(|h| (h.step, h.instance_id.as_str())).collect();
        groups.len() >= 180
    })
    .await;
    let mut ids: HashMap<(i64, &str), HashSet<&str>> = HashMap::new();
    for h in &hints {
        ids.entry((h.step, h.instance_id.as_str()))
            .or_default()
            .insert(h.hint_id.as_str());
    }
    assert_eq!(ids.len(), 180, "every group has at least one hint");
    assert!(
        b_metrics.value(assigned, &[]).await > assigned_before,
        "the survivor took over the killed process's partitions"
    );
    assert!(
        by_a_before_kill < 180.0,
        "the killed process did not finish everything itself"
    );
    assert!(
        ids.values().all(|set| set.len() == 1),
        "duplicates share their hint_id"
    );
    eprintln!(
        "after the kill: {} hints for 180 groups ({} duplicates)",
        hints.len(),
        hints.len() - 180
    );
    drop(b);
}

/// The reference trainer hints a group only when its best reward is at most
/// `hint_reward_threshold`: a group above it gets no LLM call and no hint,
/// its messages are committed, and the stage counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn groups_above_the_reward_threshold_get_no_hint() {
    let broker = common::shared_kafka();
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text("A hint.".into(), Duration::ZERO));
    let (mut config, partitions) = stage_config(&broker.bootstrap, 1);
    config.hints.group_wait_ms = 200;
    let endpoint = common::MetricsEndpoint::free();
    config.hints.metrics_addr = endpoint.addr();
    common::create_hints_topics(&config, partitions).await;
    let topic = config.hints.input_topic.clone();
    let producer = create_producer(&config).unwrap();
    // P: one of two trajectories passed partly (0.5 > 0): not hinted.
    // F: both failed (0.0): hinted.
    for (instance, t, r) in [
        ("P", "p1", 0.0),
        ("P", "p2", 0.5),
        ("F", "f1", 0.0),
        ("F", "f2", 0.0),
    ] {
        send(
            &producer,
            &topic,
            &format!("run-h/1/{instance}"),
            &trajectory(1, instance, t, r, 2),
        )
        .await;
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let env = llm_server::anthropic_env(&server, "sk-k");
    let stage = HintStage::build(config.clone(), &env).await.unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let skipped = endpoint
        .wait_for(
            "hintstream_hints_hints_skipped_total",
            &[("reason", "above_reward_threshold")],
            |n| n >= 1.0,
            Duration::from_secs(60),
            String::new,
        )
        .await;
    let hints = wait_hints(&config, &config.hints.output_topic, 60, |h| !h.is_empty()).await;
    // Both groups' messages committed: a hint for P would be on the topic.
    common::waits::wait_committed_to_end(
        &config,
        &config.hints.group_id,
        &topic,
        partitions,
        Duration::from_secs(60),
        String::new,
    )
    .await;
    let hints_again = common::hints_in(&config, &config.hints.output_topic).await;
    let in_flight = endpoint.value("hintstream_hints_in_flight_messages", &[]).await;
    running.stop().await;
    assert_eq!(skipped, 1.0);
    assert_eq!(hints_again.len(), 1, "{hints:?}");
    assert_eq!(hints_again[0].instance_id, "F");
    assert!(
        server
            .seen()
            .iter()
            .all(|r| !r.body.to_string().contains("Solve P")),
        "no LLM call for the group that passed"
    );
    assert_eq!(in_flight, 0.0, "the skipped group's messages are finished");
}

/// A worker stalled past its session (SIGSTOP for twice `session.timeout.ms`,
/// as a load spike or a long GC-like pause does) loses its partitions; when
/// it runs again it rejoins the group and hints what arrives after, with no
/// operator action.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_stalled_past_its_session_rejoins_and_goes_on() {
    let broker = common::shared_kafka();
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Check the output format first.".into(),
        Duration::ZERO,
    ));
    let (mut config, _) = stage_config(&broker.bootstrap, 3);
    common::create_hints_topics(&config, 3).await;
    config.kafka.insert("session.timeout.ms", "6000");
    config.kafka.insert("heartbeat.interval.ms", "500");
    config.hints.drain_timeout_secs = 3;
    config.advantages.drain_timeout_secs = 3;
    config.hints.group_wait_ms = 200;
    let h = config.hints.clone();
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let metrics = common::MetricsEndpoint::free();
    let mut worker = start_worker(&file, &server, "stalled", metrics);
    metrics.wait_assigned("hints", || worker.log()).await;
    let producer = create_producer(&config).unwrap();
    send_groups(&producer, &h.input_topic, 1, 30).await;
    wait_hints(&config, &h.output_topic, 60, |h| h.len() >= 30).await;
    let pid = worker.pid().to_string();
    let signal = |sig: &str| {
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success(), "kill {sig} failed");
    };
    signal("-STOP");
    // Past the session: the broker evicts the member meanwhile.
    tokio::time::sleep(Duration::from_secs(12)).await;
    signal("-CONT");
    send_groups(&producer, &h.input_topic, 2, 30).await;
    let hints = wait_hints(&config, &h.output_topic, 90, |hints| {
        hints
            .iter()
            .filter(|h| h.step == 2)
            .map(|h| &h.instance_id)
            .collect::<HashSet<_>>()
            .len()
            >= 30
    })
    .await;
    assert!(worker.running(), "the worker exited:\n{}", worker.log());
    assert_eq!(
        hints
            .iter()
            .filter(|h| h.step == 1)
            .map(|h| &h.instance_id)
            .collect::<HashSet<_>>()
            .len(),
        30
    );
    drop(worker);
}
