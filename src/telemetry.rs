//! Logs and traces: the log layer (text or JSON, ANSI colours only when
//! stderr is a terminal), span export over OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and the W3C `traceparent` that
//! carries a trace from a message's input to its outputs.
//!
//! Export is off by default, and then costs nothing beyond the log layer:
//! no exporter, no OpenTelemetry layer, and [`start_trace`] and [`link`] return
//! at once. Outputs carry a `traceparent` either way: the input's trace with a
//! new span id (or a new trace), so a trace survives a stage that does not
//! export.
//!
//! Numeric span fields are `i64`: tracing-opentelemetry exports other
//! integer types as text.

use std::future::Future;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags, TraceState, TracerProvider as _};
use opentelemetry::{Context, SpanId, TraceId};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use thiserror::Error;
use tracing::field::{Field, Visit};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::cli::LogFormat;

/// The W3C trace-context header, on inputs (read) and outputs (written).
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// The name of the span that labels a stage's log lines in the quick start
/// ([`stage_span`]). It is never exported: each message starts its own
/// trace.
pub const STAGE_SPAN: &str = "stage";

/// How long the exit waits for the last spans to reach the collector.
const EXPORT_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// Set once spans are exported (the OpenTelemetry layer is installed).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported over OTLP.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// A W3C `traceparent`: version 00, trace id, parent (span) id, flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: u128,
    pub span_id: u64,
    /// Bit 0: sampled.
    pub flags: u8,
}

impl TraceParent {
    /// Parses a header value as the W3C Trace Context spec says: version 00
    /// is exactly `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, with non-zero
    /// ids; a later version may append `-...`, which is ignored; version ff
    /// is invalid. Anything else is `None` (a new trace starts).
    pub fn parse(value: &[u8]) -> Option<Self> {
        let value = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
        let b = value.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = hex(&value[0..2])? as u8;
        match (version, b.len()) {
            (0xff, _) => return None,
            (0x00, 55) => {}
            (0x00, _) => return None,
            (_, 55) => {}
            (_, _) if b[55] == b'-' => {}
            _ => return None,
        }
        let trace_id = hex(&value[3..35])?;
        let span_id = hex(&value[36..52])? as u64;
        let flags = hex(&value[53..55])? as u8;
        (trace_id != 0 && span_id != 0).then_some(TraceParent {
            trace_id,
            span_id,
            flags,
        })
    }

    /// A new sampled trace with random ids.
    pub fn new_root() -> Self {
        TraceParent {
            trace_id: rand::random::<u128>().max(1),
            span_id: rand::random::<u64>().max(1),
            flags: 0x01,
        }
    }

    /// The same trace under a new span id.
    pub fn child(&self) -> Self {
        TraceParent {
            span_id: rand::random::<u64>().max(1),
            ..*self
        }
    }

    pub fn sampled(&self) -> bool {
        self.flags & 0x01 == 1
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    fn span_context(&self) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes(self.trace_id.to_be_bytes()),
            SpanId::from_bytes(self.span_id.to_be_bytes()),
            TraceFlags::new(self.flags),
            true,
            TraceState::default(),
        )
    }

    fn of(context: &SpanContext) -> Option<Self> {
        context.is_valid().then(|| TraceParent {
            trace_id: u128::from_be_bytes(context.trace_id().to_bytes()),
            span_id: u64::from_be_bytes(context.span_id().to_bytes()),
            flags: context.trace_flags().to_u8(),
        })
    }
}

/// The header value, `00-<trace id>-<span id>-<flags>`.
impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

/// Lowercase hex digits only (the spec rejects uppercase).
fn hex(digits: &str) -> Option<u128> {
    digits
        .bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        .then(|| u128::from_str_radix(digits, 16).ok())
        .flatten()
}

tokio::task_local! {
    /// The trace of the input a task works on, for outputs' `traceparent`
    /// when spans are not exported.
    static INPUT_TRACE: Option<TraceParent>;
}

/// Runs `work` with `input` as the trace of the input it works on: what it
/// produces carries that trace when spans are not exported.
pub fn scope<F: Future>(input: Option<TraceParent>, work: F) -> impl Future<Output = F::Output> {
    INPUT_TRACE.scope(input, work)
}

