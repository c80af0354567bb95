//! Records produced together (`kafka::produce::send_all`, a step's hint
//! outcomes): every one acknowledged, in order, with its headers and a
//! `traceparent`; one the producer refuses for good comes back as `send`
//! would return it while the others go; those a full queue refuses go once
//! there is room; those whose delivery failed while the broker was away
//! (`message.timeout.ms` passed) are produced again, with their headers,
//! once it is back (`produce::delivered`'s retries, which the settler's
//! hints go through too); with the broker gone, the drain deadline ends the
//! wait for all of them; and once it passed, none is queued.

use crate::common;

use std::time::{Duration, Instant};

use hintstream::config::Config;
use hintstream::health::Lifecycle;
use hintstream::kafka::produce::send_all;
use hintstream::kafka::{create_producer, Outgoing, SendError};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaErrorCode;

/// A topic of one partition named `prefix-<random>` on the shared broker,
/// its configuration with `producer` settings added, and a producer of it.
async fn on_a_new_topic(prefix: &str, producer: &[(&str, i64)]) -> (Config, String, FutureProducer) {
    on_a_new_topic_at(&common::shared_kafka().bootstrap, prefix, producer).await
}

/// [`on_a_new_topic`] on the broker at `bootstrap`.
async fn on_a_new_topic_at(
    bootstrap: &str,
    prefix: &str,
    producer: &[(&str, i64)],
) -> (Config, String, FutureProducer) {
    let mut config = common::config_for(bootstrap);
    let topic = common::unique(prefix);
    common::create_topics(&config, &[&topic], 1).await;
    for (name, value) in producer {
        config.kafka.producer.insert((*name).into(), (*value).into());
    }
    let made = create_producer(&config).unwrap();
    (config, topic, made)
}

/// `n` records for `topic`, keyed `k<i>`, of payload `v<i>` (`big`: the
/// one whose payload is `big.1` bytes instead).
fn payloads(n: usize, big: Option<(usize, usize)>) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let payload = match big {
                Some((at, bytes)) if at == i => vec![b'x'; bytes],
                _ => format!("v{i}").into_bytes(),
            };
            (format!("k{i}"), payload)
        })
        .collect()
}

