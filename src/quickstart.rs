//! `hintstream quickstart`: the whole pipeline in one process on a bundled
//! sample training step. Against an embedded Kafka-protocol broker
//! (librdkafka's mock cluster on 127.0.0.1, memory only) unless
//! `--bootstrap-servers` names a real one: creates the topics, starts two
//! hint workers and the advantage stage, plays the failed trajectories,
//! prints the hints as they arrive, plays the scored rollouts, prints the
//! step's metrics, and stops cleanly. Each stage builds and runs in a
//! `stage` span (`stage=hints worker=0`), so its log lines say which wrote
//! them.
//!
//! A first run is quiet: without an API key it logs no warning and no error
//! at the default level. It stops in order: the stages (their consumers,
//! producers and topic readers) and its own clients first, the embedded
//! broker last, so that nothing reconnects to it, and nothing logs, after
//! `done`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::FutureProducer;
use rdkafka::Message;
use thiserror::Error;
use tokio::sync::watch;
use tracing::Instrument;

use crate::batch::ipc;
use crate::config::Config;
use crate::kafka::{admin, client_config, create_producer, EmbeddedBroker};
use crate::llm::synth::LlmEnv;
use crate::messages::{decode, key_for, Hint};
use crate::stage::BoxFuture;
use crate::telemetry::stage_span;
use crate::tools::recorded::{Bytes, RecordedMessage};
use crate::tools::replay::{send_all, ReplayOptions};

/// The sample step, relative to the crate root.
pub const SAMPLE_DIR: &str = "examples/data";
/// How long to wait for the hints and the step's results.
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);
/// The consumers' session on the embedded broker (see [`fresh_groups`]).
const EMBEDDED_SESSION: [(&str, &str); 2] =
    [("session.timeout.ms", "6000"), ("heartbeat.interval.ms", "1000")];
/// How long one metadata request for a new topic may take.
const TOPIC_PROBE: Duration = Duration::from_secs(5);
/// How often a new topic is looked for.
const READY_POLL: Duration = Duration::from_millis(100);
/// How long the embedded broker waits for its clients to close before it
/// stops anyway (they may then log that it refused their connection).
const BROKER_STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum QuickstartError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("cannot read the sample data {path}: {reason}")]
    Data { path: PathBuf, reason: String },
    #[error("starting a stage: {0}")]
    Stage(String),
    #[error("producing the sample: {0}")]
    Produce(#[from] crate::tools::replay::ReplayError),
    #[error("{0}")]
    Timeout(String),
}

/// What the run produced, for the summary and tests.
#[derive(Debug, Default)]
pub struct QuickstartReport {
    pub hints: Vec<Hint>,
    pub metrics: BTreeMap<String, f64>,
    pub advantage_rows: usize,
}

/// Finds the sample data: `dir` when given, else `examples/data` under the
/// current directory or the crate the binary was built from.
pub fn sample_dir(dir: Option<&Path>) -> PathBuf {
    if let Some(d) = dir {
        return d.to_path_buf();
    }
    let local = PathBuf::from(SAMPLE_DIR);
    if local.is_dir() {
        return local;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join(SAMPLE_DIR)
}

/// Reads a JSONL sample file, giving every message the run id `run_id` and
/// every hinted row the category of its group's hint (`categories`, by
/// instance_id), as a trainer copies it into the rollout.
fn read_sample(
    path: &Path,
    topic: &str,
    run_id: &str,
    categories: &HashMap<String, String>,
) -> Result<Vec<RecordedMessage>, QuickstartError> {
    let bad = |reason: String| QuickstartError::Data {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut value: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
            value["run_id"] = serde_json::Value::String(run_id.to_string());
            let category = value["instance_id"]
                .as_str()
                .and_then(|instance| categories.get(instance));
            if let (Some(true), Some(category)) = (value["is_hinted"].as_bool(), category) {
                value["hint_category"] = serde_json::Value::String(category.clone());
            }
            let key = key_for(&value).ok_or_else(|| bad("a message lacks run_id or step".into()))?;
            Ok(RecordedMessage {
                topic: topic.to_string(),
                partition: -1,
                offset: -1,
                timestamp: None,
                key: Bytes::new(Some(key.into_bytes())),
                value: Bytes::new(Some(value.to_string().into_bytes())),
                headers: vec![],
            })
        })
        .collect()
}

