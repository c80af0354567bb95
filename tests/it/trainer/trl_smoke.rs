//! A real GRPO run, small: three steps of TRL's GRPOTrainer through
//! `hintstream.trl` with SmolLM2-135M-Instruct on CPU (4 prompts x 4
//! completions), hints from the local llama.cpp server through stage 1,
//! advantages from stage 2, on an Apache Kafka node: python/tests_rl/, run
//! with pytest in the venv of scripts/rl-venv.sh (torch, transformers, TRL:
//! ~3 GB downloaded once, cached under ~/.cache/hintstream/rl). The model
//! server comes from `scripts/local-llm.sh`; scripts/test.sh installs both.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's install (cold, ~8 minutes, when this test runs without
/// scripts/test.sh, which installs it beside the build) and the run must
/// finish within this: the run took 30 minutes at a load average of 12-20
/// on 2 cores (~9 CPU-minutes; docs/BENCHMARKS.md).
const TIMEOUT: Duration = Duration::from_secs(45 * 60);

#[test]
fn trl_grpo_smoke_run() {
    let started = Instant::now();
    let venv = Command::new(root().join("scripts/rl-venv.sh"))
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/rl-venv.sh runs");
    assert!(venv.status.success(), "making the rl venv failed");
    let python = String::from_utf8(venv.stdout).unwrap();
    let python = python
        .lines()
        .last()
        .expect("rl-venv.sh prints the venv's python");
    println!("rl venv: {:.1} s", started.elapsed().as_secs_f64());

    let log = tempfile::NamedTempFile::new().unwrap();
    let run = Instant::now();
    let mut child = Command::new(python)
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "-s"])
        .arg(root().join("python/tests_rl"))
        .env("CARGO_BIN_EXE_hintstream", env!("CARGO_BIN_EXE_hintstream"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("TRL_EXPERIMENTAL_SILENCE", "1")
        .current_dir(root().join("python"))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.reopen().unwrap()))
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .expect("pytest starts");
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(log.path()).unwrap_or_default();
    println!("{output}");
    println!("trl smoke run: {:.1} s", run.elapsed().as_secs_f64());
    let status = status.unwrap_or_else(|| panic!("the smoke run ran past {TIMEOUT:?}:\n{output}"));
    assert!(status.success(), "the smoke run failed ({status}):\n{output}");
    assert!(output.contains(" passed"), "{output}");
}
