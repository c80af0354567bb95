//! Stage 2's outcomes on a real broker: a step whose hinted rows carry
//! `hint_id`s gives one `HintOutcome` per hint on the outcomes topic (valid
//! against its schema), and the step's metrics carry the per-arm rates of
//! the hints read back from `rl.hints`; without arms a missing outcomes
//! topic only costs the outcomes; with arms it stops the start (exit 2).

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use hintstream::advantages::service::AdvantageStage;
use hintstream::config::{ArmEntry, Config};
use hintstream::kafka::create_producer;
use hintstream::messages::{Hint, HintCategory, HintLevel, HintOutcome, HintSource, Usage};
use hintstream::tools::RecordedMessage;
use rdkafka::producer::Producer;

const RUN: &str = "run-o";

fn row(step: i64, instance: &str, trajectory: &str, reward: f64, hint_id: Option<&str>) -> Vec<u8> {
    let mut v = serde_json::json!({
        "type": "scored_rollout", "schema_version": 1, "run_id": RUN, "step": step,
        "instance_id": instance, "trajectory_id": trajectory, "reward": reward,
        "is_hinted": hint_id.is_some(),
    });
    if let Some(h) = hint_id {
        v["hint_category"] = serde_json::json!("llm_synthesized");
        v["hint_id"] = serde_json::json!(h);
    }
    serde_json::to_vec(&v).unwrap()
}

fn step_end(step: i64, count: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "type": "step_end", "schema_version": 1, "run_id": RUN, "step": step, "count": count
    }))
    .unwrap()
}

/// A hint record as stage 1 writes it, of `arm`.
fn hint(
    hint_id: &str,
    step: i64,
    instance: &str,
    arm: &str,
    category: HintCategory,
    cost_usd: f64,
    refines: &[&str],
) -> Hint {
    Hint {
        schema_version: 1,
        hint_id: hint_id.into(),
        run_id: RUN.into(),
        step,
        instance_id: instance.into(),
        trajectory_id: format!("{instance}-best"),
        hint: format!("try again, {instance}"),
        category,
        model: (category == HintCategory::LlmSynthesized).then(|| "m1".into()),
        prompt_version: "v1".into(),
        latency_ms: 5,
        usage: Usage::default(),
        cost_usd,
        failure_reason: None,
        source: HintSource {
            topic: "rl.trajectories.failed".into(),
            partition: 0,
            offset: 0,
        },
        created_at: "2026-12-01T00:00:00Z".into(),
        arm: arm.into(),
        refines: refines.iter().map(|s| s.to_string()).collect(),
        hint_truncated: false,
        hedged: false,
        leak: false,
        level: None,
    }
}

fn arm(name: &str, models: &[&str], is_static: bool) -> ArmEntry {
    ArmEntry {
        name: name.into(),
        prompt_version: None,
        models: models.iter().map(|m| m.to_string()).collect(),
        is_static,
        weight: 1.0,
        min_share: 0.05,
        prior_alpha: 1.0,
        prior_beta: 1.0,
        levels: vec![],
    }
}

/// A stage 2 config on fresh topics of `broker`: scored, advantages, dlq,
/// metrics and hints are created; the outcomes topic only when `outcomes`.
async fn fresh_stage(broker: &str, outcomes: bool) -> Config {
    let mut config = common::config_for(broker);
    common::own_topics(&mut config.advantages, "scored", "advantages");
    config.topics.metrics = common::unique("metrics");
    config.topics.hints = common::unique("hints");
    config.topics.outcomes = common::unique("outcomes");
    config.advantages.step_timeout_secs = 30;
    let a = &config.advantages;
    let mut topics = vec![
        a.input_topic.as_str(),
        a.output_topic.as_str(),
        a.dlq_topic.as_str(),
        config.topics.metrics.as_str(),
        config.topics.hints.as_str(),
    ];
    if outcomes {
        topics.push(config.topics.outcomes.as_str());
    }
    common::create_topics(&config, &topics, 1).await;
    config
}

fn metrics_of(messages: &[RecordedMessage], key: &str) -> BTreeMap<String, f64> {
    let m = messages
        .iter()
        .find(|m| m.key_bytes() == Some(key.as_bytes()))
        .unwrap_or_else(|| panic!("no metrics for {key}"));
    serde_json::from_slice(m.value_bytes().unwrap()).unwrap()
}

fn outcome_validator() -> jsonschema::Validator {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/hint_outcome.schema.json");
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .unwrap()
}

/// The `retention.ms` the broker reports for `topic`.
async fn topic_retention_ms(config: &Config, topic: &str) -> String {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        hintstream::kafka::base_config(config).create().unwrap();
    let described = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .unwrap();
    let resource = described.into_iter().next().unwrap().unwrap();
    resource
        .get("retention.ms")
        .and_then(|e| e.value.clone())
        .unwrap_or_default()
}

