//! The group's spend ledger (`[topics] spend`): each worker publishes what
//! it settled since it started (running totals) about every
//! `llm.ledger_interval_ms`, and reads every record of its consumer group
//! written in the last hour, so that `llm.budget_usd_per_hour` and
//! `llm.budget_tokens_per_hour` bound the group's spend, not each worker's.
//! Also the rate limits' re-split on every rebalance ([`rate_share_hook`]).
//!
//! - A record is a small JSON object ([`SpendRecord`]) keyed by the
//!   worker's instance id, random at each start (the process's
//!   incarnation: a restarted worker is a new stream whose totals start
//!   from 0, and what it spent before counts as a peer's). A worker skips
//!   its own instance's records (its own spend is in its window already,
//!   published or not) and records of other consumer groups (several
//!   stage-1 deployments may share the topic).
//! - Records are idempotent: each carries its instance's running totals
//!   and a sequence number, and a reader counts, per instance, what the
//!   totals grew by since the last record it read ([`PeerStreams`]). A
//!   record delivered twice (a produce that timed out here but reached the
//!   broker, then a later record), out of order, or lost changes nothing:
//!   the next record's totals cover it. The first record a reader sees of
//!   an instance (at start-up, an hour back) counts what it says was
//!   settled since the instance's last acknowledged record. A record of
//!   the first format (schema 1, a worker not yet upgraded: what it settled
//!   since its previous record, no totals) counts as it says.
//! - Publishing is bounded ([`PUBLISH_DEADLINE`]) and never holds a hint: a
//!   record that was not acknowledged is counted
//!   (`hintstream_hints_llm_ledger_publish_failures`) and logged; the next
//!   carries the same totals or more.
//! - Records are checked before they count (negative or non-finite
//!   amounts, totals going backwards, a `seq` or totals that jump further
//!   than one instance could go since its last record, a time over
//!   [`MAX_CLOCK_AHEAD`] ahead): a rejected record counts for nothing
//!   (`hintstream_hints_llm_ledger_rejected_records`) and never moves its
//!   instance's stored `seq` or totals, so a forged record naming a real
//!   instance cannot silence that instance's later records. A plausible
//!   record with more than a budget (after an outage) counts, capped at
//!   the budget. Whoever may write the topic still controls the budget
//!   (records of an invented instance count): WRITE on it is a
//!   budget-control permission.
//! - Every interval is a round (`rounds`): publish and read the ledger
//!   up to its end. A passed round lets this worker take its share (the
//!   input partitions it holds) of what the group left of the budget until
//!   the next; no passed round for `llm.ledger_stale_secs`, or a failed
//!   start-up read, puts it in share mode (`super::ledger_share`).
//! - The overspend bound: a worker does not see the others' calls in
//!   flight, nor what they settled since their last record. So the group
//!   spends at most the budget plus its calls in flight and the least of
//!   what it settles within one ledger lag and what remained at the read
//!   before (docs/hints.md, "The overspend bound, under each fault"). A
//!   worker alone: the budget itself. A killed worker (no final record)
//!   adds its calls in flight (billed, never settled, seen by no peer) and
//!   what it settled since its last acknowledged record.
//! - Without a budget there is no ledger (and no group-spend gauges). With
//!   one, the spend topic is required like the stage's other topics: a
//!   missing one exits 2 naming it (`hintstream topics create` makes it),
//!   a refused one names the missing ACL.
//! - Record times are the broker's: `hintstream topics create` makes the
//!   spend topic with `message.timestamp.type = LogAppendTime`, so a
//!   writer's clock skew does not move its spend in the rolling hour, and a
//!   reader started later finds the same ages. On a topic made without it,
//!   the writers' wall clocks (`at_ms`) stand in, and a skew between hosts
//!   moves a record's place in the rolling hour by that much.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rdkafka::producer::{FutureRecord, Producer};
use rdkafka::util::Timeout;
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use super::failure::HintsFailure;
use super::ledger_share::Freshness;
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

/// How far ahead of this host's clock a record's time may be (clock skew
/// between hosts); a record further ahead is rejected.
pub const MAX_CLOCK_AHEAD: Duration = Duration::from_secs(300);

/// The most instances a reader tracks; beyond that, the ones not heard of
/// in the last hour are forgotten (a forgotten instance's next record
/// counts what it says was settled since its last acknowledged record).
const MAX_STREAMS: usize = 4096;

/// The fewest milliseconds between two records of one instance (the least
/// `llm.ledger_interval_ms`).
const MIN_RECORD_GAP_MS: u64 = *crate::config::LEDGER_INTERVAL_MS.start();

