//! Brokers for integration tests: Apache Kafka started from the jars of
//! `scripts/kafka.sh` ([`kafka`]: one node shared by a test binary, or a
//! node of a test's own), `HINTSTREAM_TEST_BOOTSTRAP` when set, and
//! librdkafka's mock cluster where a test injects broker errors. A test that
//! cannot start its broker fails with a message that says how to fix it; it
//! never skips.
#![allow(dead_code)]

pub mod arrivals;
pub mod kafka;
pub mod llm_server;
pub mod waits;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hintstream::config::Config;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

pub use kafka::{KafkaCluster, KafkaNode, NodeSettings};

/// The broker a test shares with the other tests of its binary.
#[derive(Clone)]
pub struct Broker {
    pub bootstrap: String,
}

/// The shared Kafka node of this test binary (started on first use), or
/// `HINTSTREAM_TEST_BOOTSTRAP` when set.
pub fn shared_kafka() -> Broker {
    Broker {
        bootstrap: kafka::shared().to_string(),
    }
}

/// A plain Kafka node of the test's own (never `HINTSTREAM_TEST_BOOTSTRAP`),
/// so that it can kill and restart it: its data survives a restart.
pub fn own_kafka() -> KafkaNode {
    KafkaNode::start(NodeSettings::default())
}

