//! The README's first command: `hintstream quickstart` runs the whole
//! pipeline on the bundled sample step against the embedded broker and prints
//! a hint per failed group, the step's metrics and the metrics endpoints. A
//! first run, without an API key, is quiet: no warning and no error line at
//! the default log level, librdkafka's included.

use crate::common;

use std::process::Command;

fn quickstart(args: &[&str]) -> std::process::Output {
    common::without_llm_env(&mut Command::new(env!("CARGO_BIN_EXE_hintstream")))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("quickstart")
        .args(args)
        .env_remove("HINTSTREAM_BOOTSTRAP_SERVERS")
        .output()
        .unwrap()
}

fn assert_ran_to_the_end(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("no API key set"),
        "says plainly that hints are static: {stdout}"
    );
    assert_eq!(
        stdout.matches("  [static_fallback] ").count(),
        20,
        "one hint per failed group: {stdout}"
    );
    for needle in [
        "hint/signal_rescued",
        "hint/hint_success_rate",
        "advantage/extreme_count",
        "/metrics",
        "240 rows",
        "stopped cleanly",
    ] {
        assert!(
            stdout.contains(needle),
            "quick start output lacks {needle}:\n{stdout}"
        );
    }
    // The scored step carries the categories of the hints just produced:
    // static ones here, so no LLM category is counted.
    assert!(stdout.contains("hint/category_static_fallback_count"), "{stdout}");
    assert!(
        !stdout.contains("hint/category_llm_synthesized"),
        "the metrics count categories the hints did not have:\n{stdout}"
    );
}

#[test]
fn quickstart_runs_to_the_end_on_the_embedded_broker() {
    let out = quickstart(&[]);
    assert_ran_to_the_end(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("embedded Kafka-protocol broker"));
}

/// The stderr lines at WARN or ERROR level (the text format's level comes
/// after the timestamp), and any librdkafka wrote itself (`%4|...`).
fn warnings_and_errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            matches!(l.split_whitespace().nth(1), Some("WARN" | "ERROR"))
                || l.starts_with("%3|")
                || l.starts_with("%4|")
        })
        .collect()
}

#[test]
fn a_first_quick_start_without_an_api_key_prints_no_warning_and_no_error() {
    let out = common::without_llm_env(&mut Command::new(env!("CARGO_BIN_EXE_hintstream")))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("quickstart")
        .env_remove("HINTSTREAM_BOOTSTRAP_SERVERS")
        .env_remove("OPENROUTER_API_KEY")
        // The default log level.
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("  [static_fallback] ").count(),
        20,
        "20 hints: {stdout}"
    );
    let table = stdout
        .split("step metrics:")
        .nth(1)
        .expect("the metrics table follows its heading");
    assert!(
        table.contains("hint/signal_rescued") && table.contains("reward/pass_at_4"),
        "the metrics table: {stdout}"
    );
    let loud = warnings_and_errors(&stderr);
    assert!(
        loud.is_empty(),
        "{} WARN/ERROR lines on stderr:\n{}",
        loud.len(),
        loud.join("\n")
    );
    let after_done = stdout.split("stopped cleanly").nth(1).unwrap_or_default();
    assert!(after_done.trim().is_empty(), "nothing after done: {after_done}");
}

#[test]
fn quickstart_runs_against_kafka_with_bootstrap_servers() {
    let broker = common::shared_kafka();
    let out = quickstart(&["--bootstrap-servers", &broker.bootstrap]);
    assert_ran_to_the_end(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("broker: {}", broker.bootstrap)));
}

#[test]
fn quickstart_log_lines_name_their_stage_and_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let status = common::without_llm_env(&mut Command::new(env!("CARGO_BIN_EXE_hintstream")))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("quickstart")
        .env_remove("HINTSTREAM_BOOTSTRAP_SERVERS")
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{text}");
    assert!(
        !text.contains("\x1b["),
        "a log file gets no ANSI escape codes:\n{text}"
    );
    // Lines the stages' code wrote (the quick start's own, its embedded
    // broker's, which it stops after the stages, and librdkafka's are not a
    // stage's).
    let from_stages: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains(" hintstream::")
                && !l.contains(" hintstream::quickstart:")
                && !l.contains(" hintstream::kafka::embedded:")
        })
        .collect();
    for (stage, worker) in [("hints", Some(0)), ("hints", Some(1)), ("advantages", None)] {
        let label = match worker {
            Some(w) => format!("stage{{stage={stage} worker={w}}}"),
            None => format!("stage{{stage={stage}}}"),
        };
        assert!(
            from_stages.iter().any(|l| l.contains(&label)),
            "no line from {label}:\n{text}"
        );
    }
    let unlabelled: Vec<&&str> = from_stages
        .iter()
        .filter(|l| !l.contains("stage{stage="))
        .collect();
    assert!(
        unlabelled.is_empty(),
        "lines without their stage:\n{}",
        unlabelled
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
