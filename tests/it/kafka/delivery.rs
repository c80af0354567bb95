//! Delivery without silent stalls, against Apache Kafka: a handler
//! that panics loses its message to the dead-letter topic (not its
//! partition's commits); a stage whose topic is missing exits 2 naming it; a
//! stage whose broker died exits within its drain bound on SIGTERM; a group
//! costs one LLM call whatever its late members; ids containing `/` never
//! share a key; an hourly budget stops LLM requests. Two use librdkafka's
//! mock cluster, which can refuse every Produce: a dead letter that cannot
//! land does not hold shutdown, and a dead-letter topic that refuses writes
//! stops the stage with exit 1.

use crate::common;
use crate::common::llm_server;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hintstream::config::Config;
use hintstream::hints::HintStage;
use hintstream::kafka::{
    DlqHeaders, RecordMeta, Rejected, RunOptions, Stage, StageLoop, Work, HANDLER_PANIC,
};
use hintstream::messages::{decode, group_key, DecodeLimits, Hint, HintCategory};
use hintstream::metrics::StageMetrics;
use llm_server::{Behavior, LlmServer};
use rdkafka::producer::Producer;

fn trajectory(run: &str, step: i64, instance: &str, id: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": run, "step": step, "instance_id": instance,
        "trajectory_id": id, "task_prompt": format!("Solve {instance}"), "reward": 0.0,
        "chat_history": [{"role": "user", "content": "go"}],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['check_output failed']\n<<< ERROR_ACCUMULATOR <<<",
    }))
    .unwrap()
}

async fn hints_in(config: &Config) -> Vec<Hint> {
    common::hints_in(config, &config.hints.output_topic).await
}

