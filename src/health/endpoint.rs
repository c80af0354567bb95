//! The HTTP endpoint of a stage (`--metrics-addr`; port 0 picks a free
//! port): `/metrics` (the registry), `/healthz` (liveness) and `/readyz`
//! (readiness), served over HTTP/1 with bounds on what one client can hold:
//! a deadline for each request's headers, an idle timeout and a connection
//! cap at which a newcomer's request makes the connection idle longest give
//! up its slot, one whose request waits unread passed over
//! ([`EndpointLimits`]). The bind address is the stage's `metrics_addr`,
//! loopback unless configured otherwise.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tracing::Instrument;

use super::idle::{Activity, Tracked};
use super::readiness::Readiness;
use super::slots::{Arrival, Slot, Slots, Unread};
use crate::metrics::render;

/// How long a connection has to deliver a request's headers, counted from
/// when it takes its slot (as it opens, or after a wait at the cap: see
/// [`MAX_CONNECTIONS`]) or its previous response was sent. A connection that
/// has not delivered them by then is closed without an answer; so is an idle
/// keep-alive connection (a scraper opens a new one next time).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may move no byte either way (a response its client
/// does not read, a body that stops). Then it is closed, whatever it was
/// doing.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections served at once, so that clients which hold connections cost
/// the stage a bounded number of sockets and tasks. At the cap, a new
/// connection waits unserved for its request or a free slot (at most as
/// many wait; a newer one takes the place of the one waiting longest); once
/// its request comes, the connection that has moved no byte for longest is
/// closed to make room (see [`slots`](super::slots) for why), so `/healthz`
/// and `/readyz` answer however many idle connections others hold. A client
/// that never sends a request waits for a slot for at most
/// [`HEADER_READ_TIMEOUT`] and holds one for at most as long again; one that
/// stops mid-request, for at most [`IDLE_TIMEOUT`]. Those served and those
/// waiting each keep a second handle on their socket: at most four file
/// descriptors for each slot of the cap.
pub const MAX_CONNECTIONS: usize = 64;

/// How long the accept loop waits after an error that is not about one
/// connection (out of file descriptors, say) before it accepts again.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// The bounds the endpoint serves under; [`Default`] is the named limits
/// above, which the stages use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
    /// See [`MAX_CONNECTIONS`].
    pub max_connections: usize,
}

impl Default for EndpointLimits {
    fn default() -> Self {
        EndpointLimits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// Serves `GET /metrics` and `GET /healthz` on `addr` until the runtime
/// stops, under the default limits. Returns the bound address, which
/// differs from `addr` when its port is 0.
pub async fn serve(addr: SocketAddr, registry: Arc<Registry>) -> std::io::Result<SocketAddr> {
    serve_health(addr, registry, None).await
}

/// Serves a stage's endpoint on `addr` until the runtime stops, under the
/// default limits:
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
    serve_with_limits(addr, registry, readiness, EndpointLimits::default()).await
}

/// [`serve_health`] under `limits`.
pub async fn serve_with_limits(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Option<Arc<Readiness>>,
    limits: EndpointLimits,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = router(registry, readiness);
    tokio::spawn(accept(listener, app, limits).in_current_span());
    tracing::info!(addr = %bound, "metrics endpoint at http://{bound}/metrics");
    Ok(bound)
}

/// The routes: `/metrics`, `/healthz`, and `/readyz` with `readiness`.
fn router(registry: Arc<Registry>, readiness: Option<Arc<Readiness>>) -> Router {
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
    app
}

/// Accepts connections until the runtime stops: each takes a free slot here,
/// in the order they came, or waits at the cap on a task of its own, which
/// then serves it.
async fn accept(listener: TcpListener, app: Router, limits: EndpointLimits) {
    let slots = Slots::new(limits.max_connections);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                if !is_connection_error(&e) {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed; pausing");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
                continue;
            }
        };
        let (stream, unread) = match Unread::of(stream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "metrics endpoint: could not take a connection");
                continue;
            }
        };
        // Its clock starts here and it takes a free slot here, in the
        // order connections came: the one idle longest is the one accepted
        // first of those that sent nothing.
        let (stream, activity) = Tracked::new(stream);
        let deadline = tokio::time::Instant::now() + limits.header_read_timeout;
        let arrival = slots.arrive(activity.clone(), unread, deadline);
        tokio::spawn(enter(stream, activity, arrival, peer, app.clone(), limits).in_current_span());
    }
}

/// Serves a new connection once it holds a slot (at the cap, once its
/// request comes: see [`slots`](super::slots)); closes it unanswered when
/// it gets none.
async fn enter(
    stream: Tracked<TcpStream>,
    activity: Activity,
    arrival: Arrival,
    peer: SocketAddr,
    app: Router,
    limits: EndpointLimits,
) {
    let admitted = match arrival {
        Arrival::Admitted(slot, evicted) => Ok((slot, evicted)),
        Arrival::Waits(waiter) => waiter.admitted(stream.get_ref()).await,
    };
    match admitted {
        Ok((slot, evicted)) => {
            if evicted {
                tracing::debug!(%peer, max = limits.max_connections, "metrics endpoint: at the connection cap; closed the connection idle longest to make room");
            }
            connection(stream, activity, app, limits, slot).await;
        }
        Err(why) => tracing::debug!(%peer, %why, "metrics endpoint: closed a connection without a slot"),
    }
}

/// Errors about one connection (it went away before it was accepted): the
/// next accept may succeed at once.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}

/// Serves one connection until it ends, its headers are late, it idles or
/// a newer connection takes its slot; frees its slot before the socket
/// closes, so that a client that sees the close finds the slot free.
async fn connection(
    stream: Tracked<TcpStream>,
    activity: Activity,
    app: Router,
    limits: EndpointLimits,
    slot: Slot,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut served = Box::pin(http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app)));
    tokio::select! {
        result = served.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "metrics endpoint: connection ended");
            }
        }
        () = activity.idle_for(limits.idle_timeout) => {
            tracing::debug!("metrics endpoint: connection idle; closed");
        }
        () = slot.evicted() => {}
    }
    drop(slot);
    drop(served);
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

    #[tokio::test]
    async fn a_connection_that_stops_moving_bytes_is_closed_after_the_idle_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let idle = Duration::from_millis(300);
        let limits = EndpointLimits {
            header_read_timeout: Duration::from_secs(600),
            idle_timeout: idle,
            max_connections: 4,
        };
        let registry = Arc::new(Registry::default());
        let addr = serve_with_limits("127.0.0.1:0".parse().unwrap(), registry, None, limits)
            .await
            .unwrap();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        // Half a request, a byte at a time: each byte moved keeps it open.
        let mut last = tokio::time::Instant::now();
        for byte in b"GET /metr" {
            // Before the write: the server reads the byte after.
            last = tokio::time::Instant::now();
            stream.write_all(&[*byte]).await.unwrap();
            tokio::time::sleep(idle / 3).await;
        }
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "still open 10 s after its last byte");
        assert!(rest.is_empty(), "{rest:?}");
        assert!(
            last.elapsed() >= idle,
            "closed {:?} after its last byte",
            last.elapsed()
        );
        assert!(
            reqwest_free_get(addr, "/metrics").await.contains(" 200 "),
            "its slot is free again"
        );
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
