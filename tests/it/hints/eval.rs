//! `hintstream eval` end to end: a 200-group recorded topic, two configs
//! (Anthropic and OpenAI-compatible) against the loopback LLM server, the
//! report; a strict playback rerun makes no HTTP request and gives the same
//! hints byte for byte; a changed config is a cassette miss; the HTML renders
//! in headless Chromium with its plots and table.

use crate::common;
use crate::common::llm_server;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use hintstream::eval::report::Report;
use hintstream::tools::recorded::Bytes;
use hintstream::tools::RecordedMessage;
use llm_server::{Behavior, LlmServer};
use serde_json::json;

const KEY: &str = "sk-eval-loopback";
const GROUPS: usize = 200;

/// A `hintstream record` file: 200 groups (every third with two
/// trajectories), some of which the server fails or rate-limits, and two
/// lines stage 1 would dead-letter.
fn recorded_input(path: &Path) {
    let mut lines = Vec::new();
    let mut offset = 0i64;
    let mut push = |value: String, key: String| {
        lines.push(
            RecordedMessage {
                topic: "rl.trajectories.failed".into(),
                partition: (offset % 6) as i32,
                offset,
                timestamp: Some(1_764_000_000_000 + offset * 10),
                key: Bytes::new(Some(key.into_bytes())),
                value: Bytes::new(Some(value.into_bytes())),
                headers: vec![],
            }
            .to_line(),
        );
        offset += 1;
    };
    for i in 0..GROUPS {
        let marker = match i % 20 {
            7 => "FLAKY-MARKER",
            3 => "RATE-MARKER",
            _ => "",
        };
        let members = if i % 3 == 0 { 2 } else { 1 };
        for m in 0..members {
            let t = json!({
                "schema_version": 1, "run_id": "run-eval", "step": 1 + (i / 50) as i64,
                "instance_id": format!("inst-{i}"), "trajectory_id": format!("t-{i}-{m}"),
                "task_prompt": format!("Fix bug #{i} in the parser. {marker}"),
                "chat_history": [
                    {"role": "user", "content": format!("Fix bug #{i}")},
                    {"role": "assistant", "content": [{"type": "tool_use", "name": "bash", "input": {"cmd": "pytest"}}]},
                ],
                "verifier_error": format!("AssertionError: case {i} <expected> & got 'none'"),
                "reward": if m == 1 { 0.25 } else { 0.0 },
                "group_size": members,
            });
            push(t.to_string(), format!("run-eval/1/inst-{i}"));
        }
    }
    push("{\"schema_version\": 1, \"run_id\": ".into(), "broken".into());
    push(
        json!({"schema_version": 99, "run_id": "r", "step": 1, "instance_id": "x", "trajectory_id": "y",
               "task_prompt": "p", "chat_history": [], "reward": 0.0})
        .to_string(),
        "future".into(),
    );
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn config_file(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// Runs `hintstream eval` off the async workers (the loopback server runs on
/// them), with the API keys set or not.
async fn eval_with_keys(args: Vec<String>, keys: bool) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
        common::without_llm_env(&mut command)
            .env_remove("ANTHROPIC_BASE_URL")
            .args(&args);
        if keys {
            command.env("ANTHROPIC_API_KEY", KEY).env("OPENAI_API_KEY", KEY);
        }
        command.output().unwrap()
    })
    .await
    .unwrap()
}

async fn eval(args: Vec<String>) -> Output {
    eval_with_keys(args, true).await
}

