//! Prompts fitted to a model's context window, against the loopback
//! server's window mode (a 400 `context_length_exceeded` past its window,
//! as vLLM and llama.cpp answer): a long trajectory fitted to the
//! configured window and hinted; a denser tokenizer than the estimate
//! refitted once to half the budget; a window no refit meets failing with
//! `context_length`, then the next model of the chain answering; the
//! window read from the error when none is configured; the window read
//! from a vLLM or llama.cpp server, within its bound.

use crate::common::llm_server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hintstream::config::{LlmConfig, LlmProvider};
use hintstream::llm::synth::{LlmEnv, SynthObserver};
use hintstream::llm::Synthesizer;
use hintstream::messages::{FailedTrajectory, HintCategory};
use llm_server::{prompt_text_bytes, Behavior, LlmServer};

/// A trajectory of 40 messages of 4,200 characters (the one that failed
/// with `http_400` against an 8k window before prompts were fitted), the
/// last ending with `LAST-MESSAGE-END`; message i starts `step i:`.
pub(crate) fn long_trajectory(marker: &str) -> FailedTrajectory {
    let history: Vec<serde_json::Value> = (0..40)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            let end = if i == 39 { " LAST-MESSAGE-END" } else { "" };
            let body = format!("step {i}: ran the tests, read the parser, edited the tokenizer. ").repeat(70);
            serde_json::json!({"role": role, "content": format!("{}{end}", &body[..4_200 - end.len()])})
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "schema_version": 1, "run_id": "r", "step": 1, "instance_id": "i", "trajectory_id": "t",
        "task_prompt": format!("Fix the date parser so that ISO weeks round-trip. {marker}"),
        "chat_history": history, "reward": 0.0,
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['test_iso_week failed']\n<<< ERROR_ACCUMULATOR <<<",
        "verifier_error": "AssertionError: week 53", "tool_error_messages": ["bash: exit status 1"]
    }))
    .unwrap()
}

/// Records what the synthesizer reports of fitting.
#[derive(Default)]
struct Fits(Mutex<Vec<(String, usize)>>);

impl SynthObserver for Fits {
    fn attempt(&self, _: &str, _: &str, _: Duration) {}
    fn retry(&self, _: &str, _: &str) {}
    fn calls_in_flight(&self, _: usize) {}
    fn prompt_fitted(&self, model: &str, chars_dropped: usize) {
        self.0.lock().unwrap().push((model.to_string(), chars_dropped));
    }
}

fn env(server: &LlmServer) -> LlmEnv {
    LlmEnv {
        openai_api_key: Some("sk-window".into()),
        openai_base_url: Some(format!("{}/v1", server.base_url())),
        ..LlmEnv::default()
    }
}

fn config(models: &[&str], windows: &[(&str, u32)]) -> LlmConfig {
    LlmConfig {
        provider: LlmProvider::Openai,
        models: models.iter().map(|m| m.to_string()).collect(),
        context_tokens: windows.iter().map(|(m, w)| (m.to_string(), *w)).collect(),
        timeout_secs: 5.0,
        max_retries: 1,
        ..LlmConfig::default()
    }
}

fn window(context_tokens: u64, bytes_per_token: u64) -> Behavior {
    Behavior::Window {
        context_tokens,
        bytes_per_token,
        text: "Write the ISO week test first, then fix the year boundary.".into(),
    }
}

fn synth(config: &LlmConfig, server: &LlmServer) -> (Synthesizer, Arc<Fits>) {
    let fits = Arc::new(Fits::default());
    let synth = Synthesizer::new(config, &env(server))
        .unwrap()
        .with_observer(fits.clone());
    (synth, fits)
}

#[tokio::test]
async fn a_long_trajectory_is_fitted_to_the_configured_window_and_hinted() {
    let server = LlmServer::start(Some("sk-window")).await;
    server.default(window(2_048, 3));
    let (synth, fits) = synth(&config(&["local-model"], &[("local-model", 2_048)]), &server);
    let t = long_trajectory("");
    let s = synth.synthesize(&t).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{s:?}");
    assert_eq!(
        server.seen().len(),
        1,
        "fitted before sending: no context-length error"
    );
    let body = &server.seen()[0].body;
    assert!(prompt_text_bytes(body).div_ceil(3) + 300 <= 2_048);
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(user.contains("Fix the date parser") && user.contains("test_iso_week failed"));
    assert!(
        user.contains("<untrusted source=\"chat\" role=\"assistant\">\nstep 39:"),
        "the last message is kept, in its element"
    );
    assert!(!user.contains("step 24:"), "the oldest shown are dropped");
    assert!(user.contains("earlier messages dropped to fit the model's context window"));
    let fits = fits.0.lock().unwrap().clone();
    assert_eq!(fits.len(), 1);
    assert_eq!(fits[0].0, "local-model");
    assert!(fits[0].1 > 30_000, "{} characters dropped", fits[0].1);
    assert_eq!(
        s.usage.input_tokens,
        prompt_text_bytes(body).div_ceil(3),
        "usage is the server's"
    );
}

