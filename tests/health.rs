//! Health endpoints of the stages, as processes on a Kafka node of the
//! test's own (its data survives a restart): `/readyz` answers 503 with a
//! reason while a stage has not joined its group (another member holds the
//! partitions), 200 once it is assigned (stage 1: and once its LLM provider
//! answered), 503 within 30 s of the broker being killed (SIGKILL), and 200
//! again when the broker is back; `/healthz` answers 200 throughout; the
//! `ready` gauges follow. The stages log to files without colour codes.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::MetricsEndpoint;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// How long the broker's death may take to show on `/readyz`.
const NOT_READY_WITHIN: Duration = Duration::from_secs(30);

/// Waits until `GET path` answers with a status `until` accepts; that
/// answer, and how long it took.
async fn wait_status(
    endpoint: MetricsEndpoint,
    path: &str,
    until: impl Fn(u16, &str) -> bool,
    within: Duration,
    context: impl Fn() -> String,
) -> ((u16, String), Duration) {
    let started = Instant::now();
    let mut last = None;
    loop {
        if let Some((status, body)) = endpoint.get(path).await {
            if until(status, &body) {
                return ((status, body), started.elapsed());
            }
            last = Some((status, body));
        }
        assert!(
            started.elapsed() < within,
            "{path} on {} answered {last:?} for {within:?}\n{}",
            endpoint.0,
            context()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A model API that takes connections but answers none until
/// [`SilentLlm::answer`]: then every request gets a 404, which is an answer.
struct SilentLlm {
    listener: Option<TcpListener>,
    port: u16,
}

impl SilentLlm {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        SilentLlm {
            listener: Some(listener),
            port,
        }
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts answering, the connections waiting in the backlog first.
    fn answer(&mut self) {
        let listener = self.listener.take().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                std::thread::spawn(move || {
                    let mut request = [0u8; 4096];
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let _ = stream.read(&mut request);
                    let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
                });
            }
        });
    }
}

