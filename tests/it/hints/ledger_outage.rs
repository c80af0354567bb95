//! The spend ledger fails closed: two stage-1 workers under one $0.50/h
//! budget on a three-node cluster whose spend topic has one replica, on
//! node 3 (the stage's other topics have three). Node 3 is stopped: the
//! spend topic has no leader, no worker can read or write the ledger, and
//! after `llm.ledger_stale_secs` each enters share mode (the gauge says 1)
//! and spends only its share of the budget (half: two of the four input
//! partitions). Fed more groups than the budget pays for, the group spends
//! at most the budget plus its calls in flight, where before each worker,
//! seeing only its own spend, took the whole budget. A worker started
//! during the outage starts in share mode. Node 3 back, all leave it.

use crate::common;
use crate::common::llm_server;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use hintstream::config::{Config, ModelPrice};
use hintstream::hints::HintStage;
use hintstream::llm::limits::FRAMING_TOKENS;
use hintstream::messages::{group_key, Hint, HintCategory};
use llm_server::{Behavior, LlmServer};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::Producer;

const KEY: &str = "sk-ledger-outage";
const BUDGET_USD: f64 = 0.50;
const CONCURRENCY: usize = 2;
const PARTITIONS: i32 = 4;
const GROUPS: usize = 800;
/// Dollars per million tokens: a call's worst case is about $0.001.
const INPUT_PER_MTOK: f64 = 0.4;
const OUTPUT_PER_MTOK: f64 = 2.0;
const SHARE_MODE: &str = "hintstream_hints_llm_ledger_share_mode";

fn trajectory(instance: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": "lo", "step": 1, "instance_id": instance,
        "trajectory_id": "t", "task_prompt": format!("Solve {instance}"), "reward": 0.0,
        "chat_history": [{"role": "user", "content": "go"}],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['check_output failed']\n<<< ERROR_ACCUMULATOR <<<",
    }))
    .unwrap()
}

/// The spend topic with its one replica on node 3, stamped by the broker,
/// writable with that one replica in sync.
async fn spend_topic_on_node_3(config: &Config) {
    let admin: AdminClient<DefaultClientContext> = hintstream::kafka::base_config(config).create().unwrap();
    let replicas: &[&[i32]] = &[&[3]];
    let topic = NewTopic::new(&config.topics.spend, 1, TopicReplication::Variable(replicas))
        .set("min.insync.replicas", "1")
        .set("message.timestamp.type", "LogAppendTime");
    let results = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    for r in results {
        r.expect("create the spend topic");
    }
}

/// A worker of another consumer group on the same spend topic, with
/// topics of its own (made while every node runs).
async fn late_config(config: &Config) -> Config {
    let mut late = config.clone();
    common::own_topics(&mut late.hints, "lo-late-in", "lo-late-hints");
    late.hints.group_id = common::unique("lo-late");
    common::create_hints_topics(&late, 1).await;
    late
}

async fn config_on(cluster: &common::KafkaCluster) -> Config {
    let mut config = common::config_for(&cluster.bootstrap);
    config.topics.replication_factor = 3;
    common::own_topics(&mut config.hints, "lo-in", "lo-hints");
    config.topics.spend = common::unique("lo-spend");
    config.hints.group_wait_ms = 50;
    // Short sessions, so that a dead coordinator costs seconds.
    config.kafka.insert("session.timeout.ms", "6000");
    config.kafka.insert("heartbeat.interval.ms", "500");
    config.hints.drain_timeout_secs = 3;
    config.llm.concurrency = CONCURRENCY;
    config.llm.max_retries = 0;
    config.llm.timeout_secs = 30.0;
    config.llm.budget_usd_per_hour = BUDGET_USD;
    config.llm.ledger_stale_secs = 2;
    config.llm.prices.insert(
        hintstream::llm::synth::DEFAULT_ANTHROPIC_MODEL.into(),
        ModelPrice::new(INPUT_PER_MTOK, OUTPUT_PER_MTOK),
    );
    let h = config.hints.clone();
    common::create_topics(&config, &[&h.input_topic], PARTITIONS).await;
    common::create_topics(&config, &[&h.output_topic, &h.dlq_topic], 1).await;
    spend_topic_on_node_3(&config).await;
    let names = [
        &h.input_topic,
        &h.output_topic,
        &h.dlq_topic,
        &config.topics.spend,
    ];
    cluster.wait_for_topics(&names.map(|n| n.to_string())).await;
    config
}

/// Waits until every endpoint's `name` satisfies `ok`.
async fn wait_all(endpoints: &[common::MetricsEndpoint], name: &str, ok: fn(f64) -> bool, within: Duration) {
    for e in endpoints {
        e.wait_for(name, &[], ok, within, || format!("{name} on every worker"))
            .await;
    }
}

