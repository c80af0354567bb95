//! LLM fault storm under load, short version: while a running hint stage
//! works through 200 groups, the loopback LLM cycles through 429 with
//! retry-after, 529 overloaded, 500, broken connections, hangs past the
//! timeout, invalid JSON and empty content. Every group still gets exactly
//! one hint (LLM or static fallback with its reason), nothing stalls, and
//! once the storm passes, new groups get LLM hints again at full speed.

use crate::common;
use crate::common::llm_server;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use hintstream::hints::HintStage;
use hintstream::kafka::create_producer;
use hintstream::messages::{decode, DecodeLimits, Hint, HintCategory};
use llm_server::{Behavior, LlmServer};
use rdkafka::producer::{FutureRecord, Producer};

async fn hints(config: &hintstream::config::Config) -> Vec<Hint> {
    common::read_topic(config, &config.hints.output_topic)
        .await
        .iter()
        .map(|m| decode(m.value_bytes().unwrap(), DecodeLimits::default()).unwrap())
        .collect()
}

async fn wait_groups(config: &hintstream::config::Config, n: usize, within: Duration) -> Vec<Hint> {
    let deadline = Instant::now() + within;
    loop {
        let all = hints(config).await;
        if all.iter().map(|h| &h.instance_id).collect::<HashSet<_>>().len() >= n {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "{} hints, waiting for {n} groups",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_group_is_answered_through_a_fault_storm_and_throughput_recovers() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "storm-in", "storm-hints");
    config.llm.timeout_secs = 2.0;
    config.llm.concurrency = 10;
    config.hints.group_wait_ms = 50;
    let h = config.hints.clone();
    common::create_hints_topics(&config, 3).await;

    let server = LlmServer::start(Some("sk-k")).await;
    let ok = Behavior::Text("Use the documented flag.".into(), Duration::from_millis(50));
    server.default(Behavior::Status(429, "rate_limit_error", Some(1)));
    let env = llm_server::anthropic_env(&server, "sk-k");
    let stage = HintStage::build(config.clone(), &env).await.unwrap();
    let metrics = common::MetricsEndpoint(stage.metrics_addr);
    let running = common::spawn_stage(|stop| stage.run(stop));
    // The storm's phases are paced: it starts once the stage holds its
    // partitions, or a slow group join would see only its last faults.
    metrics.wait_assigned("hints", String::new).await;

    let producer = create_producer(&config).unwrap();
    let produce = |from: usize, to: usize| {
        let (producer, topic) = (producer.clone(), h.input_topic.clone());
        async move {
            for i in from..to {
                let t = serde_json::json!({
                    "schema_version": 1, "run_id": "storm", "step": 1, "instance_id": format!("g{i:04}"),
                    "trajectory_id": "t", "task_prompt": "Solve it.", "chat_history": [], "reward": 0.0,
                    "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['check failed']\n<<< ERROR_ACCUMULATOR <<<"
                });
                let key = format!("storm/1/g{i:04}");
                let payload = serde_json::to_vec(&t).unwrap();
                producer
                    .send(
                        FutureRecord::to(&topic).key(&key).payload(&payload),
                        Duration::from_secs(10),
                    )
                    .await
                    .map_err(|(e, _)| e)
                    .unwrap();
            }
            producer.flush(Duration::from_secs(10)).unwrap();
        }
    };
    // The storm: each fault for a stretch, with new groups arriving all along.
    let storm = [
        Behavior::Status(429, "rate_limit_error", Some(1)),
        Behavior::Status(529, "overloaded_error", None),
        Behavior::Status(500, "api_error", None),
        Behavior::Reset,
        Behavior::Hang,
        Behavior::Malformed,
        Behavior::Empty,
    ];
    let per_phase = 200 / storm.len();
    for (k, fault) in storm.into_iter().enumerate() {
        server.default(fault);
        produce(k * per_phase, (k + 1) * per_phase).await;
        // Each fault holds the LLM until the groups that arrived under it
        // are answered, so that every fault meets groups however fast the
        // stage starts or runs.
        wait_groups(&config, (k + 1) * per_phase, Duration::from_secs(60)).await;
    }
    produce(7 * per_phase, 200).await;
    server.default(ok);
    let during = wait_groups(&config, 200, Duration::from_secs(60)).await;

    // After the storm: new groups are LLM-hinted, and quickly.
    let recovered_at = Instant::now();
    produce(200, 300).await;
    let all = wait_groups(&config, 300, Duration::from_secs(30)).await;
    let recovery = recovered_at.elapsed();
    running.stop().await;

    let by_group: HashMap<&str, Vec<&Hint>> = all.iter().fold(HashMap::new(), |mut m, h| {
        m.entry(h.instance_id.as_str()).or_default().push(h);
        m
    });
    assert_eq!(by_group.len(), 300, "every group answered");
    assert!(
        by_group.values().all(|v| v.len() == 1),
        "exactly one hint per group"
    );
    let reasons: HashSet<&str> = during
        .iter()
        .filter_map(|h| h.failure_reason.as_deref())
        .collect();
    assert!(
        reasons.len() >= 5,
        "the storm's faults show up as fallback reasons: {reasons:?}"
    );
    let after: Vec<&Hint> = all.iter().filter(|h| h.instance_id.as_str() >= "g0200").collect();
    assert_eq!(after.len(), 100);
    assert!(
        after.iter().all(|h| h.category == HintCategory::LlmSynthesized),
        "recovered after the storm"
    );
    // 100 hints at concurrency 10 and 50 ms need ~0.5 s of LLM time.
    assert!(recovery < Duration::from_secs(15), "recovery took {recovery:?}");
    eprintln!(
        "storm: {} groups during it, fallback reasons {reasons:?}; 100 groups after it in {recovery:.1?}",
        during.len()
    );
}