async fn publish(config: &Config, topic: &str, messages: &[(String, Vec<u8>)]) {
    let producer = create_producer(config).unwrap();
    for (key, payload) in messages {
        common::send(&producer, topic, key, payload).await;
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hinted_rows_give_one_outcome_per_hint_and_per_arm_step_metrics() {
    let broker = common::shared_kafka();
    let mut config = fresh_stage(&broker.bootstrap, true).await;
    // arm-a gives graded hints: its step metrics count them by level too.
    let mut graded = arm("arm-a", &["m1"], false);
    graded.levels = vec![HintLevel::Concept, HintLevel::Plan];
    config.hints.arms = vec![graded, arm("control", &[], true)];
    // What stage 1 wrote: two hints of arm-a (one refined) and one of the
    // control, with their costs.
    let mut hints = [
        hint("h1", 3, "g1", "arm-a", HintCategory::LlmSynthesized, 0.01, &[]),
        hint("h2", 3, "g2", "control", HintCategory::StaticFallback, 0.0, &[]),
        hint(
            "h3",
            3,
            "g3",
            "arm-a",
            HintCategory::LlmSynthesized,
            0.02,
            &["h0"],
        ),
    ];
    hints[0].level = Some(HintLevel::Concept);
    hints[2].level = Some(HintLevel::Plan);
    let hint_records: Vec<_> = hints
        .iter()
        .map(|h| {
            (
                format!("{RUN}/3/{}", h.instance_id),
                serde_json::to_vec(h).unwrap(),
            )
        })
        .collect();
    publish(&config, &config.topics.hints.clone(), &hint_records).await;
    // Step 3: g1 rescued by h1 (1 of 2), g2 not by h2 (0 of 2), g3 rescued by
    // the refined h3 (1 of 1); g4 is not hinted.
    let rows = [
        row(3, "g1", "t1", 0.0, None),
        row(3, "g1", "t2", 1.0, Some("h1")),
        row(3, "g1", "t3", 0.0, Some("h1")),
        row(3, "g2", "t4", 0.0, None),
        row(3, "g2", "t5", 0.0, Some("h2")),
        row(3, "g2", "t6", -1.0, Some("h2")),
        row(3, "g3", "t7", 0.0, None),
        row(3, "g3", "t8", 1.0, Some("h3")),
        row(3, "g4", "t9", 1.0, None),
        step_end(3, 9),
    ];
    let key = format!("{RUN}/3");
    let scored: Vec<_> = rows.into_iter().map(|p| (key.clone(), p)).collect();
    publish(&config, &config.advantages.input_topic.clone(), &scored).await;

    let stage = AdvantageStage::build(config.clone()).await.unwrap();
    let endpoint = common::MetricsEndpoint(stage.metrics_addr);
    let running = common::spawn_stage(|stop| stage.run(stop));
    let metrics = common::wait_for_messages(&config, &config.topics.metrics, 1).await;
    let outcomes = common::wait_for_messages(&config, &config.topics.outcomes, 3).await;
    assert_eq!(
        endpoint
            .value("hintstream_advantages_hint_outcomes_published_total", &[])
            .await,
        3.0
    );
    running.stop().await;

    let validator = outcome_validator();
    let mut got: Vec<(String, String, i64, i64, bool)> = outcomes
        .iter()
        .map(|m| {
            let bytes = m.value_bytes().unwrap();
            let value: serde_json::Value = serde_json::from_slice(bytes).unwrap();
            let errors: Vec<String> = validator.iter_errors(&value).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{value}: {errors:?}");
            let o: HintOutcome = serde_json::from_slice(bytes).unwrap();
            let key = String::from_utf8(m.key_bytes().unwrap().to_vec()).unwrap();
            assert_eq!(key, o.key(), "keyed by the outcome's group");
            (o.hint_id, key, o.hinted_rollouts, o.successes, o.rescued)
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("h1".into(), format!("{RUN}/3/g1"), 2, 1, true),
            ("h2".into(), format!("{RUN}/3/g2"), 2, 0, false),
            ("h3".into(), format!("{RUN}/3/g3"), 1, 1, true),
        ]
    );

    assert_eq!(
        topic_retention_ms(&config, &config.topics.outcomes).await,
        hintstream::kafka::admin::OUTCOMES_RETENTION_MS.to_string(),
        "topics create keeps outcomes for a run"
    );

    let m = metrics_of(&metrics, &key);
    assert_eq!(m.get("hint/arm/arm-a/count"), Some(&2.0), "{m:?}");
    assert_eq!(m.get("hint/arm/arm-a/rescue_rate"), Some(&1.0), "{m:?}");
    assert_eq!(m.get("hint/arm/control/count"), Some(&1.0), "{m:?}");
    assert_eq!(m.get("hint/arm/control/rescue_rate"), Some(&0.0), "{m:?}");
    for level in ["concept", "plan"] {
        assert_eq!(
            m.get(&format!("hint/arm/arm-a/level/{level}/count")),
            Some(&1.0),
            "{m:?}"
        );
        assert_eq!(
            m.get(&format!("hint/arm/arm-a/level/{level}/rescue_rate")),
            Some(&1.0),
            "{m:?}"
        );
    }
    assert!(
        !m.keys().any(|k| k.starts_with("hint/arm/control/level/")),
        "{m:?}"
    );
    assert_eq!(m.get("hint/refined_rescue_rate"), Some(&1.0), "{m:?}");
    assert_eq!(m.get("hint/fresh_rescue_rate"), Some(&0.5), "{m:?}");
    let cost = m["hint/cost_per_rescue_usd"];
    assert!((cost - 0.015).abs() < 1e-12, "{m:?}");
    // The metrics of before stay as they were.
    assert_eq!(m.get("hint/total_hinted_rollouts"), Some(&5.0), "{m:?}");
    assert_eq!(m.get("hint/signal_rescued_count"), Some(&2.0), "{m:?}");
    assert_eq!(m.get("advantage/rows"), Some(&9.0), "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_arms_a_missing_outcomes_topic_costs_only_the_outcomes() {
    let broker = common::shared_kafka();
    let config = fresh_stage(&broker.bootstrap, false).await;
    assert!(!config.hints.has_arms());
    let h = hint("d1", 5, "g1", "default", HintCategory::LlmSynthesized, 0.0, &[]);
    publish(
        &config,
        &config.topics.hints.clone(),
        &[(format!("{RUN}/5/g1"), serde_json::to_vec(&h).unwrap())],
    )
    .await;
    // Step 5 names the hint; step 6 names none.
    let five = format!("{RUN}/5");
    let six = format!("{RUN}/6");
    let scored = vec![
        (five.clone(), row(5, "g1", "t1", 0.0, None)),
        (five.clone(), row(5, "g1", "t2", 1.0, Some("d1"))),
        (five.clone(), step_end(5, 2)),
        (six.clone(), row(6, "g1", "t3", 0.0, None)),
        (six.clone(), row(6, "g1", "t4", 1.0, None)),
        (six.clone(), step_end(6, 2)),
    ];
    publish(&config, &config.advantages.input_topic.clone(), &scored).await;

    let stage = AdvantageStage::build(config.clone())
        .await
        .expect("a missing outcomes topic without arms is only a warning");
    let endpoint = common::MetricsEndpoint(stage.metrics_addr);
    let running = common::spawn_stage(|stop| stage.run(stop));
    let advantages = common::wait_for_messages(&config, &config.advantages.output_topic, 2).await;
    let metrics = common::wait_for_messages(&config, &config.topics.metrics, 2).await;
    let published = endpoint
        .value("hintstream_advantages_steps_published_total", &[])
        .await;
    let outcomes = endpoint
        .value("hintstream_advantages_hint_outcomes_published_total", &[])
        .await;
    assert_eq!((published, outcomes), (2.0, 0.0), "steps, but no outcomes");
    running.stop().await;

    assert_eq!(advantages.len(), 2, "both steps published their advantages");
    let m5 = metrics_of(&metrics, &five);
    assert_eq!(m5.get("hint/arm/default/count"), Some(&1.0), "{m5:?}");
    assert_eq!(m5.get("hint/arm/default/rescue_rate"), Some(&1.0), "{m5:?}");
    let m6 = metrics_of(&metrics, &six);
    assert!(
        !m6.keys().any(|k| k.starts_with("hint/")),
        "a step without hint_ids has no hint metrics: {m6:?}"
    );
    let dead = common::read_topic(&config, &config.advantages.dlq_topic).await;
    assert!(dead.is_empty(), "nothing dead-lettered: {dead:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_arms_a_missing_outcomes_topic_stops_the_start_with_exit_2() {
    let broker = common::shared_kafka();
    let mut config = fresh_stage(&broker.bootstrap, false).await;
    config.hints.arms = vec![arm("arm-a", &["m1"], false), arm("control", &[], true)];
    let dir = tempfile::tempdir().unwrap();
    let file = common::write_config(&config, dir.path());
    let mut stage = common::Process::spawn(common::stage_command("advantages", &file), "advantages-arms");
    let status = stage.wait_exit(Duration::from_secs(60));
    let stderr = stage.log();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(
        stderr.contains(&config.topics.outcomes) && stderr.contains("hintstream topics create"),
        "{stderr}"
    );
}
