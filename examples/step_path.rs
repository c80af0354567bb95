//! Load script (not a timed test) for stage 2's whole step path on a real
//! broker: a step of N scored rows goes in as JSON rows (one
//! `scored_rollout` message a row) or as Arrow IPC (the rows' batch from
//! `ScoredRows::to_batch`, `instance_id` dictionary-encoded, cut into
//! messages under 900,000 bytes by `batch::chunk::encode_chunks`, with the
//! chunk headers), closed by its `step_end`; a `hintstream advantages`
//! worker started here decodes, assembles, computes, encodes and publishes
//! it; a reader here consumes every advantages chunk and the step's
//! metrics message.
//!
//! **What is timed.** From the moment the broker acknowledged the last
//! input message (the `step_end`) to the moment the reader holds the step's
//! metrics message and every chunk (the metrics are published after the
//! last chunk). Producing the input is not in it: the time from the first
//! send to the last acknowledgement is reported on its own (`produce s`),
//! and the worker consumes, decodes and assembles while the input is still
//! being produced, as it would behind a real trainer (with `--backlog`,
//! it does not: each side is held while the step is produced, and timed
//! from the moment it is let go on, as a worker restarted, or given a
//! partition, with a step waiting). Also reported, per
//! step: `intake` (from the last acknowledgement until the worker's
//! `messages_received` counter covers every input message: the fetch,
//! decode and assembly it had left), `compute` (the increase of the
//! worker's `compute_seconds` histogram sum: the step's parts put
//! together, string ids to dense ids, the kernel and, beside it, the
//! step's metrics), both read from its Prometheus endpoint (intake polled
//! every 10 ms).
//!
//! **Baseline.** The same input, produced the same way to a topic of its
//! own, read by an echo in this process that does no work on it: once it
//! has every message of the step it publishes as many messages of the same
//! sizes as the worker's advantages chunks (`--echo-in-flight` at a time)
//! and a small metrics message, through a producer that holds them as the
//! worker's output producer does (`kafka::Linger::Off`: no `linger.ms`),
//! which the same reader times. What is
//! left between the two is hintstream's own work; what the echo takes is
//! the broker's (and librdkafka's). The two run a step each in turn, after
//! `--warm-ups` untimed steps of each size through both: run one side's
//! steps all first, and the other ran on a broker that had warmed up on
//! them (a broker started for the run compiles its hot paths during the
//! first large steps, and its CPU is this machine's too).
//!
//! **`--learning`** (hints that learn, as a run with `[[hints.arms]]` or
//! an outcomes topic has it): each hinted row names its group's hint
//! (`hint_id`); before the worker starts, a hint for every group is written
//! to the hints topic in one transaction, as stage 1 writes under
//! exactly_once (so each partition ends with a commit marker), and the
//! worker reads it; for each step it passes its read barrier on the hints
//! topic and publishes an outcome a hint (one for most groups that have a
//! hinted row) before its metrics, with the per-arm metrics of what it
//! read. The echo publishes as many outcomes of the same shape before its
//! metrics.
//!
//! **`--floor`** (a third side, since 2026-12-06): the echo again, on
//! topics of its own, doing on its one task the work no worker can leave
//! out, with none of the worker's machinery (no tracker, bounds, tasks or
//! acknowledgements a message): each message's metadata copied out of
//! librdkafka (`RecordMeta::copied`) and decoded (`decode_scored`, as the
//! worker's configuration has it), its rows put into one step and their
//! group ids mapped and their `trajectory_id`s hashed as they come
//! (`HashedGroups::extend`); once every message is in, the duplicates
//! check's bit array (`LowBitClashes`) and, off the async threads as the
//! worker does, the kernel
//! (`compute_grouped`), the step's metrics (`step_metrics`) and its Arrow
//! chunks (`encode_chunks`, all of them before the first leaves, where the
//! worker sends each as the next is encoded); then those chunks and
//! metrics, sent as the echo sends. About the best a worker could do on
//! this machine: the worker ÷ the floor is what its machinery costs, the
//! floor ÷ the echo what the work itself does.
//!
//! Rows: 8 a group, string ids like a trainer's (`swe-task-00012345`),
//! shuffled (`--grouped`: a group's rows side by side), 30% reward 1 and the rest in [0, 0.5), 10% hinted (as
//! `benches/advantages.rs`).
//!
//! Every wait has a deadline (`--deadline-secs`) and says what it waited
//! for when it expires.
//!
//!     cargo build --release --bin hintstream --example step_path
//!     target/release/examples/step_path --bootstrap 127.0.0.1:9092 \
//!         [--rows 16000,64000,1000000] [--repeats 3] [--formats json,arrow] \
//!         [--json-max-rows N] [--hintstream PATH] [--no-baseline] [--floor]
//!
//! Progress goes to stderr; the Markdown tables to stdout.

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use hintstream::advantages::compute::{advantages_batch, compute_grouped};
use hintstream::advantages::decode::{decode_scored_bounded, ScoredInput};
use hintstream::advantages::step_metrics::{step_metrics, MetricOptions};
use hintstream::batch::chunk::{chunk_header_values, encode_chunks, ChunkInfo};
use hintstream::batch::synthetic::{in_group_order, synthetic_step};
use hintstream::batch::{ScoredRows, ARROW_STREAM_CONTENT_TYPE};
use hintstream::config::{ClientKind, Config};
use hintstream::kafka::admin::{create_topics, TopicOutcome};
use hintstream::kafka::client_config;
use hintstream::kafka::produce::headers;
use hintstream::kafka::{base_config, create_producer, create_producer_lingering, Linger, RecordMeta};
use hintstream::messages::{
    step_key, Hint, HintCategory, HintOutcome, HintSource, ScoredMessage, StepEnd, Usage, DEFAULT_ARM,
};
use hintstream::normalize::clashes::clashing_rows;
use hintstream::normalize::groups::HashedGroups;
use hintstream::normalize::DenseGroups;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

const GROUP_SIZE: usize = 8;
/// The largest input message: under librdkafka's `message.max.bytes`.
const INPUT_MESSAGE_BYTES: usize = 900_000;
/// Input messages in flight at once while producing.
const PRODUCE_WINDOW: usize = 10_000;
const RUN_ID: &str = "steppath";

