//! The `hintstream` binary: parses the command line, loads the config and
//! dispatches to one subcommand, each a short function that calls the
//! library and prints what it did. Flags are checked where they apply (the
//! config, or the command's module). Exit codes: 0 done, 1 runtime failure,
//! 2 bad usage/config.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use hintstream::advantages::offline;
use hintstream::allocator;
use hintstream::cli::{AdvantagesAction, Cli, Command, ConfigAction, TopicsAction};
use hintstream::config::{Config, NormalizeFlags};
use hintstream::eval::{self, EvalConfig, EvalOptions};
use hintstream::kafka::shutdown_signal;
use hintstream::kafka::{admin, create_producer};
use hintstream::llm::synth::LlmEnv;
use hintstream::stage::StageError;
use hintstream::stages;
use hintstream::tools::{produce, record, replay};

/// jemalloc instead of glibc's malloc. Stage 2 takes each message with a
/// short-lived task (~8.6 KB) and keeps a few small objects of it until its
/// step is published; glibc carves those objects out of the freed task
/// blocks, so every message left a hole: 8.7 GB resident for a 1M-row JSON
/// step (heaptrack on 100k rows: 160 MB live heap, 980 MB resident); with
/// jemalloc 1.6 GB. Its size classes keep
/// them apart (measured in docs/BENCHMARKS.md, "Steps of any size"). Its
/// large zeroed blocks are zeroed by writing (see
/// [`allocator::ZeroByWriting`]).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: allocator::ZeroByWriting<tikv_jemallocator::Jemalloc> =
    allocator::ZeroByWriting(tikv_jemallocator::Jemalloc);

/// jemalloc's options, read once at start-up (`_RJEM_MALLOC_CONF` in the
/// environment adds to them and overrides them). They keep the pages a
/// step freed for the next step (see [`allocator`]):
/// - `narenas:1`: one arena for every thread (each keeps its own cache of
///   small blocks). When a thread ends and its arena is left without one,
///   jemalloc hands all that arena's free pages back, whatever its decay
///   times; a step's group ids are mapped on a thread made for the step,
///   which had an arena of its own and faulted all its memory in again at
///   every step (24 MB: 5,900 faults each time, in a test program). The
///   main thread holds the one arena for good;
/// - `muzzy_decay_ms:-1`: jemalloc hands a freed block of 8 MiB or more
///   (after merging with its free neighbours) back to the system at once,
///   unless a decay time is -1. With it, freed pages wait `dirty_decay_ms`
///   (10 s) unused, then go back lazily (`MADV_FREE`: the system takes them
///   when it needs the memory), never forcibly;
/// - `background_thread:true`: that decay runs on jemalloc's own thread, so
///   a worker left idle after a step still lets its pages go after 10 s
///   (without it, decay runs only while the worker allocates);
/// - `oversize_threshold:0`: no separate arena for blocks of 8 MiB and more
///   (a large step's columns, its id hashes, its chunks' sources), which
///   would hand them back at once (docs/BENCHMARKS.md, round ten: compute
///   60-86 ms instead of 102-110).
#[cfg(not(target_env = "msvc"))]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"oversize_threshold:0,muzzy_decay_ms:-1,narenas:1,background_thread:true\0";

fn main() -> ExitCode {
    // Before librdkafka's threads.
    allocator::tune_glibc_malloc();
    let cli = Cli::parse();
    // The reference is the code's, whatever the config in effect.
    if let Command::Config {
        action: Some(ConfigAction::Reference),
    } = cli.command
    {
        print!("{}", hintstream::config::reference());
        return ExitCode::SUCCESS;
    }
    let (level, service) = (cli.command.default_log_level(), cli.command.service_name());
    let telemetry = match hintstream::telemetry::init(cli.global.log_format, level, service) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let loaded = match Loaded::from_cli(&cli) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = check_worker_threads() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(cli.command, loaded));
    // Blocking calls left behind at a bound (a commit or close to a broker
    // that is gone) must not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    telemetry.shutdown();
    exit_code(result)
}

/// The environment variable tokio's runtime takes its number of worker
/// threads from (one a core the process may use without it).
const WORKER_THREADS_ENV: &str = "TOKIO_WORKER_THREADS";

