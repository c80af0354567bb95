//! Apache Kafka nodes for integration tests, run from the jars that
//! `scripts/kafka.sh` resolves: one node shared by every test of a test
//! binary ([`shared`]), or a node of a test's own ([`KafkaNode::start`]) for
//! tests that kill, restart or secure their broker, or three of them in one
//! quorum ([`KafkaCluster`]) for failover. Each node is a KRaft
//! broker and controller in one JVM on 127.0.0.1, with
//! `scripts/kafka/node.properties` as every node's base settings.
//!
//! A node's JVM runs under a small `sh` guard that SIGKILLs it once the test
//! process is gone (a panic, a SIGKILL of the test binary, or the end of the
//! process for the shared node, which Rust never drops) and then removes its
//! folder, so no JVM outlives its test binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

/// How long a node may take from launch until it answers metadata. Seconds
/// on an idle machine (docs/BENCHMARKS.md); much more when the machine's
/// cores are busy compiling.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// The repository's `scripts/`.
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts")
}

/// The folder of the broker's jars: `scripts/kafka.sh libs`, which resolves
/// them with Maven the first time (about a minute) and answers at once later.
pub fn libs() -> &'static Path {
    static LIBS: OnceLock<PathBuf> = OnceLock::new();
    LIBS.get_or_init(|| {
        let out = Command::new(scripts().join("kafka.sh"))
            .arg("libs")
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run scripts/kafka.sh libs: {e}"));
        assert!(
            out.status.success(),
            "scripts/kafka.sh libs failed: install Java 17+ and Maven (scripts/setup.sh says how), or set HINTSTREAM_TEST_BOOTSTRAP to a running broker"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
    })
}

/// `java` on the broker's classpath, logging through the project's log4j2
/// config at `level`.
pub fn kafka_java(level: &str) -> Command {
    let mut command = Command::new("java");
    command
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            scripts().join("kafka/log4j2.properties").display()
        ))
        .arg(format!("-Dhintstream.kafka.log.level={level}"))
        .arg("-cp")
        .arg(format!("{}/*", libs().display()));
    command
}

/// The JVM options every node runs with (`scripts/kafka/jvm.options`, as
/// `scripts/kafka.sh` and the Python harness read them: Kafka's own
/// launcher's, a heap of 512 MB).
fn jvm_options() -> Vec<String> {
    let path = scripts().join("kafka/jvm.options");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// A KRaft cluster id: 16 random bytes in unpadded base64url, drawn again
/// while it starts with `-` (StorageTool would read it as an option).
fn cluster_id() -> String {
    loop {
        let id = random_id();
        if !id.starts_with('-') {
            return id;
        }
    }
}

fn random_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes: [u8; 16] = rand::random();
    let mut bits = 0u32;
    let mut held = 0;
    let mut out = String::new();
    for b in bytes {
        bits = (bits << 8) | u32::from(b);
        held += 8;
        while held >= 6 {
            held -= 6;
            out.push(ALPHABET[((bits >> held) & 63) as usize] as char);
        }
    }
    if held > 0 {
        out.push(ALPHABET[((bits << (6 - held)) & 63) as usize] as char);
    }
    out
}

/// What makes a node differ from the plain one.
#[derive(Clone, Default)]
pub struct NodeSettings {
    /// The security protocol of the client listener (`PLAINTEXT` when
    /// empty), which is also the inter-broker listener.
    pub protocol: String,
    /// The security protocol of the controller listener (`PLAINTEXT` when
    /// empty).
    pub controller_protocol: String,
    /// More client listeners, as (name, security protocol), each on a free
    /// port ([`KafkaNode::listener_port`]).
    pub listeners: Vec<(String, String)>,
    /// More `server.properties` lines (`ssl.*`, `sasl.*`, the authorizer).
    pub properties: Vec<String>,
    /// More `StorageTool format` arguments (`--add-scram ...`).
    pub format_args: Vec<String>,
    /// The client settings that reach the node (security), for the check
    /// that it answers metadata; plain when empty.
    pub client: Vec<(String, String)>,
}

/// Where a node sits in its KRaft quorum.
struct Quorum {
    id: u32,
    /// The node's controller port.
    controller: u16,
    /// `controller.quorum.voters`.
    voters: String,
    /// Replicas of every topic and internal topic; `min.insync.replicas` is
    /// one less (at least 1).
    replication: u32,
    cluster_id: String,
}

