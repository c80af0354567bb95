//! Prometheus metrics: the counters every stage keeps, and the HTTP endpoint
//! that serves them (`--metrics-addr`; port 0 picks a free port).

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label set of one label, `reason` or `kind`.
pub type Labels = Vec<(&'static str, String)>;

/// Counters of the consume loop, shared by both stages.
pub struct StageMetrics {
    received: Counter,
    read_errors: Counter,
    dead_letters: Family<Labels, Counter>,
    in_flight: Gauge,
    consumer_lag: Gauge,
}

impl StageMetrics {
    /// Registers the loop's metrics under `registry` (which carries the stage
    /// prefix, for example `hintstream_hints`).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = StageMetrics {
            received: Counter::default(),
            read_errors: Counter::default(),
            dead_letters: Family::default(),
            in_flight: Gauge::default(),
            consumer_lag: Gauge::default(),
        };
        registry.register(
            "messages_received",
            "Messages taken off the input topic",
            metrics.received.clone(),
        );
        registry.register(
            "kafka_read_errors",
            "Errors returned by the consumer",
            metrics.read_errors.clone(),
        );
        registry.register(
            "dead_letters",
            "Input sent to the dead-letter topic, by reason",
            metrics.dead_letters.clone(),
        );
        registry.register(
            "in_flight_messages",
            "Messages taken and not yet finished",
            metrics.in_flight.clone(),
        );
        registry.register(
            "consumer_lag",
            "Messages behind the end of the assigned partitions (librdkafka statistics)",
            metrics.consumer_lag.clone(),
        );
        metrics
    }

    /// The lag gauge, for the consumer's context to update.
    pub fn consumer_lag(&self) -> Gauge {
        self.consumer_lag.clone()
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

    pub fn dead_lettered(&self, reason: &str) {
        self.dead_letters
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    pub fn dead_letter_count(&self, reason: &str) -> u64 {
        self.dead_letters
            .get_or_create(&vec![("reason", reason.to_string())])
            .get()
    }

    pub fn set_in_flight(&self, n: usize) {
        self.in_flight.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// A counter of `f64` (cost in dollars and the like).
pub type FloatCounter = Counter<f64, AtomicU64>;

/// Renders a registry in the Prometheus/OpenMetrics text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, registry);
    out
}

/// Serves `GET /metrics` on `addr` until the runtime stops. Returns the bound
/// address, which differs from `addr` when its port is 0.
pub async fn serve(addr: SocketAddr, registry: Arc<Registry>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move {
                (
                    [(
                        CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    render(&registry),
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
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
        let body = reqwest_free_get(addr).await;
        assert!(
            body.contains("hintstream_test_dead_letters_total{reason=\"not_json\"} 1"),
            "{body}"
        );
    }

    /// A minimal HTTP/1.0 GET, so this unit test needs no HTTP client crate.
    async fn reqwest_free_get(addr: SocketAddr) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).await.unwrap();
        body
    }
}
