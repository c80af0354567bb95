//! Stage 1 under both consumer group protocols on Apache Kafka: the classic
//! one (members assign among themselves, `cooperative-sticky`) and KIP-848's
//! `consumer` (the broker assigns; `session.timeout.ms` is the broker's).
//! For each: a second worker joins a running one and takes partitions (the
//! time it took is printed), the two together hold every partition and are
//! ready (`/readyz`), and
//! work that arrives while 1 or 3 workers join is all hinted (the time and
//! the 3-against-1 ratio printed; docs/BENCHMARKS.md "Group protocols"):
//!
//!     cargo test --test it kafka::group_protocol -- --nocapture

use crate::common;
use crate::common::arrivals::{read_outputs, wait_distinct, Arrivals};
use crate::common::llm_server::{Behavior, LlmServer};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hintstream::config::{Config, KafkaValue};
use hintstream::kafka::create_producer;
use hintstream::messages::keys::group_key;
use rdkafka::producer::{FutureRecord, Producer};

const PARTITIONS: i32 = 6;
const GROUPS: usize = 600;
/// The loopback model's latency per hint.
const LLM_LATENCY: Duration = Duration::from_millis(20);

/// A stage-1 config for `protocol` on fresh topics and a fresh group.
async fn config_for(protocol: &str, tag: &str) -> Config {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(
        &mut config.hints,
        &format!("gp-{tag}-in"),
        &format!("gp-{tag}-hints"),
    );
    config.hints.group_wait_ms = 20;
    config.hints.drain_timeout_secs = 3;
    config.advantages.drain_timeout_secs = 3;
    config.llm.concurrency = 4;
    config.llm.requests_per_minute = 0;
    if protocol == "consumer" {
        config
            .kafka
            .consumer
            .insert("group.protocol".into(), "consumer".into());
    } else {
        config
            .kafka
            .consumer
            .insert("session.timeout.ms".into(), KafkaValue::Int(6000));
        config
            .kafka
            .consumer
            .insert("heartbeat.interval.ms".into(), KafkaValue::Int(500));
    }
    common::create_hints_topics(&config, PARTITIONS).await;
    config
}

/// A `hintstream hints` worker on `config`, its metrics on a port of its own.
fn worker(
    config: &Config,
    dir: &std::path::Path,
    server: &LlmServer,
    name: &str,
) -> (common::Process, common::MetricsEndpoint) {
    let endpoint = common::MetricsEndpoint::free();
    let mut own = config.clone();
    own.hints.metrics_addr = endpoint.addr();
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).unwrap();
    let file = common::write_config(&own, &sub);
    let mut command = common::stage_command("hints", &file);
    command
        .env("ANTHROPIC_API_KEY", "sk-k")
        .env("ANTHROPIC_BASE_URL", server.base_url());
    (common::Process::spawn(command, name), endpoint)
}

async fn produce_groups(config: &Config) {
    let producer = create_producer(config).unwrap();
    let acks: Vec<_> = (0..GROUPS)
        .map(|i| {
            let instance = format!("g{i:05}");
            let payload = serde_json::to_vec(&serde_json::json!({
                "schema_version": 1, "run_id": "gp", "step": 1, "instance_id": instance, "trajectory_id": "t",
                "task_prompt": "Solve it.", "chat_history": [], "reward": 0.0
            }))
            .unwrap();
            let key = group_key("gp", 1, &instance);
            producer
                .send_result(
                    FutureRecord::to(&config.hints.input_topic)
                        .key(&key)
                        .payload(&payload),
                )
                .map_err(|(e, _)| e)
                .unwrap()
        })
        .collect();
    for ack in futures::future::join_all(acks).await {
        ack.unwrap().map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// Seconds until a worker joining a running one holds partitions; checks
/// that the two then hold all of them between them.
async fn join_time(protocol: &str, server: &LlmServer) -> Duration {
    let config = config_for(protocol, &format!("{protocol}-join")).await;
    let dir = tempfile::tempdir().unwrap();
    let (first, first_metrics) = worker(&config, dir.path(), server, &format!("gp-{protocol}-first"));
    first_metrics.wait_assigned("hints", || first.log()).await;
    let started = Instant::now();
    let (second, second_metrics) = worker(&config, dir.path(), server, &format!("gp-{protocol}-second"));
    second_metrics.wait_assigned("hints", || second.log()).await;
    let joined = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let name = "hintstream_hints_assigned_partitions";
        let (a, b) = (
            first_metrics.value(name, &[]).await,
            second_metrics.value(name, &[]).await,
        );
        if a + b == f64::from(PARTITIONS) && a > 0.0 && b > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{protocol}: the two workers hold {a} + {b} of {PARTITIONS} partitions\nfirst:\n{}\nsecond:\n{}",
            first.log(),
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Readiness reads the group's state from librdkafka's statistics, which
    // differ between the protocols: both workers must be ready.
    for (endpoint, process) in [(first_metrics, &first), (second_metrics, &second)] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while endpoint.get("/readyz").await.map(|(s, _)| s) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "{protocol}: /readyz {:?}\n{}",
                endpoint.get("/readyz").await,
                process.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    joined
}

/// How long `workers` workers, started as the work arrives, take to hint
/// every group.
async fn time_to_hint_all(protocol: &str, workers: usize, server: &LlmServer) -> Duration {
    let config = config_for(protocol, &format!("{protocol}-{workers}w")).await;
    let dir = tempfile::tempdir().unwrap();
    let arrivals = Arc::new(Mutex::new(Arrivals::default()));
    let reader = read_outputs(
        &config,
        std::slice::from_ref(&config.hints.output_topic),
        arrivals.clone(),
    );
    let started = Instant::now();
    let mut running: Vec<_> = (0..workers)
        .map(|w| {
            worker(
                &config,
                dir.path(),
                server,
                &format!("gp-{protocol}-{workers}w-{w}"),
            )
        })
        .collect();
    produce_groups(&config).await;
    let done = wait_distinct(
        &arrivals,
        &config.hints.output_topic,
        GROUPS,
        Duration::from_secs(180),
    )
    .await;
    reader.stop().await;
    for (process, _) in &mut running {
        assert!(process.running(), "a worker exited:\n{}", process.log());
    }
    done - started
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_group_protocols_share_partitions_and_hint_everything() {
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Check the output format first.".into(),
        LLM_LATENCY,
    ));
    let mut rows = Vec::new();
    for protocol in ["classic", "consumer"] {
        let joined = join_time(protocol, &server).await;
        let one = time_to_hint_all(protocol, 1, &server).await;
        let three = time_to_hint_all(protocol, 3, &server).await;
        rows.push(format!(
            "group_protocol: {protocol:8} join {:>6.2} s | {GROUPS} groups: 1 worker {:>6.2} s, 3 workers {:>6.2} s, ratio {:.2}",
            joined.as_secs_f64(),
            one.as_secs_f64(),
            three.as_secs_f64(),
            one.as_secs_f64() / three.as_secs_f64()
        ));
    }
    for row in rows {
        eprintln!("{row}");
    }
}
