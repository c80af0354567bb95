//! Stage 1's hints settled off their handlers (the worker's settler,
//! `kafka::settler`) on a real broker: a hint the broker refuses after it
//! was queued still dead-letters its input as `output_rejected`, in the
//! input's trace, and lets its offset commit; a stage stopped mid-stream waits for the hints it
//! queued, so every input whose hint it published is committed and none is
//! left to be redone; and a partition revoked while its hints are queued
//! is drained of them before its next owner takes it, which redoes none.

use crate::common;
use crate::common::header;

use std::time::Duration;

use hintstream::config::Config;
use hintstream::hints::HintStage;
use hintstream::kafka::{create_producer, DlqHeaders, RunSummary};
use hintstream::llm::synth::LlmEnv;
use rdkafka::producer::Producer;

/// A failed trajectory of a group of one, which gets a static hint.
fn trajectory(i: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": "run-settled", "step": 1, "instance_id": format!("i{i:05}"),
        "trajectory_id": format!("t{i:05}"), "task_prompt": "Solve it", "reward": 0.0, "group_size": 1,
        "chat_history": [{"role": "user", "content": "go"}],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['check_output failed']\n<<< ERROR_ACCUMULATOR <<<",
    }))
    .unwrap()
}

/// The trace of input `i`, as its producer's `traceparent`.
fn trace_id(i: usize) -> String {
    format!("{:032x}", 0x5e771ed0000 + i)
}

/// Sends `n` failed trajectories to `topic`, each traced by its producer
/// ([`trace_id`]), flushed.
async fn send_failed(config: &Config, topic: &str, n: usize) {
    let producer = create_producer(config).unwrap();
    for i in 0..n {
        let traceparent = format!("00-{}-b7ad6b7169203331-01", trace_id(i));
        let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: "traceparent",
            value: Some(&traceparent),
        });
        let key = format!("run-settled/1/i{i:05}");
        common::send_raw(&producer, topic, &key, Some(&trajectory(i)), Some(headers)).await;
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Sends `n` failed trajectories to the stage's input topic, then starts
/// the stage with static hints.
async fn send_and_start(config: &Config, n: usize) -> common::Running<RunSummary> {
    send_failed(config, &config.hints.input_topic, n).await;
    start(config.clone()).await
}

/// Stage 1 with static hints on `config`.
async fn start(config: Config) -> common::Running<RunSummary> {
    let stage = HintStage::build(config, &LlmEnv::default()).await.unwrap();
    common::spawn_stage(|stop| stage.run(stop))
}

/// [`start`], its metrics on a port of its own.
async fn start_measured(mut config: Config) -> (common::MetricsEndpoint, common::Running<RunSummary>) {
    let endpoint = common::MetricsEndpoint::free();
    config.hints.metrics_addr = endpoint.addr();
    (endpoint, start(config).await)
}

/// A config on the shared broker whose stage 1 has topics of its own
/// (`{name}-in`, `{name}-hints` and the dead letters' topic, of
/// `partitions` each, created) and a group of its own.
async fn with_own_topics(name: &str, partitions: i32) -> Config {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, &format!("{name}-in"), &format!("{name}-hints"));
    common::create_hints_topics(&config, partitions).await;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_the_broker_refuses_after_it_was_queued_dead_letters_its_input_and_commits() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "settled-in", "settled-hints");
    config.hints.group_id = common::unique("settled-group");
    let h = config.hints.clone();
    common::create_topics(&config, &[&h.input_topic, &h.dlq_topic], 1).await;
    // The producer takes a hint (librdkafka's own limit is 1 MB); the
    // broker refuses it when it arrives (the topic's limit is 200 bytes),
    // which only its delivery report says.
    hintstream::kafka::admin::create_topics_with(
        &config,
        &[(h.output_topic.clone(), vec![("max.message.bytes", "200")])],
        1,
    )
    .await
    .unwrap();
    let n = 5;
    let running = send_and_start(&config, n).await;
    let dead = common::wait_for_messages(&config, &h.dlq_topic, n).await;
    let summary = running.stop().await;
    assert_eq!(dead.len(), n, "one dead letter an input");
    for letter in &dead {
        assert_eq!(header(letter, DlqHeaders::ERROR_KIND), Some("output_rejected"));
        let reason = header(letter, DlqHeaders::REASON).unwrap_or_default();
        assert!(
            reason.starts_with("the hint for run-settled/1/i") && reason.contains(&*h.output_topic),
            "{reason}"
        );
        // Its input's trace, though settled off the input's handler.
        let key = std::str::from_utf8(letter.key_bytes().unwrap()).unwrap();
        let i: usize = key.rsplit_once("/i").unwrap().1.parse().unwrap();
        let traceparent = header(letter, "traceparent").unwrap_or_default();
        assert!(
            traceparent.starts_with(&format!("00-{}-", trace_id(i))),
            "{key}: {traceparent}"
        );
    }
    assert!(common::read_topic(&config, &h.output_topic).await.is_empty());
    assert_eq!(summary.abandoned, 0, "{summary:?}");
    let committed = common::committed_offsets(&config, &h.group_id, &h.input_topic, 1).await;
    assert_eq!(
        committed.get(&0),
        Some(&(n as i64)),
        "every input's offset commits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_stopped_mid_stream_commits_every_input_whose_hint_it_published() {
    let partitions = 3;
    let mut config = with_own_topics("settled-stop", partitions).await;
    let endpoint = common::MetricsEndpoint::free();
    config.hints.metrics_addr = endpoint.addr();
    let h = config.hints.clone();
    let n = 6_000;
    let running = send_and_start(&config, n).await;
    // Stopped once it is well under way, with hints queued and not yet
    // acknowledged.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let published = endpoint
            .value("hintstream_hints_hints_published_total", &[])
            .await;
        if published >= 300.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{published} hints published"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let summary = running.stop().await;
    assert_eq!(
        summary.abandoned, 0,
        "the drain waited for every hint: {summary:?}"
    );
    let hints = common::read_topic(&config, &h.output_topic).await;
    assert!(hints.len() < n, "stopped mid-stream: {} hints", hints.len());
    let committed: i64 = common::committed_offsets(&config, &h.group_id, &h.input_topic, partitions)
        .await
        .values()
        .sum();
    // Each input taken gets one hint, and the drain finishes every input
    // taken: what was committed is what was published.
    assert_eq!(
        committed,
        hints.len() as i64,
        "committed inputs against hints published"
    );
    assert!(common::read_topic(&config, &h.dlq_topic).await.is_empty());
}

