//! A reply of about 1 MiB from the loopback LLM through a running stage 1 on
//! a real broker: the hint is published, cut to `llm.max_hint_chars` at a
//! sentence boundary and marked `hint_truncated`, not dead-lettered as
//! `output_rejected`.

use crate::common;
use crate::common::llm_server;

use std::time::Duration;

use hintstream::hints::HintStage;
use hintstream::kafka::create_producer;
use hintstream::llm::client::MAX_RESPONSE_BODY_BYTES;
use hintstream::messages::{decode, DecodeLimits, Hint, HintCategory};
use llm_server::{Behavior, LlmServer};
use rdkafka::producer::Producer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_megabyte_reply_is_published_cut_at_a_sentence_and_marked_truncated() {
    let broker = common::shared_kafka();
    let server = LlmServer::start(Some("sk-k")).await;
    let sentence = "Check the week numbering first. ";
    // Over librdkafka's default message.max.bytes (1,000,000) as a hint,
    // under the client's body cap as a reply.
    let reply = sentence.repeat(32_200);
    assert!(reply.len() > 1_000_000 && reply.len() < MAX_RESPONSE_BODY_BYTES - 4096);
    server.default(Behavior::Text(reply, Duration::ZERO));

    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.hints, "long-failed", "long-hints");
    config.hints.group_wait_ms = 100;
    let endpoint = common::MetricsEndpoint::free();
    config.hints.metrics_addr = endpoint.addr();
    let h = config.hints.clone();
    common::create_hints_topics(&config, 1).await;
    let trajectory = serde_json::to_vec(&serde_json::json!({
        "schema_version": 1, "run_id": "run-long", "step": 1, "instance_id": "A", "trajectory_id": "a1",
        "task_prompt": "Solve A", "reward": 0.0, "group_size": 1,
        "chat_history": [{"role": "user", "content": "go"}],
        "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['check failed']\n<<< ERROR_ACCUMULATOR <<<",
    }))
    .unwrap();
    let producer = create_producer(&config).unwrap();
    common::send(&producer, &h.input_topic, "run-long/1/A", &trajectory).await;
    producer.flush(Duration::from_secs(10)).unwrap();

    let env = llm_server::anthropic_env(&server, "sk-k");
    let stage = HintStage::build(config.clone(), &env).await.unwrap();
    let running = common::spawn_stage(|stop| stage.run(stop));
    // The input is finished one way or the other: published (acknowledged
    // by the broker) or dead-lettered (`output_rejected`).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (published, dead) = loop {
        let published = endpoint
            .value("hintstream_hints_hints_published_total", &[])
            .await;
        let dead = endpoint.value("hintstream_hints_dead_letters_total", &[]).await;
        if published + dead >= 1.0 {
            break (published, dead);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the input was not finished"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    running.stop().await;
    assert_eq!((published, dead), (1.0, 0.0), "published, not dead-lettered");

    let hints: Vec<Hint> = common::read_topic(&config, &h.output_topic)
        .await
        .iter()
        .map(|m| decode(m.value_bytes().unwrap(), DecodeLimits::default()).unwrap())
        .collect();
    assert_eq!(hints.len(), 1);
    let hint = &hints[0];
    assert_eq!(
        hint.category,
        HintCategory::LlmSynthesized,
        "{:?}",
        hint.failure_reason
    );
    assert!(hint.hint_truncated, "the hint says it was cut");
    let max = config.llm.max_hint_chars;
    assert!(
        hint.hint.chars().count() <= max && hint.hint.chars().count() > max - sentence.len(),
        "{} chars",
        hint.hint.chars().count()
    );
    assert!(
        hint.hint.ends_with("first.") && hint.hint.starts_with(sentence),
        "cut at a sentence boundary: …{}",
        &hint.hint[hint.hint.len() - 40..]
    );
}
