//! Load script (not a timed test): the floor under stage 1's static path,
//! for `scripts/bench-static-hints.sh` (issue 34, P4). It moves the input
//! topic to an output topic with no hint work at all, but writes what
//! `hintstream hints` writes and keeps its guarantee:
//!
//! - every output record is a copy of one real hint (`--payload`, taken by
//!   the script from the worker's output) with that hint's headers
//!   (`--header`, the `traceparent` a fixed value of the same length), keyed
//!   like the input;
//! - an input's offset is stored only once its output and every output
//!   made before it from its partition were acknowledged (at-least-once, in
//!   order per partition), and librdkafka commits the stored offsets on its
//!   timer;
//! - the producer is idempotent with `acks=all` and `linger.ms=5`, the
//!   consumer stores offsets itself, as the worker's do (the worker's other
//!   settings, e.g. `message.timeout.ms`, cooperative rebalancing,
//!   statistics, are left at librdkafka's defaults here); jemalloc, as the
//!   worker's.
//!
//! It is built as cheaply as this crate's librdkafka allows, since a floor
//! is only worth its name if little is left under it: one thread polls a
//! `BaseConsumer` and a `BaseProducer`, and each delivery report comes back
//! through the producer's context, with the input's partition and place in
//! its opaque; each poll serves every report waiting. (Round twelve's floor
//! awaited an rdkafka `DeliveryFuture` a record, a oneshot channel and a
//! boxed future each, on tokio; side by side it spent 1.2-1.9 CPU s for
//! 200,000 messages where this design spent 0.9-1.3: docs/BENCHMARKS.md,
//! "Round thirteen".)
//!
//! What it leaves out is hintstream's own work: decoding and checking the
//! trajectory, the hint's making and encoding, its cache, the tracker and
//! the bounds (it takes input without a bound on what is in flight, save
//! librdkafka's queue). So the floor's time against the plain passthrough
//! is about what the broker and librdkafka cost for the worker's output,
//! and hintstream's time against the floor about the worker's own work.
//!
//! `--hint-work` puts the hint work back, on the same one thread: each
//! input decoded and checked (`decode_arrival`), its hint's id, the static
//! synthesis, the leak guard, the hint built and encoded as the cache keeps
//! it (the calls, in order, of `benches/static_hint.rs`'s `all`), and that
//! hint's bytes are the output instead of `--payload`'s. It leaves out the
//! rest of the worker (a task and a settlement a message, the bounds, the
//! cache, the learner's state, the tracker, the metrics, the traces): so it
//! is about the best a worker built like the floor could do, and
//! hintstream's time against it what that machinery costs. An input that
//! does not decode ends it with the decode's error (the bench's never do).
//! Neither side's time waits for its commits: both are timed to N records
//! on the output topic, so what the guarantee costs here is its bookkeeping
//! (delivery reports, stores).
//!
//!     cargo build --release --example static_floor
//!     target/release/examples/static_floor --bootstrap 127.0.0.1:9092 --group g \
//!         --input in --output out --payload hint.json \
//!         --header content-type=application/json --header traceparent=00-...
//!
//! Runs until stopped (SIGTERM or Ctrl-C), then stores what was
//! acknowledged; the script times it by its output topic's high
//! watermarks.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use futures::executor::block_on;
use hintstream::config::LlmConfig;
use hintstream::hints::cache::CachedHint;
use hintstream::hints::decode::decode_arrival;
use hintstream::hints::{build_hint, HintLabels};
use hintstream::kafka::produce::headers;
use hintstream::kafka::RecordMeta;
use hintstream::learn::{hint_id, STATIC_CHAIN};
use hintstream::llm::prompt::leak::{expected_values, repeated};
use hintstream::llm::synth::LlmEnv;
use hintstream::llm::Synthesizer;
use hintstream::messages::{DecodeLimits, DEFAULT_ARM};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

/// The worker's allocator (src/main.rs), so that the two allocate alike.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    about = "The floor under stage 1's static path: the hints' bytes and headers, the worker's guarantee, no hint work"
)]
struct Args {
    #[arg(long)]
    bootstrap: String,
    #[arg(long)]
    group: String,
    #[arg(long)]
    input: String,
    #[arg(long)]
    output: String,
    /// A file whose bytes every output record carries (one real hint).
    #[arg(long)]
    payload: PathBuf,
    /// A header every output record carries, as NAME=VALUE (repeat).
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// Acknowledged outputs between two stores of the inputs' offsets
    /// (also stored whenever nothing is left in flight).
    #[arg(long, default_value_t = 1000)]
    store_every: usize,
    /// Do stage 1's hint work on each input (decode, id, static synthesis,
    /// leak guard, build and encode) and send that hint, not `--payload`.
    #[arg(long)]
    hint_work: bool,
}

