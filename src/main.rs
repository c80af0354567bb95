//! The `hintstream` binary: parses the command line, loads the config and runs
//! one subcommand. Exit codes: 0 done, 1 runtime failure, 2 bad usage/config.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use hintstream::advantages::offline;
use hintstream::advantages::service::AdvantageStage;
use hintstream::cli::{AdvantagesAction, Cli, Command, TopicsAction};
use hintstream::config::Config;
use hintstream::eval::{self, EvalConfig, EvalOptions};
use hintstream::hints::HintStage;
use hintstream::kafka::shutdown_signal;
use hintstream::kafka::{admin, create_producer};
use hintstream::llm::cassette::CassetteMode;
use hintstream::stage::StageError;
use hintstream::tools::{produce, record, replay};

/// jemalloc instead of glibc's malloc. Stage 2 takes each message with a
/// short-lived task (~8.6 KB) and keeps a few small objects of it until its
/// step is published; glibc carves those objects out of the freed task
/// blocks, so every message left a hole: 8.7 GB resident for a 1M-row JSON
/// step (heaptrack on 100k rows: 160 MB live heap, 980 MB resident); with
/// jemalloc 1.6 GB. Its size classes keep
/// them apart (measured in docs/BENCHMARKS.md, "Steps of any size").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The quick start prints its own story; keep the stages' logs to warnings.
    let default_level = if matches!(cli.command, Command::Quickstart { .. }) {
        "warn"
    } else {
        "info,rdkafka=warn"
    };
    let service = match &cli.command {
        Command::Hints { .. } => "hintstream-hints",
        Command::Advantages { action: None, .. } => "hintstream-advantages",
        _ => "hintstream",
    };
    let telemetry = match hintstream::telemetry::init(cli.global.log_format, default_level, service) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let explicit_broker =
        cli.global.bootstrap_servers.is_some() || std::env::var_os("HINTSTREAM_BOOTSTRAP_SERVERS").is_some();
    let config = match cli.load_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // `eval` compares several configs, each layered on its own.
    let eval_configs = match &cli.command {
        Command::Eval { .. } => match cli.load_configs() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        _ => vec![],
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(cli.command, config, explicit_broker, eval_configs));
    // Blocking calls left behind at a bound (a commit or close to a broker
    // that is gone) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            // A stage that could not start because of its configuration (a
            // missing topic included) exits 2, like bad flags.
            let code = e
                .chain()
                .find_map(|cause| cause.downcast_ref::<StageError>())
                .map_or(1, StageError::exit_code);
            ExitCode::from(code)
        }
    }
}

