//! A whole topic read by assignment: every record of every partition reaches
//! the callback, and the read barrier (`sync`) returns only once the reader
//! has read up to the end offsets measured when it was called, on an empty
//! topic too. A reader started at a time reads only what was written since,
//! and its barrier counts a partition with nothing since as read.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hintstream::kafka::{create_producer, TailError, TopicTail};

/// A tail of `topic` that counts the records it was handed.
async fn counting_tail(config: &hintstream::config::Config, topic: &str) -> (TopicTail, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    let tail = TopicTail::start(config, topic, move |_, _| {
        counter.fetch_add(1, Ordering::SeqCst);
    })
    .await
    .unwrap();
    (tail, count)
}

/// Three barriers of `tail` in turn, each within 5 s (`what`: the case,
/// for the failure's message).
async fn three_barriers_pass_at_once(tail: &TopicTail, what: &str) {
    for barrier in 1..=3 {
        if let Err(e) = tail.sync(Duration::from_secs(5)).await {
            panic!("barrier {barrier} {what}: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_barrier_passes_only_once_every_record_so_far_was_read() {
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let (topic, empty) = (common::unique("tail"), common::unique("tail-empty"));
    common::create_topics(&config, &[&topic, &empty], 3).await;
    let producer = create_producer(&config).unwrap();
    for i in 0..300 {
        common::send(&producer, &topic, &format!("k{i}"), format!("v{i}").as_bytes()).await;
    }

    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let tail = {
        let seen = seen.clone();
        TopicTail::start(&config, &topic, move |_, payload| {
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(payload.unwrap_or_default()).into_owned());
        })
        .await
        .unwrap()
    };
    tail.sync(Duration::from_secs(30)).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 300, "every record before the barrier");

    for i in 300..350 {
        common::send(&producer, &topic, &format!("k{i}"), format!("v{i}").as_bytes()).await;
    }
    tail.sync(Duration::from_secs(30)).await.unwrap();
    let mut got = seen.lock().unwrap().clone();
    got.sort();
    let mut want: Vec<String> = (0..350).map(|i| format!("v{i}")).collect();
    want.sort();
    assert_eq!(got, want, "each record once, the later ones too");

    let (empty_tail, count) = counting_tail(&config, &empty).await;
    empty_tail.sync(Duration::from_secs(30)).await.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 0);

    let missing = TopicTail::start(&config, &common::unique("no-such-topic"), |_, _| {}).await;
    assert!(
        matches!(missing, Err(TailError::MissingTopic(_))),
        "{:?}",
        missing.err()
    );
}

/// The barrier asks the end offsets on a connection of its own. The
/// reader's nearly always has a fetch waiting on the broker for new records
/// (`fetch.wait.max.ms`, 30 s here), and a broker answers one connection's
/// requests in order: asked there, each barrier on a quiet topic waited
/// for that fetch to end. Three in turn each pass within 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_barrier_does_not_wait_behind_the_readers_fetch() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    config
        .kafka
        .consumer
        .insert("fetch.wait.max.ms".into(), 30_000i64.into());
    let topic = common::unique("tail-quiet");
    common::create_topics(&config, &[&topic], 1).await;
    let producer = create_producer(&config).unwrap();
    for i in 0..10 {
        common::send(&producer, &topic, &format!("k{i}"), b"v").await;
    }
    let (tail, count) = counting_tail(&config, &topic).await;
    three_barriers_pass_at_once(&tail, "on a quiet topic").await;
    assert_eq!(
        count.load(Ordering::SeqCst),
        10,
        "every record before the barriers"
    );
}

/// A record counts as read once the callback that applies it returned: a
/// barrier taken while the callback holds the last record does not pass
/// (its bound, 2 s, runs out), and passes once the callback returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_barrier_waits_for_the_callback_that_applies_the_last_record() {
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let topic = common::unique("tail-held");
    common::create_topics(&config, &[&topic], 1).await;
    let producer = create_producer(&config).unwrap();
    for i in 0..3 {
        common::send(&producer, &topic, &format!("k{i}"), format!("v{i}").as_bytes()).await;
    }
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let applied = Arc::new(AtomicUsize::new(0));
    let counter = applied.clone();
    let tail = TopicTail::start(&config, &topic, move |_, payload| {
        if payload == Some(b"v2".as_slice()) {
            // The last record: held until the test lets it go.
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        }
        counter.fetch_add(1, Ordering::SeqCst);
    })
    .await
    .unwrap();
    tokio::task::spawn_blocking(move || held_rx.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the last record reached the callback");
    let held = tail.sync(Duration::from_secs(2)).await;
    assert!(
        matches!(held, Err(TailError::Behind { .. })),
        "a barrier passed with {} of 3 records applied: {held:?}",
        applied.load(Ordering::SeqCst)
    );
    release_tx.send(()).unwrap();
    tail.sync(Duration::from_secs(30)).await.unwrap();
    assert_eq!(applied.load(Ordering::SeqCst), 3, "every record applied");
}

/// A topic written in transactions (stage 1's hints under exactly_once)
/// ends each partition with a commit marker, an offset with no record. A
/// reader that has read every record, with nothing written since, passes
/// each barrier at once: three in turn, each within 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_up_reader_passes_the_barrier_of_a_topic_written_in_transactions() {
    use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let topic = common::unique("tail-transactions");
    common::create_topics(&config, &[&topic], 2).await;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .set("transactional.id", common::unique("tail-txn"))
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    for batch in 0..2 {
        producer.begin_transaction().unwrap();
        for i in 0..10 {
            let key = format!("k{batch}-{i}");
            producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload("v"),
                    Duration::from_secs(30),
                )
                .await
                .unwrap();
        }
        producer.commit_transaction(Duration::from_secs(30)).unwrap();
    }
    let (tail, count) = counting_tail(&config, &topic).await;
    // A commit is answered before its markers are written: the last
    // transaction's records may become readable a little after it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while count.load(Ordering::SeqCst) < 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of 20 committed records read in 30 s",
            count.load(Ordering::SeqCst)
        );
        tail.sync(Duration::from_secs(30)).await.unwrap();
    }
    three_barriers_pass_at_once(&tail, "of a caught-up reader").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_started_at_a_time_reads_only_what_was_written_since() {
    use rdkafka::producer::FutureRecord;
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let topic = common::unique("tail-since");
    common::create_topics(&config, &[&topic], 3).await;
    let producer = create_producer(&config).unwrap();
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let hour_ms = 3_600_000;
    // Two hours old on every partition, then new records on one key (one
    // partition): the others have nothing since the hour.
    for (i, (key, at)) in (0..30)
        .map(|i| (format!("k{i}"), now_ms - 2 * hour_ms))
        .chain((0..5).map(|_| ("new".to_string(), now_ms)))
        .enumerate()
    {
        let payload = format!("v{i}");
        producer
            .send(
                FutureRecord::to(&topic).key(&key).payload(&payload).timestamp(at),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let tail = {
        let seen = seen.clone();
        let since = SystemTime::now() - Duration::from_secs(3600);
        TopicTail::start_since(&config, &topic, since, move |_, payload, _| {
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(payload.unwrap_or_default()).into_owned());
        })
        .await
        .unwrap()
    };
    tail.sync(Duration::from_secs(30)).await.unwrap();
    let got = seen.lock().unwrap().clone();
    let want: Vec<String> = (30..35).map(|i| format!("v{i}")).collect();
    assert_eq!(got, want, "only the records of the last hour, in order");
}
