//! Hint synthesis against a loopback server that speaks the Anthropic and
//! OpenAI-compatible APIs: the requests it sees, the hint categories and
//! failure reasons for each way a call can fail, retry-after, and the model
//! fallback chain.

use crate::common::llm_server;

use std::time::{Duration, Instant};

use hintstream::config::LlmConfig;
use hintstream::llm::synth::LlmEnv;
use hintstream::llm::Synthesizer;
use hintstream::messages::{FailedTrajectory, HintCategory};
use llm_server::{Behavior, LlmServer};

fn trajectory(marker: &str) -> FailedTrajectory {
    serde_json::from_value(serde_json::json!({
        "schema_version": 1, "run_id": "r", "step": 1, "instance_id": "i", "trajectory_id": "t",
        "task_prompt": format!("Fix the date parser. {marker}"),
        "chat_history": [{"role": "assistant", "content": [{"type": "tool_use", "name": "bash", "input": {"cmd": "pytest"}}]}],
        "reward": 0.0,
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['test_iso_week failed', 'test_roundtrip failed']\n<<< ERROR_ACCUMULATOR <<<",
        "verifier_error": null, "tool_error_messages": ["bash: exit status 1"]
    }))
    .unwrap()
}

fn anthropic_env(server: &LlmServer) -> LlmEnv {
    llm_server::anthropic_env(server, "sk-test-key")
}

fn fast_config() -> LlmConfig {
    LlmConfig {
        timeout_secs: 3.0,
        max_retries: 2,
        ..LlmConfig::default()
    }
}

#[tokio::test]
async fn anthropic_hint_carries_the_server_text_and_a_valid_request() {
    let server = LlmServer::start(Some("sk-test-key")).await;
    server.on(
        "[ok]",
        vec![Behavior::Text(
            "Run pytest -x before editing.".into(),
            Duration::ZERO,
        )],
    );
    let synth = Synthesizer::new(&fast_config(), &anthropic_env(&server)).unwrap();
    let s = synth.synthesize(&trajectory("[ok]")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized);
    assert_eq!(s.hint, "Run pytest -x before editing.");
    assert_eq!(s.model.as_deref(), Some("claude-sonnet-4-20250514"));
    assert!(s.usage.input_tokens > 0 && s.cost_usd > 0.0);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let r = &seen[0];
    assert_eq!(r.path, "/v1/messages");
    assert_eq!(r.headers["x-api-key"], "sk-test-key");
    assert_eq!(r.headers["anthropic-version"], "2023-06-01");
    assert_eq!(r.body["max_tokens"], 300);
    assert_eq!(r.body["temperature"], 0.3);
    assert!(r.body["system"].as_str().unwrap().contains("2-5 sentences"));
    let user = r.body["messages"][0]["content"].as_str().unwrap();
    assert_eq!(r.body["messages"][0]["role"], "user");
    assert!(
        user.contains("test_iso_week failed") && user.contains("[tool_use: bash("),
        "{user}"
    );
}

#[tokio::test]
async fn openai_compatible_server_gets_system_and_user_messages() {
    let server = LlmServer::start(Some("sk-oa")).await;
    let env = LlmEnv {
        openai_api_key: Some("sk-oa".into()),
        openai_base_url: Some(format!("{}/v1", server.base_url())),
        ..LlmEnv::default()
    };
    let config = LlmConfig {
        models: vec!["qwen2.5-7b-instruct".into()],
        ..fast_config()
    };
    let synth = Synthesizer::new(&config, &env).unwrap();
    let s = synth.synthesize(&trajectory("")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized);
    assert_eq!(s.model.as_deref(), Some("qwen2.5-7b-instruct"));
    let r = &server.seen()[0];
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(r.headers["authorization"], "Bearer sk-oa");
    assert_eq!(r.body["messages"][0]["role"], "system");
    assert_eq!(r.body["messages"][1]["role"], "user");
}

