//! Provider prompt caching against the loopback LLM, which reports cache
//! usage as the providers do: a 2,000-token `system_context_file` is
//! written to the cache on the first call and read at the cache-read price
//! after; `cost_usd` is what the usage fields cost by hand; nothing under
//! 1,024 tokens is cached; a recurring task gets its own breakpoint; the
//! OpenAI dialect gets `prompt_cache_key` and its `cached_tokens` are taken
//! out of the input; requests in flight together on a cold cache each
//! write; the budget reserves a marked request at the write price; the
//! eval report shows the context and the hints it changed.

use crate::common::llm_server;

use std::path::Path;

use hintstream::config::{CacheTtl, LlmConfig};
use hintstream::llm::synth::LlmEnv;
use hintstream::llm::{LlmError, Synthesis, Synthesizer};
use hintstream::messages::{FailedTrajectory, HintCategory, Usage};
use llm_server::{LlmServer, CACHE_MIN_TOKENS};
use serde_json::Value;

const KEY: &str = "sk-cache-test";
/// Claude Sonnet 4's list prices, dollars per million tokens, and its
/// cache rates (0.1x the input for a read, 1.25x for a 5-minute write, 2x
/// for a 1-hour one).
const INPUT: f64 = 3.0;
const OUTPUT: f64 = 15.0;
const READ: f64 = 0.3;
const WRITE_5M: f64 = 3.75;
const WRITE_1H: f64 = 6.0;

fn trajectory(task: &str) -> FailedTrajectory {
    serde_json::from_value(serde_json::json!({
        "schema_version": 1, "run_id": "r", "step": 1, "instance_id": "i", "trajectory_id": "t",
        "task_prompt": task,
        "chat_history": [{"role": "assistant", "content": "I ran the tests."}],
        "reward": 0.0,
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['test_parse failed']\n<<< ERROR_ACCUMULATOR <<<",
        "verifier_error": null, "tool_error_messages": ["bash: exit status 1"]
    }))
    .unwrap()
}

