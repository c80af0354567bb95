//! A simulated training run people can watch: hidden per-arm rescue rates,
//! the real stages over Kafka, a loopback LLM, per-step arm shares, an HTML
//! report.
//!
//! ```text
//! cargo build && cargo run --example simulate -- --bootstrap-servers 127.0.0.1:9092 --out sim-out
//! ```
//!
//! It creates its own topics (named `sim-<id>.…`), writes a config with one
//! `[[hints.arms]]` entry per `--arm`, starts `hintstream hints` and
//! `hintstream advantages` as processes (the binary next to this example in
//! the target folder, or `--hintstream`), answers their LLM calls from a
//! loopback OpenAI-compatible server on 127.0.0.1:0 (each model a distinct
//! hint text), and plays the trainer, step by step:
//!
//! 1. publishes `--groups` failed groups (tasks drawn from a pool of
//!    `--tasks`) of `--group-size` failed trajectories each;
//! 2. waits for every group's hint;
//! 3. decides, per hint, whether its retries succeed: with the hidden rate of
//!    the hint's `arm` for a task's first hint (or the first after a rescue);
//!    a task's later hint helps only if it saw the earlier one: a hint whose
//!    `refines` names the task's last unhelpful hint succeeds with that rate
//!    plus `--refine-bonus`, any other with the rate times `--blind-repeat`;
//! 4. publishes the step's scored rollouts (the raw rows, all failed, and
//!    `--hinted-retries` hinted retries per group with `hint_id`,
//!    `hint_category` and the log-probs a trainer reports: a response of
//!    `--response-length` tokens whose unhinted log-prob is lower than its
//!    hinted one by the arm's hidden reliance per token) and its `step_end`;
//! 5. waits for the step's metrics and its outcomes (`rl.hints.outcomes`).
//!
//! Every draw comes from one stream seeded by `--seed`. With
//! `--arm-reward transfer` the arms compete on what the policy keeps
//! without the hint (`transfer`), not on rescues: a leaky arm (rescues
//! often, high reliance) then loses to a teaching one. It prints a line per
//! step (arm shares, rescue and transfer rates) under a progress bar, and writes
//! `OUT/report.json` and `OUT/index.html` (the arm shares chart, the
//! per-step table and the eval report's arm table).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use plotters::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use hintstream::config::{ArmEntry, ClientKind, Config, LlmProvider, ModelPrice};
use hintstream::eval::arms::{arm_tables, RunArms};
use hintstream::eval::arms_html::run_table_html;
use hintstream::eval::markup::{escape, CONFIG_COLORS, STYLE};
use hintstream::messages::{decode, step_key, DecodeLimits, Hint, HintOutcome};

/// Dollars per million tokens the loopback models are priced at.
const INPUT_PER_MTOK: f64 = 3.0;
const OUTPUT_PER_MTOK: f64 = 15.0;
/// Tokens the loopback LLM reports per answer.
const LOOPBACK_USAGE: (u64, u64) = (400, 60);

/// The command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "simulate",
    about = "A simulated training run: arms with hidden rescue rates compete through the real stages over Kafka"
)]
pub struct SimArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "HINTSTREAM_BOOTSTRAP_SERVERS", default_value = "127.0.0.1:9092")]
    pub bootstrap_servers: String,
    /// An arm, its hidden rescue rate and (after `/`) its hidden reliance in
    /// nats per token (default 0: the policy keeps all of it), NAME=RATE,
    /// NAME=RATE/RELIANCE, or with `:static` for the static control; repeat
    /// it [default: strong=0.7 weak=0.1 control=0.05:static].
    #[arg(long = "arm", value_name = "NAME=RATE[/RELIANCE][:static]")]
    pub arms: Vec<String>,
    /// What the arms are rewarded by (`[hints] arm_reward`).
    #[arg(long, default_value = "rescue", value_parser = ["rescue", "transfer"])]
    pub arm_reward: String,
    /// Tokens of each hinted response (its `response_length`).
    #[arg(long, default_value_t = 32)]
    pub response_length: i64,
    /// Training steps.
    #[arg(long, default_value_t = 15)]
    pub steps: i64,
    /// Failed groups per step.
    #[arg(long, default_value_t = 40)]
    pub groups: usize,
    /// Trajectories per failed group.
    #[arg(long, default_value_t = 4)]
    pub group_size: usize,
    /// Hinted retries per group.
    #[arg(long, default_value_t = 2)]
    pub hinted_retries: usize,
    /// Tasks the failed groups are drawn from [default: 2 x --groups].
    #[arg(long)]
    pub tasks: Option<usize>,
    /// Added to the arm's rate for a hint that saw the task's earlier one.
    #[arg(long, default_value_t = 0.2)]
    pub refine_bonus: f64,
    /// The arm's rate is multiplied by this for a task's later hint that did
    /// not see the earlier one (0: it does not help).
    #[arg(long, default_value_t = 0.0)]
    pub blind_repeat: f64,
    /// Every arm's min_share.
    #[arg(long, default_value_t = 0.05)]
    pub min_share: f64,
    /// `[hints] half_life_steps` (unset: outcomes never fade).
    #[arg(long)]
    pub half_life_steps: Option<f64>,
    /// The seed of every draw.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Output folder: report.json, index.html, the stages' config and logs.
    #[arg(long, default_value = "sim-out")]
    pub out: PathBuf,
    /// The hintstream binary [default: the one next to this example, built
    /// by `cargo build`].
    #[arg(long)]
    pub hintstream: Option<PathBuf>,
    /// Topic partitions.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// How long to wait for one step's hints, metrics or outcomes.
    #[arg(long, default_value_t = 120)]
    pub step_timeout_secs: u64,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// An arm as simulated: its name, hidden rate and reliance, and whether it
