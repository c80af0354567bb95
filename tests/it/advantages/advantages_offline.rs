//! `hintstream advantages compute` on files: JSONL in and out, Arrow in
//! (dictionary-encoded ids, f32 rewards, i16 steps) and out, several steps in
//! one file each normalised on its own, flags honoured.

use std::process::Command;
use std::sync::Arc;

use arrow_array::{
    Array, BooleanArray, DictionaryArray, Float32Array, Float64Array, Int16Array, RecordBatch, StringArray,
};
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use arrow_schema::{DataType, Field, Schema};

const EPS: f64 = 1e-6;

fn hintstream(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hintstream"))
        .current_dir(std::env::temp_dir())
        .args(args)
        .output()
        .unwrap()
}

fn advantages_of(jsonl: &str) -> Vec<f64> {
    jsonl
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["advantage"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

#[test]
fn computes_each_step_of_a_jsonl_file_in_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("rows.jsonl");
    // Step 1: g [1, 0] (no hints). Step 2: g raw [0, 0] and a hinted 1.
    let rows = [
        r#"{"type":"scored_rollout","schema_version":1,"run_id":"r","step":1,"instance_id":"g","trajectory_id":"a","reward":1.0,"is_hinted":false}"#,
        r#"{"type":"scored_rollout","schema_version":1,"run_id":"r","step":2,"instance_id":"g","trajectory_id":"b","reward":0.0,"is_hinted":false}"#,
        r#"{"type":"scored_rollout","schema_version":1,"run_id":"r","step":1,"instance_id":"g","trajectory_id":"c","reward":0.0,"is_hinted":false}"#,
        r#"{"type":"scored_rollout","schema_version":1,"run_id":"r","step":2,"instance_id":"g","trajectory_id":"d","reward":0.0,"is_hinted":false}"#,
        r#"{"type":"scored_rollout","schema_version":1,"run_id":"r","step":2,"instance_id":"g","trajectory_id":"e","reward":1.0,"is_hinted":true}"#,
        r#"{"type":"step_end","schema_version":1,"run_id":"r","step":2,"count":3}"#,
    ];
    std::fs::write(&input, rows.join("\n")).unwrap();
    let output = dir.path().join("out.jsonl");
    let out = hintstream(&[
        "advantages",
        "compute",
        "--device",
        "cpu",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&output).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["trajectory_id"], "a");
    assert_eq!(first["run_id"], "r");
    let s = 0.5f64.sqrt();
    let want = [0.5 / (s + EPS), 0.0, -0.5 / (s + EPS), 0.0, 1.0 / EPS];
    for (g, w) in advantages_of(&text).iter().zip(want) {
        assert!((g - w).abs() <= 1e-9 * (1.0 + w.abs()), "got {g}, want {w}");
    }

    // --no-norm-by-std centres only; --epsilon is honoured.
    let out = hintstream(&[
        "advantages",
        "compute",
        "--no-norm-by-std",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert_eq!(
        advantages_of(&std::fs::read_to_string(&output).unwrap()),
        vec![0.5, 0.0, -0.5, 0.0, 1.0]
    );
    let out = hintstream(&[
        "advantages",
        "compute",
        "--epsilon",
        "0.5",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let got = advantages_of(&std::fs::read_to_string(&output).unwrap());
    assert!((got[4] - 1.0 / 0.5).abs() < 1e-12);
}

#[test]
fn reads_and_writes_arrow_with_other_encodings() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("rows.arrow");
    let schema = Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("step", DataType::Int16, false),
        Field::new(
            "instance_id",
            DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
            false,
        ),
        Field::new("trajectory_id", DataType::Utf8, false),
        Field::new("reward", DataType::Float32, false),
        Field::new("is_hinted", DataType::Boolean, false),
    ]));
    let ids: DictionaryArray<arrow_array::types::Int8Type> = vec!["x", "y", "x", "y"].into_iter().collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec!["r"; 4])),
            Arc::new(Int16Array::from(vec![7; 4])),
            Arc::new(ids),
            Arc::new(StringArray::from(vec!["a", "b", "c", "d"])),
            Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0, 6.0])),
            Arc::new(BooleanArray::from(vec![false; 4])),
        ],
    )
    .unwrap();
    let mut writer = FileWriter::try_new(std::fs::File::create(&input).unwrap(), &schema).unwrap();
    writer.write(&batch).unwrap();
    writer.finish().unwrap();

    let output = dir.path().join("out.arrow");
    let out = hintstream(&[
        "advantages",
        "compute",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reader = FileReader::try_new(std::fs::File::open(&output).unwrap(), None).unwrap();
    let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
    let b = &batches[0];
    let adv = b
        .column_by_name("advantage")
        .unwrap()
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap();
    // x: [1, 3] mean 2 std sqrt(2); y: [2, 6] mean 4 std sqrt(8).
    let (sx, sy) = (2f64.sqrt(), 8f64.sqrt());
    let want = [
        -1.0 / (sx + EPS),
        -2.0 / (sy + EPS),
        1.0 / (sx + EPS),
        2.0 / (sy + EPS),
    ];
    for (g, w) in adv.values().iter().zip(want) {
        assert!((g - w).abs() < 1e-9, "got {g}, want {w}");
    }
    assert_eq!(adv.null_count(), 0);
}

#[test]
fn bad_input_fails_with_the_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("rows.jsonl");
    std::fs::write(&input, "{\"type\":\"scored_rollout\",\"schema_version\":1,\"run_id\":\"r\",\"step\":1,\"instance_id\":\"g\",\"trajectory_id\":\"a\",\"reward\":1.0,\"is_hinted\":false}\n{\"reward\": NaN}\n").unwrap();
    let out = hintstream(&[
        "advantages",
        "compute",
        "--input",
        input.to_str().unwrap(),
        "--output",
        "/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2") && err.contains("non-finite"), "{err}");
}

