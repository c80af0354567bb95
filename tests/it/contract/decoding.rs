//! Decoding never panics and names what is wrong, for each kind of bad input.

use hintstream::messages::{decode, DecodeError, DecodeLimits, FailedTrajectory};

fn valid() -> serde_json::Value {
    serde_json::json!({
        "schema_version": 1, "run_id": "r", "step": 2, "instance_id": "i", "trajectory_id": "t",
        "task_prompt": "p", "chat_history": [], "reward": 0.0
    })
}

fn decode_failed(bytes: &[u8]) -> Result<FailedTrajectory, DecodeError> {
    decode::<FailedTrajectory>(bytes, DecodeLimits::default())
}

fn with(field: &str, value: serde_json::Value) -> Vec<u8> {
    let mut v = valid();
    v[field] = value;
    serde_json::to_vec(&v).unwrap()
}

fn without(field: &str) -> Vec<u8> {
    let mut v = valid();
    v.as_object_mut().unwrap().remove(field);
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn decodes_a_valid_trajectory_with_defaults() {
    let t = decode_failed(&serde_json::to_vec(&valid()).unwrap()).unwrap();
    assert_eq!(t.group_size, 1);
    assert_eq!(t.group_key(), "r/2/i");
}

#[test]
fn names_the_field_for_each_kind_of_bad_input() {
    let cases: Vec<(&str, Vec<u8>, &str, Option<&str>)> = vec![
        (
            "bad utf-8",
            b"{\"run_id\": \"\xff\xfe\"}".to_vec(),
            "not_utf8",
            None,
        ),
        ("not json", b"{\"run_id\": ".to_vec(), "not_json", None),
        ("not an object", b"[1,2]".to_vec(), "not_object", None),
        ("empty", b"  ".to_vec(), "empty", None),
        (
            "missing field",
            without("trajectory_id"),
            "missing_field",
            Some("trajectory_id"),
        ),
        (
            "wrong type",
            with("step", serde_json::json!("two")),
            "wrong_type",
            Some("step"),
        ),
        (
            "nested wrong type",
            with("chat_history", serde_json::json!([{"role": 1, "content": "x"}])),
            "wrong_type",
            Some("chat_history[0].role"),
        ),
        (
            "nan",
            serde_json::to_string(&valid())
                .unwrap()
                .replace("\"reward\":0.0", "\"reward\":NaN")
                .into_bytes(),
            "non_finite",
            None,
        ),
        (
            "empty id",
            with("instance_id", serde_json::json!("")),
            "invalid_value",
            Some("instance_id"),
        ),
        (
            "negative step",
            with("step", serde_json::json!(-3)),
            "invalid_value",
            Some("step"),
        ),
        (
            "schema version",
            with("schema_version", serde_json::json!(9)),
            "schema_version",
            None,
        ),
    ];
    for (what, bytes, kind, field) in cases {
        let err = decode_failed(&bytes).expect_err(what);
        assert_eq!(err.kind(), kind, "{what}: {err}");
        assert_eq!(err.field(), field, "{what}: {err}");
    }
}

#[test]
fn rejects_deep_nesting_before_parsing() {
    let deep = format!("{{\"a\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let err = decode_failed(deep.as_bytes()).unwrap_err();
    assert_eq!(
        err,
        DecodeError::TooDeep {
            limit: DecodeLimits::default().max_depth
        }
    );
}

#[test]
fn rejects_payloads_over_the_size_limit() {
    let limits = DecodeLimits {
        max_bytes: 1024,
        ..DecodeLimits::default()
    };
    let big = with("task_prompt", serde_json::json!("x".repeat(2000)));
    let err = decode::<FailedTrajectory>(&big, limits).unwrap_err();
    assert_eq!(err.kind(), "too_large");
}

#[test]
fn never_panics_on_arbitrary_bytes() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let seed = serde_json::to_vec(&valid()).unwrap();
    for _ in 0..20_000 {
        let mut bytes = seed.clone();
        for _ in 0..rng.random_range(1..6) {
            let i = rng.random_range(0..bytes.len());
            bytes[i] = rng.random();
        }
        let _ = decode_failed(&bytes);
    }
}