/// A [`WORKER_THREADS_ENV`] the runtime cannot use, as a usage error: the
/// runtime itself panics on one.
fn check_worker_threads() -> Result<(), String> {
    let Some(value) = std::env::var_os(WORKER_THREADS_ENV) else {
        return Ok(());
    };
    // Parsed as the runtime parses it.
    match value.to_str().map(str::parse::<usize>) {
        Some(Ok(n)) if n > 0 => Ok(()),
        _ => Err(format!(
            "{WORKER_THREADS_ENV} must be a whole number above 0 (the async runtime's worker threads), not {value:?}; unset it for one a core"
        )),
    }
}

/// What the command runs with, loaded before the runtime starts.
struct Loaded {
    config: Config,
    /// `eval` compares several configs, each layered on its own; empty for
    /// the other commands.
    eval_configs: Vec<(Option<PathBuf>, Config)>,
    /// Whether the flags or the environment name the brokers.
    names_brokers: bool,
}

impl Loaded {
    fn from_cli(cli: &Cli) -> Result<Loaded, hintstream::config::ConfigError> {
        let config = cli.load_config()?;
        let eval_configs = match &cli.command {
            Command::Eval(_) => cli.load_configs()?,
            _ => vec![],
        };
        Ok(Loaded {
            config,
            eval_configs,
            names_brokers: cli.names_brokers(),
        })
    }
}

/// 0, or the failure's code: a stage that could not start because of its
/// configuration (a missing topic included) exits 2, like bad flags; any
/// other failure 1.
fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            let code = e
                .chain()
                .find_map(|cause| cause.downcast_ref::<StageError>())
                .map_or(1, StageError::exit_code);
            ExitCode::from(code)
        }
    }
}

async fn run(command: Command, loaded: Loaded) -> anyhow::Result<()> {
    let Loaded {
        config,
        eval_configs,
        names_brokers,
    } = loaded;
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    match command {
        Command::Config { .. } => {
            print!("{}", config.to_redacted_toml());
            Ok(())
        }
        Command::Quickstart { data } => quickstart(config, names_brokers, data.as_deref()).await,
        Command::Hints { .. } => run_stage("hints", config).await,
        Command::Advantages { action: None, .. } => run_stage("advantages", config).await,
        Command::Advantages {
            action: Some(AdvantagesAction::Compute(args)),
            ..
        } => compute(&config, &args.flags(), args.input, args.output).await,
        Command::Topics {
            action: TopicsAction::Create { partitions },
        } => create_topics(&config, partitions).await,
        Command::Produce { topic, file } => produce(&config, &topic, &file, progress).await,
        Command::Record(args) => record(&config, &args.options(progress), &args.out).await,
        Command::Eval(args) => evaluate(eval_configs, &args.options(progress)).await,
        Command::Replay(args) => replay(&config, &args.file, &args.options(progress)).await,
    }
}

/// `hintstream quickstart`: its own broker unless one is named.
async fn quickstart(config: Config, names_brokers: bool, data: Option<&Path>) -> anyhow::Result<()> {
    let dir = hintstream::quickstart::sample_dir(data);
    hintstream::quickstart::run(config, !names_brokers, &dir)
        .await
        .context("quick start")?;
    Ok(())
}

/// `hintstream hints`, `hintstream advantages`: the stage of that name in
/// the registry, until SIGTERM/SIGINT or a failure.
async fn run_stage(name: &str, config: Config) -> anyhow::Result<()> {
    // Before the start-up: a signal meanwhile stops the stage once it runs.
    let shutdown = Box::pin(shutdown_signal());
    let stage = stages::find(name).with_context(|| format!("no stage is registered as {name}"))?;
    let built = (stage.build)(config)
        .await
        .with_context(|| format!("starting the {name} stage"))?;
    let summary = built.run(shutdown).await;
    tracing::info!(?summary, "{name} stage stopped");
    if let Some(failure) = summary.failure {
        anyhow::bail!("the {name} stage failed: {failure}");
    }
    Ok(())
}

