//! Hostile input through a running `hintstream advantages` process (issue
//! 21, items 1 and 7), on one partition between valid steps:
//!
//! - a ~0.8 MB Arrow message whose `Utf8View` column has 8,000 views of one
//!   512 KiB buffer, and one whose dictionary keys all name one 512 KiB
//!   value (each gigabytes once decoded), go to the DLQ as `bad_arrow`
//!   naming the column; the worker stays alive with a peak RSS under 1 GB
//!   and publishes the next step;
//! - a stray row after a published step's `step_end`, then a client's retry
//!   of the whole step: one `step_already_published` dead letter, the other
//!   rows counted and dropped, and the partition's committed offset passes
//!   them all without waiting `step_timeout` (300 s here).

use crate::common;

use std::time::{Duration, Instant};

use arrow_array::Int64Array;
use hintstream::batch::{hostile, ipc, ARROW_STREAM_CONTENT_TYPE};
use hintstream::kafka::DlqHeaders;
use hintstream::messages::ScoredRollout;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::Producer;

/// Peak resident memory the worker may reach (issue 21: the views message
/// alone took `advantages compute` to 2.1 GB before it panicked).
const MAX_PEAK_RSS_MB: u64 = 1024;

const RUN: &str = "run-h";

fn row(step: i64, id: &str, reward: f64) -> Vec<u8> {
    let row = ScoredRollout::unhinted(RUN, step, "g", id, reward);
    let mut v = serde_json::to_value(row).unwrap();
    v["type"] = "scored_rollout".into();
    serde_json::to_vec(&v).unwrap()
}

fn end(step: i64, count: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "type": "step_end", "schema_version": 1, "run_id": RUN, "step": step, "count": count
    }))
    .unwrap()
}

fn step(step: i64) -> Vec<(String, Vec<u8>, bool)> {
    let key = format!("{RUN}/{step}");
    vec![
        (key.clone(), row(step, "a", 1.0), false),
        (key.clone(), row(step, "b", 0.0), false),
        (key, end(step, 2), false),
    ]
}

fn header(m: &hintstream::tools::RecordedMessage, name: &str) -> String {
    m.headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value.bytes.clone())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amplified_arrow_is_dead_lettered_and_late_rows_never_hold_commits() {
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    common::own_topics(&mut config.advantages, "hostile-scored", "hostile-advantages");
    config.topics.metrics = common::unique("hostile-metrics");
    config.advantages.step_timeout_secs = 300;
    config.advantages.pass_at_k = vec![1];
    let a = config.advantages.clone();
    common::create_advantages_topics(&config, 1).await;

    let key2 = format!("{RUN}/2");
    let mut inputs = step(1);
    inputs.push((
        key2.clone(),
        hostile::amplified_views_stream(RUN, 2).unwrap(),
        true,
    ));
    inputs.push((key2, hostile::amplified_dictionary_stream(RUN, 2).unwrap(), true));
    inputs.extend(step(2));
    // A stray row after step 1's end, then a client's retry of all of it.
    inputs.push((format!("{RUN}/1"), row(1, "c", 0.5), false));
    inputs.extend(step(1));
    inputs.extend(step(3));
    let total = inputs.len() as i64;

    let producer = common::large_message_producer(&config);
    for (key, payload, arrow) in &inputs {
        let headers = arrow.then(|| {
            OwnedHeaders::new().insert(Header {
                key: "content-type",
                value: Some(ARROW_STREAM_CONTENT_TYPE),
            })
        });
        common::send_raw(&producer, &a.input_topic, key, Some(payload), headers).await;
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let endpoint = common::MetricsEndpoint::free();
    config.advantages.metrics_addr = endpoint.addr();
    let file = common::write_config(&config, dir.path());
    let mut worker = common::Process::spawn(common::stage_command("advantages", &file), "hostile-scored");

    // Every input is committed, well before step_timeout.
    let started = Instant::now();
    loop {
        let committed = common::committed_offsets(&config, &a.group_id, &a.input_topic, 1).await;
        if committed.get(&0) == Some(&total) {
            break;
        }
        assert!(worker.running(), "the worker exited:\n{}", worker.log());
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "committed {committed:?} of {total} after {:?}\n{}",
            started.elapsed(),
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let waited = started.elapsed();
    assert!(worker.running(), "the worker is alive after the hostile messages");
    let peak = common::peak_rss_mb(worker.pid());
    let late_rows = endpoint
        .value("hintstream_advantages_rows_already_published_total", &[])
        .await;
    let late_messages = endpoint
        .value("hintstream_advantages_messages_already_published_total", &[])
        .await;
    let dead = common::read_topic(&config, &a.dlq_topic).await;
    let published = common::read_topic(&config, &a.output_topic).await;
    worker.kill9();

    let mut kinds: Vec<(String, String)> = dead
        .iter()
        .map(|m| (header(m, DlqHeaders::ERROR_KIND), header(m, DlqHeaders::REASON)))
        .collect();
    kinds.sort();
    assert_eq!(kinds.len(), 3, "{kinds:?}");
    assert_eq!(kinds[0].0, "bad_arrow");
    assert_eq!(kinds[1].0, "bad_arrow");
    let reasons = format!("{} | {}", kinds[0].1, kinds[1].1);
    assert!(
        reasons.contains("`trajectory_id`") && reasons.contains("`instance_id`"),
        "{reasons}"
    );
    assert_eq!(kinds[2].0, "step_already_published", "{kinds:?}");
    assert_eq!(
        (late_rows, late_messages),
        (3.0, 4.0),
        "c, then a, b and the step_end"
    );

    let mut steps: Vec<i64> = published
        .iter()
        .flat_map(|m| ipc::decode_stream(m.value_bytes().unwrap()).unwrap())
        .map(|b| {
            b.column_by_name("step")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0)
        })
        .collect();
    steps.sort();
    assert_eq!(
        steps,
        vec![1, 2, 3],
        "step 1 once, and the steps after the hostile messages"
    );
    eprintln!(
        "hostile stage-2 input: {total} messages committed in {waited:?} (step_timeout 300 s); worker peak RSS {peak} MB"
    );
    assert!(peak > 0 && peak < MAX_PEAK_RSS_MB, "peak RSS {peak} MB");
}
