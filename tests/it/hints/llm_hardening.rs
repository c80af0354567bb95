//! The hardened LLM client over real HTTP on loopback: a redirect is never
//! followed (the key stays on its host), a body over the cap is cut off and
//! the client keeps working, a private CA is trusted through
//! `SSL_CERT_FILE`, `retry-after-ms` and HTTP-date `retry-after` are
//! honoured, 408 and 409 are retried as the official SDKs do, and no key
//! reaches a cassette, an error or a `Debug` line.

use crate::common::llm_server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hintstream::config::LlmConfig;
use hintstream::llm::cassette::{Cassette, CassetteMode};
use hintstream::llm::client::MAX_RESPONSE_BODY_BYTES;
use hintstream::llm::synth::LlmEnv;
use hintstream::llm::{LlmError, Synthesizer};
use hintstream::messages::{FailedTrajectory, HintCategory};
use llm_server::{Behavior, ConnectionCounter, LlmServer, Seen};

const KEY: &str = "sk-ant-api03-hardening-test-secret";

fn trajectory(marker: &str) -> FailedTrajectory {
    serde_json::from_value(serde_json::json!({
        "schema_version": 1, "run_id": "r", "step": 1, "instance_id": "i", "trajectory_id": "t",
        "task_prompt": format!("Fix the date parser. {marker}"),
        "chat_history": [{"role": "assistant", "content": "I ran pytest."}],
        "reward": 0.0,
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['test_iso_week failed']\n<<< ERROR_ACCUMULATOR <<<",
        "verifier_error": null, "tool_error_messages": []
    }))
    .unwrap()
}

fn config(timeout_secs: f64, max_retries: u32) -> LlmConfig {
    LlmConfig {
        timeout_secs,
        max_retries,
        ..LlmConfig::default()
    }
}

fn synth(server: &LlmServer, config: &LlmConfig) -> Synthesizer {
    Synthesizer::new(config, &llm_server::anthropic_env(server, KEY)).unwrap()
}

/// The requests that carried `marker`.
fn seen_with(server: &LlmServer, marker: &str) -> Vec<Seen> {
    server
        .seen()
        .into_iter()
        .filter(|s| s.body.to_string().contains(marker))
        .collect()
}

/// The wait between the first two requests that carried `marker`.
fn gap(server: &LlmServer, marker: &str) -> Duration {
    let seen = seen_with(server, marker);
    assert_eq!(seen.len(), 2, "{marker}: one retry expected");
    seen[1].at.duration_since(seen[0].at)
}

#[tokio::test]
async fn a_redirect_to_another_port_is_not_followed() {
    let elsewhere = ConnectionCounter::start().await;
    let server = LlmServer::start(Some(KEY)).await;
    let location = format!("http://{}/v1/messages", elsewhere.addr);
    let statuses = [307, 308, 301, 302, 303];
    for status in statuses {
        server.on(
            &format!("[redirect {status}]"),
            vec![Behavior::Redirect(status, location.clone())],
        );
    }
    let synth = synth(&server, &config(3.0, 2));
    for status in statuses {
        let marker = format!("[redirect {status}]");
        let s = synth.synthesize(&trajectory(&marker)).await;
        assert_eq!(
            elsewhere.connections(),
            0,
            "{status}: the redirect target was connected to; the key could have gone there"
        );
        assert_eq!(s.category, HintCategory::LlmFailedStaticFallback, "{status}");
        assert_eq!(s.failure_reason.as_deref(), Some("http_3xx"), "{status}");
        assert!(s.hint.contains("test_iso_week failed"), "{status}: {}", s.hint);
        assert_eq!(seen_with(&server, &marker).len(), 1, "a {status} is not retried");
    }
}

