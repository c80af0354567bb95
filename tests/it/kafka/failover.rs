//! Leader failover on a three-node Apache Kafka cluster (replication factor
//! 3, `min.insync.replicas=2`, producers at `acks=all`): both stages run as
//! processes under a steady load of groups and steps; the leader of an input
//! partition is killed with SIGKILL, then restarted; then the leader of an
//! output partition. Nothing is lost (every group gets its hint, every step
//! its advantages), neither stage exits, and both `/readyz` answer 200 again.
//! The duplicates and the longest stall of each output are printed
//! (docs/BENCHMARKS.md "Failover"):
//!
//!     cargo test --test it kafka::failover -- --nocapture

use crate::common;
use crate::common::arrivals::{read_outputs, wait_progress, Arrivals};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hintstream::config::Config;
use hintstream::kafka::create_producer;
use hintstream::messages::keys::{group_key, step_key};
use rdkafka::producer::{FutureProducer, FutureRecord};

const PARTITIONS: i32 = 6;
/// Groups (one failed trajectory each) and steps (four rows and a
/// `step_end`) produced per tick.
const GROUPS_PER_TICK: usize = 4;
const TICK: Duration = Duration::from_millis(50);
const ROWS_PER_STEP: i64 = 4;
/// How long the outputs may stall before the test fails.
const PROGRESS_WITHIN: Duration = Duration::from_secs(90);

/// Produces groups and steps every tick until `stop` is set; returns how many
/// of each it produced once every send was acknowledged.
async fn produce_load(producer: FutureProducer, config: Config, stop: Arc<AtomicBool>) -> (usize, usize) {
    let (failed, scored) = (
        config.hints.input_topic.clone(),
        config.advantages.input_topic.clone(),
    );
    let mut acks = Vec::new();
    let mut send = |topic: &str, key: &str, payload: Vec<u8>| {
        let record = FutureRecord::to(topic).key(key).payload(&payload);
        acks.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| e)
                .expect("the producer queue is full"),
        );
    };
    let (mut groups, mut steps) = (0usize, 0i64);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..GROUPS_PER_TICK {
            let instance = format!("g{groups:06}");
            let payload = serde_json::to_vec(&serde_json::json!({
                "schema_version": 1, "run_id": "fo", "step": 1, "instance_id": instance, "trajectory_id": "t",
                "task_prompt": "Solve it.", "chat_history": [], "reward": 0.0
            }))
            .unwrap();
            send(&failed, &group_key("fo", 1, &instance), payload);
            groups += 1;
        }
        steps += 1;
        let key = step_key("fo", steps);
        for r in 0..ROWS_PER_STEP {
            let row = serde_json::json!({
                "type": "scored_rollout", "schema_version": 1, "run_id": "fo", "step": steps,
                "instance_id": format!("i{}", r % 2), "trajectory_id": format!("t{r}"), "reward": (r % 2) as f64,
                "is_hinted": false,
            });
            send(&scored, &key, serde_json::to_vec(&row).unwrap());
        }
        let end = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "fo", "step": steps, "count": ROWS_PER_STEP});
        send(&scored, &key, serde_json::to_vec(&end).unwrap());
        tokio::time::sleep(TICK).await;
    }
    // Every record must have been acknowledged (acks=all: by two replicas at least)
    // for the test's "nothing lost" to mean anything.
    for ack in futures::future::join_all(acks).await {
        let delivered = ack.expect("the producer was dropped");
        delivered
            .map_err(|(e, _)| e)
            .expect("a produced record was not acknowledged");
    }
    (groups, steps as usize)
}

