//! The group's spend ledger (`[topics] spend`): each worker publishes what
//! it settled since its last record about every `llm.ledger_interval_ms`,
//! and reads every record of its consumer group written in the last hour,
//! so that `llm.budget_usd_per_hour` and `llm.budget_tokens_per_hour` bound
//! the group's spend, not each worker's. Also the rate limits' re-split on
//! every rebalance ([`rate_share_hook`]).
//!
//! - A record is a small JSON object ([`SpendRecord`]) keyed by the
//!   worker's instance id. A worker skips its own instance's records (its
//!   own spend is in its window already, published or not) and records of
//!   other consumer groups (several stage-1 deployments may share the
//!   topic); a restarted worker is a new instance, so what it spent before
//!   counts as a peer's.
//! - Publishing is bounded ([`PUBLISH_DEADLINE`]) and never holds a hint: a
//!   record that was not acknowledged is counted
//!   (`hintstream_hints_llm_ledger_publish_failures`), logged, and its spend
//!   goes into the next record. (A record acknowledged after its deadline
//!   is then counted twice by the others: the budget errs on the safe side.)
//! - The overspend bound: a worker does not see the others' calls in
//!   flight, nor what they settled since their last record (one interval,
//!   plus a produce and a fetch). So the group spends at most the budget
//!   plus, for each worker but the one that admits the last call,
//!   `llm.concurrency` worst-case calls and what it settles within one
//!   interval (README, "The budget and the rate limits are the group's").
//!   A worker alone: the budget itself.
//! - Without a budget there is no ledger (and no group-spend gauges). With
//!   one, the spend topic is required like the stage's other topics: a
//!   missing one exits 2 naming it (`hintstream topics create` makes it),
//!   a refused one names the missing ACL.
//! - Record times are the writers' wall clocks: a skew between hosts moves
//!   a record's place in the rolling hour by that much.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::config::Config;
use crate::kafka::{
    check_topic_access, partition_count, AssignmentHook, ConnectError, StageProducer, TailError, TopicTail,
};
use crate::llm::limits::GroupLimits;
use crate::metrics::FloatGauge;
use crate::stage::StageError;

/// How long one record may take to be acknowledged before it counts as
/// failed (its spend then goes into the next record).
pub const PUBLISH_DEADLINE: Duration = Duration::from_secs(5);

/// How long the start-up read of the last hour may take before the stage
/// runs anyway (it keeps reading; a warning says so).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// How far back a worker reads the ledger: the budgets' window.
const LOOKBACK: Duration = crate::llm::budget::BUDGET_WINDOW;

/// The largest ledger record read; a larger one is skipped.
const MAX_RECORD_BYTES: usize = 4096;

/// One worker's spend since its previous record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpendRecord {
    pub schema_version: u32,
    /// The stage's consumer group (`hints.group_id`): whose budget it is.
    pub group: String,
    /// The worker: host name and process id.
    pub worker: String,
    /// This run of the worker (random at start-up): its records are the
    /// ones it skips.
    pub instance: String,
    /// When it was written: milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// Dollars and tokens (input + output) settled since the previous
    /// record.
    pub usd: f64,
    pub tokens: u64,
}

/// The ledger's metrics (and the group's spend and rate share).
#[derive(Clone)]
pub struct LedgerMetrics {
    /// Registered only with a budget: without one the group's spend is not
    /// counted, and is left out rather than shown as 0.
    group_spend_usd: Option<FloatGauge>,
    group_spend_tokens: Option<Gauge>,
    rate_share: FloatGauge,
    published: Counter,
    publish_failures: Counter,
    peer_records: Counter,
}

