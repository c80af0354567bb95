//! Autoscaling on consumer lag, measured on real workers: what the Helm
//! chart's KEDA ScaledObject would do to stage 1 under a burst, replayed
//! with real `hintstream hints` processes on Apache Kafka.
//!
//! ```text
//! KAFKA_EXTRA_PROPERTIES="group.consumer.session.timeout.ms=45000" scripts/kafka.sh start 19092
//! cargo build --release --bin hintstream --example autoscale_load
//! target/release/examples/autoscale_load --static-membership true --group-protocol classic
//! ```
//!
//! A burst of `--groups` failed groups arrives at once on `--partitions`
//! partitions, and a trickle (`--trickle-per-sec`) keeps arriving from then
//! on, round-robin over the partitions. The workers ask a loopback model
//! server that answers every call after a fixed `--llm-latency-ms`.
//!
//! The scaler follows KEDA's kafka scaler and the HPA it drives, with the
//! chart's settings: every `--poll-secs` (the HPA's sync period; the burst
//! arrives just after a poll) the lag is read as KEDA reads it (per
//! partition, the end offset less the group's committed offset, or less the
//! start without a commit) and desired = ceil(total lag / `--lag-threshold`),
//! capped at the partitions and `--max-replicas`, at least `--min-replicas`;
//! the HPA's tolerance (no change within 10% of the target), its default
//! scale-up policy (at most max(4 pods, 100%) more per period) and its
//! scale-down stabilization window (`--cooldown-secs`: the highest desired
//! count of that window wins) apply. Workers are StatefulSet pods: worker
//! `hints-N` has that worker id, scale-up starts the missing ordinals at once
//! (podManagementPolicy Parallel), scale-down stops the highest with SIGTERM.
//!
//! It prints, for the mode given (static membership on/off, group protocol
//! classic/consumer), one row of docs/BENCHMARKS.md's table:
//! - drain: from the burst's arrival until every burst group is hinted;
//! - rebalances: rebalance callbacks (assign and revoke) the workers got,
//!   summed over workers (`hintstream_hints_rebalances_total`);
//! - duplicates: hints published more than once (at-least-once redelivery);
//! - longest stall: the longest time a partition with waiting input
//!   published nothing (for each group: its hint's arrival less the later of
//!   its arrival and its partition's previous hint), while the burst drained
//!   (workers joining) and after (workers leaving);
//!
//! and the scaler's decisions, one line per poll.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use axum::routing::post;
use axum::Router;
use clap::Parser;
use hintstream::config::{ClientKind, Config, KafkaValue};
use hintstream::kafka::{client_config, create_producer};
use hintstream::messages::keys::group_key;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:19092")]
    bootstrap_servers: String,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    static_membership: bool,
    /// `classic` or `consumer` (KIP-848).
    #[arg(long, default_value = "classic")]
    group_protocol: String,
    /// Classic protocol: `session.timeout.ms` (the broker's
    /// `group.consumer.session.timeout.ms` rules under `consumer`).
    #[arg(long, default_value_t = 45_000)]
    session_timeout_ms: i64,
    #[arg(long, default_value_t = 5_000)]
    groups: usize,
    #[arg(long, default_value_t = 2.0)]
    trickle_per_sec: f64,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    #[arg(long, default_value_t = 300)]
    llm_latency_ms: u64,
    /// `llm.concurrency` of each worker.
    #[arg(long, default_value_t = 20)]
    concurrency: usize,
    #[arg(long, default_value_t = 100)]
    lag_threshold: u64,
    #[arg(long, default_value_t = 15)]
    poll_secs: u64,
    #[arg(long, default_value_t = 120)]
    cooldown_secs: u64,
    #[arg(long, default_value_t = 1)]
    min_replicas: usize,
    #[arg(long, default_value_t = 6)]
    max_replicas: usize,
    /// After the last scale-down, how long the trickle goes on (to see the
    /// stall a removed member leaves); default: the session timeout + 15 s.
    #[arg(long)]
    settle_secs: Option<u64>,
    /// The `hintstream` binary [default: next to this example].
    #[arg(long)]
    hintstream: Option<PathBuf>,
}

/// Every reply of the loopback model: a hint and its usage.
const REPLY: &str = r#"{"id":"msg","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Check the output format first."}],"stop_reason":"end_turn","usage":{"input_tokens":900,"output_tokens":40}}"#;

