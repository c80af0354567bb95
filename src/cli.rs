//! The command-line surface: subcommands, their flags and how flags map onto
//! config settings. Names are part of the contract (the book's Concepts,
//! "Commands").

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ConfigError, NormalizeFlags, Overrides};
use crate::eval::EvalOptions;
use crate::llm::cassette::CassetteMode;
use crate::telemetry::LogFormat;
use crate::tools::{record::RecordOptions, replay::ReplayOptions};

const AFTER_HELP: &str = "\
Configuration is layered: built-in defaults, then the config file
(--config, or ./hintstream.toml when it exists), then environment variables
HINTSTREAM_<SECTION>__<KEY> (for example HINTSTREAM_HINTS__GROUP_ID), then flags.
`hintstream config` prints the result with secrets redacted.
TOKIO_WORKER_THREADS sets the async runtime's worker threads (default: one a
core the process may use, a CPU limit counted).

Exit codes: 0 done, 1 runtime failure, 2 bad usage or configuration.";

#[derive(Debug, Parser)]
#[command(
    name = "hintstream",
    version,
    about = "Rescue the GRPO signal of all-failed prompts: LLM hints over Kafka, and hint-augmented advantages",
    after_help = AFTER_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Config file (TOML). Default: ./hintstream.toml when it exists.
    /// `eval` takes it more than once, one run per config.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Vec<PathBuf>,
    /// Kafka bootstrap servers, comma-separated
    /// [env: HINTSTREAM_BOOTSTRAP_SERVERS] [default: 127.0.0.1:9092].
    #[arg(long, global = true, value_name = "LIST")]
    pub bootstrap_servers: Option<String>,
    /// Log format on stderr; the level comes from RUST_LOG (default info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Flags every stage takes; each maps onto the stage's config section.
#[derive(Debug, Clone, Default, Args)]
pub struct StageArgs {
    /// Consumer group; processes with the same id share the partitions.
    #[arg(long)]
    pub group_id: Option<String>,
    /// Topic to consume.
    #[arg(long)]
    pub input_topic: Option<String>,
    /// Topic to publish results to.
    #[arg(long)]
    pub output_topic: Option<String>,
    /// Dead-letter topic for input that can never be processed.
    #[arg(long)]
    pub dlq_topic: Option<String>,
    /// Prometheus endpoint HOST:PORT (port 0 picks a free one and logs it).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// This worker's stable id, required by `kafka.delivery = "exactly_once"`
    /// (its `transactional.id` is `<kafka.transactional_id_prefix>-<stage>-<id>`):
    /// the same across restarts of this worker, unique among the stage's
    /// workers. On Kubernetes, a StatefulSet's pod name (`hints-0`) through
    /// the downward API.
    #[arg(long, env = "HINTSTREAM_WORKER_ID", value_name = "ID")]
    pub worker_id: Option<String>,
}