impl LedgerMetrics {
    /// Registers the ledger's metrics; the group-spend gauges only when
    /// `with_budget` (there is a ledger).
    pub fn register(registry: &mut Registry, with_budget: bool) -> Self {
        let m = LedgerMetrics {
            group_spend_usd: with_budget.then(FloatGauge::default),
            group_spend_tokens: with_budget.then(Gauge::default),
            rate_share: FloatGauge::default(),
            published: Counter::default(),
            publish_failures: Counter::default(),
            peer_records: Counter::default(),
        };
        m.rate_share.set(1.0);
        if let Some(gauge) = &m.group_spend_usd {
            registry.register(
                "llm_group_spend_usd",
                "Dollars the consumer group settled in the rolling hour (this worker's and the spend ledger's), \
                 what llm.budget_usd_per_hour bounds",
                gauge.clone(),
            );
        }
        if let Some(gauge) = &m.group_spend_tokens {
            registry.register(
                "llm_group_spend_tokens",
                "Tokens the consumer group settled in the rolling hour, what llm.budget_tokens_per_hour bounds",
                gauge.clone(),
            );
        }
        registry.register(
            "llm_rate_share",
            "This worker's share of the group's llm.requests_per_minute and llm.tokens_per_minute \
             (its input partitions over all)",
            m.rate_share.clone(),
        );
        registry.register(
            "llm_ledger_records_published",
            "Spend records this worker wrote to the spend ledger",
            m.published.clone(),
        );
        registry.register(
            "llm_ledger_publish_failures",
            "Spend records not acknowledged within their deadline (their spend goes into the next)",
            m.publish_failures.clone(),
        );
        registry.register(
            "llm_ledger_peer_records",
            "Spend records of the group's other workers read from the spend ledger",
            m.peer_records.clone(),
        );
        m
    }

    fn show(&self, limits: &GroupLimits) {
        if let Some(spend) = limits.group_spend() {
            if let Some(gauge) = &self.group_spend_usd {
                gauge.set(spend.usd);
            }
            if let Some(gauge) = &self.group_spend_tokens {
                gauge.set(i64::try_from(spend.tokens).unwrap_or(i64::MAX));
            }
        }
    }
}

/// A running ledger: the reader of the last hour and the publisher task.
pub struct Ledger {
    _tail: TopicTail,
    publisher: Arc<Publisher>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Publisher {
    topic: String,
    group: String,
    instance: String,
    limits: GroupLimits,
    producer: StageProducer,
    metrics: LedgerMetrics,
}

impl Ledger {
    /// Starts the ledger of `config`'s stage 1 when a spend budget is set:
    /// checks that the principal may read and write `[topics] spend` and
    /// that it exists (a missing topic is a configuration error, exit 2),
    /// reads the group's records of the last hour (at most
    /// [`CATCH_UP_TIMEOUT`]), then publishes every `llm.ledger_interval_ms`.
    /// `None` without a budget.
    pub async fn start(
        config: &Config,
        limits: GroupLimits,
        producer: StageProducer,
        metrics: LedgerMetrics,
    ) -> Result<Option<Ledger>, StageError> {
        if !limits.has_budget() {
            return Ok(None);
        }
        let topic = config.topics.spend.clone();
        let within = Duration::from_secs(config.connect_timeout_secs);
        // Access first: a topic the principal may not describe looks
        // missing, and is reported as refused.
        check_topic_access(config, &[&topic], &[&topic], within).await?;
        if partition_count(config, &topic, within).await?.is_none() {
            return Err(ConnectError::MissingTopic {
                topic,
                servers: config.bootstrap_servers.clone(),
            }
            .into());
        }
        let group = config.hints.group_id.clone();
        let instance = format!("{:016x}", rand::random::<u64>());
        let tail = {
            let (group, instance, limits, metrics) =
                (group.clone(), instance.clone(), limits.clone(), metrics.clone());
            let since = SystemTime::now().checked_sub(LOOKBACK).unwrap_or(UNIX_EPOCH);
            TopicTail::start_since(config, &topic, since, move |_, payload| {
                let Some(record) = payload.and_then(decode) else {
                    return;
                };
                if record.group != group || record.instance == instance {
                    return;
                }
                let age = Duration::from_millis(u64::try_from(now_ms() - record.at_ms).unwrap_or(0));
                limits.observe_peer_spend(age, record.usd, record.tokens);
                metrics.peer_records.inc();
            })
            .await
            .map_err(tail_error)?
        };
        if let Err(e) = tail.sync(CATCH_UP_TIMEOUT).await {
            tracing::warn!(error = %e, "running before the spend ledger's last hour was read");
        }
        metrics.show(&limits);
        let publisher = Arc::new(Publisher {
            topic,
            group,
            instance,
            limits,
            producer,
            metrics,
        });
        let interval = Duration::from_millis(config.llm.ledger_interval_ms);
        let task = tokio::spawn(publish_every(Arc::downgrade(&publisher), interval).in_current_span());
        tracing::info!(
            topic = %publisher.topic, instance = %publisher.instance, interval_ms = config.llm.ledger_interval_ms,
            "the spend budget is the consumer group's"
        );
        Ok(Some(Ledger {
            _tail: tail,
            publisher,
            task,
        }))
    }