#[tokio::test]
async fn without_a_key_the_static_hint_names_the_failed_checks() {
    let synth = Synthesizer::new(&LlmConfig::default(), &LlmEnv::default()).unwrap();
    assert!(!synth.has_model());
    let s = synth.synthesize(&trajectory("")).await;
    assert_eq!(s.category, HintCategory::StaticFallback);
    assert!(
        s.hint.contains("test_iso_week failed") && s.hint.contains("test_roundtrip failed"),
        "{}",
        s.hint
    );
    assert_eq!(s.failure_reason, None);
    assert_eq!(s.model, None);
}

#[tokio::test]
async fn each_failure_falls_back_to_the_static_hint_with_its_reason() {
    let server = LlmServer::start(Some("sk-test-key")).await;
    let cases = [
        ("[500]", Behavior::Status(500, "api_error", None), "http_5xx"),
        (
            "[529]",
            Behavior::Status(529, "overloaded_error", None),
            "http_529",
        ),
        ("[hang]", Behavior::Hang, "timeout"),
        ("[empty]", Behavior::Empty, "empty"),
        ("[malformed]", Behavior::Malformed, "malformed_response"),
        ("[reset]", Behavior::Reset, "connect"),
        // A 200, then the body breaks off: billed, so not `connect`.
        ("[broken]", Behavior::BreakAfter200, "body_broken"),
        (
            "[400]",
            Behavior::Status(400, "invalid_request_error", None),
            "http_400",
        ),
    ];
    for (marker, behavior, _) in &cases {
        server.on(marker, vec![behavior.clone()]);
    }
    let config = LlmConfig {
        timeout_secs: 1.5,
        ..fast_config()
    };
    let synth = Synthesizer::new(&config, &anthropic_env(&server)).unwrap();
    let results = futures::future::join_all(cases.iter().map(|(m, _, _)| {
        let t = trajectory(m);
        let synth = &synth;
        async move { synth.synthesize(&t).await }
    }))
    .await;
    for ((marker, _, reason), s) in cases.iter().zip(results) {
        assert_eq!(s.category, HintCategory::LlmFailedStaticFallback, "{marker}");
        assert_eq!(s.failure_reason.as_deref(), Some(*reason), "{marker}");
        assert!(s.hint.contains("test_iso_week failed"), "{marker}: {}", s.hint);
        assert!(
            s.latency_ms <= 2_500,
            "{marker} took {} ms, over its budget",
            s.latency_ms
        );
    }
}