/// How long an instance may have run when a reader first sees it, for the
/// plausibility of its first record (a forged `seq` or total beyond this
/// is rejected).
const MAX_INSTANCE_AGE: Duration = Duration::from_secs(366 * 24 * 3600);

/// The highest `seq` a first record read of an instance may carry: one
/// record per [`MIN_RECORD_GAP_MS`] for [`MAX_INSTANCE_AGE`].
const MAX_FIRST_SEQ: u64 = MAX_INSTANCE_AGE.as_millis() as u64 / MIN_RECORD_GAP_MS;

/// Hours of budget an instance's totals may grow by beyond the hours
/// between two of its records (its calls in flight, an hour's worth after
/// an outage): more is not plausible.
const SPEND_SLACK_HOURS: f64 = 2.0;

/// The most records an instance writes within `elapsed`: one per
/// [`MIN_RECORD_GAP_MS`], its final one at shutdown, and one of slack
/// (two records' broker times can be a little closer than their sends).
fn most_records_within(elapsed: Duration) -> u64 {
    (elapsed.as_millis() as u64) / MIN_RECORD_GAP_MS + 2
}

/// Whether `usd` and `tokens` could have been settled within `elapsed` by
/// one instance under `budgets`: at most [`SPEND_SLACK_HOURS`] plus the
/// elapsed hours' worth of each budget set.
fn plausible(
    usd: f64,
    tokens: u64,
    elapsed: Duration,
    (usd_budget, tokens_budget): (Option<f64>, Option<u64>),
) -> bool {
    let hours = SPEND_SLACK_HOURS + elapsed.as_secs_f64() / LOOKBACK.as_secs_f64();
    usd_budget.is_none_or(|b| usd <= b * hours)
        && tokens_budget.is_none_or(|b| tokens as f64 <= b as f64 * hours)
}

/// The record format's version (2: running totals; 1, still read: what
/// was settled since the previous record).
const SCHEMA_VERSION: u32 = 2;

/// One worker incarnation's spend so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpendRecord {
    pub schema_version: u32,
    /// The stage's consumer group (`hints.group_id`): whose budget it is.
    pub group: String,
    /// The worker: host name and process id.
    pub worker: String,
    /// This run of the worker (random at start-up): its records are the
    /// ones it skips, and one stream of running totals.
    pub instance: String,
    /// The record's number in its instance's stream: 1, 2, ... (0 in
    /// schema 1)
    #[serde(default)]
    pub seq: u64,
    /// When it was written: milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// Dollars and tokens (input + output) the instance settled since it
    /// started (0 in schema 1).
    #[serde(default)]
    pub total_usd: f64,
    #[serde(default)]
    pub total_tokens: u64,
    /// What of those totals its last acknowledged record did not carry:
    /// what a reader that read none of its earlier records counts.
    pub usd: f64,
    pub tokens: u64,
}

/// What a reader does with one record of a peer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Count this much spend, `age` ago.
    Count { age: Duration, usd: f64, tokens: u64 },
    /// Already counted (a duplicate, or older than one already read).
    Seen,
    /// Not to be trusted: counts for nothing.
    Rejected(&'static str),
}

/// The last record read of one instance.
#[derive(Debug, Clone, Copy)]
struct Stream {
    seq: u64,
    total_usd: f64,
    total_tokens: u64,
    at_ms: i64,
}

/// A reader's view of its group's instances: the last totals read of each,
/// so that each record counts only what its totals grew by.
#[derive(Debug, Default)]
pub struct PeerStreams {
    streams: HashMap<String, Stream>,
}

