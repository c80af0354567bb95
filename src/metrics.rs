//! Prometheus metrics: the counters every stage keeps, and the HTTP endpoint
//! that serves them (`--metrics-addr`; port 0 picks a free port) with the
//! stage's health (`/healthz`, `/readyz`).

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::Instrument;

use crate::health::Readiness;

/// Label set of one label, `kind` or `reason`.
pub type Labels = Vec<(&'static str, String)>;

/// Counters of the consume loop and the delivery contract, shared by both
/// stages.
pub struct StageMetrics {
    received: Counter,
    read_errors: Counter,
    dead_letters: Family<Labels, Counter>,
    handler_panics: Counter,
    abandoned: Counter,
    commit_failures: Counter,
    store_failures: Counter,
    revoke_finished: Counter,
    in_flight: Gauge,
    in_flight_bytes: Gauge,
    consumer_lag: Gauge,
    assigned: Gauge,
    ready: Gauge,
}

impl StageMetrics {
    /// Registers the loop's metrics under `registry` (which carries the stage
    /// prefix, for example `hintstream_hints`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = StageMetrics {
            received: Counter::default(),
            read_errors: Counter::default(),
            dead_letters: Family::default(),
            handler_panics: Counter::default(),
            abandoned: Counter::default(),
            commit_failures: Counter::default(),
            store_failures: Counter::default(),
            revoke_finished: Counter::default(),
            in_flight: Gauge::default(),
            in_flight_bytes: Gauge::default(),
            consumer_lag: Gauge::default(),
            assigned: Gauge::default(),
            ready: Gauge::default(),
        };
        registry.register(
            "messages_received",
            "Messages taken off the input topic",
            m.received.clone(),
        );
        registry.register(
            "kafka_read_errors",
            "Errors returned by the consumer",
            m.read_errors.clone(),
        );
        registry.register(
            "dead_letters",
            "Messages sent to the dead-letter topic, by kind",
            m.dead_letters.clone(),
        );
        registry.register(
            "handler_panics",
            "Handler tasks that panicked (their messages are dead-lettered as handler_panic)",
            m.handler_panics.clone(),
        );
        registry.register(
            "abandoned_messages",
            "Messages left unfinished at a partition revoke or shutdown (uncommitted, redelivered)",
            m.abandoned.clone(),
        );
        registry.register(
            "offset_commit_failures",
            "Offset commits that failed (not counting deferrals during a rebalance)",
            m.commit_failures.clone(),
        );
        registry.register(
            "offset_store_failures",
            "Offsets that could not be stored for commit",
            m.store_failures.clone(),
        );
        registry.register(
            "revoke_drained_messages",
            "In-flight messages of revoked partitions that finished during the drain",
            m.revoke_finished.clone(),
        );
        registry.register(
            "in_flight_messages",
            "Messages taken and not yet finished",
            m.in_flight.clone(),
        );
        registry.register(
            "in_flight_bytes",
            "Bytes of messages taken and not yet finished (stages with a byte bound on intake)",
            m.in_flight_bytes.clone(),
        );
        registry.register(
            "consumer_lag",
            "Messages behind the end of the assigned partitions (librdkafka statistics)",
            m.consumer_lag.clone(),
        );
        registry.register(
            "assigned_partitions",
            "Input partitions assigned to this member",
            m.assigned.clone(),
        );
        registry.register(
            "ready",
            "1 when the stage's /readyz answers 200 (in its consumer group, producer connected, stage 1: \
             LLM provider answered once or none configured), else 0",
            m.ready.clone(),
        );
        m
    }

    /// Metrics registered nowhere, for tools and tests that serve none.
    pub fn unregistered() -> Self {
        Self::register(&mut Registry::default())
    }

    pub fn received(&self) {
        self.received.inc();
    }

    pub fn read_error(&self) {
        self.read_errors.inc();
    }

    pub fn dead_lettered(&self, kind: &str) {
        self.dead_letters
            .get_or_create(&vec![("kind", kind.to_string())])
            .inc();
    }

    pub fn dead_letter_count(&self, kind: &str) -> u64 {
        self.dead_letters
            .get_or_create(&vec![("kind", kind.to_string())])
            .get()
    }

    pub fn handler_panicked(&self) {
        self.handler_panics.inc();
    }

    pub fn handler_panic_count(&self) -> u64 {
        self.handler_panics.get()
    }

    pub fn abandoned(&self) {
        self.abandoned.inc();
    }

    pub fn commit_failed(&self) {
        self.commit_failures.inc();
    }

    pub fn store_failed(&self) {
        self.store_failures.inc();
    }

    /// A revoke's drain ended with `finished` messages completed (those
    /// cancelled are counted as abandoned when their handles drop).
    pub fn revoke_drained(&self, finished: usize) {
        self.revoke_finished.inc_by(finished as u64);
    }

    pub fn set_in_flight(&self, n: usize) {
        self.in_flight.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn set_in_flight_bytes(&self, n: usize) {
        self.in_flight_bytes.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn set_consumer_lag(&self, lag: i64) {
        self.consumer_lag.set(lag);
    }

    pub fn set_assigned(&self, partitions: usize) {
        self.assigned.set(i64::try_from(partitions).unwrap_or(i64::MAX));
    }

    /// Partitions assigned now.
    pub fn assigned(&self) -> i64 {
        self.assigned.get()
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// 1 when the stage was ready at its last check, else 0.
    pub fn ready(&self) -> i64 {
        self.ready.get()
    }

    /// Messages in flight now.
    pub fn in_flight(&self) -> usize {
        usize::try_from(self.in_flight.get()).unwrap_or(0)
    }

    /// Messages abandoned so far.
    pub fn abandoned_count(&self) -> u64 {
        self.abandoned.get()
    }

    /// In-flight messages of revoked partitions that finished during drains.
    pub fn revoke_finished(&self) -> u64 {
        self.revoke_finished.get()
    }
}

/// A counter of `f64` (cost in dollars and the like).
pub type FloatCounter = Counter<f64, AtomicU64>;

/// A gauge of `f64` (dollars left and the like).
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// Renders a registry in the Prometheus/OpenMetrics text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, registry);
    out
}

/// Serves `GET /metrics` and `GET /healthz` on `addr` until the runtime
/// stops. Returns the bound address, which differs from `addr` when its
/// port is 0.
pub async fn serve(addr: SocketAddr, registry: Arc<Registry>) -> std::io::Result<SocketAddr> {
    serve_health(addr, registry, None).await
}

/// Serves a stage's endpoint on `addr` until the runtime stops:
///
/// - `GET /metrics`: `registry` (the `ready` gauge refreshed first);
/// - `GET /healthz`: 200 while the runtime runs (liveness);
/// - `GET /readyz` (with `readiness`): 200 when ready, else 503 with the
///   reason as text.
///
/// Returns the bound address, which differs from `addr` when its port is 0.
pub async fn serve_health(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Option<Arc<Readiness>>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let metrics_readiness = readiness.clone();
    let mut app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                let readiness = metrics_readiness.clone();
                async move {
                    if let Some(readiness) = &readiness {
                        // The gauge says what /readyz would answer now.
                        let _ = readiness.check();
                    }
                    (
                        [(
                            CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        render(&registry),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    if let Some(readiness) = readiness {
        app = app.route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move {
                    match readiness.check() {
                        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
                    }
                }
            }),
        );
    }
    tokio::spawn(
        async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "metrics endpoint stopped");
            }
        }
        .in_current_span(),
    );
    tracing::info!(addr = %bound, "metrics endpoint at http://{bound}/metrics");
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_registered_counters_over_http() {
        let mut registry = Registry::with_prefix("hintstream_test");
        let metrics = StageMetrics::register(&mut registry);
        metrics.dead_lettered("not_json");
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::new(registry))
            .await
            .unwrap();
        assert_ne!(addr.port(), 0);
        let body = reqwest_free_get(addr, "/metrics").await;
        assert!(
            body.contains("hintstream_test_dead_letters_total{kind=\"not_json\"} 1"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn readyz_answers_503_with_the_reason_until_ready() {
        use crate::health::Signal;
        let mut registry = Registry::with_prefix("hintstream_test");
        let metrics = Arc::new(StageMetrics::register(&mut registry));
        let group = Arc::new(Signal::new("the consumer has not joined its group"));
        let producer = Arc::new(Signal::new("no broker"));
        let readiness = Arc::new(Readiness::new(
            crate::kafka::Lifecycle::new(),
            group.clone(),
            producer.clone(),
            metrics,
        ));
        let addr = serve_health(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(registry),
            Some(readiness),
        )
        .await
        .unwrap();
        let not_ready = reqwest_free_get(addr, "/readyz").await;
        assert!(not_ready.contains(" 503 "), "{not_ready}");
        assert!(
            not_ready.ends_with("not ready: the consumer has not joined its group\n"),
            "{not_ready}"
        );
        assert!(reqwest_free_get(addr, "/metrics")
            .await
            .contains("hintstream_test_ready 0"));
        group.hold();
        producer.hold();
        assert!(reqwest_free_get(addr, "/readyz").await.contains(" 200 "));
        assert!(reqwest_free_get(addr, "/metrics")
            .await
            .contains("hintstream_test_ready 1"));
        assert!(reqwest_free_get(addr, "/healthz").await.contains(" 200 "));
    }

    /// A minimal HTTP/1.0 GET, so this unit test needs no HTTP client crate.
    async fn reqwest_free_get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).await.unwrap();
        body
    }
}
