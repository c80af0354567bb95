//! Log lines on stderr: text (tracing-subscriber's format less the export's
//! fields) or JSON, ANSI colours only on a terminal, and the span that names
//! the stage of each line.

use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Span, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The format of log lines on stderr (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The name of the span that labels a stage's log lines in the quick start
/// ([`stage_span`]). It is never exported: each message starts its own
/// trace.
pub const STAGE_SPAN: &str = "stage";

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

/// Whether log lines get ANSI colours: only on a terminal, and not when
/// `NO_COLOR` is set (<https://no-color.org>).
pub fn ansi_colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The log layer: lines on stderr in `format`, coloured per [`ansi_colours`].
pub(super) fn layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi_colours());
    match format {
        LogFormat::Text => logs.fmt_fields(TextFields).boxed(),
        LogFormat::Json => logs.json().boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

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
}
