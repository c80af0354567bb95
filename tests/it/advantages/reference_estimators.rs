//! The reference trainer's own estimator tests (SkyRL-Fleet
//! `tests/backends/skyrl_train/utils/test_ppo_utils.py`) as ours, for GRPO,
//! RLOO and REINFORCE++, with its literal expected values where it has them;
//! then cases it lacks (hinted rows, mixed response lengths, `norm_by_std`
//! off, custom epsilons) with values computed from its formulas.
//!
//! Every case runs every way in: the CPU kernel, `compute_step` from string
//! ids and `ScoredRows`, an Arrow batch with the optional `response_length`
//! column (`compute_batch`), and `Device::Cuda` (the CUDA kernel where there
//! is a GPU and a `--features cuda` build, the CPU fallback elsewhere).
//!
//! The reference's REINFORCE++ tests do not apply here:
//! `test_compute_reinforce_plus_plus_outcome_advantage_gamma` uses γ = 0.5
//! and both it and `..._returns_and_masking` put rewards on several tokens
//! of a row and check the per-token returns (and that masked positions are
//! 0) only. Our REINFORCE++ is the outcome form with γ = 1: one score per
//! row, on its last token, so every token of a row has the same return and
//! the same advantage; its cases below are the computed ones.
//!
//! How the computed values were made: a plain-Python float64 transcription
//! of the reference's `compute_grpo_outcome_advantage`,
//! `compute_rloo_outcome_advantage` and
//! `compute_reinforce_plus_plus_outcome_advantage` (with its `masked_mean`,
//! `masked_var` and `masked_whiten`, fed token matrices with the score on
//! the last of `response_length` tokens and a `response_mask` of that many
//! ones), run once; the printed values are pasted below as literals. None of
//! that code is in this repository.

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use hintstream::advantages::{compute_batch, compute_step};
use hintstream::batch::ScoredRows;
use hintstream::normalize::{self, AdvantageOptions, Batch, Device, Estimator, HintBaseline, Ran};

/// One step's rows: (instance_id, score, is_hinted).
type Rows = [(&'static str, f64, bool)];

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-12 * want.abs().max(1.0)
}

fn scored(rows: &Rows, lengths: &[u32]) -> ScoredRows {
    let mut s = ScoredRows::default();
    for (i, r) in rows.iter().enumerate() {
        s.run_id.push("run");
        s.step.push(1);
        s.instance_id.push(r.0);
        s.trajectory_id.push(&format!("t{i}"));
        s.reward.push(r.1);
        s.is_hinted.push(r.2);
        s.hint_category.push(r.2.then(|| "llm_synthesized".into()));
    }
    s.response_length = lengths.to_vec();
    while s.response_length.last() == Some(&1) {
        s.response_length.pop();
    }
    s
}

/// Checks that every path gives `want` for `rows` (with response lengths
/// `lengths`, empty for all 1) under `options`.
fn assert_advantages(name: &str, rows: &Rows, lengths: &[u32], options: AdvantageOptions, want: &[f64]) {
    assert_eq!(rows.len(), want.len(), "{name}: case has a value per row");
    let check = |path: &str, got: &[f64]| {
        assert_eq!(got.len(), want.len(), "{name}, {path}: row count");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                close(*g, *w),
                "{name}, {path}, row {i}: got {g}, want {w} (all: {got:?})"
            );
        }
    };
    // Dense ids in first-seen order.
    let mut names: Vec<&str> = Vec::new();
    let ids: Vec<u32> = rows
        .iter()
        .map(|r| match names.iter().position(|n| *n == r.0) {
            Some(p) => p as u32,
            None => {
                names.push(r.0);
                (names.len() - 1) as u32
            }
        })
        .collect();
    let reward: Vec<f64> = rows.iter().map(|r| r.1).collect();
    let hinted: Vec<bool> = rows.iter().map(|r| r.2).collect();
    let batch = Batch {
        group: &ids,
        n_groups: names.len(),
        reward: &reward,
        hinted: &hinted,
        response_length: lengths,
    };
    let (cpu, ran) = normalize::compute(&batch, &options, Device::Cpu).unwrap();
    assert_eq!(ran, Ran::Cpu);
    check("cpu kernel", &cpu.advantage);

    let step = compute_step(scored(rows, lengths), &options, Device::Cpu).unwrap();
    check("from string ids", &step.advantages.advantage);

    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("instance_id", Arc::new(StringArray::from(names_of(rows)))),
        ("reward", Arc::new(Float64Array::from(reward.clone()))),
        ("is_hinted", Arc::new(BooleanArray::from(hinted.clone()))),
    ];
    if !lengths.is_empty() {
        // Int64 on purpose: any integer type is read.
        let values: Vec<i64> = lengths.iter().map(|&l| i64::from(l)).collect();
        columns.push(("response_length", Arc::new(Int64Array::from(values))));
    }
    let arrow = RecordBatch::try_from_iter(columns).unwrap();
    let (got, _) = compute_batch(&arrow, &options, Device::Cpu).unwrap();
    check("arrow", &got.advantage);

    let (cuda, ran) = normalize::compute(&batch, &options, Device::Cuda).unwrap();
    assert!(matches!(ran, Ran::Cuda | Ran::CpuFallback), "{ran:?}");
    check(ran.as_str(), &cuda.advantage);
}

