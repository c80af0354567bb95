//! Load check of stage 1's synthesis path against a loopback Anthropic-style
//! server with controlled latency. Every hint is its own task (as in the
//! stage); the synthesizer's semaphore bounds LLM calls to C.
//!
//! 1. Fixed latency L: hints/s as a ratio to the ideal C / L (goal >= 0.9).
//! 2. Heavy-tailed latency (lognormal): hints/s against a batch-barrier
//!    baseline at the same C, which gathers C requests, waits for all, then
//!    starts the next C (goal >= 1.5).
//!
//! 3. Prompt caching off vs on (`caching_comparison`): dollars per 1,000
//!    hints from the usage the tests' loopback LLM reports (a cache write
//!    on the first request of a marked prefix of 1,024+ tokens, reads
//!    after), for today's prompt, a 2,000-token `system_context_file`
//!    (5-minute and 1-hour TTL), tasks that recur, and the OpenAI dialect.
//!
//! ```text
//! cargo run --release --example hint_load [-- C L_MS N]
//! cargo run --example hint_load -- caching [N]    # the caching part alone
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use hintstream::config::LlmConfig;
use hintstream::llm::synth::LlmEnv;
use hintstream::llm::Synthesizer;
use hintstream::messages::{FailedTrajectory, HintCategory};
use rand::Rng;

/// 0: fixed latency; 1: lognormal.
static MODE: AtomicU8 = AtomicU8::new(0);
static LATENCY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(100);

fn sample_latency() -> Duration {
    let l = LATENCY_MS.load(Ordering::Relaxed) as f64;
    if MODE.load(Ordering::Relaxed) == 0 {
        return Duration::from_secs_f64(l / 1e3);
    }
    // Lognormal with median L and sigma 1.2: a p99 about 16x the median.
    let mut rng = rand::rng();
    let z: f64 = {
        let (u1, u2): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    };
    Duration::from_secs_f64(l / 1e3 * (1.2 * z).exp())
}

