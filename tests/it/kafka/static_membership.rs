//! Static group membership (`kafka.static_membership = true`) on Apache
//! Kafka: two `hintstream hints` workers (child processes, worker ids
//! `hints-0` and `hints-1`) share six partitions while failed groups arrive
//! at a steady pace (50 a second), one partition after another; `hints-1` is stopped with
//! SIGTERM (as Kubernetes stops a pod) and started again under the same id.
//!
//! As a static member it takes its partitions back without a rebalance: the
//! other worker gets no rebalance callback and keeps its partitions, and the
//! restarted one holds as many as before. Without static membership the same
//! restart moves its partitions to the other worker and back (two
//! rebalances on it). Both ways, every group is hinted. Printed for each
//! mode and group protocol (docs/BENCHMARKS.md, "Static membership"): the
//! longest time any partition went without a hint while the worker
//! restarted (its partitions' gap), the duplicates, and the rebalance
//! callbacks on the other worker:
//!
//!     cargo test --test it kafka::static_membership -- --nocapture
//!
//! Without a worker id, a stage under static membership exits 2 saying what
//! to set.

use crate::common;
use crate::common::arrivals::{read_outputs, wait_distinct, Arrivals};
use crate::common::llm_server::{Behavior, LlmServer};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hintstream::config::{Config, KafkaValue};
use hintstream::kafka::create_producer;
use hintstream::messages::keys::group_key;
use rdkafka::producer::{FutureRecord, Producer};

const PARTITIONS: i32 = 6;
/// One failed group every this long, on partitions 0, 1, 2, ... in turn: each
/// partition gets one every `PARTITIONS` times this, which bounds how finely
/// a partition's gap is seen.
const PACE: Duration = Duration::from_millis(20);
/// How long the workers may take to hint what is left once the input ends
/// (a backlog builds up while a worker restarts on a loaded machine).
const FINISH_WITHIN: Duration = Duration::from_secs(180);
/// The loopback model's latency per hint.
const LLM_LATENCY: Duration = Duration::from_millis(20);
/// The classic protocol's session timeout here (and the test broker's
/// group.consumer.session.timeout.ms): a restart must be back within it.
const SESSION_TIMEOUT_MS: i64 = 6000;

/// What one restart of `hints-1` did.
struct Restart {
    /// Rebalance callbacks on `hints-0` while `hints-1` restarted.
    rebalances_on_other: f64,
    /// `hints-1`'s partitions before the stop and after the restart.
    partitions: (f64, f64),
    /// SIGTERM to the restarted worker holding partitions again.
    restart: Duration,
    /// The longest time one partition went without a hint meanwhile.
    gap: Duration,
    produced: usize,
    duplicates: usize,
}

async fn config_for(protocol: &str, static_membership: bool) -> Config {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    let tag = common::unique(&format!(
        "sm-{protocol}-{}",
        if static_membership { "static" } else { "dynamic" }
    ));
    common::own_topics(&mut config.hints, &format!("{tag}-in"), &format!("{tag}-hints"));
    config.hints.group_id = format!("{tag}-group");
    config.hints.drain_timeout_secs = 3;
    config.advantages.drain_timeout_secs = 3;
    config.llm.concurrency = 8;
    config.llm.requests_per_minute = 0;
    config.kafka.static_membership = static_membership;
    if protocol == "consumer" {
        config
            .kafka
            .consumer
            .insert("group.protocol".into(), "consumer".into());
    } else {
        let consumer = &mut config.kafka.consumer;
        consumer.insert("session.timeout.ms".into(), KafkaValue::Int(SESSION_TIMEOUT_MS));
        consumer.insert("heartbeat.interval.ms".into(), KafkaValue::Int(500));
    }
    common::create_hints_topics(&config, PARTITIONS).await;
    config
}

/// `hintstream hints` as worker `id`, its metrics on a port of its own.
fn worker(
    config: &Config,
    dir: &std::path::Path,
    server: &LlmServer,
    id: &str,
) -> (common::Process, common::MetricsEndpoint) {
    let endpoint = common::MetricsEndpoint::free();
    let mut own = config.clone();
    own.hints.metrics_addr = endpoint.addr();
    let sub = dir.join(common::unique(id));
    std::fs::create_dir_all(&sub).unwrap();
    let file = common::write_config(&own, &sub);
    let mut command = common::stage_command("hints", &file);
    command
        .env("HINTSTREAM_WORKER_ID", id)
        .env("ANTHROPIC_API_KEY", "sk-k")
        .env("ANTHROPIC_BASE_URL", server.base_url());
    (common::Process::spawn(command, &format!("sm-{id}")), endpoint)
}

