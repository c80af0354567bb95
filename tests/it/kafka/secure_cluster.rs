//! Reaching a secured cluster, with real processes: an Apache Kafka node
//! with its own SASL_SSL listener (SCRAM-SHA-512, PEM key stores made by the
//! `openssl` CLI for 127.0.0.1) and the StandardAuthorizer, the password
//! taken from the environment as `${KAFKA_PASSWORD}` in the config file.
//! Both stages run through it, each as its own principal with only the
//! book's ACLs (docs/acls.md, "ACLs per stage", applied with Kafka's AclCommand); a stage
//! whose principal lacks WRITE on a topic it writes exits 1 before consuming,
//! naming the topic and the ACL; a wrong password, a certificate from another
//! CA and an unset variable each stop a stage at once, saying why; mutual
//! TLS works; and no secret reaches a log, `hintstream config`, the eval
//! report or the cassette.

use crate::common;
use crate::common::llm_server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hintstream::config::Config;
use llm_server::{Behavior, LlmServer};

const USER: &str = "trainer";
const PASSWORD: &str = "scram-pw-4bd01f9e";
const ADMIN: &str = "admin";
const ADMIN_PASSWORD: &str = "admin-pw-9d3c7a21";
const HINTS_USER: &str = "hints";
const HINTS_PASSWORD: &str = "hints-pw-5e8f0b46";
const ADVANTAGES_USER: &str = "advantages";
const ADVANTAGES_PASSWORD: &str = "advantages-pw-1a6d2c93";
const API_KEY: &str = "sk-ant-secure-cluster-test-key";
/// Every SCRAM user of the test broker.
const USERS: [(&str, &str); 4] = [
    (ADMIN, ADMIN_PASSWORD),
    (USER, PASSWORD),
    (HINTS_USER, HINTS_PASSWORD),
    (ADVANTAGES_USER, ADVANTAGES_PASSWORD),
];

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private CA, a server certificate for 127.0.0.1 signed by it, a client
/// certificate signed by it (mutual TLS), and an unrelated CA.
struct Pki {
    dir: PathBuf,
    /// Removes `dir` on drop, for a test's own certificates.
    _owned: Option<tempfile::TempDir>,
}

impl Pki {
    /// Certificates in a folder of their own.
    fn new() -> Pki {
        let owned = tempfile::tempdir().unwrap();
        let mut pki = Pki::new_in(owned.path().to_path_buf());
        pki._owned = Some(owned);
        pki
    }

    /// Certificates in `dir`, which the caller removes.
    fn new_in(dir: PathBuf) -> Pki {
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.as_path();
        for ca in ["ca", "other-ca"] {
            openssl(
                d,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN=hintstream test {ca}"),
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.pem"),
                ],
            );
        }
        std::fs::write(d.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        for (name, cn) in [("server", "127.0.0.1"), ("client", USER)] {
            openssl(
                d,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-subj",
                    &format!("/CN={cn}"),
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                ],
            );
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    "san.ext",
                    "-out",
                    &format!("{name}.pem"),
                ],
            );
        }
        // PEM key stores: the certificate and its key in one file.
        for name in ["server", "client"] {
            let bundle = [
                std::fs::read_to_string(d.join(format!("{name}.pem"))).unwrap(),
                std::fs::read_to_string(d.join(format!("{name}.key"))).unwrap(),
            ]
            .concat();
            std::fs::write(d.join(format!("{name}-bundle.pem")), bundle).unwrap();
        }
        Pki { dir, _owned: None }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// An Apache Kafka node: its client listener SASL_SSL with SCRAM-SHA-512
/// users made at format time and PEM key stores, a second SASL_SSL listener
/// (`MTLS`) that requires a client certificate signed by the CA (mutual
/// TLS), the StandardAuthorizer with `admin` as super user, and its
/// controller listener on TLS where the node's own certificate is its
/// principal.
struct SecureBroker {
    node: common::KafkaNode,
    tls_port: u16,
    /// The admin's client config for Kafka's Java tools (AclCommand).
    admin_properties: PathBuf,
}

