//! Throughput of both stages under one delivery guarantee, to compare
//! `kafka.delivery = "at_least_once"` with `"exactly_once"` side by side.
//!
//! ```text
//! cargo build --release --bin hintstream --example eos_load
//! target/release/examples/eos_load --bootstrap-servers 127.0.0.1:19092 --delivery exactly_once
//! ```
//!
//! It creates fresh topics (`eosload-<id>.…`), produces `--groups` failed
//! groups (one trajectory each) and `--steps` steps of `--rows` scored rows
//! and a `step_end` up front, then starts one `hintstream hints` and one
//! `hintstream advantages` process (the binary next to this example, or
//! `--hintstream`) with static hints (no LLM: what is measured is the Kafka
//! path, where the delivery guarantee costs), and a `read_committed` reader
//! of their outputs. It prints, per stage, how long from the stage's start
//! until the reader saw every output, and the rate.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use hintstream::config::{ClientKind, Config, DeliveryMode};
use hintstream::kafka::{client_config, create_producer};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:19092")]
    bootstrap_servers: String,
    /// `at_least_once` or `exactly_once`.
    #[arg(long, default_value = "at_least_once")]
    delivery: String,
    #[arg(long, default_value_t = 20_000)]
    groups: usize,
    #[arg(long, default_value_t = 2_000)]
    steps: usize,
    #[arg(long, default_value_t = 8)]
    rows: usize,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// `kafka.transaction_interval_ms` under exactly_once.
    #[arg(long, default_value_t = 100)]
    transaction_interval_ms: u64,
    /// The `hintstream` binary [default: next to this example].
    #[arg(long)]
    hintstream: Option<PathBuf>,
}

/// A stage process, killed on drop.
struct Stage(Child);

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn binary(args: &Args) -> anyhow::Result<PathBuf> {
    let candidate = match &args.hintstream {
        Some(p) => p.clone(),
        // target/<profile>/examples/eos_load -> target/<profile>/hintstream
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let delivery = match args.delivery.as_str() {
        "at_least_once" => DeliveryMode::AtLeastOnce,
        "exactly_once" => DeliveryMode::ExactlyOnce,
        other => bail!("--delivery {other}: at_least_once or exactly_once"),
    };
    let id = format!("eosload-{:08x}", rand::random::<u32>());
    let mut config = Config {
        bootstrap_servers: args.bootstrap_servers.clone(),
        ..Config::default()
    };
    for (stage, name) in [
        (&mut *config.hints, "trajectories"),
        (&mut *config.advantages, "scored"),
    ] {
        stage.input_topic = format!("{id}.{name}");
        stage.output_topic = format!("{id}.{name}.out");
        stage.dlq_topic = format!("{id}.{name}.dlq");
        stage.group_id = format!("{id}.{name}.group");
        stage.metrics_addr = "127.0.0.1:0".into();
    }
    config.topics.metrics = format!("{id}.metrics");
    let names: Vec<String> = [&*config.hints, &*config.advantages]
        .iter()
        .flat_map(|s| [s.input_topic.clone(), s.output_topic.clone(), s.dlq_topic.clone()])
        .chain([config.topics.metrics.clone()])
        .collect();
    let specs = hintstream::stages::specs_of(&config, &names);
    hintstream::kafka::admin::create_topics(&config, &specs, args.partitions)
        .await
        .context("creating topics")?;

    // The input, all up front.
    let mut producer_config = config.clone();
    producer_config.kafka.insert("linger.ms", "20");
    let producer = create_producer(&producer_config)?;
    let mut records: Vec<(String, String, Vec<u8>)> = Vec::new();
    for g in 0..args.groups {
        let t = serde_json::json!({
            "schema_version": 1, "run_id": "load", "step": 1, "instance_id": format!("g{g:06}"),
            "trajectory_id": "t", "task_prompt": "Solve it.", "chat_history": [], "reward": 0.0
        });
        records.push((
            config.hints.input_topic.clone(),
            format!("load/1/g{g:06}"),
            serde_json::to_vec(&t)?,
        ));
    }
    for s in 0..args.steps {
        let key = format!("load/{s}");
        for r in 0..args.rows {
            let row = serde_json::json!({
                "type": "scored_rollout", "schema_version": 1, "run_id": "load", "step": s,
                "instance_id": format!("i{}", r / 4), "trajectory_id": format!("t{r}"),
                "reward": (r % 3) as f64, "is_hinted": false,
            });
            records.push((
                config.advantages.input_topic.clone(),
                key.clone(),
                serde_json::to_vec(&row)?,
            ));
        }
        let end = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "load", "step": s, "count": args.rows});
        records.push((
            config.advantages.input_topic.clone(),
            key,
            serde_json::to_vec(&end)?,
        ));
    }
    for chunk in records.chunks(10_000) {
        let sends = chunk.iter().map(|(topic, key, payload)| {
            producer.send(
                FutureRecord::to(topic).key(key).payload(payload),
                Duration::from_secs(60),
            )
        });
        for sent in futures::future::join_all(sends).await {
            sent.map_err(|(e, _)| e).context("producing the input")?;
        }
    }
    producer.flush(Duration::from_secs(60))?;

    let mut stage_config = config.clone();
    stage_config.kafka.delivery = delivery;
    stage_config.kafka.transaction_interval_ms = args.transaction_interval_ms;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("hintstream.toml");
    std::fs::write(&file, toml::to_string(&stage_config)?)?;
    let binary = binary(&args)?;
    let started = Instant::now();
    let _stages: Vec<Stage> = ["hints", "advantages"]
        .iter()
        .map(|stage| {
            Command::new(&binary)
                .args([stage, "--config"])
                .arg(&file)
                .env("HINTSTREAM_WORKER_ID", format!("{stage}-0"))
                .env_remove("ANTHROPIC_API_KEY")
                .env_remove("OPENAI_API_KEY")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map(Stage)
        })
        .collect::<Result<_, _>>()?;

    // A read_committed reader of both outputs, until each is whole.
    let mut client = client_config(&config, ClientKind::Consumer);
    client
        .set("group.id", format!("{id}.reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    let consumer: BaseConsumer = client.create()?;
    let mut tpl = TopicPartitionList::new();
    let outputs = [
        config.hints.output_topic.clone(),
        config.advantages.output_topic.clone(),
    ];
    for topic in &outputs {
        for p in 0..args.partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
    }
    consumer.assign(&tpl)?;
    let wants = [args.groups, args.steps];
    let mut seen: [HashSet<Vec<u8>>; 2] = [HashSet::new(), HashSet::new()];
    let mut done: [Option<Duration>; 2] = [None, None];
    let deadline = Instant::now() + Duration::from_secs(600);
    while done.iter().any(Option::is_none) {
        if Instant::now() > deadline {
            bail!(
                "after 600 s: {} of {} hints, {} of {} steps",
                seen[0].len(),
                wants[0],
                seen[1].len(),
                wants[1]
            );
        }
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let i = usize::from(m.topic() == outputs[1]);
        seen[i].insert(m.key().unwrap_or_default().to_vec());
        if done[i].is_none() && seen[i].len() >= wants[i] {
            done[i] = Some(started.elapsed());
        }
    }
    for (i, stage) in ["hints", "advantages"].iter().enumerate() {
        let took = done[i].unwrap_or_default().as_secs_f64();
        let unit = if i == 0 { "hints" } else { "steps" };
        println!(
            "delivery={} stage={stage} outputs={} seconds={took:.2} rate={:.0} {unit}/s",
            args.delivery,
            wants[i],
            wants[i] as f64 / took
        );
    }
    Ok(())
}