/// `name`'s value at `endpoint` now, which must answer (a missed answer
/// is not read as 0).
async fn metric_now(endpoint: &common::MetricsEndpoint, name: &str, labels: &[(&str, &str)]) -> f64 {
    let (_, text) = endpoint
        .get("/metrics")
        .await
        .expect("the stage's metrics endpoint answers");
    common::metric_value(&text, name, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_revoked_while_its_hints_are_queued_waits_for_them_and_is_not_redone() {
    let partitions = 4;
    let mut config = with_own_topics("settled-revoke", partitions).await;
    // Quick heartbeats: a join is answered within half a second.
    config.kafka.insert("heartbeat.interval.ms", "500");
    let h = config.hints.clone();
    let n = 40;
    // Sent without A's linger: `send_failed` waits for each message.
    send_failed(&config, &h.input_topic, n).await;
    // A's hints wait in its producer for 25 s before they are sent (under
    // the producer's 30 s message timeout, as librdkafka requires): its
    // handlers are done at once, and its settler holds every input until
    // then, through B's start and join and A's revoke, whose drain may
    // wait that long (within the session's 45 s, as the config requires).
    let mut a_config = config.clone();
    a_config.kafka.producer.insert("linger.ms".into(), "25000".into());
    a_config.hints.drain_timeout_secs = 40;
    let (a_endpoint, a) = start_measured(a_config).await;
    a_endpoint
        .wait_for(
            "hintstream_hints_in_flight_messages",
            &[],
            |v| v >= n as f64,
            Duration::from_secs(60),
            || "A took every input".into(),
        )
        .await;
    let (b_endpoint, b) = start_measured(config.clone()).await;
    // Counted as A's revoke begins, before its drain.
    a_endpoint
        .wait_for(
            "hintstream_hints_rebalances_total",
            &[("kind", "revoke")],
            |v| v >= 1.0,
            Duration::from_secs(60),
            || "A's revoke once B joined".into(),
        )
        .await;
    let published_at_revoke = metric_now(&a_endpoint, "hintstream_hints_hints_published_total", &[]).await;
    b_endpoint.wait_assigned("hints", String::new).await;
    // B takes partitions only once A's revoke finished: by then every
    // input of the revoked partitions was settled and committed.
    common::waits::wait_committed_to_end(
        &config,
        &h.group_id,
        &h.input_topic,
        partitions,
        Duration::from_secs(90),
        String::new,
    )
    .await;
    let drained = metric_now(&a_endpoint, "hintstream_hints_revoke_drained_messages_total", &[]).await;
    let a_summary = a.stop().await;
    let b_summary = b.stop().await;
    assert_eq!(
        published_at_revoke, 0.0,
        "A's revoke began while every hint was still queued"
    );
    assert!(
        drained >= 1.0,
        "A's revoke waited for inputs whose hints were queued: {drained} drained"
    );
    let hints = common::read_topic(&config, &h.output_topic).await;
    let keys: std::collections::BTreeSet<&[u8]> = hints.iter().filter_map(|m| m.key_bytes()).collect();
    assert_eq!(keys.len(), n, "a hint for every input");
    assert_eq!(hints.len(), n, "none redone by B: {a_summary:?} {b_summary:?}");
    assert_eq!(a_summary.abandoned, 0, "{a_summary:?}");
    assert!(common::read_topic(&config, &h.dlq_topic).await.is_empty());
}
