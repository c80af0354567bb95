//! The HTTP endpoint of a stage (`--metrics-addr`; port 0 picks a free
//! port): `/metrics` (the registry), `/healthz` (liveness) and `/readyz`
//! (readiness).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use tracing::Instrument;

use super::readiness::Readiness;
use crate::metrics::render;

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
    use crate::health::{Lifecycle, Signal};
    use crate::metrics::StageMetrics;

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
        let mut registry = Registry::with_prefix("hintstream_test");
        let metrics = Arc::new(StageMetrics::register(&mut registry));
        let group = Arc::new(Signal::new("the consumer has not joined its group"));
        let producer = Arc::new(Signal::new("no broker"));
        let readiness = Arc::new(Readiness::new(
            Lifecycle::new(),
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