/// Produces one failed group every [`PACE`], round-robin over the
/// partitions, until `stop`; the partition of each group's key.
fn produce_steadily(config: &Config, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<HashMap<String, i32>> {
    let producer = create_producer(config).unwrap();
    let topic = config.hints.input_topic.clone();
    tokio::spawn(async move {
        let mut partition_of = HashMap::new();
        let mut acks = Vec::new();
        let mut next = tokio::time::interval(PACE);
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            next.tick().await;
            let instance = format!("g{i:06}");
            let key = group_key("sm", 1, &instance);
            let payload = serde_json::to_vec(&serde_json::json!({
                "schema_version": 1, "run_id": "sm", "step": 1, "instance_id": instance,
                "trajectory_id": "t", "task_prompt": "Solve it.", "chat_history": [], "reward": 0.0
            }))
            .unwrap();
            let partition = (i % PARTITIONS as usize) as i32;
            let ack = producer
                .send_result(
                    FutureRecord::to(&topic)
                        .key(&key)
                        .payload(&payload)
                        .partition(partition),
                )
                .map_err(|(e, _)| e)
                .unwrap();
            acks.push(ack);
            partition_of.insert(key, partition);
            i += 1;
        }
        for ack in futures::future::join_all(acks).await {
            ack.unwrap().map_err(|(e, _)| e).unwrap();
        }
        producer.flush(Duration::from_secs(10)).unwrap();
        partition_of
    })
}

/// The longest time between two hints of one partition within `window`.
fn longest_partition_gap(
    arrivals: &Arrivals,
    topic: &str,
    partition_of: &HashMap<String, i32>,
    window: (Instant, Instant),
) -> Duration {
    let mut by_partition: HashMap<i32, Vec<Instant>> = HashMap::new();
    for (key, at) in arrivals.by_topic.get(topic).into_iter().flatten() {
        if let Some(p) = partition_of.get(key) {
            by_partition.entry(*p).or_default().push(*at);
        }
    }
    by_partition
        .values_mut()
        .map(|times| {
            times.sort();
            // The last hint before the window and the first after it count:
            // a gap that spans the window's edge is whole.
            let first = times.iter().rposition(|t| *t <= window.0).unwrap_or(0);
            let last = times
                .iter()
                .position(|t| *t >= window.1)
                .unwrap_or(times.len() - 1);
            times[first..=last]
                .windows(2)
                .map(|w| w[1] - w[0])
                .max()
                .unwrap_or_default()
        })
        .max()
        .unwrap_or_default()
}

async fn rebalances(endpoint: &common::MetricsEndpoint) -> f64 {
    endpoint.value("hintstream_hints_rebalances_total", &[]).await
}

async fn assigned(endpoint: &common::MetricsEndpoint) -> f64 {
    endpoint.value("hintstream_hints_assigned_partitions", &[]).await
}