/// Makes `span` (not yet entered) the start of its trace in the export: a
/// child of `input` (the input's `traceparent`) when present, else the root
/// of a new trace, whatever span encloses it in the logs. Nothing when spans
/// are not exported.
pub fn start_trace(span: &Span, input: Option<TraceParent>) {
    if !exporting() {
        return;
    }
    let context = match input {
        Some(parent) => Context::new().with_remote_span_context(parent.span_context()),
        None => Context::new(),
    };
    // Fails only when the span was entered already or is disabled.
    let _ = span.set_parent(context);
}

/// Links `span` (not yet entered) to another trace, such as another input
/// of the group or step it works on. Nothing when spans are not exported.
pub fn link(span: &Span, to: TraceParent) {
    if exporting() {
        span.add_link(to.span_context());
    }
}

/// The `traceparent` of an output written inside `span`: the span's own
/// context when spans are exported, else the task's input trace (see
/// [`scope`]) under a new span id, else a new trace.
pub fn outgoing(span: &Span) -> TraceParent {
    if exporting() {
        if let Some(own) = TraceParent::of(span.context().span().span_context()) {
            return own;
        }
    }
    match INPUT_TRACE.try_with(|input| *input).ok().flatten() {
        Some(input) => input.child(),
        None => TraceParent::new_root(),
    }
}

/// `headers` with a `traceparent` for an output written inside `span`
/// ([`outgoing`]), unless they carry one already.
pub fn with_traceparent(headers: OwnedHeaders, span: &Span) -> OwnedHeaders {
    if headers.iter().any(|h| h.key == TRACEPARENT_HEADER) {
        return headers;
    }
    let value = outgoing(span).to_string();
    headers.insert(Header {
        key: TRACEPARENT_HEADER,
        value: Some(&value),
    })
}

/// The span that labels one stage's log lines (`stage=hints worker=0`) in a
/// process that runs several. At ERROR level so that any log filter keeps
/// it: a line of any level shows the stage that wrote it.
pub fn stage_span(stage: &str, worker: Option<usize>) -> Span {
    tracing::error_span!(STAGE_SPAN, stage = %stage, worker)
}

/// The text format's fields, as tracing-subscriber's default writes them,
/// less those meant for the span export (`otel.kind`, `otel.status_code`)
/// and the `log.*` fields of records from the `log` crate.
struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'writer>, fields: R) -> std::fmt::Result {
        let mut visitor = TextVisitor {
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> std::fmt::Result {
        let mut added = String::new();
        self.format_fields(Writer::new(&mut added), fields)?;
        if !added.is_empty() {
            if !current.fields.is_empty() {
                current.fields.push(' ');
            }
            current.fields.push_str(&added);
        }
        Ok(())
    }
}

struct TextVisitor<'a, 'writer> {
    writer: &'a mut Writer<'writer>,
    first: bool,
    result: std::fmt::Result,
}

impl Visit for TextVisitor<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("otel.") || name.starts_with("log.") {
            return;
        }
        let separator = if std::mem::take(&mut self.first) { "" } else { " " };
        self.result = if name == "message" {
            write!(self.writer, "{separator}{value:?}")
        } else {
            write!(
                self.writer,
                "{separator}{}={value:?}",
                name.trim_start_matches("r#")
            )
        };
    }
}

/// Why logging or tracing could not start.
#[derive(Debug, Error)]
pub enum TelemetryError {
    #[error("OTEL_EXPORTER_OTLP_ENDPOINT: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("a global log subscriber is installed already: {0}")]
    Installed(#[from] tracing_subscriber::util::TryInitError),
}

/// What [`init`] started; [`Telemetry::shutdown`] sends the last spans.
#[must_use = "call shutdown() at exit so that the last spans are exported"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered (waiting at most
    /// `EXPORT_FLUSH_TIMEOUT`) and stops the exporter. Call it outside the
    /// async runtime, after the work is done.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            if let Err(e) = provider.shutdown_with_timeout(EXPORT_FLUSH_TIMEOUT) {
                eprintln!("warning: exporting the last spans failed: {e}");
            }
        }
    }
}