/// A port nothing listens on now, for a process to bind later (a stage's
/// metrics endpoint, a broker's listener, again after a restart). Taken
/// below the range the system hands out as connections' own ports
/// (`ip_local_port_range`): a port of that range, once free, can become the
/// local port of any new connection, a Kafka client's of another test, before
/// the process binds it (a restarted stage failed so: "Address already in
/// use"). Random, checked free, and never handed out twice in this
/// process.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let below = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const FROM: u16 = 10_000;
    if below > FROM + 1000 {
        for _ in 0..200 {
            let port = rand::random_range(FROM..below);
            if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.push(port);
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Blocks until something accepts connections on 127.0.0.1:`port`.
pub fn wait_for_port(port: u16, within: Duration) {
    let deadline = Instant::now() + within;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on 127.0.0.1:{port} after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Blocks until a metadata request to `bootstrap` succeeds.
pub fn wait_for_broker(bootstrap: &str, within: Duration) {
    let deadline = Instant::now() + within;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    loop {
        match consumer.fetch_metadata(None, Duration::from_secs(2)) {
            Ok(_) => return,
            Err(e) if Instant::now() > deadline => {
                panic!("broker at {bootstrap} did not answer within {within:?}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// A config pointing at `bootstrap`, with the rest default.
pub fn config_for(bootstrap: &str) -> Config {
    Config {
        bootstrap_servers: bootstrap.to_string(),
        ..Config::default()
    }
}

/// Creates topics through the project's own admin path and checks they exist.
pub async fn create_topics(config: &Config, names: &[&str], partitions: i32) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let specs = hintstream::stages::specs_of(config, &names);
    let outcomes = hintstream::kafka::admin::create_topics(config, &specs, partitions)
        .await
        .expect("create topics");
    for (name, outcome) in outcomes {
        assert!(
            !matches!(outcome, hintstream::kafka::admin::TopicOutcome::Failed(_)),
            "creating {name}: {outcome:?}"
        );
    }
    wait_for_topics(config, &names).await;
}

/// Waits, at most 30 s, until the broker's metadata shows every topic of
/// `names` with its partitions (`kafka::admin::wait_until_visible`).
pub async fn wait_for_topics(config: &Config, names: &[String]) {
    let missing =
        hintstream::kafka::admin::wait_until_visible(config, names.to_vec(), Duration::from_secs(30)).await;
    assert!(
        missing.is_empty(),
        "topics {missing:?} not in the metadata after 30 s"
    );
}

/// Creates stage 1's topics: its input, output and dead letters.
pub async fn create_hints_topics(config: &Config, partitions: i32) {
    let h = &config.hints;
    create_topics(
        config,
        &[&h.input_topic, &h.output_topic, &h.dlq_topic],
        partitions,
    )
    .await;
}

/// Creates stage 2's topics: its input, output and dead letters, and the
/// step-metrics topic.
pub async fn create_advantages_topics(config: &Config, partitions: i32) {
    let a = &config.advantages;
    create_topics(
        config,
        &[
            &a.input_topic,
            &a.output_topic,
            &a.dlq_topic,
            &config.topics.metrics,
        ],
        partitions,
    )
    .await;
}

/// Both stages' topics (input, output, dead letters) and the step-metrics
/// topic.
pub fn pipeline_topics(config: &Config) -> Vec<String> {
    let (h, a) = (&config.hints, &config.advantages);
    [
        &h.input_topic,
        &h.output_topic,
        &h.dlq_topic,
        &a.input_topic,
        &a.output_topic,
        &a.dlq_topic,
        &config.topics.metrics,
    ]
    .map(String::clone)
    .to_vec()
}

/// Creates [`pipeline_topics`].
pub async fn create_pipeline_topics(config: &Config, partitions: i32) {
    let names = pipeline_topics(config);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    create_topics(config, &names, partitions).await;
}

/// Points `stage` at topics and a group of its own (input `NAME-…`, its
/// output, `INPUT.dlq`), with the metrics endpoint on a free port.
pub fn own_topics(stage: &mut hintstream::config::StageConfig, input: &str, output: &str) {
    stage.input_topic = unique(input);
    stage.output_topic = unique(output);
    stage.dlq_topic = format!("{}.dlq", stage.input_topic);
    stage.group_id = unique(&format!("{input}-group"));
    stage.metrics_addr = "127.0.0.1:0".into();
}

/// A producer that takes messages up to 20 MB (the 10 MB inputs of the
/// bad-input corpora).
pub fn large_message_producer(config: &Config) -> rdkafka::producer::FutureProducer {
    let mut c = config.clone();
    c.kafka.insert("message.max.bytes", "20000000");
    hintstream::kafka::create_producer(&c).unwrap()
}

/// Produces `record` and waits (at most 60 s) for its acknowledgement.
async fn deliver<K, P>(
    producer: &rdkafka::producer::FutureProducer,
    record: rdkafka::producer::FutureRecord<'_, K, P>,
) where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    producer
        .send(record, Duration::from_secs(60))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// Produces one message without a key to `partition` and waits for its
/// acknowledgement.
pub async fn send_to_partition(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    partition: i32,
    payload: &[u8],
) {
    let record = rdkafka::producer::FutureRecord::<(), [u8]>::to(topic)
        .partition(partition)
        .payload(payload);
    deliver(producer, record).await;
}

/// Produces one keyed message and waits for its acknowledgement.
pub async fn send(producer: &rdkafka::producer::FutureProducer, topic: &str, key: &str, payload: &[u8]) {
    deliver(
        producer,
        rdkafka::producer::FutureRecord::to(topic)
            .key(key)
            .payload(payload),
    )
    .await;
}

/// Produces one message as it is (no payload when `payload` is `None`, any
/// headers) and waits for its acknowledgement.
pub async fn send_raw(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    key: &str,
    payload: Option<&[u8]>,
    headers: Option<rdkafka::message::OwnedHeaders>,
) {
    let mut record: rdkafka::producer::FutureRecord<'_, str, [u8]> =
        rdkafka::producer::FutureRecord::to(topic).key(key);
    if let Some(p) = payload {
        record = record.payload(p);
    }
    if let Some(h) = headers {
        record = record.headers(h);
    }
    deliver(producer, record).await;
}

/// A unique name for a topic or group in this test run.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", rand::random::<u32>())
}

/// Every message of `topic`, read with `hintstream record` up to the end.
pub async fn read_topic(config: &Config, topic: &str) -> Vec<hintstream::tools::RecordedMessage> {
    let out = tempfile::NamedTempFile::new().unwrap();
    let options = hintstream::tools::record::RecordOptions {
        topic: topic.into(),
        max_messages: None,
        idle_timeout: Duration::from_secs(20),
        progress: false,
    };
    hintstream::tools::record::record(config, &options, out.path())
        .await
        .unwrap();
    hintstream::tools::replay::read_recorded(out.path()).unwrap()
}

/// The value of `message`'s header `name`, when it has one in UTF-8.
pub fn header<'m>(message: &'m hintstream::tools::RecordedMessage, name: &str) -> Option<&'m str> {
    message
        .headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value.bytes.as_deref())
        .and_then(|b| std::str::from_utf8(b).ok())
}

/// Waits, at most 60 s, until `topic` holds at least `n` messages; all of
/// them, from the start.
pub async fn wait_for_messages(
    config: &Config,
    topic: &str,
    n: usize,
) -> Vec<hintstream::tools::RecordedMessage> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let messages = read_topic(config, topic).await;
        if messages.len() >= n {
            return messages;
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: {} of {n} messages",
            messages.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits, at most 90 s, for `n` hints on stage 1's output topic.
pub async fn wait_output_hints(config: &Config, n: usize) -> Vec<hintstream::messages::Hint> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let hints = hints_in(config, &config.hints.output_topic).await;
        if hints.len() >= n {
            return hints;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out with {} hints",
            hints.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The hints on `topic`, from the start (each must decode).
pub async fn hints_in(config: &Config, topic: &str) -> Vec<hintstream::messages::Hint> {
    read_topic(config, topic)
        .await
        .iter()
        .map(|m| {
            hintstream::messages::decode::<hintstream::messages::Hint>(
                m.value_bytes().unwrap(),
                hintstream::messages::DecodeLimits::default(),
            )
            .expect("hints decode")
        })
        .collect()
}

/// A stage running in a task until [`Running::stop`].
pub struct Running<T> {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<T>,
}

impl<T> Running<T> {
    /// Signals shutdown and waits for the stage to drain and return.
    pub async fn stop(self) -> T {
        let _ = self.stop.send(());
        self.task.await.expect("the stage task panicked")
    }
}

/// Spawns `run(shutdown)`, where `shutdown` resolves on [`Running::stop`].
pub fn spawn_stage<T, F>(
    run: impl FnOnce(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> F,
) -> Running<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run(Box::pin(async move {
        let _ = rx.await;
    })));
    Running { stop, task }
}

/// A child process killed (SIGKILL) and reaped on drop, even when an
/// assertion fails first.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `hintstream` child process with its stderr in a log file, killed
/// (SIGKILL) and reaped on drop.
pub struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Spawns `command` (stdout discarded, stderr to a fresh log file).
    pub fn spawn(mut command: Command, name: &str) -> Process {
        let log = std::env::temp_dir().join(format!("{name}-{}.log", rand::random::<u32>()));
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        Process { child, log }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGTERM: the stage drains and commits.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits up to `within` for the process to exit; its status, or `None`
    /// when it is still running.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL: no drain, no final commit.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Peak resident memory (VmHWM) of process `pid`, in MB; 0 when unknown.
pub fn peak_rss_mb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// Removes the model API variables, so a `hintstream` child publishes static
/// hints whatever the environment of the test run.
pub fn without_llm_env(command: &mut Command) -> &mut Command {
    command
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
}

/// `hintstream <stage> --config <config_file>`, without the model API
/// variables ([`without_llm_env`]); callers add what they need and spawn it.
pub fn stage_command(stage: &str, config_file: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
    without_llm_env(&mut command)
        .args([stage, "--config"])
        .arg(config_file);
    command
}

/// A stage's Prometheus endpoint, read by tests: they wait on what the stage
/// counts, not on its log wording.
#[derive(Clone, Copy, Debug)]
pub struct MetricsEndpoint(pub std::net::SocketAddr);

impl MetricsEndpoint {
    /// A free loopback port for `--metrics-addr`.
    pub fn free() -> Self {
        MetricsEndpoint(format!("127.0.0.1:{}", free_port()).parse().unwrap())
    }

    /// `HOST:PORT`, for `--metrics-addr` or `metrics_addr`.
    pub fn addr(&self) -> String {
        self.0.to_string()
    }

    /// Status and body of `GET path` on this endpoint (`/metrics`,
    /// `/healthz`, `/readyz`), or `None` while nothing answers.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let response = reqwest::Client::new()
            .get(format!("http://{}{path}", self.0))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.unwrap_or_default()))
    }

    /// The sum of the series of `name` whose labels contain every
    /// `key="value"` of `labels`; 0 when there is none (or no answer).
    pub async fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get("/metrics")
            .await
            .map_or(0.0, |(_, text)| metric_value(&text, name, labels))
    }

    /// Waits, at most 60 s, until `stage` (`hints` or `advantages`) holds a
    /// partition of its input (`hintstream_<stage>_assigned_partitions`).
    pub async fn wait_assigned(&self, stage: &str, context: impl Fn() -> String) -> f64 {
        let name = format!("hintstream_{stage}_assigned_partitions");
        self.wait_for(&name, &[], |n| n > 0.0, Duration::from_secs(60), context)
            .await
    }

    /// Waits until `name` (summed as [`MetricsEndpoint::value`] does)
    /// satisfies `until`, failing with `context()` after `within`.
    pub async fn wait_for(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        until: impl Fn(f64) -> bool,
        within: Duration,
        context: impl Fn() -> String,
    ) -> f64 {
        let deadline = Instant::now() + within;
        loop {
            let v = self.value(name, labels).await;
            if until(v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{name}{labels:?} = {v} after {within:?}\n{}",
                context()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Sums the samples of `name` (exactly that name, no suffix added) whose
/// label set contains every pair of `labels`.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, series_labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if series_name != name {
                return None;
            }
            let all = labels.iter().all(|(k, v)| {
                series_labels
                    .split(',')
                    .any(|pair| pair == format!("{k}=\"{v}\""))
            });
            all.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// Writes `config` as a TOML file in `dir` for a `hintstream` process.
pub fn write_config(config: &Config, dir: &std::path::Path) -> PathBuf {
    let path = dir.join("hintstream.toml");
    std::fs::write(&path, toml::to_string(config).unwrap()).unwrap();
    path
}

/// Committed offsets of `group` on `topic`'s partitions `0..partitions`.
pub async fn committed_offsets(
    config: &Config,
    group: &str,
    topic: &str,
    partitions: i32,
) -> std::collections::BTreeMap<i32, i64> {
    let mut client = hintstream::kafka::base_config(config);
    client.set("group.id", group);
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client.create().unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&topic, p);
        }
        // A fresh broker answers NOT_COORDINATOR (and the like) while it
        // creates and loads the offsets topic: retried for 30 s.
        let deadline = Instant::now() + Duration::from_secs(30);
        let committed = loop {
            match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
                Ok(committed) => break committed,
                Err(e) if Instant::now() < deadline && coordinator_not_ready(&e) => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                Err(e) => panic!("committed offsets of {topic}: {e}"),
            }
        };
        committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                rdkafka::Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect()
    })
    .await
    .unwrap()
}

/// Whether `e` says the group coordinator is still being chosen or loaded.
fn coordinator_not_ready(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode::*;
    matches!(
        e.rdkafka_error_code(),
        Some(NotCoordinator | CoordinatorNotAvailable | CoordinatorLoadInProgress)
    )
}

/// A Float64 column of `batch`, by name.
pub fn f64s(batch: &arrow_array::RecordBatch, name: &str) -> Vec<f64> {
    batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_any()
        .downcast_ref::<arrow_array::Float64Array>()
        .unwrap_or_else(|| panic!("{name} is not Float64"))
        .values()
        .to_vec()
}

/// A string column of `batch` (plain or dictionary-encoded), by name; a
/// null fails the test.
pub fn strings(batch: &arrow_array::RecordBatch, name: &str) -> Vec<String> {
    let column = batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    let column = arrow_cast::cast(column, &arrow_schema::DataType::Utf8).unwrap();
    let column = column
        .as_any()
        .downcast_ref::<arrow_array::StringArray>()
        .unwrap();
    column
        .iter()
        .map(|v| v.unwrap_or_else(|| panic!("a null in {name}")).to_string())
        .collect()
}
