//! record → replay → record keeps keys, values (binary too) and headers, and
//! the order of each key's messages.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use hintstream::kafka::create_producer;
use hintstream::tools::record::{record, RecordOptions};
use hintstream::tools::replay::{read_recorded, replay, ReplayOptions};
use hintstream::tools::RecordedMessage;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};

type Seen = BTreeMap<Vec<u8>, Vec<(Option<Vec<u8>>, Vec<(String, Option<Vec<u8>>)>)>>;

/// Each key's (value, headers) in order.
fn by_key(messages: &[RecordedMessage]) -> Seen {
    let mut map = Seen::new();
    for m in messages {
        let headers = m
            .headers
            .iter()
            .map(|h| (h.key.clone(), h.value.bytes.clone()))
            .collect();
        map.entry(m.key_bytes().unwrap_or_default().to_vec())
            .or_default()
            .push((m.value_bytes().map(<[u8]>::to_vec), headers));
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_replay_record_is_identical() {
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let (a, b) = (common::unique("rec-a"), common::unique("rec-b"));
    common::create_topics(&config, &[&a, &b], 3).await;

    let producer = create_producer(&config).unwrap();
    for i in 0..300u32 {
        let key = format!("run/{}", i % 7);
        let mut value = format!("{{\"n\": {i}}}").into_bytes();
        if i % 10 == 0 {
            value = vec![0xff, 0xfe, (i % 256) as u8, 0x00]; // not UTF-8, like Arrow IPC
        }
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "content-type",
                value: Some("application/json"),
            })
            .insert(Header {
                key: "binary",
                value: Some(&[0x80u8, i as u8][..]),
            });
        producer
            .send(
                FutureRecord::to(&a).key(&key).payload(&value).headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    let rec = |topic: &str| RecordOptions {
        topic: topic.into(),
        max_messages: None,
        idle_timeout: Duration::from_secs(20),
        progress: false,
    };
    assert_eq!(record(&config, &rec(&a), &first).await.unwrap(), 300);
    let options = ReplayOptions {
        topic: Some(b.clone()),
        ..ReplayOptions::default()
    };
    assert_eq!(replay(&producer, &first, &options).await.unwrap(), 300);
    assert_eq!(record(&config, &rec(&b), &second).await.unwrap(), 300);

    let before = read_recorded(&first).unwrap();
    let after = read_recorded(&second).unwrap();
    assert_eq!(by_key(&before), by_key(&after));
    assert!(after.iter().all(|m| m.topic == b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_at_a_speed_keeps_the_recorded_pace() {
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let topic = common::unique("paced");
    common::create_topics(&config, &[&topic], 1).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("paced.jsonl");
    // Recorded 400 ms apart; at --speed 2 they go 200 ms apart.
    let lines: Vec<String> = (0..5i64)
        .map(|i| {
            RecordedMessage {
                topic: topic.clone(),
                partition: 0,
                offset: i,
                timestamp: Some(1_700_000_000_000 + i * 400),
                key: hintstream::tools::recorded::Bytes::new(Some(b"k".to_vec())),
                value: hintstream::tools::recorded::Bytes::new(Some(format!("{{\"n\": {i}}}").into_bytes())),
                headers: vec![],
            }
            .to_line()
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let producer = create_producer(&config).unwrap();
    let options = ReplayOptions {
        speed: Some(2.0),
        ..ReplayOptions::default()
    };
    let started = std::time::Instant::now();
    assert_eq!(replay(&producer, &file, &options).await.unwrap(), 5);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "1.6 s of recorded time at speed 2 took {took:?}"
    );
    let seen = common::read_topic(&config, &topic).await;
    let stamps: Vec<i64> = seen.iter().filter_map(|m| m.timestamp).collect();
    assert_eq!(stamps.len(), 5);
    assert!(
        stamps[4] - stamps[0] >= 790,
        "sent over {} ms",
        stamps[4] - stamps[0]
    );
}
