//! Chaos, short version for CI: three `hintstream hints` workers on a
//! 12-partition topic on Apache Kafka, a loopback LLM with latency, and a random
//! worker killed with SIGKILL each time the group has made progress since the
//! last kill, restarted each time. At the
//! end every group has a hint, duplicates stay within what a kill and its
//! rebalances can redeliver (in-flight bounds plus one auto-commit interval),
//! and duplicates of a group share their hint_id.
//!
//! Longer runs (not HINTSTREAM_-prefixed: the workers would read them as
//! settings and reject them as unknown): CHAOS_GROUPS=20000 CHAOS_KILLS=10
//! cargo test --release --test it kafka::chaos -- --nocapture. CHAOS_DRAIN_SECS
//! (default 3) sets drain_timeout_secs; 0 turns drain on revoke off, to
//! compare.

use crate::common;
use crate::common::llm_server;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hintstream::kafka::create_producer;
use hintstream::messages::{decode, DecodeLimits, Hint};
use llm_server::{Behavior, LlmServer};
use rand::Rng;
use rdkafka::producer::Producer;

/// Messages a worker takes before finishing them: bounds redelivery per kill.
const MAX_IN_FLIGHT: usize = 64;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn spawn(config_file: &std::path::Path, server: &LlmServer) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hintstream"))
        .args(["hints", "--config"])
        .arg(config_file)
        .env("ANTHROPIC_API_KEY", "sk-k")
        .env("ANTHROPIC_BASE_URL", server.base_url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_group_is_hinted_while_workers_are_killed() {
    let groups = env_or("CHAOS_GROUPS", 1_500);
    let kills = env_or("CHAOS_KILLS", 5);
    let drain_secs = env_or("CHAOS_DRAIN_SECS", 3);
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    let (input, output) = (common::unique("chaos-in"), common::unique("chaos-hints"));
    common::create_topics(&config, &[&input, &output, &format!("{input}.dlq")], 12).await;
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Check the output format first.".into(),
        Duration::from_millis(100),
    ));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chaos.toml");
    let mut f = std::fs::File::create(&file).unwrap();
    writeln!(
        f,
        "bootstrap_servers = \"{}\"\n[kafka]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n\
         [hints]\ngroup_id = \"{}\"\ninput_topic = \"{input}\"\noutput_topic = \"{output}\"\ndlq_topic = \"{input}.dlq\"\n\
         metrics_addr = \"127.0.0.1:0\"\nmax_in_flight = {MAX_IN_FLIGHT}\ndrain_timeout_secs = {drain_secs}\ngroup_wait_ms = 100\n\
         [advantages]\ndrain_timeout_secs = 3\n[llm]\nconcurrency = 8\ntimeout_secs = 10.0\n# No request cap: the test measures delivery, not spend.\nrequests_per_minute = 0",
        config.bootstrap_servers,
        common::unique("chaos-group")
    )
    .unwrap();
    drop(f);
    let mut workers: Vec<Child> = (0..3).map(|_| spawn(&file, &server)).collect();

    config.kafka.insert("linger.ms", "20");
    let producer = create_producer(&config).unwrap();
    // Produced concurrently, so that the workers meet a full topic and the
    // kills land in the middle of the work, not after a slow producer.
    let payloads: Vec<(String, Vec<u8>)> = (0..groups)
        .map(|i| {
            let t = serde_json::json!({
                "schema_version": 1, "run_id": "chaos", "step": 1, "instance_id": format!("g{i:05}"), "trajectory_id": "t",
                "task_prompt": "Solve it.", "chat_history": [], "reward": 0.0
            });
            (format!("chaos/1/g{i:05}"), serde_json::to_vec(&t).unwrap())
        })
        .collect();
    let sends = payloads.iter().map(|(key, payload)| {
        producer.send(
            rdkafka::producer::FutureRecord::to(&input)
                .key(key)
                .payload(payload),
            Duration::from_secs(30),
        )
    });
    for result in futures::future::join_all(sends).await {
        result.map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    let started = Instant::now();
    let count = |config: &hintstream::config::Config| {
        let (config, output) = (config.clone(), output.clone());
        async move { common::read_topic(&config, &output).await.len() }
    };
    for k in 0..kills {
        // Kill mid-stream: only once the group has made progress since the
        // last kill (every kill triggers a rebalance that pauses everyone).
        let target = (k + 1) * groups / (kills + 2);
        let wait_until = Instant::now() + Duration::from_secs(120);
        while count(&config).await < target {
            assert!(
                Instant::now() < wait_until,
                "no progress towards {target} hints before kill {k}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let victim = rand::rng().random_range(0..workers.len());
        let _ = workers[victim].kill();
        let _ = workers[victim].wait();
        workers[victim] = spawn(&file, &server);
    }

    let deadline = Instant::now() + Duration::from_secs(300);
    let hints = loop {
        let hints: Vec<Hint> = common::read_topic(&config, &output)
            .await
            .iter()
            .map(|m| decode(m.value_bytes().unwrap(), DecodeLimits::default()).unwrap())
            .collect();
        let distinct: HashSet<&str> = hints.iter().map(|h| h.instance_id.as_str()).collect();
        if distinct.len() >= groups {
            break hints;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {groups} groups hinted",
            distinct.len()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    for w in workers.iter_mut() {
        let _ = w.kill();
        let _ = w.wait();
    }
    let mut ids: HashMap<&str, HashSet<&str>> = HashMap::new();
    for h in &hints {
        ids.entry(h.instance_id.as_str())
            .or_default()
            .insert(h.hint_id.as_str());
    }
    let duplicates = hints.len() - groups;
    eprintln!(
        "{groups} groups, {kills} kills: {} hints, {duplicates} duplicates, {:.1?} after the first kill",
        hints.len(),
        started.elapsed()
    );
    assert_eq!(ids.len(), groups, "every group hinted");
    assert!(
        ids.values().all(|s| s.len() == 1),
        "duplicates share their hint_id"
    );
    // A kill redelivers what the killed worker had in flight plus what it
    // finished since librdkafka's last auto-commit (1 s; at most ~80 hints a
    // second at concurrency 8 and 100 ms). Each kill also brings two
    // rebalances (the dead member leaves, its replacement joins); work in
    // flight on a revoked partition gets drain_timeout_secs to finish, and
    // what does not is done again by its next owner: up to the in-flight
    // bound of each of the three workers, twice.
    let bound = kills * (MAX_IN_FLIGHT + 80 + 2 * 3 * MAX_IN_FLIGHT);
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates for {kills} kills (bound {bound})"
    );
}