#[tokio::test]
async fn a_five_mib_body_is_rejected_and_the_client_keeps_working() {
    let server = LlmServer::start(Some(KEY)).await;
    server.on("[huge]", vec![Behavior::Huge(5 << 20)]);
    server.on(
        "[after]",
        vec![Behavior::Text("Check the week numbering.".into(), Duration::ZERO)],
    );
    let synth = synth(&server, &config(10.0, 2));
    let s = synth.synthesize(&trajectory("[huge]")).await;
    assert_eq!(s.category, HintCategory::LlmFailedStaticFallback);
    assert_eq!(s.failure_reason.as_deref(), Some("malformed_response"));
    assert_eq!(
        seen_with(&server, "[huge]").len(),
        1,
        "an oversized body is not retried"
    );
    // The same client, after the rejected body.
    let s = synth.synthesize(&trajectory("[after]")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    assert_eq!(s.hint, "Check the week numbering.");
}

#[tokio::test]
async fn a_body_just_under_the_cap_is_read() {
    let server = LlmServer::start(Some(KEY)).await;
    server.on("[big]", vec![Behavior::Huge(MAX_RESPONSE_BODY_BYTES - 64)]);
    // The hint whole (llm.max_hint_chars is not under test): the text
    // shows the body was read to its end.
    let whole = LlmConfig {
        max_hint_chars: MAX_RESPONSE_BODY_BYTES,
        ..config(10.0, 0)
    };
    let s = synth(&server, &whole).synthesize(&trajectory("[big]")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    assert!(s.hint.len() > MAX_RESPONSE_BODY_BYTES - 1024);
}

#[tokio::test]
async fn a_body_past_the_cap_is_cut_off_without_reading_to_its_end() {
    // 2 MiB, chunked (no content-length), and the body never ends: only a
    // client that stops at the cap answers before the timeout.
    let server = LlmServer::start(Some(KEY)).await;
    server.on("[endless]", vec![Behavior::Endless(2 << 20)]);
    let started = Instant::now();
    let s = synth(&server, &config(5.0, 0))
        .synthesize(&trajectory("[endless]"))
        .await;
    assert_eq!(s.failure_reason.as_deref(), Some("malformed_response"));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
}

/// A private CA and a server certificate for 127.0.0.1 signed by it, made
/// with the `openssl` CLI.
struct PrivateCa {
    ca_cert: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the openssl CLI runs (Debian: apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PrivateCa {
    fn generate(dir: &Path) -> PrivateCa {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-noenc",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=hintstream test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(dir, &ca);
        let mut csr = vec!["req"];
        csr.extend(ec);
        csr.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        openssl(dir, &csr);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
        PrivateCa {
            ca_cert: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
        }
    }
}

#[tokio::test]
async fn a_private_ca_is_trusted_through_ssl_cert_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = PrivateCa::generate(dir.path());
    let server = LlmServer::start_tls(Some(KEY), &ca.server_cert, &ca.server_key).await;
    assert!(server.base_url().starts_with("https://127.0.0.1:"));
    server.on(
        "[tls]",
        vec![Behavior::Text("Read the ISO 8601 rules.".into(), Duration::ZERO)],
    );

    // Without the CA: the handshake fails, no request is served.
    let untrusted = Synthesizer::new(&config(3.0, 0), &llm_server::anthropic_env(&server, KEY)).unwrap();
    let s = untrusted.synthesize(&trajectory("[tls]")).await;
    assert_eq!(s.category, HintCategory::LlmFailedStaticFallback);
    assert_eq!(s.failure_reason.as_deref(), Some("connect"));
    // The server notes the refused handshake on its own task.
    let deadline = Instant::now() + Duration::from_secs(3);
    while server.tls_rejected() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(server.tls_rejected() >= 1, "no TLS handshake was refused");
    assert!(server.seen().is_empty());

    // With SSL_CERT_FILE naming the CA (another CA first in the bundle).
    let other = tempfile::tempdir().unwrap();
    let other_ca = PrivateCa::generate(other.path());
    let bundle = dir.path().join("bundle.pem");
    let pem =
        std::fs::read_to_string(&other_ca.ca_cert).unwrap() + &std::fs::read_to_string(&ca.ca_cert).unwrap();
    std::fs::write(&bundle, pem).unwrap();
    let env = LlmEnv {
        ssl_cert_file: Some(bundle),
        ..llm_server::anthropic_env(&server, KEY)
    };
    let s = Synthesizer::new(&config(3.0, 0), &env)
        .unwrap()
        .synthesize(&trajectory("[tls]"))
        .await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    assert_eq!(s.hint, "Read the ISO 8601 rules.");
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["x-api-key"], KEY);
}

#[tokio::test]
async fn only_the_trusted_ca_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let ca = PrivateCa::generate(dir.path());
    let other = tempfile::tempdir().unwrap();
    let other_ca = PrivateCa::generate(other.path());
    let server = LlmServer::start_tls(Some(KEY), &ca.server_cert, &ca.server_key).await;
    let env = LlmEnv {
        ssl_cert_file: Some(other_ca.ca_cert.clone()),
        ..llm_server::anthropic_env(&server, KEY)
    };
    let s = Synthesizer::new(&config(3.0, 0), &env)
        .unwrap()
        .synthesize(&trajectory("[tls]"))
        .await;
    assert_eq!(s.failure_reason.as_deref(), Some("connect"));
    assert!(server.seen().is_empty());
}

#[test]
fn a_bad_ssl_cert_file_fails_the_client_at_start_up_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("gateway-ca.pem");
    let env = LlmEnv {
        anthropic_api_key: Some(KEY.into()),
        ssl_cert_file: Some(missing.clone()),
        ..LlmEnv::default()
    };
    let err = Synthesizer::new(&LlmConfig::default(), &env).unwrap_err();
    assert!(matches!(err, LlmError::CertFile { .. }), "{err:?}");
    assert!(err.to_string().contains(&missing.display().to_string()), "{err}");
}