fn jaas(user: &str, password: &str) -> String {
    format!("org.apache.kafka.common.security.scram.ScramLoginModule required username=\"{user}\" password=\"{password}\";")
}

/// The broker (and its certificates) that the tests share, all but the one
/// that takes ACLs away; its folder goes once the test process is gone.
fn shared() -> &'static (Pki, SecureBroker) {
    static SHARED: std::sync::OnceLock<(Pki, SecureBroker)> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("hintstream-kafka-secure-")
            .tempdir()
            .unwrap()
            .keep();
        let pki = Pki::new_in(dir.join("pki"));
        let broker = SecureBroker::start_in(&pki, Some(dir));
        (pki, broker)
    })
}

impl SecureBroker {
    /// A broker of the test's own.
    fn start(pki: &Pki) -> SecureBroker {
        SecureBroker::start_in(pki, None)
    }

    /// A broker in `dir` (which its guard removes once the test process is
    /// gone), or in a folder of its own.
    fn start_in(pki: &Pki, dir: Option<PathBuf>) -> SecureBroker {
        let ca = pki.path("ca.pem");
        let properties = vec![
            "sasl.enabled.mechanisms=SCRAM-SHA-512".to_string(),
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512".into(),
            format!(
                "listener.name.client.scram-sha-512.sasl.jaas.config={}",
                jaas(ADMIN, ADMIN_PASSWORD)
            ),
            format!(
                "listener.name.mtls.scram-sha-512.sasl.jaas.config={}",
                jaas(ADMIN, ADMIN_PASSWORD)
            ),
            "listener.name.mtls.ssl.client.auth=required".into(),
            "ssl.keystore.type=PEM".into(),
            format!(
                "ssl.keystore.location={}",
                pki.path("server-bundle.pem").display()
            ),
            "ssl.truststore.type=PEM".into(),
            format!("ssl.truststore.location={}", ca.display()),
            "listener.name.controller.ssl.client.auth=required".into(),
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer".into(),
            // The node's certificate (CN=127.0.0.1) is the broker's principal
            // on its controller listener.
            format!("super.users=User:{ADMIN};User:CN=127.0.0.1"),
        ];
        let client = [
            ("security.protocol", "SASL_SSL".to_string()),
            ("sasl.mechanism", "SCRAM-SHA-512".into()),
            ("sasl.username", ADMIN.into()),
            ("sasl.password", ADMIN_PASSWORD.into()),
            ("ssl.ca.location", ca.display().to_string()),
        ];
        let admin = [
            "security.protocol=SASL_SSL".to_string(),
            "sasl.mechanism=SCRAM-SHA-512".into(),
            format!("sasl.jaas.config={}", jaas(ADMIN, ADMIN_PASSWORD)),
            "ssl.truststore.type=PEM".into(),
            format!("ssl.truststore.location={}", ca.display()),
        ];
        let format_args = USERS
            .iter()
            .flat_map(|(user, password)| {
                [
                    "--add-scram".to_string(),
                    format!("SCRAM-SHA-512=[name={user},password={password}]"),
                ]
            })
            .collect();
        let settings = common::NodeSettings {
            protocol: "SASL_SSL".into(),
            controller_protocol: "SSL".into(),
            listeners: vec![("MTLS".into(), "SASL_SSL".into())],
            properties,
            format_args,
            client: client.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        };
        let node = match dir {
            Some(dir) => common::KafkaNode::start_in(dir, settings),
            None => common::KafkaNode::start(settings),
        };
        let admin_properties = pki.path("admin.properties");
        std::fs::write(&admin_properties, admin.join("\n") + "\n").unwrap();
        SecureBroker {
            tls_port: node.port(),
            node,
            admin_properties,
        }
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.tls_port)
    }

    /// The listener that requires a client certificate.
    fn mtls_bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.node.listener_port("MTLS"))
    }

    /// Kafka's AclCommand (`kafka-acls.sh`) with `args`, as the admin.
    fn acls(&self, args: &[String]) -> Child {
        common::kafka::kafka_java("WARN")
            .arg("org.apache.kafka.tools.AclCommand")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Runs `kafka-acls.sh` command lines (their arguments) at once, and
    /// checks that each succeeded. `$B` and `admin.properties` stand for this
    /// broker and its admin's config.
    fn run_acl_commands(&self, lines: &[Vec<String>]) {
        let children: Vec<(String, Child)> = lines
            .iter()
            .map(|line| {
                let args: Vec<String> = line
                    .iter()
                    .map(|a| match a.as_str() {
                        "$B" => self.bootstrap(),
                        "admin.properties" => self.admin_properties.display().to_string(),
                        _ => a.clone(),
                    })
                    .collect();
                (line.join(" "), self.acls(&args))
            })
            .collect();
        for (line, child) in children {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "kafka-acls.sh {line}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Applies the book's "ACLs per stage" (docs/acls.md), line by line.
    fn apply_book_acls(&self) {
        self.run_acl_commands(&book_acl_lines());
    }
}

/// The `kafka-acls.sh` lines of the book's "ACLs per stage" block
/// (docs/acls.md), as their arguments.
fn book_acl_lines() -> Vec<Vec<String>> {
    let chapter =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/acls.md")).unwrap();
    let section = &chapter[chapter
        .find("# ACLs per stage")
        .expect("docs/acls.md has \"# ACLs per stage\"")..];
    let block = section
        .split("```sh")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block under \"ACLs per stage\"");
    let lines: Vec<Vec<String>> = block
        .lines()
        .filter_map(|l| l.strip_prefix("kafka-acls.sh "))
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    assert!(lines.len() >= 4, "kafka-acls.sh lines in docs/acls.md: {lines:?}");
    lines
}

/// Topics of the test's own for every stage (on the shared broker, the
/// default topics belong to the test that runs both stages under the
/// book's ACLs).
fn own_pipeline_topics(config: &mut Config) {
    let prefix = common::unique("sec");
    config.topics.failed = format!("{prefix}.failed");
    config.topics.hints = format!("{prefix}.hints");
    config.topics.scored = format!("{prefix}.scored");
    config.topics.advantages = format!("{prefix}.advantages");
    config.topics.metrics = format!("{prefix}.metrics");
    config.hints.input_topic = config.topics.failed.clone();
    config.hints.output_topic = config.topics.hints.clone();
    config.hints.dlq_topic = format!("{}.dlq", config.topics.failed);
    config.advantages.input_topic = config.topics.scored.clone();
    config.advantages.output_topic = config.topics.advantages.clone();
    config.advantages.dlq_topic = format!("{}.dlq", config.topics.scored);
}

/// The config a trainer writes for the secured cluster: SASL_SSL, SCRAM,
/// the CA file, and the password from the environment.
fn secure_config(broker: &SecureBroker, ca: &Path) -> Config {
    secure_config_as(broker, ca, USER)
}

/// [`secure_config`] for the principal `user`.
fn secure_config_as(broker: &SecureBroker, ca: &Path, user: &str) -> Config {
    let mut config = common::config_for(&broker.bootstrap());
    config.connect_timeout_secs = 15;
    config.kafka.insert("security.protocol", "SASL_SSL");
    config.kafka.insert("sasl.mechanism", "SCRAM-SHA-512");
    config.kafka.insert("sasl.username", user);
    config.kafka.insert("sasl.password", "${KAFKA_PASSWORD}");
    config
        .kafka
        .insert("ssl.ca.location", ca.display().to_string().as_str());
    config
}

/// Writes `config` to a file (its `${...}` references unresolved) and
/// returns the path.
fn write(config: &Config, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, toml::to_string(config).unwrap()).unwrap();
    path
}