impl PeerStreams {
    /// Decides what `record` (of this reader's group, not its own) counts,
    /// at `now_ms`, under `budgets` (dollars, tokens per hour). Its time is
    /// `appended_ms`, the broker's (the spend topic stamps records with
    /// `LogAppendTime`), else what the writer says (`at_ms`). A record
    /// whose `seq` or totals jump further than its instance could have
    /// gone since its last record is rejected, and a rejected record never
    /// moves its instance's stored `seq` or totals: a forged one cannot
    /// silence the instance's genuine records. A plausible record with more
    /// spend than a budget (an outage's worth) counts, capped at the budget.
    pub fn observe(
        &mut self,
        record: &SpendRecord,
        appended_ms: Option<i64>,
        now_ms: i64,
        budgets: (Option<f64>, Option<u64>),
    ) -> Verdict {
        let finite = |v: f64| v.is_finite() && v >= 0.0;
        if !(finite(record.total_usd) && finite(record.usd)) {
            return Verdict::Rejected("negative_or_not_finite");
        }
        let at_ms = appended_ms.unwrap_or(record.at_ms);
        let ahead_ms = i64::try_from(MAX_CLOCK_AHEAD.as_millis()).unwrap_or(i64::MAX);
        if at_ms > now_ms.saturating_add(ahead_ms) {
            return Verdict::Rejected("in_the_future");
        }
        if record.schema_version == 1 {
            // No totals: the spend since its previous record, as it says.
            if !plausible(record.usd, record.tokens, LOOKBACK, budgets) {
                return Verdict::Rejected("implausible_totals");
            }
            return Self::bounded(at_ms, record.usd, record.tokens, now_ms, budgets);
        }
        let last = self.streams.get(&record.instance).copied();
        let (usd, tokens) = match last {
            Some(last) if record.seq <= last.seq => return Verdict::Seen,
            Some(last) => {
                let elapsed =
                    Duration::from_millis(u64::try_from(at_ms.saturating_sub(last.at_ms)).unwrap_or(0));
                if record.seq - last.seq > most_records_within(elapsed) {
                    return Verdict::Rejected("implausible_seq");
                }
                if record.total_usd < last.total_usd || record.total_tokens < last.total_tokens {
                    return Verdict::Rejected("totals_went_back");
                }
                let grew = (
                    record.total_usd - last.total_usd,
                    record.total_tokens - last.total_tokens,
                );
                if !plausible(grew.0, grew.1, elapsed, budgets) {
                    return Verdict::Rejected("implausible_totals");
                }
                grew
            }
            None => {
                if record.seq > MAX_FIRST_SEQ {
                    return Verdict::Rejected("implausible_seq");
                }
                if !(plausible(record.usd, record.tokens, LOOKBACK, budgets)
                    && plausible(record.total_usd, record.total_tokens, MAX_INSTANCE_AGE, budgets))
                {
                    return Verdict::Rejected("implausible_totals");
                }
                (record.usd, record.tokens)
            }
        };
        // Read on: a later record counts from these totals.
        if last.is_none() && self.streams.len() >= MAX_STREAMS {
            self.forget_old(now_ms);
        }
        self.streams.insert(
            record.instance.clone(),
            Stream {
                seq: record.seq,
                total_usd: record.total_usd,
                total_tokens: record.total_tokens,
                at_ms,
            },
        );
        Self::bounded(at_ms, usd, tokens, now_ms, budgets)
    }

    /// Counts `usd` and `tokens` of a record of time `at_ms`, each capped
    /// at its budget: an instance cut off from the ledger (an outage) may
    /// have spent its share for longer than an hour, and no record counts
    /// more than the whole budget.
    fn bounded(
        at_ms: i64,
        usd: f64,
        tokens: u64,
        now_ms: i64,
        (usd_budget, tokens_budget): (Option<f64>, Option<u64>),
    ) -> Verdict {
        let usd = usd_budget.map_or(usd, |b| usd.min(b));
        let tokens = tokens_budget.map_or(tokens, |b| tokens.min(b));
        let age = Duration::from_millis(u64::try_from(now_ms.saturating_sub(at_ms)).unwrap_or(0));
        Verdict::Count { age, usd, tokens }
    }

    /// Forgets the instances not heard of in the last hour, or, if all
    /// were, the older half.
    fn forget_old(&mut self, now_ms: i64) {
        let hour_ms = i64::try_from(LOOKBACK.as_millis()).unwrap_or(i64::MAX);
        self.streams
            .retain(|_, s| now_ms.saturating_sub(s.at_ms) < hour_ms);
        if self.streams.len() >= MAX_STREAMS {
            let mut times: Vec<i64> = self.streams.values().map(|s| s.at_ms).collect();
            times.sort_unstable();
            let median = times[times.len() / 2];
            self.streams.retain(|_, s| s.at_ms > median);
        }
    }
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
    rejected: Counter,
    /// 1 while the ledger cannot be read (share mode); registered only
    /// with a budget.
    share_mode: Gauge,
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
            rejected: Counter::default(),
            share_mode: Gauge::default(),
        };
        m.rate_share.set(1.0);
        if with_budget {
            registry.register(
                "llm_ledger_share_mode",
                "1 while this worker cannot read the spend ledger (for longer than llm.ledger_stale_secs, or \
                 at start-up) and spends only its share of the budget (its input partitions over all), else 0",
                m.share_mode.clone(),
            );
        }
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
            "Spend records not acknowledged within their deadline (the next carries the same running totals or more)",
            m.publish_failures.clone(),
        );
        registry.register(
            "llm_ledger_peer_records",
            "Spend records of the group's other workers read from the spend ledger",
            m.peer_records.clone(),
        );
        registry.register(
            "llm_ledger_rejected_records",
            "Spend records of the group's other workers rejected (negative or non-finite amounts, totals \
             going back, a seq or totals jumping further than a worker could go, a time too far ahead): they \
             count for nothing",
            m.rejected.clone(),
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
    sent: Mutex<Sent>,
}

