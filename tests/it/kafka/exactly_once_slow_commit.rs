//! A commit that times out under exactly_once: librdkafka says such a
//! commit is retriable and refuses an abort after it, so the worker calls
//! the commit again (counted in `transaction_retries_total{call="commit"}`)
//! and goes on; each step is published once.
//!
//! On librdkafka's mock cluster, the one place where a single EndTxn can be
//! answered late on purpose (an Apache Kafka broker cannot be slowed for
//! one request). The mock makes records visible at once, so a transaction
//! aborted here would show its outputs twice: "each step once" also says no
//! abort happened.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use hintstream::advantages::service::AdvantageStage;
use hintstream::batch::ipc;
use hintstream::config::DeliveryMode;
use rdkafka::bindings::{rd_kafka_handle_mock_cluster, rd_kafka_mock_broker_push_request_error_rtts};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

/// `kafka.transaction_timeout_ms`: each commit call waits this long.
const CALL_MS: u64 = 1_000;

fn row(step: i64, id: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "type": "scored_rollout", "schema_version": 1, "run_id": "slow-commit", "step": step,
        "instance_id": format!("g{}", id % 2), "trajectory_id": format!("s{step}-t{id}"),
        "reward": (id % 3) as f64, "is_hinted": false,
    }))
    .unwrap()
}

async fn send_step(producer: &rdkafka::producer::FutureProducer, topic: &str, step: i64) {
    let key = hintstream::messages::step_key("slow-commit", step);
    for id in 0..4 {
        common::send(producer, topic, &key, &row(step, id)).await;
    }
    let end = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "slow-commit", "step": step, "count": 4});
    common::send(producer, topic, &key, &serde_json::to_vec(&end).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_that_times_out_is_called_again_and_the_stage_goes_on() {
    // A client that owns a one-broker mock cluster.
    let owner: BaseProducer = ClientConfig::new()
        .set("test.mock.num.brokers", "1")
        .create()
        .unwrap();
    let cluster = owner.client().mock_cluster().unwrap();
    let mut config = common::config_for(&cluster.bootstrap_servers());
    common::own_topics(&mut config.advantages, "slow-commit-in", "slow-commit-out");
    config.topics.metrics = common::unique("slow-commit-metrics");
    config.kafka.delivery = DeliveryMode::ExactlyOnce;
    config.kafka.worker_id = Some("w0".into());
    config.kafka.transaction_timeout_ms = CALL_MS;
    let endpoint = common::MetricsEndpoint::free();
    config.advantages.metrics_addr = endpoint.addr();
    let a = config.advantages.clone();
    for t in [
        &a.input_topic,
        &a.output_topic,
        &a.dlq_topic,
        &config.topics.metrics,
    ] {
        cluster.create_topic(t, 1, 1).unwrap();
    }
    let stage = AdvantageStage::build(config.clone()).await.unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    let published = |n: f64| {
        endpoint.wait_for(
            "hintstream_advantages_steps_published_total",
            &[],
            move |v| v >= n,
            Duration::from_secs(60),
            String::new,
        )
    };
    send_step(&producer, &a.input_topic, 1).await;
    published(1.0).await;

    // The next EndTxn is answered after 1.5 calls' time: the commit's first
    // call times out.
    let late = i32::try_from(CALL_MS * 3 / 2).unwrap();
    // SAFETY: the mock cluster lives as long as `owner`; the variadic
    // arguments are one (error code, round-trip ms) pair, as `cnt` says.
    let pushed = unsafe {
        let mock = rd_kafka_handle_mock_cluster(owner.client().native_ptr());
        rd_kafka_mock_broker_push_request_error_rtts(
            mock,
            1,
            RDKafkaApiKey::EndTxn as i16,
            1,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
            late,
        )
    };
    assert_eq!(pushed, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
    send_step(&producer, &a.input_topic, 2).await;
    endpoint
        .wait_for(
            "hintstream_advantages_transaction_retries_total",
            &[("call", "commit")],
            |v| v >= 1.0,
            Duration::from_secs(60),
            String::new,
        )
        .await;
    // It went on: a later step is published too.
    send_step(&producer, &a.input_topic, 3).await;
    published(3.0).await;
    producer.flush(Duration::from_secs(10)).unwrap();

    let summary = running.stop().await;
    assert_eq!(summary.failure, None, "the stage stopped on its own");
    assert_eq!(
        endpoint
            .value(
                "hintstream_advantages_transaction_retries_total",
                &[("call", "abort")]
            )
            .await,
        0.0,
        "nothing was aborted"
    );
    // Each step's rows once, as a reader sees them.
    let mut rows: BTreeMap<String, usize> = BTreeMap::new();
    for m in common::read_topic(&config, &a.output_topic).await {
        for batch in ipc::decode_stream(m.value_bytes().unwrap()).unwrap() {
            let ids = arrow_cast::display::ArrayFormatter::try_new(
                batch.column_by_name("trajectory_id").unwrap().as_ref(),
                &Default::default(),
            )
            .unwrap();
            for i in 0..batch.num_rows() {
                *rows.entry(ids.value(i).to_string()).or_default() += 1;
            }
        }
    }
    assert_eq!(rows.len(), 12, "3 steps of 4 rows: {rows:?}");
    assert!(rows.values().all(|&n| n == 1), "a row published twice: {rows:?}");
}
