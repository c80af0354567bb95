//! The Python trainer client and the W&B bridge (examples/python) against a
//! real broker and both stages running as `hintstream` processes:
//! confluent-kafka, pyarrow and wandb (offline) from PyPI in a venv that
//! scripts/python-venv.sh makes.

mod common;

use std::process::{Command, Stdio};

fn root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_and_wandb_bridge_round_trip() {
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

    let broker = common::start_tansu();
    let mut config = common::config_for(&broker.bootstrap);
    let prefix = common::unique("py");
    config.topics.failed = format!("{prefix}.failed");
    config.topics.hints = format!("{prefix}.hints");
    config.topics.scored = format!("{prefix}.scored");
    config.topics.advantages = format!("{prefix}.advantages");
    config.topics.metrics = format!("{prefix}.metrics");
    let t = config.topics.clone();
    common::create_topics(
        &config,
        &[&t.failed, &t.hints, &t.scored, &t.advantages, &t.metrics],
        2,
    )
    .await;
    common::create_topics(
        &config,
        &[&format!("{}.dlq", t.failed), &format!("{}.dlq", t.scored)],
        1,
    )
    .await;

    let stage = |name: &str, input: &str, output: &str| {
        common::KillOnDrop(
            common::without_llm_env(&mut Command::new(env!("CARGO_BIN_EXE_hintstream")))
                .args([
                    name,
                    "--bootstrap-servers",
                    &broker.bootstrap,
                    "--metrics-addr",
                    "127.0.0.1:0",
                ])
                .args([
                    "--group-id",
                    &format!("{prefix}-{name}"),
                    "--input-topic",
                    input,
                    "--output-topic",
                    output,
                ])
                .args(["--dlq-topic", &format!("{input}.dlq")])
                .env("HINTSTREAM_TOPICS__METRICS", &t.metrics)
                .env("HINTSTREAM_HINTS__GROUP_WAIT_MS", "500")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let _hints = stage("hints", &t.failed, &t.hints);
    let _advantages = stage("advantages", &t.scored, &t.advantages);

    let topics = serde_json::json!({
        "failed": t.failed, "hints": t.hints, "scored": t.scored, "advantages": t.advantages, "metrics": t.metrics
    });
    let wandb_dir = tempfile::tempdir().unwrap();
    let out = Command::new(&python)
        .arg(root().join("examples/python/roundtrip.py"))
        .args(["--bootstrap", &broker.bootstrap, "--data"])
        .arg(root().join("examples/data"))
        .args(["--topics", &topics.to_string()])
        .env("WANDB_MODE", "offline")
        .env("WANDB_DIR", wandb_dir.path())
        .env("WANDB_SILENT", "true")
        .current_dir(wandb_dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("roundtrip ok"), "{stdout}");
    assert!(stdout.contains("hints: 20 groups"), "{stdout}");
}