/// What the publisher sent so far.
#[derive(Debug, Default)]
struct Sent {
    /// The last record's number.
    seq: u64,
    /// The totals of the last acknowledged record.
    acked_usd: f64,
    acked_tokens: u64,
}

impl Ledger {
    /// Starts the ledger of `config`'s stage 1 when a spend budget is set:
    /// checks that the principal may read and write `[topics] spend` and
    /// that it exists (a missing topic is a configuration error, exit 2),
    /// reads the group's records of the last hour (at most
    /// [`CATCH_UP_TIMEOUT`]; when that fails, the worker starts in share
    /// mode, see [`super::ledger_share`]), then publishes and reads every
    /// `llm.ledger_interval_ms`. `None` without a budget.
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
        let publisher = Arc::new(Publisher {
            topic,
            group: config.hints.group_id.clone(),
            instance: format!("{:016x}", rand::random::<u64>()),
            limits,
            producer,
            metrics,
            sent: Mutex::new(Sent::default()),
        });
        // A reader that cannot start (the topic's leader unreachable) is
        // a failed catch-up: share mode, and the rounds start it again.
        let (tail, caught_up) = match start_reader(config, &publisher).await {
            Ok(tail) => {
                let caught_up = tail.sync(CATCH_UP_TIMEOUT).await.map_err(|e| e.to_string());
                (Some(tail), caught_up)
            }
            Err(e) => (None, Err(e.to_string())),
        };
        let fresh = Freshness::at_start(
            &publisher.topic,
            Duration::from_secs(config.llm.ledger_stale_secs),
            publisher.limits.clone(),
            publisher.metrics.share_mode.clone(),
            caught_up,
        );
        publisher.metrics.show(&publisher.limits);
        let interval = Duration::from_millis(config.llm.ledger_interval_ms);
        let reader = Reader {
            config: config.clone(),
            tail,
        };
        let task =
            tokio::spawn(rounds(Arc::downgrade(&publisher), reader, fresh, interval).in_current_span());
        tracing::info!(
            topic = %publisher.topic, instance = %publisher.instance, interval_ms = config.llm.ledger_interval_ms,
            "the spend budget is the consumer group's"
        );
        Ok(Some(Ledger { publisher, task }))
    }

    /// At shutdown: stops the periodic publisher (a record it had in
    /// flight may still be delivered; the last one's totals cover it), then
    /// publishes the final totals and flushes the producer, so that the
    /// others count all of this worker's spend. Takes at most twice
    /// [`PUBLISH_DEADLINE`] (an unreachable broker delays the exit that
    /// much).
    pub async fn close(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
        let _ = self.publisher.publish().await;
        let producer = self.publisher.producer.clone();
        let flushed = tokio::task::spawn_blocking(move || producer.flush(PUBLISH_DEADLINE)).await;
        if let Ok(Err(e)) = flushed {
            tracing::warn!(topic = %self.publisher.topic, error = %e, "the last spend record may not have been written");
        }
    }
}

impl Publisher {
    fn sent(&self) -> std::sync::MutexGuard<'_, Sent> {
        // Plain numbers, each set whole.
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes one record of this instance's running totals (none when no
    /// spend was settled since the last acknowledged record), within
    /// [`PUBLISH_DEADLINE`]; a failure is counted and logged (the next
    /// record carries the same totals or more). Whether the others can
    /// count this worker's spend: the record acknowledged, or none due.
    async fn publish(&self) -> bool {
        self.metrics.show(&self.limits);
        let Some((total_usd, total_tokens)) = self.limits.settled_totals() else {
            return true;
        };
        let record = {
            let mut sent = self.sent();
            if total_usd <= sent.acked_usd && total_tokens <= sent.acked_tokens {
                return true;
            }
            sent.seq += 1;
            SpendRecord {
                schema_version: SCHEMA_VERSION,
                group: self.group.clone(),
                worker: worker_identity().to_string(),
                instance: self.instance.clone(),
                seq: sent.seq,
                at_ms: now_ms(),
                total_usd,
                total_tokens,
                usd: (total_usd - sent.acked_usd).max(0.0),
                tokens: total_tokens.saturating_sub(sent.acked_tokens),
            }
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
                let mut sent = self.sent();
                sent.acked_usd = sent.acked_usd.max(total_usd);
                sent.acked_tokens = sent.acked_tokens.max(total_tokens);
                self.metrics.published.inc();
                return true;
            }
            Ok(Err((e, _))) => e.to_string(),
            Err(_) => format!("not acknowledged within {PUBLISH_DEADLINE:?}"),
        };
        self.metrics.publish_failures.inc();
        tracing::warn!(
            topic = %self.topic, error, seq = record.seq, total_usd, total_tokens,
            "a spend record was not acknowledged; the next carries the same totals or more"
        );
        false
    }
}