/// Waits until the workers published `n` hints in all (their metrics: a
/// reader of the hints topic would need node 3).
async fn wait_published(endpoints: &[common::MetricsEndpoint], n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let mut published = 0.0;
        for e in endpoints {
            published += e.value("hintstream_hints_hints_published_total", &[]).await;
        }
        if published >= n as f64 {
            return;
        }
        assert!(Instant::now() < deadline, "{published} of {n} hints published");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_spend_topics_leader_stopped_two_workers_spend_their_shares_of_the_budget() {
    let started = Instant::now();
    let mut cluster = common::KafkaCluster::start();
    let config = config_on(&cluster).await;
    let late = late_config(&config).await;
    cluster
        .wait_for_topics(&[late.hints.input_topic.clone(), late.hints.output_topic.clone()])
        .await;
    let server = LlmServer::start(Some(KEY)).await;
    server.default(Behavior::Billed(
        "Check the numbering.".into(),
        Duration::from_millis(100),
    ));
    let env = llm_server::anthropic_env(&server, KEY);
    let (mut running, mut endpoints) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let stage = HintStage::build(config.clone(), &env).await.unwrap();
        endpoints.push(common::MetricsEndpoint(stage.metrics_addr));
        running.push(common::spawn_stage(|stop| stage.run(stop)));
    }
    // Each worker holds two of the four partitions: a half share each.
    wait_all(
        &endpoints,
        "hintstream_hints_llm_rate_share",
        |v| v == 0.5,
        Duration::from_secs(90),
    )
    .await;
    wait_all(&endpoints, SHARE_MODE, |v| v == 0.0, Duration::from_secs(10)).await;

    cluster.kill9(3);
    let stopped = Instant::now();
    wait_all(&endpoints, SHARE_MODE, |v| v == 1.0, Duration::from_secs(60)).await;
    eprintln!(
        "both workers in share mode {:.1?} after node 3 stopped",
        stopped.elapsed()
    );
    // A worker started now cannot read the ledger's last hour: it starts,
    // in share mode, rather than as if nobody had spent.
    let building = Instant::now();
    let stage = HintStage::build(late, &env).await.unwrap();
    let late_endpoint = [common::MetricsEndpoint(stage.metrics_addr)];
    let late_running = common::spawn_stage(|stop| stage.run(stop));
    wait_all(&late_endpoint, SHARE_MODE, |v| v == 1.0, Duration::from_secs(5)).await;
    eprintln!(
        "a worker started during the outage runs in share mode after {:.1?}",
        building.elapsed()
    );
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    for i in 0..GROUPS {
        let instance = format!("g{i:04}");
        common::send(
            &producer,
            &config.hints.input_topic,
            &group_key("lo", 1, &instance),
            &trajectory(&instance),
        )
        .await;
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    wait_published(&endpoints, GROUPS, Duration::from_secs(180)).await;
    let outage = stopped.elapsed();

    cluster.start_again(3);
    wait_all(&endpoints, SHARE_MODE, |v| v == 0.0, Duration::from_secs(90)).await;
    wait_all(&late_endpoint, SHARE_MODE, |v| v == 0.0, Duration::from_secs(60)).await;
    late_running.stop().await;
    eprintln!(
        "both workers out of share mode {:.1?} after node 3 stopped",
        stopped.elapsed()
    );
    for r in running {
        r.stop().await;
    }
    let hints = common::hints_in(&config, &config.hints.output_topic).await;
    assert_eq!(
        hints
            .iter()
            .map(|h| h.instance_id.as_str())
            .collect::<HashSet<_>>()
            .len(),
        GROUPS
    );
    let spent: f64 = hints.iter().map(|h| h.cost_usd).sum();
    let llm: Vec<&Hint> = hints
        .iter()
        .filter(|h| h.category == HintCategory::LlmSynthesized)
        .collect();
    let exhausted = hints
        .iter()
        .filter(|h| h.failure_reason.as_deref() == Some("budget_exhausted"))
        .count();
    let worst = llm
        .iter()
        .map(|h| h.cost_usd + FRAMING_TOKENS as f64 * INPUT_PER_MTOK / 1e6)
        .fold(0.0, f64::max);
    let in_flight = 2.0 * CONCURRENCY as f64 * worst;
    eprintln!(
        "spend topic's leader stopped {outage:.1?}: 2 workers x concurrency {CONCURRENCY} under ${BUDGET_USD}/h \
         spent ${spent:.4} in {} LLM calls ({exhausted} budget_exhausted), calls in flight ${in_flight:.4}; \
         test took {:.1?}",
        llm.len(),
        started.elapsed()
    );
    assert!(exhausted > 0, "the budget was reached");
    assert!(
        spent <= BUDGET_USD + in_flight + 1e-9,
        "the group spent ${spent:.4}, over ${BUDGET_USD} + ${in_flight:.4} in flight"
    );
    assert!(
        spent >= BUDGET_USD - 2.0 * worst - 0.01,
        "each worker spent its share: ${spent:.4}"
    );
}