/// Waits until the two workers hold all partitions between them, each some.
async fn wait_shared(a: &common::MetricsEndpoint, b: &common::MetricsEndpoint, context: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (x, y) = (assigned(a).await, assigned(b).await);
        if x > 0.0 && y > 0.0 && x + y == f64::from(PARTITIONS) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the workers hold {x} + {y} of {PARTITIONS} partitions\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs two workers under `protocol`, restarts `hints-1` once, and measures.
async fn restart_once(protocol: &str, static_membership: bool, server: &LlmServer) -> Restart {
    let config = config_for(protocol, static_membership).await;
    let dir = tempfile::tempdir().unwrap();
    let arrivals = Arc::new(Mutex::new(Arrivals::default()));
    let output = config.hints.output_topic.clone();
    let reader = read_outputs(&config, std::slice::from_ref(&output), arrivals.clone());
    let (first, first_metrics) = worker(&config, dir.path(), server, "hints-0");
    first_metrics.wait_assigned("hints", || first.log()).await;
    let (second, second_metrics) = worker(&config, dir.path(), server, "hints-1");
    let both = || format!("hints-0:\n{}\nhints-1:\n{}", first.log(), second.log());
    wait_shared(&first_metrics, &second_metrics, both).await;

    let stop = Arc::new(AtomicBool::new(false));
    let producing = produce_steadily(&config, stop.clone());
    // Steady work on every partition before the restart.
    common::arrivals::wait_progress(&arrivals, &output, 0, 150, Duration::from_secs(60), "start").await;
    let before = (rebalances(&first_metrics).await, assigned(&second_metrics).await);
    let stopped_at = Instant::now();
    second.terminate();
    let mut second = second;
    let status = second.wait_exit(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "hints-1 did not stop cleanly on SIGTERM: {status:?}\n{}",
        second.log()
    );
    drop(second);
    if !static_membership {
        // The control: a dynamic member's leave hands its partitions to the
        // other worker. Under KIP-848 the coordinator may instead hand them
        // straight to a member that rejoins within the other worker's next
        // heartbeat, so the control waits for that hand-over first.
        first_metrics
            .wait_for(
                "hintstream_hints_rebalances_total",
                &[],
                |v| v > before.0,
                Duration::from_secs(60),
                || first.log(),
            )
            .await;
    }
    let (again, again_metrics) = worker(&config, dir.path(), server, "hints-1");
    again_metrics.wait_assigned("hints", || again.log()).await;
    let back = stopped_at.elapsed();
    wait_shared(&first_metrics, &again_metrics, || {
        format!("hints-0:\n{}\nhints-1:\n{}", first.log(), again.log())
    })
    .await;
    let settled = Instant::now();
    // A little more work on the settled group, then the end of the input.
    let seen = arrivals.lock().unwrap().count(&output);
    common::arrivals::wait_progress(
        &arrivals,
        &output,
        seen,
        300,
        Duration::from_secs(60),
        "the restart",
    )
    .await;
    let after = (rebalances(&first_metrics).await, assigned(&again_metrics).await);
    stop.store(true, Ordering::Relaxed);
    let partition_of = producing.await.unwrap();
    wait_distinct(&arrivals, &output, partition_of.len(), FINISH_WITHIN).await;
    reader.stop().await;
    let arrivals = arrivals.lock().unwrap();
    Restart {
        rebalances_on_other: after.0 - before.0,
        partitions: (before.1, after.1),
        restart: back,
        gap: longest_partition_gap(&arrivals, &output, &partition_of, (stopped_at, settled)),
        produced: partition_of.len(),
        duplicates: arrivals.count(&output) - arrivals.distinct(&output),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_static_member_takes_its_partitions_back_without_a_rebalance() {
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Check the output format first.".into(),
        LLM_LATENCY,
    ));
    let mut rows = Vec::new();
    for protocol in ["classic", "consumer"] {
        for static_membership in [true, false] {
            let r = restart_once(protocol, static_membership, &server).await;
            let mode = if static_membership { "static" } else { "dynamic" };
            rows.push(format!(
                "static_membership: {protocol:8} {mode:7} | restart {:>5.2} s | gap {:>5.2} s | \
                 rebalances on the other worker {:>2} | partitions {} -> {} | duplicates {} of {}",
                r.restart.as_secs_f64(),
                r.gap.as_secs_f64(),
                r.rebalances_on_other,
                r.partitions.0,
                r.partitions.1,
                r.duplicates,
                r.produced,
            ));
            eprintln!("{}", rows.last().unwrap());
            if static_membership {
                assert_eq!(
                    r.rebalances_on_other, 0.0,
                    "{protocol}: the other worker went through a rebalance while a static member restarted"
                );
                assert_eq!(
                    r.partitions.0, r.partitions.1,
                    "{protocol}: the static member came back with other partitions"
                );
            } else {
                // The control: the same restart, without static membership,
                // moves the partitions away and back.
                assert!(
                    r.rebalances_on_other >= 2.0,
                    "{protocol}: a dynamic member's restart caused {} rebalance callbacks on the other worker",
                    r.rebalances_on_other
                );
            }
        }
    }
    for row in rows {
        eprintln!("{row}");
    }
}

#[test]
fn static_membership_without_a_worker_id_exits_2_saying_what_to_set() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    config.kafka.static_membership = true;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let out = common::stage_command("hints", &file)
        .env_remove("HINTSTREAM_WORKER_ID")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("static_membership") && stderr.contains("HINTSTREAM_WORKER_ID"),
        "{stderr}"
    );
    // And group.instance.id cannot be set around it.
    let mut direct = common::config_for(&broker.bootstrap);
    direct
        .kafka
        .consumer
        .insert("group.instance.id".into(), "hints-0".into());
    let file = common::write_config(&direct, dir.path());
    let out = common::stage_command("hints", &file).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("group.instance.id"), "{stderr}");
}