impl Quorum {
    fn replication_lines(&self) -> Vec<String> {
        let (rf, isr) = (self.replication, self.replication.saturating_sub(1).max(1));
        vec![
            format!("default.replication.factor={rf}"),
            format!("min.insync.replicas={isr}"),
            format!("offsets.topic.replication.factor={rf}"),
            format!("transaction.state.log.replication.factor={rf}"),
            format!("transaction.state.log.min.isr={isr}"),
            format!("share.coordinator.state.topic.replication.factor={rf}"),
            format!("share.coordinator.state.topic.min.isr={isr}"),
        ]
    }
}

/// A Kafka node of a test's own, killed on drop. Its data folder survives
/// [`KafkaNode::kill9`] and [`KafkaNode::start_again`].
pub struct KafkaNode {
    pub bootstrap: String,
    pub port: u16,
    /// The ports of [`NodeSettings::listeners`], by name.
    listener_ports: Vec<(String, u16)>,
    /// The node's log (stdout and stderr of the JVM).
    pub log: PathBuf,
    dir: PathBuf,
    /// Removes `dir` on drop; `None` for the shared node, whose guard
    /// removes it once the test process is gone.
    _owned: Option<tempfile::TempDir>,
    guard: Option<Child>,
    settings: NodeSettings,
}

impl KafkaNode {
    /// Formats and starts a node of its own on free ports, and waits until it
    /// answers metadata.
    pub fn start(settings: NodeSettings) -> KafkaNode {
        let dir = tempfile::Builder::new()
            .prefix("hintstream-kafka-")
            .tempdir()
            .unwrap();
        let path = dir.path().to_path_buf();
        KafkaNode::create(path, Some(dir), settings)
    }

    /// [`KafkaNode::start`] in `dir`, which the node's guard removes once the
    /// test process is gone (for a node held in a static, never dropped).
    pub fn start_in(dir: PathBuf, settings: NodeSettings) -> KafkaNode {
        KafkaNode::create(dir, None, settings)
    }

    fn create(dir: PathBuf, owned: Option<tempfile::TempDir>, settings: NodeSettings) -> KafkaNode {
        let port = super::free_port();
        let controller = super::free_port();
        let quorum = Quorum {
            id: 1,
            controller,
            voters: format!("1@127.0.0.1:{controller}"),
            replication: 1,
            cluster_id: cluster_id(),
        };
        let mut node = KafkaNode::format(dir, owned, settings, port, &quorum);
        node.launch();
        node
    }

