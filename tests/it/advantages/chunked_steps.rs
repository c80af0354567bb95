//! Steps larger than one message, on Apache Kafka:
//!
//! - a 1,000,000-row step published from Arrow (dictionary-encoded
//!   instance_id, 8 rows a group, some hinted) as chunked input messages
//!   closed by a `step_end`: every chunk of advantages arrives under the
//!   byte bound, in order on one partition, the reassembled step equals an
//!   independent float64 reference written here, and the metrics message
//!   was produced after the last chunk;
//! - an advantage worker killed (SIGKILL) between two chunks: the topic
//!   then holds a partial step that no reader returns and no metrics; the
//!   restarted worker republishes the whole step, chunk for chunk the same
//!   bytes, and readers get it once, whole;
//! - a row too large for a message on its own dead-letters its step
//!   (`output_rejected`, saying what to raise), and no chunk of it is
//!   published;
//! - `record` and `replay` carry chunked steps unchanged.

use crate::common;

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int32Array, Int64Array, RecordBatch,
    StringArray,
};
use hintstream::advantages::service::AdvantageStage;
use hintstream::batch::chunk::{chunk_header_values, encode_chunks, ChunkInfo};
use hintstream::batch::ARROW_STREAM_CONTENT_TYPE;
use hintstream::config::Config;
use hintstream::kafka::create_producer;
use hintstream::tools::reassemble::Step;
use hintstream::tools::recorded::RecordedHeader;
use hintstream::tools::{reassemble_steps, RecordedMessage};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};

const EPSILON: f64 = 1e-6;

/// A step of `n` scored rows from Arrow: `instance_id` dictionary-encoded,
/// 8 rows a group; every fifth group scored all 0 (std 0), the others
/// spread over [0, 1); the last row of every third group hinted (a hinted
/// success on a std-0 baseline gets about 1e6).
fn scored_step(run_id: &str, step: i64, n: usize) -> RecordBatch {
    let groups = n.div_ceil(8);
    let hinted = |i: usize| i % 8 == 7 && (i / 8).is_multiple_of(3);
    let reward = |i: usize| {
        if hinted(i) {
            1.0
        } else if (i / 8).is_multiple_of(5) {
            0.0
        } else {
            ((i as u64).wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0
        }
    };
    let names: StringArray = (0..groups).map(|g| Some(format!("task/{g}"))).collect();
    let keys = Int32Array::from_iter_values((0..n).map(|i| (i / 8) as i32));
    let instance = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(names)).unwrap();
    let category: StringArray = (0..n).map(|i| hinted(i).then_some("llm_synthesized")).collect();
    RecordBatch::try_from_iter([
        ("run_id", Arc::new(StringArray::from(vec![run_id; n])) as ArrayRef),
        ("step", Arc::new(Int64Array::from(vec![step; n])) as ArrayRef),
        ("instance_id", Arc::new(instance) as ArrayRef),
        (
            "trajectory_id",
            Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("t{i}")))) as ArrayRef,
        ),
        (
            "reward",
            Arc::new(Float64Array::from_iter_values((0..n).map(reward))) as ArrayRef,
        ),
        (
            "is_hinted",
            Arc::new(BooleanArray::from_iter((0..n).map(|i| Some(hinted(i))))) as ArrayRef,
        ),
        ("hint_category", Arc::new(category) as ArrayRef),
    ])
    .unwrap()
}

