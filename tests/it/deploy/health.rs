//! Health endpoints of the stages, as processes on a Kafka node of the
//! test's own (its data survives a restart): `/readyz` answers 503 with a
//! reason while a stage has not joined its group (another member holds the
//! partitions), 200 once it is assigned (stage 1: and once its LLM provider
//! answered), 503 within 30 s of the broker being killed (SIGKILL), and 200
//! again when the broker is back; `/healthz` answers 200 throughout; the
//! `ready` gauges follow. The stages log to files without colour codes.
//!
//! The endpoint's limits, in process without a broker: a connection that
//! never sends a request is closed after the header-read timeout; at the
//! connection cap a new connection is answered and the one idle longest is
//! closed, while a scraper's kept connection still answers; `/healthz` and
//! `/readyz` answer while idle connections, renewed as they close, hold
//! every slot; and the stages bind it to loopback unless told otherwise.

use crate::common;

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
    // reason (the book's contract, docs/operating.md, is the `not ready: <reason>` form, not
    // the reason's words); alive all along.
    for (endpoint, prefix) in [(hints, "hintstream_hints"), (advantages, "hintstream_advantages")] {
        let ((status, body), _) =
            wait_status(endpoint, "/readyz", |_, _| true, Duration::from_secs(60), logs).await;
        assert_eq!(status, 503, "{prefix}: {body}\n{}", logs());
        assert!(body.starts_with("not ready: "), "{prefix}: {body}");
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
    // Stage 1 holds its partitions and its producer is connected (as stage
    // 2's, on the same broker); its LLM provider has not answered: 503.
    hints
        .wait_for(
            "hintstream_hints_assigned_partitions",
            &[],
            |n| n == 2.0,
            Duration::from_secs(60),
            logs,
        )
        .await;
    let (status, body) = hints.get("/readyz").await.unwrap_or_default();
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: "), "{body}");
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

    // Logs to a file: plain text, not one escape byte (whatever the lines
    // say; RUST_LOG=info makes sure there are some).
    for (name, log) in [
        ("hints", hints_process.log()),
        ("advantages", advantages_process.log()),
    ] {
        assert!(!log.trim().is_empty(), "{name} logged nothing");
        assert!(
            !log.contains('\x1b'),
            "{name}'s log file has colour codes:\n{log}"
        );
    }
}

/// How soon the connection that loses its slot to a newer one must be
/// closed: well before the header timeout would close it anyway.
const EVICTED_WITHIN: Duration = Duration::from_secs(2);

/// How long after the header timeout a silent connection may still be open
/// (the server's timer starts once it accepts, a little after the connect).
const CLOSE_SLACK: Duration = Duration::from_secs(5);

/// Reads until the server closes `stream` (end of file or reset); what it
/// sent before.
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut sent = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = stream.read(&mut chunk).await {
        sent.extend_from_slice(&chunk[..n]);
    }
    sent
}

