//! The spend budget against a loopback server that bills every request at
//! its worst case (one input token per byte of prompt text, the whole
//! `max_tokens`), above the old bytes/3 estimate: 200 concurrent calls
//! overspend by at most one request's worst-case cost, also with hedged
//! requests on (every duplicate reserves like a call), and a body broken
//! after a 200 is charged its reservation.

use crate::common::llm_server;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hintstream::config::LlmConfig;
use hintstream::llm::limits::FRAMING_TOKENS;
use hintstream::llm::Synthesizer;
use hintstream::messages::{FailedTrajectory, HintCategory};
use llm_server::{Behavior, LlmServer};

const KEY: &str = "sk-budget-test";
/// The default model's list price (dollars per million tokens).
const INPUT_PER_MTOK: f64 = 3.0;
const OUTPUT_PER_MTOK: f64 = 15.0;

fn trajectory(marker: &str) -> FailedTrajectory {
    serde_json::from_value(serde_json::json!({
        "schema_version": 1, "run_id": "r", "step": 1, "instance_id": "i", "trajectory_id": "t",
        // Dense text: JSON and code tokenize near a byte a token.
        "task_prompt": format!("Fix {{\"k\":[1,2,3]}} in parse(). {marker}"),
        "chat_history": [{"role": "assistant", "content": "{\"x\":1,\"y\":[0,0]}"}],
        "reward": 0.0,
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['test_iso_week failed']\n<<< ERROR_ACCUMULATOR <<<",
        "verifier_error": null, "tool_error_messages": []
    }))
    .unwrap()
}

fn config(budget_usd_per_hour: f64) -> LlmConfig {
    LlmConfig {
        timeout_secs: 30.0,
        max_retries: 0,
        concurrency: 200,
        requests_per_minute: 0,
        budget_usd_per_hour,
        ..LlmConfig::default()
    }
}

/// The prompt-text bytes of a request for a trajectory marked like
/// `marker` (markers of one length give prompts of one length), from one
/// call without a budget to a server that bills the worst case.
async fn prompt_bytes(server: &LlmServer, marker: &str) -> u64 {
    server.on(marker, vec![Behavior::Billed("Probe.".into(), Duration::ZERO)]);
    let s = Synthesizer::new(&config(0.0), &llm_server::anthropic_env(server, KEY))
        .unwrap()
        .synthesize(&trajectory(marker))
        .await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    s.usage.input_tokens
}

