//! Drain on revoke, on Apache Kafka with cooperative-sticky
//! rebalancing: when a second member joins and takes partitions over, the
//! first finishes and commits their in-flight work before letting them go
//! (the newcomer does not redo it), and work parked outside handler tasks
//! (stage 2's pending steps) is released at once instead of holding the
//! rebalance for the whole drain timeout. The two tests of a revoke amid a
//! backlog rebalance eagerly (every partition revoked), so that the revoke
//! takes the partitions of whatever the consume loop is taking then.

use crate::common;
use crate::common::waits::wait_count;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hintstream::config::Config;
use hintstream::kafka::{RecordMeta, Rejected, RunOptions, RunSummary, Stage, StageLoop, Taken, Work};
use hintstream::metrics::StageMetrics;

const PARTITIONS: i32 = 4;
const MESSAGES: usize = 40;

async fn setup() -> (common::Broker, Config, String, String) {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    // Fast group protocol: the test is about the drain, not the timers.
    config.kafka.insert("session.timeout.ms", "10000");
    config.kafka.insert("heartbeat.interval.ms", "500");
    let topic = common::unique("revoke");
    common::create_topics(&config, &[&topic, &format!("{topic}.dlq")], PARTITIONS).await;
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    for i in 0..MESSAGES {
        common::send(&producer, &topic, &format!("k{i}"), i.to_string().as_bytes()).await;
    }
    let group = common::unique("revoke-group");
    (broker, config, topic, group)
}

/// A stage loop on `topic` (its dead letters to `{topic}.dlq`) in `group`,
/// with room for 1,000 messages and a drain of `drain`.
pub(super) fn stage_loop(
    config: &Config,
    group: &str,
    topic: &str,
    metrics: Arc<StageMetrics>,
    drain: Duration,
) -> StageLoop {
    StageLoop::create(
        config,
        group,
        topic,
        &format!("{topic}.dlq"),
        metrics,
        RunOptions {
            max_in_flight: 1000,
            max_in_flight_bytes: None,
            drain_timeout: drain,
        },
    )
    .unwrap()
}

/// Starts a member that acknowledges every message it gets: its stage, its
/// metrics, and the partitions of the messages it got, in order.
pub(super) fn start_acking(
    config: &Config,
    group: &str,
    topic: &str,
    drain: Duration,
) -> (
    common::Running<RunSummary>,
    Arc<StageMetrics>,
    Arc<Mutex<Vec<i32>>>,
) {
    let metrics = Arc::new(StageMetrics::unregistered());
    let seen: Arc<Mutex<Vec<i32>>> = Arc::default();
    let stage_loop = stage_loop(config, group, topic, metrics.clone(), drain);
    let handler_seen = seen.clone();
    let running = common::spawn_stage(move |stop| {
        stage_loop.run(
            |_: &[u8], _: &RecordMeta| Ok(()),
            move |work: Work<()>| {
                handler_seen.lock().unwrap().push(work.message.meta().partition);
                work.message.ack();
                async {}
            },
            stop,
        )
    });
    (running, metrics, seen)
}

