//! Stage 1 against a real model server: llama.cpp's OpenAI-compatible
//! server (llama-cpp-python) with SmolLM2-135M-Instruct, started by
//! `scripts/local-llm.sh` with a 2,048-token window and shared by the tests
//! of this binary (it answers one request at a time). The OpenAI path end
//! to end on Kafka, its usage checked against the server's own reply to
//! the stage's request, recorded by a loopback proxy; a long trajectory fitted to the window and hinted by
//! the model, and the same one sent unfitted, refused by the server and
//! refitted; an eval report recorded from the server, then played back.
//! A machine that cannot run the server fails these tests with what to do.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hintstream::config::{Config, LlmConfig, LlmProvider, PromptVersion};
use hintstream::eval::report::Report;
use hintstream::hints::HintStage;
use hintstream::kafka::create_producer;
use hintstream::llm::synth::{LlmEnv, SynthObserver};
use hintstream::llm::Synthesizer;
use hintstream::messages::{FailedTrajectory, Hint, HintCategory};
use hintstream::tools::recorded::Bytes;
use hintstream::tools::RecordedMessage;
use rdkafka::producer::Producer;
use serde_json::{json, Value};

/// The name the server serves the model under (`--model_alias`).
const MODEL: &str = "smollm2-135m-instruct";
/// The server's context window (`LOCAL_LLM_CTX`).
const WINDOW: u32 = 2_048;
/// Short replies keep the tests fast on two cores.
const MAX_TOKENS: u32 = 64;

/// The base URL of the shared server (`…/v1`), started on first use; the
/// server stops when the test process is gone.
fn local_llm() -> &'static str {
    static BASE_URL: OnceLock<String> = OnceLock::new();
    BASE_URL.get_or_init(|| {
        let port = common::free_port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/local-llm.sh");
        let out = Command::new(&script)
            .args(["start", &port.to_string()])
            .env("LOCAL_LLM_CTX", WINDOW.to_string())
            .env("LOCAL_LLM_WATCH_PID", std::process::id().to_string())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "the local model server did not start (scripts/local-llm.sh start {port}):\n{}\n\
             To fix: run `scripts/local-llm.sh install` and read what it says; it needs python3 with \
             venv, cmake, a C++ compiler and PyPI (pip), and takes ~4 minutes once on 2 cores \
             (cached under ${{XDG_CACHE_HOME:-~/.cache}}/hintstream/local-llm)",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        stdout
            .lines()
            .last()
            .expect("start prints the base URL last")
            .to_string()
    })
}

fn env() -> LlmEnv {
    LlmEnv {
        openai_base_url: Some(local_llm().to_string()),
        ..LlmEnv::default()
    }
}

fn llm_config(windows: &[(&str, u32)]) -> LlmConfig {
    LlmConfig {
        provider: LlmProvider::Openai,
        models: vec![MODEL.into()],
        context_tokens: windows.iter().map(|(m, w)| (m.to_string(), *w)).collect(),
        max_tokens: MAX_TOKENS,
        // Greedy, for replies that vary little from run to run.
        temperature: 0.0,
        // One slot, shared by the tests: a request may wait for others.
        timeout_secs: 300.0,
        concurrency: 1,
        max_retries: 1,
        ..LlmConfig::default()
    }
}

