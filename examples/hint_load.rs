//! Load check of stage 1's synthesis path against a loopback Anthropic-style
//! server with controlled latency. Every hint is its own task (as in the
//! stage); the synthesizer's semaphore bounds LLM calls to C.
//!
//! 1. Fixed latency L: hints/s as a ratio to the ideal C / L (goal >= 0.9).
//! 2. Heavy-tailed latency (lognormal): hints/s against a batch-barrier
//!    baseline at the same C, which gathers C requests, waits for all, then
//!    starts the next C (goal >= 1.5).
//!
//!     cargo run --release --example hint_load [-- C L_MS N]

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
}