/// is static.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimArm {
    pub name: String,
    pub rate: f64,
    /// How much a successful hinted response depends on the hint, in nats
    /// per token: its unhinted log-prob is `reliance × length` lower.
    #[serde(default)]
    pub reliance: f64,
    pub is_static: bool,
}

impl SimArm {
    /// The loopback model of an LLM arm.
    pub fn model(&self) -> String {
        format!("{}-model", self.name)
    }
}

/// `NAME=RATE[/RELIANCE][:static]`.
pub fn parse_arm(text: &str) -> anyhow::Result<SimArm> {
    let (name, rest) = text
        .split_once('=')
        .with_context(|| format!("--arm {text:?}: expected NAME=RATE[/RELIANCE][:static]"))?;
    let (rest, is_static) = match rest.strip_suffix(":static") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    let (rate, reliance) = rest.split_once('/').unwrap_or((rest, "0"));
    let rate: f64 = rate
        .parse()
        .with_context(|| format!("--arm {text:?}: the rate is not a number"))?;
    if !(0.0..=1.0).contains(&rate) {
        bail!("--arm {text:?}: the rate must be between 0 and 1");
    }
    let reliance: f64 = reliance
        .parse()
        .with_context(|| format!("--arm {text:?}: the reliance is not a number"))?;
    if !(0.0..=50.0).contains(&reliance) {
        bail!("--arm {text:?}: the reliance must be between 0 and 50 nats per token");
    }
    Ok(SimArm {
        name: name.to_string(),
        rate,
        reliance,
        is_static,
    })
}

impl SimArgs {
    /// The arms, the defaults when none is given.
    pub fn sim_arms(&self) -> anyhow::Result<Vec<SimArm>> {
        if self.arms.is_empty() {
            return ["strong=0.7", "weak=0.1", "control=0.05:static"]
                .iter()
                .map(|a| parse_arm(a))
                .collect();
        }
        self.arms.iter().map(|a| parse_arm(a)).collect()
    }
}

/// One step as the trainer saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRow {
    pub step: i64,
    /// Hints per arm (every arm present, 0 included).
    pub pulls: BTreeMap<String, u64>,
    /// Hints per arm whose retries succeeded.
    pub rescues: BTreeMap<String, u64>,
    /// The mean `transfer` of the step's outcomes per arm (as stage 2
    /// computed it from the log-probs); an arm without outcomes is absent.
    #[serde(default)]
    pub transfer: BTreeMap<String, f64>,
    /// Hints that refined an earlier one, and of those the ones that rescued.
    pub refined: u64,
    pub refined_rescues: u64,
    /// Outcomes stage 2 published for the step.
    pub outcomes: u64,
    /// Stage 2's metrics of the step (`rl.metrics`).
    pub metrics: BTreeMap<String, f64>,
    pub wall_secs: f64,
}

impl StepRow {
    /// The arm's share of the step's hints.
    pub fn share(&self, arm: &str) -> f64 {
        let total: u64 = self.pulls.values().sum();
        if total == 0 {
            return 0.0;
        }
        self.pulls.get(arm).copied().unwrap_or(0) as f64 / total as f64
    }

    /// The arm's rescue rate in the step; `None` without pulls.
    pub fn rescue_rate(&self, arm: &str) -> Option<f64> {
        let pulls = self.pulls.get(arm).copied().unwrap_or(0);
        (pulls > 0).then(|| self.rescues.get(arm).copied().unwrap_or(0) as f64 / pulls as f64)
    }
}

/// `report.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    pub run_id: String,
    pub arms: Vec<SimArm>,
    pub seed: u64,
    /// `rescue` or `transfer`.
    #[serde(default)]
    pub arm_reward: String,
    pub groups: usize,
    pub group_size: usize,
    pub hinted_retries: usize,
    pub tasks: usize,
    pub refine_bonus: f64,
    pub blind_repeat: f64,
    pub min_share: f64,
    pub steps: Vec<StepRow>,
    /// The eval report's arm table over the run's hints and outcomes.
    pub arm_table: Vec<RunArms>,
    /// LLM requests per model the loopback server answered.
    pub llm_requests: BTreeMap<String, u64>,
    /// Stage 1's per-arm Prometheus series at the end (`hintstream_hints_arm_*`
    /// by series, labels included).
    pub prometheus: BTreeMap<String, f64>,
    pub wall_secs: f64,
}

