//! Every kind of malformed input lands in the dead-letter topic with its
//! reason, while the consumer goes on with the valid messages around it and
//! commits past the bad ones (redelivering them would fail the same way).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hintstream::kafka::{create_producer, DlqHeaders, RecordMeta, RunOptions, StageLoop, Work};
use hintstream::messages::{decode, FailedTrajectory};
use hintstream::metrics::StageMetrics;
use rdkafka::producer::{FutureRecord, Producer};

fn valid(n: usize) -> serde_json::Value {
    serde_json::json!({
        "schema_version": 1, "run_id": "run", "step": 1, "instance_id": format!("inst-{n}"),
        "trajectory_id": format!("traj-{n}"), "task_prompt": "p", "chat_history": [], "reward": 0.0
    })
}

fn with(field: &str, value: serde_json::Value) -> Vec<u8> {
    let mut v = valid(0);
    v[field] = value;
    serde_json::to_vec(&v).unwrap()
}

/// (expected kind, payload) for each malformed kind.
fn malformed() -> Vec<(&'static str, Vec<u8>)> {
    let mut missing = valid(0);
    missing.as_object_mut().unwrap().remove("reward");
    vec![
        ("not_utf8", b"{\"run_id\": \"\xc3\x28\"}".to_vec()),
        ("not_json", b"{\"run_id\": \"r\", ".to_vec()),
        ("not_object", b"\"just a string\"".to_vec()),
        ("empty", Vec::new()),
        ("missing_field", serde_json::to_vec(&missing).unwrap()),
        (
            "wrong_type",
            with("chat_history", serde_json::json!({"role": "user"})),
        ),
        (
            "non_finite",
            serde_json::to_string(&valid(0))
                .unwrap()
                .replace("\"reward\":0.0", "\"reward\":Infinity")
                .into_bytes(),
        ),
        ("invalid_value", with("instance_id", serde_json::json!(""))),
        ("invalid_value", with("step", serde_json::json!(-4))),
        (
            "too_deep",
            format!("{{\"x\": {}{}}}", "[".repeat(500), "]".repeat(500)).into_bytes(),
        ),
        (
            "too_large",
            with("task_prompt", serde_json::json!("x".repeat(70_000))),
        ),
        ("schema_version", with("schema_version", serde_json::json!(3))),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routes_each_malformed_kind_to_the_dlq_and_keeps_going() {
    let broker = common::start_tansu();
    let mut config = common::config_for(&broker.bootstrap);
    config.limits.max_message_bytes = 64 * 1024;
    let topic = common::unique("dlq-in");
    let dlq_topic = format!("{topic}.dlq");
    common::create_topics(&config, &[&topic, &dlq_topic], 1).await;

    // valid, bad, valid, bad, ..., valid: one partition keeps the order.
    let bad = malformed();
    let producer = create_producer(&config).unwrap();
    let mut expected_valid = Vec::new();
    for (i, (_, payload)) in bad.iter().enumerate() {
        let good = serde_json::to_vec(&valid(i)).unwrap();
        expected_valid.push(format!("traj-{i}"));
        for bytes in [&good, payload] {
            producer
                .send(
                    FutureRecord::to(&topic).key("k").payload(bytes.as_slice()),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
    let last = serde_json::to_vec(&valid(99)).unwrap();
    producer
        .send(
            FutureRecord::to(&topic).key("k").payload(&last),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    expected_valid.push("traj-99".into());
    producer.flush(Duration::from_secs(10)).unwrap();

    let group = common::unique("dlq-group");
    let metrics = Arc::new(StageMetrics::unregistered());
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let limits = config.decode_limits();
    let handler_seen = seen.clone();
    let stage_loop = StageLoop::create(
        &config,
        &group,
        &topic,
        &dlq_topic,
        metrics.clone(),
        RunOptions {
            max_in_flight: 1,
            max_in_flight_bytes: None,
            drain_timeout: Duration::from_secs(5),
        },
    )
    .unwrap();
    let stage = tokio::spawn(stage_loop.run(
        move |bytes: &[u8], _: &RecordMeta| Ok(decode::<FailedTrajectory>(bytes, limits)?),
        move |work: Work<FailedTrajectory>| {
            let seen = handler_seen.clone();
            async move {
                seen.lock().unwrap().push(work.input.trajectory_id.clone());
                work.message.ack();
            }
        },
        async {
            let _ = stop_rx.await;
        },
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.lock().unwrap().len() < expected_valid.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "valid messages not all processed: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_tx.send(()).unwrap();
    let summary = stage.await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        expected_valid,
        "valid messages processed in order around the bad ones"
    );
    assert_eq!(summary.rejected as usize, bad.len());
    assert_eq!(metrics.dead_letter_count("invalid_value"), 2);
    for (kind, _) in &bad {
        assert!(metrics.dead_letter_count(kind) >= 1, "{kind} counted by kind");
    }

    let letters = common::read_topic(&config, &dlq_topic).await;
    assert_eq!(letters.len(), bad.len());
    for ((kind, payload), letter) in bad.iter().zip(&letters) {
        let header = |name: &str| {
            letter
                .headers
                .iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value.bytes.clone())
                .map(|b| String::from_utf8(b).unwrap())
                .unwrap_or_else(|| panic!("dead letter for {kind} lacks header {name}"))
        };
        assert_eq!(header(DlqHeaders::ERROR_KIND), *kind);
        assert!(!header(DlqHeaders::REASON).is_empty());
        assert_eq!(header(DlqHeaders::SOURCE_TOPIC), topic);
        assert_eq!(header(DlqHeaders::SOURCE_PARTITION), "0");
        let offset: i64 = header(DlqHeaders::SOURCE_OFFSET).parse().unwrap();
        assert_eq!(offset % 2, 1, "bad messages sit at odd offsets");
        assert_eq!(
            letter.value_bytes().unwrap_or_default(),
            payload.as_slice(),
            "original bytes kept for {kind}"
        );
        assert_eq!(letter.key_bytes(), Some(&b"k"[..]), "original key kept");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_keeps_every_input_the_stage_accepts_whole() {
    let broker = common::start_tansu();
    let mut config = common::config_for(&broker.bootstrap);
    // 2 MiB accepted: twice the broker's default and the old 900 KB cut.
    config.limits.max_message_bytes = 2 * 1024 * 1024;
    let topic = common::unique("dlq-whole-in");
    let dlq_topic = format!("{topic}.dlq");
    config.hints.dlq_topic = dlq_topic.clone();
    let outcomes = hintstream::kafka::admin::create_topics_with(
        &config,
        &[(topic.clone(), vec![("max.message.bytes", "4000000")])],
        1,
    )
    .await
    .unwrap();
    assert!(
        outcomes
            .iter()
            .all(|(_, o)| *o == hintstream::kafka::admin::TopicOutcome::Created),
        "{outcomes:?}"
    );
    // `topics create`'s path: the DLQ takes the limit plus 64 KiB.
    common::create_topics(&config, &[&dlq_topic], 1).await;

    // Just under the limit, and dead-lettered (an unknown schema_version).
    let mut payload = with("schema_version", serde_json::json!(3));
    let room = config.limits.max_message_bytes - payload.len() - 16;
    payload = with("schema_version", serde_json::json!(3))
        .into_iter()
        .take(payload.len() - 1)
        .chain(format!(",\"pad\":\"{}\"}}", "p".repeat(room)).into_bytes())
        .collect();
    assert!(payload.len() <= config.limits.max_message_bytes && payload.len() > 2_000_000);
    let key = "k".repeat(1000);
    common::send(&common::large_message_producer(&config), &topic, &key, &payload).await;

    let metrics = Arc::new(StageMetrics::unregistered());
    let limits = config.decode_limits();
    let stage_loop = StageLoop::create(
        &config,
        &common::unique("dlq-whole-group"),
        &topic,
        &dlq_topic,
        metrics.clone(),
        RunOptions {
            max_in_flight: 1,
            max_in_flight_bytes: None,
            drain_timeout: Duration::from_secs(5),
        },
    )
    .unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stage = tokio::spawn(stage_loop.run(
        move |bytes: &[u8], _: &RecordMeta| Ok(decode::<FailedTrajectory>(bytes, limits)?),
        |work: Work<FailedTrajectory>| async move { work.message.ack() },
        async {
            let _ = stop_rx.await;
        },
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while metrics.dead_letter_count("schema_version") < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the input was not dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_tx.send(()).unwrap();
    stage.await.unwrap();

    let letters = common::read_topic(&config, &dlq_topic).await;
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert!(
        letter
            .headers
            .iter()
            .all(|h| h.key != DlqHeaders::TRUNCATED_FROM && h.key != DlqHeaders::KEY_TRUNCATED_FROM),
        "nothing was cut"
    );
    assert_eq!(letter.key_bytes(), Some(key.as_bytes()));
    assert_eq!(letter.value_bytes().unwrap().len(), payload.len());
    assert!(
        letter.value_bytes().unwrap() == payload.as_slice(),
        "the dead letter's bytes differ from the input's"
    );
}
