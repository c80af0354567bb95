//! The leak guard on a real broker (`[hints] on_leak`): the verifier output
//! says `expected [1, 2, 3]` and the loopback LLM's first reply repeats
//! `[1, 2, 3]`.
//! - `keep`: the hint is published as written, `leak: true`, and counted
//!   for its arm (`action="kept"`);
//! - `regenerate`: a second request names the value as forbidden, inside
//!   `<untrusted source="forbidden_value">`, before the instruction, which
//!   stays the last part and forbids it; the second reply, which does not
//!   repeat it, is the hint (`leak` absent);
//! - `regenerate`, and the second reply repeats it too: the static hint
//!   with the value withheld, `failure_reason = "leak"`.

use crate::common;
use crate::common::llm_server;

use std::time::Duration;

use hintstream::config::{Config, OnLeak};
use hintstream::hints::HintStage;
use hintstream::kafka::create_producer;
use hintstream::messages::{Hint, HintCategory};
use llm_server::{Behavior, LlmServer, Seen};
use serde_json::Value;

const LEAKY: &str = "Make sort() return expected [1, 2, 3] for this input.";
const TEACHING: &str = "Sort in ascending order: compare neighbours and check the test's order.";
const VALUE: &str = "[1, 2, 3]";

fn trajectory(run: &str, instance: &str, marker: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": run, "step": 1, "instance_id": instance,
        "trajectory_id": format!("{instance}-1"), "task_prompt": format!("Sort the list. {marker}"),
        "reward": 0.0, "group_size": 1,
        "chat_history": [{"role": "assistant", "content": "I returned the list reversed."}],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['test_sort: expected [1, 2, 3], got [3, 2, 1]']\n<<< ERROR_ACCUMULATOR <<<",
    }))
    .unwrap()
}

async fn config(broker: &str, on_leak: OnLeak) -> Config {
    let mut config = common::config_for(broker);
    common::own_topics(&mut config.hints, "leak-failed", "leak-hints");
    config.llm.timeout_secs = 10.0;
    config.hints.group_wait_ms = 100;
    config.hints.on_leak = on_leak;
    common::create_hints_topics(&config, 1).await;
    config
}

/// The user message of a recorded request (prompt caching may split it
/// into blocks).
fn user_of(seen: &Seen) -> String {
    match &seen.body["messages"][0]["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        other => panic!("not text: {other}"),
    }
}

/// The recorded requests whose body holds `marker`, in order.
fn requests(server: &LlmServer, marker: &str) -> Vec<String> {
    server
        .seen()
        .iter()
        .map(user_of)
        .filter(|user| user.contains(marker))
        .collect()
}

/// Runs a stage with `on_leak` on one group per marker, each answered with
/// its replies in turn; the hints by instance, the server and the stage's
/// leak counter by action.
async fn run(on_leak: OnLeak, scripts: &[(&str, Vec<&str>)]) -> (Vec<Hint>, LlmServer, Vec<(String, f64)>) {
    let broker = common::shared_kafka();
    let config = config(&broker.bootstrap, on_leak).await;
    let server = LlmServer::start(Some("sk-k")).await;
    for (marker, replies) in scripts {
        let behaviors = replies
            .iter()
            .map(|r| Behavior::Text(r.to_string(), Duration::ZERO))
            .collect();
        server.on(marker, behaviors);
    }
    let stage = HintStage::build(config.clone(), &llm_server::anthropic_env(&server, "sk-k"))
        .await
        .unwrap();
    let metrics = common::MetricsEndpoint(stage.metrics_addr);
    let running = common::spawn_stage(|stop| stage.run(stop));
    let producer = create_producer(&config).unwrap();
    let run = common::unique("run-leak");
    for (i, (marker, _)) in scripts.iter().enumerate() {
        let instance = format!("task-{i}");
        let key = hintstream::messages::group_key(&run, 1, &instance);
        let payload = trajectory(&run, &instance, marker);
        common::send(&producer, &config.hints.input_topic, &key, &payload).await;
    }
    let mut hints = common::wait_output_hints(&config, scripts.len()).await;
    let mut counted = Vec::new();
    for action in ["kept", "regenerated", "static_fallback", "withheld"] {
        let labels = [("arm", "default"), ("action", action)];
        counted.push((
            action.to_string(),
            metrics.value("hintstream_hints_hint_leaks_total", &labels).await,
        ));
    }
    running.stop().await;
    hints.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    (hints, server, counted)
}