impl SimReport {
    /// The step table as text: one line per step, arm shares, rescue rates
    /// and transfer rates.
    pub fn table(&self) -> String {
        let mut out = String::from("step");
        for a in &self.arms {
            let _ = write!(out, " | {:>26}", format!("{} share/rescue/transfer", a.name));
        }
        out.push_str(" | refined | outcomes\n");
        for s in &self.steps {
            let _ = write!(out, "{:>4}", s.step);
            for a in &self.arms {
                let rate = s
                    .rescue_rate(&a.name)
                    .map_or_else(|| "  -".to_string(), |r| format!("{:>3.0}", r * 100.0));
                let transfer = s
                    .transfer
                    .get(&a.name)
                    .map_or_else(|| "    -".to_string(), |t| format!("{t:>5.3}"));
                let _ = write!(
                    out,
                    " | {:>12.0}% / {rate}% / {transfer}",
                    s.share(&a.name) * 100.0
                );
            }
            let _ = writeln!(out, " | {:>7} | {:>8}", s.refined, s.outcomes);
        }
        out
    }
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = SimArgs::parse();
    let report = run(&args).await?;
    println!("{}", report.table());
    println!(
        "wrote {} and {}",
        args.out.join("report.json").display(),
        args.out.join("index.html").display()
    );
    Ok(())
}

/// Runs the simulation and writes the report into `args.out`.
pub async fn run(args: &SimArgs) -> anyhow::Result<SimReport> {
    let arms = args.sim_arms()?;
    let started = Instant::now();
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let llm = LoopbackLlm::start().await?;
    let id = format!("sim-{:08x}", rand::random::<u32>());
    let mut config = stage_config(args, &arms, &id, &llm.base_url());
    config.hints.stage.metrics_addr = free_loopback_addr()?;
    let config_path = args.out.join("hintstream.toml");
    std::fs::write(&config_path, toml::to_string(&config)?)?;
    let topics = hintstream::stages::design_topics(&config);
    hintstream::kafka::admin::create_topics(&config, &topics, args.partitions)
        .await
        .context("creating the topics")?;
    let mut feeds = Feeds::start(&config)?;
    let binary = hintstream_binary(args)?;
    let _stages = [
        Stage::spawn(&binary, "hints", &config_path, &args.out)?,
        Stage::spawn(&binary, "advantages", &config_path, &args.out)?,
    ];
    let producer: FutureProducer =
        hintstream::kafka::create_producer(&config).context("creating the producer")?;
    let mut trainer = Trainer::new(args, arms.clone(), id.clone(), &config, producer);
    let bar = progress(args);
    let mut steps = Vec::new();
    for step in 1..=args.steps {
        let row = trainer.step(step, &mut feeds).await?;
        bar.println(step_line(&row, &arms));
        bar.inc(1);
        steps.push(row);
    }
    bar.finish_and_clear();
    let prometheus = arm_series(&config.hints.stage.metrics_addr).await;
    let (arm_table, _) = arm_tables(&feeds.hints, &feeds.outcomes, Some(&config))?;
    let report = SimReport {
        run_id: id,
        arms,
        seed: args.seed,
        arm_reward: args.arm_reward.clone(),
        groups: args.groups,
        group_size: args.group_size,
        hinted_retries: args.hinted_retries,
        tasks: trainer.tasks,
        refine_bonus: args.refine_bonus,
        blind_repeat: args.blind_repeat,
        min_share: args.min_share,
        steps,
        arm_table,
        llm_requests: llm.requests(),
        prometheus,
        wall_secs: started.elapsed().as_secs_f64(),
    };
    write_report(&report, &args.out)?;
    Ok(report)
}