/// Waits until `metrics` reports assigned partitions satisfying `until`.
pub(super) async fn wait_assigned(
    metrics: &StageMetrics,
    until: impl Fn(i64) -> bool,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    while !until(metrics.assigned()) {
        assert!(
            started.elapsed() < within,
            "assignment {} after {within:?}",
            metrics.assigned()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// The payload of the messages put at the end of every partition once the
/// work is done: the group committing past them means every message below
/// was finished by its partition's owner, a redone one included.
const MARKER: &str = "marker";

/// Produces one [`MARKER`] on each partition of `topic`.
async fn mark_the_ends(config: &Config, topic: &str) {
    let producer = hintstream::kafka::create_producer(config).unwrap();
    for p in 0..PARTITIONS {
        common::send_to_partition(&producer, topic, p, MARKER.as_bytes()).await;
    }
}

/// Puts a [`MARKER`] at the end of every partition and waits, at most
/// `within`, until the group committed past them all.
async fn mark_and_wait_committed(
    config: &Config,
    group: &str,
    topic: &str,
    within: Duration,
    context: impl Fn() -> String,
) {
    mark_the_ends(config, topic).await;
    common::waits::wait_committed_to_end(config, group, topic, PARTITIONS, within, context).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_work_of_revoked_partitions_finishes_and_is_not_redone() {
    let (_broker, config, topic, group) = setup().await;
    // Who processed what: (member, payload).
    let done: Arc<Mutex<Vec<(u8, String)>>> = Arc::default();
    // Work waits for A's revoke to begin: it is in flight when the second
    // member's join takes partitions from A.
    let (revoking, gate) = tokio::sync::watch::channel(false);
    let run = |member: u8, metrics: Arc<StageMetrics>| {
        let stage = stage_loop(&config, &group, &topic, metrics, Duration::from_secs(20));
        if member == 0 {
            let revoking = revoking.clone();
            stage.on_revoke(Box::new(move |_| {
                revoking.send_replace(true);
            }));
        }
        let (done, gate) = (done.clone(), gate.clone());
        common::spawn_stage(move |stop| {
            stage.run(
                |bytes: &[u8], _: &RecordMeta| Ok(String::from_utf8_lossy(bytes).into_owned()),
                move |work: Work<String>| {
                    let (done, mut gate) = (done.clone(), gate.clone());
                    async move {
                        let _ = gate.wait_for(|open| *open).await;
                        done.lock().unwrap().push((member, work.input));
                        work.message.ack();
                    }
                },
                stop,
            )
        })
    };
    let a_metrics = Arc::new(StageMetrics::unregistered());
    let a = run(0, a_metrics.clone());
    wait_assigned(
        &a_metrics,
        |n| n == i64::from(PARTITIONS),
        Duration::from_secs(60),
    )
    .await;
    // Let A take everything off the topic.
    wait_count("A took", MESSAGES, Duration::from_secs(30), || {
        a_metrics.in_flight()
    })
    .await;
    let b_metrics = Arc::new(StageMetrics::unregistered());
    let b = run(1, b_metrics.clone());
    let took = wait_assigned(&b_metrics, |n| n > 0, Duration::from_secs(60)).await;
    // Every message was finished once, by A: the revoke waited for them.
    wait_count("done", MESSAGES, Duration::from_secs(30), || {
        done.lock().unwrap().len()
    })
    .await;
    // Whatever B would redo comes before the markers on its partitions.
    mark_and_wait_committed(&config, &group, &topic, Duration::from_secs(60), || {
        format!("done: {:?}", done.lock().unwrap())
    })
    .await;
    a.stop().await;
    b.stop().await;
    let done: Vec<(u8, String)> = done
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, payload)| payload != MARKER)
        .cloned()
        .collect();
    let by_member: BTreeMap<u8, usize> = done.iter().fold(BTreeMap::new(), |mut m, (who, _)| {
        *m.entry(*who).or_default() += 1;
        m
    });
    let distinct: HashSet<&String> = done.iter().map(|(_, p)| p).collect();
    eprintln!(
        "revoke with {MESSAGES} in flight: B assigned after {took:.1?}; processed by member {by_member:?}"
    );
    assert_eq!(distinct.len(), MESSAGES);
    assert_eq!(
        done.len(),
        MESSAGES,
        "nothing redone by the new owner: {by_member:?}"
    );
    assert_eq!(
        by_member.get(&0),
        Some(&MESSAGES),
        "A finished all its in-flight work"
    );
    assert!(
        a_metrics.revoke_finished() >= 1,
        "the drain finished work of the revoked partitions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parked_work_of_revoked_partitions_is_released_without_waiting_out_the_drain() {
    const DRAIN: Duration = Duration::from_secs(30);
    let (_broker, config, topic, group) = setup().await;
    // A parks every message, as stage 2 parks the rows of incomplete steps,
    // and releases the revoked partitions' ones from its revoke hook.
    let parked: Arc<Mutex<Vec<Taken>>> = Arc::default();
    let released_count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook_released = released_count.clone();
    let a_metrics = Arc::new(StageMetrics::unregistered());
    let a_loop = stage_loop(&config, &group, &topic, a_metrics.clone(), DRAIN);
    let hook_parked = parked.clone();
    a_loop.on_revoke(Box::new(move |partitions| {
        let released: Vec<Taken> = {
            let mut parked = hook_parked.lock().unwrap();
            let (go, stay) = std::mem::take(&mut *parked)
                .into_iter()
                .partition(|t| partitions.iter().any(|(_, p)| *p == t.meta().partition));
            *parked = stay;
            go
        };
        hook_released.fetch_add(released.len(), std::sync::atomic::Ordering::SeqCst);
        drop(released);
    }));
    let handler_parked = parked.clone();
    let a = common::spawn_stage(move |stop| {
        a_loop.run(
            |_: &[u8], _: &RecordMeta| Ok(()),
            move |work: Work<()>| {
                handler_parked.lock().unwrap().push(work.message);
                async {}
            },
            stop,
        )
    });
    wait_assigned(
        &a_metrics,
        |n| n == i64::from(PARTITIONS),
        Duration::from_secs(60),
    )
    .await;
    wait_count("A parked", MESSAGES, Duration::from_secs(30), || {
        parked.lock().unwrap().len()
    })
    .await;
    // B takes everything it gets and finishes it.
    let (b, b_metrics, b_seen) = start_acking(&config, &group, &topic, DRAIN);
    let took = wait_assigned(&b_metrics, |n| n > 0, DRAIN + Duration::from_secs(30)).await;
    eprintln!(
        "revoke with {MESSAGES} parked messages: B assigned after {took:.1?} (drain timeout {DRAIN:?})"
    );
    assert!(
        took < DRAIN / 2,
        "the rebalance waited {took:?}, as if for the parked (released) messages"
    );
    // The released messages were not committed: B redoes them.
    let released = released_count.load(std::sync::atomic::Ordering::SeqCst);
    assert!(released > 0, "the hook released the revoked partitions' messages");
    wait_count("B got", released, Duration::from_secs(30), || {
        b_seen.lock().unwrap().len()
    })
    .await;
    a.stop().await;
    b.stop().await;
    assert!(
        a_metrics.abandoned_count() >= 1,
        "released messages count as abandoned"
    );
}

/// A stage that fails while a revoke's drain waits for its in-flight work
/// ends the drain at once instead of at its timeout: the drain holds the
/// consume loop's thread, which is what would otherwise stop on the
/// failure. The revoked partitions' held messages are cancelled then
/// (abandoned, left to the newcomer), and the failed member stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stage_that_fails_during_a_revoke_drain_ends_the_drain_at_once() {
    const DRAIN: Duration = Duration::from_secs(40);
    let (_broker, config, topic, group) = setup().await;
    // A's handlers hold their messages until the test lets them go.
    let gate = tokio_util::sync::CancellationToken::new();
    let a_metrics = Arc::new(StageMetrics::unregistered());
    let a_loop = stage_loop(&config, &group, &topic, a_metrics.clone(), DRAIN);
    let lifecycle = a_loop.lifecycle().clone();
    let held = gate.clone();
    let a = common::spawn_stage(move |stop| {
        a_loop.run(
            |_: &[u8], _: &RecordMeta| Ok(()),
            move |work: Work<()>| {
                let held = held.clone();
                async move {
                    held.cancelled().await;
                    work.message.ack();
                }
            },
            stop,
        )
    });
    wait_count("A took", MESSAGES, Duration::from_secs(60), || {
        a_metrics.in_flight()
    })
    .await;
    let (b, b_metrics, _) = start_acking(&config, &group, &topic, DRAIN);
    // A's drain has begun: it waits for the held messages of what it gives up.
    wait_count("A's revokes", 1, Duration::from_secs(60), || {
        a_metrics.rebalance_count("revoke") as usize
    })
    .await;
    assert_eq!(a_metrics.abandoned_count(), 0);
    let failed = Instant::now();
    lifecycle.fail("the test fails the stage during its drain");
    while a_metrics.abandoned_count() == 0 {
        assert!(
            failed.elapsed() < DRAIN / 4,
            "A's drain still waited {:?} after the failure (drain timeout {DRAIN:?})",
            failed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "A's drain ended {:.1?} after the failure, {} messages abandoned",
        failed.elapsed(),
        a_metrics.abandoned_count()
    );
    gate.cancel();
    let summary = a.stop().await;
    assert!(summary.failure.is_some(), "A ends with its failure");
    // What A gave up goes to B.
    wait_assigned(&b_metrics, |n| n > 0, DRAIN).await;
    b.stop().await;
}

/// Acknowledges every message and counts it in `acked`. Pipelined
/// (`Stage::PIPELINED`, as stage 2's) when `PIPELINED`: the loop takes the
/// messages ready together before it hands them on (one-byte ones, with
/// none on their way, itself). Else the messages fetched together run in
/// one task (`Stage::TASK_PER_BATCH`, as stage 1's).
struct Acks<const PIPELINED: bool> {
    acked: Arc<AtomicUsize>,
}

impl<const P: bool> Stage for Acks<P> {
    type Input = ();
    const PIPELINED: bool = P;
    const TASK_PER_BATCH: bool = !P;

    fn decode(&self, _: &bytes::Bytes, _: &RecordMeta) -> Result<(), Rejected> {
        Ok(())
    }

    fn handle(self: &Arc<Self>, work: Work<()>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let acked = self.acked.clone();
        async move {
            work.message.ack();
            acked.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What [`revoked_amid_a_backlog`] saw.
struct AmidABacklog {
    /// How long the newcomer waited for its partitions.
    took: Duration,
    /// Messages the first member abandoned (left to their partitions' next
    /// owner).
    abandoned: u64,
}

/// A member running the stage `make` builds (given the count its handler
/// adds to) is revoked while it works through a backlog of 200,000 one-byte
/// messages, so the revoke comes inside one of the polls that take the
/// messages fetched already: a second member joins. Waits until the
/// newcomer is assigned (at most half the drain timeout), checks that the
/// backlog was not done by then (else the revoke came after it, and the
/// run would show nothing), and waits until the group committed past a
/// marker at the end of every partition: every message was finished by
/// its partition's owner, a redone one included.
async fn revoked_amid_a_backlog<S: Stage>(
    make: impl Fn(Arc<AtomicUsize>) -> S,
    kafka: &[(&str, &str)],
) -> AmidABacklog {
    const BACKLOG: usize = 200_000;
    const DRAIN: Duration = Duration::from_secs(60);
    let (_broker, mut config, topic, group) = setup().await;
    for &(name, value) in kafka {
        config.kafka.insert(name, value);
    }
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    for chunk in 0..BACKLOG / 10_000 {
        let sent: Vec<_> = (0..10_000)
            .map(|i| {
                let key = format!("b{chunk}-{i}");
                producer
                    .send_result(
                        rdkafka::producer::FutureRecord::<str, str>::to(&topic)
                            .key(&key)
                            .payload("x"),
                    )
                    .map_err(|(e, _)| e)
                    .unwrap()
            })
            .collect();
        for delivery in futures::future::join_all(sent).await {
            delivery.unwrap().map_err(|(e, _)| e).unwrap();
        }
    }
    let total = BACKLOG + MESSAGES;
    let acked = Arc::new(AtomicUsize::new(0));
    let start = |metrics: Arc<StageMetrics>| {
        let stage = Arc::new(make(acked.clone()));
        let stage_loop = stage_loop(&config, &group, &topic, metrics, DRAIN);
        common::spawn_stage(move |stop| stage_loop.run_stage(stage, stop))
    };
    let a_metrics = Arc::new(StageMetrics::unregistered());
    let a = start(a_metrics.clone());
    wait_assigned(
        &a_metrics,
        |n| n == i64::from(PARTITIONS),
        Duration::from_secs(60),
    )
    .await;
    let b_metrics = Arc::new(StageMetrics::unregistered());
    let b = start(b_metrics.clone());
    let took = wait_assigned(&b_metrics, |n| n > 0, DRAIN / 2).await;
    let by_then = acked.load(Ordering::Relaxed);
    mark_and_wait_committed(&config, &group, &topic, Duration::from_secs(120), || {
        format!("{} acknowledged", acked.load(Ordering::Relaxed))
    })
    .await;
    a.stop().await;
    b.stop().await;
    eprintln!("B assigned after {took:.1?}, {by_then} of {total} acknowledged by then");
    assert!(
        by_then < total,
        "the backlog was done before the revoke: this run did not revoke amid it"
    );
    // At least one acknowledgement a message (a redone one has two; the
    // markers count too): the commits past the markers say none was skipped.
    assert!(acked.load(Ordering::Relaxed) >= total);
    AmidABacklog {
        took,
        abandoned: a_metrics.abandoned_count(),
    }
}

/// Eager rebalancing: a revoke takes every partition, so whatever the loop
/// is taking when it comes is of a revoked one.
const EAGER: [(&str, &str); 1] = [("partition.assignment.strategy", "range")];

/// A stage that takes its messages in batches is revoked while it works
/// through a backlog: every message begun by then is already running, so
/// the drain ends at once. The newcomer is assigned long before the drain
/// timeout, and nothing is abandoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoke_while_a_batch_is_taken_drains_without_waiting_out_the_timeout() {
    let seen = revoked_amid_a_backlog(|acked| Acks::<false> { acked }, &EAGER).await;
    assert_eq!(
        seen.abandoned, 0,
        "no message of a batch was cut off by the drain"
    );
}

/// A pipelined stage is revoked while it works through a backlog, so the
/// revoke comes while the loop takes the messages ready together, before it
/// hands them on. Those of the revoked partitions are abandoned, as any
/// still in the pipeline are (their next owner redoes them), instead of
/// holding the drain, which runs on the loop's own thread, until its
/// timeout: the newcomer is assigned long before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoke_while_a_pipelined_batch_is_taken_drains_without_waiting_out_the_timeout() {
    let seen = revoked_amid_a_backlog(|acked| Acks::<true> { acked }, &EAGER).await;
    eprintln!("A abandoned {} messages to the newcomer", seen.abandoned);
    assert!(
        seen.took < Duration::from_secs(20),
        "B assigned after {:?}",
        seen.took
    );
}