    /// Writes the node's `server.properties` for its place in `quorum` and
    /// formats its storage; does not start it.
    fn format(
        dir: PathBuf,
        owned: Option<tempfile::TempDir>,
        settings: NodeSettings,
        port: u16,
        quorum: &Quorum,
    ) -> KafkaNode {
        let controller = quorum.controller;
        let or_plain = |p: &str| {
            if p.is_empty() {
                "PLAINTEXT".to_string()
            } else {
                p.to_string()
            }
        };
        let (protocol, controller_protocol) = (
            or_plain(&settings.protocol),
            or_plain(&settings.controller_protocol),
        );
        let listener_ports: Vec<(String, u16)> = settings
            .listeners
            .iter()
            .map(|(name, _)| (name.clone(), super::free_port()))
            .collect();
        let (mut listeners, mut advertised, mut protocols) = (
            vec![format!("CLIENT://127.0.0.1:{port}")],
            vec![format!("CLIENT://127.0.0.1:{port}")],
            vec![
                format!("CLIENT:{protocol}"),
                format!("CONTROLLER:{controller_protocol}"),
            ],
        );
        for ((name, p), (_, lp)) in settings.listeners.iter().zip(&listener_ports) {
            listeners.push(format!("{name}://127.0.0.1:{lp}"));
            advertised.push(format!("{name}://127.0.0.1:{lp}"));
            protocols.push(format!("{name}:{p}"));
        }
        listeners.push(format!("CONTROLLER://127.0.0.1:{controller}"));
        let base = std::fs::read_to_string(scripts().join("kafka/node.properties")).unwrap();
        let mut lines = vec![
            base,
            "process.roles=broker,controller".into(),
            format!("node.id={}", quorum.id),
            format!("listeners={}", listeners.join(",")),
            format!("advertised.listeners={}", advertised.join(",")),
            format!("listener.security.protocol.map={}", protocols.join(",")),
            "inter.broker.listener.name=CLIENT".into(),
            format!("controller.quorum.voters={}", quorum.voters),
            format!("log.dirs={}", dir.join("data").display()),
        ];
        lines.extend(quorum.replication_lines());
        lines.extend(settings.properties.iter().cloned());
        let properties = dir.join("server.properties");
        std::fs::write(&properties, lines.join("\n") + "\n").unwrap();
        let out = kafka_java("WARN")
            .args([
                "kafka.tools.StorageTool",
                "format",
                "-t",
                &quorum.cluster_id,
                "-c",
            ])
            .arg(&properties)
            .args(&settings.format_args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run java (install Java 17+): {e}"));
        assert!(
            out.status.success(),
            "formatting the Kafka node in {}: {}{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        KafkaNode {
            bootstrap: format!("127.0.0.1:{port}"),
            port,
            listener_ports,
            log: dir.join("kafka.log"),
            dir,
            _owned: owned,
            guard: None,
            settings,
        }
    }

    /// Starts the JVM under its guard and waits until the node answers.
    fn launch(&mut self) {
        self.spawn();
        self.wait_ready();
    }

    /// Starts the JVM under its guard.
    fn spawn(&mut self) {
        // The guard: the JVM is its child; it SIGKILLs the JVM once the test
        // process is gone, then removes the node's folder. It exits when the
        // JVM does.
        const GUARD: &str = r#"
"$@" >>"$NODE_DIR/kafka.log" 2>&1 </dev/null &
jvm=$!
echo "$jvm" >"$NODE_DIR/pid"
( while kill -0 "$TEST_PID" 2>/dev/null; do sleep 1; done; kill -9 "$jvm" 2>/dev/null ) &
watcher=$!
wait "$jvm"
kill "$watcher" 2>/dev/null
kill -0 "$TEST_PID" 2>/dev/null || rm -rf "$NODE_DIR"
"#;
        let _ = std::fs::remove_file(self.dir.join("pid"));
        let mut command = Command::new("sh");
        command
            .args(["-c", GUARD, "kafka-node"])
            .arg("java")
            .args(jvm_options())
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                scripts().join("kafka/log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", libs().display()))
            .arg("kafka.Kafka")
            .arg(self.dir.join("server.properties"))
            .env("NODE_DIR", &self.dir)
            .env("TEST_PID", std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.guard = Some(command.spawn().expect("cannot start sh for the Kafka node"));
    }

    /// Waits until the node answers metadata; panics with its log when it
    /// exits first or takes longer than [`READY_WITHIN`].
    fn wait_ready(&mut self) {
        let client = self.settings.client.clone();
        let started = Instant::now();
        let deadline = started + READY_WITHIN;
        loop {
            if let Some(status) = self.guard.as_mut().and_then(|g| g.try_wait().unwrap()) {
                panic!(
                    "the Kafka node exited ({status}) before it answered:\n{}",
                    self.log_tail()
                );
            }
            if answers_metadata(&self.bootstrap, &client) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the Kafka node at {} did not answer metadata within {READY_WITHIN:?}:\n{}",
                self.bootstrap,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!(
            "kafka: node {} answered metadata {:.1?} after launch",
            self.bootstrap,
            started.elapsed()
        );
    }

    /// The last lines of the node's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The JVM's process id, while it runs.
    fn jvm_pid(&self) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(pid) = std::fs::read_to_string(self.dir.join("pid")) {
                if !pid.trim().is_empty() {
                    return Some(pid.trim().to_string());
                }
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: the node stops at once, mid-request. Its data stays.
    pub fn kill9(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            if let Some(pid) = self.jvm_pid() {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
            let _ = guard.wait();
        }
    }

    /// SIGSTOP: the node stops answering, connections stay open, as under
    /// a long pause or a starved machine. [`KafkaNode::resume`] before the
    /// node is dropped.
    pub fn stall(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`KafkaNode::stall`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.jvm_pid().expect("the Kafka node's pid");
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success(), "kill {sig} {pid} failed");
    }

    /// Starts it again on the same ports and data.
    pub fn start_again(&mut self) {
        assert!(self.guard.is_none(), "the Kafka node is still running");
        self.launch();
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the listener `name` of [`NodeSettings::listeners`].
    pub fn listener_port(&self, name: &str) -> u16 {
        self.listener_ports
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("no listener {name}"))
    }
}

impl Drop for KafkaNode {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Whether a metadata request to `bootstrap` succeeds within 2 s.
fn answers_metadata(bootstrap: &str, client: &[(String, String)]) -> bool {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (k, v) in client {
        config.set(k, v);
    }
    let consumer: BaseConsumer = match config.create() {
        Ok(c) => c,
        Err(_) => return false,
    };
    consumer
        .fetch_metadata(None, Duration::from_secs(2))
        .is_ok_and(|m| !m.brokers().is_empty())
}

/// The bootstrap servers of the node that every test of this binary shares:
/// `HINTSTREAM_TEST_BOOTSTRAP` when set (any running broker), else a node
/// started by the first test that asks, which lives until the test process
/// ends.
pub fn shared() -> &'static str {
    static SHARED: OnceLock<(String, Option<KafkaNode>)> = OnceLock::new();
    &SHARED
        .get_or_init(|| {
            if let Ok(bootstrap) = std::env::var("HINTSTREAM_TEST_BOOTSTRAP") {
                super::wait_for_broker(&bootstrap, Duration::from_secs(30));
                return (bootstrap, None);
            }
            let dir = tempfile::Builder::new()
                .prefix("hintstream-kafka-shared-")
                .tempdir()
                .unwrap()
                .keep();
            let node = KafkaNode::create(dir, None, NodeSettings::default());
            (node.bootstrap.clone(), Some(node))
        })
        .0
}

/// Three Kafka nodes of a test's own in one KRaft quorum (each a broker and a
/// controller), as `scripts/kafka.sh cluster` runs them: topics at
/// replication factor 3 and `min.insync.replicas=2`, so one node may die
/// without losing an acknowledged (`acks=all`) record. Nodes are numbered
/// 1 to 3, as their `node.id`s.
pub struct KafkaCluster {
    /// All three nodes' bootstrap servers.
    pub bootstrap: String,
    nodes: Vec<KafkaNode>,
}

impl KafkaCluster {
    /// Formats three nodes and starts them; waits until each answers.
    pub fn start() -> KafkaCluster {
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (super::free_port(), super::free_port())).collect();
        let voters = ports
            .iter()
            .enumerate()
            .map(|(i, (_, c))| format!("{}@127.0.0.1:{c}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let id = cluster_id();
        let mut nodes: Vec<KafkaNode> = ports
            .iter()
            .enumerate()
            .map(|(i, &(port, controller))| {
                let dir = tempfile::Builder::new()
                    .prefix(&format!("hintstream-kafka-cluster-{}-", i + 1))
                    .tempdir()
                    .unwrap();
                let quorum = Quorum {
                    id: i as u32 + 1,
                    controller,
                    voters: voters.clone(),
                    replication: 3,
                    cluster_id: id.clone(),
                };
                KafkaNode::format(
                    dir.path().to_path_buf(),
                    Some(dir),
                    NodeSettings::default(),
                    port,
                    &quorum,
                )
            })
            .collect();
        // A node answers only once the quorum has a leader: start all first.
        let started = Instant::now();
        nodes.iter_mut().for_each(KafkaNode::spawn);
        nodes.iter_mut().for_each(KafkaNode::wait_ready);
        eprintln!(
            "kafka: three-node cluster answered {:.1?} after launch",
            started.elapsed()
        );
        let bootstrap = nodes
            .iter()
            .map(|n| n.bootstrap.clone())
            .collect::<Vec<_>>()
            .join(",");
        KafkaCluster { bootstrap, nodes }
    }

    /// Node `id` (1 to 3).
    pub fn node(&mut self, id: i32) -> &mut KafkaNode {
        assert!(
            (1..=3).contains(&id),
            "the cluster's nodes are 1, 2 and 3 (got {id})"
        );
        &mut self.nodes[id as usize - 1]
    }

    /// SIGKILL of node `id`: it stops at once, mid-request; its data stays.
    pub fn kill9(&mut self, id: i32) {
        self.node(id).kill9();
    }

    /// Starts node `id` again on its ports and data; waits until it answers.
    pub fn start_again(&mut self, id: i32) {
        self.node(id).start_again();
    }

    /// Waits until every node's metadata shows `names` with their
    /// partitions: a topic just created is known to the controller first and
    /// reaches each broker a moment later, and a stage that asks a broker
    /// that has not heard of it yet exits 2 ("does not exist").
    pub async fn wait_for_topics(&self, names: &[String]) {
        for node in &self.nodes {
            super::wait_for_topics(&super::config_for(&node.bootstrap), names).await;
        }
    }

    /// The node leading `topic`'s `partition` now, from a metadata request
    /// to the nodes that run; `None` while it has no leader.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<i32> {
        let live: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.guard.is_some())
            .map(|n| n.bootstrap.as_str())
            .collect();
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", live.join(","))
            .create()
            .ok()?;
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()?;
        let leader = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)?
            .partitions()
            .iter()
            .find(|p| p.id() == partition)?
            .leader();
        (leader >= 1).then_some(leader)
    }
}