fn usd(input_tokens: u64, output_tokens: u64) -> f64 {
    (input_tokens as f64 * INPUT_PER_MTOK + output_tokens as f64 * OUTPUT_PER_MTOK) / 1e6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_calls_billed_over_the_old_estimate_overspend_by_at_most_one_request() {
    let server = LlmServer::start(Some(KEY)).await;
    let max_tokens = u64::from(LlmConfig::default().max_tokens);
    let prompt = prompt_bytes(&server, "[probe]").await;
    let real = usd(prompt, max_tokens);
    let worst = usd(prompt + FRAMING_TOKENS, max_tokens);
    let old_estimate = usd(prompt / 3, max_tokens);
    assert!(real > old_estimate * 1.1, "the billed usage exceeds bytes/3");
    // Room for 40.5 real calls.
    let budget = 40.5 * real;

    // Every call waits at the server, so all 200 are in flight (reserved)
    // before the first one settles.
    server.on(
        "[call]",
        vec![Behavior::Billed(
            "Check the week numbering.".into(),
            Duration::from_millis(500),
        )],
    );
    let synth = Synthesizer::new(&config(budget), &llm_server::anthropic_env(&server, KEY)).unwrap();
    let t = trajectory("[call]");
    let results = futures::future::join_all((0..200).map(|_| synth.synthesize(&t))).await;

    let spent: f64 = results.iter().map(|s| s.cost_usd).sum();
    let synthesized = results
        .iter()
        .filter(|s| s.category == HintCategory::LlmSynthesized)
        .count();
    let exhausted = results
        .iter()
        .filter(|s| s.failure_reason.as_deref() == Some("budget_exhausted"))
        .count();
    eprintln!(
        "budget ${budget:.4}: {synthesized} calls spent ${spent:.4} (worst case ${worst:.5} a call), \
         {exhausted} refused"
    );
    assert_eq!(
        synthesized + exhausted,
        200,
        "every call either ran or was refused"
    );
    assert!(exhausted > 0, "the budget bound the calls");
    assert!(
        spent <= budget + worst + 1e-9,
        "overspent by ${:.5}, more than one request's worst case (${worst:.5})",
        spent - budget
    );
    assert!(
        synthesized >= 35,
        "the budget let only {synthesized} calls through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_hedged_requests_two_hundred_calls_still_overspend_by_at_most_one_request() {
    let server = LlmServer::start(Some(KEY)).await;
    let max_tokens = u64::from(LlmConfig::default().max_tokens);
    // "[probe]", "[warm]" and "[call]": prompts of one length.
    let prompt = prompt_bytes(&server, "[probe]").await;
    let real = usd(prompt, max_tokens);
    let worst = usd(prompt + FRAMING_TOKENS, max_tokens);
    // Quick calls first: the model's latency window fills (no hedge
    // before 20 calls), and what they spend is within the budget.
    const WARM: usize = 20;
    server.on("[warm]", vec![Behavior::Billed("Warm.".into(), Duration::ZERO)]);
    server.on(
        "[call]",
        vec![Behavior::Billed(
            "Check the week numbering.".into(),
            Duration::from_millis(500),
        )],
    );
    // Room for the warm-up and 40.5 real calls.
    let budget = (WARM as f64 + 40.5) * real;
    let count = Arc::new(super::hedging::HedgeCount::default());
    let hedged = LlmConfig {
        hedge: true,
        hedge_min_delay_ms: 50,
        // Many duplicates, to press on the budget.
        hedge_max_share: 0.5,
        ..config(budget)
    };
    let synth = Synthesizer::new(&hedged, &llm_server::anthropic_env(&server, KEY))
        .unwrap()
        .with_observer(count.clone());
    for _ in 0..WARM {
        let s = synth.synthesize(&trajectory("[warm]")).await;
        assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    }

    // 5 ms apart: each call's duplicate (50 ms in, while it waits at the
    // server) competes with the later calls for what is left.
    let t = trajectory("[call]");
    let results = futures::future::join_all((0..200u32).map(|i| {
        let (synth, t) = (&synth, &t);
        async move {
            tokio::time::sleep(Duration::from_millis(5) * i).await;
            synth.synthesize(t).await
        }
    }))
    .await;

    // Every request that reached the server is billed in full, cancelled
    // ones included.
    let requests = server
        .seen()
        .iter()
        .filter(|r| {
            let body = r.body.to_string();
            body.contains("[warm]") || body.contains("[call]")
        })
        .count();
    let billed = requests as f64 * real;
    let sent = count.sent.load(Ordering::SeqCst);
    let exhausted = results
        .iter()
        .filter(|s| s.failure_reason.as_deref() == Some("budget_exhausted"))
        .count();
    eprintln!(
        "budget ${budget:.4}: {requests} requests billed ${billed:.4} (worst case ${worst:.5} a call), \
         {sent} of them duplicates, {} hedges won, {exhausted} calls refused",
        count.won.load(Ordering::SeqCst)
    );
    assert!(sent > 0, "duplicates were sent");
    assert!(exhausted > 0, "the budget bound the calls");
    assert!(
        billed <= budget + worst + 1e-9,
        "overspent by ${:.5}, more than one request's worst case (${worst:.5})",
        billed - budget
    );
}

#[tokio::test]
async fn a_body_broken_after_a_200_is_charged_its_reservation() {
    let server = LlmServer::start(Some(KEY)).await;
    let max_tokens = u64::from(LlmConfig::default().max_tokens);
    // "[probe]", "[break]" and "[after]": prompts of one length.
    let prompt = prompt_bytes(&server, "[probe]").await;
    let worst = usd(prompt + FRAMING_TOKENS, max_tokens);
    server.on("[break]", vec![Behavior::BreakAfter200]);
    server.on(
        "[after]",
        vec![Behavior::Billed("A hint.".into(), Duration::ZERO)],
    );
    // Room for one reservation and a half.
    let synth = Synthesizer::new(&config(1.5 * worst), &llm_server::anthropic_env(&server, KEY)).unwrap();

    let broken = synth.synthesize(&trajectory("[break]")).await;
    assert_eq!(broken.category, HintCategory::LlmFailedStaticFallback);
    assert_eq!(broken.failure_reason.as_deref(), Some("body_broken"));
    // The broken call was billed: what is left is under one reservation.
    let after = synth.synthesize(&trajectory("[after]")).await;
    assert_eq!(
        after.failure_reason.as_deref(),
        Some("budget_exhausted"),
        "the broken call was charged nothing"
    );
    assert!(
        server
            .seen()
            .iter()
            .all(|r| !r.body.to_string().contains("[after]")),
        "no request was sent past the budget"
    );
}
