//! Reaching a secured cluster, with real processes: tansu with SASL/SCRAM
//! behind a TLS terminator (socat; tansu's own TLS cannot be switched on),
//! certificates made by the `openssl` CLI for 127.0.0.1, the password taken
//! from the environment as `${KAFKA_PASSWORD}` in the config file. Both
//! stages run through it; a wrong password, a certificate from another CA
//! and an unset variable each stop a stage at once, saying why; mutual TLS
//! works; and no secret reaches a log, `hintstream config`, the eval report
//! or the cassette.

use crate::common;
use crate::common::llm_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hintstream::config::Config;
use llm_server::{Behavior, LlmServer};

const USER: &str = "trainer";
const PASSWORD: &str = "scram-pw-4bd01f9e";
const API_KEY: &str = "sk-ant-secure-cluster-test-key";

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
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
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
        let bundle = [
            std::fs::read_to_string(d.join("server.pem")).unwrap(),
            std::fs::read_to_string(d.join("server.key")).unwrap(),
        ]
        .concat();
        std::fs::write(d.join("server-bundle.pem"), bundle).unwrap();
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// tansu with SCRAM users on SQLite, behind socat terminating TLS on
/// `tls_port`; with `client_ca`, socat requires a client certificate signed
/// by it (mutual TLS).
struct SecureBroker {
    tansu: common::Tansu,
    _terminator: common::Process,
    tls_port: u16,
    _data: tempfile::TempDir,
}

impl SecureBroker {
    fn start(pki: &Pki, client_ca: Option<&Path>) -> SecureBroker {
        let data = tempfile::tempdir().unwrap();
        let mut tansu = common::start_tansu_on(common::Storage::Sqlite(data.path().to_path_buf()));
        // Users are created while the broker runs without authentication.
        let out = Command::new(common::tansu_binary())
            .args([
                "user",
                "create",
                "--broker",
                &format!("tcp://127.0.0.1:{}", tansu.port()),
                USER,
                PASSWORD,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tansu user create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tls_port = common::free_port();
        tansu.restart_with(Some(tls_port), &["--authentication"]);
        let verify = match client_ca {
            Some(ca) => format!("verify=1,cafile={}", ca.display()),
            None => "verify=0".into(),
        };
        let mut socat = Command::new("socat");
        socat.args([
            &format!(
                "OPENSSL-LISTEN:{tls_port},cert={},{verify},fork,reuseaddr",
                pki.path("server-bundle.pem").display()
            ),
            &format!("TCP:127.0.0.1:{}", tansu.port()),
        ]);
        let terminator = common::Process::spawn(socat, "socat");
        common::wait_for_port(tls_port, Duration::from_secs(10));
        SecureBroker {
            tansu,
            _terminator: terminator,
            tls_port,
            _data: data,
        }
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.tls_port)
    }
}

/// The config a trainer writes for the secured cluster: SASL_SSL, SCRAM,
/// the CA file, and the password from the environment.
fn secure_config(broker: &SecureBroker, ca: &Path) -> Config {
    let mut config = common::config_for(&broker.bootstrap());
    config.connect_timeout_secs = 15;
    config.kafka.insert("security.protocol", "SASL_SSL");
    config.kafka.insert("sasl.mechanism", "SCRAM-SHA-512");
    config.kafka.insert("sasl.username", USER);
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
    let mut c = config.clone();
    c.kafka.insert("sasl.password", PASSWORD);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_stages_run_over_scram_and_tls_and_no_secret_leaks() {
    let pki = Pki::new();
    let broker = SecureBroker::start(&pki, None);
    let server = LlmServer::start(Some(API_KEY)).await;
    server.default(Behavior::Derived(Duration::from_millis(10)));
    let mut config = secure_config(&broker, &pki.path("ca.pem"));
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
    config.hints.group_id = format!("{prefix}-hints");
    config.advantages.group_id = format!("{prefix}-advantages");
    config.hints.group_wait_ms = 300;
    let (hints_metrics, advantages_metrics) =
        (common::MetricsEndpoint::free(), common::MetricsEndpoint::free());
    config.hints.metrics_addr = hints_metrics.addr();
    config.advantages.metrics_addr = advantages_metrics.addr();
    let dir = tempfile::tempdir().unwrap();
    let file = write(&config, dir.path(), "secure.toml");

    let (out, _) = hintstream(&["topics", "create", "--partitions", "2"], &file, Some(PASSWORD));
    assert!(
        out.status.success(),
        "topics create over SASL_SSL:\n{}",
        text(&out)
    );

    let mut logs = vec![];
    let spawn = |stage: &str| {
        let mut command = common::stage_command(stage, &file);
        command
            .env("KAFKA_PASSWORD", PASSWORD)
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
        for secret in [PASSWORD, API_KEY] {
            assert!(!body.contains(secret), "{what} shows a secret:\n{body}");
        }
    }
    assert!(logs[2].1.contains("<redacted>"), "the config shows what it hides");
    drop(broker.tansu);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_an_untrusted_certificate_and_an_unset_variable_each_stop_the_stage_saying_why() {
    let pki = Pki::new();
    let broker = SecureBroker::start(&pki, None);
    let config = secure_config(&broker, &pki.path("ca.pem"));
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

/// Mutual TLS (the README's example): the broker's terminator requires a
/// client certificate signed by the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let pki = Pki::new();
    let ca = pki.path("ca.pem");
    let broker = SecureBroker::start(&pki, Some(&ca));
    let mut config = common::config_for(&broker.bootstrap());
    config.connect_timeout_secs = 10;
    // tansu still wants SASL behind the terminator; mTLS is the transport.
    config.kafka.insert("security.protocol", "SASL_SSL");
    config.kafka.insert("sasl.mechanism", "SCRAM-SHA-512");
    config.kafka.insert("sasl.username", USER);
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

    let (out, _) = hintstream(&["topics", "create"], &with, Some(PASSWORD));
    assert!(
        out.status.success(),
        "with the client certificate:\n{}",
        text(&out)
    );
    let (out, _) = hintstream(&["topics", "create"], &without, Some(PASSWORD));
    assert_eq!(out.status.code(), Some(1), "without it:\n{}", text(&out));
}

/// Confluent Cloud's shape (SASL_SSL with PLAIN and an API key and secret)
/// as the README writes it. The test broker offers only SCRAM once it
/// authenticates, so it cannot play Confluent's part: this checks the client
/// side of the example (it parses, its variables resolve, TLS verifies) and
/// that a mechanism the broker refuses is named, with the user, not looped
/// on, and that the secret is never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_confluent_cloud_example_reaches_the_broker_and_a_refused_mechanism_is_named() {
    let pki = Pki::new();
    let broker = SecureBroker::start(&pki, None);
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
