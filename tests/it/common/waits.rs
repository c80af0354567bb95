//! Waits on what a count depends on: a consumer group's committed offsets
//! reaching the end of its input, so a test counts outputs once nothing more
//! can come, instead of sleeping first; and a count (a metric, what a stage
//! recorded) reaching a number.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hintstream::config::Config;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// Waits, at most `within`, until `count()` reaches `n`; fails naming
/// `what` and how far it got.
pub async fn wait_count(what: &str, n: usize, within: Duration, count: impl Fn() -> usize) {
    let deadline = Instant::now() + within;
    while count() < n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {n} after {within:?}",
            count()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The end offsets (high watermarks) of `topic`'s partitions `0..partitions`.
pub async fn end_offsets(config: &Config, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let client = hintstream::kafka::base_config(config);
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client.create().unwrap();
        (0..partitions)
            .map(|p| {
                let (_, high) = consumer
                    .fetch_watermarks(&topic, p, Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("end offsets of {topic}[{p}]: {e}"));
                (p, high)
            })
            .collect()
    })
    .await
    .unwrap()
}

/// Waits, at most `within`, until `group` committed every message `topic`
/// holds now (its committed offset is the end offset on each partition that
/// has messages): a stage commits a message only once its output (or dead
/// letter) was acknowledged, so every output of that input is on its topic
/// then. Fails with `context()` on timeout.
pub async fn wait_committed_to_end(
    config: &Config,
    group: &str,
    topic: &str,
    partitions: i32,
    within: Duration,
    context: impl Fn() -> String,
) {
    let end: BTreeMap<i32, i64> = end_offsets(config, topic, partitions)
        .await
        .into_iter()
        .filter(|(_, offset)| *offset > 0)
        .collect();
    let deadline = Instant::now() + within;
    loop {
        let committed = super::committed_offsets(config, group, topic, partitions).await;
        if end.iter().all(|(p, o)| committed.get(p).is_some_and(|c| c >= o)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} committed {committed:?} of {topic}, whose end is {end:?}, after {within:?}\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
