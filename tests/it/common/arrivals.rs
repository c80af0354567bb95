//! A reader of output topics that records when each record arrived, for
//! tests that measure progress, stalls and duplicates while brokers or
//! workers come and go (failover, group protocols).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hintstream::config::Config;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

/// When each output record arrived at the test's reader, by topic.
#[derive(Default)]
pub struct Arrivals {
    pub by_topic: HashMap<String, Vec<(String, Instant)>>,
}

impl Arrivals {
    pub fn count(&self, topic: &str) -> usize {
        self.by_topic.get(topic).map_or(0, Vec::len)
    }

    pub fn distinct(&self, topic: &str) -> usize {
        let keys: HashSet<&str> = self
            .by_topic
            .get(topic)
            .into_iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        keys.len()
    }

    /// The longest time between two arrivals on `topic` within `window`.
    pub fn longest_stall(&self, topic: &str, window: (Instant, Instant)) -> Duration {
        let mut times: Vec<Instant> = self
            .by_topic
            .get(topic)
            .into_iter()
            .flatten()
            .map(|(_, t)| *t)
            .filter(|t| *t >= window.0 && *t <= window.1)
            .collect();
        times.sort();
        times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }
}

/// A reader of output topics (see [`read_outputs`]).
pub struct OutputReader {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl OutputReader {
    /// Stops reading and waits until the reader is gone.
    pub async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for OutputReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads `topics` from the start, recording each arrival, until stopped.
/// By assignment (a group of its own that it never joins, and commits
/// nothing), so closing it has no group to leave: a test whose brokers are
/// gone (killed, or dropped while it unwinds) does not wait on it.
pub fn read_outputs(config: &Config, topics: &[String], arrivals: Arc<Mutex<Arrivals>>) -> OutputReader {
    let mut client = hintstream::kafka::base_config(config);
    client
        .set("group.id", super::unique("output-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    let consumer: StreamConsumer = client.create().unwrap();
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("metadata of {topic}: {e}"));
        for t in metadata.topics().iter().filter(|t| t.name() == topic.as_str()) {
            for p in t.partitions() {
                assignment
                    .add_partition_offset(topic, p.id(), Offset::Beginning)
                    .unwrap();
            }
        }
    }
    assert!(assignment.count() > 0, "{topics:?} have no partitions");
    consumer.assign(&assignment).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        while !stopped.load(Ordering::Relaxed) {
            let Ok(Ok(message)) = tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await
            else {
                continue;
            };
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            arrivals
                .lock()
                .unwrap()
                .by_topic
                .entry(message.topic().to_string())
                .or_default()
                .push((key, Instant::now()));
        }
    });
    OutputReader {
        stop,
        task: Some(task),
    }
}

/// Waits until `topic` has `more` arrivals past `from`, failing after
/// `within` with `after` in the message.
pub async fn wait_progress(
    arrivals: &Mutex<Arrivals>,
    topic: &str,
    from: usize,
    more: usize,
    within: Duration,
    after: &str,
) {
    let deadline = Instant::now() + within;
    loop {
        let now = arrivals.lock().unwrap().count(topic);
        if now >= from + more {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: no progress after {after} ({now} records, waiting for {})",
            from + more
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `topic` has `n` distinct keys; the time it took from `since`.
pub async fn wait_distinct(arrivals: &Mutex<Arrivals>, topic: &str, n: usize, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let got = arrivals.lock().unwrap().distinct(topic);
        if got >= n {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: {got} of {n} keys after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