/// `hintstream ARGS --config FILE` with `KAFKA_PASSWORD` set to `password`
/// (unset when `None`), its output, and how long it took.
fn hintstream(args: &[&str], file: &Path, password: Option<&str>) -> (std::process::Output, Duration) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
    common::without_llm_env(&mut command)
        .args(args)
        .arg("--config")
        .arg(file)
        .env_remove("KAFKA_PASSWORD");
    if let Some(p) = password {
        command.env("KAFKA_PASSWORD", p);
    }
    let started = Instant::now();
    let out = command.stdin(Stdio::null()).output().unwrap();
    (out, started.elapsed())
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The same config with `${KAFKA_PASSWORD}` resolved, for the test's own
/// clients.
fn resolved(config: &Config) -> Config {
    resolved_as(config, PASSWORD)
}

/// The same config with `password` in place of `${KAFKA_PASSWORD}`.
fn resolved_as(config: &Config, password: &str) -> Config {
    let mut c = config.clone();
    c.kafka.insert("sasl.password", password);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_stages_run_over_scram_and_tls_and_no_secret_leaks() {
    let (pki, broker) = shared();

    let server = LlmServer::start(Some(API_KEY)).await;
    server.default(Behavior::Derived(Duration::from_millis(10)));
    // The default topic, group and transactional-id names (the broker is
    // the test's own), which the book's ACL lines name.
    let ca = pki.path("ca.pem");
    let mut config = secure_config(broker, &ca);
    config.hints.group_wait_ms = 300;
    // A budget: stage 1 reads and writes the spend ledger (rl.hints.spend)
    // under the book's ACLs too.
    config.llm.budget_usd_per_hour = 100.0;
    let (hints_metrics, advantages_metrics) =
        (common::MetricsEndpoint::free(), common::MetricsEndpoint::free());
    config.hints.metrics_addr = hints_metrics.addr();
    config.advantages.metrics_addr = advantages_metrics.addr();
    let dir = tempfile::tempdir().unwrap();
    let file = write(&config, dir.path(), "secure.toml");
    let as_user = |user: &str| {
        let mut c = config.clone();
        c.kafka.insert("sasl.username", user);
        write(&c, dir.path(), &format!("{user}.toml"))
    };
    let (admin_file, hints_file, advantages_file) =
        (as_user(ADMIN), as_user(HINTS_USER), as_user(ADVANTAGES_USER));

    let (out, _) = hintstream(
        &["topics", "create", "--partitions", "2"],
        &admin_file,
        Some(ADMIN_PASSWORD),
    );
    assert!(
        out.status.success(),
        "topics create over SASL_SSL:\n{}",
        text(&out)
    );
    // Each stage as its own principal, with only the book's ACLs.
    broker.apply_book_acls();

    let mut logs = vec![];
    let spawn = |stage: &str| {
        let (file, password) = match stage {
            "hints" => (&hints_file, HINTS_PASSWORD),
            _ => (&advantages_file, ADVANTAGES_PASSWORD),
        };
        let mut command = common::stage_command(stage, file);
        command
            .env("KAFKA_PASSWORD", password)
            .env("RUST_LOG", "debug,rdkafka=debug,librdkafka=debug");
        if stage == "hints" {
            command
                .env("ANTHROPIC_API_KEY", API_KEY)
                .env("ANTHROPIC_BASE_URL", server.base_url());
        }
        common::Process::spawn(command, &format!("secure-{stage}"))
    };
    let hints = spawn("hints");
    let advantages = spawn("advantages");
    let context = || format!("--- hints\n{}\n--- advantages\n{}", hints.log(), advantages.log());
    hints_metrics.wait_assigned("hints", context).await;
    advantages_metrics.wait_assigned("advantages", context).await;

    // The trainer's side, through the CLI over the same secured config.
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data");
    let failed = data.join("failed_trajectories.jsonl");
    let (out, _) = hintstream(
        &[
            "produce",
            "--topic",
            &config.topics.failed,
            failed.to_str().unwrap(),
        ],
        &file,
        Some(PASSWORD),
    );
    assert!(out.status.success(), "{}", text(&out));
    let groups = 20.0;
    hints_metrics
        .wait_for(
            "hintstream_hints_hints_published_total",
            &[("category", "llm_synthesized")],
            |n| n >= groups,
            Duration::from_secs(90),
            context,
        )
        .await;
    hints_metrics
        .wait_for(
            "hintstream_hints_llm_ledger_records_published_total",
            &[],
            |n| n >= 1.0,
            Duration::from_secs(30),
            context,
        )
        .await;
    let scored = data.join("scored_rollouts.jsonl");
    let (out, _) = hintstream(
        &[
            "produce",
            "--topic",
            &config.topics.scored,
            scored.to_str().unwrap(),
        ],
        &file,
        Some(PASSWORD),
    );
    assert!(out.status.success(), "{}", text(&out));
    advantages_metrics
        .wait_for(
            "hintstream_advantages_steps_published_total",
            &[],
            |n| n >= 1.0,
            Duration::from_secs(90),
            context,
        )
        .await;
    let published = common::read_topic(&resolved(&config), &config.topics.advantages).await;
    assert!(!published.is_empty(), "advantages read back over SASL_SSL");
    let hints_out = common::read_topic(&resolved(&config), &config.topics.hints).await;
    assert_eq!(hints_out.len(), 20);
    logs.push(("hints log", hints.log()));
    logs.push(("advantages log", advantages.log()));
    drop(hints);
    drop(advantages);

    // What a user prints or keeps: the resolved config, an eval report and
    // its cassette, made with the same key.
    let (out, _) = hintstream(&["config"], &file, Some(PASSWORD));
    assert!(out.status.success(), "{}", text(&out));
    logs.push(("hintstream config", text(&out)));
    let eval_dir = tempfile::tempdir().unwrap();
    let mut eval = Command::new(env!("CARGO_BIN_EXE_hintstream"));
    let out = common::without_llm_env(&mut eval)
        .args(["eval", "--input", failed.to_str().unwrap(), "--out"])
        .arg(eval_dir.path())
        .arg("--config")
        .arg(&file)
        .env("KAFKA_PASSWORD", PASSWORD)
        .env("ANTHROPIC_API_KEY", API_KEY)
        .env("ANTHROPIC_BASE_URL", server.base_url())
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    logs.push(("eval output", text(&out)));
    for name in ["report.json", "index.html", "cassette.jsonl"] {
        logs.push((name, std::fs::read_to_string(eval_dir.path().join(name)).unwrap()));
    }
    for (what, body) in &logs {
        assert!(!body.is_empty(), "{what} is empty");
        for secret in [
            PASSWORD,
            ADMIN_PASSWORD,
            HINTS_PASSWORD,
            ADVANTAGES_PASSWORD,
            API_KEY,
        ] {
            assert!(!body.contains(secret), "{what} shows a secret:\n{body}");
        }
    }
    assert!(logs[2].1.contains("<redacted>"), "the config shows what it hides");
}

/// Least privilege refused at start-up: with the book's ACLs less stage
/// 1's WRITE on its output topic and stage 2's WRITE on its dead-letter
/// topic, each stage exits 1 within the connect bound, naming the topic and
/// the missing ACL, before it joins its group or takes a message; so does
/// stage 1 under a budget without WRITE on its spend ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_lacking_write_on_a_topic_it_writes_exits_1_naming_it_before_consuming() {
    let pki = Pki::new();
    let broker = SecureBroker::start(&pki);
    let ca = pki.path("ca.pem");
    let dir = tempfile::tempdir().unwrap();
    let write_as = |user: &str| {
        write(
            &secure_config_as(&broker, &ca, user),
            dir.path(),
            &format!("{user}.toml"),
        )
    };
    let config = secure_config(&broker, &ca);
    let (out, _) = hintstream(&["topics", "create"], &write_as(ADMIN), Some(ADMIN_PASSWORD));
    assert!(out.status.success(), "{}", text(&out));
    broker.apply_book_acls();
    let write_acl = |change: &[&'static str], principal: &str, topic: &str| {
        ["--bootstrap-server", "$B", "--command-config", "admin.properties"]
            .into_iter()
            .chain(change.iter().copied())
            .chain([
                "--allow-principal",
                principal,
                "--operation",
                "Write",
                "--topic",
                topic,
            ])
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let remove = |principal: &str, topic: &str| write_acl(&["--remove", "--force"], principal, topic);
    broker.run_acl_commands(&[
        remove("User:hints", &config.hints.output_topic),
        remove("User:advantages", &config.advantages.dlq_topic),
    ]);
    // Work waits on both inputs.
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data");
    let trainer = write_as(USER);
    for (topic, file) in [
        (&config.hints.input_topic, "failed_trajectories.jsonl"),
        (&config.advantages.input_topic, "scored_rollouts.jsonl"),
    ] {
        let path = data.join(file);
        let (out, _) = hintstream(
            &["produce", "--topic", topic, path.to_str().unwrap()],
            &trainer,
            Some(PASSWORD),
        );
        assert!(out.status.success(), "{}", text(&out));
    }
    let bound = Duration::from_secs(config.connect_timeout_secs);
    for (stage, user, password, topic) in [
        ("hints", HINTS_USER, HINTS_PASSWORD, &config.hints.output_topic),
        (
            "advantages",
            ADVANTAGES_USER,
            ADVANTAGES_PASSWORD,
            &config.advantages.dlq_topic,
        ),
    ] {
        let (out, took) = hintstream(&[stage], &write_as(user), Some(password));
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{stage}: {said}");
        assert!(
            said.contains(&format!("missing ACLs for User:{user}"))
                && said.contains(&format!("WRITE on topic \"{topic}\"")),
            "{stage}: {said}"
        );
        assert!(took < bound, "{stage} took {took:?}, bound {bound:?}");
    }
    // Stage 1 under a budget reads and writes its spend ledger, one topic
    // asked about once for both: without WRITE on it (its output topic
    // granted again), it exits 1 naming it.
    broker.run_acl_commands(&[
        write_acl(&["--add"], "User:hints", &config.hints.output_topic),
        remove("User:hints", &config.topics.spend),
    ]);
    let mut budgeted = secure_config_as(&broker, &ca, HINTS_USER);
    budgeted.llm.budget_usd_per_hour = 100.0;
    let (out, took) = hintstream(
        &["hints"],
        &write(&budgeted, dir.path(), "budgeted.toml"),
        Some(HINTS_PASSWORD),
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "hints under a budget: {said}");
    assert!(
        said.contains(&format!("missing ACLs for User:{HINTS_USER}"))
            && said.contains(&format!("WRITE on topic \"{}\"", config.topics.spend)),
        "hints under a budget: {said}"
    );
    assert!(
        took < bound,
        "hints under a budget took {took:?}, bound {bound:?}"
    );
    // Neither joined its group nor took a message: no offsets committed.
    let admin = resolved_as(&secure_config_as(&broker, &ca, ADMIN), ADMIN_PASSWORD);
    for (group, topic) in [
        (&config.hints.group_id, &config.hints.input_topic),
        (&config.advantages.group_id, &config.advantages.input_topic),
    ] {
        let committed = common::committed_offsets(&admin, group, topic, config.topics.partitions).await;
        assert!(committed.is_empty(), "{group} committed {committed:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_an_untrusted_certificate_and_an_unset_variable_each_stop_the_stage_saying_why() {
    let (pki, broker) = shared();

    let config = secure_config(broker, &pki.path("ca.pem"));
    let dir = tempfile::tempdir().unwrap();
    let file = write(&config, dir.path(), "secure.toml");
    let bound = Duration::from_secs(config.connect_timeout_secs);

    let (out, took) = hintstream(&["hints"], &file, Some("not-the-password"));
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("authentication failed (SCRAM-SHA-512, user trainer)"),
        "{said}"
    );
    assert!(took < bound, "took {took:?}, bound {bound:?}");
    assert!(
        !said.contains("not-the-password"),
        "the wrong password is not printed either"
    );

    let mut other_ca = config.clone();
    other_ca.kafka.insert(
        "ssl.ca.location",
        pki.path("other-ca.pem").display().to_string().as_str(),
    );
    let other_file = write(&other_ca, dir.path(), "other-ca.toml");
    let (out, took) = hintstream(&["advantages"], &other_file, Some(PASSWORD));
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "TLS certificate verification failed for 127.0.0.1:{}",
            broker.tls_port
        )),
        "{said}"
    );
    assert!(took < bound, "took {took:?}");

    let (out, _) = hintstream(&["hints"], &file, None);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("KAFKA_PASSWORD") && said.contains("sasl.password"),
        "{said}"
    );
}

