//! Faults around the workers, with real processes and a real broker:
//!
//! - the Kafka node killed (SIGKILL) and restarted on its data while a hint
//!   worker and an advantage worker are mid-stream: both reconnect and
//!   finish; every group gets a hint and every step its advantages, nothing
//!   goes to a dead-letter topic, neither process dies.
//! - an advantage worker killed (SIGKILL) after computing a step and before
//!   the broker acknowledged its publication: the restarted worker
//!   reassembles the step from the uncommitted input and publishes it, with
//!   the same advantages.

use crate::common;
use crate::common::llm_server;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use arrow_array::{Array, Float64Array, Int64Array, RecordBatch};
use common::send;
use hintstream::batch::{ipc, ScoredRows};
use hintstream::config::Config;
use hintstream::messages::{Hint, ScoredRollout};
use hintstream::normalize::{AdvantageOptions, Device};
use llm_server::{Behavior, LlmServer};
use rdkafka::producer::{FutureProducer, Producer};

fn trajectory(step: i64, instance: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": "run-f", "step": step, "instance_id": instance,
        "trajectory_id": format!("{instance}-t"), "task_prompt": format!("Solve {instance}"),
        "reward": 0.0, "chat_history": [{"role": "user", "content": "go"}],
        "verifier_error": "assert failed",
    }))
    .unwrap()
}

/// Step `step`'s rows: 4 groups × 5 rollouts, the last of each hinted.
fn step_rows(step: i64) -> Vec<ScoredRollout> {
    let mut rows = Vec::new();
    for g in 0..4 {
        for r in 0..5 {
            rows.push(ScoredRollout {
                schema_version: 1,
                run_id: "run-f".into(),
                step,
                instance_id: format!("g{g}"),
                trajectory_id: format!("s{step}-g{g}-r{r}"),
                reward: f64::from((step as i32 * 7 + g * 3 + r) % 4) / 3.0,
                is_hinted: r == 4,
                hint_category: (r == 4).then(|| "llm_synthesized".to_string()),
                hint_id: None,
                response_length: None,
                logprob_hinted: None,
                logprob_unhinted: None,
            });
        }
    }
    rows
}

async fn send_step(producer: &FutureProducer, topic: &str, step: i64) {
    let key = format!("run-f/{step}");
    let rows = step_rows(step);
    for row in &rows {
        let mut v = serde_json::to_value(row).unwrap();
        v["type"] = "scored_rollout".into();
        send(producer, topic, &key, v.to_string().as_bytes()).await;
    }
    let end = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "run-f", "step": step, "count": rows.len()});
    send(producer, topic, &key, end.to_string().as_bytes()).await;
}

/// The advantages stage 2 should publish for `step`, computed here.
fn expected_advantages(step: i64) -> BTreeMap<String, f64> {
    let mut rows = ScoredRows::default();
    for r in step_rows(step) {
        rows.push(&r);
    }
    let ids = rows.trajectory_id.clone();
    let result =
        hintstream::advantages::compute_step(rows, &AdvantageOptions::default(), Device::Cpu).unwrap();
    ids.iter()
        .map(str::to_string)
        .zip(result.advantages.advantage)
        .collect()
}

/// Per step, trajectory_id → advantage, from the Arrow messages of `topic`.
async fn published_advantages(config: &Config, topic: &str) -> BTreeMap<i64, BTreeMap<String, f64>> {
    let mut out: BTreeMap<i64, BTreeMap<String, f64>> = BTreeMap::new();
    for m in common::read_topic(config, topic).await {
        for batch in ipc::decode_stream(m.value_bytes().unwrap()).unwrap() {
            let (steps, ids, advantages) = columns(&batch);
            for i in 0..batch.num_rows() {
                out.entry(steps[i])
                    .or_default()
                    .insert(ids[i].clone(), advantages[i]);
            }
        }
    }
    out
}