#[derive(Debug, Parser)]
#[command(about = "Times stage 2's whole step path on a running broker (see the source's doc comment)")]
struct Args {
    /// The broker, HOST:PORT.
    #[arg(long)]
    bootstrap: String,
    /// Step sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16000,64000,1000000")]
    rows: Vec<usize>,
    /// Steps per size and format (median and min are reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Input formats, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "json,arrow")]
    formats: Vec<Format>,
    /// JSON steps above this many rows are skipped (one message a row).
    #[arg(long, default_value_t = usize::MAX)]
    json_max_rows: usize,
    /// The hintstream binary [default: `hintstream` beside this example's
    /// folder, i.e. target/release/hintstream].
    #[arg(long)]
    hintstream: Option<PathBuf>,
    /// Skip the broker-only echo baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Bound of every wait: producing one step, and its way back.
    #[arg(long, default_value_t = 900)]
    deadline_secs: u64,
    /// `fetch.wait.max.ms` of every consumer (the worker's, the reader's,
    /// the echo's) [default: librdkafka's, 500].
    #[arg(long)]
    fetch_wait_ms: Option<u32>,
    /// Folder for the worker's config and log [default: a fresh one under
    /// the system temp folder].
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Output messages the echo keeps in the producer at once: the worker's
    /// chunks in flight by default (`kafka::IDEMPOTENT_IN_FLIGHT`, 5; 8
    /// before 2026-12-04), 1 for one acknowledgement after another (the
    /// worker's sending before 2026-12-02).
    #[arg(long, default_value_t = hintstream::kafka::IDEMPOTENT_IN_FLIGHT)]
    echo_in_flight: usize,
    /// Untimed steps of each size and format before the timed ones,
    /// through hintstream and the echo in turn.
    #[arg(long, default_value_t = 1)]
    warm_ups: usize,
    /// Print each step's first send, last acknowledgement and way back as
    /// wall-clock times (UTC) on stderr, to line up with the worker's log
    /// (run it with `RUST_LOG=info,hintstream::advantages::publish=debug`
    /// through a `--hintstream` wrapper for the end of its compute).
    #[arg(long)]
    wall_times: bool,
    /// Rows of a group side by side, as GRPO samples them (and as a
    /// trainer's messages then carry their `instance_id` dictionaries, a
    /// value every few rows), instead of shuffled across the step.
    #[arg(long)]
    grouped: bool,
    /// Each step waits whole on its topic before it is taken, as after a
    /// worker's restart or a partition moved to a new owner: the worker is
    /// stopped (SIGSTOP) while the step is produced and let go on
    /// (SIGCONT) at its last acknowledgement; the echo's consumer is made
    /// and connected before the step is produced and assigned the step's
    /// first offset then. Each side is timed from then. (A fetch the
    /// stopped worker had asked before may be answered while it is
    /// stopped, as far as its socket's buffer takes.)
    #[arg(long)]
    backlog: bool,
    /// Hints that learn: each hinted row names its group's hint
    /// (`hint_id`), a hint for every group is written to a hints topic in
    /// one transaction, and the worker reads it and publishes one outcome a
    /// hint before the step's metrics.
    #[arg(long)]
    learning: bool,
    /// A third side, the floor: the echo doing the work no worker can
    /// leave out (decode, assemble, compute, metrics, encode) on one task
    /// (see the doc comment). Not with --no-baseline.
    #[arg(long, conflicts_with = "no_baseline")]
    floor: bool,
    /// The worker under `kafka.delivery = "exactly_once"` (worker id
    /// `steppath-0`): a step's outputs are held and committed in its
    /// transactions, and the reader here reads read_committed. The
    /// baselines are unchanged (no transactions).
    #[arg(long)]
    exactly_once: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
enum Format {
    Json,
    Arrow,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Json => "JSON rows",
            Format::Arrow => "Arrow IPC",
        }
    }
}

/// Who turns the input into the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Via {
    Hintstream,
    Echo,
    /// `--floor`.
    Floor,
}

impl Via {
    /// How the progress lines name a baseline side.
    fn name(self) -> &'static str {
        match self {
            Via::Hintstream => "hintstream",
            Via::Echo => "echo",
            Via::Floor => "floor",
        }
    }
}

/// `n` rows of one step, with string ids like a trainer's: shuffled, or
/// `grouped` (each group's rows side by side).
fn step_rows(n: usize, grouped: bool, learning: bool) -> ScoredRows {
    let mut rows = synthetic_step(n, GROUP_SIZE, RUN_ID, 0, 42);
    if learning {
        rows.hint_id = (0..rows.len())
            .map(|row| {
                rows.is_hinted[row].then(|| format!("hint-{}", rows.instance_id.get(row).unwrap_or_default()))
            })
            .collect();
    }
    match grouped {
        true => in_group_order(&rows),
        false => rows,
    }
}

/// An outcome (key, JSON) for each hint the rows of step `step` name, as
/// many and about as large as the worker's.
fn hint_outcomes(rows: &ScoredRows, step: i64) -> Vec<(String, Vec<u8>)> {
    let mut seen = std::collections::HashSet::new();
    (0..rows.len())
        .filter_map(|row| {
            let hint_id = rows.hint_id.get(row)?.as_ref()?;
            seen.insert(hint_id.clone()).then(|| {
                let outcome = HintOutcome {
                    schema_version: 1,
                    hint_id: hint_id.clone(),
                    run_id: RUN_ID.to_string(),
                    step,
                    instance_id: rows.instance_id.get(row).unwrap_or_default().to_string(),
                    hinted_rollouts: 1,
                    successes: 0,
                    rescued: false,
                    mean_reward: 0.25,
                    transfer: None,
                    reliance: None,
                    created_at: "2026-12-06T00:00:00.000000Z".to_string(),
                };
                (
                    outcome.key(),
                    serde_json::to_vec(&outcome).expect("an outcome serialises"),
                )
            })
        })
        .collect()
}

/// `--learning`: a hint for each group of `rows` (`hint-<instance_id>`,
/// what the hinted rows name), as stage 1 writes a static hint of its
/// implicit arm, written to `topic` in one transaction, as stage 1 writes
/// under exactly_once: each partition of the topic then ends with a commit
/// marker, an offset with no record. Returns how many.
async fn write_hints(config: &Config, topic: &str, rows: &ScoredRows) -> Result<usize> {
    use rdkafka::producer::Producer;
    let mut settings = base_config(config);
    settings.set(
        "transactional.id",
        format!("steppath-hints-{}", rand::random::<u32>()),
    );
    let producer: FutureProducer = settings.create()?;
    let bound = Duration::from_secs(60);
    producer.init_transactions(bound)?;
    producer.begin_transaction()?;
    let mut seen = std::collections::HashSet::new();
    let mut sends = Vec::new();
    for row in 0..rows.len() {
        let instance = rows.instance_id.get(row).unwrap_or_default();
        if !seen.insert(instance.to_string()) {
            continue;
        }
        let hint = Hint {
            schema_version: 1,
            hint_id: format!("hint-{instance}"),
            run_id: RUN_ID.to_string(),
            step: 0,
            instance_id: instance.to_string(),
            trajectory_id: format!("{instance}-r0"),
            hint: "Print the result in the format check_output expects.".to_string(),
            category: HintCategory::StaticFallback,
            model: None,
            prompt_version: "v1".to_string(),
            latency_ms: 0,
            usage: Usage::default(),
            cost_usd: 0.0,
            failure_reason: None,
            source: HintSource {
                topic: "rl.trajectories.failed".to_string(),
                partition: 0,
                offset: row as i64,
            },
            created_at: "2026-12-06T00:00:00.000Z".to_string(),
            arm: DEFAULT_ARM.to_string(),
            refines: Vec::new(),
            hint_truncated: false,
            hedged: false,
            leak: false,
            level: None,
        };
        sends.push((
            hintstream::messages::group_key(RUN_ID, 0, instance),
            serde_json::to_vec(&hint)?,
        ));
    }
    let count = sends.len();
    let sent = futures::future::join_all(
        sends
            .iter()
            .map(|(key, payload)| producer.send(FutureRecord::to(topic).key(key).payload(payload), bound)),
    )
    .await;
    for result in sent {
        result.map_err(|(e, _)| format!("writing a hint to {topic}: {e}"))?;
    }
    producer.commit_transaction(bound)?;
    Ok(count)
}

/// One input message.
struct Input {
    payload: Vec<u8>,
    /// Chunk headers of an Arrow message (content-type added on send).
    chunk: Option<[(&'static str, String); 3]>,
}

/// The input messages of step `step` (without its `step_end`).
fn encode_input(rows: &mut ScoredRows, step: i64, format: Format) -> Result<Vec<Input>> {
    rows.step.iter_mut().for_each(|s| *s = step);
    match format {
        Format::Json => (0..rows.len())
            .map(|i| {
                // Synthetic rows: no hint ids, lengths or logprobs.
                let row = ScoredMessage::ScoredRollout(rows.rollout(i));
                Ok(Input {
                    payload: serde_json::to_vec(&row)?,
                    chunk: None,
                })
            })
            .collect(),
        Format::Arrow => {
            let chunks = encode_chunks(&rows.to_batch()?, INPUT_MESSAGE_BYTES)?;
            let count = chunks.len();
            Ok(chunks
                .chunks
                .into_iter()
                .enumerate()
                .map(|(i, c)| Input {
                    payload: c.payload,
                    chunk: Some(chunk_header_values(i, count, rows.len())),
                })
                .collect())
        }
    }
}

fn step_end(step: i64, count: usize) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(&ScoredMessage::StepEnd(StepEnd {
        schema_version: 1,
        run_id: RUN_ID.into(),
        step,
        count: count as i64,
    }))?)
}

