//! Stage 2 end to end on a real broker: JSON rows and `step_end` in, one Arrow
//! IPC stream per step out (decoded and checked against hand-computed
//! advantages), the step metrics checked against hand-computed values, an
//! Arrow-encoded step, and an incomplete step dead-lettered after its timeout.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{BooleanArray, DictionaryArray, Float32Array, Int32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use hintstream::advantages::service::AdvantageStage;
use hintstream::batch::{ipc, ARROW_STREAM_CONTENT_TYPE};
use hintstream::kafka::{create_producer, DlqHeaders};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, Producer};

const EPS: f64 = 1e-6;

fn row(step: i64, instance: &str, trajectory: &str, reward: f64, hint: Option<&str>) -> serde_json::Value {
    let mut v = serde_json::json!({
        "type": "scored_rollout", "schema_version": 1, "run_id": "run-a", "step": step,
        "instance_id": instance, "trajectory_id": trajectory, "reward": reward, "is_hinted": hint.is_some(),
    });
    if let Some(h) = hint {
        v["hint_category"] = serde_json::json!(h);
    }
    v
}

/// Produces one message with optional headers and waits for its ack.
async fn send(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    payload: &[u8],
    headers: Option<OwnedHeaders>,
) {
    common::send_raw(producer, topic, key, Some(payload), headers).await;
}

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-9 * (1.0 + w.abs()),
            "row {i}: got {g}, want {w}"
        );
    }
}

/// A stage 2 config on fresh topics of `broker` (created), with a 2 s step
/// timeout. Returns it with (scored, advantages, metrics, dlq) topic names.
async fn fresh_stage(broker: &str) -> (hintstream::config::Config, [String; 4]) {
    let mut config = common::config_for(broker);
    common::own_topics(&mut config.advantages, "scored", "advantages");
    let scored = config.advantages.input_topic.clone();
    config.topics.metrics = common::unique("metrics");
    config.advantages.step_timeout_secs = 2;
    config.advantages.pass_at_k = vec![1];
    let topics = [
        scored,
        config.advantages.output_topic.clone(),
        config.topics.metrics.clone(),
        config.advantages.dlq_topic.clone(),
    ];
    common::create_topics(&config, &[&topics[0], &topics[1], &topics[2], &topics[3]], 1).await;
    (config, topics)
}