/// Stage 1's hint work on one input, with no model: what
/// `benches/static_hint.rs` times as `all`.
struct HintWork {
    synth: Synthesizer,
    prompt: String,
    limits: DecodeLimits,
}

impl HintWork {
    fn new() -> Result<Self> {
        let synth = Synthesizer::new(&LlmConfig::default(), &LlmEnv::default())
            .map_err(|e| anyhow!("a static synthesizer: {e}"))?;
        if !synth.chain_ids().is_empty() {
            bail!("the hint work is the static path's: no model may be configured");
        }
        Ok(HintWork {
            prompt: synth.prompt_version().to_string(),
            synth,
            limits: DecodeLimits::default(),
        })
    }

    /// The encoded hint for the input `payload` read at `meta`.
    fn hint(&self, payload: &[u8], meta: &RecordMeta) -> Result<Vec<u8>> {
        let arrival = decode_arrival(payload, meta, self.limits).map_err(|e| {
            anyhow!(
                "{}/{} offset {}: {}: {}",
                meta.topic,
                meta.partition,
                meta.offset,
                e.kind,
                e.reason
            )
        })?;
        let t = &arrival.trajectory;
        let id = hint_id(&arrival.group_key, &self.prompt, STATIC_CHAIN, DEFAULT_ARM);
        let synthesis = block_on(self.synth.synthesize(t));
        if !repeated(&synthesis.hint, &expected_values(t)).is_empty() {
            bail!(
                "{}/{} offset {}: the static hint repeats an expected value",
                meta.topic,
                meta.partition,
                meta.offset
            );
        }
        let hint = build_hint(id, t, meta, synthesis, HintLabels::default_arm(&self.prompt));
        Ok(CachedHint::new(hint).payload)
    }
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: give a header as NAME=VALUE"))?;
    Ok((name.to_string(), value.to_string()))
}

/// The producer's context: the delivery reports since they were last
/// taken, each an output's opaque (see [`Lanes::take`]) or why it failed.
/// Only the polling thread runs the callback, so the lock is never
/// contended.
#[derive(Default)]
struct Reports(Mutex<Vec<Result<usize, String>>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let report = result.as_ref().map(|_| opaque).map_err(|(e, _)| e.to_string());
        self.0.lock().expect("only the polling thread locks").push(report);
    }
}

/// The opaque's low bits hold the input partition, the rest its output's
/// place among that partition's.
const PARTITION_BITS: u32 = 16;

/// One input partition's outputs in flight, in the order taken: each
/// input's offset, and whether its output was acknowledged.
#[derive(Default)]
struct Lane {
    /// The place of `pending[0]`.
    first: usize,
    pending: VecDeque<(i64, bool)>,
}

/// Every input partition's lane, and the offsets acknowledged in order and
/// not yet stored.
#[derive(Default)]
struct Lanes {
    lanes: BTreeMap<i32, Lane>,
    next: BTreeMap<i32, i64>,
    since: usize,
}

impl Lanes {
    /// Takes an input in flight: the opaque its output carries.
    fn take(&mut self, partition: i32, offset: i64) -> Result<usize> {
        if !(0..1 << PARTITION_BITS).contains(&partition) {
            bail!(
                "input partition {partition}: the floor carries partitions below {}",
                1 << PARTITION_BITS
            );
        }
        let lane = self.lanes.entry(partition).or_default();
        let place = lane.first + lane.pending.len();
        lane.pending.push_back((offset, false));
        Ok((place << PARTITION_BITS) | partition as usize)
    }

    /// An output was acknowledged: its input, once every earlier one of its
    /// partition's was too, may be stored.
    fn acknowledged(&mut self, opaque: usize) {
        let partition = (opaque & ((1 << PARTITION_BITS) - 1)) as i32;
        let lane = self
            .lanes
            .get_mut(&partition)
            .expect("an output's partition has a lane");
        lane.pending[(opaque >> PARTITION_BITS) - lane.first].1 = true;
        while let Some(&(offset, true)) = lane.pending.front() {
            lane.pending.pop_front();
            lane.first += 1;
            self.next.insert(partition, offset + 1);
            self.since += 1;
        }
    }

