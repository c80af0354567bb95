//! A step's trace in stage 2: one `step` span from assembly to publishing
//! (`assemble_ms`: from its first message until it was complete), whose
//! `compute` and `produce` spans are its children. It continues the
//! `traceparent` of the step's first message that has one, and links the
//! others; a step whose messages carry none stays in the trace of the
//! message that completed it.

use tracing::Span;

use super::assemble::PendingStep;
use crate::kafka::Taken;
use crate::telemetry::{self, TraceParent, TRACEPARENT_HEADER};

/// The span of a complete step, and the input trace its outputs continue
/// when spans are not exported (see [`telemetry::scope`]).
pub(super) fn step_span(step: &PendingStep<Taken>) -> (Span, Option<TraceParent>) {
    let span = tracing::info_span!(
        "step",
        run_id = %step.run_id,
        step = step.step,
        messages = step.parked.len() as i64,
        assemble_ms = step.first_seen.elapsed().as_millis() as i64,
    );
    let mut parents = step
        .parked
        .iter()
        .filter_map(|m| m.meta().header(TRACEPARENT_HEADER).and_then(TraceParent::parse));
    if !telemetry::exporting() {
        // Only the outputs' traceparent needs it: the first is enough.
        return (span, parents.next());
    }
    let mut traces: Vec<TraceParent> = Vec::new();
    for parent in parents {
        if !traces.contains(&parent) {
            traces.push(parent);
        }
    }
    let first = traces.first().copied();
    if first.is_some() {
        telemetry::start_trace(&span, first);
    }
    for other in traces.iter().skip(1) {
        telemetry::link(&span, *other);
    }
    (span, first)
}