impl StageArgs {
    /// The flags that were given, as `(section, key, value)` overrides.
    pub fn overrides(&self, section: &str) -> Vec<(String, String, serde_json::Value)> {
        [
            ("group_id", &self.group_id),
            ("input_topic", &self.input_topic),
            ("output_topic", &self.output_topic),
            ("dlq_topic", &self.dlq_topic),
            ("metrics_addr", &self.metrics_addr),
        ]
        .into_iter()
        .filter_map(|(key, value)| {
            value.as_ref().map(|v| {
                (
                    section.to_string(),
                    key.to_string(),
                    serde_json::Value::String(v.clone()),
                )
            })
        })
        .chain(self.worker_id.as_ref().map(|id| {
            (
                "kafka".to_string(),
                "worker_id".to_string(),
                serde_json::Value::String(id.clone()),
            )
        }))
        .collect()
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole pipeline on a bundled sample training step: an embedded
    /// Kafka-protocol broker (or --bootstrap-servers), two hint workers and
    /// the advantage stage in one process. Prints hints, step metrics and the
    /// metrics endpoints. Uses ANTHROPIC_API_KEY / OPENAI_API_KEY when set,
    /// static hints otherwise.
    Quickstart {
        /// Folder with failed_trajectories.jsonl and scored_rollouts.jsonl
        /// [default: examples/data].
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
    },
    /// Stage 1: consume failed trajectories, publish one LLM hint per failed
    /// group (static fallback without a key or when the LLM fails).
    ///
    /// The model API comes from ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL, or
    /// OPENAI_API_KEY / OPENAI_BASE_URL for OpenAI-compatible servers (vLLM,
    /// OpenRouter, LiteLLM, Ollama), and the [llm] config section.
    Hints {
        #[command(flatten)]
        stage: StageArgs,
    },
    /// Stage 2: consume scored rollouts, publish hint-augmented GRPO
    /// advantages (Arrow IPC) and step metrics. `advantages compute` works on
    /// files instead.
    Advantages {
        #[command(flatten)]
        stage: StageArgs,
        #[command(subcommand)]
        action: Option<AdvantagesAction>,
    },
    /// Create the pipeline's topics (and dead-letter topics).
    Topics {
        #[command(subcommand)]
        action: TopicsAction,
    },
    /// Publish a JSONL file of messages, keyed from their fields.
    Produce {
        /// Topic to publish to.
        #[arg(long)]
        topic: String,
        /// JSONL file, one message per line.
        file: PathBuf,
    },
    /// Copy a topic into a JSONL file (key, value, headers, partition, offset,
    /// timestamp), up to the end it had when recording started.
    Record(RecordArgs),
    /// Produce a `record` file back into a topic, keeping keys, headers and
    /// per-key order.
    Replay(ReplayArgs),
    /// Evaluate hint synthesis offline: stage 1's synthesis over a recorded
    /// failed-trajectory topic, under each --config, without a broker.
    ///
    /// Writes OUT/report.json and OUT/index.html (summary per config:
    /// category mix, fallback rate and reasons, latency percentiles, tokens,
    /// cost, hint length; plots; the hints side by side per group). Every LLM
    /// exchange is kept in a cassette (default OUT/cassette.jsonl); rerun with
    /// --playback to answer from it: deterministic, no HTTP, no cost.
    ///
    /// With --hints (and --outcomes) recorded from a run, adds the arm table;
    /// with --hints alone and no --input, the arm table without synthesis.
    ///
    /// Example: hintstream eval --input failed.jsonl --config sonnet.toml
    /// --config haiku.toml --out eval-out
    Eval(EvalArgs),
    /// Print the effective configuration (secrets redacted) and exit;
    /// `config reference` prints every key instead.
    Config {
        #[command(subcommand)]
        action: Option<ConfigAction>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Print the configuration reference as Markdown: every key as the file
    /// writes it, its type, default, environment variable and meaning
    /// (docs/configuration.md is this output).
    Reference,
}

#[derive(Debug, Subcommand)]
pub enum AdvantagesAction {
    /// Compute advantages for a file, without Kafka.
    ///
    /// Input: JSONL of scored_rollout rows (rows of one run_id/step form one
    /// batch) or Arrow IPC (`.arrow`; strings plain or dictionary-encoded,
    /// reward f32 or f64, step any integer type). Output: JSONL rows
    /// {run_id, step, trajectory_id, instance_id, advantage} in input order, or
    /// Arrow IPC when the name ends in `.arrow`.
    Compute(ComputeArgs),
}

/// The flags of `hintstream record`.
#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// Topic to record.
    #[arg(long)]
    pub topic: String,
    /// Output JSONL file.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Stop after this many messages.
    #[arg(long, value_name = "N")]
    pub max_messages: Option<u64>,
    /// Fail when nothing arrives for this many seconds before the end.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub idle_timeout_secs: u64,
}

/// The flags of `hintstream replay`.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// A file written by `hintstream record`.
    pub file: PathBuf,
    /// Target topic (default: each message's recorded topic).
    #[arg(long)]
    pub topic: Option<String>,
    /// Messages per second (default: as fast as the broker takes them).
    #[arg(long, value_name = "N", conflicts_with = "speed")]
    pub rate: Option<f64>,
    /// Keep the recorded pace, from the messages' timestamps, sped up X
    /// times (1 = as recorded, 10 = ten times faster).
    #[arg(long, value_name = "X")]
    pub speed: Option<f64>,
    /// Send each message to its recorded partition instead of by key.
    #[arg(long)]
    pub keep_partitions: bool,
}

/// The flags of `hintstream eval`.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// Failed trajectories: a `hintstream record` file (or plain JSONL).
    /// Optional with --hints: the arm table alone, no synthesis.
    #[arg(long, value_name = "FILE", required_unless_present = "hints")]
    pub input: Option<PathBuf>,
    /// Recorded scored rollouts of the same run (a `record` file of
    /// rl.rollouts.scored, or JSONL rows): adds hint success rates per
    /// category and signal rescued per step, computed by stage 2.
    #[arg(long, value_name = "FILE")]
    pub scored: Option<PathBuf>,
    /// Recorded hints (a `record` file of rl.hints, or JSONL): adds the arm
    /// table (pulls, rescue rate with a 95% Wilson interval, posterior mean,
    /// spend, cost per rescue per arm and run), counted as stage 1 counts.
    #[arg(long, value_name = "FILE")]
    pub hints: Option<PathBuf>,
    /// Recorded outcomes (a `record` file of rl.hints.outcomes, or JSONL)
    /// for the arm table's rescues.
    #[arg(long, value_name = "FILE", requires = "hints")]
    pub outcomes: Option<PathBuf>,
    /// Output folder (created when missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The cassette file [default: OUT/cassette.jsonl]. Without
    /// --playback it is rewritten with this run's exchanges.
    #[arg(long, value_name = "FILE")]
    pub cassette: Option<PathBuf>,
    /// Answer LLM requests from the cassette; requests it lacks go to the
    /// API and are added to it.
    #[arg(long)]
    pub playback: bool,
    /// With --playback: a request the cassette lacks is an error, and no
    /// request reaches the API.
    #[arg(long, requires = "playback")]
    pub strict: bool,
}

