//! The skeleton both stage services share: check that the cluster answers
//! and every topic the stage touches exists, build the Kafka clients (the
//! consume loop, the output producer, the dead-letter producer), the metrics
//! registry with the loop's counters and the stage's readiness, and serve
//! the metrics and health endpoint. Each stage adds its own metrics to the
//! registry, its own readiness conditions, and runs the loop with itself
//! as the [`Stage`] it drives. A built stage is a [`Service`]; the registry
//! of stages (`stages`) lists each as [`Registered`].

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use rdkafka::error::KafkaError;
use thiserror::Error;

use crate::config::{Config, ConfigError, StageConfig};
use crate::health::{Lifecycle, Readiness, Signal};
use crate::kafka::dlq::dlq_message_max_bytes;
use crate::kafka::{
    check_cluster, connect_output, create_stage_producer, create_transactional_producer, AssignmentHook,
    ConnectError, Delivery, Linger, RunOptions, RunSummary, Stage, StageLoop, StageProducer,
    TransactionalProducer, Under,
};
use crate::metrics::StageMetrics;

/// A stage's own reason not to start (stage 1's model clients or spend
/// ledger, say): the shell needs only its text and its exit code.
pub trait StageFailure: std::error::Error + Send + Sync + 'static {
    /// 2 for what the user fixes in the configuration, 1 otherwise.
    fn exit_code(&self) -> u8 {
        1
    }
}

/// A future a stage runs until, or returns: boxed, so that stages of any
/// type stand in one registry.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A stage built and checked, ready to run: what the binary, the quick
/// start and the registry of stages hold of it.
pub trait Service: Send {
    /// Where its metrics, `/healthz` and `/readyz` are served.
    fn metrics_addr(&self) -> SocketAddr;

    /// Runs until `shutdown` resolves or the stage fails
    /// ([`RunSummary::failure`]), then drains and commits.
    fn run(self: Box<Self>, shutdown: BoxFuture<()>) -> BoxFuture<RunSummary>;
}

/// What a registered stage's `build` returns.
pub type Built = BoxFuture<Result<Box<dyn Service>, StageError>>;

/// One stage as the registry lists it (see `stages`): its name (the
/// subcommand, the span), the topics it reads and writes as `topics create`
/// makes them, and how it is built from the configuration.
pub struct Registered {
    pub name: &'static str,
    pub topics: fn(&Config) -> Vec<crate::kafka::admin::TopicSpec>,
    pub build: fn(Config) -> Built,
    /// How many workers of it the quick start runs in its one process
    /// (stage 1 runs two, sharing the input's partitions as a group).
    pub quickstart_workers: usize,
}

/// Why a stage could not start, or stopped on its own.
#[derive(Debug, Error)]
pub enum StageError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// Under exactly_once, `init_transactions` failed (no transactional-id
    /// ACL, a broker without transactions, or none reached in time).
    #[error(
        "kafka.delivery = \"exactly_once\": cannot initialise the transactions of transactional.id {id}: \
         {source}{hint}"
    )]
    Transactions {
        id: String,
        #[source]
        source: KafkaError,
        hint: &'static str,
    },
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("reading what the hints learn from: {0}")]
    Learn(String),
    /// A stage's own failure.
    #[error("{0}")]
    Own(Box<dyn StageFailure>),
}

impl StageError {
    /// 2 for what the user fixes in the configuration (a missing topic
    /// included), 1 for runtime failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            StageError::Config(_) => 2,
            StageError::Connect(e) if e.is_config() => 2,
            StageError::Own(e) => e.exit_code(),
            _ => 1,
        }
    }

    /// A stage's own failure, as the shell's.
    pub fn own(failure: impl StageFailure) -> Self {
        StageError::Own(Box::new(failure))
    }
}

/// Exactly-once delivery for the worker `transactional_id`: its
/// transactional producer (which says whether the stage is connected) with
/// its transactions initialised within the connect timeout.
async fn exactly_once(
    config: &Config,
    transactional_id: &str,
    connected: Arc<Signal>,
    metrics: Arc<StageMetrics>,
) -> Result<Under, StageError> {
    let producer =
        create_transactional_producer(config, transactional_id, dlq_message_max_bytes(config), connected)?;
    let producer = TransactionalProducer {
        producer,
        transactional_id: transactional_id.to_string(),
        interval: Duration::from_millis(config.kafka.transaction_interval_ms),
        call_timeout: Duration::from_millis(config.kafka.transaction_timeout_ms),
        metrics,
    };
    let within = Duration::from_secs(config.connect_timeout_secs);
    Under::exactly_once(producer, within)
        .await
        .map_err(|source| StageError::Transactions {
            id: transactional_id.to_string(),
            hint: match source.rdkafka_error_code() {
                Some(rdkafka::types::RDKafkaErrorCode::TransactionalIdAuthorizationFailed) => {
                    " (grant this principal WRITE and DESCRIBE on the transactional id, \
                     e.g. kafka-acls --transactional-id <prefix>-<stage>- --resource-pattern-type prefixed)"
                }
                _ => "",
            },
            source,
        })
}