async fn wait_hints(config: &Config, n: usize, within: Duration) -> Vec<Hint> {
    let deadline = Instant::now() + within;
    loop {
        let hints = hints_in(config).await;
        if hints.len() >= n {
            return hints;
        }
        assert!(Instant::now() < deadline, "{} of {n} hints", hints.len());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A config whose stage 1 reads and writes topics of its own, created.
async fn hint_config(bootstrap: &str) -> Config {
    let mut config = common::config_for(bootstrap);
    common::own_topics(&mut config.hints, "failed", "hints");
    config.hints.group_wait_ms = 50;
    common::create_hints_topics(&config, 1).await;
    config
}

/// A stage whose handler panics on the input "boom" and acks the rest;
/// `IN_LOOP`: its future is polled first in the consume loop
/// (`Stage::FIRST_POLL_IN_LOOP`, as stage 2's), where the panic happens.
struct PanicsOnBoom<const IN_LOOP: bool, const BATCH: bool> {
    acked: Arc<std::sync::Mutex<HashSet<i64>>>,
}

impl<const IN_LOOP: bool, const BATCH: bool> Stage for PanicsOnBoom<IN_LOOP, BATCH> {
    type Input = String;
    const FIRST_POLL_IN_LOOP: bool = IN_LOOP;
    const TASK_PER_BATCH: bool = BATCH;

    fn decode(&self, payload: &bytes::Bytes, _: &RecordMeta) -> Result<String, Rejected> {
        Ok(String::from_utf8_lossy(payload).into_owned())
    }

    fn handle(
        self: &Arc<Self>,
        work: Work<String>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let acked = self.acked.clone();
        async move {
            if work.input == "boom" {
                panic!("the handler choked on {}", work.input);
            }
            acked.lock().unwrap().insert(work.message.offset());
            work.message.ack();
        }
    }
}

type Acked = Arc<std::sync::Mutex<HashSet<i64>>>;

/// Runs a [`PanicsOnBoom`] stage in `group` on `topic` (dead letters to
/// `<topic>.dlq`) under `options`: its metrics, the offsets it acknowledged
/// and the running stage.
fn run_panics_on_boom<const IN_LOOP: bool, const BATCH: bool>(
    config: &Config,
    topic: &str,
    group: &str,
    options: RunOptions,
) -> (
    Arc<StageMetrics>,
    Acked,
    common::Running<hintstream::kafka::RunSummary>,
) {
    let metrics = Arc::new(StageMetrics::unregistered());
    let stage_loop = StageLoop::create(
        config,
        group,
        topic,
        &format!("{topic}.dlq"),
        metrics.clone(),
        options,
    )
    .unwrap();
    let acked = Acked::default();
    let stage = Arc::new(PanicsOnBoom::<IN_LOOP, BATCH> { acked: acked.clone() });
    let running = common::spawn_stage(move |stop| stage_loop.run_stage(stage, stop));
    (metrics, acked, running)
}

/// Waits, at most 60 s, until `done` says so; a timeout shows `state`.
async fn wait_until<T: std::fmt::Debug>(done: impl Fn() -> bool, state: &std::sync::Mutex<T>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{:?}", state.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_handler_dead_letters_its_message_and_later_offsets_commit() {
    a_panicking_handler_case::<false, false>().await;
}

/// Messages fetched together run in one task (`Stage::TASK_PER_BATCH`):
/// the one that panics is dead-lettered, the others of its batch finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_panics_in_a_batchs_task_dead_letters_only_its_message() {
    a_panicking_handler_case::<false, true>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_panics_in_the_consume_loop_dead_letters_its_message_and_later_offsets_commit() {
    a_panicking_handler_case::<true, false>().await;
}

/// A config for the shared broker, and an input topic named after `name`
/// with its `<topic>.dlq`, created, holding `payloads` (key "k", in turn).
async fn input_with(name: &str, payloads: impl IntoIterator<Item = String>) -> (Config, String, String) {
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let topic = common::unique(name);
    let dlq = format!("{topic}.dlq");
    common::create_topics(&config, &[&topic, &dlq], 1).await;
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    for payload in payloads {
        common::send(&producer, &topic, "k", payload.as_bytes()).await;
    }
    (config, topic, dlq)
}

async fn a_panicking_handler_case<const IN_LOOP: bool, const BATCH: bool>() {
    let payloads = (0..10).map(|i| if i == 4 { "boom".to_string() } else { i.to_string() });
    let (config, topic, dlq) = input_with("panic-in", payloads).await;
    let group = common::unique("panic-group");
    let options = RunOptions {
        max_in_flight: 4,
        max_in_flight_bytes: Some(1 << 20),
        drain_timeout: Duration::from_secs(5),
    };
    let (metrics, acked, running) = run_panics_on_boom::<IN_LOOP, BATCH>(&config, &topic, &group, options);
    wait_until(
        || acked.lock().unwrap().len() >= 9 && metrics.dead_letter_count(HANDLER_PANIC) >= 1,
        &acked,
    )
    .await;
    let summary = running.stop().await;
    assert_eq!(summary.panicked, 1);
    assert_eq!(metrics.handler_panic_count(), 1, "the panic is counted");
    assert_eq!(metrics.dead_letter_count(HANDLER_PANIC), 1);
    let letters = common::read_topic(&config, &dlq).await;
    assert_eq!(letters.len(), 1);
    let header = |name: &str| {
        letters[0]
            .headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value.bytes.clone())
    };
    assert_eq!(
        header(DlqHeaders::ERROR_KIND).as_deref(),
        Some(HANDLER_PANIC.as_bytes())
    );
    assert_eq!(header(DlqHeaders::SOURCE_OFFSET).as_deref(), Some(&b"4"[..]));
    assert_eq!(letters[0].value_bytes(), Some(&b"boom"[..]));
    let committed = common::committed_offsets(&config, &group, &topic, 1).await;
    assert_eq!(committed.get(&0), Some(&10), "offsets past the panic commit");
}

/// The task each message was decoded in and the one it was handled in, by
/// offset.
type TaskIds = Arc<std::sync::Mutex<HashMap<i64, (Option<tokio::task::Id>, Option<tokio::task::Id>)>>>;

/// A stage that notes the task it decodes and handles each message in,
/// rejects the input "bad" and panics decoding "boom"; `BATCH` as
/// [`Stage::TASK_PER_BATCH`].
struct NotesTasks<const BATCH: bool> {
    tasks: TaskIds,
}

impl<const BATCH: bool> Stage for NotesTasks<BATCH> {
    type Input = ();
    const TASK_PER_BATCH: bool = BATCH;

    fn decode(&self, payload: &bytes::Bytes, meta: &RecordMeta) -> Result<(), Rejected> {
        self.tasks.lock().unwrap().entry(meta.offset).or_default().0 = tokio::task::try_id();
        if payload.as_ref() == b"boom" {
            panic!("the decoder choked");
        }
        if payload.as_ref() == b"bad" {
            return Err(Rejected {
                kind: "bad_input",
                reason: "the test's bad input".into(),
            });
        }
        Ok(())
    }

    fn handle(self: &Arc<Self>, work: Work<()>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let tasks = self.tasks.clone();
        async move {
            let offset = work.message.offset();
            tasks.lock().unwrap().entry(offset).or_default().1 = tokio::task::try_id();
            work.message.ack();
        }
    }
}

/// A batch stage's messages are decoded in the task that handles them, not
/// in the consume loop (whose one thread then only takes messages); a
/// stage of a task a message decodes in the loop. What the decoder rejects
/// is dead-lettered and counted in the run's summary either way; a batch
/// stage's decoder that panics dead-letters its message alone
/// (`handler_panic`), and the offsets after it commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_stage_decodes_in_its_task_and_dead_letters_what_it_rejects() {
    decode_task_case::<true>().await;
    decode_task_case::<false>().await;
}