/// The flags of `hintstream advantages compute`.
#[derive(Debug, Clone, Args)]
pub struct ComputeArgs {
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
    /// Added to the std before dividing [default: normalize.epsilon].
    #[arg(long)]
    pub epsilon: Option<f64>,
    /// Centre only: A = s − mean.
    #[arg(long)]
    pub no_norm_by_std: bool,
    /// The advantage estimator [default: normalize.estimator].
    #[arg(long, value_enum)]
    pub estimator: Option<crate::normalize::Estimator>,
    /// Where to compute [default: normalize.device].
    #[arg(long, value_enum)]
    pub device: Option<crate::normalize::Device>,
}

#[derive(Debug, Subcommand)]
pub enum TopicsAction {
    /// Create every topic of the design that does not exist yet.
    Create {
        /// Partitions (default: topics.partitions from the config).
        #[arg(long)]
        partitions: Option<i32>,
    },
}

impl Cli {
    /// Loads the configuration with this command line's flags applied last.
    /// Only `eval` takes several `--config` (see [`Cli::load_configs`]).
    pub fn load_config(&self) -> Result<Config, ConfigError> {
        if self.global.config.len() > 1 && !matches!(self.command, Command::Eval(_)) {
            return Err(ConfigError::Invalid(
                "--config was given more than once; only `eval` compares several configs".into(),
            ));
        }
        self.load_one(self.global.config.first().map(PathBuf::as_path))
    }

    /// Each `--config` file layered on its own (none: the defaults and
    /// ./hintstream.toml), paired with its path.
    pub fn load_configs(&self) -> Result<Vec<(Option<PathBuf>, Config)>, ConfigError> {
        if self.global.config.is_empty() {
            return Ok(vec![(None, self.load_one(None)?)]);
        }
        self.global
            .config
            .iter()
            .map(|f| Ok((Some(f.clone()), self.load_one(Some(f))?)))
            .collect()
    }

    fn load_one(&self, file: Option<&std::path::Path>) -> Result<Config, ConfigError> {
        Config::load(file, &self.overrides())
    }

    /// The settings this command line's flags give.
    fn overrides(&self) -> Overrides {
        let settings = match &self.command {
            Command::Advantages { stage, .. } => stage.overrides("advantages"),
            Command::Hints { stage } => stage.overrides("hints"),
            _ => vec![],
        };
        Overrides {
            bootstrap_servers: self.global.bootstrap_servers.clone(),
            settings,
        }
    }

    /// Whether `--bootstrap-servers` or the environment names the brokers.
    pub fn names_brokers(&self) -> bool {
        self.overrides().names_brokers()
    }
}

impl Command {
    /// The service its logs and exported spans are attributed to.
    pub fn service_name(&self) -> &'static str {
        match self {
            Command::Hints { .. } => "hintstream-hints",
            Command::Advantages { action: None, .. } => "hintstream-advantages",
            _ => "hintstream",
        }
    }

    /// The log filter when RUST_LOG is not set. The quick start prints its
    /// own story, so it keeps the stages' logs to warnings.
    pub fn default_log_level(&self) -> &'static str {
        if matches!(self, Command::Quickstart { .. }) {
            "warn"
        } else {
            "info,rdkafka=warn"
        }
    }
}

impl RecordArgs {
    /// What to record, and whether to draw a progress bar.
    pub fn options(&self, progress: bool) -> RecordOptions {
        RecordOptions {
            topic: self.topic.clone(),
            max_messages: self.max_messages,
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout_secs),
            progress,
        }
    }
}

impl ReplayArgs {
    /// How to replay, and whether to draw a progress bar; checked by
    /// [`ReplayOptions::check`].
    pub fn options(&self, progress: bool) -> ReplayOptions {
        ReplayOptions {
            topic: self.topic.clone(),
            rate: self.rate,
            speed: self.speed,
            keep_partitions: self.keep_partitions,
            progress,
        }
    }
}

impl EvalArgs {
    /// The files, the cassette mode `--playback [--strict]` asks for, and
    /// whether to draw a progress bar.
    pub fn options(&self, progress: bool) -> EvalOptions {
        EvalOptions {
            input: self.input.clone(),
            scored: self.scored.clone(),
            hints: self.hints.clone(),
            outcomes: self.outcomes.clone(),
            out: self.out.clone(),
            cassette: self.cassette.clone(),
            mode: match (self.playback, self.strict) {
                (false, _) => CassetteMode::Record,
                (true, false) => CassetteMode::Playback,
                (true, true) => CassetteMode::Strict,
            },
            progress,
        }
    }
}

impl ComputeArgs {
    /// The flags over `[normalize]`, applied by
    /// [`NormalizeConfig::with_flags`](crate::config::NormalizeConfig::with_flags).
    pub fn flags(&self) -> NormalizeFlags {
        NormalizeFlags {
            epsilon: self.epsilon,
            no_norm_by_std: self.no_norm_by_std,
            estimator: self.estimator,
            device: self.device,
        }
    }
}