fn columns(batch: &RecordBatch) -> (Vec<i64>, Vec<String>, Vec<f64>) {
    let step = batch
        .column_by_name("step")
        .unwrap()
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    let ids = arrow_cast::display::ArrayFormatter::try_new(
        batch.column_by_name("trajectory_id").unwrap().as_ref(),
        &Default::default(),
    )
    .unwrap();
    let adv = batch
        .column_by_name("advantage")
        .unwrap()
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap();
    (
        step.values().to_vec(),
        (0..batch.num_rows()).map(|i| ids.value(i).to_string()).collect(),
        adv.values().to_vec(),
    )
}

fn assert_same_advantages(got: &BTreeMap<String, f64>, want: &BTreeMap<String, f64>) {
    assert_eq!(got.len(), want.len());
    for (id, w) in want {
        let g = got[id];
        assert!((g - w).abs() <= 1e-9 * (1.0 + w.abs()), "{id}: got {g}, want {w}");
    }
}

fn start(stage: &str, config_file: &Path, server: Option<&LlmServer>, name: &str) -> common::Process {
    let mut command = common::stage_command(stage, config_file);
    command.env("RUST_LOG", "info,hintstream::advantages=debug");
    if let Some(s) = server {
        command
            .env("ANTHROPIC_API_KEY", "sk-k")
            .env("ANTHROPIC_BASE_URL", s.base_url());
    }
    common::Process::spawn(command, name)
}

