//! At-least-once under concurrent, out-of-order completion: 10,000 messages,
//! random handler delays, the consumer killed midway and restarted. Every
//! message is processed at least once, and no committed offset ever passes a
//! message that had not finished. Runs on Apache Kafka and on librdkafka's
//! mock cluster, both with batched input: the restarted consumer resumes
//! inside record batches, which both serve from the batch's start.

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hintstream::config::Config;
use hintstream::kafka::{create_producer, RecordMeta, RunOptions, StageLoop, Work};
use hintstream::metrics::StageMetrics;
use rand::Rng;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

const MESSAGES: u64 = 10_000;
const PARTITIONS: i32 = 4;

#[derive(Default)]
struct Progress {
    /// (partition, offset) of every finished message, over both runs.
    finished: HashSet<(i32, i64)>,
    /// Payload ids seen finished.
    ids: HashSet<u64>,
    /// Finishes that came after a higher offset of the same partition.
    out_of_order: u64,
    last_finished: HashMap<i32, i64>,
}

async fn produce(producer: &FutureProducer, topic: &str) {
    let sends = (0..MESSAGES).map(|i| {
        let key = format!("key-{}", i % 97);
        let payload = i.to_string();
        async move {
            producer
                .send(
                    FutureRecord::to(topic).key(&key).payload(&payload),
                    Duration::from_secs(30),
                )
                .await
                .map(drop)
                .map_err(|(e, _)| e)
        }
    });
    for result in futures::future::join_all(sends).await {
        result.expect("produce");
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Committed offsets of `group` per partition.
async fn committed(config: &Config, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    common::committed_offsets(config, group, topic, PARTITIONS).await
}

fn assert_no_commit_past_unfinished(committed: &BTreeMap<i32, i64>, progress: &Progress) {
    for (&partition, &offset) in committed {
        if let Some(missing) = (0..offset).find(|o| !progress.finished.contains(&(partition, *o))) {
            panic!("partition {partition} committed {offset} but offset {missing} never finished");
        }
    }
}

/// Runs the stage loop until `stop_when` holds, then either kills it (drops
/// the loop and its tasks: no drain, no final commit) or shuts it down.
async fn run_until(
    config: &Config,
    group: &str,
    topic: &str,
    progress: Arc<Mutex<Progress>>,
    stop_when: impl Fn(&Progress) -> bool + Send + Sync + 'static,
    kill: bool,
) {
    let reached = Arc::new(tokio::sync::Notify::new());
    let stop_when = Arc::new(stop_when);
    let options = RunOptions {
        max_in_flight: 256,
        max_in_flight_bytes: None,
        drain_timeout: Duration::from_secs(10),
    };
    let stage_loop = StageLoop::create(
        config,
        group,
        topic,
        &format!("{topic}.dlq"),
        Arc::new(StageMetrics::unregistered()),
        options,
    )
    .unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let handler_progress = progress.clone();
    let (handler_reached, handler_stop_when) = (reached.clone(), stop_when.clone());
    let stage = stage_loop.run(
        |bytes: &[u8], _: &RecordMeta| Ok(std::str::from_utf8(bytes).unwrap().parse::<u64>().unwrap()),
        move |work: Work<u64>| {
            let progress = handler_progress.clone();
            let (reached, stop_when) = (handler_reached.clone(), handler_stop_when.clone());
            async move {
                let delay = rand::rng().random_range(0..20);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let mut p = progress.lock().unwrap();
                let (partition, offset) = (work.message.meta().partition, work.message.offset());
                if p.last_finished.get(&partition).is_some_and(|last| *last > offset) {
                    p.out_of_order += 1;
                }
                p.last_finished.insert(partition, offset);
                p.finished.insert((partition, offset));
                p.ids.insert(work.input);
                if stop_when(&p) {
                    reached.notify_one();
                }
                drop(p);
                work.message.ack();
            }
        },
        async {
            let _ = stop_rx.await;
        },
    );
    tokio::pin!(stage);
    let mut stop_tx = Some(stop_tx);
    let mut checks = 0;
    loop {
        tokio::select! {
            _ = &mut stage => break,
            _ = reached.notified() => {
                if kill {
                    // Kill once librdkafka's auto-commit has landed, so the
                    // restart resumes mid-stream rather than from the start
                    // (reaching the target can take less than its 1 s timer).
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                    while committed(config, group, topic).await.values().sum::<i64>() == 0 {
                        assert!(tokio::time::Instant::now() < deadline, "nothing committed in 30 s");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    return; // dropping `stage` aborts its tasks mid-flight
                }
                if let Some(tx) = stop_tx.take() {
                    let _ = tx.send(());
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(300)) => {
                // Read the commit first, then what had finished: `finished`
                // only grows, so the check is never weaker than the truth.
                let committed = committed(config, group, topic).await;
                assert_no_commit_past_unfinished(&committed, &progress.lock().unwrap());
                checks += 1;
            }
            _ = tokio::time::sleep(Duration::from_secs(240)) => panic!("no progress after {checks} checks"),
        }
    }
}

async fn kill_and_resume(config: Config, topic: &str) {
    let group = common::unique("alo-group");
    let progress = Arc::new(Mutex::new(Progress::default()));

    run_until(
        &config,
        &group,
        topic,
        progress.clone(),
        |p| p.ids.len() >= 4_000,
        true,
    )
    .await;
    let after_kill = progress.lock().unwrap().ids.len() as u64;
    assert!(
        after_kill < MESSAGES,
        "the kill must come midway, {after_kill} were done"
    );
    let committed_after_kill = committed(&config, &group, topic).await;
    assert_no_commit_past_unfinished(&committed_after_kill, &progress.lock().unwrap());
    let committed_total: i64 = committed_after_kill.values().sum();
    assert!(committed_total > 0, "something was committed before the kill");

    run_until(
        &config,
        &group,
        topic,
        progress.clone(),
        |p| p.ids.len() as u64 >= MESSAGES,
        false,
    )
    .await;
    let committed_end = committed(&config, &group, topic).await;
    let p = progress.lock().unwrap();
    assert_eq!(
        p.ids.len() as u64,
        MESSAGES,
        "every message processed at least once"
    );
    assert!(p.ids.iter().all(|id| *id < MESSAGES));
    assert!(
        p.out_of_order > 0,
        "completion must have been out of order to test anything"
    );
    assert_no_commit_past_unfinished(&committed_end, &p);
    eprintln!(
        "killed after {after_kill}, committed then {committed_total}, out-of-order finishes {}, final commits {committed_end:?}",
        p.out_of_order
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resumes_after_kill_on_mock_cluster_with_batched_input() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let topic = common::unique("alo-mock");
    cluster.create_topic(&topic, PARTITIONS, 1).unwrap();
    let config = common::config_for(&cluster.bootstrap_servers());
    let mut producer_config = config.clone();
    // Batched, as real producers send: many messages per record batch, so
    // the restarted consumer resumes inside batches.
    producer_config.kafka.insert("linger.ms", "50");
    producer_config.kafka.insert("batch.num.messages", "500");
    produce(&create_producer(&producer_config).unwrap(), &topic).await;
    kill_and_resume(config, &topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resumes_after_kill_on_kafka_with_batched_input() {
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let topic = common::unique("alo-kafka");
    common::create_topics(&config, &[&topic], PARTITIONS).await;
    let mut producer_config = config.clone();
    producer_config.kafka.insert("linger.ms", "50");
    producer_config.kafka.insert("batch.num.messages", "500");
    produce(&create_producer(&producer_config).unwrap(), &topic).await;
    kill_and_resume(config, &topic).await;
}
