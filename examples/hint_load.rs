//! Load check of stage 1's synthesis path against a loopback Anthropic-style
//! server with controlled latency. Every hint is its own task (as in the
//! stage); the synthesizer's semaphore bounds LLM calls to C.
//!
//! 1. Fixed latency L: hints/s as a ratio to the ideal C / L (goal >= 0.9).
//! 2. Heavy-tailed latency (lognormal): hints/s against a batch-barrier
//!    baseline at the same C, which gathers C requests, waits for all, then
//!    starts the next C (goal >= 1.5).
//! 3. Side by side, off vs on, each pair on one seeded latency process:
//!    hedged requests (`llm.hedge`) on stragglers (3% of calls 20x slower
//!    than a lognormal base of sigma 0.3) and on a lognormal tail of sigma
//!    1.2: p50/p95/p99 hint latency, extra requests, and dollars per 1,000
//!    hints from the usage the server reports (every request it received
//!    billed, cancelled duplicates included). H hints a run, 100 in flight,
//!    after 200 unmeasured ones that fill the latency window.
//!
//! 4. Prompt caching off vs on (`caching_comparison`): dollars per 1,000
//!    hints from the usage the tests' loopback LLM reports (a cache write
//!    on the first request of a marked prefix of 1,024+ tokens, reads
//!    after), for today's prompt, a 2,000-token `system_context_file`
//!    (5-minute and 1-hour TTL), tasks that recur, and the OpenAI dialect.
//!
//! ```text
//! cargo run --release --example hint_load [-- C L_MS N H]
//! cargo run --example hint_load -- caching [N]    # the caching part alone
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use hintstream::config::LlmConfig;
use hintstream::llm::synth::LlmEnv;
use hintstream::llm::Synthesizer;
use hintstream::messages::{FailedTrajectory, HintCategory};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The usage every reply reports.
const INPUT_TOKENS: u64 = 900;
const OUTPUT_TOKENS: u64 = 40;
/// The default model's list price (dollars per million tokens).
const INPUT_PER_MTOK: f64 = 3.0;
const OUTPUT_PER_MTOK: f64 = 15.0;

/// The server's latency process.
#[derive(Debug, Clone, Copy)]
enum Process {
    Fixed(Duration),
    /// `median * exp(sigma * z)`.
    Lognormal {
        median: Duration,
        sigma: f64,
    },
    /// Lognormal, and a `share` of the calls `factor` times slower.
    Stragglers {
        median: Duration,
        sigma: f64,
        share: f64,
        factor: f64,
    },
}

/// The latency draws, seeded, and the requests they served.
struct Latency {
    process: Process,
    rng: StdRng,
    requests: u64,
}

static LATENCY: Mutex<Option<Latency>> = Mutex::new(None);

/// Sets the latency process, its draws restarted from `seed` and the
/// request count zeroed.
fn set_latency(process: Process, seed: u64) {
    *LATENCY.lock().unwrap_or_else(|p| p.into_inner()) = Some(Latency {
        process,
        rng: StdRng::seed_from_u64(seed),
        requests: 0,
    });
}

/// Requests served since the process was last set.
fn requests() -> u64 {
    LATENCY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map_or(0, |l| l.requests)
}

fn lognormal(rng: &mut StdRng, median: Duration, sigma: f64) -> Duration {
    // Box-Muller.
    let (u1, u2): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    median.mul_f64((sigma * z).exp())
}

/// One request: counted, and its latency drawn.
fn sample_latency() -> Duration {
    let mut guard = LATENCY.lock().unwrap_or_else(|p| p.into_inner());
    let Some(l) = guard.as_mut() else {
        return Duration::ZERO;
    };
    l.requests += 1;
    match l.process {
        Process::Fixed(d) => d,
        Process::Lognormal { median, sigma } => lognormal(&mut l.rng, median, sigma),
        Process::Stragglers {
            median,
            sigma,
            share,
            factor,
        } => {
            let base = lognormal(&mut l.rng, median, sigma);
            if l.rng.random_bool(share) {
                base.mul_f64(factor)
            } else {
                base
            }
        }
    }
}

/// Every reply: a hint and its usage ([`INPUT_TOKENS`], [`OUTPUT_TOKENS`]).
const REPLY: &str = r#"{"id":"msg","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Check the output format first."}],"stop_reason":"end_turn","usage":{"input_tokens":900,"output_tokens":40}}"#;

