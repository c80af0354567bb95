//! The JSON Schemas in `schemas/` and the Rust types agree: every valid
//! example decodes and passes its schema; every invalid example is rejected by
//! both.

use std::path::{Path, PathBuf};

use hintstream::messages::{decode, DecodeLimits, FailedTrajectory, Hint, HintOutcome, ScoredMessage};

fn schemas_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas")
}

fn validator(name: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(schemas_dir().join(format!("{name}.schema.json"))).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .unwrap_or_else(|e| panic!("{name} schema does not compile: {e}"))
}

/// Decodes with the message type behind `name`; `Ok` only for the right kind.
fn rust_accepts(name: &str, bytes: &[u8]) -> Result<(), String> {
    let limits = DecodeLimits::default();
    let e = |e: hintstream::messages::DecodeError| e.to_string();
    match name {
        "failed_trajectory" => decode::<FailedTrajectory>(bytes, limits).map(drop).map_err(e),
        "hint" => decode::<Hint>(bytes, limits).map(drop).map_err(e),
        "hint_outcome" => decode::<HintOutcome>(bytes, limits).map(drop).map_err(e),
        "scored_rollout" => match decode::<ScoredMessage>(bytes, limits).map_err(e)? {
            ScoredMessage::ScoredRollout(_) => Ok(()),
            other => Err(format!("decoded as another kind: {other:?}")),
        },
        "step_end" => match decode::<ScoredMessage>(bytes, limits).map_err(e)? {
            ScoredMessage::StepEnd(_) => Ok(()),
            other => Err(format!("decoded as another kind: {other:?}")),
        },
        other => panic!("no decoder for {other}"),
    }
}

/// `Ok` when the bytes are JSON and the schema accepts them.
fn schema_accepts(validator: &jsonschema::Validator, bytes: &[u8]) -> Result<(), String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let errors: Vec<String> = validator.iter_errors(&value).map(|e| e.to_string()).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn examples(name: &str, kind: &str) -> Vec<PathBuf> {
    let dir = schemas_dir().join("examples").join(name).join(kind);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no examples in {}", dir.display());
    files
}

const MESSAGES: [&str; 5] = [
    "failed_trajectory",
    "hint",
    "hint_outcome",
    "scored_rollout",
    "step_end",
];

#[test]
fn valid_examples_pass_schema_and_decode() {
    for name in MESSAGES {
        let validator = validator(name);
        for file in examples(name, "valid") {
            let bytes = std::fs::read(&file).unwrap();
            schema_accepts(&validator, &bytes)
                .unwrap_or_else(|e| panic!("schema rejects {}: {e}", file.display()));
            rust_accepts(name, &bytes).unwrap_or_else(|e| panic!("decode rejects {}: {e}", file.display()));
        }
    }
}

#[test]
fn invalid_examples_fail_schema_and_decode() {
    for name in MESSAGES {
        let validator = validator(name);
        for file in examples(name, "invalid") {
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                schema_accepts(&validator, &bytes).is_err(),
                "schema accepts invalid {}",
                file.display()
            );
            assert!(
                rust_accepts(name, &bytes).is_err(),
                "decode accepts invalid {}",
                file.display()
            );
        }
    }
}

#[test]
fn produced_hints_match_their_schema() {
    // A Hint built by the Rust type serialises into something the schema takes.
    let bytes = std::fs::read(schemas_dir().join("examples/hint/valid/llm.json")).unwrap();
    let hint: Hint = serde_json::from_slice(&bytes).unwrap();
    let round_trip = serde_json::to_vec(&hint).unwrap();
    schema_accepts(&validator("hint"), &round_trip).unwrap();
}

#[test]
fn produced_outcomes_and_refined_hints_match_their_schemas() {
    let bytes = std::fs::read(schemas_dir().join("examples/hint_outcome/valid/rescued.json")).unwrap();
    let outcome: HintOutcome = serde_json::from_slice(&bytes).unwrap();
    schema_accepts(&validator("hint_outcome"), &serde_json::to_vec(&outcome).unwrap()).unwrap();
    let bytes = std::fs::read(schemas_dir().join("examples/hint/valid/refined.json")).unwrap();
    let hint: Hint = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(hint.refines.len(), 1);
    schema_accepts(&validator("hint"), &serde_json::to_vec(&hint).unwrap()).unwrap();
    // A hint written before arms existed reads as the default arm.
    let bytes = std::fs::read(schemas_dir().join("examples/hint/valid/llm.json")).unwrap();
    let old: Hint = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        (old.arm.as_str(), old.refines.len()),
        (hintstream::messages::DEFAULT_ARM, 0)
    );
}

#[test]
fn a_graded_hint_writes_its_level_and_a_hint_without_one_writes_no_key() {
    let bytes = std::fs::read(schemas_dir().join("examples/hint/valid/graded.json")).unwrap();
    let hint: Hint = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(hint.level, Some(hintstream::messages::HintLevel::Plan));
    let written = serde_json::to_vec(&hint).unwrap();
    schema_accepts(&validator("hint"), &written).unwrap();
    assert!(String::from_utf8(written).unwrap().contains("\"level\":\"plan\""));
    // Without levels the bytes are what they were: no `level` key at all.
    let bytes = std::fs::read(schemas_dir().join("examples/hint/valid/refined.json")).unwrap();
    let hint: Hint = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(hint.level, None);
    let written = String::from_utf8(serde_json::to_vec(&hint).unwrap()).unwrap();
    assert!(!written.contains("level"), "{written}");
}

/// The static-hint fixtures shared with the Python package
/// (python/tests/test_static_hint.py checks the same files): the Rust text
/// of each is exactly the fixture's. Rewrite them with
/// scripts/static-hint-fixtures.sh after changing the static hint.
#[test]
fn static_hint_fixtures_hold_the_rust_text() {
    use hintstream::llm::prompt::{feedback, static_hint};
    use hintstream::messages::FailedTrajectory;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/fixtures/static_hint");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let fixture: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let trajectory: FailedTrajectory = serde_json::from_value(fixture["trajectory"].clone()).unwrap();
        assert_eq!(
            static_hint(&feedback(&trajectory)),
            fixture["hint"].as_str().unwrap(),
            "{}",
            path.display()
        );
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} fixtures");
}