fn short_trajectory(i: usize) -> Value {
    json!({
        "schema_version": 1, "run_id": "run-local", "step": 1, "instance_id": format!("inst-{i}"),
        "trajectory_id": format!("t-{i}"), "group_size": 1, "reward": 0.0,
        "task_prompt": format!("Fix bug #{i}: the date parser rejects ISO week 53."),
        "chat_history": [
            {"role": "user", "content": format!("Fix bug #{i}")},
            {"role": "assistant", "content": [{"type": "tool_use", "name": "bash", "input": {"cmd": "pytest -x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "content": "FAILED test_iso_week - ValueError: week 53"}]},
        ],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['test_iso_week failed']\n<<< ERROR_ACCUMULATOR <<<",
        "verifier_error": "ValueError: week 53 out of range",
    })
}

/// What the server answered, as it crossed the wire: each request body
/// with the JSON body of its reply.
type Exchanges = Arc<Mutex<Vec<(Value, Value)>>>;

/// A loopback proxy in front of the shared server that forwards every chat
/// request as it is and records the server's reply: the usage a hint must
/// carry is the usage the server reported for the stage's own request, not
/// for a second one (a repeated request can decode differently at a near
/// tie, whatever the sampling settings). Returns the proxy's base URL.
async fn recording_proxy() -> (String, Exchanges) {
    use axum::extract::State;
    use axum::routing::post;
    let seen: Exchanges = Arc::default();
    let upstream = format!("{}/chat/completions", local_llm());
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(
                |State((upstream, seen)): State<(String, Exchanges)>, body: axum::body::Bytes| async move {
                    let reply = reqwest::Client::new()
                        .post(&upstream)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .timeout(Duration::from_secs(300))
                        .send()
                        .await
                        .unwrap();
                    let status = reply.status().as_u16();
                    let bytes = reply.bytes().await.unwrap();
                    if let (Ok(request), Ok(answer)) = (
                        serde_json::from_slice::<Value>(&body),
                        serde_json::from_slice::<Value>(&bytes),
                    ) {
                        seen.lock().unwrap().push((request, answer));
                    }
                    axum::response::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(bytes))
                        .unwrap()
                },
            ),
        )
        .with_state((upstream, seen.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), seen)
}

async fn hints_in(config: &Config) -> Vec<Hint> {
    common::hints_in(config, &config.hints.output_topic).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stage_1_hints_from_a_real_llama_cpp_server_carry_the_usage_it_reported() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "local-failed", "local-hints");
    config.llm = llm_config(&[]);
    common::create_hints_topics(&config, 1).await;
    let producer = create_producer(&config).unwrap();
    let sent: Vec<Value> = (0..3).map(short_trajectory).collect();
    for t in &sent {
        let key = format!("run-local/1/{}", t["instance_id"].as_str().unwrap());
        common::send(
            &producer,
            &config.hints.input_topic,
            &key,
            t.to_string().as_bytes(),
        )
        .await;
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let (proxy, exchanges) = recording_proxy().await;
    let through_proxy = LlmEnv {
        openai_base_url: Some(proxy),
        ..LlmEnv::default()
    };
    let stage = HintStage::build(config.clone(), &through_proxy).await.unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let hints = loop {
        let hints = hints_in(&config).await;
        if hints.len() >= sent.len() {
            break hints;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 3 hints: {hints:?}",
            hints.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    running.stop().await;
    for t in &sent {
        let hint = hints
            .iter()
            .find(|h| h.instance_id == t["instance_id"].as_str().unwrap())
            .unwrap();
        assert_eq!(hint.category, HintCategory::LlmSynthesized, "{hint:?}");
        assert_eq!(hint.model.as_deref(), Some(MODEL));
        assert!(!hint.hint.trim().is_empty());
        // The server's reply to the stage's own request for this
        // trajectory, as the proxy saw it cross the wire.
        let t: FailedTrajectory = serde_json::from_value(t.clone()).unwrap();
        let exchanges = exchanges.lock().unwrap().clone();
        let (request, reply) = exchanges
            .iter()
            .rev()
            .find(|(request, _)| request.to_string().contains(&t.task_prompt))
            .unwrap_or_else(|| panic!("no request for {} reached the server", t.instance_id));
        let version = PromptVersion::V3;
        assert_eq!(request["messages"][0]["content"], version.system_prompt());
        assert_eq!(request["messages"][1]["content"], version.user_message(&t));
        let text = reply["choices"][0]["message"]["content"].as_str().unwrap().trim();
        let input = reply["usage"]["prompt_tokens"].as_u64().unwrap();
        let output = reply["usage"]["completion_tokens"].as_u64().unwrap();
        assert_eq!(
            hint.usage.input_tokens, input,
            "prompt tokens of {}",
            t.instance_id
        );
        assert_eq!(
            hint.usage.output_tokens, output,
            "completion tokens of {}",
            t.instance_id
        );
        assert!(input > 100 && output > 0 && output <= u64::from(MAX_TOKENS));
        assert_eq!(hint.hint, text);
        assert_eq!(hint.cost_usd, 0.0, "a local model has no price");
    }
}

/// The status of each attempt, in order.
#[derive(Default)]
struct Attempts {
    statuses: Mutex<Vec<String>>,
    fits: Mutex<Vec<usize>>,
}

impl SynthObserver for Attempts {
    fn attempt(&self, _: &str, status: &str, _: Duration) {
        self.statuses.lock().unwrap().push(status.to_string());
    }
    fn retry(&self, _: &str, _: &str) {}
    fn calls_in_flight(&self, _: usize) {}
    fn prompt_fitted(&self, _: &str, chars_dropped: usize) {
        self.fits.lock().unwrap().push(chars_dropped);
    }
}

#[tokio::test]
async fn a_long_trajectory_is_fitted_to_a_2048_token_window_and_hinted_by_the_model() {
    let t = super::context_window::long_trajectory("");
    // 1. The window configured: fitted before sending, answered at once.
    let attempts = Arc::new(Attempts::default());
    let synth = Synthesizer::new(&llm_config(&[(MODEL, WINDOW)]), &env())
        .unwrap()
        .with_observer(attempts.clone());
    let s = synth.synthesize(&t).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{s:?}");
    assert_eq!(s.failure_reason, None);
    assert_eq!(*attempts.statuses.lock().unwrap(), ["ok"]);
    let fits = attempts.fits.lock().unwrap().clone();
    assert!(fits.len() == 1 && fits[0] > 30_000, "{fits:?}");
    assert!(
        s.usage.input_tokens + u64::from(MAX_TOKENS) <= u64::from(WINDOW),
        "the server counted {} prompt tokens",
        s.usage.input_tokens
    );
    // 2. No window configured (the server does not report it): sent whole,
    // refused with the server's context-length error, refitted to half the
    // window it named, answered.
    let attempts = Arc::new(Attempts::default());
    let synth = Synthesizer::new(&llm_config(&[]), &env())
        .unwrap()
        .with_observer(attempts.clone());
    let s = synth.synthesize(&t).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{s:?}");
    assert_eq!(*attempts.statuses.lock().unwrap(), ["context_length", "ok"]);
    assert_eq!(attempts.fits.lock().unwrap().len(), 1);
}

/// A `hintstream record` file of `n` single-trajectory groups.
fn recorded_input(path: &Path, n: usize) {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let t = short_trajectory(i);
            RecordedMessage {
                topic: "rl.trajectories.failed".into(),
                partition: 0,
                offset: i as i64,
                timestamp: Some(1_764_000_000_000 + i as i64),
                key: Bytes::new(Some(format!("run-local/1/inst-{i}").into_bytes())),
                value: Bytes::new(Some(t.to_string().into_bytes())),
                headers: vec![],
            }
            .to_line()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

async fn eval(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
        common::without_llm_env(&mut command)
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_eval_report_recorded_from_the_real_server_plays_back_the_same() {
    const GROUPS: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("failed.jsonl");
    recorded_input(&input, GROUPS);
    let config = dir.path().join("smollm2.toml");
    std::fs::write(
        &config,
        format!(
            "[llm]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodels = [\"{MODEL}\"]\nmax_tokens = {MAX_TOKENS}\n\
             temperature = 0.0\ntimeout_secs = 300\nconcurrency = 1\n",
            local_llm()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["eval", "--input"].map(String::from).to_vec();
        a.push(input.display().to_string());
        a.extend(["--out".to_string(), out.display().to_string()]);
        a.extend(["--config".to_string(), config.display().to_string()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let report =
        || -> Report { serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap() };
    let recorded = eval(args(&[])).await;
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let r1 = report();
    let c = &r1.configs[0];
    assert_eq!(
        c.categories.get("llm_synthesized"),
        Some(&(GROUPS as u64)),
        "{c:?}"
    );
    assert_eq!((c.api_calls, c.cassette_played), (GROUPS as u64, 0));
    assert!(c.input_tokens > 0 && c.output_tokens > 0);
    let played = eval(args(&["--playback", "--strict"])).await;
    assert!(
        played.status.success(),
        "{}",
        String::from_utf8_lossy(&played.stderr)
    );
    let r2 = report();
    let c2 = &r2.configs[0];
    assert_eq!(
        (c2.api_calls, c2.cassette_played),
        (0, GROUPS as u64),
        "played, not sent"
    );
    assert_eq!(
        (c2.input_tokens, c2.output_tokens),
        (c.input_tokens, c.output_tokens)
    );
    let texts = |r: &Report| -> Vec<(String, String)> {
        r.hints
            .iter()
            .flat_map(|g| g.hints.iter().map(|h| (h.hint_id.clone(), h.hint.clone())))
            .collect()
    };
    assert_eq!(texts(&r1), texts(&r2), "the played hints are the recorded ones");
}