fn names_of(rows: &Rows) -> Vec<&'static str> {
    rows.iter().map(|r| r.0).collect()
}

fn options(estimator: Estimator) -> AdvantageOptions {
    AdvantageOptions {
        estimator,
        ..AdvantageOptions::default()
    }
}

// ---- The reference's cases, with its literal expected values. ----

/// `test_compute_grpo_outcome_advantage`: one row with token rewards
/// [1, 2, 3] (score 6) alone in its group. The reference checks shapes and
/// that advantages equal returns only; the value is its formula's for a
/// group of one (mean 0, std 1): 6 / (1 + 1e-6), computed.
#[test]
fn reference_grpo_outcome_advantage() {
    assert_advantages(
        "grpo",
        &[("0", 6.0, false)],
        &[],
        options(Estimator::Grpo),
        &[5.999994000006001],
    );
}

/// `test_compute_grpo_outcome_advantage_norm_std_false`: groups [6, 3] and
/// [9, 12] give [1.5, −1.5, −1.5, 1.5] (its literals). Dr. GRPO is the same
/// formula.
#[test]
fn reference_grpo_outcome_advantage_norm_std_false() {
    let rows: &Rows = &[
        ("0", 6.0, false),
        ("0", 3.0, false),
        ("1", 9.0, false),
        ("1", 12.0, false),
    ];
    let want = [1.5, -1.5, -1.5, 1.5];
    let grpo = AdvantageOptions {
        norm_by_std: false,
        ..options(Estimator::Grpo)
    };
    assert_advantages("grpo without std", rows, &[], grpo, &want);
    assert_advantages("drgrpo", rows, &[], options(Estimator::Drgrpo), &want);
}

/// `test_compute_rloo_outcome_advantage_basic`: groups [6, 3], [9, 12] and
/// [1] give [3, −3], [−3, 3] and [0] (its literals), under both hint
/// baselines (no row is hinted).
#[test]
fn reference_rloo_outcome_advantage_basic() {
    let rows: &Rows = &[
        ("0", 6.0, false),
        ("0", 3.0, false),
        ("1", 9.0, false),
        ("1", 12.0, false),
        ("2", 1.0, false),
    ];
    for hint_baseline in [HintBaseline::Reference, HintBaseline::Raw] {
        let o = AdvantageOptions {
            hint_baseline,
            ..options(Estimator::Rloo)
        };
        assert_advantages("rloo", rows, &[], o, &[3.0, -3.0, -3.0, 3.0, 0.0]);
    }
}

