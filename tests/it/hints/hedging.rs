//! Hedged requests (`llm.hedge`) against the loopback LLM's latency modes:
//! 2,000 hints with hedging off and on side by side, on one seeded latency
//! process. Stragglers (3% of calls 20x slower than a lognormal base of
//! σ 0.3): with hedging the p99 stays within 4x the p50 (about 20x without).
//! A lognormal tail of σ 1.2: the p99 with hedging is at most 0.7x the p99
//! without. Both with at most 6% extra requests. And no duplicate is sent
//! while an attempt waits on a `retry-after`, nor without a rate-limit
//! permit; with `hedge_to = "next"` it goes to the chain's next model. (The
//! budget with hedging on: `budget_bound.rs`.)
//!
//! On paused Tokio time: latencies are the latency process's, not a
//! loaded machine's scheduling. A ticker keeps the clock from jumping past
//! the HTTP exchanges (each costs a millisecond or so of virtual time), and
//! a hint's latency is measured on that clock. `hedge_min_delay_ms` is
//! scaled down with the latencies (a 100 ms median).

use crate::common::llm_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hintstream::config::{HedgeTo, LlmConfig, LlmProvider};
use hintstream::llm::synth::SynthObserver;
use hintstream::llm::Synthesizer;
use hintstream::messages::{FailedTrajectory, HintCategory};
use llm_server::{Behavior, Latency, LlmServer};

const KEY: &str = "sk-hedge-test";
/// Hints measured in each run.
const HINTS: usize = 2_000;
/// Hints sent before measuring: they fill the latency window (and the
/// duplicates' bucket) as a running stage has.
const WARM_UP: usize = 200;
/// Hints in flight at once (below `llm.concurrency`: no hint queues for a
/// call slot, so a hint's latency is its calls').
const IN_FLIGHT: usize = 100;
const MEDIAN: Duration = Duration::from_millis(100);

/// Counts the duplicates the synthesizer reports.
#[derive(Default)]
pub(crate) struct HedgeCount {
    pub(crate) sent: AtomicUsize,
    pub(crate) won: AtomicUsize,
    pub(crate) skipped: AtomicUsize,
    /// Of `skipped`: for want of a call slot, rate-limit permit or budget.
    pub(crate) skipped_for_limits: AtomicUsize,
}