async fn decode_task_case<const BATCH: bool>() {
    let payloads = (0..20).map(|i| match i {
        7 => "bad".to_string(),
        // In the loop, a decoder's panic is the stage's own.
        12 if BATCH => "boom".to_string(),
        _ => i.to_string(),
    });
    let (config, topic, dlq) = input_with("decode-task-in", payloads).await;
    let metrics = Arc::new(StageMetrics::unregistered());
    let options = RunOptions {
        max_in_flight: 64,
        max_in_flight_bytes: Some(1 << 20),
        drain_timeout: Duration::from_secs(5),
    };
    let group = common::unique("decode-task-group");
    let stage_loop = StageLoop::create(&config, &group, &topic, &dlq, metrics.clone(), options).unwrap();
    let tasks = TaskIds::default();
    let stage = Arc::new(NotesTasks::<BATCH> { tasks: tasks.clone() });
    let running = common::spawn_stage(move |stop| stage_loop.run_stage(stage, stop));
    let handled = || {
        tasks
            .lock()
            .unwrap()
            .values()
            .filter(|(_, h)| h.is_some())
            .count()
    };
    let panicked = u64::from(BATCH);
    wait_until(
        || {
            handled() >= 19 - panicked as usize
                && metrics.dead_letter_count("bad_input") >= 1
                && metrics.dead_letter_count(HANDLER_PANIC) >= panicked
        },
        &tasks,
    )
    .await;
    let summary = running.stop().await;
    assert_eq!(summary.rejected, 1, "batch {BATCH}: {summary:?}");
    assert_eq!(summary.panicked, panicked, "batch {BATCH}: {summary:?}");
    let tasks = tasks.lock().unwrap().clone();
    assert_eq!(tasks.len(), 20, "batch {BATCH}: every message decoded once");
    for (offset, (decoded, handled)) in tasks.iter() {
        if *offset == 7 || (BATCH && *offset == 12) {
            assert!(handled.is_none(), "offset {offset}: not handled");
            continue;
        }
        let (decoded, handled) = (decoded.expect("decoded in a task"), handled.expect("handled"));
        if BATCH {
            assert_eq!(
                decoded, handled,
                "offset {offset}: decoded in the task that handled it"
            );
        } else {
            assert_ne!(
                decoded, handled,
                "offset {offset}: decoded in the loop, handled in a task of its own"
            );
        }
    }
    let letters = common::read_topic(&config, &dlq).await;
    let mut values: Vec<_> = letters
        .iter()
        .map(|l| l.value_bytes().unwrap_or_default().to_vec())
        .collect();
    values.sort();
    let expected: Vec<&[u8]> = if BATCH {
        vec![b"bad", b"boom"]
    } else {
        vec![b"bad"]
    };
    assert_eq!(values, expected, "batch {BATCH}");
    let committed = common::committed_offsets(&config, &group, &topic, 1).await;
    assert_eq!(
        committed.get(&0),
        Some(&20),
        "batch {BATCH}: the offsets past them commit"
    );
}