/// A loopback Anthropic Messages endpoint answering after `latency`.
async fn model_server(latency: Duration) -> anyhow::Result<SocketAddr> {
    let app = Router::new().route(
        "/v1/messages",
        post(move || async move {
            tokio::time::sleep(latency).await;
            ([("content-type", "application/json")], REPLY)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// One worker: a `hintstream hints` process, SIGKILLed on drop.
struct Worker {
    child: Child,
    metrics: SocketAddr,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The StatefulSet: ordinals 0..n running, started and stopped as a
/// StatefulSet controller with parallel pod management does.
struct Pool {
    binary: PathBuf,
    config_file: PathBuf,
    model: SocketAddr,
    logs: PathBuf,
    workers: Vec<Worker>,
    /// Rebalance callbacks counted by workers already stopped.
    stopped_rebalances: f64,
    starts: usize,
}

async fn rebalances_of(metrics: SocketAddr) -> f64 {
    let Ok(response) = reqwest::get(format!("http://{metrics}/metrics")).await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("hintstream_hints_rebalances_total"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

impl Pool {
    fn start(&mut self, ordinal: usize) -> anyhow::Result<Worker> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let metrics: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        self.starts += 1;
        let log = std::fs::File::create(self.logs.join(format!("hints-{ordinal}.{}.log", self.starts)))?;
        let child = Command::new(&self.binary)
            .args(["hints", "--config"])
            .arg(&self.config_file)
            .env("HINTSTREAM_WORKER_ID", format!("hints-{ordinal}"))
            .env("HINTSTREAM_HINTS__METRICS_ADDR", metrics.to_string())
            .env("ANTHROPIC_API_KEY", "sk-load")
            .env("ANTHROPIC_BASE_URL", format!("http://{}", self.model))
            .env_remove("OPENAI_API_KEY")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting hintstream hints")?;
        Ok(Worker { child, metrics })
    }

    /// Scales to `n` workers: starts the missing ordinals at once, or stops
    /// the highest with SIGTERM and waits for them to drain and exit.
    async fn scale_to(&mut self, n: usize) -> anyhow::Result<()> {
        while self.workers.len() < n {
            let worker = self.start(self.workers.len())?;
            self.workers.push(worker);
        }
        let mut stopping = Vec::new();
        while self.workers.len() > n {
            let worker = self.workers.pop().expect("more workers than n");
            self.stopped_rebalances += rebalances_of(worker.metrics).await;
            Command::new("kill")
                .args(["-TERM", &worker.child.id().to_string()])
                .status()?;
            stopping.push(worker);
        }
        for mut worker in stopping {
            let deadline = Instant::now() + Duration::from_secs(60);
            while worker.child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    bail!("a worker did not exit within 60 s of SIGTERM");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    async fn rebalances(&self) -> f64 {
        let mut sum = self.stopped_rebalances;
        for w in &self.workers {
            sum += rebalances_of(w.metrics).await;
        }
        sum
    }

    fn check_running(&mut self) -> anyhow::Result<()> {
        for (i, w) in self.workers.iter_mut().enumerate() {
            if let Some(status) = w.child.try_wait()? {
                bail!("worker hints-{i} exited ({status}); see {}", self.logs.display());
            }
        }
        Ok(())
    }
}

/// The HPA over KEDA's kafka metric, as the chart configures it.
struct Scaler {
    threshold: u64,
    min: usize,
    max: usize,
    partitions: usize,
    window: Duration,
    /// Recommendations of the last `window`, for the scale-down
    /// stabilization.
    recent: VecDeque<(Instant, usize)>,
}

impl Scaler {
    /// The replica count after one poll at `now` that read `lag` with
    /// `current` replicas.
    fn decide(&mut self, now: Instant, lag: i64, current: usize) -> usize {
        let lag = u64::try_from(lag).unwrap_or(0);
        // KEDA caps the metric at partitions x threshold (allowIdleConsumers
        // false), so the HPA never wants more workers than partitions.
        let metric = lag.min(self.partitions as u64 * self.threshold);
        let target = self.threshold as f64 * current as f64;
        let ratio = metric as f64 / target;
        let mut desired = if (ratio - 1.0).abs() <= 0.1 {
            current
        } else {
            metric.div_ceil(self.threshold) as usize
        };
        desired = desired.clamp(self.min, self.max);
        self.recent.push_back((now, desired));
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > self.window)
        {
            self.recent.pop_front();
        }
        if desired >= current {
            // Scale-up: at most max(4 pods, 100%) more per period.
            desired.min(current + current.max(4))
        } else {
            // Scale-down: the highest recommendation of the window.
            let highest = self.recent.iter().map(|(_, d)| *d).max().unwrap_or(desired);
            highest.min(current)
        }
    }
}

/// The group's lag as KEDA's kafka scaler reads it.
fn lag(reader: &BaseConsumer, topic: &str, partitions: i32) -> anyhow::Result<i64> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = reader.committed_offsets(tpl, Duration::from_secs(10))?;
    let mut total = 0;
    for e in committed.elements() {
        let (low, high) = reader.fetch_watermarks(topic, e.partition(), Duration::from_secs(10))?;
        total += match e.offset() {
            Offset::Offset(o) => high - o,
            _ => high - low,
        };
    }
    Ok(total)
}

/// When each group arrived and on which partition.
type Produced = Arc<Mutex<HashMap<String, (i32, Instant)>>>;

async fn produce(
    producer: &FutureProducer,
    topic: &str,
    produced: &Produced,
    i: usize,
    partitions: i32,
) -> anyhow::Result<()> {
    let instance = format!("g{i:07}");
    let key = group_key("scale", 1, &instance);
    let payload = serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": "scale", "step": 1, "instance_id": instance,
        "trajectory_id": "t", "task_prompt": "Solve it.", "chat_history": [], "reward": 0.0
    }))?;
    let partition = (i % partitions as usize) as i32;
    produced
        .lock()
        .unwrap()
        .insert(key.clone(), (partition, Instant::now()));
    producer
        .send(
            FutureRecord::to(topic)
                .key(&key)
                .payload(&payload)
                .partition(partition),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)?;
    Ok(())
}

/// The hints read so far: each one's key and arrival, and the keys seen.
#[derive(Default)]
struct Seen {
    hints: Vec<(String, Instant)>,
    keys: HashSet<String>,
    /// Hints that are not `llm_synthesized` (a timed-out call falls back
    /// to a static hint: the run would then measure the fallback).
    fallbacks: usize,
}

/// Reads the hints topic from the start into `seen` until `stop`.
fn read_hints(
    config: &Config,
    topic: &str,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut client = client_config(config, ClientKind::Consumer);
    client
        .set("group.id", format!("{topic}.reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false");
    let consumer: StreamConsumer = client.create()?;
    consumer.subscribe(&[topic])?;
    Ok(tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await {
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                let synthesized = m
                    .payload()
                    .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                    .is_some_and(|h| h["category"] == "llm_synthesized");
                let mut seen = seen.lock().unwrap();
                seen.fallbacks += usize::from(!synthesized);
                seen.keys.insert(key.clone());
                seen.hints.push((key, Instant::now()));
            }
        }
    }))
}

/// The longest time a partition with waiting input published nothing, for
/// the hints that came out before `split` and for those after it.
fn longest_stalls(
    produced: &HashMap<String, (i32, Instant)>,
    hints: &[(String, Instant)],
    split: Instant,
) -> (Duration, Duration) {
    let mut first_hint: HashMap<&str, Instant> = HashMap::new();
    for (key, at) in hints {
        first_hint.entry(key.as_str()).or_insert(*at);
    }
    let mut by_partition: HashMap<i32, Vec<(Instant, Instant)>> = HashMap::new();
    for (key, (partition, arrived)) in produced {
        if let Some(hinted) = first_hint.get(key.as_str()) {
            by_partition
                .entry(*partition)
                .or_default()
                .push((*hinted, *arrived));
        }
    }
    let (mut before, mut after) = (Duration::ZERO, Duration::ZERO);
    for list in by_partition.values_mut() {
        list.sort();
        let mut previous: Option<Instant> = None;
        for (hinted, arrived) in list.iter() {
            let since = previous.map_or(*arrived, |p| p.max(*arrived));
            let stall = hinted.saturating_duration_since(since);
            let longest = if *hinted <= split { &mut before } else { &mut after };
            *longest = (*longest).max(stall);
            previous = Some(*hinted);
        }
    }
    (before, after)
}

fn binary(args: &Args) -> anyhow::Result<PathBuf> {
    let candidate = match &args.hintstream {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("hintstream"))
            .unwrap_or_else(|| PathBuf::from("target/release/hintstream")),
    };
    if !candidate.exists() {
        bail!(
            "{} is missing: build it or pass --hintstream",
            candidate.display()
        );
    }
    Ok(candidate)
}

