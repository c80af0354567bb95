//! Names on the wire against schemas/vectors/wire_names.json, which the
//! Python suite reads too (python/tests/test_wire_names.py): header names,
//! content types, hint categories, the default topics and dead-letter topics.

use std::collections::BTreeMap;

use hintstream::advantages::publish::DEVICE_HEADER;
use hintstream::batch::chunk::{ATTEMPT_HEADER, CHUNKS_HEADER, CHUNK_HEADER, ROWS_HEADER};
use hintstream::batch::ARROW_STREAM_CONTENT_TYPE;
use hintstream::config::Config;
use hintstream::hints::service::{CATEGORY_HEADER, PROMPT_VERSION_HEADER};
use hintstream::kafka::DlqHeaders;
use hintstream::messages::HintCategory;
use hintstream::telemetry::TRACEPARENT_HEADER;
use serde_json::Value;

fn vectors() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/vectors/wire_names.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A section of the vectors as name → value.
fn section(name: &str) -> BTreeMap<String, String> {
    serde_json::from_value(vectors()[name].clone()).unwrap()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn header_names_are_the_shared_vectors() {
    let mut want = section("headers");
    // Written as a literal where it is read and set (advantages::decode,
    // the publishers): nothing to compare here; the Python side checks it.
    assert_eq!(want.remove("content_type").as_deref(), Some("content-type"));
    let ours = map(&[
        ("chunk", CHUNK_HEADER),
        ("chunks", CHUNKS_HEADER),
        ("rows", ROWS_HEADER),
        ("attempt", ATTEMPT_HEADER),
        ("device", DEVICE_HEADER),
        ("category", CATEGORY_HEADER),
        ("prompt_version", PROMPT_VERSION_HEADER),
        ("error_kind", DlqHeaders::ERROR_KIND),
        ("error_reason", DlqHeaders::REASON),
        ("source_topic", DlqHeaders::SOURCE_TOPIC),
        ("source_partition", DlqHeaders::SOURCE_PARTITION),
        ("source_offset", DlqHeaders::SOURCE_OFFSET),
        ("payload_truncated_from", DlqHeaders::TRUNCATED_FROM),
        ("key_truncated_from", DlqHeaders::KEY_TRUNCATED_FROM),
        ("traceparent", TRACEPARENT_HEADER),
    ]);
    assert_eq!(ours, want);
}

#[test]
fn content_types_and_categories_are_the_shared_vectors() {
    assert_eq!(
        section("content_types"),
        map(&[("arrow_stream", ARROW_STREAM_CONTENT_TYPE)])
    );
    let ours: Vec<Value> = [
        HintCategory::LlmSynthesized,
        HintCategory::StaticFallback,
        HintCategory::LlmFailedStaticFallback,
    ]
    .into_iter()
    .map(|c| {
        assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        Value::from(c.as_str())
    })
    .collect();
    assert_eq!(Value::from(ours), vectors()["categories"]);
}

#[test]
fn default_topics_are_the_shared_vectors() {
    let config = Config::default();
    let t = &config.topics;
    let ours = map(&[
        ("failed", t.failed.as_str()),
        ("hints", t.hints.as_str()),
        ("scored", t.scored.as_str()),
        ("advantages", t.advantages.as_str()),
        ("metrics", t.metrics.as_str()),
        ("outcomes", t.outcomes.as_str()),
        ("spend", t.spend.as_str()),
    ]);
    assert_eq!(ours, section("topics"));
    let stages = map(&[
        ("hints", config.hints.stage.dlq_topic.as_str()),
        ("advantages", config.advantages.stage.dlq_topic.as_str()),
    ]);
    assert_eq!(stages, section("dead_letter_topics"));
}