#[tokio::test]
async fn waits_at_least_retry_after_then_succeeds() {
    let server = LlmServer::start(Some("sk-test-key")).await;
    server.on(
        "[429]",
        vec![
            Behavior::Status(429, "rate_limit_error", Some(1)),
            Behavior::Text("Use the edit tool.".into(), Duration::ZERO),
        ],
    );
    let synth = Synthesizer::new(&fast_config(), &anthropic_env(&server)).unwrap();
    let started = Instant::now();
    let s = synth.synthesize(&trajectory("[429]")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized);
    assert_eq!(s.hint, "Use the edit tool.");
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at.duration_since(seen[0].at);
    assert!(
        gap >= Duration::from_secs(1),
        "retried after {gap:?}, before retry-after"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn falls_through_the_model_chain() {
    let server = LlmServer::start(Some("sk-test-key")).await;
    server.on(
        "\"model\":\"bad-model\"",
        vec![Behavior::Status(404, "not_found_error", None)],
    );
    let config = LlmConfig {
        models: vec!["bad-model".into(), "claude-3-5-haiku-20241022".into()],
        ..fast_config()
    };
    let synth = Synthesizer::new(&config, &anthropic_env(&server)).unwrap();
    let s = synth.synthesize(&trajectory("")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized);
    assert_eq!(s.model.as_deref(), Some("claude-3-5-haiku-20241022"));
    assert_eq!(server.seen().len(), 2, "a 404 is not retried on the same model");
}

#[tokio::test]
async fn hint_ids_are_deterministic_per_group_prompt_and_chain() {
    let a = Synthesizer::new(&LlmConfig::default(), &LlmEnv::default()).unwrap();
    let b = Synthesizer::new(&LlmConfig::default(), &LlmEnv::default()).unwrap();
    assert_eq!(a.hint_id("r/1/i"), b.hint_id("r/1/i"));
    assert_ne!(a.hint_id("r/1/i"), a.hint_id("r/1/j"));
    let env = LlmEnv {
        anthropic_api_key: Some("k".into()),
        ..LlmEnv::default()
    };
    let with_model = Synthesizer::new(&LlmConfig::default(), &env).unwrap();
    assert_ne!(a.hint_id("r/1/i"), with_model.hint_id("r/1/i"));
}

/// The reference trainer's model id and key work unchanged: with
/// `provider = "auto"`, `openrouter/anthropic/claude-sonnet-4` goes to
/// OpenRouter's OpenAI-compatible API (`OPENROUTER_API_KEY`,
/// `OPENROUTER_BASE_URL`) as `anthropic/claude-sonnet-4`, and an
/// `anthropic/...` id to the Anthropic API under its own name.
#[tokio::test]
async fn litellm_style_ids_pick_their_api() {
    let openrouter = LlmServer::start(Some("sk-or-key")).await;
    openrouter.on(
        "[route]",
        vec![
            Behavior::Status(503, "overloaded", None),
            Behavior::Status(503, "overloaded", None),
        ],
    );
    let anthropic = LlmServer::start(Some("sk-ant-key")).await;
    anthropic.default(Behavior::Text("From Anthropic.".into(), Duration::ZERO));
    let env = LlmEnv {
        openrouter_api_key: Some("sk-or-key".into()),
        openrouter_base_url: Some(format!("{}/v1", openrouter.base_url())),
        anthropic_api_key: Some("sk-ant-key".into()),
        anthropic_base_url: Some(anthropic.base_url()),
        ..LlmEnv::default()
    };
    let config = LlmConfig {
        models: vec![
            "openrouter/anthropic/claude-sonnet-4".into(),
            "anthropic/claude-3-5-haiku-20241022".into(),
        ],
        max_retries: 0,
        ..fast_config()
    };
    let synth = Synthesizer::new(&config, &env).unwrap();
    let s = synth.synthesize(&trajectory("[route]")).await;
    assert_eq!(s.hint, "From Anthropic.");
    assert_eq!(s.model.as_deref(), Some("anthropic/claude-3-5-haiku-20241022"));
    let or_seen = openrouter.seen();
    assert_eq!(or_seen.len(), 1);
    assert_eq!(or_seen[0].path, "/v1/chat/completions");
    assert_eq!(or_seen[0].body["model"], "anthropic/claude-sonnet-4");
    assert_eq!(
        or_seen[0].headers.get("authorization").map(String::as_str),
        Some("Bearer sk-or-key")
    );
    let an_seen = anthropic.seen();
    assert_eq!(an_seen[0].path, "/v1/messages");
    assert_eq!(an_seen[0].body["model"], "claude-3-5-haiku-20241022");

    // Without OPENROUTER_API_KEY, the OpenRouter model is left out.
    let env = LlmEnv {
        openrouter_api_key: None,
        ..env
    };
    let synth = Synthesizer::new(&config, &env).unwrap();
    assert_eq!(synth.models(), ["anthropic/claude-3-5-haiku-20241022"]);
    // A named provider takes every id as written (an OpenAI-compatible
    // gateway may well serve a model called `anthropic/...`).
    let named = LlmConfig {
        provider: hintstream::config::LlmProvider::Anthropic,
        models: vec!["anthropic/claude-x".into()],
        ..fast_config()
    };
    let synth = Synthesizer::new(&named, &env).unwrap();
    assert_eq!(synth.models(), ["anthropic/claude-x"]);
    assert!(
        synth.describe().contains("anthropic/claude-x (Anthropic API)"),
        "{}",
        synth.describe()
    );
}