/// Whether the environment asks for span export.
fn export_requested() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()))
}

/// Whether log lines get ANSI colours: only on a terminal, and not when
/// `NO_COLOR` is set (<https://no-color.org>).
pub fn ansi_colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber: log lines on stderr in `format`, filtered
/// by `RUST_LOG` (else `default_level`); and, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
/// is set, hintstream's spans exported over OTLP/HTTP protobuf as `service`
/// (unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names it), in
/// batches from a thread of their own, whatever `RUST_LOG` says. The
/// exporter reads the other `OTEL_*` variables (headers, timeout, batch
/// delay). Call it before the async runtime starts.
pub fn init(format: LogFormat, default_level: &str, service: &str) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi_colours());
    let logs = match format {
        LogFormat::Text => logs.fmt_fields(TextFields).boxed(),
        LogFormat::Json => logs.json().boxed(),
    };
    let provider = if export_requested() {
        let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build()?;
        let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
        let mut resource = Resource::builder();
        if !named {
            resource = resource.with_service_name(service.to_string());
        }
        Some(
            SdkTracerProvider::builder()
                .with_resource(resource.build())
                .with_batch_exporter(exporter)
                .build(),
        )
    } else {
        None
    };
    let traces = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("hintstream"))
            // Decided once per callsite: hintstream's spans and events at
            // INFO and above, less the stage label.
            .with_filter(
                tracing_subscriber::filter::filter_fn(|meta| {
                    meta.target().starts_with("hintstream")
                        && *meta.level() <= tracing::Level::INFO
                        && !(meta.is_span() && meta.name() == STAGE_SPAN)
                })
                .with_max_level_hint(tracing::level_filters::LevelFilter::INFO),
            )
    });
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces)
        .try_init()?;
    EXPORTING.store(provider.is_some(), Ordering::Relaxed);
    Ok(Telemetry { provider })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_writes_the_spec_example() {
        let parent = TraceParent::parse(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(parent.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(parent.span_id, 0x00f067aa0ba902b7);
        assert!(parent.sampled());
        assert_eq!(parent.to_string(), EXAMPLE);
        assert_eq!(parent.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn rejects_what_the_spec_rejects() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_may_append_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes-next";
        let parent = TraceParent::parse(later.as_bytes()).unwrap();
        assert!(!parent.sampled());
        assert_eq!(parent.span_id, 0x00f067aa0ba902b7);
    }

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;

        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    #[test]
    fn text_logs_leave_out_the_export_fields() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .with_ansi(false)
            .fmt_fields(TextFields)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "produce",
                otel.kind = "producer",
                otel.status_code = tracing::field::Empty,
                topic = "t",
                offset = tracing::field::Empty
            );
            span.record("otel.status_code", "error");
            span.record("offset", 7);
            span.in_scope(|| tracing::info!(key = "k", "sent {}", 1));
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("produce{topic=\"t\" offset=7}: "), "{text}");
        assert!(text.ends_with("sent 1 key=\"k\"\n"), "{text}");
        assert!(!text.contains("otel"), "{text}");
    }

    #[tokio::test]
    async fn outputs_continue_the_input_trace_without_export() {
        let input = TraceParent::parse(EXAMPLE.as_bytes()).unwrap();
        let out = scope(Some(input), async { outgoing(&Span::none()) }).await;
        assert_eq!(out.trace_id, input.trace_id);
        assert_ne!(out.span_id, input.span_id);
        let fresh = scope(None, async { outgoing(&Span::none()) }).await;
        assert_ne!(fresh.trace_id, input.trace_id);
        let headers = with_traceparent(OwnedHeaders::new(), &Span::none());
        assert_eq!(headers.count(), 1);
        let kept = with_traceparent(
            OwnedHeaders::new().insert(Header {
                key: TRACEPARENT_HEADER,
                value: Some(EXAMPLE),
            }),
            &Span::none(),
        );
        assert_eq!(kept.get(0).value, Some(EXAMPLE.as_bytes()));
    }
}