async fn run(
    command: Command,
    config: Config,
    explicit_broker: bool,
    eval_configs: Vec<(Option<std::path::PathBuf>, Config)>,
) -> anyhow::Result<()> {
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    match command {
        Command::Config => print!("{}", config.to_redacted_toml()),
        Command::Quickstart { data } => {
            let dir = hintstream::quickstart::sample_dir(data.as_deref());
            hintstream::quickstart::run(config, !explicit_broker, &dir)
                .await
                .context("quick start")?;
        }
        Command::Hints { .. } => {
            let env = hintstream::llm::synth::LlmEnv::from_process();
            let stage = HintStage::build(config, &env)
                .await
                .context("starting the hint stage")?;
            let summary = stage.run(shutdown_signal()).await;
            tracing::info!(?summary, "hint stage stopped");
            if let Some(failure) = summary.failure {
                anyhow::bail!("the hint stage failed: {failure}");
            }
        }
        Command::Advantages { action: None, .. } => {
            let stage = AdvantageStage::build(config)
                .await
                .context("starting the advantage stage")?;
            let summary = stage.run(shutdown_signal()).await;
            tracing::info!(?summary, "advantage stage stopped");
            if let Some(failure) = summary.failure {
                anyhow::bail!("the advantage stage failed: {failure}");
            }
        }
        Command::Advantages {
            action:
                Some(AdvantagesAction::Compute {
                    input,
                    output,
                    epsilon,
                    no_norm_by_std,
                    estimator,
                    device,
                }),
            ..
        } => {
            let mut options = config.normalize.options();
            if let Some(e) = epsilon {
                anyhow::ensure!(
                    e.is_finite() && e >= 0.0,
                    "--epsilon must be a finite number >= 0"
                );
                options.epsilon = e;
            }
            options.norm_by_std &= !no_norm_by_std;
            if let Some(e) = estimator {
                options.estimator = e;
            }
            let device = device.unwrap_or(config.normalize.device);
            let limits = config.decode_limits();
            let started = std::time::Instant::now();
            let rows = tokio::task::spawn_blocking(move || {
                offline::compute_file(&input, &output, &options, device, limits).map(|n| (n, output))
            })
            .await??;
            println!(
                "computed {} advantages into {} in {:.2?}",
                rows.0,
                rows.1.display(),
                started.elapsed()
            );
        }
        Command::Topics {
            action: TopicsAction::Create { partitions },
        } => {
            reach(&config).await?;
            let names = admin::design_topics(&config);
            let partitions = partitions.unwrap_or(config.topics.partitions);
            let outcomes = admin::create_topics(&config, &names, partitions)
                .await
                .with_context(|| format!("creating topics on {}", config.bootstrap_servers))?;
            let mut failed = 0;
            for (name, outcome) in outcomes {
                println!("{name}: {outcome:?}");
                failed += usize::from(matches!(outcome, admin::TopicOutcome::Failed(_)));
            }
            anyhow::ensure!(failed == 0, "{failed} topic(s) could not be created");
        }
        Command::Produce { topic, file } => {
            reach(&config).await?;
            let producer = create_producer(&config).context("creating the producer")?;
            let n = produce::produce_file(&producer, &topic, &file, progress).await?;
            println!("produced {n} messages to {topic}");
        }
        Command::Record {
            topic,
            out,
            max_messages,
            idle_timeout_secs,
        } => {
            reach(&config).await?;
            let options = record::RecordOptions {
                topic: topic.clone(),
                max_messages,
                idle_timeout: std::time::Duration::from_secs(idle_timeout_secs),
                progress,
            };
            let n = record::record(&config, &options, &out)
                .await
                .with_context(|| format!("recording {topic}"))?;
            println!("recorded {n} messages from {topic} to {}", out.display());
        }
        Command::Eval {
            input,
            scored,
            out,
            cassette,
            playback,
            strict,
        } => {
            let files: Vec<_> = eval_configs.iter().map(|(f, _)| f.clone()).collect();
            let configs: Vec<EvalConfig> = eval::labels(&files)
                .into_iter()
                .zip(eval_configs)
                .map(|(label, (file, config))| EvalConfig { label, file, config })
                .collect();
            let options = EvalOptions {
                input,
                scored,
                out,
                cassette,
                mode: match (playback, strict) {
                    (false, _) => CassetteMode::Record,
                    (true, false) => CassetteMode::Playback,
                    (true, true) => CassetteMode::Strict,
                },
                progress,
            };
            let env = hintstream::llm::synth::LlmEnv::from_process();
            let report = eval::run(&configs, &options, &env).await?;
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
        }
        Command::Replay {
            file,
            topic,
            rate,
            speed,
            keep_partitions,
        } => {
            if let Some(x) = speed {
                anyhow::ensure!(x.is_finite() && x > 0.0, "--speed must be a number > 0");
            }
            reach(&config).await?;
            let producer = create_producer(&config).context("creating the producer")?;
            let options = replay::ReplayOptions {
                topic,
                rate,
                speed,
                keep_partitions,
                progress,
            };
            let n = replay::replay(&producer, &file, &options).await?;
            println!("replayed {n} messages from {}", file.display());
        }
    }
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