// ---- Computed cases (see the module docs for how). ----

/// A step with hinted rows: p0 raw [1, 0, 0] and a hinted 1; p1 raw [1,
/// 0.5] and a hinted 0; p2 only a hinted 1. Interleaved.
const HINTED: &Rows = &[
    ("p0", 1.0, false),
    ("p1", 1.0, false),
    ("p0", 0.0, false),
    ("p2", 1.0, true),
    ("p0", 0.0, false),
    ("p1", 0.5, false),
    ("p0", 1.0, true),
    ("p1", 0.0, true),
];

/// The reference's GRPO with `is_hinted`: raw-only baselines, p2 (no raw
/// row) mean 0 and std 1; the same under both hint baselines.
#[test]
fn grpo_with_hinted_rows_uses_the_reference_first_turn_baseline() {
    let want = [
        1.1546985383827155,
        0.7071047811922043,
        -0.5773492691913577,
        0.9999990000010001,
        -0.5773492691913577,
        -0.7071047811922043,
        1.1546985383827155,
        -2.1213143435766133,
    ];
    for hint_baseline in [HintBaseline::Reference, HintBaseline::Raw] {
        let o = AdvantageOptions {
            hint_baseline,
            ..options(Estimator::Grpo)
        };
        assert_advantages("grpo hinted", HINTED, &[], o, &want);
    }
}

/// `grpo_norm_by_std = False` with hinted rows: s − raw mean.
#[test]
fn grpo_with_hinted_rows_and_norm_by_std_off_only_centres() {
    let want = [
        0.6666666666666667,
        0.25,
        -0.3333333333333333,
        1.0,
        -0.3333333333333333,
        -0.25,
        0.6666666666666667,
        -0.75,
    ];
    let o = AdvantageOptions {
        norm_by_std: false,
        ..options(Estimator::Grpo)
    };
    assert_advantages("grpo hinted, no std", HINTED, &[], o, &want);
    assert_advantages("drgrpo hinted", HINTED, &[], options(Estimator::Drgrpo), &want);
}

/// GRPO with a custom epsilon (0.1): (s − mean) / (std + 0.1).
#[test]
fn grpo_with_a_custom_epsilon() {
    let want = [
        0.9842273591538676,
        0.5512030230288559,
        -0.4921136795769337,
        0.9090909090909091,
        -0.4921136795769337,
        -0.5512030230288559,
        0.9842273591538676,
        -1.653609069086568,
    ];
    let o = AdvantageOptions {
        epsilon: 0.1,
        ..options(Estimator::Grpo)
    };
    assert_advantages("grpo epsilon 0.1", HINTED, &[], o, &want);
}

/// The reference's RLOO ignores `is_hinted`: leave-one-out over all of a
/// group's rows (p2, one row, gets 0). `hint_baseline = "reference"`, the
/// default.
#[test]
fn rloo_with_hinted_rows_ignores_is_hinted_as_the_reference_does() {
    let want = [
        0.6666666666666666,
        0.75,
        -0.6666666666666666,
        0.0,
        -0.6666666666666666,
        0.0,
        0.6666666666666666,
        -0.75,
    ];
    assert_advantages("rloo hinted", HINTED, &[], options(Estimator::Rloo), &want);
}

/// The reference's REINFORCE++ ignores `is_hinted` too: whitening over all
/// the step's tokens (one a row here): mean 0.5625, var 0.2455357...
#[test]
fn reinforce_pp_with_hinted_rows_ignores_is_hinted_as_the_reference_does() {
    let want = [
        0.8829186954622128,
        0.8829186954622128,
        -1.1351811798799878,
        0.8829186954622128,
        -1.1351811798799878,
        -0.12613124220888755,
        0.8829186954622128,
        -1.1351811798799878,
    ];
    assert_advantages(
        "reinforce_pp hinted",
        HINTED,
        &[],
        options(Estimator::ReinforcePp),
        &want,
    );
}

