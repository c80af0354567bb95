//! Exactly-once delivery on a three-node Apache Kafka cluster
//! (`common::KafkaCluster`: replication 3, `min.insync.replicas=2`): both
//! stages under `kafka.delivery = "exactly_once"`, two workers each
//! (`hintstream` child processes with stable worker ids), input produced at
//! a steady pace while a worker of each stage is killed with SIGKILL again
//! and again and restarted under the same id. A `read_committed` reader then
//! sees every group's hint exactly once and every step's advantages (one
//! publication: one attempt, each chunk once) and metrics exactly once: 0
//! duplicates, 0 lost, and no dead letters.
//!
//! EOS_KILLS (default 10 per stage) sets the kills, EOS_PARTITIONS (default
//! 6) the partitions of every topic (2: the two steps produced at a time
//! often share one, interleaved), EOS_GROUP_PROTOCOL=consumer the KIP-848
//! group protocol (classic by default). The same run under at_least_once on one
//! node (measured once, not a test) showed 332 duplicate hints and 95
//! duplicate advantage chunks for 6 kills.

use crate::common;
use crate::common::header;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hintstream::batch::chunk::{ATTEMPT_HEADER, CHUNKS_HEADER, CHUNK_HEADER};
use hintstream::config::{ClientKind, Config, DeliveryMode};
use hintstream::kafka::{client_config, create_producer};
use hintstream::messages::{decode, DecodeLimits, Hint};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// Failed groups of two trajectories each.
const GROUPS: usize = 900;
/// Steps of 8 rows and a `step_end`, produced two at a time interleaved.
const STEPS: usize = 240;
const ROWS: usize = 8;
/// Input is produced over about this long, so the kills meet work.
const PRODUCE_FOR: Duration = Duration::from_secs(40);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn trajectory(group: usize, member: usize) -> (String, Vec<u8>) {
    let t = serde_json::json!({
        "schema_version": 1, "run_id": "eos", "step": 1, "instance_id": format!("g{group:05}"),
        "trajectory_id": format!("t{member}"), "group_size": 2,
        "task_prompt": "Solve it.", "chat_history": [], "reward": 0.0
    });
    (format!("eos/1/g{group:05}"), serde_json::to_vec(&t).unwrap())
}

fn step_messages(step: usize) -> Vec<(String, Vec<u8>)> {
    let key = format!("eos/{step}");
    let mut messages: Vec<(String, Vec<u8>)> = (0..ROWS)
        .map(|r| {
            let row = serde_json::json!({
                "type": "scored_rollout", "schema_version": 1, "run_id": "eos", "step": step,
                "instance_id": format!("i{}", r / 4), "trajectory_id": format!("t{r}"),
                "reward": (r % 3) as f64, "is_hinted": false,
            });
            (key.clone(), serde_json::to_vec(&row).unwrap())
        })
        .collect();
    let end = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "eos", "step": step, "count": ROWS});
    messages.push((key, serde_json::to_vec(&end).unwrap()));
    messages
}

