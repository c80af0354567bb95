//! Under `[llm] prompt_version = "reference"`, the loopback LLM receives the
//! reference trainer's system prompt and user message byte for byte for
//! every fixture of schemas/fixtures/reference_prompts.json (the joined
//! text of the system blocks where prompt caching splits it), with its
//! max_tokens and temperature.

use crate::common::llm_server;

use std::path::PathBuf;
use std::time::Duration;

use hintstream::config::LlmConfig;
use hintstream::llm::Synthesizer;
use hintstream::messages::{decode, DecodeLimits, FailedTrajectory, HintCategory, OrderedJson};
use llm_server::{Behavior, LlmServer};
use serde_json::Value;

fn fixtures() -> (Value, Vec<Vec<u8>>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas/fixtures/reference_prompts.json");
    let text = std::fs::read_to_string(path).unwrap();
    let ordered: OrderedJson = serde_json::from_str(&text).unwrap();
    let Some(OrderedJson::Array(cases)) = ordered.get("cases") else {
        panic!("no cases")
    };
    let payloads = cases
        .iter()
        .map(|case| serde_json::to_vec(case.get("trajectory").unwrap()).unwrap())
        .collect();
    (serde_json::from_str(&text).unwrap(), payloads)
}

/// A string, or the joined text of content blocks.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        other => panic!("not text: {other}"),
    }
}

#[tokio::test]
async fn the_loopback_llm_receives_the_reference_prompt_byte_for_byte_for_every_fixture() {
    let server = LlmServer::start(Some("sk-test-key")).await;
    server.default(Behavior::Text(
        "Re-check the booking time.".into(),
        Duration::ZERO,
    ));
    let mut config = serde_json::to_value(LlmConfig::default()).unwrap();
    config["prompt_version"] = "reference".into();
    config["timeout_secs"] = 5.0.into();
    let config: LlmConfig = serde_json::from_value(config).expect("[llm] prompt_version is not wired yet");
    let synth = Synthesizer::new(&config, &llm_server::anthropic_env(&server, "sk-test-key")).unwrap();

    let (prompts, payloads) = fixtures();
    let cases = prompts["cases"].as_array().unwrap();
    for (case, bytes) in cases.iter().zip(&payloads) {
        let t: FailedTrajectory = decode(bytes, DecodeLimits::default()).unwrap();
        let s = synth.synthesize(&t).await;
        assert_eq!(s.category, HintCategory::LlmSynthesized, "{}", case["name"]);
    }
    let seen = server.seen();
    assert_eq!(seen.len(), cases.len());
    for (case, request) in cases.iter().zip(&seen) {
        let name = &case["name"];
        assert_eq!(
            text_of(&request.body["system"]),
            prompts["system"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(request.body["messages"][0]["role"], "user", "{name}");
        assert_eq!(
            text_of(&request.body["messages"][0]["content"]),
            case["user"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(request.body["max_tokens"], prompts["max_tokens"], "{name}");
        assert_eq!(request.body["temperature"], prompts["temperature"], "{name}");
    }
}