/// A context file of about `tokens` tokens (a token per 4 bytes, as the
/// loopback counts them).
fn context_file(dir: &Path, tokens: usize) -> String {
    let line = "Tool `bash`: runs one shell command; quote paths with spaces.\n";
    let text = line.repeat(tokens * 4 / line.len() + 1);
    let path = dir.join("tools.md");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn config(context: &str) -> LlmConfig {
    LlmConfig {
        timeout_secs: 10.0,
        max_retries: 0,
        system_context_file: context.into(),
        ..LlmConfig::default()
    }
}

/// What `usage` costs by hand at the Sonnet prices, writes at `write`.
fn hand_cost(u: &Usage, write: f64) -> f64 {
    (u.input_tokens as f64 * INPUT
        + u.cache_read_input_tokens.unwrap_or(0) as f64 * READ
        + u.cache_creation_input_tokens.unwrap_or(0) as f64 * write
        + u.output_tokens as f64 * OUTPUT)
        / 1e6
}

fn assert_costs_its_usage(s: &Synthesis, write: f64) {
    assert_eq!(s.category, HintCategory::LlmSynthesized, "{:?}", s.failure_reason);
    let want = hand_cost(&s.usage, write);
    assert!(
        (s.cost_usd - want).abs() < 1e-12,
        "cost_usd {} is not the usage's {want}: {:?}",
        s.cost_usd,
        s.usage
    );
}

/// The `cache_control` markers of a request body.
fn markers(body: &Value) -> Vec<Value> {
    let mut found = Vec::new();
    let mut collect = |v: &Value| {
        for b in v.as_array().into_iter().flatten() {
            if let Some(c) = b.get("cache_control") {
                found.push(c.clone());
            }
        }
    };
    collect(&body["system"]);
    for m in body["messages"].as_array().into_iter().flatten() {
        collect(&m["content"]);
    }
    found
}

#[tokio::test]
async fn a_2000_token_context_is_written_once_then_billed_at_the_cache_read_price() {
    let server = LlmServer::start(Some(KEY)).await;
    let dir = tempfile::tempdir().unwrap();
    let synth = Synthesizer::new(
        &config(&context_file(dir.path(), 2000)),
        &llm_server::anthropic_env(&server, KEY),
    )
    .unwrap();
    let mut hints = Vec::new();
    for i in 0..5 {
        hints.push(
            synth
                .synthesize(&trajectory(&format!("Fix parser bug #{i}.")))
                .await,
        );
    }
    let first = &hints[0];
    assert_costs_its_usage(first, WRITE_5M);
    let written = first.usage.cache_creation_input_tokens.unwrap();
    assert!(written >= 2000, "the context was written: {:?}", first.usage);
    assert_eq!(first.usage.cache_read_input_tokens, Some(0));
    for later in &hints[1..] {
        assert_costs_its_usage(later, WRITE_5M);
        assert_eq!(
            later.usage.cache_read_input_tokens,
            Some(written),
            "the context is read from the cache"
        );
        assert_eq!(later.usage.cache_creation_input_tokens, Some(0));
        assert!(later.cost_usd < first.cost_usd);
        // Saved: the cached tokens at the input price less the read price.
        let saved = written as f64 * (INPUT - READ) / 1e6;
        assert!(
            (later.cache_saved_usd - saved).abs() < 1e-12,
            "{}",
            later.cache_saved_usd
        );
    }
    assert!(first.cache_saved_usd < 0.0, "the write costs a premium");
    let seen = server.seen();
    assert_eq!(seen.len(), 5);
    for r in &seen {
        let system = r.body["system"].as_array().expect("system blocks");
        assert_eq!(system.len(), 1, "one block: the prompt with its context");
        assert_eq!(
            system[0]["cache_control"],
            serde_json::json!({"type": "ephemeral"})
        );
        assert!(system[0]["text"].as_str().unwrap().contains("Tool `bash`"));
        assert!(
            r.body["messages"][0]["content"].is_string(),
            "no task recurred: no task breakpoint"
        );
    }
}

#[tokio::test]
async fn below_1024_tokens_nothing_is_marked_or_cached() {
    let server = LlmServer::start(Some(KEY)).await;
    let dir = tempfile::tempdir().unwrap();
    let synth = Synthesizer::new(
        &config(&context_file(dir.path(), 500)),
        &llm_server::anthropic_env(&server, KEY),
    )
    .unwrap();
    for _ in 0..2 {
        let s = synth.synthesize(&trajectory("Fix the parser.")).await;
        assert_costs_its_usage(&s, WRITE_5M);
        assert_eq!(s.usage.cache_read_input_tokens, None);
        assert_eq!(s.usage.cache_creation_input_tokens, None);
        assert_eq!(s.cache_saved_usd, 0.0);
    }
    for r in server.seen() {
        assert!(markers(&r.body).is_empty(), "{}", r.body);
        assert!(r.body["system"].as_str().unwrap().contains("Tool `bash`"));
    }
}

#[tokio::test]
async fn the_loopback_caches_nothing_under_1024_tokens_even_when_marked() {
    let server = LlmServer::start(Some(KEY)).await;
    let dir = tempfile::tempdir().unwrap();
    // A low minimum makes the client mark a 500-token prefix.
    let config = LlmConfig {
        cache_min_tokens: 100,
        ..config(&context_file(dir.path(), 500))
    };
    let synth = Synthesizer::new(&config, &llm_server::anthropic_env(&server, KEY)).unwrap();
    for _ in 0..2 {
        let s = synth.synthesize(&trajectory("Fix the parser.")).await;
        assert_costs_its_usage(&s, WRITE_5M);
        assert_eq!(s.usage.cache_read_input_tokens, Some(0));
        assert_eq!(s.usage.cache_creation_input_tokens, Some(0));
    }
    let seen = server.seen();
    assert!(
        seen.iter().all(|r| !markers(&r.body).is_empty()),
        "the requests were marked"
    );
    assert!(llm_server::prompt_text_bytes(&seen[0].body) / 4 < CACHE_MIN_TOKENS);
}

#[tokio::test]
async fn a_recurring_task_gets_its_own_breakpoint_and_is_read_the_third_time() {
    let server = LlmServer::start(Some(KEY)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = LlmConfig {
        cache_ttl: CacheTtl::OneHour,
        ..config(&context_file(dir.path(), 2000))
    };
    let synth = Synthesizer::new(&config, &llm_server::anthropic_env(&server, KEY)).unwrap();
    let task = format!(
        "Make the date parser accept ISO weeks. {}",
        "Details. ".repeat(200)
    );
    let t = trajectory(&task);
    let runs = [
        synth.synthesize(&t).await,
        synth.synthesize(&t).await,
        synth.synthesize(&t).await,
    ];
    for s in &runs {
        assert_costs_its_usage(s, WRITE_1H);
    }
    let system = runs[0].usage.cache_creation_input_tokens.unwrap();
    // Second: the system is read, the task section written.
    assert_eq!(runs[1].usage.cache_read_input_tokens, Some(system));
    let task_tokens = runs[1].usage.cache_creation_input_tokens.unwrap();
    assert!(
        task_tokens >= 400,
        "the task section was written: {:?}",
        runs[1].usage
    );
    // Third: both are read.
    assert_eq!(runs[2].usage.cache_read_input_tokens, Some(system + task_tokens));
    assert_eq!(runs[2].usage.cache_creation_input_tokens, Some(0));
    let seen = server.seen();
    assert_eq!(markers(&seen[0].body).len(), 1);
    assert_eq!(markers(&seen[1].body).len(), 2, "{}", seen[1].body);
    let ttl = serde_json::json!({"type": "ephemeral", "ttl": "1h"});
    assert!(markers(&seen[2].body).iter().all(|m| *m == ttl));
    let content = &seen[1].body["messages"][0]["content"];
    assert!(content[0]["text"]
        .as_str()
        .unwrap()
        .starts_with("## Task\n<untrusted source=\"task\">\nMake the date parser"));
    assert!(content[1]["text"]
        .as_str()
        .unwrap()
        .starts_with("\n\n## Conversation"));
}

#[tokio::test]
async fn the_openai_dialect_gets_a_prompt_cache_key_and_its_cached_tokens_are_not_input() {
    let server = LlmServer::start(Some(KEY)).await;
    let dir = tempfile::tempdir().unwrap();
    let env = LlmEnv {
        openai_api_key: Some(KEY.into()),
        openai_base_url: Some(format!("{}/v1", server.base_url())),
        ..LlmEnv::default()
    };
    let synth = Synthesizer::new(&config(&context_file(dir.path(), 2000)), &env).unwrap();
    let first = synth.synthesize(&trajectory("Fix parser bug #1.")).await;
    let second = synth.synthesize(&trajectory("Fix parser bug #2.")).await;
    assert_eq!(first.usage.cache_read_input_tokens, Some(0));
    let cached = second.usage.cache_read_input_tokens.unwrap();
    assert!(cached >= 2000 && cached % 128 == 0, "{:?}", second.usage);
    assert_eq!(
        second.usage.cache_creation_input_tokens, None,
        "OpenAI bills no write"
    );
    // gpt-4o-mini: $0.15 input, $0.075 cached, $0.60 output.
    for s in [&first, &second] {
        let u = &s.usage;
        let want = (u.input_tokens as f64 * 0.15
            + u.cache_read_input_tokens.unwrap_or(0) as f64 * 0.075
            + u.output_tokens as f64 * 0.6)
            / 1e6;
        assert!((s.cost_usd - want).abs() < 1e-12, "{} vs {want}", s.cost_usd);
    }
    // The input is prompt_tokens less the cached ones.
    assert_eq!(
        first.usage.input_tokens,
        second.usage.input_tokens + cached,
        "the two prompts are of one length"
    );
    let seen = server.seen();
    let keys: Vec<&str> = seen
        .iter()
        .map(|r| r.body["prompt_cache_key"].as_str().unwrap())
        .collect();
    assert!(keys.iter().all(|k| k.starts_with("hintstream-v3-")), "{keys:?}");
    assert_ne!(keys[0], keys[1], "one key per task");
}

#[tokio::test]
async fn caching_off_sends_no_marker_and_no_key() {
    let server = LlmServer::start(Some(KEY)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = LlmConfig {
        prompt_cache: false,
        ..config(&context_file(dir.path(), 2000))
    };
    let synth = Synthesizer::new(&config, &llm_server::anthropic_env(&server, KEY)).unwrap();
    let t = trajectory("Fix the parser.");
    for _ in 0..3 {
        let s = synth.synthesize(&t).await;
        assert_costs_its_usage(&s, WRITE_5M);
        assert_eq!(s.usage.cache_read_input_tokens, None);
    }
    for r in server.seen() {
        assert!(r.body["system"].is_string() && markers(&r.body).is_empty());
    }
}

#[tokio::test]
async fn an_env_class_gets_its_own_text_after_the_common_one() {
    let server = LlmServer::start(Some(KEY)).await;
    let dir = tempfile::tempdir().unwrap();
    let classes = dir.path().join("classes");
    std::fs::create_dir(&classes).unwrap();
    std::fs::write(
        classes.join("sql.md"),
        "SQL: always ROLLBACK after a failed statement.",
    )
    .unwrap();
    let config = LlmConfig {
        system_context_dir: classes.display().to_string(),
        ..config(&context_file(dir.path(), 2000))
    };
    let synth = Synthesizer::new(&config, &llm_server::anthropic_env(&server, KEY)).unwrap();
    let mut sql = trajectory("Fix the query.");
    sql.env_class = Some("sql".into());
    let mut other = trajectory("Fix the query.");
    other.env_class = Some("web".into());
    synth.synthesize(&sql).await;
    let s = synth.synthesize(&other).await;
    // The common part was cached by the sql request and read by the other.
    assert!(s.usage.cache_read_input_tokens.unwrap() >= 2000, "{:?}", s.usage);
    let seen = server.seen();
    let text = |r: &llm_server::Seen| {
        r.body["system"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["text"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let sql_system = text(&seen[0]);
    assert_eq!(sql_system.len(), 2, "the common part, then the class's");
    assert!(sql_system[1].contains("ROLLBACK"));
    assert!(!text(&seen[1]).concat().contains("ROLLBACK"));
}

#[test]
fn a_missing_context_file_stops_the_start_up_naming_it() {
    let env = LlmEnv::default();
    let err = Synthesizer::new(&config("/nonexistent/tools.md"), &env).unwrap_err();
    assert!(
        matches!(err, LlmError::Context { .. }) && err.is_config(),
        "{err:?}"
    );
    assert!(err.to_string().contains("/nonexistent/tools.md"), "{err}");
}

/// `hintstream eval` with a config without context and one with it, over
/// a recorded topic of `groups` groups: the report says which context each
/// config carried and how many hints changed with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eval_report_shows_the_context_and_the_hints_it_changed() {
    use hintstream::eval::report::Report;
    use hintstream::tools::recorded::Bytes;
    use hintstream::tools::RecordedMessage;

    let server = LlmServer::start(Some(KEY)).await;
    server.default(llm_server::Behavior::Derived(std::time::Duration::ZERO));
    let dir = tempfile::tempdir().unwrap();
    let groups = 4;
    let lines: Vec<String> = (0..groups)
        .map(|i| {
            let t = serde_json::to_value(trajectory(&format!("Fix bug #{i}."))).unwrap();
            let mut t = t.as_object().unwrap().clone();
            t.insert("instance_id".into(), format!("inst-{i}").into());
            RecordedMessage {
                topic: "rl.trajectories.failed".into(),
                partition: 0,
                offset: i,
                timestamp: Some(1_764_000_000_000),
                key: Bytes::new(Some(format!("r/1/inst-{i}").into_bytes())),
                value: Bytes::new(Some(Value::Object(t).to_string().into_bytes())),
                headers: vec![],
            }
            .to_line()
        })
        .collect();
    let input = dir.path().join("failed.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let llm = format!(
        // One call at a time: a prefix is readable once its write is answered.
        "[llm]\nprovider = \"anthropic\"\nbase_url = \"{}\"\nmax_retries = 0\nconcurrency = 1\n",
        server.base_url()
    );
    let plain = dir.path().join("plain.toml");
    std::fs::write(&plain, &llm).unwrap();
    let with_context = dir.path().join("context.toml");
    let context = context_file(dir.path(), 2000);
    std::fs::write(
        &with_context,
        format!("{llm}system_context_file = \"{context}\"\n"),
    )
    .unwrap();
    let out = dir.path().join("out");
    let args: Vec<String> = [
        "eval",
        "--input",
        &input.display().to_string(),
        "--out",
        &out.display().to_string(),
        "--config",
        &plain.display().to_string(),
        "--config",
        &with_context.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let output = tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hintstream"));
        crate::common::without_llm_env(&mut command)
            .env_remove("ANTHROPIC_BASE_URL")
            .env("ANTHROPIC_API_KEY", KEY)
            .args(&args);
        command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Report = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    let (a, b) = (&report.configs[0], &report.configs[1]);
    assert_eq!(a.system_context, "none");
    assert!(
        b.system_context.starts_with("file: ") && b.system_context.contains("sha256"),
        "{}",
        b.system_context
    );
    assert_eq!(a.hints_changed, None);
    assert_eq!(
        b.hints_changed,
        Some(groups as u64),
        "the loopback's hints follow the prompt"
    );
    // Below the minimum nothing is marked, so the loopback reports no
    // cache usage at all: absent, not 0.
    assert_eq!(
        (a.cache_read_input_tokens, a.cache_creation_input_tokens),
        (None, None)
    );
    assert!(
        b.cache_read_input_tokens.unwrap() >= 2000 * (groups as u64 - 1),
        "{b:?}"
    );
    assert!(b.cache_creation_input_tokens.unwrap() >= 2000, "{b:?}");
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("hints changed vs the first config") && html.contains("system context"));
}

/// The spend budget reserves a request that marks a breakpoint at the
/// cache write price: a budget that fits one plain request's worst case
/// (every prompt byte a token at the input price) refuses the same request
/// with caching on.
#[tokio::test]
async fn the_budget_reserves_a_marked_request_at_the_cache_write_price() {
    use hintstream::llm::limits::FRAMING_TOKENS;

    let server = LlmServer::start(Some(KEY)).await;
    let dir = tempfile::tempdir().unwrap();
    let context = context_file(dir.path(), 2000);
    let t = trajectory("Fix the parser.");
    let probe = Synthesizer::new(
        &LlmConfig {
            prompt_cache: false,
            ..config(&context)
        },
        &llm_server::anthropic_env(&server, KEY),
    )
    .unwrap();
    probe.synthesize(&t).await;
    let bytes = llm_server::prompt_text_bytes(&server.seen()[0].body);
    let max_tokens = f64::from(LlmConfig::default().max_tokens);
    let plain_worst = ((bytes + FRAMING_TOKENS) as f64 * INPUT + max_tokens * OUTPUT) / 1e6;
    let marked_worst = ((bytes + FRAMING_TOKENS) as f64 * WRITE_5M + max_tokens * OUTPUT) / 1e6;
    let budget = plain_worst * 1.05;
    assert!(marked_worst > budget);
    for (prompt_cache, reason) in [(false, None), (true, Some("budget_exhausted"))] {
        let synth = Synthesizer::new(
            &LlmConfig {
                prompt_cache,
                budget_usd_per_hour: budget,
                ..config(&context)
            },
            &llm_server::anthropic_env(&server, KEY),
        )
        .unwrap();
        let s = synth.synthesize(&t).await;
        assert_eq!(
            s.failure_reason.as_deref(),
            reason,
            "prompt_cache = {prompt_cache}"
        );
    }
}

/// As on the real APIs, a prefix is readable once the request that wrote
/// it is answered: requests in flight together on a cold cache each write
/// it, and the next one reads it.
#[tokio::test]
async fn requests_in_flight_together_on_a_cold_cache_each_write() {
    let server = LlmServer::start(Some(KEY)).await;
    server.default(llm_server::Behavior::Text(
        "Check the week numbering.".into(),
        std::time::Duration::from_millis(300),
    ));
    let dir = tempfile::tempdir().unwrap();
    let synth = Synthesizer::new(
        &config(&context_file(dir.path(), 2000)),
        &llm_server::anthropic_env(&server, KEY),
    )
    .unwrap();
    let tasks: Vec<FailedTrajectory> = (0..5).map(|i| trajectory(&format!("Fix bug #{i}."))).collect();
    let burst = futures::future::join_all(tasks.iter().map(|t| synth.synthesize(t))).await;
    for s in &burst {
        assert_costs_its_usage(s, WRITE_5M);
        assert!(
            s.usage.cache_creation_input_tokens.unwrap() >= 2000,
            "{:?}",
            s.usage
        );
        assert_eq!(s.usage.cache_read_input_tokens, Some(0));
    }
    let after = synth.synthesize(&trajectory("Fix bug #5.")).await;
    assert_eq!(
        after.usage.cache_read_input_tokens,
        burst[0].usage.cache_creation_input_tokens
    );
}