/// The stage configuration of this run, on fresh topics and a fresh group.
fn stage_config(args: &Args, id: &str) -> Config {
    let mut config = Config {
        bootstrap_servers: args.bootstrap_servers.clone(),
        ..Config::default()
    };
    let h = &mut config.hints;
    h.input_topic = format!("{id}.failed");
    h.output_topic = format!("{id}.hints");
    h.dlq_topic = format!("{id}.failed.dlq");
    h.group_id = format!("{id}.group");
    config.topics.spend = format!("{id}.spend");
    // The group's rate limit would cap the whole group below what the
    // workers can do: what is measured is the scaling.
    config.llm.requests_per_minute = 0;
    config.llm.concurrency = args.concurrency;
    // What a worker takes in waits for a call slot within the hint's time
    // budget (llm.timeout_secs): a backlog of the default 1,000 would time
    // out into static fallbacks. Four calls' worth a slot keeps the wait
    // near a second, and leaves the rest of the burst in Kafka as lag,
    // where the scaler sees it and other workers can take it.
    config.hints.max_in_flight = 4 * args.concurrency;
    config.kafka.static_membership = args.static_membership;
    if args.group_protocol == "consumer" {
        config
            .kafka
            .consumer
            .insert("group.protocol".into(), "consumer".into());
    } else {
        config.kafka.consumer.insert(
            "session.timeout.ms".into(),
            KafkaValue::Int(args.session_timeout_ms),
        );
    }
    config
}