async fn server() -> SocketAddr {
    let app = Router::new().route(
        "/v1/messages",
        post(|| async {
            tokio::time::sleep(sample_latency()).await;
            ([("content-type", "application/json")], REPLY)
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

/// One run's figures.
struct Figures {
    p50_ms: u64,
    p95_ms: u64,
    p99_ms: u64,
    /// Requests the server got per hint, minus one.
    extra: f64,
    /// From the usage the server reports, every request billed.
    usd_per_1000_hints: f64,
}

/// Off vs on, one row per latency process.
struct Comparison {
    title: &'static str,
    rows: Vec<(String, Figures, Figures)>,
}

impl Comparison {
    fn print(&self) {
        println!();
        println!("{}", self.title);
        println!(
            "{:<34} {:>4} {:>8} {:>8} {:>8} {:>8} {:>10}",
            "latency", "", "p50 ms", "p95 ms", "p99 ms", "extra", "$/1k hints"
        );
        for (name, off, on) in &self.rows {
            for (label, f) in [("off", off), ("on", on)] {
                println!(
                    "{:<34} {:>4} {:>8} {:>8} {:>8} {:>7.2}% {:>10.3}",
                    name,
                    label,
                    f.p50_ms,
                    f.p95_ms,
                    f.p99_ms,
                    100.0 * f.extra,
                    f.usd_per_1000_hints
                );
            }
            println!(
                "{:<34} {:>4} p99/p50 {:.2} -> {:.2}; p99 on/off {:.2}",
                name,
                "",
                off.p99_ms as f64 / off.p50_ms as f64,
                on.p99_ms as f64 / on.p50_ms as f64,
                on.p99_ms as f64 / off.p99_ms as f64
            );
        }
    }
}

/// Hints in flight in the side-by-side runs.
const IN_FLIGHT: usize = 100;
/// Unmeasured hints first: they fill the latency window, as a running
/// stage has.
const WARM_UP: usize = 200;

/// Synthesizes `n` hints, [`IN_FLIGHT`] at a time; their latencies, sorted.
async fn latencies(synth: Arc<Synthesizer>, n: usize) -> Vec<u64> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (synth, next) = (synth.clone(), next.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    let s = synth.synthesize(&trajectory(out.len())).await;
                    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
                    out.push(s.latency_ms);
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.expect("task"));
    }
    all.sort_unstable();
    all
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    let rank = (sorted.len() as f64 * q).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

/// One run of `n` measured hints on `process` (seeded alike for every
/// run) with `config`.
async fn measure(config: &LlmConfig, env: &LlmEnv, process: Process, n: usize) -> Figures {
    let synth = Arc::new(Synthesizer::new(config, env).expect("synthesizer"));
    set_latency(process, 1);
    latencies(synth.clone(), WARM_UP).await;
    set_latency(process, 2);
    let sorted = latencies(synth, n).await;
    let requests = requests();
    let usd_per_request =
        (INPUT_TOKENS as f64 * INPUT_PER_MTOK + OUTPUT_TOKENS as f64 * OUTPUT_PER_MTOK) / 1e6;
    Figures {
        p50_ms: percentile(&sorted, 0.50),
        p95_ms: percentile(&sorted, 0.95),
        p99_ms: percentile(&sorted, 0.99),
        extra: requests as f64 / n as f64 - 1.0,
        usd_per_1000_hints: requests as f64 * usd_per_request / n as f64 * 1000.0,
    }
}

/// Hedged requests off vs on, on stragglers and on a sigma 1.2 lognormal
/// tail, median `l_ms`; `hedge_min_delay_ms` scaled down with it.
async fn hedging(env: &LlmEnv, l_ms: u64, n: usize) -> Comparison {
    let median = Duration::from_millis(l_ms);
    let processes = [
        (
            "stragglers: 3% x20, sigma 0.3",
            Process::Stragglers {
                median,
                sigma: 0.3,
                share: 0.03,
                factor: 20.0,
            },
        ),
        ("lognormal sigma 1.2", Process::Lognormal { median, sigma: 1.2 }),
    ];
    let off = LlmConfig {
        concurrency: 2 * IN_FLIGHT,
        requests_per_minute: 0,
        timeout_secs: 120.0,
        hedge_min_delay_ms: l_ms / 2,
        ..LlmConfig::default()
    };
    let on = LlmConfig {
        hedge: true,
        ..off.clone()
    };
    let mut rows = Vec::new();
    for (name, process) in processes {
        let without = measure(&off, env, process, n).await;
        let with = measure(&on, env, process, n).await;
        rows.push((format!("{name} (median {l_ms} ms)"), without, with));
    }
    Comparison {
        title: "hedged requests (llm.hedge, p95 delay, hedge_max_share 0.05), off vs on",
        rows,
    }
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
    let h = args.get(3).copied().unwrap_or(2000);
    let addr = server().await;
    let config = LlmConfig {
        concurrency: c,
        timeout_secs: 120.0,
        // The default 600 a minute would bound the throughput measured.
        requests_per_minute: 0,
        ..LlmConfig::default()
    };
    let env = LlmEnv {
        anthropic_api_key: Some("load-test".into()),
        anthropic_base_url: Some(format!("http://{addr}")),
        ..LlmEnv::default()
    };
    let synth = Arc::new(Synthesizer::new(&config, &env).expect("synthesizer"));
    let latency = Duration::from_millis(l_ms as u64);
    // Warm the connection pool.
    set_latency(Process::Fixed(latency), 0);
    let _ = concurrent(synth.clone(), c).await;

    let fixed = concurrent(synth.clone(), n).await;
    let ideal = c as f64 / (l_ms as f64 / 1e3);

    set_latency(
        Process::Lognormal {
            median: latency,
            sigma: 1.2,
        },
        0,
    );
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

    // Side-by-side comparisons, off vs on; each prints its own table. (Prompt
    // caching has its own table, below: it needs its own servers.)
    let comparisons = [hedging(&env, l_ms as u64, h).await];
    println!("\nH={h} hints a run, {IN_FLIGHT} in flight, after {WARM_UP} unmeasured");
    for comparison in &comparisons {
        comparison.print();
    }
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