fn step_end(step: i64, count: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "run-a", "step": step, "count": count}))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drops_duplicate_rows_and_dead_letters_rows_after_step_end() {
    let broker = common::shared_kafka();
    let (config, [scored, adv_topic, metrics_topic, dlq_topic]) = fresh_stage(&broker.bootstrap).await;
    let producer = create_producer(&config).unwrap();
    let send_row = |step, t: &'static str, r| serde_json::to_vec(&row(step, "g", t, r, None)).unwrap();
    // Step 4: a duplicated row (redelivered by the trainer) among two.
    for payload in [
        send_row(4, "a", 1.0),
        send_row(4, "a", 1.0),
        send_row(4, "b", 0.0),
        step_end(4, 2),
    ] {
        send(&producer, &scored, "run-a/4", &payload, None).await;
    }
    // Step 5: complete with one row, then a late row after its step_end.
    for payload in [send_row(5, "c", 1.0), step_end(5, 1), send_row(5, "late", 0.0)] {
        send(&producer, &scored, "run-a/5", &payload, None).await;
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    let stage = AdvantageStage::build(config.clone()).await.unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let advantages = common::wait_for_messages(&config, &adv_topic, 2).await;
    let metrics = common::wait_for_messages(&config, &metrics_topic, 2).await;
    let dead = common::wait_for_messages(&config, &dlq_topic, 1).await;
    running.stop().await;

    let four = advantages
        .iter()
        .find(|m| m.key_bytes() == Some(b"run-a/4"))
        .unwrap();
    let b = &ipc::decode_stream(four.value_bytes().unwrap()).unwrap()[0];
    assert_eq!(
        common::strings(b, "trajectory_id"),
        vec!["a", "b"],
        "the duplicate row was dropped"
    );
    let m4 = metrics
        .iter()
        .find(|m| m.key_bytes() == Some(b"run-a/4"))
        .unwrap();
    let m4: serde_json::Value = serde_json::from_slice(m4.value_bytes().unwrap()).unwrap();
    assert_eq!(m4["advantage/duplicate_rows"].as_f64(), Some(1.0));
    assert!(
        advantages.iter().any(|m| m.key_bytes() == Some(b"run-a/5")),
        "step 5 published on its own"
    );
    assert_eq!(dead.len(), 1, "only the late row is dead-lettered");
    let kind = dead[0]
        .headers
        .iter()
        .find(|h| h.key == DlqHeaders::ERROR_KIND)
        .unwrap();
    // Dead-lettered at once as late (issue 21, item 7), not after step_timeout.
    assert_eq!(kind.value.bytes.as_deref(), Some(&b"step_already_published"[..]));
    assert!(String::from_utf8_lossy(dead[0].value_bytes().unwrap()).contains("\"late\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishes_advantages_and_metrics_per_step() {
    let broker = common::shared_kafka();
    let (config, [scored, adv_topic, metrics_topic, dlq_topic]) = fresh_stage(&broker.bootstrap).await;

    let producer = create_producer(&config).unwrap();
    // Step 1 (JSON): g1 raw all 0 with a hinted success and a hinted failure;
    // g2 raw [1, 0]. Any hint in the step: raw samples form the baselines.
    let step1 = [
        row(1, "g1", "t1", 0.0, None),
        row(1, "g2", "t2", 1.0, None),
        row(1, "g1", "t3", 0.0, None),
        row(1, "g2", "t4", 0.0, None),
        row(1, "g1", "t5", 0.0, None),
        row(1, "g1", "t6", 1.0, Some("llm_synthesized")),
        row(1, "g1", "t7", 0.0, Some("static_fallback")),
    ];
    for r in &step1 {
        send(
            &producer,
            &scored,
            "run-a/1",
            &serde_json::to_vec(r).unwrap(),
            None,
        )
        .await;
    }
    let end1 = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "run-a", "step": 1, "count": 7});
    send(
        &producer,
        &scored,
        "run-a/1",
        &serde_json::to_vec(&end1).unwrap(),
        None,
    )
    .await;

    // Step 2 (Arrow: dictionary ids, f32 rewards, i32 step): g3 [1, 0.5, 0].
    let schema = Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("step", DataType::Int32, false),
        Field::new(
            "instance_id",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            false,
        ),
        Field::new("trajectory_id", DataType::Utf8, false),
        Field::new("reward", DataType::Float32, false),
        Field::new("is_hinted", DataType::Boolean, false),
    ]));
    let ids: DictionaryArray<arrow_array::types::Int32Type> = vec!["g3", "g3", "g3"].into_iter().collect();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(vec!["run-a"; 3])),
            Arc::new(Int32Array::from(vec![2; 3])),
            Arc::new(ids),
            Arc::new(StringArray::from(vec!["u1", "u2", "u3"])),
            Arc::new(Float32Array::from(vec![1.0, 0.5, 0.0])),
            Arc::new(BooleanArray::from(vec![false; 3])),
        ],
    )
    .unwrap();
    let headers = OwnedHeaders::new().insert(Header {
        key: "content-type",
        value: Some(ARROW_STREAM_CONTENT_TYPE),
    });
    send(
        &producer,
        &scored,
        "run-a/2",
        &ipc::encode_stream(&[batch]).unwrap(),
        Some(headers),
    )
    .await;
    let end2 = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "run-a", "step": 2, "count": 3});
    send(
        &producer,
        &scored,
        "run-a/2",
        &serde_json::to_vec(&end2).unwrap(),
        None,
    )
    .await;

    // Step 3: one of two rows never arrives.
    send(
        &producer,
        &scored,
        "run-a/3",
        &serde_json::to_vec(&row(3, "g4", "v1", 1.0, None)).unwrap(),
        None,
    )
    .await;
    let end3 = serde_json::json!({"type": "step_end", "schema_version": 1, "run_id": "run-a", "step": 3, "count": 2});
    send(
        &producer,
        &scored,
        "run-a/3",
        &serde_json::to_vec(&end3).unwrap(),
        None,
    )
    .await;
    producer.flush(Duration::from_secs(10)).unwrap();

    let stage = AdvantageStage::build(config.clone()).await.unwrap();
    assert_ne!(stage.metrics_addr.port(), 0);
    let running = common::spawn_stage(|stop| stage.run(stop));

    let advantages = common::wait_for_messages(&config, &adv_topic, 2).await;
    let metrics = common::wait_for_messages(&config, &metrics_topic, 2).await;
    let dead = common::wait_for_messages(&config, &dlq_topic, 2).await;
    running.stop().await;

    // Step 1's advantages, in input order.
    let first = advantages
        .iter()
        .find(|m| m.key_bytes() == Some(b"run-a/1"))
        .expect("step 1 published");
    assert!(first
        .headers
        .iter()
        .any(|h| h.key == "content-type"
            && h.value.bytes.as_deref() == Some(ARROW_STREAM_CONTENT_TYPE.as_bytes())));
    let batches = ipc::decode_stream(first.value_bytes().unwrap()).unwrap();
    let b = &batches[0];
    assert_eq!(
        common::strings(b, "trajectory_id"),
        vec!["t1", "t2", "t3", "t4", "t5", "t6", "t7"]
    );
    let s2 = 0.5f64.sqrt();
    assert_close(
        &common::f64s(b, "advantage"),
        &[0.0, 0.5 / (s2 + EPS), 0.0, -0.5 / (s2 + EPS), 0.0, 1.0 / EPS, 0.0],
    );
    assert_close(
        &common::f64s(b, "group_mean"),
        &[0.0, 0.5, 0.0, 0.5, 0.0, 0.0, 0.0],
    );

    // Step 2, from Arrow input: standard GRPO over [1, 0.5, 0].
    let second = advantages
        .iter()
        .find(|m| m.key_bytes() == Some(b"run-a/2"))
        .expect("step 2 published");
    let b = &ipc::decode_stream(second.value_bytes().unwrap()).unwrap()[0];
    assert_close(
        &common::f64s(b, "advantage"),
        &[0.5 / (0.5 + EPS), 0.0, -0.5 / (0.5 + EPS)],
    );

    // Step 1's metrics, computed by hand.
    let m1 = metrics
        .iter()
        .find(|m| m.key_bytes() == Some(b"run-a/1"))
        .unwrap();
    let m1: serde_json::Value = serde_json::from_slice(m1.value_bytes().unwrap()).unwrap();
    let expect = [
        ("hint/total_hinted_rollouts", 2.0),
        ("hint/hint_success_rate", 0.5),
        ("hint/prompts_hinted", 1.0),
        ("hint/signal_rescued", 1.0),
        ("hint/signal_rescued_count", 1.0),
        ("hint/category_llm_synthesized_count", 1.0),
        ("hint/category_llm_synthesized_success_rate", 1.0),
        ("hint/category_static_fallback_count", 1.0),
        ("hint/category_static_fallback_success_rate", 0.0),
        ("reward/pass_at_1", 0.25),
        ("advantage/extreme_count", 1.0),
        ("step", 1.0),
    ];
    for (name, value) in expect {
        assert_eq!(m1[name].as_f64(), Some(value), "{name} in {m1}");
    }

    // Step 3: both of its messages dead-lettered as incomplete.
    assert_eq!(dead.len(), 2);
    for letter in &dead {
        let kind = letter
            .headers
            .iter()
            .find(|h| h.key == DlqHeaders::ERROR_KIND)
            .unwrap();
        assert_eq!(kind.value.bytes.as_deref(), Some(&b"step_incomplete"[..]));
        assert_eq!(letter.key_bytes(), Some(&b"run-a/3"[..]));
    }
}