#[test]
fn the_hint_stage_exits_2_on_a_bad_ssl_cert_file_before_any_broker() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("gateway-ca.pem");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hintstream"))
        .current_dir(dir.path())
        // Nothing listens on port 1: a stage that asked the broker first
        // would wait out its connect bound and exit 1.
        .args(["hints", "--bootstrap-servers", "127.0.0.1:1"])
        .env_remove("HINTSTREAM_BOOTSTRAP_SERVERS")
        .env_remove("OPENAI_API_KEY")
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SSL_CERT_FILE", &not_pem)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("SSL_CERT_FILE") && stderr.contains(&not_pem.display().to_string()),
        "{stderr}"
    );
    assert!(!stderr.contains(KEY) && !String::from_utf8_lossy(&out.stdout).contains(KEY));
}

#[tokio::test]
async fn retry_after_ms_is_honoured_before_retry_after() {
    let server = LlmServer::start(Some(KEY)).await;
    let ok = Behavior::Text("Use the edit tool.".into(), Duration::ZERO);
    let after = |ms: &str, s: &str| {
        Behavior::StatusWith(
            429,
            "rate_limit_error",
            vec![("retry-after-ms", ms.into()), ("retry-after", s.into())],
        )
    };
    // The milliseconds ask for longer than the seconds...
    server.on("[ms-long]", vec![after("1200", "0"), ok.clone()]);
    // ...and for shorter: a 30 s wait would run past the 6 s budget.
    server.on("[ms-short]", vec![after("100", "30"), ok]);
    let synth = synth(&server, &config(6.0, 2));
    let (long, short) = (trajectory("[ms-long]"), trajectory("[ms-short]"));
    let (long, short) = futures::join!(synth.synthesize(&long), synth.synthesize(&short));
    assert_eq!(
        long.category,
        HintCategory::LlmSynthesized,
        "{:?}",
        long.failure_reason
    );
    assert_eq!(
        short.category,
        HintCategory::LlmSynthesized,
        "{:?}",
        short.failure_reason
    );
    let long_gap = gap(&server, "[ms-long]");
    assert!(
        long_gap >= Duration::from_millis(1200),
        "retried after {long_gap:?}"
    );
    let short_gap = gap(&server, "[ms-short]");
    assert!(short_gap < Duration::from_secs(3), "retried after {short_gap:?}");
}