/// A consumer of `group` that holds every partition of `topic` until dropped.
fn hold(config: &hintstream::config::Config, group: &str, topic: &str) -> BaseConsumer {
    let mut client = hintstream::kafka::base_config(config);
    client
        .set("group.id", group)
        .set("partition.assignment.strategy", "cooperative-sticky");
    let holder: BaseConsumer = client.create().unwrap();
    holder.subscribe(&[topic]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while holder.assignment().unwrap().count() == 0 {
        let _ = holder.poll(Duration::from_millis(100));
        assert!(
            Instant::now() < deadline,
            "the holder of {group} got no partition"
        );
    }
    holder
}

fn start(stage: &str, config_file: &std::path::Path, llm: Option<&SilentLlm>) -> common::Process {
    let mut command = common::stage_command(stage, config_file);
    command.env("RUST_LOG", "info").env_remove("NO_COLOR");
    if let Some(llm) = llm {
        command
            .env("ANTHROPIC_API_KEY", "sk-k")
            .env("ANTHROPIC_BASE_URL", llm.base_url());
    }
    common::Process::spawn(command, &format!("health-{stage}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_follows_assignment_the_llm_and_the_broker() {
    let mut broker = common::own_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "failed", "hints");
    common::own_topics(&mut config.advantages, "scored", "advantages");
    config.topics.metrics = common::unique("metrics");
    let (hints, advantages) = (MetricsEndpoint::free(), MetricsEndpoint::free());
    config.hints.metrics_addr = hints.addr();
    config.advantages.metrics_addr = advantages.addr();
    let (h, a) = (config.hints.clone(), config.advantages.clone());
    common::create_pipeline_topics(&config, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    // Members that hold every partition of the stages' groups, so that a
    // stage starts unassigned.
    let holders = [
        hold(&config, &h.group_id, &h.input_topic),
        hold(&config, &a.group_id, &a.input_topic),
    ];
    let mut llm = SilentLlm::start();
    let hints_process = start("hints", &file, Some(&llm));
    let advantages_process = start("advantages", &file, None);
    let logs = || {
        format!(
            "--- hints\n{}\n--- advantages\n{}",
            hints_process.log(),
            advantages_process.log()
        )
    };

    // Before the stage is in its group, and so unassigned: 503 with a
    // reason; alive all along.
    for (endpoint, prefix) in [(hints, "hintstream_hints"), (advantages, "hintstream_advantages")] {
        let ((status, body), _) =
            wait_status(endpoint, "/readyz", |_, _| true, Duration::from_secs(60), logs).await;
        assert_eq!(status, 503, "{prefix}: {body}\n{}", logs());
        assert!(
            body.starts_with("not ready: the consumer has not joined its group"),
            "{prefix}: {body}"
        );
        assert_eq!(
            endpoint
                .value(&format!("{prefix}_assigned_partitions"), &[])
                .await,
            0.0
        );
        assert_eq!(endpoint.value(&format!("{prefix}_ready"), &[]).await, 0.0);
        assert_eq!(endpoint.get("/healthz").await, Some((200, "ok\n".to_string())));
    }

    // The holders leave: stage 2 turns ready once assigned; stage 1 once its
    // LLM provider also answered.
    tokio::task::spawn_blocking(move || drop(holders)).await.unwrap();
    let ((_, body), took) = wait_status(
        advantages,
        "/readyz",
        |s, _| s == 200,
        Duration::from_secs(60),
        logs,
    )
    .await;
    assert_eq!(body, "ready\n");
    println!("advantages ready {took:?} after the holders left");
    advantages
        .wait_for(
            "hintstream_advantages_assigned_partitions",
            &[],
            |n| n == 2.0,
            Duration::from_secs(30),
            logs,
        )
        .await;
    assert_eq!(advantages.value("hintstream_advantages_ready", &[]).await, 1.0);
    let ((_, body), _) = wait_status(
        hints,
        "/readyz",
        |_, body| body.contains("LLM provider has not answered"),
        Duration::from_secs(60),
        logs,
    )
    .await;
    assert!(body.contains("claude"), "names the models: {body}");
    hints
        .wait_for(
            "hintstream_hints_assigned_partitions",
            &[],
            |n| n == 2.0,
            Duration::from_secs(30),
            logs,
        )
        .await;
    assert_eq!(hints.get("/readyz").await.map(|(s, _)| s), Some(503));
    assert_eq!(hints.value("hintstream_hints_ready", &[]).await, 0.0);
    llm.answer();
    let (_, took) = wait_status(hints, "/readyz", |s, _| s == 200, Duration::from_secs(45), logs).await;
    println!("hints ready {took:?} after its LLM provider answered");
    assert_eq!(hints.value("hintstream_hints_ready", &[]).await, 1.0);

    // The broker dies: not ready within 30 s, still alive.
    broker.kill9();
    for (endpoint, gauge) in [
        (hints, "hintstream_hints_ready"),
        (advantages, "hintstream_advantages_ready"),
    ] {
        let ((_, body), took) =
            wait_status(endpoint, "/readyz", |s, _| s == 503, NOT_READY_WITHIN, logs).await;
        println!("{gauge}: not ready {took:?} after the broker was killed: {body}");
        assert_eq!(endpoint.get("/healthz").await, Some((200, "ok\n".to_string())));
        assert_eq!(endpoint.value(gauge, &[]).await, 0.0);
    }

    // It comes back: ready again.
    broker.start_again();
    for endpoint in [hints, advantages] {
        let (_, took) = wait_status(
            endpoint,
            "/readyz",
            |s, _| s == 200,
            Duration::from_secs(90),
            logs,
        )
        .await;
        println!("{}: ready again {took:?} after the broker restarted", endpoint.0);
    }

    // Logs to a file: plain text, no ANSI escape codes.
    for (name, log) in [
        ("hints", hints_process.log()),
        ("advantages", advantages_process.log()),
    ] {
        assert!(log.contains(" INFO "), "{name} logged: {log}");
        assert!(
            !log.contains("\x1b["),
            "{name}'s log file has colour codes:\n{log}"
        );
    }
}