fn counted(counts: &[(String, f64)], action: &str) -> f64 {
    counts.iter().find(|(a, _)| a == action).map_or(0.0, |(_, v)| *v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hint_that_repeats_an_expected_value_is_flagged_and_counted_under_keep() {
    let (hints, server, counts) = run(OnLeak::Keep, &[("[leak-keep]", vec![LEAKY, TEACHING])]).await;
    let hint = &hints[0];
    assert_eq!(hint.category, HintCategory::LlmSynthesized);
    assert_eq!(hint.hint, LEAKY, "kept as written");
    assert!(hint.leak, "flagged: {hint:?}");
    assert_eq!(counted(&counts, "kept"), 1.0, "{counts:?}");
    assert_eq!(requests(&server, "[leak-keep]").len(), 1, "no second request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_regenerate_the_second_request_names_the_value_as_forbidden_then_static_if_it_leaks_again() {
    let (hints, server, counts) = run(
        OnLeak::Regenerate,
        &[
            ("[leak-once]", vec![LEAKY, TEACHING]),
            ("[leak-twice]", vec![LEAKY, LEAKY]),
        ],
    )
    .await;

    // Leaked once: the second reply is the hint.
    let once = &hints[0];
    assert_eq!(once.category, HintCategory::LlmSynthesized);
    assert_eq!(once.hint, TEACHING);
    assert!(!once.leak);
    let published = serde_json::to_string(once).unwrap();
    assert!(!published.contains("\"leak\""), "absent when false: {published}");
    let asked = requests(&server, "[leak-once]");
    assert_eq!(asked.len(), 2, "one more request");
    let element = format!("<untrusted source=\"forbidden_value\">\n{VALUE}\n</untrusted>");
    assert!(!asked[0].contains("forbidden_value"), "{}", asked[0]);
    let second = &asked[1];
    let at = second
        .find(&element)
        .unwrap_or_else(|| panic!("the value in its element: {second}"));
    let instruction = second.rfind("\n## Instruction\n").expect("an instruction");
    assert!(at < instruction, "the value stands before the instruction");
    let last = &second[instruction..];
    assert!(
        !last.contains("<untrusted source="),
        "the instruction is the last part, after every element: {last}"
    );
    assert!(
        last.ends_with("in whole or in part: say how to find or check it instead."),
        "the instruction forbids the values: {last}"
    );
    assert_eq!(second.matches("\n## Instruction\n").count(), 1);

    // Leaked twice: the static hint, the value withheld.
    let twice = &hints[1];
    assert_eq!(twice.category, HintCategory::LlmFailedStaticFallback);
    assert_eq!(twice.failure_reason.as_deref(), Some("leak"));
    assert_eq!(twice.model, None);
    assert!(!twice.hint.contains(VALUE), "{}", twice.hint);
    assert!(twice.hint.contains("expected [withheld]"), "{}", twice.hint);
    assert!(!twice.leak);
    assert_eq!(requests(&server, "[leak-twice]").len(), 2);
    assert!(
        twice.usage.output_tokens > 0,
        "both requests' spend is the hint's"
    );

    assert_eq!(counted(&counts, "regenerated"), 1.0, "{counts:?}");
    assert_eq!(counted(&counts, "static_fallback"), 1.0, "{counts:?}");
    assert_eq!(counted(&counts, "kept"), 0.0, "{counts:?}");
}