/// How long one round's read of the ledger may take (its read barrier),
/// at least: a slow fetch is not yet an outage.
const MIN_READ_BOUND: Duration = Duration::from_secs(2);

/// The ledger's reader, started again by the rounds when it could not
/// start.
struct Reader {
    config: Config,
    tail: Option<TopicTail>,
}

impl Reader {
    /// Reads the ledger up to its end, at most `within`; starts the reader
    /// first when it is not running.
    async fn read(&mut self, publisher: &Publisher, within: Duration) -> Result<(), String> {
        if self.tail.is_none() {
            self.tail = Some(
                start_reader(&self.config, publisher)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        match &self.tail {
            Some(tail) => tail.sync(within).await.map_err(|e| e.to_string()),
            None => Err(String::from("the spend ledger's reader did not start")),
        }
    }
}

/// Every `interval`: publishes this worker's totals and reads the ledger up
/// to its end, both at once; a round that passes sets the allowance until
/// the next, one that fails counts towards share mode ([`Freshness`]).
async fn rounds(
    publisher: std::sync::Weak<Publisher>,
    mut reader: Reader,
    mut fresh: Freshness,
    interval: Duration,
) {
    let read_bound = interval.max(MIN_READ_BOUND);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(p) = publisher.upgrade() else {
            return;
        };
        let (published, read) = tokio::join!(p.publish(), reader.read(&p, read_bound));
        match (published, read) {
            (true, Ok(())) => fresh.passed(),
            (false, _) => fresh.failed("this worker's spend record was not acknowledged"),
            (_, Err(e)) => fresh.failed(&e),
        }
        p.metrics.show(&p.limits);
    }
}

/// Starts reading the group's records of the last hour from `publisher`'s
/// topic, each peer's record counted into its limits.
async fn start_reader(config: &Config, publisher: &Publisher) -> Result<TopicTail, StageError> {
    let (group, instance) = (publisher.group.clone(), publisher.instance.clone());
    let (limits, metrics) = (publisher.limits.clone(), publisher.metrics.clone());
    let since = SystemTime::now().checked_sub(LOOKBACK).unwrap_or(UNIX_EPOCH);
    let mut streams = PeerStreams::default();
    TopicTail::start_since(config, &publisher.topic, since, move |_, payload, appended| {
        let Some(record) = payload.and_then(decode) else {
            return;
        };
        if record.group != group || record.instance == instance {
            return;
        }
        metrics.peer_records.inc();
        match streams.observe(&record, appended, now_ms(), limits.budgets()) {
            Verdict::Count { age, usd, tokens } => limits.observe_peer_spend(age, usd, tokens),
            Verdict::Seen => {}
            Verdict::Rejected(why) => {
                // The first ten, then ever more rarely: a flood of bad
                // records does not flood the log.
                let n = metrics.rejected.inc() + 1;
                if n <= 10 || n.is_power_of_two() {
                    tracing::warn!(
                        instance = %record.instance, worker = %record.worker, seq = record.seq, why,
                        rejected = n, "a spend ledger record was rejected; it counts for nothing"
                    );
                }
            }
        }
    })
    .await
    .map_err(tail_error)
}

/// A ledger record, or `None` (one that does not decode, or is too large,
/// carries no spend that can be trusted).
fn decode(payload: &[u8]) -> Option<SpendRecord> {
    if payload.len() > MAX_RECORD_BYTES {
        return None;
    }
    let record: SpendRecord = serde_json::from_slice(payload).ok()?;
    (record.schema_version == SCHEMA_VERSION || record.schema_version == 1).then_some(record)
}

fn tail_error(e: TailError) -> StageError {
    // TailError names the topic.
    HintsFailure::Ledger(format!("reading {e}")).into()
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

/// The hook that re-splits the group's rate limits and budget after every
/// rebalance: this worker takes the share of `input`'s `total` partitions
/// it holds (at most all of them), logged when its rates change (at info
/// when the stage calls a model, `calls_model`; otherwise the rates limit
/// nothing, and the line is at debug).
pub fn rate_share_hook(
    input: &str,
    total: usize,
    limits: GroupLimits,
    metrics: LedgerMetrics,
    calls_model: bool,
) -> AssignmentHook {
    let input = input.to_string();
    Box::new(move |assignment| {
        let held = assignment.iter().filter(|(t, _)| **t == *input).count();
        let changed = limits.set_rate_share(held, total);
        limits.set_budget_share(held, total);
        let (requests, tokens) = limits.rate_per_minute();
        metrics.rate_share.set(if total == 0 {
            1.0
        } else {
            held.min(total) as f64 / total as f64
        });
        if !changed {
            return;
        }
        macro_rules! resplit {
            ($level:expr) => {
                tracing::event!(
                    $level,
                    partitions = held,
                    of = total,
                    requests_per_minute = requests,
                    tokens_per_minute = tokens,
                    "the group's LLM rate limits re-split"
                )
            };
        }
        if calls_model {
            resplit!(tracing::Level::INFO);
        } else {
            resplit!(tracing::Level::DEBUG);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGETS: (Option<f64>, Option<u64>) = (Some(1.0), None);
    const NOW: i64 = 1_700_000_000_000;

    fn record(instance: &str, seq: u64, total_usd: f64, usd: f64) -> SpendRecord {
        SpendRecord {
            schema_version: SCHEMA_VERSION,
            group: "hintstream-hints".into(),
            worker: "host/1".into(),
            instance: instance.into(),
            seq,
            at_ms: NOW,
            total_usd,
            total_tokens: (total_usd * 1e4) as u64,
            usd,
            tokens: (usd * 1e4) as u64,
        }
    }

    /// Dollars counted of `verdict`, 0 when it counts none.
    fn counted(verdict: Verdict) -> f64 {
        match verdict {
            Verdict::Count { usd, .. } => usd,
            _ => 0.0,
        }
    }

    #[test]
    fn a_record_round_trips_and_a_bad_one_is_skipped() {
        let r = record("00000000000000ab", 3, 0.042, 0.01);
        let bytes = serde_json::to_vec(&r).unwrap();
        assert_eq!(decode(&bytes), Some(r.clone()));
        let future = SpendRecord {
            schema_version: 3,
            ..r
        };
        assert_eq!(decode(&serde_json::to_vec(&future).unwrap()), None);
        assert_eq!(decode(b"{not json"), None);
        assert_eq!(decode(&vec![b' '; MAX_RECORD_BYTES + 1]), None);
    }

    #[test]
    fn a_duplicate_record_counts_once() {
        let mut streams = PeerStreams::default();
        let first = record("a", 1, 0.10, 0.10);
        assert!((counted(streams.observe(&first, None, NOW, BUDGETS)) - 0.10).abs() < 1e-12);
        assert_eq!(streams.observe(&first, None, NOW, BUDGETS), Verdict::Seen);
        // The publisher timed out on seq 2 (delivered anyway) and sent the
        // same totals again as seq 3: nothing more.
        assert!(
            (counted(streams.observe(&record("a", 2, 0.15, 0.05), None, NOW, BUDGETS)) - 0.05).abs() < 1e-12
        );
        assert_eq!(
            counted(streams.observe(&record("a", 3, 0.15, 0.05), None, NOW, BUDGETS)),
            0.0
        );
    }

    #[test]
    fn a_lost_record_is_covered_by_the_next() {
        let mut streams = PeerStreams::default();
        streams.observe(&record("a", 1, 0.10, 0.10), None, NOW, BUDGETS);
        // Seq 2 (0.10 -> 0.15) never arrived; seq 3 carries the totals.
        let v = streams.observe(&record("a", 3, 0.20, 0.10), None, NOW, BUDGETS);
        assert!((counted(v) - 0.10).abs() < 1e-12, "{v:?}");
    }

    #[test]
    fn an_out_of_order_record_counts_nothing_more() {
        let mut streams = PeerStreams::default();
        streams.observe(&record("a", 1, 0.10, 0.10), None, NOW, BUDGETS);
        streams.observe(&record("a", 3, 0.30, 0.20), None, NOW, BUDGETS);
        assert_eq!(
            streams.observe(&record("a", 2, 0.20, 0.10), None, NOW, BUDGETS),
            Verdict::Seen
        );
        let v = streams.observe(&record("a", 4, 0.35, 0.05), None, NOW, BUDGETS);
        assert!((counted(v) - 0.05).abs() < 1e-12, "{v:?}");
    }

    #[test]
    fn a_new_incarnation_is_a_new_stream_from_zero() {
        let mut streams = PeerStreams::default();
        streams.observe(&record("a", 5, 0.40, 0.05), None, NOW, BUDGETS);
        // The worker restarted: a new instance id, totals from 0, seq from 1.
        let v = streams.observe(&record("b", 1, 0.03, 0.03), None, NOW, BUDGETS);
        assert!((counted(v) - 0.03).abs() < 1e-12, "{v:?}");
        // The old incarnation's late record still counts on its own stream.
        let v = streams.observe(&record("a", 6, 0.42, 0.02), None, NOW, BUDGETS);
        assert!((counted(v) - 0.02).abs() < 1e-12, "{v:?}");
    }

    #[test]
    fn the_first_record_read_of_an_instance_counts_what_its_last_acknowledged_one_did_not() {
        // Read at start-up, an hour back: its totals hold older spend.
        let mut streams = PeerStreams::default();
        let v = streams.observe(&record("a", 40, 3.00, 0.02), None, NOW, BUDGETS);
        assert!((counted(v) - 0.02).abs() < 1e-12, "{v:?}");
    }

    #[test]
    fn untrustworthy_records_are_rejected() {
        let mut streams = PeerStreams::default();
        let negative = record("a", 1, -1.0, 0.0);
        assert!(matches!(
            streams.observe(&negative, None, NOW, BUDGETS),
            Verdict::Rejected(_)
        ));
        let nan = record("a", 1, f64::NAN, 0.0);
        assert!(matches!(
            streams.observe(&nan, None, NOW, BUDGETS),
            Verdict::Rejected(_)
        ));
        let infinite = record("a", 1, 0.1, f64::INFINITY);
        assert!(matches!(
            streams.observe(&infinite, None, NOW, BUDGETS),
            Verdict::Rejected(_)
        ));
        let ahead = SpendRecord {
            at_ms: NOW + 3_600_000,
            ..record("a", 1, 0.1, 0.1)
        };
        assert_eq!(
            streams.observe(&ahead, None, NOW, BUDGETS),
            Verdict::Rejected("in_the_future")
        );
        // More than any instance could spend in the time.
        assert_eq!(
            streams.observe(&record("b", 1, 5.0, 5.0), None, NOW, BUDGETS),
            Verdict::Rejected("implausible_totals")
        );
        // ...which does not stop that instance's later records counting.
        let v = streams.observe(&record("b", 2, 5.1, 0.1), None, NOW, BUDGETS);
        assert!((counted(v) - 0.1).abs() < 1e-9, "{v:?}");
        // Totals going back.
        assert_eq!(
            streams.observe(&record("b", 3, 1.0, 0.0), None, NOW, BUDGETS),
            Verdict::Rejected("totals_went_back")
        );
        // A token budget bounds the tokens of one record.
        let huge = SpendRecord {
            total_tokens: u64::MAX,
            tokens: u64::MAX,
            ..record("c", 1, 0.0, 0.0)
        };
        assert_eq!(
            streams.observe(&huge, None, NOW, (None, Some(1_000_000))),
            Verdict::Rejected("implausible_totals")
        );
    }

    #[test]
    fn a_record_of_a_worker_not_yet_upgraded_counts_as_it_says() {
        let v1 = br#"{"schema_version":1,"group":"hintstream-hints","worker":"host/1",
            "instance":"00000000000000ab","at_ms":1700000000000,"usd":0.042,"tokens":1234}"#;
        let record = decode(v1).unwrap();
        let mut streams = PeerStreams::default();
        for _ in 0..2 {
            let v = streams.observe(&record, None, NOW, BUDGETS);
            assert_eq!(
                v,
                Verdict::Count {
                    age: Duration::ZERO,
                    usd: 0.042,
                    tokens: 1234
                }
            );
        }
        let over = SpendRecord {
            usd: 2.0,
            ..record.clone()
        };
        assert_eq!(
            counted(streams.observe(&over, None, NOW, BUDGETS)),
            1.0,
            "capped at the budget"
        );
        let huge = SpendRecord { usd: 5.0, ..record };
        assert_eq!(
            streams.observe(&huge, None, NOW, BUDGETS),
            Verdict::Rejected("implausible_totals")
        );
    }

    const HOUR_MS: i64 = 3_600_000;

    #[test]
    fn a_forged_seq_does_not_silence_the_instance_it_names() {
        let forged = || record("a", u64::MAX, 0.10, 0.0);
        // After the genuine first record, and as the first one read.
        for genuine_first in [true, false] {
            let mut streams = PeerStreams::default();
            if genuine_first {
                streams.observe(&record("a", 1, 0.10, 0.10), None, NOW, BUDGETS);
            }
            assert_eq!(
                streams.observe(&forged(), None, NOW, BUDGETS),
                Verdict::Rejected("implausible_seq")
            );
            let v = streams.observe(&record("a", 2, 0.30, 0.20), None, NOW + 1_000, BUDGETS);
            assert!(
                (counted(v) - 0.20).abs() < 1e-9,
                "genuine first {genuine_first}: {v:?}"
            );
            let v = streams.observe(&record("a", 3, 0.35, 0.05), None, NOW + 2_000, BUDGETS);
            assert!(
                (counted(v) - 0.05).abs() < 1e-9,
                "genuine first {genuine_first}: {v:?}"
            );
        }
        // A jump further than one record per interval since the last.
        let mut streams = PeerStreams::default();
        streams.observe(&record("a", 1, 0.10, 0.10), None, NOW, BUDGETS);
        let far = most_records_within(Duration::from_secs(10)) + 2;
        assert_eq!(
            streams.observe(&record("a", far, 0.20, 0.10), None, NOW + 10_000, BUDGETS),
            Verdict::Rejected("implausible_seq")
        );
        let v = streams.observe(&record("a", 2, 0.20, 0.10), None, NOW + 10_000, BUDGETS);
        assert!((counted(v) - 0.10).abs() < 1e-9, "{v:?}");
    }

    #[test]
    fn forged_totals_do_not_silence_the_instance_they_name() {
        let mut streams = PeerStreams::default();
        streams.observe(&record("a", 1, 0.10, 0.10), None, NOW, BUDGETS);
        assert_eq!(
            streams.observe(&record("a", 2, 1e300, 1e300), None, NOW + 1_000, BUDGETS),
            Verdict::Rejected("implausible_totals")
        );
        // Seq 2 was not taken by the forgery: the genuine seq 2 counts.
        let v = streams.observe(&record("a", 2, 0.15, 0.05), None, NOW + 1_000, BUDGETS);
        assert!((counted(v) - 0.05).abs() < 1e-9, "{v:?}");
        // A forged first record with an implausible total.
        let mut streams = PeerStreams::default();
        assert_eq!(
            streams.observe(&record("b", 1, 1e300, 0.01), None, NOW, BUDGETS),
            Verdict::Rejected("implausible_totals")
        );
        let v = streams.observe(&record("b", 2, 0.02, 0.02), None, NOW, BUDGETS);
        assert!((counted(v) - 0.02).abs() < 1e-9, "{v:?}");
    }

    #[test]
    fn a_record_over_the_budget_after_an_outage_counts_capped_at_the_budget() {
        let mut streams = PeerStreams::default();
        streams.observe(&record("a", 1, 0.10, 0.10), None, NOW, BUDGETS);
        // Two hours cut off from the ledger, spending its share: 1.5 × the
        // budget since its last record read.
        let v = streams.observe(&record("a", 2, 1.60, 1.50), None, NOW + 2 * HOUR_MS, BUDGETS);
        assert!((counted(v) - 1.0).abs() < 1e-9, "{v:?}");
    }

    #[test]
    fn a_record_of_a_writer_an_hour_behind_counts_for_the_hour_by_the_brokers_time() {
        let mut streams = PeerStreams::default();
        // The writer's clock says an hour ago; the broker appended it now.
        let behind = SpendRecord {
            at_ms: NOW - HOUR_MS,
            ..record("a", 1, 0.30, 0.30)
        };
        let v = streams.observe(&behind, Some(NOW), NOW, BUDGETS);
        assert_eq!(
            v,
            Verdict::Count {
                age: Duration::ZERO,
                usd: 0.30,
                tokens: 3000
            }
        );
        // Counted in the window, as any fresh spend: it stays for the hour.
        let budget = crate::llm::budget::SpendBudget::new(1.0, 0).unwrap();
        let Verdict::Count { age, usd, tokens } = v else {
            unreachable!()
        };
        budget.observe_peer(age, usd, tokens);
        assert!((budget.group_spend().usd - 0.30).abs() < 1e-9);
        // Without the broker's time it would have left the window at once.
        let mut streams = PeerStreams::default();
        let Verdict::Count { age, .. } = streams.observe(&behind, None, NOW, BUDGETS) else {
            panic!("counted")
        };
        assert!(age >= LOOKBACK, "{age:?}");
    }

    #[test]
    fn a_reader_tracks_a_bounded_number_of_instances() {
        let mut streams = PeerStreams::default();
        for i in 0..(MAX_STREAMS * 2) {
            let at_ms = NOW + i as i64;
            let r = SpendRecord {
                at_ms,
                ..record(&format!("i{i}"), 1, 0.0001, 0.0001)
            };
            streams.observe(&r, None, at_ms, BUDGETS);
        }
        assert!(streams.streams.len() <= MAX_STREAMS);
    }
}