/// What one run measured.
struct Figures {
    drain: Duration,
    rebalances: f64,
    duplicates: usize,
    /// The longest stall while the burst drained, and after.
    stalls: (Duration, Duration),
    peak: usize,
    hints: usize,
    groups: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !matches!(args.group_protocol.as_str(), "classic" | "consumer") {
        bail!("--group-protocol {}: classic or consumer", args.group_protocol);
    }
    let id = format!("scale-{:08x}", rand::random::<u32>());
    let config = stage_config(&args, &id);
    let names = [
        config.hints.input_topic.clone(),
        config.hints.output_topic.clone(),
        config.hints.dlq_topic.clone(),
        config.topics.spend.clone(),
    ];
    let specs = hintstream::stages::specs_of(&config, &names);
    hintstream::kafka::admin::create_topics(&config, &specs, args.partitions)
        .await
        .context("creating topics")?;
    let dir = tempfile::tempdir()?;
    let config_file = dir.path().join("hintstream.toml");
    std::fs::write(&config_file, toml::to_string(&config)?)?;
    let logs = std::env::temp_dir().join(&id);
    std::fs::create_dir_all(&logs)?;
    let mut pool = Pool {
        binary: binary(&args)?,
        config_file,
        model: model_server(Duration::from_millis(args.llm_latency_ms)).await?,
        logs: logs.clone(),
        workers: Vec::new(),
        stopped_rebalances: 0.0,
        starts: 0,
    };
    let figures = run(&args, &config, &mut pool).await?;
    pool.scale_to(0).await?;
    println!(
        "| {} | {} | {:.1} s | {} | {} of {} | {:.1} s | {:.1} s | {} |",
        if args.static_membership { "on" } else { "off" },
        args.group_protocol,
        figures.drain.as_secs_f64(),
        figures.rebalances,
        figures.duplicates,
        figures.hints,
        figures.stalls.0.as_secs_f64(),
        figures.stalls.1.as_secs_f64(),
        figures.peak,
    );
    eprintln!(
        "({} groups in all; worker logs in {})",
        figures.groups,
        logs.display()
    );
    Ok(())
}