async fn server() -> SocketAddr {
    let app = Router::new().route(
        "/v1/messages",
        post(|| async {
            tokio::time::sleep(sample_latency()).await;
            (
                [("content-type", "application/json")],
                r#"{"id":"msg","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Check the output format first."}],"stop_reason":"end_turn","usage":{"input_tokens":900,"output_tokens":40}}"#,
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn trajectory(i: usize) -> FailedTrajectory {
    serde_json::from_value(serde_json::json!({
        "schema_version": 1, "run_id": "load", "step": 1, "instance_id": format!("g{i}"),
        "trajectory_id": format!("t{i}"), "task_prompt": "Solve the task.", "chat_history": [], "reward": 0.0
    }))
    .expect("valid trajectory")
}

/// Every hint its own task, as in the stage.
async fn concurrent(synth: Arc<Synthesizer>, n: usize) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let synth = synth.clone();
            tokio::spawn(async move { synth.synthesize(&trajectory(i)).await })
        })
        .collect();
    for t in tasks {
        let s = t.await.expect("task");
        assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// Gather C, wait for all C, then the next C.
async fn batch_barrier(synth: Arc<Synthesizer>, n: usize, c: usize) -> f64 {
    let started = Instant::now();
    let mut i = 0;
    while i < n {
        let batch: Vec<_> = (i..(i + c).min(n))
            .map(|j| {
                let synth = synth.clone();
                tokio::spawn(async move { synth.synthesize(&trajectory(j)).await })
            })
            .collect();
        for t in batch {
            t.await.expect("task");
        }
        i += c;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    if std::env::args().nth(1).as_deref() == Some("caching") {
        let n = std::env::args()
            .nth(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or(1000);
        caching::comparison(n).await;
        return;
    }
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let c = args.first().copied().unwrap_or(20);
    let l_ms = args.get(1).copied().unwrap_or(100);
    let n = args.get(2).copied().unwrap_or(1000);
    LATENCY_MS.store(l_ms as u64, Ordering::Relaxed);
    let addr = server().await;
    let config = LlmConfig {
        concurrency: c,
        timeout_secs: 120.0,
        ..LlmConfig::default()
    };
    let env = LlmEnv {
        anthropic_api_key: Some("load-test".into()),
        anthropic_base_url: Some(format!("http://{addr}")),
        ..LlmEnv::default()
    };
    let synth = Arc::new(Synthesizer::new(&config, &env).expect("synthesizer"));
    // Warm the connection pool.
    let _ = concurrent(synth.clone(), c).await;

    MODE.store(0, Ordering::Relaxed);
    let fixed = concurrent(synth.clone(), n).await;
    let ideal = c as f64 / (l_ms as f64 / 1e3);

    MODE.store(1, Ordering::Relaxed);
    let tail_n = n / 2;
    let heavy = concurrent(synth.clone(), tail_n).await;
    let barrier = batch_barrier(synth.clone(), tail_n, c).await;

    println!("C={c} L={l_ms}ms N={n}");
    println!("{:<44} {:>10} {:>10}", "scenario", "hints/s", "ratio");
    println!(
        "{:<44} {:>10.1} {:>10.3}",
        format!("fixed latency vs ideal C/L = {ideal:.0}/s"),
        fixed,
        fixed / ideal
    );
    println!(
        "{:<44} {:>10.1} {:>10}",
        "heavy-tailed, batch-barrier baseline", barrier, "1.000"
    );
    println!(
        "{:<44} {:>10.1} {:>10.3}",
        "heavy-tailed, hintstream (no barrier)",
        heavy,
        heavy / barrier
    );
    println!();
    caching::comparison(n).await;
}

/// The tests' loopback LLM, which reports prompt cache usage as the
/// providers do.
#[path = "../tests/it/common/llm_server.rs"]
mod llm_server;

/// Prompt caching off vs on, in dollars per 1,000 hints.
mod caching {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use hintstream::config::{CacheTtl, LlmConfig};
    use hintstream::llm::synth::LlmEnv;
    use hintstream::llm::{Synthesis, Synthesizer};
    use hintstream::messages::{FailedTrajectory, HintCategory};

    use super::llm_server::{Behavior, LlmServer};

    const KEY: &str = "load-test";
    /// Calls in flight (the default `llm.concurrency`).
    const CONCURRENCY: usize = 20;
    /// The loopback's latency: a request arriving while the one that writes
    /// its prefix is in flight misses the cache, as on the real APIs.
    const LATENCY: Duration = Duration::from_millis(200);

    /// A failed trajectory of task `task`: a task of about `task_len`
    /// characters and a short conversation, as a coding environment sends.
    fn trajectory(task: usize, i: usize, task_len: usize) -> FailedTrajectory {
        serde_json::from_value(serde_json::json!({
            "schema_version": 1, "run_id": "load", "step": 1, "instance_id": format!("g{i}"),
            "trajectory_id": format!("t{i}"),
            "task_prompt": format!("Task {task:05}: {}", "Make the date parser accept ISO week dates and keep the old formats working. ".repeat(task_len / 78)),
            "chat_history": [
                {"role": "assistant", "content": [{"type": "tool_use", "name": "bash", "input": {"cmd": "pytest -x tests/test_dates.py"}}]},
                {"role": "user", "content": [{"type": "tool_result", "content": format!("FAILED tests/test_dates.py::test_iso_week_{i} - AssertionError")}]},
            ],
            "reward": 0.0,
            "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['test_iso_week failed', 'test_roundtrip failed']\n<<< ERROR_ACCUMULATOR <<<",
            "tool_error_messages": ["bash: exit status 1"]
        }))
        .expect("valid trajectory")
    }

    /// About 2,000 tokens of tool documentation (8,000 bytes).
    fn context_file(dir: &Path) -> String {
        let line =
            "Tool `bash`: runs one shell command in the repository; quote paths, check the exit status.\n";
        let path = dir.join("tools.md");
        std::fs::write(&path, line.repeat(8_000 / line.len() + 1)).expect("write the context");
        path.display().to_string()
    }

    struct Scenario {
        name: &'static str,
        context: bool,
        ttl: CacheTtl,
        openai: bool,
        /// Hints per distinct task: 1 = every task once; 4 = four epochs.
        repeats: usize,
        /// Characters of each task prompt.
        task_len: usize,
        /// Hints between cache expiries (0: none expires): a training step
        /// whose hints come more than the TTL after the last step's finds
        /// the cache cold.
        per_step: usize,
    }

    /// `n` hints with caching `on`, a cold cache every `per_step` hints.
    async fn run(s: &Scenario, on: bool, n: usize, context: &str) -> Vec<Synthesis> {
        if s.per_step == 0 {
            return run_cold(s, on, n, context).await;
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            out.extend(run_cold(s, on, s.per_step.min(n - out.len()), context).await);
        }
        out
    }

    /// `n` hints with caching `on` from a cold cache, each its own task (C
    /// at once).
    async fn run_cold(s: &Scenario, on: bool, n: usize, context: &str) -> Vec<Synthesis> {
        // A fresh server per run: a cold cache.
        let server = LlmServer::start(Some(KEY)).await;
        // ~400 characters: ~100 output tokens, as a 2-5 sentence hint.
        server.default(Behavior::Text(
            "Run the failing test alone first. ".repeat(12).trim().to_string(),
            LATENCY,
        ));
        let config = LlmConfig {
            concurrency: CONCURRENCY,
            timeout_secs: 120.0,
            requests_per_minute: 0,
            prompt_cache: on,
            cache_ttl: s.ttl,
            system_context_file: if s.context { context.into() } else { String::new() },
            ..LlmConfig::default()
        };
        let env = if s.openai {
            LlmEnv {
                openai_api_key: Some(KEY.into()),
                openai_base_url: Some(format!("{}/v1", server.base_url())),
                ..LlmEnv::default()
            }
        } else {
            super::llm_server::anthropic_env(&server, KEY)
        };
        let synth = Arc::new(Synthesizer::new(&config, &env).expect("synthesizer"));
        let tasks = n.div_ceil(s.repeats);
        // Epoch after epoch: every task once, then again.
        let mut out = Vec::with_capacity(n);
        for epoch in 0..s.repeats {
            let handles: Vec<_> = (0..tasks)
                .map(|task| {
                    let synth = synth.clone();
                    let t = trajectory(task, epoch * tasks + task, s.task_len);
                    tokio::spawn(async move { synth.synthesize(&t).await })
                })
                .collect();
            for h in handles {
                let s = h.await.expect("task");
                assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
                out.push(s);
            }
        }
        out
    }

    /// Dollars per 1,000 hints, and the share of prompt tokens read from
    /// the cache.
    fn figures(hints: &[Synthesis]) -> (f64, f64) {
        let cost: f64 = hints.iter().map(|h| h.cost_usd).sum();
        let read: u64 = hints.iter().filter_map(|h| h.usage.cache_read_input_tokens).sum();
        let prompt: u64 = hints.iter().map(|h| h.usage.prompt_tokens()).sum();
        (
            cost / hints.len() as f64 * 1000.0,
            read as f64 / prompt.max(1) as f64,
        )
    }

    pub async fn comparison(n: usize) {
        let dir = tempfile::tempdir().expect("temp dir");
        let context = context_file(dir.path());
        let five = CacheTtl::FiveMinutes;
        let scenario = |name, context, ttl, openai, repeats, task_len, per_step| Scenario {
            name,
            context,
            ttl,
            openai,
            repeats,
            task_len,
            per_step,
        };
        let hour = CacheTtl::OneHour;
        let scenarios = [
            scenario(
                "Sonnet, today's prompt (no context)",
                false,
                five,
                false,
                1,
                1_200,
                0,
            ),
            scenario("Sonnet, 2,000-token context", true, five, false, 1, 1_200, 0),
            scenario(
                "Sonnet, 2,000-token context, ttl 1h",
                true,
                hour,
                false,
                1,
                1_200,
                0,
            ),
            scenario(
                "Sonnet, context, cold cache every 100",
                true,
                five,
                false,
                1,
                1_200,
                100,
            ),
            scenario(
                "Sonnet, context, cold cache every 20",
                true,
                five,
                false,
                1,
                1_200,
                20,
            ),
            scenario(
                "Sonnet, 4,700-char tasks, 4 epochs",
                false,
                five,
                false,
                4,
                4_700,
                0,
            ),
            scenario(
                "Sonnet, 2,000-token context, 4 epochs",
                true,
                five,
                false,
                4,
                1_200,
                0,
            ),
            scenario("gpt-4o-mini, 2,000-token context", true, five, true, 1, 1_200, 0),
        ];
        println!("prompt caching, {n} hints a run, {CONCURRENCY} calls in flight, dollars per 1,000 hints");
        println!(
            "{:<40} {:>9} {:>9} {:>8} {:>15}",
            "scenario", "off $", "on $", "saved", "read off / on"
        );
        for s in &scenarios {
            let (off, off_share) = figures(&run(s, false, n, &context).await);
            let (on, share) = figures(&run(s, true, n, &context).await);
            println!(
                "{:<40} {:>9.4} {:>9.4} {:>7.1}% {:>6.1}% / {:>4.1}%",
                s.name,
                off,
                on,
                (off - on) / off * 100.0,
                off_share * 100.0,
                share * 100.0
            );
        }
    }
}
