//! Traces over OTLP/HTTP, received by a loopback collector (axum, protobuf
//! decoded with opentelemetry-proto's types) from `hintstream` processes on a
//! real broker:
//!
//! - stage 1: a hint's spans arrive (consume, group wait, hint, one
//!   `llm_attempt` per HTTP attempt with model, status and retry wait, and
//!   produce), the LLM attempts are children of the hint's span, and the
//!   hint's `traceparent` header names that trace; an input `traceparent` is
//!   continued, an input without one starts a new trace.
//! - stage 2: a step's `step` span continues its input's trace, with its
//!   compute and produce spans as children, and the advantages carry that
//!   trace's `traceparent`.

use crate::common;
use crate::common::llm_server;

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use common::MetricsEndpoint;
use hintstream::kafka::create_producer;
use hintstream::telemetry::TraceParent;
use llm_server::{Behavior, LlmServer};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use rdkafka::message::{Header, OwnedHeaders};

/// The trace a test's producer starts, as a trainer would.
const INPUT_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A span as received, with its resource's `service.name`.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    fn attribute(&self, key: &str) -> Option<Value> {
        attribute(&self.span.attributes, key)
    }

    fn text(&self, key: &str) -> Option<String> {
        match self.attribute(key)? {
            Value::StringValue(s) => Some(s),
            other => Some(format!("{other:?}")),
        }
    }

    fn int(&self, key: &str) -> Option<i64> {
        match self.attribute(key)? {
            Value::IntValue(n) => Some(n),
            _ => None,
        }
    }
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|v| v.value)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A loopback OTLP/HTTP collector: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`.
struct Collector {
    addr: std::net::SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Collector { addr, spans }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn trace(&self, trace_id: &str) -> Vec<Received> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id() == trace_id)
            .cloned()
            .collect()
    }

    /// Waits until the spans of `trace_id` include every name of `names`
    /// (as many times as listed); returns them all.
    async fn wait_for(&self, trace_id: &str, names: &[&str], context: impl Fn() -> String) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.trace(trace_id);
            let mut wanted: HashMap<&str, usize> = HashMap::new();
            for n in names {
                *wanted.entry(n).or_default() += 1;
            }
            if wanted
                .iter()
                .all(|(name, n)| spans.iter().filter(|s| s.span.name == *name).count() >= *n)
            {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "trace {trace_id} lacks some of {names:?}: {:?}\nall: {:?}\n{}",
                spans.iter().map(|s| &s.span.name).collect::<Vec<_>>(),
                self.spans
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|s| (s.trace_id(), s.span.name.clone()))
                    .collect::<Vec<_>>(),
                context()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn export(State(spans): State<Arc<Mutex<Vec<Received>>>>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf trace export");
    let mut spans = spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| attribute(&r.attributes, "service.name"))
            .map(|v| match v {
                Value::StringValue(s) => s,
                other => format!("{other:?}"),
            })
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(Received {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    ExportTraceServiceResponse::default().encode_to_vec()
}

fn the<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    let named: Vec<&Received> = spans.iter().filter(|s| s.span.name == name).collect();
    assert_eq!(named.len(), 1, "one {name} span: {spans:#?}");
    named[0]
}

/// The `traceparent` header of a recorded message.
fn traceparent_of(message: &hintstream::tools::RecordedMessage) -> TraceParent {
    let header = message
        .headers
        .iter()
        .find(|h| h.key == "traceparent")
        .unwrap_or_else(|| panic!("no traceparent header: {:?}", message.headers));
    TraceParent::parse(header.value.bytes.as_deref().unwrap()).unwrap()
}

fn spawn(stage: &str, config_file: &std::path::Path, collector: &Collector) -> Command {
    let mut command = common::stage_command(stage, config_file);
    command
        .env("RUST_LOG", "info")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES");
    command
}

fn trajectory(instance: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": "run-t", "step": 1, "instance_id": instance,
        "trajectory_id": format!("{instance}-t"), "task_prompt": format!("Solve {instance}"),
        "reward": 0.0, "group_size": 1, "chat_history": [{"role": "user", "content": "go"}],
        "verifier_error": "assert failed",
    }))
    .unwrap()
}

fn traceparent_headers() -> OwnedHeaders {
    OwnedHeaders::new().insert(Header {
        key: "traceparent",
        value: Some(INPUT_TRACEPARENT),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hints_spans_reach_the_collector_in_the_trace_its_header_names() {
    let broker = common::shared_kafka();
    let collector = Collector::start().await;
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Read the error first.".into(),
        Duration::from_millis(10),
    ));
    // The traced group's first attempt is overloaded, its retry answers.
    server.on(
        "Solve traced",
        vec![
            Behavior::Status(529, "overloaded_error", None),
            Behavior::Text("Check the parser.".into(), Duration::from_millis(10)),
        ],
    );
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "failed", "hints");
    config.hints.group_wait_ms = 100;
    config.llm.timeout_secs = 20.0;
    config.llm.models = vec!["claude-traced".into()];
    let metrics = MetricsEndpoint::free();
    config.hints.metrics_addr = metrics.addr();
    let h = config.hints.clone();
    common::create_hints_topics(&config, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let mut command = spawn("hints", &file, &collector);
    command
        .env("ANTHROPIC_API_KEY", "sk-k")
        .env("ANTHROPIC_BASE_URL", server.base_url());
    let process = common::Process::spawn(command, "tracing-hints");
    let logs = || process.log();
    metrics.wait_assigned("hints", logs).await;

    let producer = create_producer(&config).unwrap();
    common::send_raw(
        &producer,
        &h.input_topic,
        "run-t/1/traced",
        Some(&trajectory("traced")),
        Some(traceparent_headers()),
    )
    .await;
    common::send(&producer, &h.input_topic, "run-t/1/fresh", &trajectory("fresh")).await;

    let deadline = Instant::now() + Duration::from_secs(60);
    let hints = loop {
        let hints = common::read_topic(&config, &h.output_topic).await;
        if hints.len() >= 2 {
            break hints;
        }
        assert!(Instant::now() < deadline, "{} hints\n{}", hints.len(), logs());
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let hint_of = |instance: &str| {
        hints
            .iter()
            .find(|m| String::from_utf8_lossy(m.key_bytes().unwrap()).ends_with(instance))
            .unwrap()
    };
    assert!(
        hints
            .iter()
            .all(|m| m.headers.iter().all(|h| h.key != "hintstream.trace-id")),
        "traceparent replaces hintstream.trace-id"
    );

    // The traced input's trace is continued.
    let input = TraceParent::parse(INPUT_TRACEPARENT.as_bytes()).unwrap();
    let header = traceparent_of(hint_of("traced"));
    assert_eq!(
        header.trace_id, input.trace_id,
        "the hint continues its input's trace"
    );
    assert!(header.sampled());
    let spans = collector
        .wait_for(
            &input.trace_id_hex(),
            &[
                "consume",
                "group_wait",
                "hint",
                "llm_attempt",
                "llm_attempt",
                "produce",
            ],
            logs,
        )
        .await;
    assert!(
        spans.iter().all(|s| s.service == "hintstream-hints"),
        "{spans:#?}"
    );
    let (consume, wait, hint, produce) = (
        the(&spans, "consume"),
        the(&spans, "group_wait"),
        the(&spans, "hint"),
        the(&spans, "produce"),
    );
    assert_eq!(
        consume.parent_id(),
        format!("{:016x}", input.span_id),
        "consume is the input's child"
    );
    assert_eq!(consume.text("topic").as_deref(), Some(h.input_topic.as_str()));
    assert_eq!(wait.parent_id(), consume.span_id());
    assert_eq!(hint.parent_id(), consume.span_id());
    assert_eq!(produce.parent_id(), hint.span_id());
    assert_eq!(produce.text("topic").as_deref(), Some(h.output_topic.as_str()));
    assert_eq!(
        format!("{:016x}", header.span_id),
        produce.span_id(),
        "the header's parent id is the produce span"
    );
    let mut attempts: Vec<&Received> = spans.iter().filter(|s| s.span.name == "llm_attempt").collect();
    attempts.sort_by_key(|s| s.int("attempt"));
    for attempt in &attempts {
        assert_eq!(
            attempt.parent_id(),
            hint.span_id(),
            "an LLM attempt is a child of the hint"
        );
        assert_eq!(attempt.text("model").as_deref(), Some("claude-traced"));
    }
    assert_eq!(attempts[0].text("status").as_deref(), Some("http_529"));
    assert!(
        attempts[0].int("retry_wait_ms").is_some_and(|ms| ms > 0),
        "{:?}",
        attempts[0].span.attributes
    );
    assert_eq!(attempts[1].text("status").as_deref(), Some("ok"));
    assert_eq!(attempts[1].int("retry_wait_ms"), None);

    // An input without a traceparent starts a new trace, which the hint's
    // header names.
    let fresh = traceparent_of(hint_of("fresh"));
    assert_ne!(fresh.trace_id, input.trace_id);
    let spans = collector
        .wait_for(
            &fresh.trace_id_hex(),
            &["consume", "group_wait", "hint", "llm_attempt", "produce"],
            logs,
        )
        .await;
    let (consume, hint) = (the(&spans, "consume"), the(&spans, "hint"));
    assert_eq!(consume.parent_id(), "", "a new trace starts at consume");
    assert_eq!(the(&spans, "llm_attempt").parent_id(), hint.span_id());
    assert_eq!(
        format!("{:016x}", fresh.span_id),
        the(&spans, "produce").span_id()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steps_spans_continue_its_inputs_trace_and_its_advantages_name_it() {
    let broker = common::shared_kafka();
    let collector = Collector::start().await;
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.advantages, "scored", "advantages");
    config.topics.metrics = common::unique("metrics");
    let metrics = MetricsEndpoint::free();
    config.advantages.metrics_addr = metrics.addr();
    let a = config.advantages.clone();
    common::create_advantages_topics(&config, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let process = common::Process::spawn(spawn("advantages", &file, &collector), "tracing-advantages");
    let logs = || process.log();
    metrics.wait_assigned("advantages", logs).await;

    let producer = create_producer(&config).unwrap();
    for (i, reward) in [0.0, 1.0].into_iter().enumerate() {
        let row = serde_json::json!({
            "type": "scored_rollout", "schema_version": 1, "run_id": "run-t", "step": 1,
            "instance_id": "g0", "trajectory_id": format!("t{i}"), "reward": reward, "is_hinted": false,
        });
        // The step's first message carries the trainer's trace.
        let headers = (i == 0).then(traceparent_headers);
        common::send_raw(
            &producer,
            &a.input_topic,
            "run-t/1",
            Some(row.to_string().as_bytes()),
            headers,
        )
        .await;
    }
    let end = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "run-t", "step": 1, "count": 2});
    common::send(&producer, &a.input_topic, "run-t/1", end.to_string().as_bytes()).await;

    let input = TraceParent::parse(INPUT_TRACEPARENT.as_bytes()).unwrap();
    let spans = collector
        .wait_for(
            &input.trace_id_hex(),
            &["consume", "step", "compute", "produce", "produce"],
            logs,
        )
        .await;
    assert!(
        spans.iter().all(|s| s.service == "hintstream-advantages"),
        "{spans:#?}"
    );
    let step = the(&spans, "step");
    assert_eq!(
        step.parent_id(),
        format!("{:016x}", input.span_id),
        "the step continues its input"
    );
    assert_eq!(step.text("run_id").as_deref(), Some("run-t"));
    assert_eq!(the(&spans, "compute").parent_id(), step.span_id());
    let produced: Vec<&Received> = spans.iter().filter(|s| s.span.name == "produce").collect();
    assert!(
        produced.iter().all(|p| p.parent_id() == step.span_id()),
        "{produced:#?}"
    );
    for topic in [&a.output_topic, &config.topics.metrics] {
        let messages = common::read_topic(&config, topic).await;
        assert_eq!(messages.len(), 1, "{topic}");
        let header = traceparent_of(&messages[0]);
        assert_eq!(header.trace_id, input.trace_id, "{topic} names the step's trace");
        assert!(
            produced
                .iter()
                .any(|p| p.span_id() == format!("{:016x}", header.span_id)),
            "{topic}'s traceparent is its produce span"
        );
    }
}