impl SynthObserver for HedgeCount {
    fn attempt(&self, _model: &str, _status: &str, _latency: Duration) {}
    fn retry(&self, _model: &str, _reason: &str) {}
    fn calls_in_flight(&self, _n: usize) {}
    fn hedge_sent(&self, _model: &str) {
        self.sent.fetch_add(1, Ordering::SeqCst);
    }
    fn hedge_won(&self, _model: &str) {
        self.won.fetch_add(1, Ordering::SeqCst);
    }
    fn hedge_skipped(&self, _model: &str, reason: &str) {
        self.skipped.fetch_add(1, Ordering::SeqCst);
        if reason == "limits" {
            self.skipped_for_limits.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn trajectory(i: usize, marker: &str) -> FailedTrajectory {
    serde_json::from_value(serde_json::json!({
        "schema_version": 1, "run_id": "hedge", "step": 1, "instance_id": format!("g{i}"),
        "trajectory_id": format!("t{i}"), "task_prompt": format!("Solve task {i}. {marker}"),
        "chat_history": [], "reward": 0.0
    }))
    .unwrap()
}

fn config(hedge: bool) -> LlmConfig {
    LlmConfig {
        concurrency: 256,
        requests_per_minute: 0,
        // The hint's deadline is on the real clock, which paused time
        // outruns.
        timeout_secs: 600.0,
        hedge,
        // Scaled down with the latencies (500 ms against calls of seconds).
        hedge_min_delay_ms: 50,
        ..LlmConfig::default()
    }
}

/// One run's figures.
#[derive(Debug)]
struct Run {
    p50: f64,
    p95: f64,
    p99: f64,
    /// HTTP requests the server got for the measured hints.
    requests: u64,
    hedges_won: usize,
    /// Duplicates due but not sent (the share was used up).
    hedges_skipped: usize,
}

impl Run {
    fn extra(&self) -> f64 {
        self.requests as f64 / HINTS as f64 - 1.0
    }
}

/// The nearest-rank percentile `q` of sorted `values`.
fn percentile(sorted: &[u64], q: f64) -> f64 {
    let rank = (sorted.len() as f64 * q).ceil() as usize;
    sorted[rank.saturating_sub(1)] as f64
}

/// Synthesizes hints `range`, [`IN_FLIGHT`] at a time; their latencies.
async fn drive(synth: &Arc<Synthesizer>, range: std::ops::Range<usize>) -> Vec<u64> {
    let next = Arc::new(AtomicUsize::new(range.start));
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (synth, next, end) = (synth.clone(), next.clone(), range.end);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= end {
                        return latencies;
                    }
                    let started = tokio::time::Instant::now();
                    let s = synth.synthesize(&trajectory(i, "")).await;
                    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
                    latencies.push(started.elapsed().as_millis() as u64);
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    all.sort_unstable();
    all
}

/// [`WARM_UP`] hints, then [`HINTS`] measured ones, on `latency` seeded
/// alike whether hedging is on or off.
async fn run(server: &LlmServer, latency: Latency, hedge: bool) -> Run {
    server.default(Behavior::Timed(latency));
    let count = Arc::new(HedgeCount::default());
    let synth = Arc::new(
        Synthesizer::new(&config(hedge), &llm_server::anthropic_env(server, KEY))
            .unwrap()
            .with_observer(count.clone()),
    );
    server.seed_latency(1);
    drive(&synth, 0..WARM_UP).await;
    server.seed_latency(2);
    let won_before = count.won.load(Ordering::SeqCst);
    let skipped_before = count.skipped.load(Ordering::SeqCst);
    let latencies = drive(&synth, WARM_UP..WARM_UP + HINTS).await;
    let (requests, _, _) = server.timed_usage();
    Run {
        p50: percentile(&latencies, 0.50),
        p95: percentile(&latencies, 0.95),
        p99: percentile(&latencies, 0.99),
        requests,
        hedges_won: count.won.load(Ordering::SeqCst) - won_before,
        hedges_skipped: count.skipped.load(Ordering::SeqCst) - skipped_before,
    }
}

/// Wakes every millisecond of paused time: with it, the clock advances a
/// millisecond at a time while HTTP requests are on the wire, instead of
/// jumping to the next server delay's end.
fn tick() {
    tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
}

/// Off, then on, on one server; both printed.
async fn side_by_side(latency: Latency) -> (Run, Run) {
    tick();
    let server = LlmServer::start(Some(KEY)).await;
    let off = run(&server, latency, false).await;
    let on = run(&server, latency, true).await;
    for (name, r) in [("off", &off), ("on", &on)] {
        eprintln!(
            "{latency:?} hedging {name}: p50 {} ms, p95 {} ms, p99 {} ms (p99/p50 {:.2}), {} requests \
             for {HINTS} hints ({:+.2}% extra), {} hedges won, {} skipped",
            r.p50,
            r.p95,
            r.p99,
            r.p99 / r.p50,
            r.requests,
            100.0 * r.extra(),
            r.hedges_won,
            r.hedges_skipped
        );
    }
    assert_eq!(off.requests, HINTS as u64, "no duplicates with hedging off");
    (off, on)
}

#[tokio::test(start_paused = true)]
async fn hedging_keeps_stragglers_out_of_the_p99_for_at_most_6_percent_more_requests() {
    let (off, on) = side_by_side(Latency::Stragglers {
        median: MEDIAN,
        sigma: 0.3,
        share: 0.03,
        factor: 20.0,
    })
    .await;
    assert!(
        off.p99 >= 10.0 * off.p50,
        "without hedging the stragglers make the p99 ({} ms, {:.1}x the p50)",
        off.p99,
        off.p99 / off.p50
    );
    assert!(
        on.p99 <= 4.0 * on.p50,
        "with hedging the p99 is {} ms, {:.2}x the p50 of {} ms",
        on.p99,
        on.p99 / on.p50,
        on.p50
    );
    assert!(on.extra() <= 0.06, "{:.2}% extra requests", 100.0 * on.extra());
    assert!(on.hedges_won > 0);
}

#[tokio::test(start_paused = true)]
async fn hedging_cuts_a_heavy_lognormal_tail_by_at_least_30_percent_for_at_most_6_percent_more_requests() {
    let (off, on) = side_by_side(Latency::Lognormal {
        median: MEDIAN,
        sigma: 1.2,
    })
    .await;
    assert!(
        on.p99 <= 0.7 * off.p99,
        "p99 {} ms with hedging against {} ms without ({:.2}x)",
        on.p99,
        off.p99,
        on.p99 / off.p99
    );
    assert!(on.extra() <= 0.06, "{:.2}% extra requests", 100.0 * on.extra());
}

#[tokio::test(start_paused = true)]
async fn no_hedge_is_sent_while_the_first_attempt_waits_on_a_retry_after() {
    tick();
    let server = LlmServer::start(Some(KEY)).await;
    server.default(Behavior::Text("Warm.".into(), Duration::from_millis(100)));
    let count = Arc::new(HedgeCount::default());
    // Every request may be hedged: a duplicate is never missing for want
    // of a token.
    let config = LlmConfig {
        hedge_max_share: 1.0,
        ..config(true)
    };
    let synth = Arc::new(
        Synthesizer::new(&config, &llm_server::anthropic_env(&server, KEY))
            .unwrap()
            .with_observer(count.clone()),
    );
    drive(&synth, 0..WARM_UP).await;
    // (Jitter may have hedged a warm-up call or two.)
    let sent = count.sent.load(Ordering::SeqCst);
    let won = count.won.load(Ordering::SeqCst);

    // An attempt in flight past its model's p95 gets a duplicate, which
    // answers first here.
    server.on(
        "[slow]",
        vec![
            Behavior::Text("Slow.".into(), Duration::from_secs(2)),
            Behavior::Text("Quick.".into(), Duration::ZERO),
        ],
    );
    let started = tokio::time::Instant::now();
    let s = synth.synthesize(&trajectory(0, "[slow]")).await;
    assert_eq!((s.hint.as_str(), s.hedged), ("Quick.", true));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(count.sent.load(Ordering::SeqCst), sent + 1);
    assert_eq!(count.won.load(Ordering::SeqCst), won + 1);

    // A 429 with `retry-after: 2` comes back at once: the two-second wait
    // is between attempts, and nothing is hedged during it.
    server.on(
        "[wait]",
        vec![
            Behavior::Status(429, "rate_limit_error", Some(2)),
            Behavior::Text("After the wait.".into(), Duration::ZERO),
        ],
    );
    let started = tokio::time::Instant::now();
    let s = synth.synthesize(&trajectory(1, "[wait]")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    assert_eq!((s.hint.as_str(), s.hedged), ("After the wait.", false));
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2), "the retry waited {waited:?}");
    assert_eq!(
        count.sent.load(Ordering::SeqCst),
        sent + 1,
        "no hedge during the wait"
    );
    let requests: Vec<_> = server
        .seen()
        .into_iter()
        .filter(|r| r.body.to_string().contains("[wait]"))
        .collect();
    assert_eq!(requests.len(), 2, "the 429 and its one retry, no duplicate");
}

#[tokio::test(start_paused = true)]
async fn with_hedge_to_next_the_duplicate_goes_to_the_next_model_and_its_hint_names_it() {
    tick();
    let server = LlmServer::start(Some(KEY)).await;
    // The second model's requests name it; the first's never do.
    server.on(
        "claude-second",
        vec![Behavior::Text("From the second.".into(), Duration::ZERO)],
    );
    server.on(
        "[slow]",
        vec![Behavior::Text("Slow.".into(), Duration::from_secs(2))],
    );
    server.default(Behavior::Text("Warm.".into(), Duration::from_millis(100)));
    let count = Arc::new(HedgeCount::default());
    let config = LlmConfig {
        provider: LlmProvider::Anthropic,
        models: vec!["claude-first".into(), "claude-second".into()],
        hedge_to: HedgeTo::Next,
        hedge_max_share: 1.0,
        ..config(true)
    };
    let synth = Arc::new(
        Synthesizer::new(&config, &llm_server::anthropic_env(&server, KEY))
            .unwrap()
            .with_observer(count.clone()),
    );
    drive(&synth, 0..WARM_UP).await;
    let won = count.won.load(Ordering::SeqCst);

    let s = synth.synthesize(&trajectory(0, "[slow]")).await;
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    assert_eq!(
        (s.hint.as_str(), s.model.as_deref(), s.hedged),
        ("From the second.", Some("claude-second"), true)
    );
    assert_eq!(count.won.load(Ordering::SeqCst), won + 1);
    let slow: Vec<String> = server
        .seen()
        .iter()
        .filter(|r| r.body.to_string().contains("[slow]"))
        .map(|r| r.body["model"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        slow,
        ["claude-first", "claude-second"],
        "one duplicate, to the next model"
    );
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_without_a_rate_limit_permit_is_not_sent() {
    tick();
    let server = LlmServer::start(Some(KEY)).await;
    server.on(
        "[slow]",
        vec![Behavior::Text("Slow.".into(), Duration::from_secs(2))],
    );
    server.default(Behavior::Text("Warm.".into(), Duration::from_millis(100)));
    let count = Arc::new(HedgeCount::default());
    // A burst of 21 requests (the limiter runs on the real clock, which
    // hardly moves here): the 20 calls that open the latency window and
    // the slow call; none is left for its duplicate.
    let config = LlmConfig {
        requests_per_minute: 21,
        hedge_max_share: 1.0,
        ..config(true)
    };
    let synth = Synthesizer::new(&config, &llm_server::anthropic_env(&server, KEY))
        .unwrap()
        .with_observer(count.clone());
    for i in 0..20 {
        let s = synth.synthesize(&trajectory(i, "")).await;
        assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    }
    let s = synth.synthesize(&trajectory(20, "[slow]")).await;
    assert_eq!((s.hint.as_str(), s.hedged), ("Slow.", false));
    assert_eq!(count.sent.load(Ordering::SeqCst), 0);
    assert_eq!(count.skipped_for_limits.load(Ordering::SeqCst), 1);
    let slow = server
        .seen()
        .iter()
        .filter(|r| r.body.to_string().contains("[slow]"))
        .count();
    assert_eq!(slow, 1, "no duplicate reached the server");
}