fn logs(hints: &common::Process, advantages: &common::Process) -> String {
    format!("hints:\n{}\nadvantages:\n{}", hints.log(), advantages.log())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_stages_ride_out_leader_failover_without_losing_anything() {
    let mut cluster = common::KafkaCluster::start();
    let mut config = common::config_for(&cluster.bootstrap);
    config.topics.replication_factor = 3;
    config.topics.metrics = common::unique("fo-metrics");
    common::own_topics(&mut config.hints, "fo-failed", "fo-hints");
    common::own_topics(&mut config.advantages, "fo-scored", "fo-advantages");
    config.hints.group_wait_ms = 50;
    config.advantages.step_timeout_secs = 120;
    // Short sessions, so that a dead coordinator costs seconds.
    config.kafka.insert("session.timeout.ms", "6000");
    config.kafka.insert("heartbeat.interval.ms", "500");
    config.hints.drain_timeout_secs = 3;
    config.advantages.drain_timeout_secs = 3;
    common::create_pipeline_topics(&config, PARTITIONS).await;
    cluster.wait_for_topics(&common::pipeline_topics(&config)).await;
    let (hints_out, advantages_out) = (
        config.hints.output_topic.clone(),
        config.advantages.output_topic.clone(),
    );
    let (hints_metrics, advantages_metrics) =
        (common::MetricsEndpoint::free(), common::MetricsEndpoint::free());
    config.hints.metrics_addr = hints_metrics.addr();
    config.advantages.metrics_addr = advantages_metrics.addr();
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let mut hints = common::Process::spawn(common::stage_command("hints", &file), "failover-hints");
    let mut advantages =
        common::Process::spawn(common::stage_command("advantages", &file), "failover-advantages");
    hints_metrics
        .wait_assigned("hints", || logs(&hints, &advantages))
        .await;
    advantages_metrics
        .wait_assigned("advantages", || logs(&hints, &advantages))
        .await;

    let arrivals = Arc::new(Mutex::new(Arrivals::default()));
    let reader = read_outputs(
        &config,
        &[hints_out.clone(), advantages_out.clone()],
        arrivals.clone(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(produce_load(
        create_producer(&config).unwrap(),
        config.clone(),
        stop.clone(),
    ));
    let load_started = Instant::now();
    wait_progress(&arrivals, &hints_out, 0, 40, PROGRESS_WITHIN, "the start").await;
    wait_progress(&arrivals, &advantages_out, 0, 10, PROGRESS_WITHIN, "the start").await;

    // The leader of an input partition, then of an output partition: each
    // killed mid-load, the stages moved on without it, then restarted.
    let targets = [
        ("input", config.hints.input_topic.clone()),
        ("output", advantages_out.clone()),
    ];
    for (what, topic) in &targets {
        let leader = cluster
            .leader(topic, 0)
            .unwrap_or_else(|| panic!("{topic}[0] has no leader"));
        let before = {
            let a = arrivals.lock().unwrap();
            (a.count(&hints_out), a.count(&advantages_out))
        };
        eprintln!("failover: killing node {leader}, the leader of {what} partition {topic}[0]");
        cluster.kill9(leader);
        let after = format!("the kill of node {leader} ({what} leader)");
        wait_progress(&arrivals, &hints_out, before.0, 40, PROGRESS_WITHIN, &after).await;
        wait_progress(&arrivals, &advantages_out, before.1, 10, PROGRESS_WITHIN, &after).await;
        cluster.start_again(leader);
        assert!(
            hints.running() && advantages.running(),
            "a stage exited\n{}",
            logs(&hints, &advantages)
        );
    }
    stop.store(true, Ordering::Relaxed);
    let load_stopped = Instant::now();
    let (groups, steps) = load.await.unwrap();

    // Nothing lost: every group hinted, every step published.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (g, s) = {
            let a = arrivals.lock().unwrap();
            (a.distinct(&hints_out), a.distinct(&advantages_out))
        };
        if g >= groups && s >= steps {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{g} of {groups} groups hinted, {s} of {steps} steps published\n{}",
            logs(&hints, &advantages)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        hints.running() && advantages.running(),
        "a stage exited\n{}",
        logs(&hints, &advantages)
    );
    for (name, endpoint) in [("hints", hints_metrics), ("advantages", advantages_metrics)] {
        let deadline = Instant::now() + Duration::from_secs(60);
        while endpoint.get("/readyz").await.map(|(s, _)| s) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "{name}: /readyz did not recover: {:?}\n{}",
                endpoint.get("/readyz").await,
                logs(&hints, &advantages)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    reader.stop().await;
    let a = arrivals.lock().unwrap();
    let window = (load_started, load_stopped);
    for (name, topic, produced) in [
        ("hints", &hints_out, groups),
        ("advantages", &advantages_out, steps),
    ] {
        eprintln!(
            "failover: {name}: {produced} produced, {} records out, {} duplicates, longest stall under load {:.1?}",
            a.count(topic),
            a.count(topic) - a.distinct(topic),
            a.longest_stall(topic, window)
        );
        assert_eq!(a.distinct(topic), produced, "{name}: every input has its output");
    }
}
