//! Every compression codec a trainer may use: input produced with gzip, lz4,
//! zstd and snappy is hinted (on Apache Kafka); hints produced with
//! `compression.type = "zstd"` are read back by confluent-kafka, as a Python
//! trainer reads them.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use hintstream::config::Config;
use hintstream::hints::HintStage;
use hintstream::llm::synth::LlmEnv;
use hintstream::messages::{decode, group_key, DecodeLimits, Hint};

fn trajectory(instance: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": "codec", "step": 1, "instance_id": instance,
        "trajectory_id": "t", "task_prompt": format!("Solve {instance}"), "reward": 0.0,
        // Compressible: a long, repetitive transcript.
        "chat_history": [{"role": "tool", "content": "retrying the build ".repeat(500)}],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['build failed']\n<<< ERROR_ACCUMULATOR <<<",
    }))
    .unwrap()
}

/// Produces one trajectory per codec, each with a producer using it.
async fn produce_with(config: &Config, topic: &str, codecs: &[&str]) {
    for codec in codecs {
        let mut c = config.clone();
        c.kafka
            .producer
            .insert("compression.type".into(), (*codec).into());
        let producer = hintstream::kafka::create_producer(&c).unwrap();
        common::send(
            &producer,
            topic,
            &group_key("codec", 1, codec),
            &trajectory(codec),
        )
        .await;
    }
}

async fn hinted(config: &Config, n: usize) -> Vec<Hint> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let hints: Vec<Hint> = common::read_topic(config, &config.hints.output_topic)
            .await
            .iter()
            .map(|m| decode(m.value_bytes().unwrap(), DecodeLimits::default()).unwrap())
            .collect();
        if hints.len() >= n {
            return hints;
        }
        assert!(Instant::now() < deadline, "{} of {n} hints", hints.len());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gzip_lz4_and_zstd_input_is_hinted_and_zstd_output_reads_back_in_python() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "codec", "codec-hints");
    config.hints.group_wait_ms = 50;
    // The stage's output is compressed with zstd.
    config
        .kafka
        .producer
        .insert("compression.type".into(), "zstd".into());
    let h = config.hints.clone();
    common::create_hints_topics(&config, 1).await;
    let codecs = ["gzip", "lz4", "zstd"];
    produce_with(&config, &h.input_topic, &codecs).await;
    let stage = HintStage::build(config.clone(), &LlmEnv::default())
        .await
        .unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let hints = hinted(&config, codecs.len()).await;
    running.stop().await;
    let mut instances: Vec<&str> = hints.iter().map(|h| h.instance_id.as_str()).collect();
    instances.sort();
    assert_eq!(instances, ["gzip", "lz4", "zstd"]);
    assert!(common::read_topic(&config, &h.dlq_topic).await.is_empty());

    // A Python trainer reads the zstd-compressed hints with confluent-kafka.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = Command::new(root.join("scripts/python-venv.sh"))
        .current_dir(root)
        .output()
        .unwrap();
    assert!(venv.status.success(), "{}", String::from_utf8_lossy(&venv.stderr));
    let python = root.join(String::from_utf8(venv.stdout).unwrap().trim());
    let script = r#"
import json, sys
from confluent_kafka import Consumer, TopicPartition
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": "codec-check", "enable.auto.commit": False})
c.assign([TopicPartition(sys.argv[2], 0, 0)])
got = []
while len(got) < 3:
    m = c.poll(20)
    if m is None:
        break
    if m.error():
        raise SystemExit(str(m.error()))
    got.append(json.loads(m.value())["instance_id"])
print(",".join(sorted(got)))
"#;
    let out = Command::new(python)
        .args(["-c", script, &broker.bootstrap, &h.output_topic])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "gzip,lz4,zstd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snappy_input_is_hinted() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "snappy", "snappy-hints");
    config.hints.group_wait_ms = 50;
    let h = config.hints.clone();
    common::create_hints_topics(&config, 1).await;
    produce_with(&config, &h.input_topic, &["snappy"]).await;
    let stage = HintStage::build(config.clone(), &LlmEnv::default())
        .await
        .unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    let hints = hinted(&config, 1).await;
    running.stop().await;
    assert_eq!(hints[0].instance_id, "snappy");
}