/// A consumer reading `topic` from the beginning, outside any stage's group.
fn reader(config: &Config, topic: &str) -> Result<StreamConsumer, QuickstartError> {
    let mut client = client_config(config, crate::config::ClientKind::Consumer);
    client
        .set(
            "group.id",
            format!("hintstream-quickstart-reader-{}", rand::random::<u64>()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        // Only committed transactional records (see `tools::record`).
        .set("isolation.level", "read_committed");
    let consumer: StreamConsumer = client.create()?;
    consumer.subscribe(&[topic])?;
    Ok(consumer)
}

/// Runs the quick start. `embedded`: start the embedded broker and point
/// `config` at it.
pub async fn run(
    mut config: Config,
    embedded: bool,
    data: &Path,
) -> Result<QuickstartReport, QuickstartError> {
    let started = Instant::now();
    let run_id = format!("quickstart-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S"));
    let broker = open_broker(&mut config, embedded).await?;
    fresh_groups(&mut config, &run_id);
    let played = match start_stages(&config).await {
        Ok((stop_tx, running)) => {
            let played = play(&config, data, &run_id).await;
            let _ = stop_tx.send(true);
            for task in running {
                let _ = task.await;
            }
            played
        }
        Err(e) => Err(e),
    };
    if let Some(broker) = broker {
        broker.stop(BROKER_STOP_TIMEOUT).await;
    }
    let report = played?;
    println!("done in {:.1?}; stages stopped cleanly", started.elapsed());
    Ok(report)
}

/// The quick start's readers of the topics it shows, made together so
/// that their groups join while the stages work.
struct Readers {
    hints: StreamConsumer,
    metrics: StreamConsumer,
    advantages: StreamConsumer,
}

/// Plays the sample step through the running stages; its producer and
/// readers are closed when it returns.
async fn play(config: &Config, data: &Path, run_id: &str) -> Result<QuickstartReport, QuickstartError> {
    let producer = create_producer(config)?;
    let readers = Readers {
        hints: reader(config, &config.topics.hints)?,
        metrics: reader(config, &config.topics.metrics)?,
        advantages: reader(config, &config.topics.advantages)?,
    };
    let mut report = QuickstartReport {
        hints: play_failed(config, &producer, &readers.hints, data, run_id).await?,
        ..QuickstartReport::default()
    };
    play_scored(config, &producer, &readers, data, run_id, &mut report).await?;
    Ok(report)
}

/// Starts the embedded broker with the design's topics (`embedded`), or
/// creates them on the broker `config` names.
async fn open_broker(config: &mut Config, embedded: bool) -> Result<Option<EmbeddedBroker>, QuickstartError> {
    let topics = crate::stages::design_topics(config);
    let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
    if !embedded {
        admin::create_topics(config, &topics, config.topics.partitions).await?;
        wait_for_topics(config, &names).await?;
        println!("broker: {}", config.bootstrap_servers);
        return Ok(None);
    }
    let broker = EmbeddedBroker::start(&names, config.topics.partitions)?;
    config.bootstrap_servers = broker.bootstrap_servers().to_string();
    println!(
        "broker: embedded Kafka-protocol broker (librdkafka mock cluster) at {}",
        config.bootstrap_servers
    );
    Ok(Some(broker))
}

/// Waits until the broker's metadata names every topic of `topics`, at most
/// [`PHASE_TIMEOUT`]: a topic just created is not in every metadata answer
/// at once, and a stage that asks too early refuses to start.
async fn wait_for_topics(config: &Config, topics: &[String]) -> Result<(), QuickstartError> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    for topic in topics {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let seen = crate::kafka::connect::topic_exists(config, topic, left.min(TOPIC_PROBE))
                .await
                .unwrap_or(false);
            if seen {
                break;
            }
            if left.is_zero() {
                return Err(QuickstartError::Timeout(format!(
                    "topic {topic} was created but the broker did not name it within {PHASE_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }
    Ok(())
}

/// Fresh groups, so a rerun against the same broker starts clean; metrics
/// on free ports; a short group wait for the small sample. On the embedded
/// broker, a short session: its group coordinator, when two workers join at
/// the same moment, can wait a session timeout for a member to rejoin (45 s
/// by default; 6 s here, as in the tests).
fn fresh_groups(config: &mut Config, run_id: &str) {
    if crate::kafka::embedded::is_embedded(&config.bootstrap_servers) {
        for (key, value) in EMBEDDED_SESSION {
            if config
                .kafka
                .get(crate::config::ClientKind::Consumer, key)
                .is_none()
            {
                config.kafka.consumer.insert(key.to_string(), value.into());
            }
        }
    }
    config.hints.group_id = format!("{}-{run_id}", config.hints.group_id);
    config.advantages.group_id = format!("{}-{run_id}", config.advantages.group_id);
    config.hints.metrics_addr = "127.0.0.1:0".into();
    config.advantages.metrics_addr = "127.0.0.1:0".into();
    config.hints.group_wait_ms = config.hints.group_wait_ms.min(1000);
}

/// Builds and spawns every registered stage (each `quickstart_workers`
/// times), each worker in its `stage` span; they stop when the returned
/// sender says so.
async fn start_stages(
    config: &Config,
) -> Result<(watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>), QuickstartError> {
    let env = LlmEnv::from_process();
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| -> BoxFuture<()> {
        Box::pin(async move {
            let _ = rx.wait_for(|stop| *stop).await;
        })
    };
    let stage_error = |e: &dyn std::fmt::Display| QuickstartError::Stage(e.to_string());
    let mut running = Vec::new();
    for registered in &crate::stages::STAGES {
        let workers = registered.quickstart_workers;
        for worker in 0..workers {
            let span = stage_span(registered.name, (workers > 1).then_some(worker));
            let stage = (registered.build)(config.clone())
                .instrument(span.clone())
                .await
                .map_err(|e| stage_error(&e))?;
            let who = match workers {
                1 => registered.name.to_string(),
                _ => format!("{} worker {worker}", registered.name),
            };
            println!("{who}: metrics at http://{}/metrics", stage.metrics_addr());
            let run = stage.run(stopped(stop_rx.clone())).instrument(span);
            running.push(tokio::spawn(async move {
                let _ = run.await;
            }));
        }
    }
    let synth = crate::llm::Synthesizer::new(&config.llm, &env).map_err(|e| stage_error(&e))?;
    println!("hints from: {}", synth.describe());
    let embedded = crate::kafka::embedded::is_embedded(&config.bootstrap_servers);
    tracing::info!(
        broker = %config.bootstrap_servers,
        embedded,
        hints = %synth.describe(),
        "quick start: the broker and the hint source"
    );
    Ok((stop_tx, running))
}

/// The groups stage 1 hints: the keys of those whose best reward is at most
/// `hints.reward_threshold` (the others did not fail).
fn failed_groups(config: &Config, failed: &[RecordedMessage]) -> HashSet<Vec<u8>> {
    let mut best: HashMap<Vec<u8>, f64> = HashMap::new();
    for m in failed {
        let reward = m
            .value_bytes()
            .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
            .and_then(|v| v["reward"].as_f64())
            .unwrap_or(f64::NEG_INFINITY);
        if let Some(key) = m.key_bytes() {
            let entry = best.entry(key.to_vec()).or_insert(f64::NEG_INFINITY);
            *entry = entry.max(reward);
        }
    }
    best.into_iter()
        .filter(|(_, reward)| *reward <= config.hints.reward_threshold)
        .map(|(key, _)| key)
        .collect()
}

/// Plays the failed trajectories and prints each group's hint as it
/// arrives; returns the hints once every failed group has one.
async fn play_failed(
    config: &Config,
    producer: &FutureProducer,
    hints_reader: &StreamConsumer,
    data: &Path,
    run_id: &str,
) -> Result<Vec<Hint>, QuickstartError> {
    let failed = read_sample(
        &data.join("failed_trajectories.jsonl"),
        &config.topics.failed,
        run_id,
        &HashMap::new(),
    )?;
    let groups = failed_groups(config, &failed);
    send_all(
        producer,
        &failed,
        &ReplayOptions::default(),
        "failed trajectories",
    )
    .await?;
    println!(
        "\nplayed {} failed trajectories of {} groups (run {run_id}); hints:\n",
        failed.len(),
        groups.len()
    );
    let mut hints = Vec::new();
    let mut hinted: HashSet<String> = HashSet::new();
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while hinted.len() < groups.len() {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(remaining, hints_reader.recv())
            .await
            .map_err(|_| {
                QuickstartError::Timeout(format!(
                    "{} of {} hints after {PHASE_TIMEOUT:?}",
                    hinted.len(),
                    groups.len()
                ))
            })??;
        let Ok(hint) = decode::<Hint>(message.payload().unwrap_or_default(), config.decode_limits()) else {
            continue;
        };
        if hint.run_id != run_id || !hinted.insert(hint.hint_id.clone()) {
            continue;
        }
        println!(
            "  [{}] {}: {}",
            hint.category.as_str(),
            hint.instance_id,
            crate::llm::prompt::truncate_chars(&hint.hint, 240)
        );
        hints.push(hint);
    }
    Ok(hints)
}

/// Plays the scored rollouts (hinted rows carrying their group's hint
/// category), then waits for the step's metrics and advantages and prints
/// them into `report`.
async fn play_scored(
    config: &Config,
    producer: &FutureProducer,
    readers: &Readers,
    data: &Path,
    run_id: &str,
    report: &mut QuickstartReport,
) -> Result<(), QuickstartError> {
    let categories = report
        .hints
        .iter()
        .map(|h| (h.instance_id.clone(), h.category.as_str().to_string()))
        .collect();
    let scored = read_sample(
        &data.join("scored_rollouts.jsonl"),
        &config.topics.scored,
        run_id,
        &categories,
    )?;
    send_all(producer, &scored, &ReplayOptions::default(), "scored rollouts").await?;
    let step_key = scored
        .first()
        .and_then(|m| m.key_bytes().map(<[u8]>::to_vec))
        .unwrap_or_default();
    println!(
        "\nplayed {} scored rollouts (hinted retries included); step metrics:\n",
        scored.len()
    );
    let m = next_for_key(&readers.metrics, &step_key, "step metrics").await?;
    report.metrics = serde_json::from_slice(m.payload().unwrap_or_default()).unwrap_or_default();
    for (name, value) in &report.metrics {
        println!("  {name:<45} {value:.4}");
    }
    let m = next_for_key(&readers.advantages, &step_key, "advantages").await?;
    let batches = ipc::decode_stream(m.payload().unwrap_or_default()).unwrap_or_default();
    report.advantage_rows = batches.iter().map(|b| b.num_rows()).sum();
    println!(
        "\nadvantages: one Arrow IPC stream with {} rows on {}",
        report.advantage_rows, config.topics.advantages
    );
    Ok(())
}

/// The next message of `reader` under `key`, each wait bounded by
/// [`PHASE_TIMEOUT`].
async fn next_for_key<'a>(
    reader: &'a StreamConsumer,
    key: &[u8],
    what: &'static str,
) -> Result<rdkafka::message::BorrowedMessage<'a>, QuickstartError> {
    loop {
        let m = tokio::time::timeout(PHASE_TIMEOUT, reader.recv())
            .await
            .map_err(|_| QuickstartError::Timeout(format!("no {what} after {PHASE_TIMEOUT:?}")))??;
        if m.key() == Some(key) {
            return Ok(m);
        }
    }
}