#[tokio::test]
async fn an_http_date_retry_after_is_honoured() {
    let server = LlmServer::start(Some(KEY)).await;
    // Whole seconds on the wire: the wait is between 3 and 4 s.
    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(4));
    server.on(
        "[date]",
        vec![
            Behavior::StatusWith(503, "overloaded_error", vec![("retry-after", date)]),
            Behavior::Text("Mind the leap year.".into(), Duration::ZERO),
        ],
    );
    let s = synth(&server, &config(8.0, 2))
        .synthesize(&trajectory("[date]"))
        .await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    let gap = gap(&server, "[date]");
    assert!(gap >= Duration::from_millis(2500), "retried after {gap:?}");
}

#[tokio::test]
async fn retries_408_and_409_but_not_400() {
    let server = LlmServer::start(Some(KEY)).await;
    let ok = Behavior::Text("Start from the failing test.".into(), Duration::ZERO);
    server.on(
        "[408]",
        vec![Behavior::Status(408, "timeout_error", None), ok.clone()],
    );
    server.on("[409]", vec![Behavior::Status(409, "conflict", None), ok.clone()]);
    server.on(
        "[400]",
        vec![Behavior::Status(400, "invalid_request_error", None), ok],
    );
    let synth = synth(&server, &config(5.0, 2));
    for marker in ["[408]", "[409]"] {
        let s = synth.synthesize(&trajectory(marker)).await;
        assert_eq!(
            s.category,
            HintCategory::LlmSynthesized,
            "{marker}: {:?}",
            s.failure_reason
        );
        assert_eq!(seen_with(&server, marker).len(), 2, "{marker}");
    }
    let s = synth.synthesize(&trajectory("[400]")).await;
    assert_eq!(s.category, HintCategory::LlmFailedStaticFallback);
    assert_eq!(s.failure_reason.as_deref(), Some("http_400"));
    assert_eq!(seen_with(&server, "[400]").len(), 1, "a 400 is not retried");
}

#[tokio::test]
async fn no_key_reaches_the_cassette_the_error_or_debug() {
    let server = LlmServer::start(Some(KEY)).await;
    server.on("[echo]", vec![Behavior::EchoKey]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calls.jsonl");
    let cassette = Arc::new(Cassette::open(&path, CassetteMode::Record).unwrap());
    let synth = synth(&server, &config(3.0, 0)).with_cassette(cassette.clone());
    let s = synth.synthesize(&trajectory("[echo]")).await;
    assert_eq!(s.failure_reason.as_deref(), Some("http_401"));
    assert_eq!(cassette.appended(), 1);
    let recorded = std::fs::read_to_string(&path).unwrap();
    assert!(recorded.contains("invalid x-api-key: <redacted>"), "{recorded}");
    for (what, text) in [
        ("cassette", recorded),
        ("synthesis", format!("{s:?}")),
        ("synthesizer", format!("{synth:?}")),
        ("cassette Debug", format!("{cassette:?}")),
        ("env", format!("{:?}", llm_server::anthropic_env(&server, KEY))),
    ] {
        assert!(!text.contains(KEY), "the key is in the {what}: {text}");
    }
}

#[tokio::test]
async fn a_key_where_the_error_message_is_cut_leaves_no_part_of_itself() {
    let server = LlmServer::start(Some(KEY)).await;
    // The key starts at char 290 of the message, which is cut at 300.
    server.on("[echo290]", vec![Behavior::EchoKeyAt(290)]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calls.jsonl");
    let cassette = Arc::new(Cassette::open(&path, CassetteMode::Record).unwrap());
    let synth = synth(&server, &config(3.0, 0)).with_cassette(cassette.clone());
    let s = synth.synthesize(&trajectory("[echo290]")).await;
    assert_eq!(s.failure_reason.as_deref(), Some("http_401"));
    assert_eq!(cassette.appended(), 1);
    let recorded = std::fs::read_to_string(&path).unwrap();
    assert!(recorded.contains("<redacted>"), "{recorded}");
    // No 8 characters in a row of the key, wherever they start.
    let parts: Vec<&str> = (0..=KEY.len() - 8).map(|i| &KEY[i..i + 8]).collect();
    for (what, text) in [("cassette", recorded), ("synthesis", format!("{s:?}"))] {
        for part in &parts {
            assert!(
                !text.contains(part),
                "{part:?} of the key is in the {what}: {text}"
            );
        }
    }
}