/// The book's step-metrics table (docs/advantages.md) names exactly what stage 2 publishes: a
/// step rich enough to define every metric (both hint categories, groups of
/// 8 raw rows) yields one key per table row, and nothing else.
#[test]
fn the_book_metrics_table_matches_what_stage_2_publishes() {
    use hintstream::advantages::step_metrics::{step_metrics, MetricOptions};
    use hintstream::messages::ScoredRollout;
    let chapter =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/advantages.md"))
            .unwrap();
    let section = chapter
        .split("\n## Step metrics\n")
        .nth(1)
        .expect("docs/advantages.md has a Step metrics section");
    let table: std::collections::BTreeSet<String> = section
        .lines()
        .skip_while(|l| !l.starts_with("| metric |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.split('`')
                .nth(1)
                .expect("a metric name in backticks")
                .to_string()
        })
        .collect();

    let mut rows = hintstream::batch::ScoredRows::default();
    for g in 0..3 {
        for i in 0..8 {
            let category = match i {
                6 => Some("llm_synthesized"),
                7 => Some("llm_failed_static_fallback"),
                _ => None,
            };
            rows.push(&ScoredRollout {
                schema_version: 1,
                run_id: "r".into(),
                step: 1,
                instance_id: format!("g{g}"),
                trajectory_id: format!("t{g}-{i}"),
                reward: f64::from(u8::from(i % 3 == 0)),
                is_hinted: category.is_some(),
                hint_category: category.map(str::to_string),
                hint_id: None,
                // Hinted rows carry log-probs, so that transfer and
                // reliance are defined (row 6 succeeds).
                response_length: category.map(|_| 4),
                logprob_hinted: category.map(|_| -2.0),
                logprob_unhinted: category.map(|_| -6.0),
            });
        }
    }
    let advantages = hintstream::normalize::Advantages {
        advantage: vec![0.0; rows.len()],
        ..Default::default()
    };
    let published = step_metrics(
        &rows,
        &hintstream::normalize::DenseGroups::from_strings(rows.instance_id.iter()),
        &advantages,
        &MetricOptions {
            success_threshold: 0.0,
            pass_at_k: &[4],
            samples_per_prompt: None,
        },
    );
    // The service adds these two to every step's object, and the per-arm
    // metrics of a step whose hinted rows name hints (all defined here: a
    // fresh and a refined hint with a cost, both rescued).
    let mut names: std::collections::BTreeSet<String> = published
        .keys()
        .cloned()
        .chain(["step".to_string(), "advantage/duplicate_rows".to_string()])
        .chain(learned_step_metric_names())
        .collect();
    // The table writes the configurable numbers as <n> and <k>, and an
    // arm's name as <name>.
    names = names
        .into_iter()
        .map(|n| {
            n.replace("reward/avg_pass_at_6", "reward/avg_pass_at_<n>")
                .replace("reward/pass_at_4", "reward/pass_at_<k>")
                .replace("hint/arm/default/", "hint/arm/<name>/")
                .replace("/level/concept/", "/level/<level>/")
                .replace("/level/plan/", "/level/<level>/")
        })
        .collect();
    assert_eq!(names, table, "docs/advantages.md's table vs published metrics");
}