    fn idle(&self) -> bool {
        self.lanes.values().all(|lane| lane.pending.is_empty())
    }

    fn store(&mut self, consumer: &BaseConsumer, topic: &str) -> Result<()> {
        if self.next.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (&partition, &next) in &self.next {
            tpl.add_partition_offset(topic, partition, Offset::Offset(next))?;
        }
        consumer.store_offsets(&tpl)?;
        self.next.clear();
        self.since = 0;
        Ok(())
    }
}

/// Set once SIGTERM or Ctrl-C arrives (on a thread of its own).
fn stop_on_signal() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        runtime.block_on(async {
            #[cfg(unix)]
            {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("a SIGTERM handler");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
        });
        flag.store(true, Ordering::Relaxed);
    });
    Ok(stop)
}

/// Outputs produced between two polls of the producer (its delivery
/// reports) while input keeps coming.
const POLL_EVERY: usize = 256;

/// Serves every delivery report the producer has waiting (a poll with no
/// timeout serves one event, a batch's reports for one partition) and
/// applies them to `lanes`.
fn settle(producer: &BaseProducer<Reports>, lanes: &mut Lanes) -> Result<()> {
    loop {
        producer.poll(Duration::ZERO);
        let reports = std::mem::take(&mut *producer.context().0.lock().expect("only this thread locks"));
        if reports.is_empty() {
            return Ok(());
        }
        for report in reports {
            let opaque = report.map_err(|e| anyhow!("an output was not acknowledged: {e}"))?;
            lanes.acknowledged(opaque);
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let payload =
        std::fs::read(&args.payload).with_context(|| format!("reading {}", args.payload.display()))?;
    let headers = headers(
        args.headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str())),
    );
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        // The worker's: a full prefetch queue pauses fetching 10 ms, not
        // librdkafka's 1000, and a fetch asks up to 16 MiB of a partition
        // (a quarter of its 64 MiB queue; src/kafka/settings.rs).
        .set("fetch.queue.backoff.ms", "10")
        .set("max.partition.fetch.bytes", (16 << 20).to_string())
        .create()?;
    consumer.subscribe(&[&args.input])?;
    let producer: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create_with_context(Reports::default())?;
    let work = args.hint_work.then(HintWork::new).transpose()?;
    let input_topic: Arc<str> = args.input.as_str().into();
    let stop = stop_on_signal()?;
    let mut lanes = Lanes::default();
    let mut unpolled = 0;
    while !stop.load(Ordering::Relaxed) {
        // Waits only when nothing is left to poll the producer for.
        let wait = if unpolled > 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        match consumer.poll(wait) {
            None => {
                settle(&producer, &mut lanes)?;
                unpolled = 0;
            }
            Some(message) => {
                let message = message?;
                let hinted = match &work {
                    Some(work) => {
                        // As the worker's intake copies it out.
                        let meta = RecordMeta::copied(&message, input_topic.clone());
                        Some(work.hint(message.payload().unwrap_or_default(), &meta)?)
                    }
                    None => None,
                };
                let opaque = lanes.take(message.partition(), message.offset())?;
                let mut record: BaseRecord<'_, [u8], [u8], usize> =
                    BaseRecord::with_opaque_to(&args.output, opaque)
                        .payload(hinted.as_deref().unwrap_or(payload.as_slice()))
                        .headers(headers.clone());
                if let Some(key) = message.key() {
                    record = record.key(key);
                }
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                            // Delivery reports make room.
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            record = returned;
                            producer.poll(Duration::from_millis(10));
                            settle(&producer, &mut lanes)?;
                        }
                        Err((e, _)) => bail!("producing to {}: {e}", args.output),
                    }
                }
                unpolled += 1;
                if unpolled >= POLL_EVERY {
                    settle(&producer, &mut lanes)?;
                    unpolled = 0;
                }
            }
        }
        if lanes.since >= args.store_every || (lanes.since > 0 && lanes.idle()) {
            lanes.store(&consumer, &args.input)?;
        }
    }
    // What is in flight is delivered (or not) within the flush's bound;
    // what was acknowledged is stored.
    let flushed = producer.flush(Duration::from_secs(10));
    settle(&producer, &mut lanes)?;
    lanes.store(&consumer, &args.input)?;
    flushed.context("flushing the floor's outputs at its stop")?;
    Ok(())
}