fn args(input: &Path, configs: &[&Path], out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "eval".to_string(),
        "--input".into(),
        input.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    for c in configs {
        a.push("--config".into());
        a.push(c.display().to_string());
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn report(out: &Path) -> Report {
    serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap()
}

/// Per (group, config): everything about the hint but timing.
fn hints(r: &Report) -> BTreeMap<(String, String), serde_json::Value> {
    r.hints
        .iter()
        .flat_map(|g| {
            g.hints.iter().map(|h| {
                let identity = json!({
                    "hint_id": h.hint_id, "category": h.category, "model": h.model,
                    "failure_reason": h.failure_reason, "hint": h.hint,
                    "tokens": [h.input_tokens, h.output_tokens], "cost_usd": h.cost_usd,
                });
                ((g.key.clone(), h.config.clone()), identity)
            })
        })
        .collect()
}

fn assert_ok(output: &Output) {
    assert!(
        output.status.success(),
        "eval failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eval_records_then_replays_byte_identical_hints_without_http() {
    let server = LlmServer::start(Some(KEY)).await;
    server.default(Behavior::Derived(Duration::from_millis(3)));
    server.on("FLAKY-MARKER", vec![Behavior::Status(500, "api_error", None)]);
    let mut rate = Vec::new();
    for _ in 0..5 {
        rate.push(Behavior::Status(429, "rate_limit_error", Some(0)));
        rate.push(Behavior::Derived(Duration::from_millis(3)));
    }
    server.on("RATE-MARKER", rate);

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("failed.jsonl");
    recorded_input(&input);
    let base = server.base_url();
    let common = "max_retries = 1\ntimeout_secs = 20\n";
    let a = config_file(
        dir.path(),
        "sonnet.toml",
        &format!("[llm]\nprovider = \"anthropic\"\nbase_url = \"{base}\"\nmodels = [\"claude-sonnet-4-20250514\"]\nconcurrency = 8\n{common}"),
    );
    let b = config_file(
        dir.path(),
        "mini.toml",
        &format!("[llm]\nprovider = \"openai\"\nbase_url = \"{base}/v1\"\nmodels = [\"gpt-4o-mini\"]\nconcurrency = 16\nmax_tokens = 200\n{common}"),
    );
    let out = dir.path().join("out");

    // 1. Record.
    let timer = std::time::Instant::now();
    let first = eval(args(&input, &[&a, &b], &out, &[])).await;
    let record_secs = timer.elapsed().as_secs_f64();
    assert_ok(&first);
    let recorded_requests = server.seen().len();
    let r1 = report(&out);
    assert_eq!((r1.groups, r1.trajectories), (GROUPS as u64, 269));
    assert_eq!(r1.rejected.get("not_json"), Some(&1), "{:?}", r1.rejected);
    assert_eq!(r1.rejected.get("schema_version"), Some(&1), "{:?}", r1.rejected);
    assert_eq!(r1.configs.len(), 2);
    let labels: Vec<&str> = r1.configs.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(labels, ["sonnet", "mini"]);
    for c in &r1.configs {
        assert_eq!(c.categories.values().sum::<u64>(), GROUPS as u64, "{c:?}");
        assert_eq!(c.categories["llm_failed_static_fallback"], 10, "the FLAKY groups");
        assert_eq!(c.failure_reasons.get("http_5xx"), Some(&10));
        assert_eq!(c.categories["llm_synthesized"], 190);
        assert!((c.fallback_rate - 0.05).abs() < 1e-9);
        assert_eq!((c.api_calls, c.cassette_played), (GROUPS as u64, 0));
        assert!(
            c.latency_ms.p50 >= 3.0 && c.latency_ms.p99 >= c.latency_ms.p50,
            "{:?}",
            c.latency_ms
        );
        assert!(c.input_tokens > 0 && c.output_tokens > 0);
        assert!(c.cost_usd > 0.0);
        assert_eq!(
            c.latency_histogram.iter().map(|b| b.count).sum::<u64>(),
            GROUPS as u64
        );
    }
    // 200 first attempts per config, one retry per FLAKY group, one per 429.
    assert_eq!(
        recorded_requests,
        2 * (GROUPS + 10) + 5,
        "HTTP requests while recording"
    );
    let group = &r1.hints[0];
    assert_eq!(group.members, 2);
    assert_eq!(group.trajectory_id, "t-0-1", "the best trajectory");
    assert!(group.hints[0].hint.starts_with("[claude-sonnet-4-20250514]"));
    assert!(group.hints[1].hint.starts_with("[gpt-4o-mini]"));
    assert_ne!(group.hints[0].hint_id, group.hints[1].hint_id);
    let retried = r1
        .hints
        .iter()
        .flat_map(|g| &g.hints)
        .filter(|h| h.category.as_str() == "llm_synthesized" && h.latency_ms >= 250)
        .count();
    assert!(retried >= 5, "the 429s were retried after a backoff: {retried}");

    // 2. Strict playback: no HTTP, the same hints, the recorded latencies.
    let timer = std::time::Instant::now();
    // No API key needed: strict playback sends nothing.
    let second = eval_with_keys(args(&input, &[&a, &b], &out, &["--playback", "--strict"]), false).await;
    let playback_secs = timer.elapsed().as_secs_f64();
    assert_ok(&second);
    assert_eq!(
        server.seen().len(),
        recorded_requests,
        "playback made HTTP requests"
    );
    let r2 = report(&out);
    assert_eq!(hints(&r1), hints(&r2), "playback hints differ");
    let latencies = |r: &Report| -> Vec<u64> {
        r.hints
            .iter()
            .flat_map(|g| g.hints.iter().map(|h| h.latency_ms))
            .collect()
    };
    // Playback reports the recorded time of each call: the recorded hint
    // latency less the time spent outside calls (building the prompt).
    for (l1, l2) in latencies(&r1).iter().zip(latencies(&r2)) {
        assert!(l2 <= *l1 && l1 - l2 <= 50, "recorded {l1} ms, played {l2} ms");
    }
    for c in &r2.configs {
        assert_eq!((c.api_calls, c.cassette_played), (0, GROUPS as u64));
    }
    eprintln!(
        "eval: {GROUPS} groups x 2 configs: recorded in {record_secs:.2} s ({recorded_requests} HTTP requests), strict playback in {playback_secs:.2} s (0 requests)"
    );

    // 3. A changed model is a miss: an error in strict mode, recorded otherwise.
    let haiku = config_file(
        dir.path(),
        "haiku.toml",
        &format!("[llm]\nprovider = \"anthropic\"\nbase_url = \"{base}\"\nmodels = [\"claude-3-5-haiku-20241022\"]\n{common}"),
    );
    let strict_miss = eval(args(&input, &[&a, &haiku], &out, &["--playback", "--strict"])).await;
    assert_eq!(strict_miss.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&strict_miss.stderr);
    assert!(
        stderr.contains("not in the cassette") && stderr.contains("haiku"),
        "{stderr}"
    );
    assert_eq!(
        server.seen().len(),
        recorded_requests,
        "a strict miss made HTTP requests"
    );
    let extended = eval(args(&input, &[&a, &haiku], &out, &["--playback"])).await;
    assert_ok(&extended);
    let r3 = report(&out);
    assert_eq!(
        (r3.configs[0].api_calls, r3.configs[0].cassette_played),
        (0, GROUPS as u64)
    );
    assert_eq!(
        r3.configs[1].api_calls, GROUPS as u64,
        "the new config went to the API"
    );
    assert!(server.seen().len() > recorded_requests);

    // 4. The page renders: plots and the table.
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(!html.contains("<expected>"), "trajectory text is escaped");
    render_in_chromium(&out.join("index.html"), dir.path());
}

fn chromium() -> PathBuf {
    let path = std::env::var_os("CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup.sh (installs Debian's chromium) or set CHROMIUM",
        path.display()
    );
    path
}

/// Headless Chromium as on this kind of machine: no sandbox (root), no GPU,
/// no background network, a fresh profile. Returns (stdout, stderr); they go
/// through files, as a dumped DOM outgrows a pipe's buffer.
fn run_chromium(profile: &Path, args: &[String]) -> (String, String) {
    std::fs::create_dir_all(profile).unwrap();
    let (out, err) = (profile.join("stdout"), profile.join("stderr"));
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    (read(&out), read(&err))
}

fn render_in_chromium(page: &Path, dir: &Path) {
    let url = format!("file://{}", page.display());
    // The DOM as Chromium parsed it: the plots and the table are there.
    let (dom, _) = run_chromium(&dir.join("profile-dom"), &["--dump-dom".into(), url.clone()]);
    for id in ["summary", "hints"] {
        assert!(
            dom.contains(&format!("<table id=\"{id}\"")),
            "no table {id} in the DOM"
        );
    }
    for id in ["plot-categories", "plot-latency"] {
        let at = dom
            .find(&format!("<figure id=\"{id}\""))
            .unwrap_or_else(|| panic!("no {id}"));
        assert!(
            dom[at..]
                .trim_start_matches(|c| c != '>')
                .get(1..)
                .is_some_and(|rest| rest.starts_with("<svg")),
            "{id} holds no inline SVG"
        );
    }
    let hint_rows = dom
        .split("<table id=\"hints\"")
        .nth(1)
        .unwrap()
        .split("</table>")
        .next()
        .unwrap()
        .matches("<tr>")
        .count();
    assert_eq!(hint_rows, GROUPS + 1, "one row per group plus the header");

    // The screenshot: both configs' bars were painted.
    let shot = dir.join("report.png");
    let (_, stderr) = run_chromium(
        &dir.join("profile-shot"),
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,1400".into(),
            url,
        ],
    );
    assert!(shot.exists(), "no screenshot: {stderr}");
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1280, 1400));
    let channels = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let count = |rgb: (u8, u8, u8)| {
        pixels
            .chunks(channels)
            .filter(|p| (p[0], p[1], p[2]) == rgb)
            .count()
    };
    let colors = hintstream::eval::markup::CONFIG_COLORS;
    for (i, rgb) in colors.iter().take(2).enumerate() {
        let n = count(*rgb);
        assert!(n > 2_000, "config {i}'s bars: {n} pixels of {rgb:?}");
    }
    let white = count((255, 255, 255));
    assert!(white < pixels.len() / channels, "the page is not blank");
}
