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

/// Reads both outputs from the start, recording each arrival, until the
/// returned flag is set.
pub fn read_outputs(config: &Config, topics: &[String], arrivals: Arc<Mutex<Arrivals>>) -> Arc<AtomicBool> {
    let mut client = hintstream::kafka::base_config(config);
    client
        .set("group.id", super::unique("failover-reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed");
    let consumer: StreamConsumer = client.create().unwrap();
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&names).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
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
    done
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
