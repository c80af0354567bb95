//! Stage 2's Prometheus metrics (`hintstream_advantages_*`), beside the
//! consume loop's: steps, chunks and rows published, steps dead-lettered by reason,
//! compute time by device, extreme advantages, pending steps and their bytes,
//! hint outcomes published and rejected, and late messages of published
//! steps.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::metrics::{Labels, StoredGauge};

/// Prometheus metrics of stage 2.
pub struct AdvantageMetrics {
    steps_published: Counter,
    chunks_published: Counter,
    rows_published: Counter,
    steps_dead_lettered: Family<Labels, Counter>,
    compute_seconds: Family<Labels, Histogram>,
    extreme_advantages: Counter,
    pending_steps: StoredGauge,
    pending_bytes: StoredGauge,
    cuda_fallbacks: Counter,
    outcomes_published: Counter,
    outcomes_rejected: Counter,
    rows_already_published: Counter,
    messages_already_published: Counter,
}

impl AdvantageMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = AdvantageMetrics {
            steps_published: Counter::default(),
            chunks_published: Counter::default(),
            rows_published: Counter::default(),
            steps_dead_lettered: Family::default(),
            compute_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-5, 4.0, 12))
            }),
            extreme_advantages: Counter::default(),
            pending_steps: StoredGauge::default(),
            pending_bytes: StoredGauge::default(),
            cuda_fallbacks: Counter::default(),
            outcomes_published: Counter::default(),
            outcomes_rejected: Counter::default(),
            rows_already_published: Counter::default(),
            messages_already_published: Counter::default(),
        };
        registry.register(
            "steps_published",
            "Steps whose advantages were published",
            m.steps_published.clone(),
        );
        registry.register(
            "chunks_published",
            "Messages of advantages acknowledged by the broker (a step is one or more chunks under advantages.max_message_bytes)",
            m.chunks_published.clone(),
        );
        registry.register(
            "rows_published",
            "Rows whose advantages were published",
            m.rows_published.clone(),
        );
        registry.register(
            "steps_dead_lettered",
            "Steps sent to the DLQ (incomplete, overfull, evicted, output rejected, compute error), by reason",
            m.steps_dead_lettered.clone(),
        );
        registry.register(
            "compute_seconds",
            "Advantage computation time per step (its rows put together, their group ids mapped, the kernel and, beside it, the step's metrics), by device",
            m.compute_seconds.clone(),
        );
        registry.register(
            "extreme_advantages",
            "Rows with |advantage| > 1e3 (std-0 baselines)",
            m.extreme_advantages.clone(),
        );
        registry.register(
            "pending_steps",
            "Steps waiting for rows or their step_end",
            m.pending_steps.clone(),
        );
        registry.register(
            "pending_bytes",
            "Bytes held by pending steps (their messages and rows), bounded by advantages.max_in_flight_bytes",
            m.pending_bytes.clone(),
        );
        registry.register(
            "cuda_fallbacks",
            "Steps computed on the CPU because the CUDA module could not be loaded or run (device = cuda or auto)",
            m.cuda_fallbacks.clone(),
        );
        registry.register(
            "hint_outcomes_published",
            "HintOutcome messages acknowledged on the outcomes topic (one per hint_id of a step's hinted rows)",
            m.outcomes_published.clone(),
        );
        registry.register(
            "hint_outcomes_rejected",
            "HintOutcome messages the broker rejected (logged; the step went on)",
            m.outcomes_rejected.clone(),
        );
        registry.register(
            "rows_already_published",
            "Rows that arrived for a step already published (stray rows after step_end, retried steps): dropped; the first message of each such step is dead-lettered as step_already_published",
            m.rows_already_published.clone(),
        );
        registry.register(
            "messages_already_published",
            "Messages (rows and step_ends) that arrived for a step already published, acknowledged at once",
            m.messages_already_published.clone(),
        );
        m
    }

    /// One hint outcome was acknowledged.
    pub fn outcome_published(&self) {
        self.outcomes_published.inc();
    }

    /// One hint outcome was rejected by the broker.
    pub fn outcome_rejected(&self) {
        self.outcomes_rejected.inc();
    }

    /// A message of `rows` rows came for a step already published.
    pub fn already_published(&self, rows: usize) {
        self.messages_already_published.inc();
        self.rows_already_published.inc_by(rows as u64);
    }

    /// A step meant for the GPU was computed on the CPU.
    pub fn cuda_fell_back(&self) {
        self.cuda_fallbacks.inc();
    }

    /// Steps and bytes waiting for rows or their step_end.
    pub fn set_pending(&self, steps: usize, bytes: usize) {
        self.pending_steps.set(i64::try_from(steps).unwrap_or(i64::MAX));
        self.pending_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// One chunk of a step's advantages was acknowledged.
    pub fn chunk_published(&self) {
        self.chunks_published.inc();
    }

    /// A step was published with `rows` rows, `extreme` of them extreme.
    pub fn step_published(&self, rows: usize, extreme: u64) {
        self.steps_published.inc();
        self.rows_published.inc_by(rows as u64);
        self.extreme_advantages.inc_by(extreme);
    }

    /// A step's advantages were computed on `device` in `seconds`.
    pub fn computed(&self, device: &str, seconds: f64) {
        self.compute_seconds
            .get_or_create(&vec![("device", device.to_string())])
            .observe(seconds);
    }

    /// A step went to the DLQ for `reason`.
    pub fn step_dead_lettered(&self, reason: &str) {
        self.steps_dead_lettered
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }
}