/// A loopback `HOST:PORT` nothing listens on now.
fn free_loopback_addr() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// Stage 1's `hintstream_hints_arm_*` series from its endpoint (empty when
/// it does not answer).
async fn arm_series(addr: &str) -> BTreeMap<String, f64> {
    let Ok(response) = reqwest::get(format!("http://{addr}/metrics")).await else {
        return BTreeMap::new();
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("hintstream_hints_arm_"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn progress(args: &SimArgs) -> indicatif::ProgressBar {
    if args.no_progress {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(args.steps.max(0) as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:40} step {pos}/{len} {elapsed}") {
        bar.set_style(style);
    }
    bar
}

/// `step 3 | strong 80% (rescue 72%) | ...`.
fn step_line(row: &StepRow, arms: &[SimArm]) -> String {
    let mut line = format!("step {:>3}", row.step);
    for a in arms {
        let rate = row
            .rescue_rate(&a.name)
            .map_or_else(|| "-".to_string(), |r| format!("{:.0}%", r * 100.0));
        let transfer = row
            .transfer
            .get(&a.name)
            .map_or_else(|| "-".to_string(), |t| format!("{t:.3}"));
        let _ = write!(
            line,
            " | {} {:.0}% (rescue {rate}, transfer {transfer})",
            a.name,
            row.share(&a.name) * 100.0
        );
    }
    let _ = write!(line, " | refined {} | {:.1}s", row.refined, row.wall_secs);
    line
}

/// The stages' config: topics of the simulation's own, one arm per `--arm`,
/// the loopback LLM, no rate limit, a short group wait.
fn stage_config(args: &SimArgs, arms: &[SimArm], id: &str, base_url: &str) -> Config {
    let mut c = Config {
        bootstrap_servers: args.bootstrap_servers.clone(),
        ..Config::default()
    };
    let t = &mut c.topics;
    t.failed = format!("{id}.failed");
    t.hints = format!("{id}.hints");
    t.scored = format!("{id}.scored");
    t.advantages = format!("{id}.advantages");
    t.metrics = format!("{id}.metrics");
    t.outcomes = format!("{id}.outcomes");
    t.partitions = args.partitions;
    c.hints.stage.input_topic = c.topics.failed.clone();
    c.hints.stage.output_topic = c.topics.hints.clone();
    c.hints.stage.dlq_topic = format!("{id}.failed.dlq");
    c.hints.stage.group_id = format!("{id}-hints");
    c.hints.stage.metrics_addr = "127.0.0.1:0".into();
    c.hints.group_wait_ms = 300;
    c.hints.half_life_steps = args.half_life_steps;
    c.hints.arm_reward =
        serde_json::from_value(serde_json::Value::from(args.arm_reward.as_str())).unwrap_or_default();
    c.advantages.stage.input_topic = c.topics.scored.clone();
    c.advantages.stage.output_topic = c.topics.advantages.clone();
    c.advantages.stage.dlq_topic = format!("{id}.scored.dlq");
    c.advantages.stage.group_id = format!("{id}-advantages");
    c.advantages.stage.metrics_addr = "127.0.0.1:0".into();
    c.llm.provider = LlmProvider::Openai;
    c.llm.base_url = base_url.to_string();
    c.llm.requests_per_minute = 0;
    c.llm.timeout_secs = 10.0;
    for a in arms.iter().filter(|a| !a.is_static) {
        c.llm.models.push(a.model());
        c.llm
            .prices
            .insert(a.model(), ModelPrice::new(INPUT_PER_MTOK, OUTPUT_PER_MTOK));
    }
    c.hints.arms = arms
        .iter()
        .map(|a| ArmEntry {
            name: a.name.clone(),
            prompt_version: None,
            models: if a.is_static { vec![] } else { vec![a.model()] },
            is_static: a.is_static,
            weight: 1.0,
            min_share: args.min_share,
            prior_alpha: 1.0,
            prior_beta: 1.0,
            levels: vec![],
        })
        .collect();
    c
}

fn hintstream_binary(args: &SimArgs) -> anyhow::Result<PathBuf> {
    let candidate = match (&args.hintstream, std::env::var_os("CARGO_BIN_EXE_hintstream")) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => PathBuf::from(p),
        // target/<profile>/examples/simulate -> target/<profile>/hintstream
        (None, None) => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("hintstream"))
            .unwrap_or_else(|| PathBuf::from("target/debug/hintstream")),
    };
    if !candidate.exists() {
        bail!(
            "{} is missing: run `cargo build` first or pass --hintstream",
            candidate.display()
        );
    }
    Ok(candidate)
}

/// A stage process, killed on drop; its stderr in `OUT/<stage>.log`.
struct Stage(Child);

impl Stage {
    fn spawn(binary: &Path, stage: &str, config: &Path, out: &Path) -> anyhow::Result<Stage> {
        let log = std::fs::File::create(out.join(format!("{stage}.log")))?;
        let child = Command::new(binary)
            .args([stage, "--config"])
            .arg(config)
            .env("OPENAI_API_KEY", "sim")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENROUTER_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {} {stage}", binary.display()))?;
        Ok(Stage(child))
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The loopback OpenAI-compatible server: each model answers with a hint
/// text of its own, instantly.
struct LoopbackLlm {
    addr: std::net::SocketAddr,
    requests: Arc<Mutex<BTreeMap<String, u64>>>,
    _server: tokio::task::JoinHandle<()>,
}

impl LoopbackLlm {
    async fn start() -> anyhow::Result<LoopbackLlm> {
        use axum::routing::{get, post};
        let requests: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let counted = requests.clone();
        let app = axum::Router::new()
            .route(
                "/v1/chat/completions",
                post(move |body: String| {
                    let counted = counted.clone();
                    async move {
                        let request: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                        json_response(answer(&request, &counted))
                    }
                }),
            )
            .route(
                "/v1/models",
                get(|| async { json_response(serde_json::json!({"data": []})) }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(LoopbackLlm {
            addr,
            requests,
            _server: server,
        })
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn requests(&self) -> BTreeMap<String, u64> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

fn json_response(value: serde_json::Value) -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
}

/// A chat completion naming the model, and whether it saw earlier hints.
fn answer(body: &serde_json::Value, counted: &Mutex<BTreeMap<String, u64>>) -> serde_json::Value {
    let model = body["model"].as_str().unwrap_or("unknown").to_string();
    let refined = body
        .to_string()
        .contains(hintstream::llm::prompt::earlier::HEADING);
    if let Ok(mut c) = counted.lock() {
        *c.entry(model.clone()).or_default() += 1;
    }
    let text = if refined {
        format!("[{model}] The earlier hint did not work: check the boundary case before the loop this time.")
    } else {
        format!("[{model}] Re-read the task: check the boundary case before the loop.")
    };
    serde_json::json!({
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": LOOPBACK_USAGE.0, "completion_tokens": LOOPBACK_USAGE.1},
    })
}

/// What the trainer reads: hints, metrics and outcomes, each topic read from
/// the beginning by a task of its own.
struct Feeds {
    hints_rx: mpsc::UnboundedReceiver<Hint>,
    metrics_rx: mpsc::UnboundedReceiver<(String, BTreeMap<String, f64>)>,
    outcomes_rx: mpsc::UnboundedReceiver<HintOutcome>,
    /// Everything read so far, in order.
    hints: Vec<Hint>,
    outcomes: Vec<HintOutcome>,
    metrics: HashMap<String, BTreeMap<String, f64>>,
}

impl Feeds {
    fn start(config: &Config) -> anyhow::Result<Feeds> {
        let limits = DecodeLimits::default();
        let hints_rx = read_topic(config, &config.topics.hints, move |_, v| {
            decode::<Hint>(v, limits).ok()
        })?;
        let outcomes_rx = read_topic(config, &config.topics.outcomes, move |_, v| {
            decode::<HintOutcome>(v, limits).ok()
        })?;
        let metrics_rx = read_topic(config, &config.topics.metrics, |key, v| {
            let key = String::from_utf8_lossy(key?).into_owned();
            serde_json::from_slice::<BTreeMap<String, f64>>(v)
                .ok()
                .map(|m| (key, m))
        })?;
        Ok(Feeds {
            hints_rx,
            metrics_rx,
            outcomes_rx,
            hints: Vec::new(),
            outcomes: Vec::new(),
            metrics: HashMap::new(),
        })
    }
}

/// Reads `topic` from the beginning (a group of its own), sending what
/// `parse` makes of each record.
fn read_topic<T: Send + 'static>(
    config: &Config,
    topic: &str,
    parse: impl Fn(Option<&[u8]>, &[u8]) -> Option<T> + Send + 'static,
) -> anyhow::Result<mpsc::UnboundedReceiver<T>> {
    let mut client = hintstream::kafka::client_config(config, ClientKind::Consumer);
    client
        .set("group.id", format!("{topic}-trainer-{}", rand::random::<u32>()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false");
    let consumer: StreamConsumer = client.create()?;
    consumer.subscribe(&[topic])?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok(m) = consumer.recv().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            if let Some(value) = m.payload().and_then(|v| parse(m.key(), v)) {
                if tx.send(value).is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// What the trainer knows of a task.
#[derive(Debug, Clone, Default)]
struct TaskState {
    /// The task's last hint, when it did not rescue the task.
    last_unhelpful: Option<String>,
}

/// The trainer: tasks, the seeded stream, and the producer.
struct Trainer {
    args: SimArgs,
    arms: Vec<SimArm>,
    run_id: String,
    tasks: usize,
    task_state: Vec<TaskState>,
    rng: ChaCha8Rng,
    producer: FutureProducer,
    failed_topic: String,
    scored_topic: String,
}

impl Trainer {
    fn new(
        args: &SimArgs,
        arms: Vec<SimArm>,
        run_id: String,
        config: &Config,
        producer: FutureProducer,
    ) -> Self {
        let tasks = args.tasks.unwrap_or(2 * args.groups).max(args.groups);
        Trainer {
            args: args.clone(),
            arms,
            run_id,
            tasks,
            task_state: vec![TaskState::default(); tasks],
            rng: ChaCha8Rng::seed_from_u64(args.seed),
            producer,
            failed_topic: config.topics.failed.clone(),
            scored_topic: config.topics.scored.clone(),
        }
    }

    /// One step: failed groups out, hints in, scored rollouts out, metrics
    /// and outcomes in.
    async fn step(&mut self, step: i64, feeds: &mut Feeds) -> anyhow::Result<StepRow> {
        let started = Instant::now();
        let chosen = rand::seq::index::sample(&mut self.rng, self.tasks, self.args.groups).into_vec();
        let mut chosen = chosen;
        chosen.sort_unstable();
        for &task in &chosen {
            self.publish_failed(step, task).await?;
        }
        let wanted: HashSet<String> = chosen.iter().map(|&t| task_name(t)).collect();
        let hints = self.wait_hints(step, &wanted, feeds).await?;
        let mut row = StepRow {
            step,
            pulls: self.arms.iter().map(|a| (a.name.clone(), 0)).collect(),
            rescues: self.arms.iter().map(|a| (a.name.clone(), 0)).collect(),
            transfer: BTreeMap::new(),
            refined: 0,
            refined_rescues: 0,
            outcomes: 0,
            metrics: BTreeMap::new(),
            wall_secs: 0.0,
        };
        let mut scored = Vec::new();
        for &task in &chosen {
            let hint = &hints[&task_name(task)];
            let (rescued, refined) = self.decide(task, hint);
            *row.pulls.entry(hint.arm.clone()).or_default() += 1;
            if rescued {
                *row.rescues.entry(hint.arm.clone()).or_default() += 1;
            }
            if refined {
                row.refined += 1;
                row.refined_rescues += u64::from(rescued);
            }
            scored.extend(self.scored_rows(step, task, hint, rescued));
        }
        let count = scored.len();
        for value in scored {
            self.send(&self.scored_topic.clone(), &step_key(&self.run_id, step), &value)
                .await?;
        }
        let end = serde_json::json!({
            "type": "step_end", "schema_version": 1, "run_id": self.run_id, "step": step, "count": count
        });
        self.send(&self.scored_topic.clone(), &step_key(&self.run_id, step), &end)
            .await?;
        row.metrics = self.wait_metrics(step, feeds).await?;
        let hint_ids: HashSet<&str> = hints.values().map(|h| h.hint_id.as_str()).collect();
        row.outcomes = self.wait_outcomes(step, &hint_ids, feeds).await?;
        row.transfer = transfer_by_arm(&hints, &feeds.outcomes);
        row.wall_secs = started.elapsed().as_secs_f64();
        Ok(row)
    }

    /// Whether the hint's retries succeed, and whether it refined the
    /// task's last unhelpful hint.
    fn decide(&mut self, task: usize, hint: &Hint) -> (bool, bool) {
        let rate = self
            .arms
            .iter()
            .find(|a| a.name == hint.arm)
            .map_or(0.0, |a| a.rate);
        let state = &self.task_state[task];
        let (p, refined) = match &state.last_unhelpful {
            None => (rate, false),
            Some(earlier) if hint.refines.contains(earlier) => {
                ((rate + self.args.refine_bonus).min(1.0), true)
            }
            Some(_) => (rate * self.args.blind_repeat, false),
        };
        let rescued = self.rng.random::<f64>() < p;
        self.task_state[task].last_unhelpful = (!rescued).then(|| hint.hint_id.clone());
        (rescued, refined)
    }

    async fn publish_failed(&self, step: i64, task: usize) -> anyhow::Result<()> {
        let instance = task_name(task);
        for member in 0..self.args.group_size {
            let value = serde_json::json!({
                "schema_version": 1,
                "run_id": self.run_id,
                "step": step,
                "instance_id": instance,
                "trajectory_id": format!("{instance}-s{step}-t{member}"),
                "task_prompt": format!("Solve {instance}: return the sum of the list's even numbers."),
                "chat_history": [
                    {"role": "user", "content": format!("Solve {instance}.")},
                    {"role": "assistant", "content": "def f(xs): return sum(xs)"}
                ],
                "verifier_error": "AssertionError: f([1, 2]) == 2, got 3",
                "reward": 0.0,
                "group_size": self.args.group_size,
            });
            let key = hintstream::messages::group_key(&self.run_id, step, &instance);
            self.send(&self.failed_topic, &key, &value).await?;
        }
        Ok(())
    }

    /// The group's raw rows (all failed) and hinted retries, these with the
    /// log-probs a trainer reports: the response under the hinted prompt at
    /// 0.5 nats a token, under the unhinted one lower by the arm's hidden
    /// reliance a token.
    fn scored_rows(&self, step: i64, task: usize, hint: &Hint, rescued: bool) -> Vec<serde_json::Value> {
        let instance = task_name(task);
        let reliance = self
            .arms
            .iter()
            .find(|a| a.name == hint.arm)
            .map_or(0.0, |a| a.reliance);
        let length = self.args.response_length.max(1);
        let logprob_hinted = -0.5 * length as f64;
        let row = |id: String, reward: f64, hinted: bool| {
            let mut v = serde_json::json!({
                "type": "scored_rollout", "schema_version": 1, "run_id": self.run_id, "step": step,
                "instance_id": instance, "trajectory_id": id, "reward": reward, "is_hinted": hinted,
            });
            if hinted {
                v["hint_id"] = hint.hint_id.clone().into();
                v["hint_category"] = hint.category.as_str().into();
                v["response_length"] = length.into();
                v["logprob_hinted"] = logprob_hinted.into();
                v["logprob_unhinted"] = (logprob_hinted - reliance * length as f64).into();
            }
            v
        };
        let mut rows: Vec<_> = (0..self.args.group_size)
            .map(|m| row(format!("{instance}-s{step}-t{m}"), 0.0, false))
            .collect();
        for r in 0..self.args.hinted_retries {
            let reward = if rescued && r == 0 { 1.0 } else { 0.0 };
            rows.push(row(format!("{instance}-s{step}-h{r}"), reward, true));
        }
        rows
    }

    async fn send(&self, topic: &str, key: &str, value: &serde_json::Value) -> anyhow::Result<()> {
        let payload = value.to_string();
        self.producer
            .send(
                FutureRecord::to(topic).key(key).payload(&payload),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| anyhow::anyhow!("publishing to {topic}: {e}"))?;
        Ok(())
    }

    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs(self.args.step_timeout_secs)
    }

    /// Every wanted group's hint of `step` (the first one read of each).
    async fn wait_hints(
        &self,
        step: i64,
        wanted: &HashSet<String>,
        feeds: &mut Feeds,
    ) -> anyhow::Result<HashMap<String, Hint>> {
        let mut got: HashMap<String, Hint> = feeds
            .hints
            .iter()
            .filter(|h| h.run_id == self.run_id && h.step == step && wanted.contains(&h.instance_id))
            .map(|h| (h.instance_id.clone(), h.clone()))
            .collect();
        let deadline = self.deadline();
        while got.len() < wanted.len() {
            let hint = recv_until(&mut feeds.hints_rx, deadline).await.with_context(|| {
                format!(
                    "step {step}: {} of {} hints arrived (see OUT/hints.log)",
                    got.len(),
                    wanted.len()
                )
            })?;
            if hint.run_id == self.run_id && hint.step == step && wanted.contains(&hint.instance_id) {
                got.entry(hint.instance_id.clone())
                    .or_insert_with(|| hint.clone());
            }
            feeds.hints.push(hint);
        }
        Ok(got)
    }

    async fn wait_metrics(&self, step: i64, feeds: &mut Feeds) -> anyhow::Result<BTreeMap<String, f64>> {
        let key = step_key(&self.run_id, step);
        let deadline = self.deadline();
        loop {
            if let Some(m) = feeds.metrics.get(&key) {
                return Ok(m.clone());
            }
            let (k, m) = recv_until(&mut feeds.metrics_rx, deadline)
                .await
                .with_context(|| format!("step {step}: no step metrics (see OUT/advantages.log)"))?;
            feeds.metrics.insert(k, m);
        }
    }

    /// Waits for the outcome of each of the step's hints; their count.
    async fn wait_outcomes(
        &self,
        step: i64,
        hint_ids: &HashSet<&str>,
        feeds: &mut Feeds,
    ) -> anyhow::Result<u64> {
        let seen = |outcomes: &[HintOutcome]| -> usize {
            outcomes
                .iter()
                .filter(|o| {
                    o.run_id == self.run_id && o.step == step && hint_ids.contains(o.hint_id.as_str())
                })
                .map(|o| o.hint_id.as_str())
                .collect::<HashSet<_>>()
                .len()
        };
        let deadline = self.deadline();
        while seen(&feeds.outcomes) < hint_ids.len() {
            let o = recv_until(&mut feeds.outcomes_rx, deadline)
                .await
                .with_context(|| {
                    format!(
                        "step {step}: {} of {} outcomes arrived (see OUT/advantages.log)",
                        seen(&feeds.outcomes),
                        hint_ids.len()
                    )
                })?;
            feeds.outcomes.push(o);
        }
        Ok(seen(&feeds.outcomes) as u64)
    }
}

/// The mean `transfer` per arm of the outcomes of `hints` (by hint id;
/// the latest outcome of each), over those that carry one.
fn transfer_by_arm(hints: &HashMap<String, Hint>, outcomes: &[HintOutcome]) -> BTreeMap<String, f64> {
    let arm_of: HashMap<&str, &str> = hints
        .values()
        .map(|h| (h.hint_id.as_str(), h.arm.as_str()))
        .collect();
    let mut latest: HashMap<&str, f64> = HashMap::new();
    for o in outcomes {
        if let (true, Some(t)) = (arm_of.contains_key(o.hint_id.as_str()), o.transfer) {
            latest.insert(o.hint_id.as_str(), t);
        }
    }
    let mut sums: BTreeMap<String, (f64, u32)> = BTreeMap::new();
    for (id, t) in latest {
        let sum = sums.entry(arm_of[id].to_string()).or_default();
        *sum = (sum.0 + t, sum.1 + 1);
    }
    sums.into_iter()
        .map(|(arm, (sum, n))| (arm, sum / f64::from(n)))
        .collect()
}

fn task_name(task: usize) -> String {
    format!("task-{task:03}")
}

/// The next item, or `None` once `deadline` passed or the feed ended.
async fn recv_until<T>(rx: &mut mpsc::UnboundedReceiver<T>, deadline: Instant) -> Option<T> {
    let left = deadline.saturating_duration_since(Instant::now());
    tokio::time::timeout(left, rx.recv()).await.ok().flatten()
}

/// The arm's colour in the chart and tables.
pub fn arm_color(index: usize) -> (u8, u8, u8) {
    CONFIG_COLORS[index % CONFIG_COLORS.len()]
}

fn write_report(report: &SimReport, out: &Path) -> anyhow::Result<()> {
    std::fs::write(out.join("report.json"), serde_json::to_vec_pretty(report)?)?;
    std::fs::write(out.join("index.html"), render(report))?;
    Ok(())
}

/// `index.html`: the arm shares chart, the per-step table, the arm table.
pub fn render(report: &SimReport) -> String {
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>hintstream simulation</title><style>{STYLE}</style></head><body>\n\
         <h1>hintstream simulation</h1>\n<p class=\"meta\">run {} — {} steps of {} failed groups, seed {}, arms rewarded by {}, hidden rates: {}; a refined hint +{}, a blind repeat x{}</p>\n",
        escape(&report.run_id),
        report.steps.len(),
        report.groups,
        report.seed,
        escape(&report.arm_reward),
        report
            .arms
            .iter()
            .map(|a| format!(
                "{} {} (reliance {}){}",
                escape(&a.name),
                a.rate,
                a.reliance,
                if a.is_static { " (static)" } else { "" }
            ))
            .collect::<Vec<_>>()
            .join(", "),
        report.refine_bonus,
        report.blind_repeat,
    );
    let _ = writeln!(
        page,
        "<figure id=\"plot-arm-shares\">{}</figure>",
        share_chart(report)
    );
    step_table(report, &mut page);
    page.push_str("<h2>Arms</h2>\n");
    for (i, run) in report.arm_table.iter().enumerate() {
        run_table_html(run, i, &mut page);
    }
    page.push_str("</body></html>\n");
    page
}

fn step_table(report: &SimReport, page: &mut String) {
    page.push_str("<h2>Steps</h2>\n<table id=\"steps\"><tr><th>step</th>");
    for (i, a) in report.arms.iter().enumerate() {
        let (r, g, b) = arm_color(i);
        let _ = write!(
            page,
            "<th style=\"border-bottom: 4px solid rgb({r},{g},{b})\">{} share / rescue / transfer</th>",
            escape(&a.name)
        );
    }
    page.push_str("<th>refined (rescued)</th><th>outcomes</th><th>wall (s)</th></tr>\n");
    for s in &report.steps {
        let _ = write!(page, "<tr><td class=\"num\">{}</td>", s.step);
        for a in &report.arms {
            let rate = s
                .rescue_rate(&a.name)
                .map_or_else(|| "–".to_string(), |r| format!("{:.0}%", r * 100.0));
            let transfer = s
                .transfer
                .get(&a.name)
                .map_or_else(|| "–".to_string(), |t| format!("{t:.3}"));
            let _ = write!(
                page,
                "<td class=\"num\">{:.0}% ({}) / {rate} / {transfer}</td>",
                s.share(&a.name) * 100.0,
                s.pulls.get(&a.name).copied().unwrap_or(0)
            );
        }
        let _ = writeln!(
            page,
            "<td class=\"num\">{} ({})</td><td class=\"num\">{}</td><td class=\"num\">{:.1}</td></tr>",
            s.refined, s.refined_rescues, s.outcomes, s.wall_secs
        );
    }
    page.push_str("</table>\n");
}

/// Stacked areas: each arm's share of the step's hints, one colour per arm,
/// with a legend.
fn share_chart(report: &SimReport) -> String {
    let mut out = String::new();
    let steps: Vec<i64> = report.steps.iter().map(|s| s.step).collect();
    let (first, last) = (
        steps.first().copied().unwrap_or(0) as f64,
        steps.last().copied().unwrap_or(1).max(1) as f64,
    );
    let result = (|| -> Result<(), String> {
        let root = SVGBackend::with_string(&mut out, (900, 380)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Arm shares of the hints per step", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(first..last.max(first + 1.0), 0f64..1f64)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("step")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("share")
            .y_label_formatter(&|y| format!("{:.0}%", y * 100.0))
            .draw()
            .map_err(|e| e.to_string())?;
        let mut below = vec![0.0; report.steps.len()];
        for (i, arm) in report.arms.iter().enumerate() {
            let (r, g, b) = arm_color(i);
            let color = RGBColor(r, g, b);
            let above: Vec<f64> = report
                .steps
                .iter()
                .zip(&below)
                .map(|(s, lo)| lo + s.share(&arm.name))
                .collect();
            let mut points: Vec<(f64, f64)> =
                steps.iter().zip(&above).map(|(&s, &y)| (s as f64, y)).collect();
            points.extend(steps.iter().zip(&below).rev().map(|(&s, &y)| (s as f64, y)));
            chart
                .draw_series(std::iter::once(Polygon::new(points, color.filled())))
                .map_err(|e| e.to_string())?
                .label(arm.name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
            below = above;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())
    })();
    match result {
        Ok(()) => out,
        Err(e) => format!("<p>plot unavailable: {}</p>", escape(&e)),
    }
}