/// Messages of a step in the producer at once: a step's Arrow chunks as
/// the Python client sends them, as many as the idempotent producer sends
/// at once (more spin its broker thread: `kafka::IDEMPOTENT_IN_FLIGHT`);
/// JSON rows [`PRODUCE_WINDOW`].
fn window(messages: &[Input]) -> usize {
    if messages.iter().any(|m| m.chunk.is_some()) {
        hintstream::kafka::IDEMPOTENT_IN_FLIGHT
    } else {
        PRODUCE_WINDOW
    }
}

/// Produces `messages` (up to [`window`] in flight), then the
/// `step_end` once they are all acknowledged. Returns when the `step_end`
/// is acknowledged.
async fn produce_step(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    messages: &[Input],
    end: &[u8],
    deadline: Duration,
) -> Result<()> {
    let bar = (messages.len() > 20_000).then(|| {
        let bar = indicatif::ProgressBar::new(messages.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("  producing {pos}/{len} {per_sec} eta {eta}")
                .expect("a valid template"),
        );
        bar
    });
    let all = async {
        let mut sends = futures::stream::iter(messages)
            .map(|m| {
                let mut record = FutureRecord::to(topic).key(key).payload(&m.payload);
                if let Some(chunk) = &m.chunk {
                    record = record.headers(headers(
                        [("content-type", ARROW_STREAM_CONTENT_TYPE)]
                            .into_iter()
                            .chain(chunk.iter().map(|(k, v)| (*k, v.as_str()))),
                    ));
                }
                producer.send(record, Duration::from_secs(60))
            })
            .buffer_unordered(window(messages));
        while let Some(sent) = sends.next().await {
            sent.map_err(|(e, _)| format!("producing to {topic}: {e}"))?;
            if let Some(bar) = &bar {
                bar.inc(1);
            }
        }
        producer
            .send(
                FutureRecord::to(topic).key(key).payload(end),
                Duration::from_secs(60),
            )
            .await
            .map_err(|(e, _)| format!("producing the step_end to {topic}: {e}"))?;
        Ok::<(), Error>(())
    };
    let result = tokio::time::timeout(deadline, all).await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    result.map_err(|_| {
        format!(
            "producing {} messages of step {key} to {topic} took more than {deadline:?}",
            messages.len()
        )
    })?
}

/// A message the reader consumed from an output topic.
#[derive(Debug)]
struct Seen {
    topic: String,
    key: String,
    at: Instant,
    bytes: usize,
    chunk: Option<ChunkInfo>,
    /// `advantage/rows` of a metrics message.
    metric_rows: Option<f64>,
}

/// A consumer of partition 0 of each of `topics` from its first offset, in
/// a group of its own (`PREFIX-<random>`) that commits nothing.
fn from_the_start(config: &Config, prefix: &str, topics: &[&str]) -> Result<StreamConsumer> {
    from_the_start_reading(config, prefix, topics, false)
}