/// The per-arm metrics stage 2 merges into a step with hint_ids, each
/// defined: the implicit arm's fresh and refined hint, both rescued.
fn learned_step_metric_names() -> Vec<String> {
    use hintstream::learn::{ArmSpec, Arms, LearnOptions, LearnState};
    use hintstream::messages::{Hint, HintCategory, HintLevel, HintOutcome, HintSource, Usage};
    // The implicit arm, given levels (as a graded arm has) so that its
    // per-level metrics are defined too.
    let mut spec = ArmSpec::llm("default", &["m"]);
    spec.levels = vec![HintLevel::Concept, HintLevel::Plan];
    let arms = Arms::new(vec![spec], LearnOptions::default()).unwrap();
    let mut state = LearnState::new(arms);
    for (id, refines) in [("fresh", vec![]), ("refined", vec!["fresh".to_string()])] {
        state.observe_hint(&Hint {
            schema_version: 1,
            hint_id: id.into(),
            run_id: "r".into(),
            step: 1,
            instance_id: id.into(),
            trajectory_id: "t".into(),
            hint: "h".into(),
            category: HintCategory::LlmSynthesized,
            model: Some("m".into()),
            prompt_version: "v1".into(),
            latency_ms: 1,
            usage: Usage::default(),
            cost_usd: 0.01,
            failure_reason: None,
            source: HintSource {
                topic: "f".into(),
                partition: 0,
                offset: 0,
            },
            created_at: "2026-01-01T00:00:00Z".into(),
            arm: "default".into(),
            refines,
            hint_truncated: false,
            hedged: false,
            leak: false,
            level: Some(HintLevel::Concept),
        });
        state.observe_outcome(&HintOutcome {
            schema_version: 1,
            hint_id: id.into(),
            run_id: "r".into(),
            step: 1,
            instance_id: id.into(),
            hinted_rollouts: 1,
            successes: 1,
            rescued: true,
            mean_reward: 1.0,
            transfer: Some(0.5),
            reliance: Some(1.0),
            created_at: "2026-01-01T00:00:00Z".into(),
        });
    }
    let mut names: Vec<String> = state.step_metrics("r", 1).into_keys().collect();
    names.extend(state.level_metrics("r", 1).into_keys());
    names
}