#[tokio::test]
async fn a_tokenizer_denser_than_the_estimate_gets_one_refit_to_half_the_budget() {
    let server = LlmServer::start(Some("sk-window")).await;
    // Two bytes a token: the bytes/3 fit is over this window, half of it is not.
    server.default(window(2_048, 2));
    let (synth, fits) = synth(&config(&["local-model"], &[("local-model", 2_048)]), &server);
    let s = synth.synthesize(&long_trajectory("")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{s:?}");
    assert_eq!(s.failure_reason, None);
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "the refit is sent once");
    assert!(prompt_text_bytes(&seen[1].body) * 2 <= prompt_text_bytes(&seen[0].body) + 2_000);
    assert_eq!(fits.0.lock().unwrap().len(), 2, "both fits are counted");
}

#[tokio::test]
async fn a_window_no_refit_meets_fails_with_context_length_and_the_chain_goes_on() {
    let server = LlmServer::start(Some("sk-window")).await;
    // One byte a token and 600 tokens: not even the task and the system prompt fit.
    server.on("\"model\":\"tiny\"", vec![window(600, 1)]);
    server.on("\"model\":\"big\"", vec![window(32_768, 3)]);
    let t = long_trajectory("");
    let (alone, _) = synth(&config(&["tiny"], &[("tiny", 2_048)]), &server);
    let s = alone.synthesize(&t).await;
    assert_eq!(s.category, HintCategory::LlmFailedStaticFallback);
    assert_eq!(s.failure_reason.as_deref(), Some("context_length"));
    assert_eq!(server.seen().len(), 2, "one call and one refit, no retries");
    let (chain, _) = synth(
        &config(&["tiny", "big"], &[("tiny", 2_048), ("big", 32_768)]),
        &server,
    );
    let s = chain.synthesize(&t).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{s:?}");
    assert_eq!(s.model.as_deref(), Some("big"));
}

#[tokio::test]
async fn without_a_configured_window_the_servers_error_names_it() {
    let server = LlmServer::start(Some("sk-window")).await;
    server.default(window(2_048, 3));
    // The loopback server has no /models: discovery finds nothing.
    let (synth, fits) = synth(&config(&["unknown-model"], &[]), &server);
    let s = synth.synthesize(&long_trajectory("")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{s:?}");
    let seen = server.seen();
    assert_eq!(
        seen.len(),
        2,
        "sent whole, refused, refitted to the window the error named"
    );
    assert!(prompt_text_bytes(&seen[1].body).div_ceil(3) + 300 <= 2_048);
    assert_eq!(fits.0.lock().unwrap().len(), 1, "only the refit cut the prompt");
}

/// A server that answers `GET /v1/models` and `GET /props` with these
/// bodies (404 where `None`), or never (`hang`).
async fn discovery_server(
    models: Option<serde_json::Value>,
    props: Option<serde_json::Value>,
    hang: bool,
) -> String {
    use axum::routing::get;
    let answer = move |body: Option<serde_json::Value>| async move {
        if hang {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        match body {
            Some(b) => (axum::http::StatusCode::OK, b.to_string()),
            None => (axum::http::StatusCode::NOT_FOUND, String::new()),
        }
    };
    let app = axum::Router::new()
        .route("/v1/models", get(move || answer(models.clone())))
        .route("/props", get(move || answer(props.clone())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

fn client(base_url: String) -> hintstream::llm::LlmClient {
    hintstream::llm::LlmClient::new(hintstream::llm::Endpoint {
        provider: hintstream::llm::Provider::Openai,
        base_url,
        api_key: None,
        ssl_cert_file: None,
    })
    .unwrap()
}

#[tokio::test]
async fn a_servers_window_is_read_from_vllm_models_or_llama_cpp_props_within_the_bound() {
    let second = Duration::from_secs(1);
    let vllm = discovery_server(
        Some(serde_json::json!({"object": "list", "data": [
            {"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "max_model_len": 32768},
            {"id": "other", "object": "model", "max_model_len": 4096}]})),
        None,
        false,
    )
    .await;
    assert_eq!(
        client(vllm.clone())
            .context_window("Qwen/Qwen2.5-7B-Instruct", second)
            .await,
        Some(32_768)
    );
    assert_eq!(client(vllm).context_window("missing", second).await, None);
    let llama_cpp = discovery_server(
        Some(serde_json::json!({"object": "list", "data": [{"id": "model.gguf", "object": "model"}]})),
        Some(serde_json::json!({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1})),
        false,
    )
    .await;
    assert_eq!(
        client(llama_cpp).context_window("anything", second).await,
        Some(4_096)
    );
    let silent = discovery_server(None, None, false).await;
    assert_eq!(client(silent).context_window("m", second).await, None);
    let hanging = discovery_server(None, None, true).await;
    let started = std::time::Instant::now();
    assert_eq!(client(hanging).context_window("m", second).await, None);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by its timeout"
    );
}