/// The reference trainer's advantages in float64, written here and not
/// taken from the crate: with any hinted row, each group's mean and
/// unbiased std come from its raw rows only (two passes); a group with 0 or
/// 1 baseline rows uses mean 0, std 1; A = (s − mean)/(std + ε).
fn reference_advantages(batch: &RecordBatch) -> Vec<f64> {
    let instance = arrow_cast::cast(
        batch.column_by_name("instance_id").unwrap(),
        &arrow_schema::DataType::Utf8,
    )
    .unwrap();
    let instance = instance.as_any().downcast_ref::<StringArray>().unwrap();
    let reward = common::f64s(batch, "reward");
    let hinted = batch
        .column_by_name("is_hinted")
        .unwrap()
        .as_any()
        .downcast_ref::<BooleanArray>()
        .unwrap();
    let first_turn = hinted.true_count() > 0;
    let mut baseline: HashMap<&str, Vec<f64>> = HashMap::new();
    for (i, &r) in reward.iter().enumerate() {
        if !(first_turn && hinted.value(i)) {
            baseline.entry(instance.value(i)).or_default().push(r);
        }
    }
    let stats: HashMap<&str, (f64, f64)> = baseline
        .into_iter()
        .map(|(group, values)| {
            if values.len() <= 1 {
                return (group, (0.0, 1.0));
            }
            let n = values.len() as f64;
            let mean = values.iter().sum::<f64>() / n;
            let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
            (group, (mean, var.sqrt()))
        })
        .collect();
    (0..batch.num_rows())
        .map(|i| {
            let (mean, std) = stats.get(instance.value(i)).copied().unwrap_or((0.0, 1.0));
            (reward[i] - mean) / (std + EPSILON)
        })
        .collect()
}

/// A column of a reassembled step, chunk after chunk.
fn step_f64s(step: &Step, name: &str) -> Vec<f64> {
    step.batches.iter().flat_map(|b| common::f64s(b, name)).collect()
}

fn step_strings(step: &Step, name: &str) -> Vec<String> {
    step.batches
        .iter()
        .flat_map(|b| common::strings(b, name))
        .collect()
}

/// rel. err < 1e-9 (absolute below 1).
fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(1.0);
        assert!(err < 1e-9, "row {i}: got {g}, want {w}");
        worst = worst.max(err);
    }
    eprintln!("{} advantages, worst relative error {worst:e}", got.len());
}

/// Publishes `batch` as Arrow input chunks of at most `max_bytes` (chunk
/// headers on each, as stage 2 writes its own), then the step's `step_end`.
async fn publish_input(
    producer: &FutureProducer,
    topic: &str,
    batch: &RecordBatch,
    max_bytes: usize,
) -> usize {
    let run_id = common::strings(&batch.slice(0, 1), "run_id").remove(0);
    let step = batch
        .column_by_name("step")
        .unwrap()
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .value(0);
    let key = hintstream::messages::step_key(&run_id, step);
    let chunks = encode_chunks(batch, max_bytes).unwrap();
    assert!(chunks.oversized().is_none());
    for (i, chunk) in chunks.chunks.iter().enumerate() {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "content-type",
            value: Some(ARROW_STREAM_CONTENT_TYPE),
        });
        for (name, value) in chunk_header_values(i, chunks.len(), batch.num_rows()) {
            headers = headers.insert(Header {
                key: name,
                value: Some(&value),
            });
        }
        common::send_raw(producer, topic, &key, Some(&chunk.payload), Some(headers)).await;
    }
    let end = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": run_id, "step": step, "count": batch.num_rows()});
    common::send_raw(producer, topic, &key, Some(end.to_string().as_bytes()), None).await;
    chunks.len()
}

fn header<'a>(m: &'a RecordedMessage, name: &str) -> Option<&'a str> {
    m.headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value.bytes.as_deref())
        .map(|v| std::str::from_utf8(v).unwrap())
}

fn chunk_info(m: &RecordedMessage) -> ChunkInfo {
    ChunkInfo::from_headers(|name| header(m, name).map(str::as_bytes)).unwrap()
}

