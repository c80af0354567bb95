//! The Python package (python/): its pytest suite, in a venv made by
//! scripts/python-venv.sh (`pip install ./python[wandb,test]`: confluent-kafka,
//! pyarrow, wandb and pytest from PyPI), against Apache Kafka, both
//! stages as `hintstream` processes and a loopback OpenAI-compatible LLM
//! server, all started by the suite's fixtures (python/tests/conftest.py).
//! The suite gets this build's binary as `CARGO_BIN_EXE_hintstream`; the
//! broker is `HINTSTREAM_TEST_BOOTSTRAP` when set, else a Kafka node it
//! starts from the jars of `scripts/kafka.sh`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The whole suite must finish within this (it takes about two minutes).
const SUITE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

#[test]
fn python_package_pytest_suite() {
    let venv = Command::new(root().join("scripts/python-venv.sh"))
        .current_dir(root())
        .output()
        .expect("scripts/python-venv.sh runs");
    assert!(
        venv.status.success(),
        "making the venv failed: {}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let python = root().join(String::from_utf8(venv.stdout).unwrap().trim());

    let log = tempfile::NamedTempFile::new().unwrap();
    let started = Instant::now();
    let mut child = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfE",
            "--durations=8",
        ])
        .arg(root().join("python/tests"))
        .env("CARGO_BIN_EXE_hintstream", env!("CARGO_BIN_EXE_hintstream"))
        .env("WANDB_MODE", "offline")
        .env("WANDB_SILENT", "true")
        .env("PYTHONDONTWRITEBYTECODE", "1")
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
        if started.elapsed() > SUITE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(log.path()).unwrap_or_default();
    println!("{output}");
    println!("python suite: {:.1} s", started.elapsed().as_secs_f64());
    let status = status.unwrap_or_else(|| panic!("pytest ran past {SUITE_TIMEOUT:?}:\n{output}"));
    assert!(status.success(), "pytest failed ({status}):\n{output}");
    assert!(output.contains(" passed"), "{output}");
}