fn outgoing<'a>(topic: &'a str, records: &'a [(String, Vec<u8>)]) -> Vec<Outgoing<'a>> {
    records
        .iter()
        .map(|(key, payload)| Outgoing::json(topic, key.as_bytes(), payload))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_is_acknowledged_in_order_with_its_headers() {
    let (config, topic, producer) = on_a_new_topic("send-all", &[]).await;
    let records = payloads(300, None);

    let sent = send_all(&producer, outgoing(&topic, &records), &Lifecycle::new()).await;

    let offsets: Vec<i64> = sent
        .iter()
        .map(|r| match r {
            Ok((0, offset)) => *offset,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(offsets, (0..300).collect::<Vec<i64>>(), "in order, each once");
    let read = common::wait_for_messages(&config, &topic, 300).await;
    for (message, (key, payload)) in read.iter().zip(&records) {
        assert_eq!(message.key.bytes.as_deref(), Some(key.as_bytes()));
        assert_eq!(message.value.bytes.as_deref(), Some(payload.as_slice()));
        let names: Vec<&str> = message.headers.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(
            names,
            ["content-type", "traceparent"],
            "offset {}",
            message.offset
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_refused_for_good_comes_back_and_the_others_go() {
    // librdkafka refuses a record over message.max.bytes as it is queued.
    let (config, topic, producer) = on_a_new_topic("send-all-big", &[("message.max.bytes", 10_000)]).await;
    let records = payloads(20, Some((7, 50_000)));

    let sent = send_all(&producer, outgoing(&topic, &records), &Lifecycle::new()).await;

    for (i, result) in sent.iter().enumerate() {
        match (i, result) {
            (7, Err(SendError::Permanent(KafkaError::MessageProduction(code)))) => {
                assert_eq!(*code, RDKafkaErrorCode::MessageSizeTooLarge)
            }
            (7, other) => panic!("the big record: {other:?}"),
            (_, Ok(_)) => {}
            (i, other) => panic!("record {i}: {other:?}"),
        }
    }
    assert_eq!(common::wait_for_messages(&config, &topic, 19).await.len(), 19);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_broker_gone_the_drain_deadline_ends_the_wait() {
    let port = common::free_port();
    let mut config = common::config_for(&format!("127.0.0.1:{port}"));
    // Longer than the test: the wait must end at the deadline, not here.
    config
        .kafka
        .producer
        .insert("message.timeout.ms".into(), 120_000i64.into());
    let producer = create_producer(&config).unwrap();
    let records = payloads(5, None);
    let lifecycle = Lifecycle::new();
    let started = Instant::now();
    lifecycle.begin_shutdown(Duration::from_millis(500));

    let sent = send_all(&producer, outgoing("nowhere", &records), &lifecycle).await;

    assert!(
        sent.iter().all(|r| matches!(r, Err(SendError::Stopped))),
        "{sent:?}"
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "the deadline ended it: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_full_queue_refuses_go_once_there_is_room() {
    let (config, topic, producer) =
        on_a_new_topic("send-all-full", &[("queue.buffering.max.messages", 5)]).await;
    let records = payloads(60, None);

    let sent = send_all(&producer, outgoing(&topic, &records), &Lifecycle::new()).await;

    assert!(sent.iter().all(Result::is_ok), "{sent:?}");
    let read = common::wait_for_messages(&config, &topic, 60).await;
    let mut payloads: Vec<&[u8]> = read.iter().filter_map(|m| m.value.bytes.as_deref()).collect();
    payloads.sort();
    let mut expected: Vec<&[u8]> = records.iter().map(|(_, p)| p.as_slice()).collect();
    expected.sort();
    assert_eq!(payloads, expected, "each once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_drain_deadline_passed_none_is_queued() {
    use rdkafka::producer::Producer;

    let (_, topic, producer) = on_a_new_topic("send-all-late", &[]).await;
    let lifecycle = Lifecycle::new();
    lifecycle.begin_shutdown(Duration::ZERO);

    let sent = send_all(&producer, outgoing(&topic, &payloads(5, None)), &lifecycle).await;

    assert!(
        sent.iter().all(|r| matches!(r, Err(SendError::Stopped))),
        "{sent:?}"
    );
    producer.flush(Duration::from_secs(10)).unwrap();
    let (_, high) = producer
        .client()
        .fetch_watermarks(&topic, 0, Duration::from_secs(10))
        .unwrap();
    assert_eq!(high, 0, "nothing was produced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_failed_while_the_broker_was_away_is_produced_again_with_its_headers() {
    use rdkafka::producer::FutureRecord;

    let mut broker = common::own_kafka();
    let producer_settings = [
        // A queued record's delivery fails once it has waited this long for
        // the broker.
        ("message.timeout.ms", 2_000i64),
        // Back at the broker soon after its restart, not after librdkafka's
        // longest backoff (10 s).
        ("reconnect.backoff.max.ms", 1_000),
    ];
    let (config, topic, producer) =
        on_a_new_topic_at(&broker.bootstrap, "send-all-retried", &producer_settings).await;
    // Connected, the topic's leader known: what the records find queued
    // after the broker died is a broker away, not a topic unknown.
    let first = vec![("warm".to_string(), b"warm".to_vec())];
    let warm = send_all(&producer, outgoing(&topic, &first), &Lifecycle::new()).await;
    assert!(warm.iter().all(Result::is_ok), "{warm:?}");
    broker.kill9();

    let records = payloads(3, None);
    let lifecycle = Lifecycle::new();
    let mut sending = Box::pin(send_all(&producer, outgoing(&topic, &records), &lifecycle));
    // `send_all` queues every record before it first waits.
    assert!(futures::poll!(&mut sending).is_pending());
    // A record queued after them on the same partition: its delivery fails
    // after theirs, whose reports come first. None of them reached a broker.
    let probe = producer
        .send_result(FutureRecord::<[u8], [u8]>::to(&topic).payload(b"probe"))
        .map_err(|(e, _)| e)
        .unwrap();
    match probe.await.unwrap() {
        Err((KafkaError::MessageProduction(code), _)) => {
            assert_eq!(
                code,
                RDKafkaErrorCode::MessageTimedOut,
                "the probe's delivery failed"
            )
        }
        other => panic!("the probe with the broker away: {other:?}"),
    }
    broker.start_again();

    let sent = tokio::time::timeout(Duration::from_secs(90), sending)
        .await
        .expect("acknowledged once the broker was back");
    assert!(sent.iter().all(Result::is_ok), "{sent:?}");
    let read = common::wait_for_messages(&config, &topic, 4).await;
    type Seen<'m> = (&'m [u8], &'m [u8], Vec<&'m str>, Option<&'m str>);
    let mut got: Vec<Seen<'_>> = read
        .iter()
        .map(|m| {
            let names = m.headers.iter().map(|h| h.key.as_str()).collect();
            let key = m.key.bytes.as_deref().unwrap_or_default();
            let value = m.value.bytes.as_deref().unwrap_or_default();
            (key, value, names, common::header(m, "content-type"))
        })
        .collect();
    got.sort();
    let mut expected: Vec<Seen<'_>> = first
        .iter()
        .chain(&records)
        .map(|(k, p)| {
            let names = vec!["content-type", "traceparent"];
            (k.as_bytes(), p.as_slice(), names, Some("application/json"))
        })
        .collect();
    expected.sort();
    assert_eq!(
        got, expected,
        "each once, with its key and headers, and not the probe"
    );
}
