//! A user and password in a base URL (`ANTHROPIC_BASE_URL`, `[llm]
//! base_url`) are used, and shown nowhere: not in an error or failure
//! text, a cassette, a `Debug` line, a log line of the binary at debug
//! level, its report, or `hintstream config`, while the loopback server
//! answers with broken bodies.

use crate::common;
use crate::common::llm_server;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use hintstream::config::LlmConfig;
use hintstream::llm::cassette::{Cassette, CassetteMode};
use hintstream::llm::synth::LlmEnv;
use hintstream::llm::Synthesizer;
use hintstream::messages::HintCategory;
use llm_server::{Behavior, LlmServer};

const KEY: &str = "sk-ant-api03-url-secrets-test-key";
const URL_USER: &str = "hs-url-user";
const URL_PASSWORD: &str = "hs-url-password-s3cret";

/// The server's base URL with a user and password in it.
fn with_user_info(server: &LlmServer) -> String {
    server
        .base_url()
        .replacen("://", &format!("://{URL_USER}:{URL_PASSWORD}@"), 1)
}

fn trajectory(marker: &str) -> serde_json::Value {
    serde_json::json!({
        "schema_version": 1, "run_id": "r", "step": 1, "instance_id": format!("i{marker}"),
        "trajectory_id": "t", "task_prompt": format!("Fix the date parser. {marker}"),
        "chat_history": [{"role": "assistant", "content": "I ran pytest."}],
        "reward": 0.0,
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['test_iso_week failed']\n<<< ERROR_ACCUMULATOR <<<",
    })
}

/// Asserts that no secret (nor the key) is in `text`.
fn secret_free(what: &str, text: &str) {
    for secret in [URL_USER, URL_PASSWORD, KEY] {
        assert!(!text.contains(secret), "{secret:?} is in the {what}:\n{text}");
    }
}

fn broken_bodies(server: &LlmServer) {
    server.on("[broken]", vec![Behavior::BreakAfter200]);
    server.on("[malformed]", vec![Behavior::Malformed]);
}

#[tokio::test]
async fn a_user_and_password_in_the_base_url_reach_no_error_text_cassette_or_debug_line() {
    let server = LlmServer::start(Some(KEY)).await;
    broken_bodies(&server);
    let env = LlmEnv {
        anthropic_api_key: Some(KEY.into()),
        anthropic_base_url: Some(with_user_info(&server)),
        ..LlmEnv::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calls.jsonl");
    let cassette = Arc::new(Cassette::open(&path, CassetteMode::Record).unwrap());
    let config = LlmConfig {
        timeout_secs: 3.0,
        max_retries: 0,
        ..LlmConfig::default()
    };
    let synth = Synthesizer::new(&config, &env)
        .unwrap()
        .with_cassette(cassette.clone());
    for (marker, reason) in [("[broken]", "body_broken"), ("[malformed]", "malformed_response")] {
        let t = serde_json::from_value(trajectory(marker)).unwrap();
        let s = synth.synthesize(&t).await;
        assert_eq!(s.category, HintCategory::LlmFailedStaticFallback, "{marker}");
        assert_eq!(s.failure_reason.as_deref(), Some(reason), "{marker}");
        secret_free("synthesis", &format!("{s:?}"));
    }
    // The credentials were sent, as the URL's user info is: basic auth.
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|s| s.headers["authorization"].starts_with("Basic ")));
    assert_eq!(cassette.appended(), 2);
    let recorded = std::fs::read_to_string(&path).unwrap();
    assert!(recorded.contains("body_broken"), "{recorded}");
    secret_free("cassette", &recorded);
    secret_free("synthesizer", &format!("{synth:?}"));
    secret_free("env", &format!("{env:?}"));
}

/// Runs `hintstream` with `args` off the async workers (the loopback
/// server runs on them), with every log line at debug level.
async fn hintstream(args: Vec<String>, base_url: Option<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
        common::without_llm_env(&mut command)
            .env_remove("ANTHROPIC_BASE_URL")
            .env("RUST_LOG", "debug")
            .env("HINTSTREAM_LLM__MAX_RETRIES", "0")
            .args(&args);
        if let Some(url) = base_url {
            command
                .env("ANTHROPIC_API_KEY", KEY)
                .env("ANTHROPIC_BASE_URL", url);
        }
        command.output().unwrap()
    })
    .await
    .unwrap()
}

fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_and_password_in_the_base_url_reach_no_log_line_report_or_shown_config() {
    let server = LlmServer::start(Some(KEY)).await;
    broken_bodies(&server);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("failed.jsonl");
    let lines: Vec<String> = ["[broken]", "[malformed]"]
        .iter()
        .map(|m| trajectory(m).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("out");
    let args = vec![
        "eval".into(),
        "--input".into(),
        path_arg(&input),
        "--out".into(),
        path_arg(&out),
    ];
    let run = hintstream(args, Some(with_user_info(&server))).await;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    // One call each, both failed.
    assert_eq!(server.seen().len(), 2, "{stderr}");
    assert!(
        stderr.contains("body_broken"),
        "the failures are logged: {stderr}"
    );
    secret_free("log", &stderr);
    secret_free("stdout", &String::from_utf8_lossy(&run.stdout));
    for file in ["report.json", "index.html", "cassette.jsonl"] {
        secret_free(file, &std::fs::read_to_string(out.join(file)).unwrap());
    }

    // The same URL as `[llm] base_url`, shown by `hintstream config`.
    let config = dir.path().join("hintstream.toml");
    std::fs::write(
        &config,
        format!("[llm]\nbase_url = \"{}/v1\"\n", with_user_info(&server)),
    )
    .unwrap();
    let shown = hintstream(vec!["config".into(), "--config".into(), path_arg(&config)], None).await;
    let text = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(
        shown.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(
        text.contains("base_url = \"http://<redacted>@127.0.0.1:"),
        "{text}"
    );
    secret_free("shown config", &text);
}
