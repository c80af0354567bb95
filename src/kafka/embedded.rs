//! The quick start's embedded broker: librdkafka's mock cluster in this
//! process, on 127.0.0.1, memory only. A stand-in for a first run that
//! needs no install, not a broker to operate:
//!
//! - It reports no authorized operations (KIP-430), and its DescribeTopics
//!   waits for a controller it never names until the request times out. The
//!   start-up ACL check skips brokers of this process ([`is_embedded`]);
//!   against any other broker the check, its bound and its warning stay.
//! - It stops last: [`EmbeddedBroker::stop`] waits until every other
//!   librdkafka client of the process is gone (their threads ended), so that
//!   none of them reconnects to a broker that is no longer there and logs
//!   `Connection refused`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaResult;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

/// How often [`EmbeddedBroker::stop`] looks at librdkafka's thread count.
const CLOSE_POLL: Duration = Duration::from_millis(5);

/// Bootstrap addresses of the embedded brokers running in this process.
static RUNNING: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn running() -> std::sync::MutexGuard<'static, Vec<String>> {
    // A push or a removal completes before the lock is released.
    RUNNING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `bootstrap_servers` names an embedded broker of this process.
pub fn is_embedded(bootstrap_servers: &str) -> bool {
    running().iter().any(|b| b == bootstrap_servers)
}

/// librdkafka's threads in this process, of every client and mock cluster.
fn librdkafka_threads() -> i32 {
    // SAFETY: reads an atomic counter; no arguments, no state.
    unsafe { rdkafka::bindings::rd_kafka_thread_cnt() }
}

/// A running embedded broker (one node); dropping it stops it at once,
/// [`EmbeddedBroker::stop`] after its clients.
pub struct EmbeddedBroker {
    /// Kept for its drop, which stops the broker.
    _cluster: MockCluster<'static, DefaultProducerContext>,
    bootstrap: String,
    /// librdkafka's threads once the broker ran and before any client of
    /// it: what is left when its clients are gone.
    own_threads: i32,
}

impl EmbeddedBroker {
    /// Starts the broker with `topics`, each of `partitions` partitions.
    pub fn start(topics: &[String], partitions: i32) -> KafkaResult<EmbeddedBroker> {
        let cluster = MockCluster::new(1)?;
        for topic in topics {
            cluster.create_topic(topic, partitions, 1)?;
        }
        let bootstrap = cluster.bootstrap_servers();
        running().push(bootstrap.clone());
        Ok(EmbeddedBroker {
            _cluster: cluster,
            bootstrap,
            own_threads: librdkafka_threads(),
        })
    }

    /// The address its clients bootstrap from.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Stops the broker once every librdkafka client started after it is
    /// closed, waiting at most `within` for them (past it, says how many
    /// threads were left and stops anyway). Returns how long it waited.
    pub async fn stop(self, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let left = librdkafka_threads() - self.own_threads;
            if left <= 0 {
                break;
            }
            if started.elapsed() >= within {
                tracing::info!(
                    threads = left,
                    "stopping the embedded broker before every client of it closed; \
                     they may log that it refused their connection"
                );
                break;
            }
            tokio::time::sleep(CLOSE_POLL).await;
        }
        drop(self);
        started.elapsed()
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        running().retain(|b| *b != self.bootstrap);
    }
}