/// A stage's Kafka clients and metrics, built and checked.
pub struct StageShell {
    intake: StageLoop,
    /// For the stage's outputs, through a
    /// [`Settlement`](crate::kafka::Settlement): under exactly_once they
    /// join the worker's transactions instead, and this producer stays plain
    /// (a transactional one refuses a send outside a transaction).
    pub producer: StageProducer,
    /// Where the stage registers its own metrics before serving them.
    pub registry: Registry,
    pub metrics: Arc<StageMetrics>,
    /// What `/readyz` answers; the stage may add conditions.
    pub readiness: Arc<Readiness>,
    metrics_socket: SocketAddr,
}

impl StageShell {
    /// Checks the cluster and topics (`outputs`: the topics the stage writes
    /// besides its output and dead-letter topics), then creates the clients
    /// and registers the loop's metrics under `prefix`. `bytes_on_intake`:
    /// whether the loop pauses intake at the byte bound (stage 1), or the
    /// stage bounds its bytes itself (stage 2). `linger`: how the output
    /// producer holds the stage's outputs at least once (under exactly_once
    /// they go through the transactional producer, which keeps
    /// [`Linger::Shared`]).
    pub async fn build(
        config: &Config,
        stage: &StageConfig,
        prefix: &str,
        outputs: &[&str],
        bytes_on_intake: bool,
        linger: Linger,
    ) -> Result<Self, StageError> {
        let metrics_socket = stage.metrics_socket()?;
        // Under exactly_once, `hintstream_hints` is a worker of `hints`.
        let transactional_id = config
            .kafka
            .transactional_id(prefix.strip_prefix("hintstream_").unwrap_or(prefix))?;
        config.kafka.group_instance_id(&stage.group_id)?;
        let mut topics = vec![
            stage.input_topic.as_str(),
            stage.output_topic.as_str(),
            stage.dlq_topic.as_str(),
        ];
        topics.extend_from_slice(outputs);
        check_cluster(config, &topics, Duration::from_secs(config.connect_timeout_secs)).await?;
        let mut registry = Registry::with_prefix(prefix);
        let metrics = Arc::new(StageMetrics::register(&mut registry));
        let connected = Arc::new(Signal::new(
            "the output producer has not reported a broker connection yet",
        ));
        // Under exactly_once, one transactional producer of the worker's
        // transactions carries the outputs and the dead letters (and says
        // whether the stage is connected); this one stays plain, for what a
        // stage writes that no input made.
        let plain_connected = match &transactional_id {
            Some(_) => Arc::new(Signal::new("unused under exactly_once")),
            None => connected.clone(),
        };
        let producer = create_stage_producer(config, plain_connected, linger)?;
        let under = match &transactional_id {
            None => Under::at_least_once(),
            Some(id) => exactly_once(config, id, connected.clone(), metrics.clone()).await?,
        };
        let intake = StageLoop::create_under(
            config,
            &stage.group_id,
            &stage.input_topic,
            &stage.dlq_topic,
            metrics.clone(),
            RunOptions {
                max_in_flight: stage.max_in_flight,
                max_in_flight_bytes: bytes_on_intake.then(|| stage.max_in_flight_bytes()),
                drain_timeout: Duration::from_secs(stage.drain_timeout_secs),
            },
            under,
        )?;
        // Connected now, rather than at its first statistics: a metadata
        // request through it answers (and its producer id is asked for).
        let client = producer.clone();
        let output = stage.output_topic.clone();
        let within = Duration::from_secs(config.connect_timeout_secs);
        let asked = tokio::task::spawn_blocking(move || connect_output(&client, &output, within));
        if asked.await.unwrap_or(false) {
            connected.hold();
        }
        let readiness = Arc::new(Readiness::new(
            intake.lifecycle().clone(),
            intake.group_signal(),
            connected,
            metrics.clone(),
        ));
        Ok(StageShell {
            intake,
            producer,
            registry,
            metrics,
            readiness,
            metrics_socket,
        })
    }

    /// What finishing a message needs (the commit point, the dead-letter
    /// topic, the lifecycle).
    pub fn delivery(&self) -> Delivery {
        self.intake.delivery.clone()
    }

    pub fn lifecycle(&self) -> Lifecycle {
        self.intake.lifecycle().clone()
    }

    /// Registers a hook called after every rebalance with the consumer's
    /// whole assignment.
    pub fn on_assignment(&self, hook: AssignmentHook) {
        self.intake.on_assignment(hook);
    }

    /// Serves the registry as it is now, `/healthz` and `/readyz` on the
    /// stage's metrics address. Returns the bound address (port 0 picks a
    /// free one).
    pub async fn serve_metrics(&mut self) -> Result<SocketAddr, StageError> {
        let registry = std::mem::take(&mut self.registry);
        crate::health::serve_health(
            self.metrics_socket,
            Arc::new(registry),
            Some(self.readiness.clone()),
        )
        .await
        .map_err(|source| StageError::Metrics {
            addr: self.metrics_socket,
            source,
        })
    }

    /// Runs the consume loop over `stage` until `shutdown` resolves or the
    /// stage fails (`RunSummary::failure`).
    pub async fn run<S>(
        self,
        stage: Arc<S>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> RunSummary
    where
        S: Stage + Send + Sync + 'static,
    {
        self.intake.run_stage(stage, shutdown).await
    }
}