/// Produces the input of both stages at a steady pace over [`PRODUCE_FOR`]:
/// groups' members and steps' rows interleaved, as trainers send them.
async fn produce_paced(producer: FutureProducer, hints_in: String, scored_in: String) {
    let rounds = STEPS / 2;
    let pause = PRODUCE_FOR / rounds as u32;
    let groups_per_round = GROUPS.div_ceil(rounds);
    for round in 0..rounds {
        let mut batch: Vec<(&str, String, Vec<u8>)> = Vec::new();
        for group in (round * groups_per_round..(round + 1) * groups_per_round).filter(|g| *g < GROUPS) {
            for member in 0..2 {
                let (key, payload) = trajectory(group, member);
                batch.push((&hints_in, key, payload));
            }
        }
        // Two steps' rows interleaved on their partitions.
        let (a, b) = (step_messages(2 * round), step_messages(2 * round + 1));
        for (x, y) in a.into_iter().zip(b) {
            batch.push((&scored_in, x.0, x.1));
            batch.push((&scored_in, y.0, y.1));
        }
        let sends = batch.iter().map(|(topic, key, payload)| {
            producer.send(
                FutureRecord::to(topic).key(key).payload(payload),
                Duration::from_secs(30),
            )
        });
        for result in futures::future::join_all(sends).await {
            result.map_err(|(e, _)| e).expect("produce input");
        }
        tokio::time::sleep(pause).await;
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Distinct keys seen per output topic by a `read_committed` reader that
/// follows the topics live: the progress the kills wait on.
#[derive(Default)]
struct Seen {
    keys: HashMap<String, HashSet<Vec<u8>>>,
}

fn follow(
    config: &Config,
    topics: Vec<String>,
    partitions: i32,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let mut client = client_config(config, ClientKind::Consumer);
    client
        .set("group.id", common::unique("eos-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    std::thread::spawn(move || {
        let consumer: BaseConsumer = client.create().unwrap();
        let mut tpl = TopicPartitionList::new();
        for topic in &topics {
            for p in 0..partitions {
                tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
            }
        }
        consumer.assign(&tpl).unwrap();
        while !stop.load(Ordering::Relaxed) {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                let key = m.key().unwrap_or_default().to_vec();
                seen.lock()
                    .unwrap()
                    .keys
                    .entry(m.topic().to_string())
                    .or_default()
                    .insert(key);
            }
        }
    })
}

/// What the reader saw of one step's advantages: the attempts they came
/// from and their (chunk, chunks) headers.
#[derive(Default)]
struct Published {
    attempts: HashSet<String>,
    chunks: Vec<(String, String)>,
}

/// A worker process of `stage` with its stable id.
fn spawn(stage: &str, file: &std::path::Path, id: &str) -> common::Process {
    let mut command = common::stage_command(stage, file);
    command
        .env("HINTSTREAM_WORKER_ID", id)
        .env("RUST_LOG", "info,rdkafka=warn");
    common::Process::spawn(command, &format!("eos-{id}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_stages_publish_each_output_exactly_once_while_workers_are_killed() {
    let kills = env_or("EOS_KILLS", 10);
    let partitions = env_or("EOS_PARTITIONS", 6) as i32;
    // Three nodes, replication 3, min.insync.replicas 2: the transaction
    // state and the offsets replicated as in production.
    let cluster = common::KafkaCluster::start();
    let mut config = common::config_for(&cluster.bootstrap);
    config.topics.replication_factor = 3;
    common::own_topics(&mut config.hints, "eos-trajectories", "eos-hints");
    common::own_topics(&mut config.advantages, "eos-scored", "eos-advantages");
    config.topics.metrics = common::unique("eos-metrics");
    let (h, a) = (config.hints.clone(), config.advantages.clone());
    common::create_pipeline_topics(&config, partitions).await;
    cluster.wait_for_topics(&common::pipeline_topics(&config)).await;
    let mut stage_config = config.clone();
    stage_config.kafka.delivery = DeliveryMode::ExactlyOnce;
    stage_config.kafka.transaction_timeout_ms = 10_000;
    // EOS_GROUP_PROTOCOL=consumer runs the workers under KIP-848, where the
    // broker owns the session (45 s by default: a kill then stalls longer).
    match std::env::var("EOS_GROUP_PROTOCOL").as_deref() {
        Ok("consumer") => stage_config.kafka.insert("group.protocol", "consumer"),
        _ => {
            stage_config.kafka.insert("session.timeout.ms", "6000");
            stage_config.kafka.insert("heartbeat.interval.ms", "500");
        }
    }
    stage_config.hints.group_wait_ms = 2_000;
    stage_config.hints.drain_timeout_secs = 3;
    stage_config.advantages.drain_timeout_secs = 3;
    stage_config.advantages.step_timeout_secs = 60;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&stage_config, dir.path());

    let mut hints = [spawn("hints", &file, "hints-0"), spawn("hints", &file, "hints-1")];
    let mut advantages = [
        spawn("advantages", &file, "advantages-0"),
        spawn("advantages", &file, "advantages-1"),
    ];
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop_reader = Arc::new(AtomicBool::new(false));
    let reader = follow(
        &config,
        vec![h.output_topic.clone(), a.output_topic.clone()],
        partitions,
        seen.clone(),
        stop_reader.clone(),
    );
    let count = |topic: &str| seen.lock().unwrap().keys.get(topic).map_or(0, HashSet::len);
    let logs = |procs: &[&common::Process]| {
        procs
            .iter()
            .map(|p| {
                let log = p.log();
                let lines: Vec<&str> = log.lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n")
            })
            .collect::<Vec<_>>()
            .join("\n---\n")
    };

    let mut producer_config = config.clone();
    producer_config.kafka.insert("linger.ms", "10");
    let producing = tokio::spawn(produce_paced(
        create_producer(&producer_config).unwrap(),
        h.input_topic.clone(),
        a.input_topic.clone(),
    ));

    // Kill a worker of each stage, in turn, each time both stages made
    // progress since the last kill.
    let started = Instant::now();
    for k in 0..kills {
        let (hinted, stepped) = (count(&h.output_topic), count(&a.output_topic));
        let deadline = Instant::now() + Duration::from_secs(60);
        while count(&h.output_topic) < (hinted + 10).min(GROUPS)
            || count(&a.output_topic) < (stepped + 3).min(STEPS)
        {
            let all: Vec<&common::Process> = hints.iter().chain(advantages.iter()).collect();
            assert!(
                Instant::now() < deadline,
                "no progress before kill {k}: {} hints, {} steps\n{}",
                count(&h.output_topic),
                count(&a.output_topic),
                logs(&all)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (procs, stage) in [(&mut hints, "hints"), (&mut advantages, "advantages")] {
            let victim = k % 2;
            for p in procs.iter_mut() {
                assert!(p.running(), "a {stage} worker exited on its own:\n{}", p.log());
            }
            procs[victim].kill9();
            procs[victim] = spawn(stage, &file, &format!("{stage}-{victim}"));
        }
    }
    let killing = started.elapsed();
    producing.await.unwrap();

    // Every group hinted and every step published, as the reader sees it.
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(&h.output_topic) < GROUPS || count(&a.output_topic) < STEPS {
        let all: Vec<&common::Process> = hints.iter().chain(advantages.iter()).collect();
        assert!(
            Instant::now() < deadline,
            "{} of {GROUPS} groups hinted, {} of {STEPS} steps published\n{}",
            count(&h.output_topic),
            count(&a.output_topic),
            logs(&all)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing left to redo: both groups committed their whole input.
    let context = || String::new();
    common::waits::wait_committed_to_end(
        &config,
        &h.group_id,
        &h.input_topic,
        partitions,
        Duration::from_secs(60),
        context,
    )
    .await;
    common::waits::wait_committed_to_end(
        &config,
        &a.group_id,
        &a.input_topic,
        partitions,
        Duration::from_secs(60),
        context,
    )
    .await;
    for p in hints.iter_mut().chain(advantages.iter_mut()) {
        assert!(p.running(), "a worker exited on its own:\n{}", p.log());
        p.terminate();
    }
    for p in hints.iter_mut().chain(advantages.iter_mut()) {
        let status = p.wait_exit(Duration::from_secs(20));
        assert!(status.is_some_and(|s| s.success()), "{status:?}\n{}", p.log());
    }
    stop_reader.store(true, Ordering::Relaxed);
    reader.join().unwrap();

    // What a read_committed reader sees, whole.
    let hint_messages = common::read_topic(&config, &h.output_topic).await;
    let mut per_group: BTreeMap<String, usize> = BTreeMap::new();
    for m in &hint_messages {
        let hint: Hint = decode(m.value_bytes().unwrap(), DecodeLimits::default()).unwrap();
        *per_group.entry(hint.instance_id).or_default() += 1;
    }
    let hint_duplicates = hint_messages.len() - per_group.len();
    let advantage_messages = common::read_topic(&config, &a.output_topic).await;
    let mut per_step: BTreeMap<String, Published> = BTreeMap::new();
    for m in &advantage_messages {
        let key = String::from_utf8(m.key_bytes().unwrap().to_vec()).unwrap();
        let entry = per_step.entry(key).or_default();
        entry
            .attempts
            .insert(header(m, ATTEMPT_HEADER).unwrap().to_string());
        entry.chunks.push((
            header(m, CHUNK_HEADER).unwrap().to_string(),
            header(m, CHUNKS_HEADER).unwrap().to_string(),
        ));
    }
    let chunks_expected: usize = per_step
        .values()
        .map(|p| p.chunks[0].1.parse::<usize>().unwrap())
        .sum();
    let advantage_duplicates = advantage_messages.len() - chunks_expected;
    let metrics_messages = common::read_topic(&config, &config.topics.metrics).await;
    let metric_steps: HashSet<Vec<u8>> = metrics_messages
        .iter()
        .map(|m| m.key_bytes().unwrap().to_vec())
        .collect();
    let dead_letters = common::read_topic(&config, &h.dlq_topic).await.len()
        + common::read_topic(&config, &a.dlq_topic).await.len();
    eprintln!(
        "{kills} kills per stage over {killing:.1?}: {} hints for {GROUPS} groups ({hint_duplicates} duplicates), \
         {} advantage chunks for {} steps ({advantage_duplicates} duplicates), {} metrics, {dead_letters} dead letters, \
         {:.1?} in all",
        hint_messages.len(),
        advantage_messages.len(),
        per_step.len(),
        metrics_messages.len(),
        started.elapsed()
    );
    assert_eq!(per_group.len(), GROUPS, "every group hinted");
    assert_eq!(hint_duplicates, 0, "no group hinted twice");
    assert_eq!(per_step.len(), STEPS, "every step published");
    for (step, Published { attempts, chunks }) in &per_step {
        assert_eq!(attempts.len(), 1, "step {step} published by {attempts:?}");
        let distinct: HashSet<&(String, String)> = chunks.iter().collect();
        assert_eq!(
            distinct.len(),
            chunks.len(),
            "step {step}: a chunk twice: {chunks:?}"
        );
    }
    assert_eq!(advantage_duplicates, 0);
    assert_eq!(metric_steps.len(), STEPS, "every step's metrics");
    assert_eq!(metrics_messages.len(), STEPS, "no step's metrics twice");
    assert_eq!(dead_letters, 0, "nothing dead-lettered");
}
