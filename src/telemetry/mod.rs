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
//!
//! One file per job: [`logs`] (the log layer), `expected` (librdkafka's
//! warnings of expected states, left out of it), [`export`] (OTLP) and
//! [`propagation`] (`traceparent` on Kafka headers). Imports nothing of the
//! crate.

mod expected;
pub mod export;
pub mod logs;
pub mod propagation;

use thiserror::Error;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use export::{export_span, exporting, Telemetry};
pub use logs::{ansi_colours, stage_span, LogFormat, STAGE_SPAN};
pub use propagation::{
    input_trace, link, outgoing, scope, start_trace, with_traceparent, TraceParent, TRACEPARENT_HEADER,
};

/// Why logging or tracing could not start.
#[derive(Debug, Error)]
pub enum TelemetryError {
    #[error("OTEL_EXPORTER_OTLP_ENDPOINT: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("a global log subscriber is installed already: {0}")]
    Installed(#[from] tracing_subscriber::util::TryInitError),
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
    let provider = export::provider(service)?;
    subscriber(format, filter, provider.as_ref()).try_init()?;
    Ok(Telemetry::started(provider))
}

/// The logs, and the traces when `provider` exports them. Without traces
/// there is no traces layer at all: an absent one added as `None` answers
/// every callsite's interest with "always", so that any debug directive
/// (`rdkafka=debug`) made `tracing::enabled!(DEBUG)` true in every module
/// (and the worker made a span for every message again).
fn subscriber(
    format: LogFormat,
    filter: EnvFilter,
    provider: Option<&opentelemetry_sdk::trace::SdkTracerProvider>,
) -> Box<dyn tracing::Subscriber + Send + Sync> {
    let logs = tracing_subscriber::registry().with(filtered_logs(format, filter));
    match provider {
        Some(provider) => Box::new(logs.with(export::layer(provider))),
        None => Box::new(logs),
    }
}

/// The log layer behind its filters. The level filter is the outer one: its
/// level is the layer's hint, which `try_init` gives the `log` crate as its
/// maximum level, so a `log` record below it (librdkafka's client writes a
/// `trace!` for every native handle it frees) is skipped at its call site
/// instead of reaching the subscriber. It also runs before the expected-state
/// filter, which reads each line's message.
fn filtered_logs<S>(format: LogFormat, filter: EnvFilter) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    logs::layer(format)
        .with_filter(expected::ExpectedStates)
        .with_filter(filter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::level_filters::LevelFilter;
    use tracing_subscriber::Registry;

    #[test]
    fn a_debug_directive_enables_debug_only_where_it_names() {
        let worker_debug = |directive: &str| {
            let subscriber = subscriber(LogFormat::Text, EnvFilter::new(directive), None);
            tracing::subscriber::with_default(
                subscriber,
                || tracing::enabled!(target: "hintstream::kafka::worker", tracing::Level::DEBUG),
            )
        };
        assert!(!worker_debug("info"));
        assert!(!worker_debug("info,rdkafka=debug"));
        assert!(worker_debug("info,hintstream::kafka=debug"));
        assert!(worker_debug("debug"));
    }

    #[test]
    fn the_log_layers_level_hint_is_its_filters() {
        for (directive, level) in [
            ("info", LevelFilter::INFO),
            ("warn,hintstream=debug", LevelFilter::DEBUG),
        ] {
            let layer = filtered_logs::<Registry>(LogFormat::Text, EnvFilter::new(directive));
            assert_eq!(layer.max_level_hint(), Some(level), "{directive}");
        }
    }
}
