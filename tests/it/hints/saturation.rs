//! A server that serves one request at a time while stage 1 sends several:
//! most hints of the window time out while queued at it, which is said
//! once (the `saturated` observation behind `hintstream_hints_llm_saturated`),
//! and the wait for a call slot is observed (`hintstream_hints_llm_queue_seconds`).

use crate::common::llm_server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hintstream::config::{LlmConfig, LlmProvider};
use hintstream::llm::synth::{LlmEnv, SynthObserver};
use hintstream::llm::Synthesizer;
use hintstream::messages::{FailedTrajectory, HintCategory};
use llm_server::{Behavior, LlmServer};

#[derive(Default)]
struct Seen {
    saturated: Mutex<Vec<String>>,
    waits: Mutex<Vec<Duration>>,
}

impl SynthObserver for Seen {
    fn attempt(&self, _: &str, _: &str, _: Duration) {}
    fn retry(&self, _: &str, _: &str) {}
    fn calls_in_flight(&self, _: usize) {}
    fn queued(&self, _: &str, wait: Duration) {
        self.waits.lock().unwrap().push(wait);
    }
    fn saturated(&self, model: &str) {
        self.saturated.lock().unwrap().push(model.to_string());
    }
}

fn trajectory(i: usize) -> FailedTrajectory {
    serde_json::from_value(serde_json::json!({
        "schema_version": 1, "run_id": "r", "step": 1, "instance_id": format!("i{i}"),
        "trajectory_id": format!("t{i}"), "task_prompt": format!("Fix bug {i}"),
        "chat_history": [], "reward": 0.0,
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_one_slot_server_timing_out_queued_hints_is_said_to_be_saturated_once() {
    let server = LlmServer::start(None).await;
    server.default(Behavior::OneSlot(
        "Test week 53 first.".into(),
        Duration::from_millis(500),
    ));
    let config = LlmConfig {
        provider: LlmProvider::Openai,
        models: vec!["one-slot-model".into()],
        // Six sent at once to a server that answers one every 0.5 s.
        concurrency: 6,
        timeout_secs: 1.75,
        max_retries: 0,
        discover_context: false,
        ..LlmConfig::default()
    };
    let env = LlmEnv {
        openai_base_url: Some(format!("{}/v1", server.base_url())),
        ..LlmEnv::default()
    };
    let seen = Arc::new(Seen::default());
    let synth = Synthesizer::new(&config, &env)
        .unwrap()
        .with_observer(seen.clone());
    let hints = futures::future::join_all((0..12).map(|i| {
        let synth = &synth;
        async move { synth.synthesize(&trajectory(i)).await }
    }))
    .await;
    let synthesized = hints
        .iter()
        .filter(|s| s.category == HintCategory::LlmSynthesized)
        .count();
    assert!(
        synthesized <= 3,
        "one slot answers at most 3 in 1.75 s: {synthesized}"
    );
    let timeouts = hints
        .iter()
        .filter(|s| s.failure_reason.as_deref() == Some("timeout"))
        .count();
    assert_eq!(synthesized + timeouts, 12);
    assert_eq!(*seen.saturated.lock().unwrap(), ["one-slot-model"], "said once");
    let waits = seen.waits.lock().unwrap().clone();
    assert!(
        waits.iter().any(|w| *w >= Duration::from_millis(400)),
        "attempts waited for a call slot: {waits:?}"
    );
}
