//! The command-line surface: subcommands, their flags and how flags map onto
//! config settings. Names are part of the contract (DESIGN.md).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ConfigError, Overrides};
use crate::telemetry::LogFormat;

const AFTER_HELP: &str = "\
Configuration is layered: built-in defaults, then the config file
(--config, or ./hintstream.toml when it exists), then environment variables
HINTSTREAM_<SECTION>__<KEY> (for example HINTSTREAM_HINTS__GROUP_ID), then flags.
`hintstream config` prints the result with secrets redacted.

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
    Record {
        /// Topic to record.
        #[arg(long)]
        topic: String,
        /// Output JSONL file.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Stop after this many messages.
        #[arg(long, value_name = "N")]
        max_messages: Option<u64>,
        /// Fail when nothing arrives for this many seconds before the end.
        #[arg(long, default_value_t = 30, value_name = "SECS")]
        idle_timeout_secs: u64,
    },
    /// Produce a `record` file back into a topic, keeping keys, headers and
    /// per-key order.
    Replay {
        /// A file written by `hintstream record`.
        file: PathBuf,
        /// Target topic (default: each message's recorded topic).
        #[arg(long)]
        topic: Option<String>,
        /// Messages per second (default: as fast as the broker takes them).
        #[arg(long, value_name = "N", conflicts_with = "speed")]
        rate: Option<f64>,
        /// Keep the recorded pace, from the messages' timestamps, sped up X
        /// times (1 = as recorded, 10 = ten times faster).
        #[arg(long, value_name = "X")]
        speed: Option<f64>,
        /// Send each message to its recorded partition instead of by key.
        #[arg(long)]
        keep_partitions: bool,
    },
    /// Evaluate hint synthesis offline: stage 1's synthesis over a recorded
    /// failed-trajectory topic, under each --config, without a broker.
    ///
    /// Writes OUT/report.json and OUT/index.html (summary per config:
    /// category mix, fallback rate and reasons, latency percentiles, tokens,
    /// cost, hint length; plots; the hints side by side per group). Every LLM
    /// exchange is kept in a cassette (default OUT/cassette.jsonl); rerun with
    /// --playback to answer from it: deterministic, no HTTP, no cost.
    ///
    /// Example: hintstream eval --input failed.jsonl --config sonnet.toml
    /// --config haiku.toml --out eval-out
    Eval {
        /// Failed trajectories: a `hintstream record` file (or plain JSONL).
        #[arg(long, value_name = "FILE")]
        input: PathBuf,
        /// Recorded scored rollouts of the same run (a `record` file of
        /// rl.rollouts.scored, or JSONL rows): adds hint success rates per
        /// category and signal rescued per step, computed by stage 2.
        #[arg(long, value_name = "FILE")]
        scored: Option<PathBuf>,
        /// Output folder (created when missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The cassette file [default: OUT/cassette.jsonl]. Without
        /// --playback it is rewritten with this run's exchanges.
        #[arg(long, value_name = "FILE")]
        cassette: Option<PathBuf>,
        /// Answer LLM requests from the cassette; requests it lacks go to the
        /// API and are added to it.
        #[arg(long)]
        playback: bool,
        /// With --playback: a request the cassette lacks is an error, and no
        /// request reaches the API.
        #[arg(long, requires = "playback")]
        strict: bool,
    },
    /// Print the effective configuration (secrets redacted) and exit.
    Config,
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
    Compute {
        #[arg(long, value_name = "FILE")]
        input: PathBuf,
        #[arg(long, value_name = "FILE")]
        output: PathBuf,
        /// Added to the std before dividing [default: normalize.epsilon].
        #[arg(long)]
        epsilon: Option<f64>,
        /// Centre only: A = s − mean.
        #[arg(long)]
        no_norm_by_std: bool,
        /// The advantage estimator [default: normalize.estimator].
        #[arg(long, value_enum)]
        estimator: Option<crate::normalize::Estimator>,
        /// Where to compute [default: normalize.device].
        #[arg(long, value_enum)]
        device: Option<crate::normalize::Device>,
    },
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
        if self.global.config.len() > 1 && !matches!(self.command, Command::Eval { .. }) {
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
        let settings = match &self.command {
            Command::Advantages { stage, .. } => stage.overrides("advantages"),
            Command::Hints { stage } => stage.overrides("hints"),
            _ => vec![],
        };
        let overrides = Overrides {
            bootstrap_servers: self.global.bootstrap_servers.clone(),
            settings,
        };
        Config::load(file, &overrides)
    }
}
