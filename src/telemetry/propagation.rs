//! W3C trace context across Kafka: the `traceparent` header read from an
//! input and written on every output, and the span parents and links that
//! tie an export's traces to it.

use std::future::Future;

use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags, TraceState};
use opentelemetry::{Context, SpanId, TraceId};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::export::exporting;

/// The W3C trace-context header, on inputs (read) and outputs (written).
pub const TRACEPARENT_HEADER: &str = "traceparent";

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

    /// The header value, `00-<trace id>-<span id>-<flags>` in lowercase hex,
    /// written without the formatter: every output of both stages carries
    /// one.
    fn value(&self) -> [u8; VALUE_LEN] {
        let mut out = [b'-'; VALUE_LEN];
        out[..2].copy_from_slice(b"00");
        // The slices are exactly twice their inputs' lengths: these cannot fail.
        let _ = hex::encode_to_slice(self.trace_id.to_be_bytes(), &mut out[3..35]);
        let _ = hex::encode_to_slice(self.span_id.to_be_bytes(), &mut out[36..52]);
        let _ = hex::encode_to_slice([self.flags], &mut out[53..55]);
        out
    }
}

/// The length of a version-00 `traceparent` value.
const VALUE_LEN: usize = 55;

/// The header value, `00-<trace id>-<span id>-<flags>`.
impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = self.value();
        // ASCII by construction.
        f.write_str(std::str::from_utf8(&value).map_err(|_| std::fmt::Error)?)
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

/// The trace of the input the current task works on (see [`scope`]), for
/// work on it that goes on in another task.
pub fn input_trace() -> Option<TraceParent> {
    INPUT_TRACE.try_with(|input| *input).ok().flatten()
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
    match input_trace() {
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
    let value = outgoing(span).value();
    headers.insert(Header {
        key: TRACEPARENT_HEADER,
        value: Some(&value[..]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn writes_every_digit_zero_padded() {
        let small = TraceParent {
            trace_id: 1,
            span_id: 0xa,
            flags: 0,
        };
        assert_eq!(
            small.to_string(),
            "00-00000000000000000000000000000001-000000000000000a-00"
        );
        let all = TraceParent {
            trace_id: u128::MAX,
            span_id: u64::MAX,
            flags: 0xff,
        };
        assert_eq!(
            all.to_string(),
            format!("00-{:032x}-{:016x}-{:02x}", u128::MAX, u64::MAX, 0xff)
        );
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