async fn run(args: &Args, config: &Config, pool: &mut Pool) -> anyhow::Result<Figures> {
    let topic = config.hints.input_topic.clone();
    let stop_reading = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let reader = read_hints(
        config,
        &config.hints.output_topic,
        seen.clone(),
        stop_reading.clone(),
    )?;
    let mut lag_client = client_config(config, ClientKind::Consumer);
    lag_client.set("group.id", &config.hints.group_id);
    let lag_reader: BaseConsumer = lag_client.create()?;
    pool.scale_to(args.min_replicas).await?;
    let producer = create_producer(config)?;
    let produced: Produced = Arc::default();
    // Workers in their group before the burst, as a running deployment's.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let burst_at = Instant::now();
    let sends = (0..args.groups).map(|i| produce(&producer, &topic, &produced, i, args.partitions));
    for sent in futures::future::join_all(sends).await {
        sent?;
    }
    let burst_keys: HashSet<String> = produced.lock().unwrap().keys().cloned().collect();
    let stop_trickle = Arc::new(AtomicBool::new(false));
    let trickle = {
        let (producer, topic, produced, stop) = (
            producer.clone(),
            topic.clone(),
            produced.clone(),
            stop_trickle.clone(),
        );
        let (every, first, partitions) = (
            Duration::from_secs_f64(1.0 / args.trickle_per_sec),
            args.groups,
            args.partitions,
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            let mut i = first;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                produce(&producer, &topic, &produced, i, partitions).await?;
                i += 1;
            }
            anyhow::Ok(())
        })
    };
    let figures = scale_until_settled(args, pool, &lag_reader, &topic, burst_at, &burst_keys, &seen).await?;
    stop_trickle.store(true, Ordering::Relaxed);
    trickle.await??;
    producer.flush(Duration::from_secs(30))?;
    // Every group hinted, then the figures.
    let (drain, peak) = figures;
    let total = produced.lock().unwrap().len();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        pool.check_running()?;
        if lag(&lag_reader, &topic, args.partitions)? == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("the workers did not finish the trickle within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rebalances = pool.rebalances().await;
    stop_reading.store(true, Ordering::Relaxed);
    reader.await?;
    let seen = seen.lock().unwrap();
    if seen.keys.len() < total {
        bail!("{} of {total} groups hinted", seen.keys.len());
    }
    if seen.fallbacks > 0 {
        bail!(
            "{} hints fell back to static ones: the workers' calls timed out",
            seen.fallbacks
        );
    }
    let produced = produced.lock().unwrap();
    Ok(Figures {
        drain,
        rebalances,
        duplicates: seen.hints.len() - seen.keys.len(),
        stalls: longest_stalls(&produced, &seen.hints, burst_at + drain),
        peak,
        hints: seen.hints.len(),
        groups: total,
    })
}

/// Polls and scales until the burst is drained, the workers are back at
/// the minimum, and the settle time has passed; the drain time and the
/// most workers at once.
async fn scale_until_settled(
    args: &Args,
    pool: &mut Pool,
    lag_reader: &BaseConsumer,
    topic: &str,
    burst_at: Instant,
    burst_keys: &HashSet<String>,
    seen: &Mutex<Seen>,
) -> anyhow::Result<(Duration, usize)> {
    let mut scaler = Scaler {
        threshold: args.lag_threshold,
        min: args.min_replicas,
        max: args.max_replicas.min(args.partitions as usize),
        partitions: args.partitions as usize,
        window: Duration::from_secs(args.cooldown_secs),
        recent: VecDeque::new(),
    };
    let settle = Duration::from_secs(
        args.settle_secs
            .unwrap_or(args.session_timeout_ms as u64 / 1000 + 15),
    );
    let (mut drained, mut peak, mut scaled_down_at) = (None, pool.workers.len(), None::<Instant>);
    let mut next_poll = burst_at + Duration::from_secs(args.poll_secs);
    let deadline = burst_at + Duration::from_secs(1800);
    loop {
        pool.check_running()?;
        if drained.is_none() && burst_keys.is_subset(&seen.lock().unwrap().keys) {
            drained = Some(burst_at.elapsed());
        }
        let now = Instant::now();
        if now >= next_poll {
            next_poll += Duration::from_secs(args.poll_secs);
            let lag = lag(lag_reader, topic, args.partitions)?;
            let current = pool.workers.len();
            let desired = scaler.decide(now, lag, current);
            eprintln!(
                "t={:>6.1}s lag={lag:>5} workers={current} -> {desired}",
                burst_at.elapsed().as_secs_f64()
            );
            if desired < current {
                scaled_down_at = Some(now);
            }
            pool.scale_to(desired).await?;
            peak = peak.max(desired);
        }
        let settled = drained.is_some()
            && pool.workers.len() == args.min_replicas
            && scaled_down_at.is_some_and(|t| t.elapsed() >= settle);
        if settled {
            return Ok((drained.unwrap_or_default(), peak));
        }
        if now > deadline {
            bail!("not settled within 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