/// The estimator is chosen by `[normalize] estimator` or `--estimator`:
/// RLOO on a group of two gives each row its score minus the other's.
#[test]
fn the_estimator_flag_picks_rloo() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    let row = |id: &str, reward: f64| {
        serde_json::json!({
            "type": "scored_rollout", "schema_version": 1, "run_id": "r", "step": 1,
            "instance_id": "g", "trajectory_id": id, "reward": reward, "is_hinted": false
        })
        .to_string()
    };
    std::fs::write(&input, [row("a", 1.0), row("b", 0.0)].join("\n")).unwrap();
    for (estimator, want) in [("rloo", [1.0, -1.0]), ("drgrpo", [0.5, -0.5])] {
        let out = hintstream(&[
            "advantages",
            "compute",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--estimator",
            estimator,
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let got: Vec<f64> = std::fs::read_to_string(&output)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["advantage"]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        assert_eq!(got, want, "{estimator}");
    }
}

/// `advantages compute` with `HINTSTREAM_NORMALIZE__HINTED_WEIGHT` set.
fn compute_with_weight(input: &std::path::Path, output: &std::path::Path, weight: Option<&str>) -> Vec<u8> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
    command.current_dir(std::env::temp_dir()).args([
        "advantages",
        "compute",
        "--device",
        "cpu",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    if let Some(w) = weight {
        command.env("HINTSTREAM_NORMALIZE__HINTED_WEIGHT", w);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::read(output).unwrap()
}

/// Issue 31 item 5: with `hinted_weight = "ratio"` every row's `weight` is
/// ω = min(1, exp((logprob_unhinted − logprob_hinted) / response_length))
/// on hinted rows with both log-probs and 1.0 elsewhere, within 1e-12, in
/// JSONL and in Arrow; with `none` (the default) the output is byte for
/// byte the output of the same rows without log-probs.
#[test]
fn hinted_weight_ratio_adds_the_formula_and_none_changes_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    // (trajectory, reward, hinted, logprob_hinted, logprob_unhinted, length)
    type Spec = (&'static str, f64, bool, Option<f64>, Option<f64>, Option<i64>);
    let spec: [Spec; 6] = [
        ("raw-1", 0.0, false, None, None, Some(7)),
        ("raw-2", 1.0, false, None, None, None),
        ("h-both", 1.0, true, Some(-12.5), Some(-40.25), Some(9)),
        ("h-capped", 0.0, true, Some(-30.0), Some(-3.0), Some(4)),
        ("h-one", 1.0, true, Some(-2.0), None, Some(3)),
        ("h-none", 0.0, true, None, None, None),
    ];
    let line = |(id, reward, hinted, lh, lu, length): &Spec, with_logprobs: bool| {
        let mut v = serde_json::json!({
            "type": "scored_rollout", "schema_version": 1, "run_id": "r", "step": 1,
            "instance_id": "g", "trajectory_id": id, "reward": reward, "is_hinted": hinted,
        });
        if let Some(l) = length {
            v["response_length"] = (*l).into();
        }
        if with_logprobs {
            if let Some(x) = lh {
                v["logprob_hinted"] = (*x).into();
            }
            if let Some(x) = lu {
                v["logprob_unhinted"] = (*x).into();
            }
        }
        v.to_string()
    };
    let want = |s: &Spec| match (s.2, s.3, s.4, s.5) {
        (true, Some(lh), Some(lu), Some(l)) => ((lu - lh) / l as f64).exp().min(1.0),
        _ => 1.0,
    };
    let with = dir.path().join("with.jsonl");
    let without = dir.path().join("without.jsonl");
    std::fs::write(
        &with,
        spec.iter().map(|s| line(s, true)).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    std::fs::write(
        &without,
        spec.iter().map(|s| line(s, false)).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    for ext in ["jsonl", "arrow"] {
        let out = dir.path().join(format!("out.{ext}"));
        let plain = compute_with_weight(&without, &out, None);
        assert_eq!(
            compute_with_weight(&with, &out, None),
            plain,
            "{ext}: none is byte-identical"
        );
        assert_eq!(compute_with_weight(&with, &out, Some("none")), plain, "{ext}");
        let weighted = compute_with_weight(&with, &out, Some("ratio"));
        let got: Vec<f64> = if ext == "jsonl" {
            let text = String::from_utf8(weighted).unwrap();
            assert!(!String::from_utf8(plain).unwrap().contains("weight"));
            text.lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["weight"]
                        .as_f64()
                        .unwrap()
                })
                .collect()
        } else {
            let reader = FileReader::try_new(std::io::Cursor::new(weighted), None).unwrap();
            let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
            let column = batches[0].column_by_name("weight").expect("a weight column");
            assert_eq!(column.data_type(), &DataType::Float64);
            column
                .as_any()
                .downcast_ref::<Float64Array>()
                .unwrap()
                .values()
                .to_vec()
        };
        assert_eq!(got.len(), spec.len(), "{ext}");
        for (s, w) in spec.iter().zip(&got) {
            assert!((w - want(s)).abs() <= 1e-12, "{ext} {}: {w} vs {}", s.0, want(s));
        }
        assert!(got[2] < 1.0 && got[3] == 1.0, "{got:?}");
    }
}