/// `GET path` over HTTP/1.1 on a connection kept for the next request, as a
/// Prometheus scraper keeps it: the status once the whole body is in.
async fn get_kept_alive(stream: &mut tokio::net::TcpStream, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.unwrap();
        assert_ne!(
            n,
            0,
            "closed mid-response: {}",
            String::from_utf8_lossy(&response)
        );
        response.extend_from_slice(&chunk[..n]);
        let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&response[..end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        if response.len() >= end + 4 + length {
            return head[9..12].parse().unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_cut_at_the_header_timeout_and_the_one_idle_longest_makes_room_at_the_cap() {
    use hintstream::health::endpoint::{HEADER_READ_TIMEOUT, MAX_CONNECTIONS};
    use tokio::net::TcpStream;

    let registry = std::sync::Arc::new(prometheus_client::registry::Registry::with_prefix(
        "hintstream_test",
    ));
    let addr = hintstream::health::serve("127.0.0.1:0".parse().unwrap(), registry)
        .await
        .unwrap();
    // A scraper that keeps its connection, as Prometheus does, holds one
    // slot; clients that never send a request take all the others.
    let mut scraper = TcpStream::connect(addr).await.unwrap();
    let scraped = Instant::now();
    assert_eq!(get_kept_alive(&mut scraper, "/metrics").await, 200);
    let mut silent = Vec::new();
    for _ in 1..MAX_CONNECTIONS {
        // Before the connect: the server's clock for it starts after.
        let opened = Instant::now();
        silent.push((TcpStream::connect(addr).await.unwrap(), opened));
    }
    assert_eq!(
        get_kept_alive(&mut scraper, "/metrics").await,
        200,
        "a scrape on a held connection works with the cap full"
    );
    assert!(
        scraped.elapsed() < HEADER_READ_TIMEOUT,
        "the test ran too slowly to say"
    );

    // One more is answered; the silent connection opened first (idle
    // longest: the scraper just moved bytes) is closed to make room.
    assert_eq!(
        MetricsEndpoint(addr)
            .get("/metrics")
            .await
            .map(|(status, _)| status),
        Some(200),
        "a connection over the cap of {MAX_CONNECTIONS} is answered"
    );
    let (mut first, _) = silent.remove(0);
    let sent = tokio::time::timeout(EVICTED_WITHIN, read_until_closed(&mut first))
        .await
        .expect("the connection idle longest still holds its slot");
    assert!(sent.is_empty(), "{sent:?}");
    assert_eq!(get_kept_alive(&mut scraper, "/metrics").await, 200);

    for (i, (mut stream, opened)) in silent.into_iter().enumerate() {
        let sent = tokio::time::timeout_at(
            (opened + HEADER_READ_TIMEOUT + CLOSE_SLACK).into(),
            read_until_closed(&mut stream),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "silent connection {i} is open {:?} after it opened",
                opened.elapsed()
            )
        });
        assert!(sent.is_empty(), "silent connection {i} got {sent:?}");
        assert!(
            opened.elapsed() >= HEADER_READ_TIMEOUT,
            "silent connection {i} closed after {:?}, before the header timeout",
            opened.elapsed()
        );
    }
    // The idle scraper's connection goes the same way; then a new scrape
    // finds every slot free.
    let held = read_until_closed(&mut scraper).await;
    assert!(held.is_empty(), "{held:?}");
    assert_eq!(
        MetricsEndpoint(addr)
            .get("/metrics")
            .await
            .map(|(status, _)| status),
        Some(200)
    );
}

/// Connections held open without a request, each opened again as soon as
/// the endpoint closes it (as a client that renews them every 10 s does,
/// only sooner): how many are open now, and how many were closed.
struct Holders {
    open: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
    closed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tasks: tokio::task::JoinSet<()>,
}

impl Holders {
    fn start(addr: std::net::SocketAddr, n: usize) -> Holders {
        use std::sync::atomic::Ordering;
        let open = std::sync::Arc::new(tokio::sync::watch::Sender::new(0usize));
        let closed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (open, closed) = (open.clone(), closed.clone());
            tasks.spawn(async move {
                loop {
                    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                    open.send_modify(|n| *n += 1);
                    let sent = read_until_closed(&mut stream).await;
                    assert!(sent.is_empty(), "a holder was answered: {sent:?}");
                    open.send_modify(|n| *n -= 1);
                    closed.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        Holders { open, closed, tasks }
    }

    /// Waits until all of them are open at once.
    async fn wait_open(&self, n: usize) {
        let mut open = self.open.subscribe();
        tokio::time::timeout(Duration::from_secs(30), open.wait_for(|o| *o == n))
            .await
            .expect("the holders did not all connect within 30 s")
            .unwrap();
    }
}

/// `GET path` as a kubelet probe sends it: from outside the runtime the
/// holders busy (its own thread), the request written `after` the
/// connection opens (a probe's thread descheduled on a busy machine), the
/// connection closed after the answer. The status and body, or `None` when
/// the connection closed unanswered or 5 s passed.
async fn probe_from_another_thread(
    addr: std::net::SocketAddr,
    path: &str,
    after: Duration,
) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).ok()?;
        std::thread::sleep(after);
        stream.write_all(request.as_bytes()).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).ok()?;
        let response = String::from_utf8(response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.get(9..12)?.parse().ok()?;
        Some((status, body.to_string()))
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_answer_while_idle_connections_hold_every_slot() {
    use hintstream::health::endpoint::MAX_CONNECTIONS;
    use hintstream::health::{Lifecycle, Readiness, Signal};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    let group = Arc::new(Signal::new("not in the group"));
    let producer = Arc::new(Signal::new("not connected"));
    group.hold();
    producer.hold();
    let metrics = Arc::new(hintstream::metrics::StageMetrics::unregistered());
    let readiness = Arc::new(Readiness::new(Lifecycle::new(), group, producer, metrics));
    let registry = Arc::new(prometheus_client::registry::Registry::default());
    // The holders are closed only to make room: not at the header timeout,
    // however slowly the test runs.
    let limits = hintstream::health::EndpointLimits {
        header_read_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
        ..Default::default()
    };
    let endpoint = MetricsEndpoint(
        hintstream::health::serve_with_limits(
            "127.0.0.1:0".parse().unwrap(),
            registry,
            Some(readiness),
            limits,
        )
        .await
        .unwrap(),
    );
    let mut holders = Holders::start(endpoint.0, MAX_CONNECTIONS);
    holders.wait_open(MAX_CONNECTIONS).await;
    const PROBES: usize = 20;
    for probe in 0..PROBES {
        let path = if probe % 2 == 0 { "/healthz" } else { "/readyz" };
        let expected = if probe % 2 == 0 { "ok\n" } else { "ready\n" };
        // Half the probes (two in every four, one of each path) send their
        // request 50 ms after their connection: the holder a probe closes
        // reconnects at once, and while newcomers took slots before their
        // request came, the holders took one another's in turn, 20 ms was
        // enough to turn every slot over, and the probe was closed
        // unanswered (seen in CI).
        let after = Duration::from_millis(if probe % 4 < 2 { 0 } else { 50 });
        assert_eq!(
            probe_from_another_thread(endpoint.0, path, after).await,
            Some((200, expected.to_string())),
            "probe {probe} ({path}, its request {after:?} after its connection) with {} holders open",
            *holders.open.borrow()
        );
    }
    // The probes took slots from holders (the cap was full), each at most
    // one: a holder that reconnects sends nothing, so it waits for a free
    // slot instead of taking another's.
    let closed = holders.closed.load(Ordering::Relaxed);
    assert!(
        (1..=PROBES).contains(&closed),
        "{closed} holders closed by {PROBES} probes"
    );
    holders.wait_open(MAX_CONNECTIONS).await;
    holders.tasks.abort_all();
}

#[test]
fn stage_endpoints_bind_to_loopback_by_default() {
    let config = hintstream::config::Config::default();
    for addr in [&config.hints.metrics_addr, &config.advantages.metrics_addr] {
        let addr: std::net::SocketAddr = addr.parse().unwrap();
        assert!(addr.ip().is_loopback(), "{addr}");
    }
}

/// A broker that stops answering (SIGSTOP: connections stay open, as on a
/// starved machine) past the consumer's bound: the stage does not wait
/// unready forever (librdkafka 2.12 was seen never to find its coordinator
/// again after such a stall); it stops, exit 1, once out of its group for
/// twice `session.timeout.ms` plus the longer of `max.poll.interval.ms` and
/// `metadata.recovery.rebootstrap.trigger.ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stage_out_of_its_group_past_its_bound_stops() {
    let broker = common::own_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.advantages, "scored", "advantages");
    config.kafka.insert("session.timeout.ms", "6000");
    config.kafka.insert("heartbeat.interval.ms", "500");
    config.kafka.insert("max.poll.interval.ms", "6000");
    config
        .kafka
        .insert("metadata.recovery.rebootstrap.trigger.ms", "2000");
    config.hints.drain_timeout_secs = 2;
    config.advantages.drain_timeout_secs = 2;
    let bound = Duration::from_secs(2 * 6 + 6);
    let advantages = MetricsEndpoint::free();
    config.advantages.metrics_addr = advantages.addr();
    common::create_advantages_topics(&config, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let mut process = start("advantages", &file, None);
    advantages.wait_assigned("advantages", || process.log()).await;

    broker.stall();
    let stalled = Instant::now();
    // Unready first, as soon as a report says the group is gone.
    let ((code, body), _) = wait_status(
        advantages,
        "/readyz",
        |s, _| s == 503,
        Duration::from_secs(60),
        || process.log(),
    )
    .await;
    assert_eq!(code, 503, "{body}");
    // Seen up to a poll (100 ms) after it turned unready.
    let unready = stalled.elapsed().saturating_sub(Duration::from_millis(200));
    let status = tokio::task::block_in_place(|| process.wait_exit(Duration::from_secs(120)));
    let took = stalled.elapsed();
    broker.resume();
    let status =
        status.unwrap_or_else(|| panic!("the stage still runs 120 s into the stall:\n{}", process.log()));
    assert_eq!(status.code(), Some(1), "{}", process.log());
    assert!(
        took >= unready + bound,
        "it stopped {took:?} into the stall, unready {unready:?} into it: within its bound of {bound:?}"
    );
    println!("unready {unready:?} and stopped {took:?} into the stall (bound {bound:?})");
}