/// REINFORCE++ with hinted rows and response lengths 2, 5, 1, 3, 8, 4, 6, 2.
#[test]
fn reinforce_pp_with_hinted_rows_and_response_lengths() {
    let want = [
        0.8975840029685481,
        0.8975840029685481,
        -1.2428086194949128,
        0.8975840029685481,
        -1.2428086194949128,
        -0.1726123082631824,
        0.8975840029685481,
        -1.2428086194949128,
    ];
    let lengths = [2, 5, 1, 3, 8, 4, 6, 2];
    assert_advantages(
        "reinforce_pp hinted, lengths",
        HINTED,
        &lengths,
        options(Estimator::ReinforcePp),
        &want,
    );
}

/// Mixed response lengths: scores 1, 0, 0.5, 0, 1 with 3, 1, 4, 7, 2 tokens.
/// Token-weighted mean 7/17 = 0.41176..., token std (Bessel over 17 tokens)
/// 0.44142...; the same scores as one token each would give ±0.99999998 and
/// 0, so the lengths matter.
const MIXED: &Rows = &[
    ("a", 1.0, false),
    ("b", 0.0, false),
    ("a", 0.5, false),
    ("c", 0.0, false),
    ("b", 1.0, false),
];
const MIXED_LENGTHS: [u32; 5] = [3, 1, 4, 7, 2];

#[test]
fn reinforce_pp_weighs_rows_by_response_length() {
    let want = [
        1.3325931751106956,
        -0.932815222577487,
        0.1998889762666044,
        -0.932815222577487,
        1.3325931751106956,
    ];
    assert_advantages(
        "reinforce_pp mixed lengths",
        MIXED,
        &MIXED_LENGTHS,
        options(Estimator::ReinforcePp),
        &want,
    );
    let one_token = [
        0.9999999800000006,
        -0.9999999800000006,
        0.0,
        -0.9999999800000006,
        0.9999999800000006,
    ];
    assert_advantages(
        "reinforce_pp one token each",
        MIXED,
        &[],
        options(Estimator::ReinforcePp),
        &one_token,
    );
}

/// A custom `whiten_epsilon` (0.25): rsqrt(var + 0.25). `epsilon` has no
/// effect on REINFORCE++.
#[test]
fn reinforce_pp_with_a_custom_whiten_epsilon() {
    let want = [
        0.8819477274048471,
        -0.6173634091833929,
        0.1322921591107271,
        -0.6173634091833929,
        0.8819477274048471,
    ];
    let o = AdvantageOptions {
        whiten_epsilon: 0.25,
        epsilon: 0.5,
        ..options(Estimator::ReinforcePp)
    };
    assert_advantages(
        "reinforce_pp whiten_epsilon 0.25",
        MIXED,
        &MIXED_LENGTHS,
        o,
        &want,
    );
}

/// Four-token responses: Bessel's correction over 24 tokens, not 6 rows
/// (the old `batch_whiten` was 3.2e-2 off here).
#[test]
fn reinforce_pp_with_four_token_responses_corrects_over_tokens() {
    let rows: &Rows = &[
        ("a", 1.0, false),
        ("a", 0.0, false),
        ("b", 0.0, false),
        ("b", 1.0, false),
        ("c", 1.0, false),
        ("c", 0.0, false),
    ];
    let hi = 0.9789449916094488;
    assert_advantages(
        "reinforce_pp four tokens",
        rows,
        &[4; 6],
        options(Estimator::ReinforcePp),
        &[hi, -hi, -hi, hi, hi, -hi],
    );
    let hi = 0.9128709139607618;
    assert_advantages(
        "reinforce_pp one token",
        rows,
        &[1; 6],
        options(Estimator::ReinforcePp),
        &[hi, -hi, -hi, hi, hi, -hi],
    );
}
