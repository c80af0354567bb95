//! `prompt_version = "reference"` against what the reference trainer's own
//! functions produce (schemas/fixtures/reference_prompts.json and
//! python_literals.json, written once by scripts/reference-prompt-fixtures.py
//! from SkyRL-Fleet's hint_synthesizer.py and FleetTaskEnv.build_hint_text):
//! the system prompt, the user message and the static hint of every fixture,
//! byte for byte, and `ast.literal_eval`'s result for every literal.

use std::path::PathBuf;

use hintstream::llm::prompt::pyeval::literal_eval;
use hintstream::llm::prompt::{reference, PromptVersion};
use hintstream::messages::{decode, DecodeLimits, FailedTrajectory, OrderedJson};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("schemas/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The fixture's trajectories in file order, their objects' keys in the
/// order the file has them (a `Value` would sort them).
fn trajectory_payloads() -> Vec<Vec<u8>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas/fixtures/reference_prompts.json");
    let ordered: OrderedJson = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let Some(OrderedJson::Array(cases)) = ordered.get("cases") else {
        panic!("no cases")
    };
    cases
        .iter()
        .map(|case| serde_json::to_vec(case.get("trajectory").unwrap()).unwrap())
        .collect()
}

/// The fixture's trajectory, decoded from its payload as stage 1 decodes one.
fn trajectory(case: &Value, bytes: &[u8]) -> FailedTrajectory {
    let limits = DecodeLimits::default();
    decode::<FailedTrajectory>(bytes, limits).unwrap_or_else(|e| panic!("{}: {e}", case["name"]))
}

/// The first difference of two texts, for a readable failure.
fn first_difference(want: &str, got: &str) -> String {
    let at = want.chars().zip(got.chars()).take_while(|(a, b)| a == b).count();
    let around = |s: &str| {
        s.chars()
            .skip(at.saturating_sub(40))
            .take(100)
            .collect::<String>()
    };
    format!(
        "first difference at char {at} (want {} chars, got {}):\n want: {:?}\n  got: {:?}",
        want.chars().count(),
        got.chars().count(),
        around(want),
        around(got)
    )
}

#[test]
fn the_fixtures_cover_the_required_inputs() {
    let prompts = fixture("reference_prompts.json");
    let cases = prompts["cases"].as_array().unwrap();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let names: Vec<&str> = cases.iter().map(|c| c["name"].as_str().unwrap()).collect();
    for needed in [
        "empty-history",
        "multimodal",
        "tool-use-without-a-name",
        "long-message",
        "both-accumulators",
        "broken",
        "tool-errors-with-repeats",
        "non-ascii",
        "emoji",
    ] {
        assert!(
            names.iter().any(|n| n.contains(needed)),
            "no fixture for {needed}"
        );
    }
    assert_eq!(prompts["max_tokens"], 300);
    assert_eq!(prompts["temperature"], 0.3);
}

#[test]
fn the_system_prompt_is_the_reference_s_byte_for_byte() {
    let prompts = fixture("reference_prompts.json");
    let want = prompts["system"].as_str().unwrap();
    assert_eq!(
        PromptVersion::Reference.system_prompt(),
        want,
        "{}",
        first_difference(want, reference::SYSTEM_PROMPT)
    );
}

#[test]
fn every_fixture_s_user_message_is_the_reference_s_byte_for_byte() {
    let prompts = fixture("reference_prompts.json");
    let mut failures = Vec::new();
    for (case, bytes) in prompts["cases"]
        .as_array()
        .unwrap()
        .iter()
        .zip(trajectory_payloads())
    {
        let want = case["user"].as_str().unwrap();
        let got = PromptVersion::Reference.user_message(&trajectory(case, &bytes));
        if got != want {
            failures.push(format!("{}: {}", case["name"], first_difference(want, &got)));
        }
    }
    assert!(
        failures.is_empty(),
        "{} fixtures differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_fixture_s_static_hint_is_build_hint_text_s() {
    let prompts = fixture("reference_prompts.json");
    let mut failures = Vec::new();
    for (case, bytes) in prompts["cases"]
        .as_array()
        .unwrap()
        .iter()
        .zip(trajectory_payloads())
    {
        let want = case["static_hint"].as_str().unwrap();
        let got = PromptVersion::Reference.static_hint(&trajectory(case, &bytes));
        if got != want {
            failures.push(format!("{}: {}", case["name"], first_difference(want, &got)));
        }
    }
    assert!(
        failures.is_empty(),
        "{} fixtures differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Literals where our `literal_eval` knowingly differs from Python's, and why.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[(
    "['\\N{BULLET}']",
    "\\N{NAME} escapes need Unicode's name table: refused (repr() never writes them)",
)];

#[test]
fn literal_eval_gives_python_s_value_or_refuses_as_python_does() {
    let literals = fixture("python_literals.json");
    let vectors = literals["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 300, "{} vectors", vectors.len());
    let mut failures = Vec::new();
    for v in vectors {
        let source = v["source"].as_str().unwrap();
        if KNOWN_DIFFERENCES.iter().any(|(s, _)| *s == source) {
            continue;
        }
        let want = v["repr"].as_str();
        let got = literal_eval(source).ok().map(|value| value.to_py_repr());
        if got.as_deref() != want {
            failures.push(format!("{source:?}: want {want:?}, got {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

#[test]
fn the_default_version_is_v3_and_names_parse() {
    assert_eq!(PromptVersion::default(), PromptVersion::V3);
    assert_eq!(
        "reference".parse::<PromptVersion>().unwrap(),
        PromptVersion::Reference
    );
    assert_eq!("v3".parse::<PromptVersion>().unwrap().as_str(), "v3");
    assert!("v4".parse::<PromptVersion>().is_err());
    // v2 is read as v3: the same prompt, its untrusted text delimited.
    assert_eq!("v2".parse::<PromptVersion>().unwrap(), PromptVersion::V3);
    let v: PromptVersion = serde_json::from_str("\"reference\"").unwrap();
    assert_eq!(v.to_string(), "reference");
}