/// [`from_the_start`], reading only what transactions committed when
/// `committed` (read_committed).
fn from_the_start_reading(
    config: &Config,
    prefix: &str,
    topics: &[&str],
    committed: bool,
) -> Result<StreamConsumer> {
    let mut client = own_group_client(config, prefix);
    if committed {
        client.set("isolation.level", "read_committed");
    }
    let consumer: StreamConsumer = client.create()?;
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// A consumer in a group of its own (`PREFIX-<random>`) that commits
/// nothing, assigned nothing yet.
fn own_group_consumer(config: &Config, prefix: &str) -> Result<StreamConsumer> {
    Ok(own_group_client(config, prefix).create()?)
}

/// [`own_group_consumer`]'s settings.
fn own_group_client(config: &Config, prefix: &str) -> rdkafka::ClientConfig {
    let mut client = client_config(config, ClientKind::Consumer);
    client
        .set("group.id", format!("{prefix}-{}", rand::random::<u32>()))
        .set("enable.auto.commit", "false");
    client
}

/// Reads `topics` (one partition each, from the start) into a channel;
/// `committed`: only what transactions committed (read_committed).
fn start_reader(config: &Config, topics: &[&str], committed: bool) -> Result<mpsc::UnboundedReceiver<Seen>> {
    let consumer = from_the_start_reading(config, "steppath-reader", topics, committed)?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let m = match consumer.recv().await {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("reader: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let at = Instant::now();
            let header = |name: &str| {
                m.headers()
                    .and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
            };
            let metrics = header("content-type") == Some(b"application/json".as_slice());
            let seen = Seen {
                topic: m.topic().to_string(),
                key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                at,
                bytes: m.payload().map_or(0, <[u8]>::len),
                chunk: (!metrics).then(|| ChunkInfo::from_headers(header).ok()).flatten(),
                metric_rows: metrics
                    .then(|| {
                        serde_json::from_slice::<serde_json::Value>(m.payload().unwrap_or_default()).ok()
                    })
                    .flatten()
                    .and_then(|v| v["advantage/rows"].as_f64()),
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// What the echo expects next, and when it had all of it.
#[derive(Default)]
struct EchoPlan {
    key: String,
    messages: usize,
    rows: usize,
    output_sizes: Vec<usize>,
    /// `--learning`: the step's hint outcomes (key, JSON), one a hint, as
    /// the worker publishes them before its metrics.
    outcomes: Vec<(String, Vec<u8>)>,
    received: usize,
    all_in: Option<Instant>,
}

/// A baseline's topics: its input, output and metrics, and with
/// `--learning` its hint outcomes.
#[derive(Clone)]
struct SideTopics {
    input: String,
    output: String,
    metrics: String,
    outcomes: Option<String>,
}

impl SideTopics {
    /// `PREFIX-in`, `PREFIX-out`, `PREFIX-metrics` (and `PREFIX-outcomes`)
    /// through `name`.
    fn named(name: &impl Fn(&str) -> String, prefix: &str, learning: bool) -> SideTopics {
        SideTopics {
            input: name(&format!("{prefix}-in")),
            output: name(&format!("{prefix}-out")),
            metrics: name(&format!("{prefix}-metrics")),
            outcomes: learning.then(|| name(&format!("{prefix}-outcomes"))),
        }
    }
}

/// The broker-only baseline: consumes the echo's input and, once the
/// planned step's messages are all in, publishes messages of the planned
/// sizes on `output` (`in_flight` at a time, as the worker sends its
/// chunks), with `--learning` the step's hint outcomes on `outcomes` (all
/// at once), and a metrics message. With `worked` (`--floor`) it does the
/// work no worker can leave out on the way ([`FloorWork`]), and publishes
/// the chunks and metrics that work made.
#[derive(Clone)]
struct Echo {
    config: Config,
    topics: SideTopics,
    plan: Arc<Mutex<EchoPlan>>,
    in_flight: usize,
    worked: bool,
    // As the worker's output producer holds a step's outputs.
    producer: FutureProducer,
}

/// `--floor`: a step's rows as they come, decoded and put together with
/// their group ids and their `trajectory_id`s' hashes (for the duplicates
/// check), on the echo's one task.
#[derive(Default)]
struct FloorWork {
    topic: Option<Arc<str>>,
    rows: ScoredRows,
    groups: HashedGroups,
    hasher: foldhash::fast::RandomState,
    hashes: Vec<u64>,
}

impl FloorWork {
    /// Copies `m`'s metadata out, decodes it and puts its rows in.
    fn take(&mut self, config: &Config, m: &BorrowedMessage<'_>) {
        let topic = self.topic.get_or_insert_with(|| Arc::from(m.topic())).clone();
        let meta = RecordMeta::copied(m, topic);
        let decoded = decode_scored_bounded(
            m.payload().unwrap_or_default(),
            &meta,
            config.decode_limits(),
            config.limits.max_decoded_bytes,
        );
        match decoded {
            Ok(ScoredInput::Row(row)) => {
                self.groups.extend(std::iter::once(row.instance_id.as_str()));
                self.hashes.push(self.hasher.hash_one(&row.trajectory_id));
                self.rows.push(&row);
            }
            Ok(ScoredInput::Rows(rows, _)) => {
                self.groups.extend(rows.instance_id.iter());
                let hasher = &self.hasher;
                self.hashes
                    .extend(rows.trajectory_id.iter().map(|id| hasher.hash_one(id)));
                self.rows.extend(*rows);
            }
            Ok(ScoredInput::End { .. }) => {}
            Err(e) => eprintln!("floor: offset {}: {} ({})", meta.offset, e.reason, e.kind),
        }
    }

    /// The step's advantages as Arrow chunks under the worker's message
    /// bound, and its metrics as the worker sends them; the rows taken so
    /// far are gone after it.
    fn finish(&mut self, config: &Config) -> Result<(Vec<Vec<u8>>, Vec<u8>)> {
        // The worker's duplicates check: the hashes whose low bits clash,
        // those sorted, and the ids of equal ones compared (the bench's ids
        // are distinct: nothing is dropped).
        let suspects = clashing_rows(&std::mem::take(&mut self.hashes), 8, 1 << 23);
        let ids = &self.rows.trajectory_id;
        let same = |a: u32, b: u32| ids.get(a as usize) == ids.get(b as usize);
        if suspects
            .windows(2)
            .any(|w| w[0].0 == w[1].0 && same(w[0].1, w[1].1))
        {
            eprintln!("floor: a trajectory_id twice in a step; the floor does not drop duplicates");
        }
        let rows = std::mem::take(&mut self.rows);
        let groups = std::mem::take(&mut self.groups)
            .finish()
            .unwrap_or_else(|| DenseGroups::from_strings(rows.instance_id.iter()));
        let normalize = &config.normalize;
        let result = compute_grouped(rows, groups, &normalize.options(), normalize.device)?;
        let metrics = step_metrics(
            &result.rows,
            &result.groups,
            &result.advantages,
            &MetricOptions::from(&config.advantages),
        );
        let batch = advantages_batch(&result.rows, &result.advantages, normalize.hinted_weight)?;
        // The worker's envelope (key, headers, framing) is under a KiB.
        let room = config.advantages.max_message_bytes.saturating_sub(1024);
        let chunks = encode_chunks(&batch, room)?;
        let chunks = chunks.chunks.into_iter().map(|c| c.payload).collect();
        Ok((chunks, serde_json::to_vec(&metrics)?))
    }
}

impl Echo {
    fn new(
        config: &Config,
        topics: &SideTopics,
        plan: Arc<Mutex<EchoPlan>>,
        in_flight: usize,
        worked: bool,
    ) -> Result<Echo> {
        Ok(Echo {
            config: config.clone(),
            topics: topics.clone(),
            plan,
            in_flight: in_flight.max(1),
            worked,
            producer: create_producer_lingering(config, Linger::Off)?,
        })
    }

    /// A consumer of the echo's input, in a group of its own, not yet
    /// assigned; connected (a metadata request, and a committed-offsets
    /// one to its group's coordinator) so that a `--backlog` step is not
    /// timed with its connections made.
    async fn connected_consumer(&self) -> Result<StreamConsumer> {
        let consumer = own_group_consumer(&self.config, "steppath-echo")?;
        let topic = self.topics.input.clone();
        // Blocking calls, off the runtime's threads; the consumer comes back.
        tokio::task::spawn_blocking(move || -> Result<StreamConsumer> {
            consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, 0);
            consumer.committed_offsets(tpl, Duration::from_secs(10))?;
            Ok(consumer)
        })
        .await?
    }

    /// Echoes every planned step `consumer` brings, until aborted.
    fn spawn(&self, consumer: StreamConsumer) -> tokio::task::JoinHandle<()> {
        let echo = self.clone();
        tokio::spawn(async move {
            let mut floor = FloorWork::default();
            loop {
                let Ok(m) = consumer.recv().await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let job = {
                    let mut p = echo.plan.lock().expect("echo plan");
                    if m.key() != Some(p.key.as_bytes()) {
                        continue;
                    }
                    p.received += 1;
                    let all_in = p.received == p.messages;
                    if all_in {
                        p.all_in = Some(Instant::now());
                    }
                    all_in.then(|| (p.key.clone(), p.rows, p.output_sizes.clone(), p.outcomes.clone()))
                };
                if echo.worked {
                    floor.take(&echo.config, &m);
                }
                let Some((key, rows, sizes, outcomes)) = job else {
                    continue;
                };
                let (payloads, metrics) = if echo.worked {
                    let (config, mut work) = (echo.config.clone(), std::mem::take(&mut floor));
                    // Off the async threads, as the worker computes.
                    match tokio::task::spawn_blocking(move || work.finish(&config)).await {
                        Ok(Ok(made)) => made,
                        Ok(Err(e)) => {
                            eprintln!("floor: step {key}: {e}");
                            continue;
                        }
                        Err(e) => {
                            eprintln!("floor: step {key} panicked: {e}");
                            continue;
                        }
                    }
                } else {
                    let payloads = sizes.into_iter().map(|size| vec![0u8; size]).collect();
                    (payloads, format!("{{\"advantage/rows\": {rows}}}").into_bytes())
                };
                echo.publish(&key, rows, &payloads, &outcomes, &metrics).await;
            }
        })
    }

    /// A step's output: `payloads` as its advantages chunks, `in_flight`
    /// at a time, then its `outcomes` all at once, then its `metrics`.
    async fn publish(
        &self,
        key: &str,
        rows: usize,
        payloads: &[Vec<u8>],
        outcomes: &[(String, Vec<u8>)],
        metrics: &[u8],
    ) {
        let (topics, producer) = (&self.topics, &self.producer);
        let count = payloads.len();
        let sends: Vec<_> = payloads
            .iter()
            .enumerate()
            .map(|(i, payload)| {
                let chunk = chunk_header_values(i, count, rows);
                producer.send(
                    FutureRecord::to(&topics.output)
                        .key(key)
                        .payload(payload)
                        .headers(headers(chunk.iter().map(|(k, v)| (*k, v.as_str())))),
                    Duration::from_secs(60),
                )
            })
            .collect();
        // As many in flight as the worker keeps: the same sending, no work.
        let mut sent = futures::stream::iter(sends).buffered(self.in_flight);
        while let Some(result) = sent.next().await {
            if let Err((e, _)) = result {
                eprintln!("echo: producing to {}: {e}", topics.output);
            }
        }
        if let Some(topic) = &topics.outcomes {
            let sends = outcomes.iter().map(|(key, payload)| {
                producer.send(
                    FutureRecord::to(topic)
                        .key(key)
                        .payload(payload)
                        .headers(headers([("content-type", "application/json")])),
                    Duration::from_secs(60),
                )
            });
            for sent in futures::future::join_all(sends).await {
                if let Err((e, _)) = sent {
                    eprintln!("echo: producing to {topic}: {e}");
                }
            }
        }
        let sent = producer
            .send(
                FutureRecord::to(&topics.metrics)
                    .key(key)
                    .payload(metrics)
                    .headers(headers([("content-type", "application/json")])),
                Duration::from_secs(60),
            )
            .await;
        if let Err((e, _)) = sent {
            eprintln!("echo: producing to {}: {e}", topics.metrics);
        }
    }
}

/// The worker's Prometheus endpoint.
#[derive(Clone)]
struct Prometheus {
    url: String,
    client: reqwest::Client,
}

impl Prometheus {
    async fn scrape(&self) -> Option<String> {
        let response = self
            .client
            .get(&self.url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        response.text().await.ok()
    }

    /// The sum of the samples named `name` (labels ignored).
    async fn value(&self, name: &str) -> Option<f64> {
        let text = self.scrape().await?;
        Some(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    (series.split('{').next() == Some(name))
                        .then(|| value.parse::<f64>().ok())
                        .flatten()
                })
                .sum(),
        )
    }
}

const RECEIVED: &str = "hintstream_advantages_messages_received_total";
/// `--backlog`: the longest the worker may stay stopped while a step is
/// produced, under librdkafka's default group session (45 s).
const BACKLOG_MAX_HOLD: Duration = Duration::from_secs(30);
const COMPUTE_SUM: &str = "hintstream_advantages_compute_seconds_sum";
const DEAD_STEPS: &str = "hintstream_advantages_steps_dead_lettered_total";

/// The `hintstream advantages` child, stopped on drop.
struct Worker {
    child: Child,
    log: PathBuf,
}

impl Worker {
    fn start(binary: &Path, config_file: &Path, log: PathBuf) -> Result<Worker> {
        let child = Command::new(binary)
            .args(["advantages", "--config"])
            .arg(config_file)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log)?))
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        Ok(Worker { child, log })
    }

    /// The last lines of its log.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Peak resident memory (VmHWM), MB.
    fn peak_rss_mb(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    }

    /// CPU time the process has used so far, user and system, all its
    /// threads (exited ones too), in seconds (clock ticks of 1/100 s).
    fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        // Fields after the command name, which is in parentheses: state is
        // the 3rd field, utime the 14th, stime the 15th.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i - 3)?.parse::<f64>().ok();
        Some((ticks(14)? + ticks(15)?) / 100.0)
    }

    /// Stops the worker (SIGSTOP) or lets it go on (SIGCONT), by kill(2)
    /// itself: a `kill` process would let it go on before the caller's
    /// clock is stamped.
    #[cfg(unix)]
    fn signal(&self, stop: bool) -> Result<()> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        let signal = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: kill(2) reads no memory of ours. The pid is our child's,
        // not waited for while the bench signals it (only `exited` and
        // `stop` reap it, neither before a step), so it names no other
        // process.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(format!(
                "signal {signal} to the worker {pid}: {}",
                std::io::Error::last_os_error()
            )
            .into());
        }
        Ok(())
    }

    #[cfg(not(unix))]
    fn signal(&self, _stop: bool) -> Result<()> {
        Err("--backlog stops the worker with SIGSTOP: Unix only".into())
    }

    /// SIGTERM, then SIGKILL when it has not exited within 30 s.
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.exited().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// When the worker's `messages_received` reached `expected`, as time after
/// `acked`; `None` when it did not by `deadline`.
async fn wait_intake(
    prometheus: &Prometheus,
    expected: usize,
    acked: Instant,
    deadline: Instant,
) -> Option<Duration> {
    loop {
        if prometheus.value(RECEIVED).await.unwrap_or(0.0) >= expected as f64 {
            return Some(Instant::now().saturating_duration_since(acked));
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads until every chunk of the step keyed `key` on `output` and its
/// metrics message on `metrics` arrived; returns when the last of them did
/// and the chunks' sizes in index order. `what` names the step when the
/// deadline passes.
async fn wait_back(
    reader: &mut mpsc::UnboundedReceiver<Seen>,
    key: &str,
    output: &str,
    metrics: &str,
    rows: usize,
    deadline: Instant,
    what: &str,
) -> std::result::Result<(Instant, Vec<usize>), String> {
    let mut chunks: BTreeMap<usize, (usize, Instant)> = BTreeMap::new();
    let mut count = None;
    let mut metrics_at = None;
    loop {
        if let (Some(c), Some(m)) = (count, metrics_at) {
            if chunks.len() == c {
                let last = chunks.values().map(|(_, at)| *at).max().unwrap_or(m);
                return Ok((last.max(m), chunks.into_values().map(|(b, _)| b).collect()));
            }
        }
        let seen = match tokio::time::timeout_at(deadline.into(), reader.recv()).await {
            Ok(Some(seen)) => seen,
            Ok(None) => return Err("the reader stopped".into()),
            Err(_) => {
                return Err(format!(
                "the deadline passed waiting for the advantages and metrics of {what} after its last input \
                     message was acknowledged: {} of {} chunks and {} metrics message arrived",
                chunks.len(),
                count.map_or("?".into(), |c: usize| c.to_string()),
                if metrics_at.is_some() { "its" } else { "no" },
            ))
            }
        };
        if seen.key != key {
            continue;
        }
        if seen.topic == metrics {
            if seen.metric_rows != Some(rows as f64) {
                return Err(format!("{what}: the metrics say {:?} rows", seen.metric_rows));
            }
            metrics_at = Some(seen.at);
        } else if seen.topic == output {
            let info = seen
                .chunk
                .ok_or_else(|| format!("{what}: an advantages message without usable chunk headers"))?;
            if info.rows.is_some_and(|r| r != rows) {
                return Err(format!("{what}: a chunk says {:?} rows", info.rows));
            }
            count = Some(info.count);
            chunks.insert(info.index, (seen.bytes, seen.at));
        }
    }
}

/// One step's figures.
#[derive(Debug, Clone)]
struct Sample {
    in_messages: usize,
    in_bytes: usize,
    produce: Duration,
    e2e: Duration,
    intake: Option<Duration>,
    compute: Option<f64>,
    output_sizes: Vec<usize>,
    /// The worker's peak resident memory so far (VmHWM), MB.
    peak_rss_mb: Option<u64>,
    /// CPU seconds the worker used from the step's first send to its way
    /// back.
    worker_cpu: Option<f64>,
}

/// Everything one step's measurement needs.
struct Bench {
    producer: FutureProducer,
    reader: mpsc::UnboundedReceiver<Seen>,
    prometheus: Prometheus,
    worker: Worker,
    /// Input messages produced to the worker's topic so far.
    worker_messages: usize,
    /// The echo and, with `--floor`, the floor (none with `--no-baseline`).
    baselines: BTreeMap<Via, Baseline>,
    backlog: bool,
    topics: Topics,
    next_step: i64,
    deadline: Duration,
    /// `--wall-times`.
    wall_times: bool,
}

/// The worker's topics.
struct Topics {
    input: String,
    output: String,
    metrics: String,
}

/// A baseline side ([`Echo`]): its plan, its running task, with
/// `--backlog` the consumer made for its next step, and how many input
/// messages were produced to its topic so far.
struct Baseline {
    plan: Arc<Mutex<EchoPlan>>,
    echo: Echo,
    task: Option<tokio::task::JoinHandle<()>>,
    next: Option<StreamConsumer>,
    messages: usize,
}

impl Bench {
    /// Produces one step of `rows` through `path` and times its way back.
    async fn step(&mut self, rows: &mut ScoredRows, format: Format, via: Via) -> Result<Sample> {
        let step = self.next_step;
        self.next_step += 1;
        let key = step_key(RUN_ID, step);
        let messages = encode_input(rows, step, format)?;
        let end = step_end(step, rows.len())?;
        let in_bytes = messages.iter().map(|m| m.payload.len()).sum::<usize>() + end.len();
        let (input, output, metrics) = match self.baselines.get(&via) {
            None => (
                self.topics.input.clone(),
                self.topics.output.clone(),
                self.topics.metrics.clone(),
            ),
            Some(b) => (
                b.echo.topics.input.clone(),
                b.echo.topics.output.clone(),
                b.echo.topics.metrics.clone(),
            ),
        };
        let compute_before = match via {
            Via::Hintstream => self.prometheus.value(COMPUTE_SUM).await,
            Via::Echo | Via::Floor => None,
        };
        let cpu_before = self.worker.cpu_seconds();
        let first_offset = self.messages(via);
        if self.backlog {
            self.hold(via).await?;
        }
        let started = Instant::now();
        produce_step(&self.producer, &input, &key, &messages, &end, self.deadline).await?;
        let mut acked = Instant::now();
        let produce = acked - started;
        *self.messages_mut(via) += messages.len() + 1;
        if self.backlog {
            if via == Via::Hintstream && produce >= BACKLOG_MAX_HOLD {
                return Err(format!(
                    "--backlog: producing step {key} took {:.1} s with the worker stopped; its group session \
                     (librdkafka's session.timeout.ms, 45 s) could run out, and the step would be timed with a \
                     rejoin: give smaller --rows",
                    produce.as_secs_f64()
                )
                .into());
            }
            // Stamped first: neither side starts before its clock does.
            acked = Instant::now();
            self.release(via, first_offset)?;
        }
        let deadline = acked + self.deadline;

        // The worker's intake, polled while the reader waits.
        let (prometheus, expected) = (&self.prometheus, self.worker_messages);
        let intake = async move {
            match via {
                Via::Hintstream => wait_intake(prometheus, expected, acked, deadline).await,
                Via::Echo | Via::Floor => None,
            }
        };
        let what = format!(
            "step {key} ({} rows, {}, through {via:?})",
            rows.len(),
            format.name()
        );
        let back = wait_back(
            &mut self.reader,
            &key,
            &output,
            &metrics,
            rows.len(),
            deadline,
            &what,
        );
        let (intake, back) = tokio::join!(intake, back);
        if self.wall_times {
            let now = std::time::SystemTime::now();
            let at = |i: Instant| {
                let ago = Instant::now().saturating_duration_since(i);
                chrono::DateTime::<chrono::Utc>::from(now - ago)
                    .format("%H:%M:%S%.6f")
                    .to_string()
            };
            if let Ok((done, _)) = &back {
                eprintln!(
                    "STEP {key} {via:?} started {} acked {} done {}",
                    at(started),
                    at(acked),
                    at(*done)
                );
            }
        }
        let (done, output_sizes) = match back {
            Ok(v) => v,
            Err(e) => {
                let dead = self.prometheus.value(DEAD_STEPS).await;
                return Err(format!(
                    "{e}\nsteps dead-lettered by the worker: {dead:?}\nworker log ({}):\n{}",
                    self.worker.log.display(),
                    self.worker.tail()
                )
                .into());
            }
        };
        let compute = match (compute_before, via) {
            (Some(before), Via::Hintstream) => self
                .prometheus
                .value(COMPUTE_SUM)
                .await
                .map(|after| after - before),
            _ => None,
        };
        let intake = match self.baselines.get(&via) {
            None => intake,
            Some(b) => b
                .plan
                .lock()
                .expect("echo plan")
                .all_in
                .map(|at| at.saturating_duration_since(acked)),
        };
        Ok(Sample {
            in_messages: messages.len() + 1,
            in_bytes,
            produce,
            e2e: done - acked,
            intake,
            compute,
            output_sizes,
            peak_rss_mb: (via == Via::Hintstream).then(|| self.worker.peak_rss_mb()),
            worker_cpu: match (via, cpu_before, self.worker.cpu_seconds()) {
                (Via::Hintstream, Some(before), Some(after)) => Some(after - before),
                _ => None,
            },
        })
    }

    /// `--backlog`: holds the side `via` before its step is produced. The
    /// worker is stopped (SIGSTOP). The echo's consumer is dropped and a
    /// new one made and connected, assigned nothing: librdkafka's pause
    /// would not do, as a paused partition resumed took 0.6-0.7 s to bring
    /// its first message here.
    async fn hold(&mut self, via: Via) -> Result<()> {
        let Some(b) = self.baselines.get_mut(&via) else {
            return self.worker.signal(true);
        };
        if let Some(task) = b.task.take() {
            task.abort();
            let _ = task.await;
        }
        b.next = Some(b.echo.connected_consumer().await?);
        Ok(())
    }

    /// `--backlog`: lets the side `via` take the step produced since
    /// [`Bench::hold`], which begins at `first_offset` of its topic.
    fn release(&mut self, via: Via, first_offset: usize) -> Result<()> {
        let Some(b) = self.baselines.get_mut(&via) else {
            return self.worker.signal(false);
        };
        let Some(consumer) = b.next.take() else {
            return Ok(());
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&b.echo.topics.input, 0, Offset::Offset(first_offset as i64))?;
        consumer.assign(&tpl)?;
        b.task = Some(b.echo.spawn(consumer));
        Ok(())
    }

    /// Input messages produced to `via`'s topic so far.
    fn messages(&self, via: Via) -> usize {
        self.baselines
            .get(&via)
            .map_or(self.worker_messages, |b| b.messages)
    }

    fn messages_mut(&mut self, via: Via) -> &mut usize {
        if via == Via::Hintstream {
            return &mut self.worker_messages;
        }
        &mut self.baselines.get_mut(&via).expect("a baseline side").messages
    }

    /// Tells baseline `via` what its next step will be: `messages` input
    /// messages (`step_end` included) of `rows`, answered with messages of
    /// `output_sizes` (and, where rows name hints, an outcome a hint).
    fn plan_echo(&self, via: Via, rows: &ScoredRows, messages: usize, output_sizes: Vec<usize>) {
        let Some(b) = self.baselines.get(&via) else {
            return;
        };
        *b.plan.lock().expect("echo plan") = EchoPlan {
            key: step_key(RUN_ID, self.next_step),
            messages,
            rows: rows.len(),
            output_sizes,
            outcomes: hint_outcomes(rows, self.next_step),
            received: 0,
            all_in: None,
        };
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until the broker answers a metadata request.
async fn wait_for_broker(config: &Config, within: Duration) -> Result<()> {
    let client = base_config(config);
    let bootstrap = config.bootstrap_servers.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client.create()?;
        let deadline = Instant::now() + within;
        loop {
            match consumer.fetch_metadata(None, Duration::from_secs(2)) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(
                        format!("the broker at {bootstrap} did not answer within {within:?}: {e}").into(),
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    })
    .await?
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Milliseconds for a table: a tenth kept under 100 ms, where a 10,000-row
/// step's 2-5 ms would otherwise round by up to a sixth.
fn ms_cell(v: f64) -> String {
    if v.abs() < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// `1234567` as `1,234,567`.
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mb(bytes: usize) -> String {
    format!("{:.2}", bytes as f64 / 1e6)
}

/// Figures of one (rows, format, path): its samples.
type Results = BTreeMap<(usize, Format, Via), Vec<Sample>>;

fn print_tables(
    results: &Results,
    skipped: &[(usize, Format)],
    repeats: usize,
    echo_in_flight: usize,
    backlog: bool,
) {
    if backlog {
        println!(
            "With --backlog: each step was produced whole while its side was held (the worker stopped by \
             SIGSTOP; the echo's consumer connected, with nothing assigned); \"the last acknowledgement\" below \
             is the moment that side was let go on (SIGCONT; the step's first offset assigned), with the whole \
             step waiting on its topic.\n"
        );
    }
    println!("### hintstream: last input acknowledged → step's metrics and every chunk consumed\n");
    println!(
        "| rows | input | input msgs | input MB | produce s | output chunks | output MB | end-to-end ms (median / min) | intake ms | compute ms | rest ms | worker CPU ms | rows/s | JSON ÷ Arrow, end-to-end | JSON ÷ Arrow, first send → out | worker peak RSS MB |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ((rows, format, path), samples) in results {
        if *path != Via::Hintstream {
            continue;
        }
        let s0 = &samples[0];
        let e2e = median(samples.iter().map(|s| ms(s.e2e)).collect());
        let min = samples.iter().map(|s| ms(s.e2e)).fold(f64::INFINITY, f64::min);
        let produce = median(samples.iter().map(|s| s.produce.as_secs_f64()).collect());
        let intake = median(samples.iter().filter_map(|s| s.intake.map(ms)).collect());
        let compute = median(
            samples
                .iter()
                .filter_map(|s| s.compute.map(|c| c * 1e3))
                .collect(),
        );
        let rest = median(
            samples
                .iter()
                .map(|s| ms(s.e2e) - s.intake.map_or(0.0, ms) - s.compute.unwrap_or(0.0) * 1e3)
                .collect(),
        );
        let cpu = median(
            samples
                .iter()
                .filter_map(|s| s.worker_cpu.map(|c| c * 1e3))
                .collect(),
        );
        let (ratio, total_ratio) = match (format, results.get(&(*rows, Format::Json, Via::Hintstream))) {
            (Format::Arrow, Some(json)) => {
                let json_e2e = median(json.iter().map(|s| ms(s.e2e)).collect());
                let json_total = median(json.iter().map(|s| ms(s.e2e + s.produce)).collect());
                let total = median(samples.iter().map(|s| ms(s.e2e + s.produce)).collect());
                (
                    format!("{:.1}×", json_e2e / e2e),
                    format!("{:.1}×", json_total / total),
                )
            }
            _ => ("".into(), "".into()),
        };
        println!(
            "| {} | {} | {} | {} | {:.2} | {} | {} | {} / {} | {:.0} | {} | {} | {:.0} | {} | {} | {} | {} |",
            thousands(*rows),
            format.name(),
            thousands(s0.in_messages),
            mb(s0.in_bytes),
            produce,
            s0.output_sizes.len(),
            mb(s0.output_sizes.iter().sum()),
            ms_cell(e2e),
            ms_cell(min),
            intake,
            ms_cell(compute),
            ms_cell(rest),
            cpu,
            thousands((*rows as f64 / (e2e / 1e3)) as usize),
            ratio,
            total_ratio,
            samples
                .iter()
                .filter_map(|s| s.peak_rss_mb)
                .max()
                .map_or(String::new(), |mb| thousands(mb as usize)),
        );
    }
    for (rows, format) in skipped {
        println!(
            "\n{} at {} rows: skipped (over --json-max-rows).",
            format.name(),
            thousands(*rows)
        );
    }
    println!(
        "\n{repeats} step(s) each. intake: from the last acknowledgement until the worker had taken every input \
         message (its messages_received counter, polled every 10 ms: fetch, decode, assembly left). compute: \
         the worker's compute_seconds (parts put together, string ids → dense ids, kernel, and the step's \
         metrics beside it). rest: end-to-end − intake − compute (encoding, publishing the chunks, the metrics, \
         the reader's fetch). worker CPU: the worker process's CPU time (user and system, every thread) from the \
         step's first send until its way back, in 10 ms ticks. rows/s: rows ÷ median end-to-end. worker peak RSS: the worker process's high-water \
         mark (VmHWM) after these steps, so it covers every step run before them: give --rows in ascending \
         order (JSON runs before Arrow by default) to read it per size."
    );
    if !results.keys().any(|(_, _, p)| *p == Via::Echo) {
        return;
    }
    let floor = results.keys().any(|(_, _, p)| *p == Via::Floor);
    println!("\n### Broker-only baseline: the same input and output bytes through the broker, an echo in place of hintstream\n");
    // The floor's cells after the echo's: a row of this table must keep
    // fewer than eleven cells (scripts/bench-step-path.sh tells the tables
    // apart by it).
    println!(
        "| rows | input | echo end-to-end ms (median / min) | echo intake ms | hintstream end-to-end ms | hintstream ÷ echo |{}",
        if floor { " floor end-to-end ms (median / min) | hintstream ÷ floor | floor ÷ echo |" } else { "" }
    );
    println!(
        "|---:|---|---:|---:|---:|---:|{}",
        if floor { "---:|---:|---:|" } else { "" }
    );
    let median_e2e = |key: (usize, Format, Via)| {
        results
            .get(&key)
            .map(|h| median(h.iter().map(|s| ms(s.e2e)).collect()))
            .unwrap_or(f64::NAN)
    };
    let min_e2e = |samples: &[Sample]| samples.iter().map(|s| ms(s.e2e)).fold(f64::INFINITY, f64::min);
    for ((rows, format, path), samples) in results {
        if *path != Via::Echo {
            continue;
        }
        let e2e = median(samples.iter().map(|s| ms(s.e2e)).collect());
        let intake = median(samples.iter().filter_map(|s| s.intake.map(ms)).collect());
        let hs = median_e2e((*rows, *format, Via::Hintstream));
        let floor_cells = match results.get(&(*rows, *format, Via::Floor)) {
            Some(f) => {
                let fl = median_e2e((*rows, *format, Via::Floor));
                format!(
                    " {} / {} | {:.2}× | {:.2}× |",
                    ms_cell(fl),
                    ms_cell(min_e2e(f)),
                    hs / fl,
                    fl / e2e
                )
            }
            None => String::new(),
        };
        println!(
            "| {} | {} | {} / {} | {:.0} | {} | {:.2}× |{floor_cells}",
            thousands(*rows),
            format.name(),
            ms_cell(e2e),
            ms_cell(min_e2e(samples)),
            intake,
            ms_cell(hs),
            hs / e2e
        );
    }
    println!(
        "\necho: consumes the step's input (no decoding), then publishes messages of the sizes the worker's chunks \
         had, {echo_in_flight} at a time (--echo-in-flight), and a small metrics message, lingering as the \
         worker's output producer does (linger.ms 0); timed like the worker. \
         echo intake: from the last acknowledgement until the echo had every input message."
    );
    if floor {
        println!(
            "\nfloor (--floor): the echo, taking its turn after it, doing on its one task the work no worker can \
             leave out: each message's metadata copied and decoded, its rows put into the step and their group ids \
             mapped as they come; once all are in (off the async threads), the kernel, the step's metrics and its \
             Arrow chunks; then those chunks and metrics, sent as the echo sends. hintstream ÷ floor: what the \
             worker's machinery costs; floor ÷ echo: what the work itself does."
        );
    }
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(Args::parse()).await {
        eprintln!("step_path: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<()> {
    let binary = match &args.hintstream {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("hintstream"))
            .ok_or("cannot tell where this example lies; pass --hintstream")?,
    };
    if !binary.is_file() {
        return Err(format!(
            "no hintstream binary at {}: build it (cargo build --release --bin hintstream) or pass --hintstream",
            binary.display()
        )
        .into());
    }
    let deadline = Duration::from_secs(args.deadline_secs);
    let work_dir = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("steppath-{}", rand::random::<u32>())),
    };
    std::fs::create_dir_all(&work_dir)?;

    let id = rand::random::<u32>();
    let name = |what: &str| format!("steppath-{what}-{id}");
    let topics = Topics {
        input: name("scored"),
        output: name("advantages"),
        metrics: name("metrics"),
    };
    // The baselines' sides: none, the echo, or the echo and the floor.
    let sides = match (args.no_baseline, args.floor) {
        (true, _) => vec![],
        (false, false) => vec![Via::Echo],
        (false, true) => vec![Via::Echo, Via::Floor],
    };
    let side_topics: Vec<(Via, SideTopics)> = sides
        .iter()
        .map(|&via| (via, SideTopics::named(&name, via.name(), args.learning)))
        .collect();
    let mut config = Config {
        bootstrap_servers: args.bootstrap.clone(),
        ..Config::default()
    };
    let metrics_port = free_port()?;
    {
        let a = &mut config.advantages;
        a.stage.input_topic = topics.input.clone();
        a.stage.output_topic = topics.output.clone();
        a.stage.dlq_topic = format!("{}.dlq", topics.input);
        a.stage.group_id = name("group");
        a.stage.metrics_addr = format!("127.0.0.1:{metrics_port}");
        // A JSON step parks one message a row until it is published.
        let largest = args.rows.iter().copied().max().unwrap_or(0);
        a.stage.max_in_flight = a.stage.max_in_flight.max(largest + 10_000);
        // Producing a large JSON step may take longer than the default 300 s.
        a.step_timeout_secs = args.deadline_secs.max(a.step_timeout_secs);
    }
    config.topics.metrics = topics.metrics.clone();
    if args.exactly_once {
        config.kafka.delivery = hintstream::config::DeliveryMode::ExactlyOnce;
        config.kafka.worker_id = Some("steppath-0".into());
    }
    if args.learning {
        config.topics.hints = name("hints");
        config.topics.outcomes = name("outcomes");
    }
    if let Some(wait) = args.fetch_wait_ms {
        config
            .kafka
            .consumer
            .insert("fetch.wait.max.ms".into(), i64::from(wait).into());
    }
    let config_file = work_dir.join("hintstream.toml");
    std::fs::write(&config_file, toml::to_string(&config)?)?;

    eprintln!(
        "broker {}; worker config {}",
        args.bootstrap,
        config_file.display()
    );
    wait_for_broker(&config, Duration::from_secs(30)).await?;
    let names = [
        &topics.input,
        &config.advantages.stage.dlq_topic,
        &topics.output,
        &topics.metrics,
    ]
    .map(|s| s.to_string())
    .into_iter()
    .chain(
        [&config.topics.hints, &config.topics.outcomes]
            .into_iter()
            .filter(|_| args.learning)
            .cloned(),
    )
    .chain(side_topics.iter().flat_map(|(_, t)| {
        [t.input.clone(), t.output.clone(), t.metrics.clone()]
            .into_iter()
            .chain(t.outcomes.clone())
    }))
    .collect::<Vec<_>>();
    let specs = hintstream::stages::specs_of(&config, &names);
    let created = tokio::time::timeout(Duration::from_secs(60), create_topics(&config, &specs, 1))
        .await
        .map_err(|_| "creating the topics took more than 60 s")??;
    for (topic, outcome) in created {
        if let TopicOutcome::Failed(e) = outcome {
            return Err(format!("creating topic {topic}: {e}").into());
        }
    }
    let read: Vec<&str> = [topics.output.as_str(), topics.metrics.as_str()]
        .into_iter()
        .chain(
            side_topics
                .iter()
                .flat_map(|(_, t)| [t.output.as_str(), t.metrics.as_str()]),
        )
        .collect();
    let reader = start_reader(&config, &read, args.exactly_once)?;
    let mut baselines = BTreeMap::new();
    for (via, side) in &side_topics {
        let plan = Arc::new(Mutex::new(EchoPlan::default()));
        let echo = Echo::new(
            &config,
            side,
            plan.clone(),
            args.echo_in_flight,
            *via == Via::Floor,
        )?;
        let task = if args.backlog {
            None
        } else {
            Some(echo.spawn(from_the_start(&config, "steppath-echo", &[&side.input])?))
        };
        let next = None;
        baselines.insert(
            *via,
            Baseline {
                plan,
                echo,
                task,
                next,
                messages: 0,
            },
        );
    }

    if args.learning {
        // Every group of the largest step: the smaller ones' are among them.
        let largest = args.rows.iter().copied().max().unwrap_or(0).max(64);
        let written = write_hints(&config, &config.topics.hints, &step_rows(largest, false, true)).await?;
        eprintln!(
            "--learning: {written} hints written to {} in one transaction",
            config.topics.hints
        );
    }
    let mut worker = Worker::start(&binary, &config_file, work_dir.join("worker.log"))?;
    let prometheus = Prometheus {
        url: format!("http://127.0.0.1:{metrics_port}/metrics"),
        client: reqwest::Client::new(),
    };
    let up_by = Instant::now() + Duration::from_secs(60);
    while prometheus.scrape().await.is_none() {
        if let Some(status) = worker.exited() {
            return Err(format!("the worker exited ({status}):\n{}", worker.tail()).into());
        }
        if Instant::now() > up_by {
            return Err(format!(
                "the worker's metrics endpoint did not answer within 60 s:\n{}",
                worker.tail()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("worker {} up; log {}", worker.child.id(), worker.log.display());

    let mut bench = Bench {
        producer: create_producer(&config)?,
        reader,
        prometheus,
        worker,
        worker_messages: 0,
        baselines,
        backlog: args.backlog,
        topics,
        next_step: 0,
        deadline,
        wall_times: args.wall_times,
    };
    // Warm-up: the worker joined its group and a step went all the way.
    let mut warm = step_rows(64, args.grouped, args.learning);
    let warm_up = bench.step(&mut warm, Format::Arrow, Via::Hintstream).await?;
    eprintln!("warm-up: a 64-row step back in {:.0} ms", ms(warm_up.e2e));
    for &via in &sides {
        bench.plan_echo(via, &warm, warm_up.in_messages, warm_up.output_sizes.clone());
        let echoed = bench.step(&mut warm, Format::Arrow, via).await?;
        eprintln!(
            "warm-up: {via:?} of a 64-row step back in {:.0} ms",
            ms(echoed.e2e)
        );
    }

    let mut results = Results::new();
    let mut skipped = Vec::new();
    let mut formats = args.formats.clone();
    formats.sort();
    formats.dedup();
    for &n in &args.rows {
        let mut rows = step_rows(n, args.grouped, args.learning);
        for &format in &formats {
            if format == Format::Json && n > args.json_max_rows {
                skipped.push((n, format));
                continue;
            }
            // Untimed steps of this size first, through both (a broker
            // started for the run is still compiling its hot paths: the
            // first large steps cost it more CPU than later ones), and the
            // output sizes the echo mirrors.
            let mut sizes = Vec::new();
            let mut in_messages = 0;
            for w in 0..args.warm_ups {
                let sample = bench.step(&mut rows, format, Via::Hintstream).await?;
                (sizes, in_messages) = (sample.output_sizes.clone(), sample.in_messages);
                let mut echoed = Vec::new();
                for &via in &sides {
                    bench.plan_echo(via, &rows, in_messages, sizes.clone());
                    let back = ms(bench.step(&mut rows, format, via).await?.e2e);
                    echoed.push(format!("{via:?} {back:.0} ms"));
                }
                eprintln!(
                    "{} rows {} warm-up #{w}: back {:.1} ms ({})",
                    n,
                    format.name(),
                    ms(sample.e2e),
                    echoed.join(", ")
                );
            }
            // hintstream and the echo in turn, a step each, so that neither
            // side runs on a broker the other warmed.
            for r in 0..args.repeats.max(1) {
                let sample = bench.step(&mut rows, format, Via::Hintstream).await?;
                eprintln!(
                    "{} rows {} #{r}: produced in {:.2} s, back {:.1} ms after the last ack (intake {:?} ms, compute \
                     {:?} ms, {} chunks); worker peak RSS {} MB",
                    n,
                    format.name(),
                    sample.produce.as_secs_f64(),
                    ms(sample.e2e),
                    sample.intake.map(|d| ms(d).round()),
                    sample.compute.map(|c| (c * 1e3).round()),
                    sample.output_sizes.len(),
                    bench.worker.peak_rss_mb()
                );
                if sizes.is_empty() {
                    (sizes, in_messages) = (sample.output_sizes.clone(), sample.in_messages);
                }
                results
                    .entry((n, format, Via::Hintstream))
                    .or_default()
                    .push(sample);
                for &via in &sides {
                    bench.plan_echo(via, &rows, in_messages, sizes.clone());
                    let sample = bench.step(&mut rows, format, via).await?;
                    eprintln!(
                        "{} rows {} {} #{r}: produced in {:.2} s, back {:.1} ms after the last ack (intake {:?} ms)",
                        n,
                        format.name(),
                        via.name(),
                        sample.produce.as_secs_f64(),
                        ms(sample.e2e),
                        sample.intake.map(|d| ms(d).round()),
                    );
                    results.entry((n, format, via)).or_default().push(sample);
                }
            }
        }
    }
    eprintln!("worker peak RSS {} MB", bench.worker.peak_rss_mb());
    bench.worker.stop();
    print_tables(
        &results,
        &skipped,
        args.repeats.max(1),
        args.echo_in_flight.max(1),
        args.backlog,
    );
    Ok(())
}