/// Distinct group keys of the hints on `topic`.
async fn hinted_groups(config: &Config, topic: &str) -> BTreeSet<String> {
    common::read_topic(config, topic)
        .await
        .iter()
        .map(|m| {
            let h: Hint = serde_json::from_slice(m.value_bytes().unwrap()).unwrap();
            hintstream::messages::group_key(&h.run_id, h.step, &h.instance_id)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_ride_out_a_broker_restart() {
    const GROUPS: usize = 400;
    const STEPS: i64 = 12;
    let mut broker = common::own_kafka();
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Derived(Duration::from_millis(10)));

    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "failed", "hints");
    common::own_topics(&mut config.advantages, "scored", "advantages");
    config.topics.metrics = common::unique("metrics");
    config.llm.concurrency = 2;
    config.hints.group_wait_ms = 100;
    config.advantages.step_timeout_secs = 120;
    let (hints_metrics, advantages_metrics) =
        (common::MetricsEndpoint::free(), common::MetricsEndpoint::free());
    config.hints.metrics_addr = hints_metrics.addr();
    config.advantages.metrics_addr = advantages_metrics.addr();
    let (h, a) = (config.hints.clone(), config.advantages.clone());
    common::create_pipeline_topics(&config, 3).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let mut hints = start("hints", &file, Some(&server), "restart-hints");
    let mut advantages = start("advantages", &file, None, "restart-advantages");
    let logs = || format!("--- hints\n{}\n--- advantages\n{}", hints.log(), advantages.log());
    hints_metrics.wait_assigned("hints", logs).await;
    advantages_metrics.wait_assigned("advantages", logs).await;

    // Groups and steps of one half of the stream.
    let send_half = |groups: std::ops::Range<usize>, steps: std::ops::RangeInclusive<i64>| {
        let (config, h, a) = (&config, &h, &a);
        async move {
            let producer = hintstream::kafka::create_producer(config).unwrap();
            for g in groups {
                let instance = format!("i{g}");
                send(
                    &producer,
                    &h.input_topic,
                    &format!("run-f/1/{instance}"),
                    &trajectory(1, &instance),
                )
                .await;
            }
            for step in steps {
                send_step(&producer, &a.input_topic, step).await;
            }
            producer.flush(Duration::from_secs(30)).unwrap();
        }
    };
    // First halves, then the broker dies mid-stream.
    send_half(0..GROUPS / 2, 1..=STEPS / 2).await;
    let published = "hintstream_hints_hints_published_total";
    hints_metrics
        .wait_for(published, &[], |n| n >= 40.0, Duration::from_secs(60), logs)
        .await;
    let before = hints_metrics.value(published, &[]).await as usize;
    broker.kill9();
    let killed = Instant::now();
    // An outage of 3 s on purpose (the broker stays down), not a wait.
    tokio::time::sleep(Duration::from_secs(3)).await;
    broker.start_again();
    // Second halves, after the restart.
    send_half(GROUPS / 2..GROUPS, STEPS / 2 + 1..=STEPS).await;

    let deadline = Instant::now() + Duration::from_secs(180);
    let (mut groups, mut steps);
    loop {
        groups = hinted_groups(&config, &h.output_topic).await;
        steps = published_advantages(&config, &a.output_topic).await;
        if groups.len() == GROUPS && steps.len() == STEPS as usize {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the restart: {} of {GROUPS} groups hinted, {} of {STEPS} steps published\n{}",
            groups.len(),
            steps.len(),
            logs()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(
        before < GROUPS,
        "the broker died mid-stream ({before} hints before)"
    );
    eprintln!(
        "broker restart: {before} of {GROUPS} hints before the kill; all {GROUPS} groups and {STEPS} steps out {:.1} s after it",
        killed.elapsed().as_secs_f64()
    );
    for step in 1..=STEPS {
        assert_same_advantages(&steps[&step], &expected_advantages(step));
    }
    for dlq in [&h.dlq_topic, &a.dlq_topic] {
        assert!(
            common::read_topic(&config, dlq).await.is_empty(),
            "{dlq} is not empty"
        );
    }
    let log_text = logs();
    assert!(
        hints.running() && advantages.running(),
        "a worker died\n{log_text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_advantage_worker_killed_between_compute_and_publish_loses_nothing() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.advantages, "scored", "advantages");
    config.advantages.drain_timeout_secs = 2;
    config.topics.metrics = common::unique("metrics");
    config.advantages.step_timeout_secs = 120;
    // The restarted worker waits out the killed member's session.
    config.kafka.insert("session.timeout.ms", "6000");
    config.hints.drain_timeout_secs = 2;
    let endpoint = common::MetricsEndpoint::free();
    config.advantages.metrics_addr = endpoint.addr();
    let a = config.advantages.clone();
    common::create_advantages_topics(&config, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    // The first worker's producer holds every record for 20 s before
    // sending it: a computed step cannot be acknowledged in time, so the
    // kill below lands between compute and publish.
    let mut lingering = config.clone();
    lingering.kafka.insert("linger.ms", "20000");
    lingering.kafka.insert("message.timeout.ms", "60000");
    let lingering_dir = tempfile::tempdir().unwrap();
    let lingering_file = common::write_config(&lingering, lingering_dir.path());
    let mut first = start("advantages", &lingering_file, None, "adv-killed");
    endpoint.wait_assigned("advantages", || first.log()).await;
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    for step in 1..=3 {
        send_step(&producer, &a.input_topic, step).await;
    }
    endpoint
        .wait_for(
            "hintstream_advantages_compute_seconds_count",
            &[],
            |n| n >= 1.0,
            Duration::from_secs(60),
            || first.log(),
        )
        .await;
    let published = endpoint
        .value("hintstream_advantages_steps_published_total", &[])
        .await;
    first.kill9();
    assert_eq!(published, 0.0, "a step was acknowledged before the kill");

    let second = start("advantages", &file, None, "adv-restarted");
    let deadline = Instant::now() + Duration::from_secs(120);
    let steps = loop {
        let steps = published_advantages(&config, &a.output_topic).await;
        if steps.len() == 3 {
            break steps;
        }
        assert!(
            Instant::now() < deadline,
            "{} of 3 steps after the restart\n{}",
            steps.len(),
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for step in 1..=3 {
        assert_same_advantages(&steps[&step], &expected_advantages(step));
    }
    assert!(common::read_topic(&config, &a.dlq_topic).await.is_empty());
    let metrics = common::read_topic(&config, &config.topics.metrics).await;
    let metric_steps: BTreeSet<i64> = metrics
        .iter()
        .map(|m| {
            serde_json::from_slice::<serde_json::Value>(m.value_bytes().unwrap()).unwrap()["step"]
                .as_f64()
                .unwrap() as i64
        })
        .collect();
    assert_eq!(metric_steps, (1..=3).collect(), "every step's metrics");
}