/// Messages fetched together whose bytes do not all fit the in-flight byte
/// bound: the batch takes those that fit and runs them; the next message
/// waits for the bytes they release (it never waits while holding messages
/// that cannot run yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_over_the_byte_bound_take_what_fits_and_the_rest_waits_its_turn() {
    const MESSAGES: i64 = 16;
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let topic = common::unique("batch-bytes");
    let dlq = format!("{topic}.dlq");
    common::create_topics(&config, &[&topic, &dlq], 1).await;
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    // 64 KiB each, 256 KiB of bound: three at a time, where one fetch
    // brings them all (librdkafka's smallest prefetch is 1 MiB).
    let payload = vec![b'x'; 64 * 1024];
    for _ in 0..MESSAGES {
        common::send(&producer, &topic, "k", &payload).await;
    }
    let group = common::unique("batch-bytes-group");
    let options = RunOptions {
        max_in_flight: 64,
        max_in_flight_bytes: Some(256 << 10),
        drain_timeout: Duration::from_secs(5),
    };
    let (_, acked, running) = run_panics_on_boom::<false, true>(&config, &topic, &group, options);
    wait_until(|| acked.lock().unwrap().len() as i64 >= MESSAGES, &acked).await;
    let summary = running.stop().await;
    assert_eq!(summary.received, MESSAGES as u64);
    let committed = common::committed_offsets(&config, &group, &topic, 1).await;
    assert_eq!(committed.get(&0), Some(&MESSAGES), "every message committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_output_topic_exits_2_naming_it() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "failed", "hints");
    let h = config.hints.clone();
    common::create_topics(&config, &[&h.input_topic, &h.dlq_topic], 1).await;
    // The stage's start-up check names the topic in a typed error, which
    // the binary maps to exit 2.
    let error = match HintStage::build(config.clone(), &hintstream::llm::synth::LlmEnv::default()).await {
        Ok(_) => panic!("the stage started with its output topic missing"),
        Err(e) => e,
    };
    match &error {
        hintstream::stage::StageError::Connect(hintstream::kafka::connect::ConnectError::MissingTopic {
            topic,
            ..
        }) => assert_eq!(topic, &h.output_topic, "names the missing topic"),
        other => panic!("not a missing topic: {other:?}"),
    }
    assert_eq!(error.exit_code(), 2);
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let command = common::stage_command("hints", &file);
    let mut process = common::Process::spawn(command, "missing-topic");
    let status = process
        .wait_exit(Duration::from_secs(40))
        .unwrap_or_else(|| panic!("still running with a missing topic:\n{}", process.log()));
    assert_eq!(status.code(), Some(2), "{}", process.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_with_the_broker_gone_exits_within_the_drain_bound() {
    const DRAIN_SECS: u64 = 3;
    let mut broker = common::own_kafka();
    let server = LlmServer::start(Some("sk-k")).await;
    // Slow answers: hints are in flight when the broker dies, and their
    // produce (and dead letters) then retry against nothing.
    server.default(Behavior::Text("Slow hint.".into(), Duration::from_secs(2)));
    let mut config = hint_config(&broker.bootstrap).await;
    config.hints.drain_timeout_secs = DRAIN_SECS;
    let endpoint = common::MetricsEndpoint::free();
    config.hints.metrics_addr = endpoint.addr();
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
    command
        .args(["hints", "--config"])
        .arg(&file)
        .env("ANTHROPIC_API_KEY", "sk-k")
        .env("ANTHROPIC_BASE_URL", server.base_url());
    let mut process = common::Process::spawn(command, "broker-gone");
    endpoint.wait_assigned("hints", || process.log()).await;
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    for i in 0..20 {
        let instance = format!("g{i}");
        common::send(
            &producer,
            &config.hints.input_topic,
            &group_key("run", 1, &instance),
            &trajectory("run", 1, &instance, "t"),
        )
        .await;
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    endpoint
        .wait_for(
            "hintstream_hints_llm_in_flight",
            &[],
            |n| n > 0.0,
            Duration::from_secs(30),
            || process.log(),
        )
        .await;
    broker.kill9();
    // The stage has seen its broker go (ready turns 0 within 30 s, as
    // deploy::health checks) and is still running.
    endpoint
        .wait_for(
            "hintstream_hints_ready",
            &[],
            |n| n == 0.0,
            Duration::from_secs(30),
            || process.log(),
        )
        .await;
    assert!(
        process.running(),
        "the stage died with its broker:\n{}",
        process.log()
    );
    let signalled = Instant::now();
    process.terminate();
    let bound = Duration::from_secs(DRAIN_SECS + 5);
    let status = process.wait_exit(bound + Duration::from_secs(10));
    let took = signalled.elapsed();
    eprintln!("SIGTERM with the broker gone: exited in {took:.1?} (drain {DRAIN_SECS} s)");
    assert!(
        status.is_some(),
        "still running {took:?} after SIGTERM:\n{}",
        process.log()
    );
    assert!(
        took <= bound,
        "took {took:?}, over drain + 5 s:\n{}",
        process.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_member_gets_the_cached_hint_without_an_llm_call() {
    let broker = common::shared_kafka();
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Derived(Duration::from_millis(10)));
    let mut config = hint_config(&broker.bootstrap).await;
    let endpoint = common::MetricsEndpoint::free();
    config.hints.metrics_addr = endpoint.addr();
    let env = llm_server::anthropic_env(&server, "sk-k");
    let stage = HintStage::build(config.clone(), &env).await.unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    let key = group_key("run", 3, "late");
    // group_size 1: the first member is the whole group.
    common::send(
        &producer,
        &config.hints.input_topic,
        &key,
        &trajectory("run", 3, "late", "first"),
    )
    .await;
    let first = wait_hints(&config, 1, Duration::from_secs(60)).await;
    let requests = server.seen().len();
    assert_eq!(requests, 1);
    // A late member of the same group, then a redelivery of the first. One
    // after the other: sent together, the second can join the first's group
    // while it is still open, and the two then share one published hint.
    for (id, hints) in [("second", 2), ("first", 3)] {
        common::send(
            &producer,
            &config.hints.input_topic,
            &key,
            &trajectory("run", 3, "late", id),
        )
        .await;
        wait_hints(&config, hints, Duration::from_secs(60)).await;
    }
    // All three messages committed: a fourth hint would be on the topic.
    common::waits::wait_committed_to_end(
        &config,
        &config.hints.group_id,
        &config.hints.input_topic,
        1,
        Duration::from_secs(60),
        String::new,
    )
    .await;
    let hints = hints_in(&config).await;
    assert_eq!(hints.len(), 3, "one hint per message: {hints:?}");
    let cache_hits = endpoint
        .value("hintstream_hints_hint_cache_hits_total", &[])
        .await;
    running.stop().await;
    assert_eq!(server.seen().len(), requests, "no new LLM request");
    assert!(
        hints
            .iter()
            .all(|h| h.hint == first[0].hint && h.hint_id == first[0].hint_id),
        "every copy is the same hint: {hints:?}"
    );
    assert_eq!(cache_hits, 2.0, "the stage counts both as cache hits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ids_with_slashes_never_share_a_group() {
    let broker = common::shared_kafka();
    let config = hint_config(&broker.bootstrap).await;
    let stage = HintStage::build(config.clone(), &hintstream::llm::synth::LlmEnv::default())
        .await
        .unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    // Unencoded, both keys were `r/1/2/x`.
    for (run, step, instance) in [("r/1", 2, "x"), ("r", 1, "2/x")] {
        common::send(
            &producer,
            &config.hints.input_topic,
            &group_key(run, step, instance),
            &trajectory(run, step, instance, "t"),
        )
        .await;
    }
    let hints = wait_hints(&config, 2, Duration::from_secs(60)).await;
    // Both messages committed: a third hint would be on the topic.
    common::waits::wait_committed_to_end(
        &config,
        &config.hints.group_id,
        &config.hints.input_topic,
        1,
        Duration::from_secs(60),
        String::new,
    )
    .await;
    let hints_again = hints_in(&config).await;
    running.stop().await;
    assert_eq!(hints_again.len(), 2, "{hints:?}");
    let groups: HashSet<(String, i64, String)> = hints_again
        .iter()
        .map(|h| (h.run_id.clone(), h.step, h.instance_id.clone()))
        .collect();
    assert!(groups.contains(&("r/1".into(), 2, "x".into())));
    assert!(groups.contains(&("r".into(), 1, "2/x".into())));
    assert_ne!(hints_again[0].hint_id, hints_again[1].hint_id);
    let keys: HashSet<Vec<u8>> = common::read_topic(&config, &config.hints.output_topic)
        .await
        .iter()
        .map(|m| m.key_bytes().unwrap().to_vec())
        .collect();
    assert_eq!(keys.len(), 2, "two distinct keys");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_hourly_budget_stops_llm_requests_and_loses_nothing() {
    const GROUPS: usize = 60;
    const BUDGET_USD: f64 = 0.05;
    let broker = common::shared_kafka();
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Read the error first.".into(),
        Duration::from_millis(20),
    ));
    let mut config = hint_config(&broker.bootstrap).await;
    config.llm.budget_usd_per_hour = BUDGET_USD;
    // A budget needs its spend ledger topic.
    config.topics.spend = common::unique("spend");
    common::create_topics(&config, &[&config.topics.spend], 1).await;
    // A small output allowance keeps each reservation near the real cost, so
    // an overshoot would show.
    config.llm.max_tokens = 16;
    config.llm.concurrency = 4;
    let model = hintstream::llm::synth::DEFAULT_ANTHROPIC_MODEL;
    // $10 per million tokens both ways: a call costs about half a cent.
    config
        .llm
        .prices
        .insert(model.into(), hintstream::config::ModelPrice::new(10.0, 10.0));
    let endpoint = common::MetricsEndpoint::free();
    config.hints.metrics_addr = endpoint.addr();
    let env = llm_server::anthropic_env(&server, "sk-k");
    let stage = HintStage::build(config.clone(), &env).await.unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    for i in 0..GROUPS {
        let instance = format!("b{i}");
        common::send(
            &producer,
            &config.hints.input_topic,
            &group_key("run", 1, &instance),
            &trajectory("run", 1, &instance, "t"),
        )
        .await;
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let hints = wait_hints(&config, GROUPS, Duration::from_secs(120)).await;
    let remaining = endpoint
        .value("hintstream_hints_llm_budget_remaining_usd", &[])
        .await;
    running.stop().await;

    let by_group: HashMap<&str, &Hint> = hints.iter().map(|h| (h.instance_id.as_str(), h)).collect();
    assert_eq!(by_group.len(), GROUPS, "every group hinted");
    let spent: f64 = hints.iter().map(|h| h.cost_usd).sum();
    let llm = hints
        .iter()
        .filter(|h| h.category == HintCategory::LlmSynthesized)
        .count();
    let exhausted = hints
        .iter()
        .filter(|h| h.failure_reason.as_deref() == Some("budget_exhausted"))
        .count();
    eprintln!(
        "budget ${BUDGET_USD}/h: {llm} LLM hints costing ${spent:.4}, {exhausted} budget_exhausted, {} requests, ${remaining:.4} left",
        server.seen().len()
    );
    assert!(spent <= BUDGET_USD, "spent ${spent} over the budget");
    assert!(
        llm >= 1 && exhausted >= 1,
        "{llm} LLM hints, {exhausted} exhausted"
    );
    assert_eq!(llm + exhausted, GROUPS);
    assert_eq!(server.seen().len(), llm, "no request once the budget was spent");
    assert!(
        hints
            .iter()
            .filter(|h| h.failure_reason.as_deref() == Some("budget_exhausted"))
            .all(|h| h.category == HintCategory::LlmFailedStaticFallback
                && h.hint.contains("check_output failed")),
        "budget_exhausted hints are the static fallback"
    );
    assert!((0.0..BUDGET_USD).contains(&remaining), "{remaining}");
}

/// The original hang: a dead letter whose produce keeps failing (here the
/// mock cluster answers every Produce with a retriable error) used to be
/// awaited in the consume loop, retried forever, so SIGTERM never took
/// effect. Now it gives up at the drain deadline, uncommitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_that_cannot_be_produced_does_not_hold_shutdown() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    const DRAIN: Duration = Duration::from_secs(2);
    let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
    let config = common::config_for(&cluster.bootstrap_servers());
    let topic = common::unique("stuck-in");
    let dlq = format!("{topic}.dlq");
    for t in [&topic, &dlq] {
        cluster.create_topic(t, 1, 1).unwrap();
    }
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    for _ in 0..5 {
        common::send(&producer, &topic, "bad", b"{not json").await;
    }
    // From now on every Produce fails, retriably: dead letters cannot land.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 100_000],
    );
    let group = common::unique("stuck-group");
    let metrics = Arc::new(StageMetrics::unregistered());
    let stage_loop = StageLoop::create(
        &config,
        &group,
        &topic,
        &dlq,
        metrics.clone(),
        RunOptions {
            max_in_flight: 100,
            max_in_flight_bytes: None,
            drain_timeout: DRAIN,
        },
    )
    .unwrap();
    let running = common::spawn_stage(move |stop| {
        stage_loop.run(
            |bytes: &[u8], _: &RecordMeta| Ok(decode::<Hint>(bytes, DecodeLimits::default())?),
            |work: Work<Hint>| async move { work.message.ack() },
            stop,
        )
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while metrics.in_flight() < 5 {
        assert!(Instant::now() < deadline, "{} taken", metrics.in_flight());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopping = Instant::now();
    let summary = tokio::time::timeout(Duration::from_secs(30), running.stop())
        .await
        .expect("shutdown hung on dead letters that cannot be produced");
    let took = stopping.elapsed();
    eprintln!("shutdown with 5 dead letters stuck: {took:.1?} (drain {DRAIN:?})");
    assert_eq!(summary.rejected, 5);
    assert!(took <= DRAIN + Duration::from_secs(6), "took {took:?}");
    assert_eq!(metrics.dead_letter_count("not_json"), 0, "none was acknowledged");
    assert_eq!(metrics.abandoned_count(), 5, "all five left uncommitted");
    cluster.clear_request_errors(RDKafkaApiKey::Produce);
    let committed = common::committed_offsets(&config, &group, &topic, 1).await;
    assert_eq!(
        committed.get(&0),
        None,
        "nothing committed past an unfinished dead letter"
    );
}

/// A dead-letter topic that refuses writes (here the mock cluster answers
/// every Produce with TOPIC_AUTHORIZATION_FAILED, which no retry can fix)
/// stops the stage with exit 1, naming the topic and what to do, and the
/// input it could not dead-letter stays uncommitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_topic_that_refuses_writes_stops_the_stage_with_exit_1() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
    let mut config = common::config_for(&cluster.bootstrap_servers());
    // The process below joins the group the stage in process just left,
    // whose leave the mock cluster does not take: its coordinator waits out
    // the old member's session first (librdkafka's 45 s by default).
    // (A drain must be shorter than a session.)
    config.kafka.insert("session.timeout.ms", "6000");
    config.hints.drain_timeout_secs = 3;
    config.advantages.drain_timeout_secs = 3;
    common::own_topics(&mut config.hints, "dlq-refuses-in", "dlq-refuses-out");
    let h = config.hints.clone();
    for t in [&h.input_topic, &h.output_topic, &h.dlq_topic] {
        cluster.create_topic(t, 1, 1).unwrap();
    }
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    common::send(&producer, &h.input_topic, "bad", b"{not json").await;
    // From now on every Produce is refused for good: the dead letter of
    // that input cannot land anywhere.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 100_000],
    );
    // In process: it starts, rejects the input, and stops on its own
    // (no shutdown signal) with a failure, having dead-lettered nothing.
    let stage = HintStage::build(config.clone(), &hintstream::llm::synth::LlmEnv::default())
        .await
        .unwrap();
    let summary = tokio::time::timeout(Duration::from_secs(60), stage.run(std::future::pending()))
        .await
        .expect("still running with a dead-letter topic that refuses writes");
    assert!(
        summary.failure.is_some(),
        "stopped without a failure: {summary:?}"
    );
    assert_eq!(summary.rejected, 1, "{summary:?}");
    // As a process: exit 1.
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let command = common::stage_command("hints", &file);
    let mut process = common::Process::spawn(command, "dlq-refuses");
    let status = process.wait_exit(Duration::from_secs(60)).unwrap_or_else(|| {
        panic!(
            "still running with a dead-letter topic that refuses writes:\n{}",
            process.log()
        )
    });
    assert_eq!(status.code(), Some(1), "{}", process.log());
    cluster.clear_request_errors(RDKafkaApiKey::Produce);
    let committed = common::committed_offsets(&config, &h.group_id, &h.input_topic, 1).await;
    assert_eq!(
        committed.get(&0),
        None,
        "the input whose dead letter failed is not committed"
    );
}