    /// Publishes what was settled since the last record (at shutdown, so
    /// that the others count it).
    pub async fn flush(&self) {
        self.publisher.publish().await;
    }
}

impl Publisher {
    /// Writes one record of the spend settled since the last (none when
    /// nothing was), within [`PUBLISH_DEADLINE`]; a failure puts the spend
    /// back for the next.
    async fn publish(&self) {
        self.metrics.show(&self.limits);
        let Some((usd, tokens)) = self.limits.take_unpublished() else {
            return;
        };
        let record = SpendRecord {
            schema_version: 1,
            group: self.group.clone(),
            worker: worker_identity().to_string(),
            instance: self.instance.clone(),
            at_ms: now_ms(),
            usd,
            tokens,
        };
        // A struct of strings and numbers always serializes.
        let payload = serde_json::to_vec(&record).unwrap_or_default();
        let sent = tokio::time::timeout(
            PUBLISH_DEADLINE,
            self.producer.send(
                FutureRecord::to(&self.topic)
                    .key(self.instance.as_bytes())
                    .payload(&payload),
                Timeout::After(PUBLISH_DEADLINE),
            ),
        )
        .await;
        let error = match sent {
            Ok(Ok(_)) => {
                self.metrics.published.inc();
                return;
            }
            Ok(Err((e, _))) => e.to_string(),
            Err(_) => format!("not acknowledged within {PUBLISH_DEADLINE:?}"),
        };
        self.limits.restore_unpublished(usd, tokens);
        self.metrics.publish_failures.inc();
        tracing::warn!(topic = %self.topic, error, usd, tokens, "a spend record was not written; the next carries it");
    }
}

async fn publish_every(publisher: std::sync::Weak<Publisher>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(p) = publisher.upgrade() else {
            return;
        };
        p.publish().await;
    }
}

/// A ledger record, or `None` (one that does not decode, or is too large,
/// carries no spend that can be trusted).
fn decode(payload: &[u8]) -> Option<SpendRecord> {
    if payload.len() > MAX_RECORD_BYTES {
        return None;
    }
    let record: SpendRecord = serde_json::from_slice(payload).ok()?;
    (record.schema_version == 1 && record.usd.is_finite() && record.usd >= 0.0).then_some(record)
}

fn tail_error(e: TailError) -> StageError {
    // TailError names the topic.
    StageError::Ledger(format!("reading {e}"))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Host name and process id.
fn worker_identity() -> &'static str {
    static IDENTITY: OnceLock<String> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .unwrap_or_default();
        format!("{}/{}", host.trim(), std::process::id())
    })
}

/// The hook that re-splits the group's rate limits after every rebalance:
/// this worker takes the share of `input`'s `total` partitions it holds.
pub fn rate_share_hook(
    input: &str,
    total: usize,
    limits: GroupLimits,
    metrics: LedgerMetrics,
) -> AssignmentHook {
    let input = input.to_string();
    Box::new(move |assignment| {
        let held = assignment.iter().filter(|(t, _)| **t == *input).count();
        limits.set_rate_share(held, total);
        let (requests, tokens) = limits.rate_per_minute();
        metrics.rate_share.set(if total == 0 {
            1.0
        } else {
            held as f64 / total as f64
        });
        tracing::info!(
            partitions = held,
            of = total,
            requests_per_minute = requests,
            tokens_per_minute = tokens,
            "the group's LLM rate limits re-split"
        );
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_bad_one_is_skipped() {
        let record = SpendRecord {
            schema_version: 1,
            group: "hintstream-hints".into(),
            worker: "host/1".into(),
            instance: "00000000000000ab".into(),
            at_ms: 1_700_000_000_000,
            usd: 0.042,
            tokens: 1234,
        };
        let bytes = serde_json::to_vec(&record).unwrap();
        assert_eq!(decode(&bytes), Some(record.clone()));
        let negative = SpendRecord { usd: -1.0, ..record };
        assert_eq!(decode(&serde_json::to_vec(&negative).unwrap()), None);
        assert_eq!(decode(b"{not json"), None);
        assert_eq!(decode(&vec![b' '; MAX_RECORD_BYTES + 1]), None);
    }
}