/// `hintstream advantages compute`, off the async workers.
async fn compute(
    config: &Config,
    flags: &NormalizeFlags,
    input: PathBuf,
    output: PathBuf,
) -> anyhow::Result<()> {
    let normalize = config.normalize.with_flags(flags)?;
    let (options, device, weight) = (normalize.options(), normalize.device, normalize.hinted_weight);
    let limits = config.decode_limits();
    let started = Instant::now();
    let rows = tokio::task::spawn_blocking(move || {
        offline::compute_file(&input, &output, &options, device, weight, limits).map(|n| (n, output))
    })
    .await??;
    println!(
        "computed {} advantages into {} in {:.2?}",
        rows.0,
        rows.1.display(),
        started.elapsed()
    );
    Ok(())
}

/// `hintstream topics create`: every topic of the design, each outcome
/// printed.
async fn create_topics(config: &Config, partitions: Option<i32>) -> anyhow::Result<()> {
    reach(config).await?;
    let topics = hintstream::stages::design_topics(config);
    let partitions = partitions.unwrap_or(config.topics.partitions);
    let outcomes = admin::create_topics(config, &topics, partitions)
        .await
        .with_context(|| format!("creating topics on {}", config.bootstrap_servers))?;
    let mut failed = 0;
    for (name, outcome) in outcomes {
        println!("{name}: {outcome:?}");
        failed += usize::from(matches!(outcome, admin::TopicOutcome::Failed(_)));
    }
    anyhow::ensure!(failed == 0, "{failed} topic(s) could not be created");
    Ok(())
}

/// `hintstream produce`.
async fn produce(config: &Config, topic: &str, file: &Path, progress: bool) -> anyhow::Result<()> {
    reach(config).await?;
    let producer = create_producer(config).context("creating the producer")?;
    let n = produce::produce_file(&producer, topic, file, progress).await?;
    println!("produced {n} messages to {topic}");
    Ok(())
}

/// `hintstream record`.
async fn record(config: &Config, options: &record::RecordOptions, out: &Path) -> anyhow::Result<()> {
    reach(config).await?;
    let n = record::record(config, options, out)
        .await
        .with_context(|| format!("recording {}", options.topic))?;
    println!(
        "recorded {n} messages from {} to {}",
        options.topic,
        out.display()
    );
    Ok(())
}

/// `hintstream eval`: one run per config, a summary line each.
async fn evaluate(eval_configs: Vec<(Option<PathBuf>, Config)>, options: &EvalOptions) -> anyhow::Result<()> {
    let files: Vec<_> = eval_configs.iter().map(|(f, _)| f.clone()).collect();
    let configs: Vec<EvalConfig> = eval::labels(&files)
        .into_iter()
        .zip(eval_configs)
        .map(|(label, (file, config))| EvalConfig { label, file, config })
        .collect();
    let env = LlmEnv::from_process();
    let report = eval::run(&configs, options, &env).await?;
    for c in &report.configs {
        println!(
            "{}: {} groups, fallback {:.1}%, latency p50 {:.0} ms p95 {:.0} ms, ${:.4}, {} LLM calls from the cassette, {} to the API",
            c.label,
            report.groups,
            c.fallback_rate * 100.0,
            c.latency_ms.p50,
            c.latency_ms.p95,
            c.cost_usd,
            c.cassette_played,
            c.api_calls
        );
    }
    println!(
        "wrote {} and {}; cassette {}",
        options.out.join("report.json").display(),
        options.out.join("index.html").display(),
        options.cassette_path().display()
    );
    Ok(())
}

/// `hintstream replay`; its options are checked before the cluster is.
async fn replay(config: &Config, file: &Path, options: &replay::ReplayOptions) -> anyhow::Result<()> {
    options.check()?;
    reach(config).await?;
    let producer = create_producer(config).context("creating the producer")?;
    let n = replay::replay(&producer, file, options).await?;
    println!("replayed {n} messages from {}", file.display());
    Ok(())
}

/// Checks that the cluster answers (credentials and TLS included) within
/// `connect_timeout_secs`, so a tool says why it cannot connect instead of
/// waiting on librdkafka's retries.
async fn reach(config: &Config) -> anyhow::Result<()> {
    let within = std::time::Duration::from_secs(config.connect_timeout_secs);
    hintstream::kafka::check_cluster(config, &[], within)
        .await
        .map_err(StageError::from)?;
    Ok(())
}