/// Mutual TLS (the book's example, docs/clusters.md): the broker's `MTLS` listener requires
/// a client certificate signed by the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let (pki, broker) = shared();
    let ca = pki.path("ca.pem");
    let mut config = common::config_for(&broker.mtls_bootstrap());
    own_pipeline_topics(&mut config);
    config.connect_timeout_secs = 10;
    // The listener authenticates with SASL too; mTLS is the transport. The
    // admin creates the topics (the authorizer lets no one else).
    config.kafka.insert("security.protocol", "SASL_SSL");
    config.kafka.insert("sasl.mechanism", "SCRAM-SHA-512");
    config.kafka.insert("sasl.username", ADMIN);
    config.kafka.insert("sasl.password", "${KAFKA_PASSWORD}");
    config
        .kafka
        .insert("ssl.ca.location", ca.display().to_string().as_str());
    let dir = tempfile::tempdir().unwrap();
    let without = write(&config, dir.path(), "no-client-cert.toml");
    config.kafka.insert(
        "ssl.certificate.location",
        pki.path("client.pem").display().to_string().as_str(),
    );
    config.kafka.insert(
        "ssl.key.location",
        pki.path("client.key").display().to_string().as_str(),
    );
    let with = write(&config, dir.path(), "client-cert.toml");

    let (out, _) = hintstream(&["topics", "create"], &with, Some(ADMIN_PASSWORD));
    assert!(
        out.status.success(),
        "with the client certificate:\n{}",
        text(&out)
    );
    let (out, _) = hintstream(&["topics", "create"], &without, Some(ADMIN_PASSWORD));
    assert_eq!(out.status.code(), Some(1), "without it:\n{}", text(&out));
}

