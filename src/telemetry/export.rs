//! Span export over OTLP/HTTP (protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set: the tracer provider, the layer that feeds it, and the flush at
//! exit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::ExporterBuildError;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::logs::STAGE_SPAN;

/// How long the exit waits for the last spans to reach the collector.
const EXPORT_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// Set once spans are exported (the OpenTelemetry layer is installed).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported over OTLP.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// A span only the export needs: `make`'s span when spans are exported,
/// else none (no fields formatted, nothing to close). Log lines written
/// inside it are labelled by the span around it.
pub fn export_span(make: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if exporting() {
        make()
    } else {
        tracing::Span::none()
    }
}

/// What [`init`](super::init) started; [`Telemetry::shutdown`] sends the last spans.
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

impl Telemetry {
    pub(super) fn started(provider: Option<SdkTracerProvider>) -> Self {
        EXPORTING.store(provider.is_some(), Ordering::Relaxed);
        Telemetry { provider }
    }
}

/// The tracer provider that exports `service`'s spans in batches from a
/// thread of its own, when the environment asks for export; else `None`.
pub(super) fn provider(service: &str) -> Result<Option<SdkTracerProvider>, ExporterBuildError> {
    if !export_requested() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build()?;
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let mut resource = Resource::builder();
    if !named {
        resource = resource.with_service_name(service.to_string());
    }
    Ok(Some(
        SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_batch_exporter(exporter)
            .build(),
    ))
}

/// The layer that hands hintstream's spans and events to `provider`.
pub(super) fn layer<S>(provider: &SdkTracerProvider) -> impl Layer<S>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
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
}
