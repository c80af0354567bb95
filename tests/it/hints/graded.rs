//! Graded hints on a real broker: one arm with `levels = ["concept",
//! "plan", "step"]`; a task that fails three times in a row gets a concept,
//! then a plan, then a step hint, each asked for at its level (the recorded
//! LLM request's system prompt and instruction), and after a rescue the
//! next hint is one level lower. The outcomes are published on the
//! outcomes topic as stage 2 (or the trainer) publishes them.

use std::time::Duration;

use hintstream::config::ArmEntry;
use hintstream::hints::HintStage;
use hintstream::kafka::create_producer;
use hintstream::llm::prompt::levels;
use hintstream::messages::{group_key, HintCategory, HintLevel};

use super::learning_stage::{learning_config, outcome, publish_outcome, trajectory, wait_hints};
use crate::common;
use crate::common::llm_server::{self, Behavior, LlmServer};

const ALL: [HintLevel; 3] = [HintLevel::Concept, HintLevel::Plan, HintLevel::Step];

fn graded_arm() -> ArmEntry {
    ArmEntry {
        name: "graded".into(),
        prompt_version: None,
        models: vec!["claude-graded".into()],
        is_static: false,
        weight: 1.0,
        min_share: 0.0,
        prior_alpha: 1.0,
        prior_beta: 1.0,
        levels: ALL.to_vec(),
    }
}

/// Whether the request `body` asked at `level`: its system prompt's ask and
/// its instruction are the level's, and no other level's.
fn asked_at(body: &serde_json::Value, level: HintLevel, refined: bool) -> Result<(), String> {
    let system = match &body["system"] {
        serde_json::Value::String(s) => s.clone(),
        blocks => blocks
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
    };
    let user = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .map(|m| match &m["content"] {
            serde_json::Value::String(s) => s.clone(),
            blocks => blocks
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
        })
        .unwrap_or_default();
    for other in ALL {
        let has = system.contains(levels::system_ask(other));
        if has != (other == level) {
            return Err(format!("system prompt at {other}: {has}\n{system}"));
        }
    }
    let instruction = format!("## Instruction\n{}", levels::instruction(level, refined));
    if !user.ends_with(&instruction) {
        return Err(format!(
            "the user message does not end in {instruction:?}:\n{user}"
        ));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_failing_three_times_climbs_concept_plan_step_and_steps_down_after_a_rescue() {
    let broker = common::shared_kafka();
    let mut config = learning_config(&broker.bootstrap).await;
    config.hints.arms = vec![graded_arm()];
    let server = LlmServer::start(Some("sk-k")).await;
    server.default(Behavior::Text(
        "Think about what the check compares.".into(),
        Duration::ZERO,
    ));
    let stage = HintStage::build(config.clone(), &llm_server::anthropic_env(&server, "sk-k"))
        .await
        .unwrap();
    let metrics = common::MetricsEndpoint(stage.metrics_addr);
    let running = common::spawn_stage(|stop| stage.run(stop));
    let producer = create_producer(&config).unwrap();
    let run = common::unique("run-graded");

    // Steps 1-3: the hints do not rescue the task (both hinted retries
    // fail); step 3's does. Step 4 comes after the rescue.
    let plan = [
        (1, HintLevel::Concept, 0),
        (2, HintLevel::Plan, 0),
        (3, HintLevel::Step, 2),
        (4, HintLevel::Plan, 0),
    ];
    for (step, level, successes) in plan {
        common::send(
            &producer,
            &config.hints.input_topic,
            &group_key(&run, step, "task-1"),
            &trajectory(&run, step, "task-1"),
        )
        .await;
        let hints = wait_hints(
            &config,
            |h| h.iter().any(|h| h.run_id == run && h.step == step),
            String::new,
        )
        .await;
        let hint = hints.iter().find(|h| h.run_id == run && h.step == step).unwrap();
        assert_eq!(hint.category, HintCategory::LlmSynthesized, "step {step}");
        assert_eq!(hint.arm, "graded");
        assert_eq!(hint.level, Some(level), "step {step}: {hint:?}");
        // Refinement goes on as without levels: from step 2 on the
        // earlier unhelpful hints (steps 1 and 2 for step 4) are shown.
        let refined = step > 1;
        assert_eq!(!hint.refines.is_empty(), refined, "step {step}: {hint:?}");
        let seen = server.seen();
        assert_eq!(seen.len(), step as usize, "one request a hint");
        asked_at(&seen.last().unwrap().body, level, refined)
            .unwrap_or_else(|e| panic!("step {step} asked at {level}: {e}"));
        publish_outcome(&config, &producer, &outcome(hint, 2, successes)).await;
    }
    let plans = metrics
        .wait_for(
            "hintstream_hints_graded_hints_total",
            &[("arm", "graded"), ("level", "plan")],
            |v| v >= 2.0,
            Duration::from_secs(30),
            String::new,
        )
        .await;
    running.stop().await;
    assert_eq!(plans, 2.0, "two plan hints: steps 2 and 4");
}