/// Confluent Cloud's shape (SASL_SSL with PLAIN and an API key and secret)
/// as the book writes it. The test broker offers only SCRAM once it
/// authenticates, so it cannot play Confluent's part: this checks the client
/// side of the example (it parses, its variables resolve, TLS verifies) and
/// that a mechanism the broker refuses is named, with the user, not looped
/// on, and that the secret is never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_confluent_cloud_example_reaches_the_broker_and_a_refused_mechanism_is_named() {
    let (pki, broker) = shared();

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("confluent.toml");
    std::fs::write(
        &file,
        format!(
            r#"bootstrap_servers = "{}"
connect_timeout_secs = 10

[kafka]
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "PLAIN"
"sasl.username" = "${{CONFLUENT_API_KEY}}"
"sasl.password" = "${{CONFLUENT_API_SECRET}}"
"ssl.ca.location" = "{}"
"#,
            broker.bootstrap(),
            pki.path("ca.pem").display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hintstream"))
        .args(["topics", "create", "--config"])
        .arg(&file)
        .env("CONFLUENT_API_KEY", "ABCDEFG")
        .env("CONFLUENT_API_SECRET", "cflt-secret-value")
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("authentication failed (PLAIN, user ABCDEFG)"),
        "{said}"
    );
    assert!(!said.contains("certificate"), "TLS itself verified: {said}");
    assert!(!said.contains("cflt-secret-value"), "{said}");
}
