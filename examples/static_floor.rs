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
//!   produced before it were acknowledged (at-least-once, in order per
//!   partition), and librdkafka commits the stored offsets on its timer;
//! - the producer is idempotent with `acks=all` and `linger.ms=5`, the
//!   consumer stores offsets itself, as the worker's do (the worker's other
//!   settings, e.g. `message.timeout.ms`, cooperative rebalancing,
//!   statistics, are left at librdkafka's defaults here); jemalloc, as the
//!   worker's.
//!
//! What it leaves out is hintstream's own work: decoding and checking the
//! trajectory, the hint's making and encoding, its cache, the tracker and
//! the bounds (it takes input without a bound on what is in flight). So the
//! floor's time against the plain passthrough is about what the broker and
//! librdkafka cost for the worker's output, and hintstream's time against
//! the floor about the worker's own work. Neither side's time waits for its
//! commits: both are timed to N records on the output topic, so what the
//! guarantee costs here is its bookkeeping (delivery reports, stores).
//!
//!     cargo build --release --example static_floor
//!     target/release/examples/static_floor --bootstrap 127.0.0.1:9092 --group g \
//!         --input in --output out --payload hint.json \
//!         --header content-type=application/json --header traceparent=00-...
//!
//! Runs until stopped (SIGTERM or Ctrl-C); the script times it by its
//! output topic's high watermarks.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use hintstream::kafka::produce::headers;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

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
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: give a header as NAME=VALUE"))?;
    Ok((name.to_string(), value.to_string()))
}

/// An output in flight: its delivery, and the input it was made from.
type InFlight = std::pin::Pin<Box<dyn std::future::Future<Output = (Result<(), String>, i32, i64)> + Send>>;

fn in_flight(delivery: DeliveryFuture, partition: i32, offset: i64) -> InFlight {
    Box::pin(async move {
        let result = match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(e.to_string()),
            Err(_) => Err("the producer dropped the delivery".to_string()),
        };
        (result, partition, offset)
    })
}

/// The inputs' offsets acknowledged and not yet stored, by partition.
struct Stores<'a> {
    consumer: &'a StreamConsumer,
    topic: &'a str,
    next: BTreeMap<i32, i64>,
    since: usize,
}

impl Stores<'_> {
    /// One output (and every one before it) was acknowledged.
    fn acknowledged(&mut self, partition: i32, offset: i64) {
        self.next.insert(partition, offset + 1);
        self.since += 1;
    }

    fn store(&mut self) -> Result<()> {
        if self.next.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (&partition, &next) in &self.next {
            tpl.add_partition_offset(self.topic, partition, Offset::Offset(next))?;
        }
        self.consumer.store_offsets(&tpl)?;
        self.next.clear();
        self.since = 0;
        Ok(())
    }
}

/// Takes the oldest output's outcome: its input (and every one before it)
/// may be stored.
fn settle(outcome: (Result<(), String>, i32, i64), stores: &mut Stores<'_>) -> Result<()> {
    let (result, partition, offset) = outcome;
    if let Err(e) = result {
        bail!("an output was not acknowledged: {e}");
    }
    stores.acknowledged(partition, offset);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let payload =
        std::fs::read(&args.payload).with_context(|| format!("reading {}", args.payload.display()))?;
    let headers = headers(
        args.headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str())),
    );
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .create()?;
    consumer.subscribe(&[&args.input])?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()?;
    let mut pending: FuturesOrdered<InFlight> = FuturesOrdered::new();
    let mut stores = Stores {
        consumer: &consumer,
        topic: &args.input,
        next: BTreeMap::new(),
        since: 0,
    };
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        #[cfg(unix)]
        let terminated = term.recv();
        #[cfg(not(unix))]
        let terminated = std::future::pending::<Option<()>>();
        tokio::select! {
            biased;
            _ = &mut stop => break,
            _ = terminated => break,
            Some(outcome) = pending.next(), if !pending.is_empty() => {
                settle(outcome, &mut stores)?;
                if stores.since >= args.store_every || pending.is_empty() {
                    stores.store()?;
                }
            }
            message = consumer.recv() => {
                let message = message?;
                let (partition, offset) = (message.partition(), message.offset());
                let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&args.output)
                    .payload(payload.as_slice())
                    .headers(headers.clone());
                if let Some(key) = message.key() {
                    record = record.key(key);
                }
                loop {
                    match producer.send_result(record) {
                        Ok(delivery) => {
                            pending.push_back(in_flight(delivery, partition, offset));
                            break;
                        }
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                            // The producer's queue is full: the oldest output's
                            // acknowledgement makes room.
                            record = returned;
                            let Some(outcome) = pending.next().await else {
                                bail!("the producer's queue is full with nothing in flight");
                            };
                            settle(outcome, &mut stores)?;
                        }
                        Err((e, _)) => bail!("producing to {}: {e}", args.output),
                    }
                }
            }
        }
    }
    stores.store()?;
    Ok(())
}