/// Reads `topics` (all partitions from the start) until `done` says the
/// messages so far are enough, failing with `context()` after `within`.
async fn consume_until(
    config: &Config,
    topics: &[(&str, i32)],
    within: Duration,
    done: impl Fn(&[RecordedMessage]) -> bool,
    context: impl Fn(&[RecordedMessage]) -> String,
) -> Vec<RecordedMessage> {
    let mut client = hintstream::kafka::base_config(config);
    client
        .set("group.id", common::unique("chunk-reader"))
        .set("enable.auto.commit", "false");
    let consumer: StreamConsumer = client.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for (topic, partitions) in topics {
        for p in 0..*partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
        }
    }
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while !done(&seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{}", context(&seen));
        if let Ok(m) = tokio::time::timeout(left.min(Duration::from_secs(1)), consumer.recv()).await {
            seen.push(RecordedMessage::of(&m.unwrap()));
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_million_row_step_from_arrow_arrives_in_chunks_whole_and_exact() {
    const ROWS: usize = 1_000_000;
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.advantages, "scored-1m", "advantages-1m");
    config.topics.metrics = common::unique("metrics-1m");
    let a = config.advantages.clone();
    let partitions = 3;
    common::create_advantages_topics(&config, partitions).await;

    let started = Instant::now();
    let input = scored_step("run-1m", 7, ROWS);
    let want = reference_advantages(&input);
    let producer = create_producer(&config).unwrap();
    let input_chunks = publish_input(&producer, &a.input_topic, &input, 900_000).await;
    eprintln!(
        "input: {ROWS} rows in {input_chunks} Arrow messages, {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let stage = AdvantageStage::build(config.clone()).await.unwrap();
    let endpoint = common::MetricsEndpoint(stage.metrics_addr);
    let running = common::spawn_stage(|stop| stage.run(stop));
    let started = Instant::now();
    let metrics_topic = config.topics.metrics.clone();
    let messages = consume_until(
        &config,
        &[(&a.output_topic, partitions), (&metrics_topic, partitions)],
        Duration::from_secs(300),
        // The metrics and every chunk (a consumer of two topics may get
        // the metrics first: they sit on another topic).
        |seen| {
            let chunks: Vec<&RecordedMessage> = seen.iter().filter(|m| m.topic != metrics_topic).collect();
            seen.iter().any(|m| m.topic == metrics_topic)
                && chunks
                    .first()
                    .is_some_and(|c| chunks.len() >= chunk_info(c).count)
        },
        |seen| format!("{} messages after {:?}", seen.len(), started.elapsed()),
    )
    .await;
    let took = started.elapsed();
    let metrics = common::read_topic(&config, &metrics_topic).await;
    // What the stage counted as acknowledged: the chunks on the topic.
    let published = endpoint
        .value("hintstream_advantages_chunks_published_total", &[])
        .await;
    let dead = common::read_topic(&config, &a.dlq_topic).await;
    running.stop().await;
    assert!(
        dead.is_empty(),
        "{} dead letters: {:?}",
        dead.len(),
        dead[0].headers
    );

    // Every chunk: under the bound, the headers, one partition, in order.
    let mut everything: Vec<RecordedMessage> = messages
        .into_iter()
        .filter(|m| m.topic == a.output_topic)
        .collect();
    let count = everything.len();
    let total: usize = everything.iter().map(|m| m.value_bytes().unwrap().len()).sum();
    let fewest = total.div_ceil(a.max_message_bytes);
    assert!(
        fewest > 10 && count <= fewest + fewest / 4,
        "a 1M-row step of {total} bytes in {count} chunks ({fewest} at the fewest)"
    );
    assert_eq!(published, count as f64, "chunks acknowledged vs on the topic");
    for (i, m) in everything.iter().enumerate() {
        let size = m.value_bytes().unwrap().len() + m.key_bytes().unwrap().len();
        assert!(size <= a.max_message_bytes, "chunk {i}: {size} bytes");
        assert_eq!(
            chunk_info(m),
            ChunkInfo {
                index: i,
                count,
                rows: Some(ROWS)
            }
        );
        assert_eq!(m.key_bytes(), Some(&b"run-1m/7"[..]));
        assert_eq!(m.partition, everything[0].partition);
        assert_eq!(header(m, "content-type"), Some(ARROW_STREAM_CONTENT_TYPE));
        assert_eq!(header(m, "hintstream.device"), Some("cpu"));
    }
    assert!(everything.windows(2).all(|w| w[0].offset < w[1].offset));

    // The metrics message was produced after the last chunk was.
    assert_eq!(metrics.len(), 1);
    let last_chunk = everything.iter().filter_map(|m| m.timestamp).max().unwrap();
    let metrics_at = metrics[0].timestamp.unwrap();
    assert!(
        metrics_at >= last_chunk,
        "metrics produced at {metrics_at}, before the last chunk at {last_chunk}"
    );
    let values: serde_json::Value = serde_json::from_slice(metrics[0].value_bytes().unwrap()).unwrap();
    assert_eq!(values["advantage/rows"].as_f64(), Some(ROWS as f64));

    // Reassembled: one whole step, input order, the reference's numbers.
    everything.reverse(); // any arrival order reassembles the same
    let out = reassemble_steps(&everything);
    assert!(
        out.partial.is_empty() && out.unreadable.is_empty(),
        "{:?} {:?}",
        out.partial,
        out.unreadable
    );
    assert_eq!(out.steps.len(), 1);
    let step = &out.steps[0];
    assert_eq!(step.num_rows(), ROWS);
    assert_eq!(
        step_strings(step, "trajectory_id"),
        common::strings(&input, "trajectory_id")
    );
    assert_close(&step_f64s(step, "advantage"), &want);
    eprintln!(
        "1M-row step: {total} bytes in {count} chunks, published and read back in {:.1} s",
        took.as_secs_f64()
    );
}

fn start_worker(config_file: &std::path::Path, name: &str) -> common::Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
    command
        .args(["advantages", "--config"])
        .arg(config_file)
        .env("RUST_LOG", "info");
    common::Process::spawn(command, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_between_chunks_republishes_the_whole_step() {
    const ROWS: usize = 20_000;
    const MAX_BYTES: usize = 64 * 1024;
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.advantages, "scored-kill", "advantages-kill");
    config.topics.metrics = common::unique("metrics-kill");
    config.advantages.max_message_bytes = MAX_BYTES;
    config.advantages.drain_timeout_secs = 2;
    config.hints.drain_timeout_secs = 2;
    // The restarted worker waits out the killed member's session.
    config.kafka.insert("session.timeout.ms", "6000");
    let endpoint = common::MetricsEndpoint::free();
    config.advantages.metrics_addr = endpoint.addr();
    let a = config.advantages.clone();
    common::create_advantages_topics(&config, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    // The first worker's producer holds each record 400 ms before sending
    // it: its chunks go out slowly enough to be killed between two.
    let mut slow = config.clone();
    slow.kafka.insert("linger.ms", "400");
    let slow_dir = tempfile::tempdir().unwrap();
    let slow_file = common::write_config(&slow, slow_dir.path());

    let input = scored_step("run-k", 3, ROWS);
    let want = reference_advantages(&input);
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    publish_input(&producer, &a.input_topic, &input, 900_000).await;

    let mut first = start_worker(&slow_file, "chunks-killed");
    let acked = endpoint
        .wait_for(
            "hintstream_advantages_chunks_published_total",
            &[],
            |n| n >= 2.0,
            Duration::from_secs(120),
            || first.log(),
        )
        .await;
    let steps_published = endpoint
        .value("hintstream_advantages_steps_published_total", &[])
        .await;
    first.kill9();
    assert_eq!(
        steps_published, 0.0,
        "the step was published whole before the kill"
    );

    // Between two chunks: a partial step that no reader returns, and no
    // metrics.
    let interrupted = common::read_topic(&config, &a.output_topic).await;
    let count = chunk_info(&interrupted[0]).count;
    assert!(
        interrupted.len() >= acked as usize && interrupted.len() < count,
        "{} of {count} chunks on the topic at the kill ({acked} acknowledged)",
        interrupted.len()
    );
    let out = reassemble_steps(&interrupted);
    assert!(out.steps.is_empty(), "a partial step was returned");
    assert_eq!(out.partial.len(), 1);
    assert_eq!(
        (out.partial[0].arrived, out.partial[0].count),
        (interrupted.len(), count)
    );
    assert!(
        common::read_topic(&config, &config.topics.metrics)
            .await
            .is_empty(),
        "metrics before the last chunk"
    );

    // The restarted worker publishes the whole step again: it gets the
    // partitions once the killed member's session (6 s) expired.
    // It counts the step once its chunks and its metrics were acknowledged
    // (on the same metrics address the killed worker had).
    let second = start_worker(&file, "chunks-restarted");
    endpoint
        .wait_for(
            "hintstream_advantages_steps_published_total",
            &[],
            |n| n >= 1.0,
            Duration::from_secs(120),
            || format!("--- killed\n{}\n--- restarted\n{}", first.log(), second.log()),
        )
        .await;
    let (all, metrics) = (
        common::read_topic(&config, &a.output_topic).await,
        common::read_topic(&config, &config.topics.metrics).await,
    );
    let republished = &all[interrupted.len()..];
    assert_eq!(republished.len(), count, "the whole step again, every chunk");
    for (i, m) in republished.iter().enumerate() {
        assert_eq!(
            chunk_info(m),
            ChunkInfo {
                index: i,
                count,
                rows: Some(ROWS)
            }
        );
        assert!(m.value_bytes().unwrap().len() <= MAX_BYTES);
    }
    for (before, again) in interrupted.iter().zip(republished) {
        assert_eq!(
            before.value_bytes(),
            again.value_bytes(),
            "a republished chunk differs"
        );
    }
    let last_chunk = all.iter().filter_map(|m| m.timestamp).max().unwrap();
    assert_eq!(metrics.len(), 1);
    assert!(metrics[0].timestamp.unwrap() >= last_chunk);

    let out = reassemble_steps(&all);
    assert_eq!(out.steps.len(), 1, "the step, once");
    assert!(out.partial.is_empty() && out.unreadable.is_empty());
    let step = &out.steps[0];
    assert_eq!(
        step_strings(step, "trajectory_id"),
        common::strings(&input, "trajectory_id")
    );
    assert_close(&step_f64s(step, "advantage"), &want);
    // The republished copy alone is the same step.
    let alone = reassemble_steps(republished);
    assert_eq!(
        step_f64s(&alone.steps[0], "advantage"),
        step_f64s(step, "advantage")
    );
    assert!(common::read_topic(&config, &a.dlq_topic).await.is_empty());
    eprintln!(
        "killed after {} of {count} chunks; republished whole",
        interrupted.len()
    );
}

/// A message's value and headers.
type KeptMessage = (Vec<u8>, Vec<RecordedHeader>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_and_replay_carry_chunked_steps_unchanged() {
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let (a, b) = (common::unique("chunks-a"), common::unique("chunks-b"));
    common::create_topics(&config, &[&a, &b], 3).await;
    // Two steps of chunks, as stage 2 publishes them, interleaved by key.
    let producer = create_producer(&config).unwrap();
    let (one, two) = (scored_step("run-r", 1, 6_000), scored_step("run-r", 2, 3_000));
    let (c1, c2) = (
        encode_chunks(&one, 20_000).unwrap(),
        encode_chunks(&two, 20_000).unwrap(),
    );
    assert!(c1.len() > 3 && c2.len() > 3);
    for i in 0..c1.len().max(c2.len()) {
        for (key, chunks, rows) in [("run-r/1", &c1, 6_000), ("run-r/2", &c2, 3_000)] {
            let Some(chunk) = chunks.chunks.get(i) else {
                continue;
            };
            let mut headers = OwnedHeaders::new();
            for (name, value) in chunk_header_values(i, chunks.len(), rows) {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(&value),
                });
            }
            common::send_raw(&producer, &a, key, Some(&chunk.payload), Some(headers)).await;
        }
    }
    let recorded = common::read_topic(&config, &a).await;
    assert_eq!(recorded.len(), c1.len() + c2.len());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.jsonl");
    std::fs::write(
        &file,
        recorded.iter().map(|m| m.to_line() + "\n").collect::<String>(),
    )
    .unwrap();
    let replay = hintstream::tools::replay::ReplayOptions {
        topic: Some(b.clone()),
        ..Default::default()
    };
    hintstream::tools::replay::replay(&producer, &file, &replay)
        .await
        .unwrap();
    let replayed = common::read_topic(&config, &b).await;

    let per_key = |messages: &[RecordedMessage]| {
        let mut by_key: HashMap<Vec<u8>, Vec<KeptMessage>> = HashMap::new();
        for m in messages {
            by_key
                .entry(m.key_bytes().unwrap().to_vec())
                .or_default()
                .push((m.value_bytes().unwrap().to_vec(), m.headers.clone()));
        }
        by_key
    };
    assert_eq!(
        per_key(&replayed),
        per_key(&recorded),
        "keys, bytes, headers and order"
    );
    for messages in [&recorded, &replayed] {
        let out = reassemble_steps(messages);
        assert_eq!(out.steps.len(), 2);
        for step in &out.steps {
            let want = if step.key == "run-r/1" { &one } else { &two };
            assert_eq!(
                step_strings(step, "trajectory_id"),
                common::strings(want, "trajectory_id")
            );
            assert_eq!(step_f64s(step, "reward"), common::f64s(want, "reward"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_too_large_for_one_message_dead_letters_its_step() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.advantages, "scored-big-row", "advantages-big-row");
    config.topics.metrics = common::unique("metrics-big-row");
    config.advantages.max_message_bytes = 64 * 1024;
    let a = config.advantages.clone();
    common::create_advantages_topics(&config, 1).await;
    let producer = create_producer(&config).unwrap();
    // Step 1: 2,000 ordinary rows and one whose trajectory_id alone is
    // 100 KB. Step 2: ordinary, published after it.
    let row = |step: i64, id: String| {
        serde_json::json!({"type": "scored_rollout", "schema_version": 1, "run_id": "run-b", "step": step,
            "instance_id": "g", "trajectory_id": id, "reward": 0.5, "is_hinted": false})
        .to_string()
    };
    let mut batch1: Vec<String> = (0..2_000).map(|i| row(1, format!("t{i}"))).collect();
    batch1.insert(1_000, row(1, "x".repeat(100_000)));
    for (step, rows) in [(1, batch1), (2, vec![row(2, "u1".into()), row(2, "u2".into())])] {
        let key = format!("run-b/{step}");
        for r in &rows {
            common::send(&producer, &a.input_topic, &key, r.as_bytes()).await;
        }
        let end = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "run-b", "step": step, "count": rows.len()});
        common::send(&producer, &a.input_topic, &key, end.to_string().as_bytes()).await;
    }
    let stage = AdvantageStage::build(config.clone()).await.unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let metrics_topic = config.topics.metrics.clone();
    let seen = consume_until(
        &config,
        &[(&a.dlq_topic, 1), (&metrics_topic, 1)],
        Duration::from_secs(120),
        |seen| {
            seen.iter().filter(|m| m.topic == a.dlq_topic).count() == 2_002
                && seen.iter().any(|m| m.topic == metrics_topic)
        },
        |seen| format!("{} messages", seen.len()),
    )
    .await;
    let output = common::read_topic(&config, &a.output_topic).await;
    running.stop().await;
    // Nothing of step 1 was published: not one chunk.
    let out = reassemble_steps(&output);
    assert_eq!(
        out.steps.iter().map(|s| s.key.as_str()).collect::<Vec<_>>(),
        ["run-b/2"]
    );
    assert!(output.iter().all(|m| m.key_bytes() == Some(&b"run-b/2"[..])));
    let dead: Vec<&RecordedMessage> = seen.iter().filter(|m| m.topic == a.dlq_topic).collect();
    let kind = header(dead[0], hintstream::kafka::DlqHeaders::ERROR_KIND);
    assert_eq!(kind, Some("output_rejected"));
    let reason = header(dead[0], hintstream::kafka::DlqHeaders::REASON).unwrap();
    assert!(
        reason.contains("row 1000") && reason.contains("raise advantages.max_message_bytes"),
        "{reason}"
    );
}
