//! Every advantage estimator against an independent float64 implementation
//! written here, with plain loops over the rows and nothing from the
//! kernels: all four estimators × {no hint, hinted, single raw row, std 0,
//! one group of size 1, a group of size 1 among others} × both
//! `hint_baseline`s × `norm_by_std` on and off (and, for reinforce_pp,
//! response lengths), plus the worked examples of the book (docs/advantages.md) with their
//! numbers written out by hand. The reference trainer's own test cases are
//! in `reference_estimators.rs`.
//!
//! Each case runs every way in: the kernel with dense ids (`Device::Cpu`),
//! the compute path from string ids (`compute_step`), Arrow batches whose
//! `instance_id` is dictionary-encoded (distinct values, or one value per
//! row so that values repeat), plain `Utf8` or `LargeUtf8`
//! (`compute_batch`), and `Device::Cuda`, which is the CUDA kernel on a
//! machine with a GPU and a `--features cuda` build and the CPU fallback
//! everywhere else.

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int32Array, RecordBatch, StringArray,
};
use hintstream::advantages::{compute_batch, compute_step};
use hintstream::batch::ScoredRows;
use hintstream::normalize::{
    self, AdvantageOptions, Advantages, Batch, Device, Estimator, HintBaseline, Ran,
};

const EPS: f64 = 1e-6;
/// The reference's `masked_whiten` epsilon.
const WEPS: f64 = 1e-8;

/// One step's rows: (group id, score, hinted).
type Rows = [(&'static str, f64, bool)];

/// What a row should get: advantage, group_mean, group_std.
#[derive(Debug, Clone, Copy)]
struct Want {
    advantage: f64,
    mean: f64,
    std: f64,
}

/// Mean and unbiased std of `xs` by the textbook two-pass formula, with the
/// reference's rule for fewer than two values (mean 0, std 1).
fn mean_std(xs: &[f64]) -> (f64, f64) {
    if xs.len() < 2 {
        return (0.0, 1.0);
    }
    let n = xs.len() as f64;
    let mut total = 0.0;
    for x in xs {
        total += x;
    }
    let mean = total / n;
    let mut squares = 0.0;
    for x in xs {
        squares += (x - mean) * (x - mean);
    }
    (mean, (squares / (n - 1.0)).sqrt())
}

/// The reference semantics, row by row: for each row, gather the scores it
/// is measured against by scanning the whole step. grpo and drgrpo take
/// raw-only baselines in a step with a hinted row; rloo and reinforce_pp
/// only under `hint_baseline = raw` (the reference's ignore `is_hinted`).
/// `lengths` are the rows' response lengths (empty: all 1).
fn reference(rows: &Rows, lengths: &[u32], options: &AdvantageOptions) -> Vec<Want> {
    let (estimator, norm_by_std) = (options.estimator, options.norm_by_std);
    let raw_rule = match estimator {
        Estimator::Grpo | Estimator::Drgrpo => true,
        Estimator::Rloo | Estimator::ReinforcePp => options.hint_baseline == HintBaseline::Raw,
    };
    let any_hint = raw_rule && rows.iter().any(|r| r.2);
    let is_baseline = |j: usize| !any_hint || !rows[j].2;
    let length = |j: usize| lengths.get(j).copied().unwrap_or(1);
    let mut out = Vec::new();
    for (row, &(group, score, _)) in rows.iter().enumerate() {
        // Baseline scores of the row's group.
        let mut group_base = Vec::new();
        for (j, other) in rows.iter().enumerate() {
            if other.0 == group && is_baseline(j) {
                group_base.push(other.1);
            }
        }
        let (g_mean, g_std) = mean_std(&group_base);
        let want = match estimator {
            Estimator::Grpo if norm_by_std => Want {
                advantage: (score - g_mean) / (g_std + EPS),
                mean: g_mean,
                std: g_std,
            },
            Estimator::Grpo | Estimator::Drgrpo => Want {
                advantage: score - g_mean,
                mean: g_mean,
                std: g_std,
            },
            Estimator::Rloo => {
                let n = group_base.len();
                if n <= 1 {
                    Want {
                        advantage: 0.0,
                        mean: score,
                        std: g_std,
                    }
                } else if !is_baseline(row) {
                    // A hinted row (under `raw`) against the mean of all the
                    // group's raw rows.
                    let mean = group_base.iter().sum::<f64>() / n as f64;
                    Want {
                        advantage: score - mean,
                        mean,
                        std: g_std,
                    }
                } else {
                    // The reference's formula: (s − mean)·n/(n − 1).
                    let mean = group_base.iter().sum::<f64>() / n as f64;
                    let advantage = (score - mean) * n as f64 / (n as f64 - 1.0);
                    Want {
                        advantage,
                        mean: score - advantage,
                        std: g_std,
                    }
                }
            }
            Estimator::ReinforcePp => {
                // One value per baseline token: a row's score, as many
                // times as it has tokens.
                let mut step_tokens = Vec::new();
                for (j, other) in rows.iter().enumerate() {
                    if is_baseline(j) {
                        for _ in 0..length(j) {
                            step_tokens.push(other.1);
                        }
                    }
                }
                let (mean, std) = mean_std(&step_tokens);
                Want {
                    advantage: (score - mean) / (std * std + options.whiten_epsilon).sqrt(),
                    mean,
                    std,
                }
            }
        };
        out.push(want);
    }
    out
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-9 * want.abs().max(1.0)
}

fn check(label: &str, got: &Advantages, want: &[Want]) {
    assert_eq!(got.advantage.len(), want.len(), "{label}: row count");
    for (i, w) in want.iter().enumerate() {
        let (a, m, s) = (got.advantage[i], got.group_mean[i], got.group_std[i]);
        assert!(
            close(a, w.advantage) && close(m, w.mean) && close(s, w.std),
            "{label} row {i}: got (A {a}, mean {m}, std {s}), want {w:?}"
        );
    }
}

/// Dense ids in first-seen order, mapped here with a linear search (not the
/// crate's mapping).
fn dense(rows: &Rows) -> (Vec<u32>, usize) {
    let mut names: Vec<&str> = Vec::new();
    let mut ids = Vec::new();
    for r in rows {
        let id = match names.iter().position(|n| *n == r.0) {
            Some(p) => p,
            None => {
                names.push(r.0);
                names.len() - 1
            }
        };
        ids.push(id as u32);
    }
    (ids, names.len())
}

/// `instance_id` columns of `rows` in each encoding a producer may send.
fn instance_columns(rows: &Rows) -> Vec<(&'static str, ArrayRef)> {
    let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
    let distinct = scored(rows, &[])
        .to_batch()
        .unwrap()
        .column_by_name("instance_id")
        .unwrap()
        .clone();
    // One dictionary value per row: values repeat whenever a group has two
    // rows.
    let repeated = DictionaryArray::<Int32Type>::try_new(
        Int32Array::from_iter_values(0..rows.len() as i32),
        Arc::new(StringArray::from(names.clone())),
    )
    .unwrap();
    vec![
        ("dictionary", distinct),
        ("dictionary with repeated values", Arc::new(repeated) as ArrayRef),
        ("utf8", Arc::new(StringArray::from(names.clone())) as ArrayRef),
        (
            "large utf8",
            Arc::new(arrow_array::LargeStringArray::from(names)) as ArrayRef,
        ),
    ]
}

fn scored(rows: &Rows, lengths: &[u32]) -> ScoredRows {
    let mut s = ScoredRows {
        response_length: lengths.to_vec(),
        ..ScoredRows::default()
    };
    for (i, r) in rows.iter().enumerate() {
        s.run_id.push("run");
        s.step.push(1);
        s.instance_id.push(r.0);
        s.trajectory_id.push(&format!("t{i}"));
        s.reward.push(r.1);
        s.is_hinted.push(r.2);
        s.hint_category.push(r.2.then(|| "llm_synthesized".into()));
    }
    s
}

/// Runs `rows` (with response lengths `lengths`) through every path with
/// `options` and checks each against `want`.
fn run_all_paths(name: &str, rows: &Rows, lengths: &[u32], options: AdvantageOptions, want: &[Want]) {
    let (ids, n_groups) = dense(rows);
    let reward: Vec<f64> = rows.iter().map(|r| r.1).collect();
    let hinted: Vec<bool> = rows.iter().map(|r| r.2).collect();
    let batch = Batch {
        group: &ids,
        n_groups,
        reward: &reward,
        hinted: &hinted,
        response_length: lengths,
    };
    let label = format!(
        "{name} ({}, hint_baseline {}, norm_by_std {}, {} lengths)",
        options.estimator,
        options.hint_baseline,
        options.norm_by_std,
        lengths.len()
    );
    let (cpu, ran) = normalize::compute(&batch, &options, Device::Cpu).unwrap();
    assert_eq!(ran, Ran::Cpu);
    check(&format!("{label}, cpu kernel"), &cpu, want);

    let step = compute_step(scored(rows, lengths), &options, Device::Cpu).unwrap();
    check(&format!("{label}, from string ids"), &step.advantages, want);

    for (encoding, instance) in instance_columns(rows) {
        let mut columns = vec![
            ("instance_id", instance),
            ("reward", Arc::new(Float64Array::from(reward.clone())) as ArrayRef),
            (
                "is_hinted",
                Arc::new(BooleanArray::from(hinted.clone())) as ArrayRef,
            ),
        ];
        if !lengths.is_empty() {
            // Rows past the given lengths have 1.
            let all = (0..rows.len()).map(|i| lengths.get(i).copied().unwrap_or(1));
            columns.push((
                "response_length",
                Arc::new(arrow_array::UInt32Array::from_iter_values(all)) as ArrayRef,
            ));
        }
        let arrow = RecordBatch::try_from_iter(columns).unwrap();
        let (got, ran) = compute_batch(&arrow, &options, Device::Cpu).unwrap();
        assert_eq!(ran, Ran::Cpu);
        check(&format!("{label}, arrow {encoding}"), &got, want);
    }

    let (cuda, ran) = normalize::compute(&batch, &options, Device::Cuda).unwrap();
    assert!(matches!(ran, Ran::Cuda | Ran::CpuFallback), "{ran:?}");
    check(&format!("{label}, {}", ran.as_str()), &cuda, want);
}

/// Response lengths 1 to 7 for `n` rows, all but the last (which then has
/// 1), for reinforce_pp's weighted cases.
fn some_lengths(n: usize) -> Vec<u32> {
    (0..n.saturating_sub(1)).map(|i| (i * 5 % 7) as u32 + 1).collect()
}

fn run_case(name: &str, rows: &Rows, estimator: Estimator) {
    let lengths = some_lengths(rows.len());
    let length_sets: &[&[u32]] = if estimator == Estimator::ReinforcePp {
        &[&[], &lengths]
    } else {
        &[&[]]
    };
    for norm_by_std in [true, false] {
        for hint_baseline in [HintBaseline::Reference, HintBaseline::Raw] {
            for &lengths in length_sets {
                let options = AdvantageOptions {
                    estimator,
                    norm_by_std,
                    hint_baseline,
                    ..AdvantageOptions::default()
                };
                run_all_paths(name, rows, lengths, options, &reference(rows, lengths, &options));
            }
        }
    }
}

// The cases. Rows of different groups are interleaved on purpose.

/// No row hinted: every row is a baseline row.
const NO_HINT: &Rows = &[
    ("a", 1.0, false),
    ("b", 0.2, false),
    ("a", 0.0, false),
    ("c", 3.0, false),
    ("b", 0.7, false),
    ("a", 1.0, false),
    ("c", -1.0, false),
    ("a", 0.0, false),
    ("b", 0.1, false),
    ("a", 1.0, false),
];

/// Hinted rows in one group switch every group to raw-only baselines,
/// including a group with only hinted rows.
const HINTED: &Rows = &[
    ("a", 0.0, false),
    ("a", 1.0, true),
    ("b", 0.5, false),
    ("a", 1.0, false),
    ("c", 1.0, true),
    ("b", 0.25, false),
    ("a", 0.0, false),
    ("c", 0.0, true),
    ("a", 1.0, true),
    ("b", 1.0, false),
];

/// The whole step has one raw row: every group has at most one baseline
/// row under the raw rule, and reinforce_pp (raw, one token a row) has
/// fewer than two tokens.
const SINGLE_RAW_ROW: &Rows = &[
    ("a", 1.0, true),
    ("a", 0.5, false),
    ("b", 0.6, true),
    ("a", 0.0, true),
    ("b", 0.2, true),
];

/// Every raw row scores the same: std 0 per group and over the step, so a
/// hinted success gets about ±1e6 where the estimator divides.
const STD_ZERO: &Rows = &[
    ("a", 1.0, false),
    ("b", 1.0, false),
    ("a", 1.0, false),
    ("a", 0.0, true),
    ("b", 1.0, false),
    ("a", 1.0, false),
    ("b", 0.5, true),
];

/// The same without a hint: every advantage is 0 where the estimator
/// centres on a mean of equal scores.
const STD_ZERO_NO_HINT: &Rows = &[
    ("a", 2.0, false),
    ("b", 2.0, false),
    ("a", 2.0, false),
    ("b", 2.0, false),
];

/// A step that is one group of one row.
const ONE_GROUP_OF_SIZE_1: &Rows = &[("a", 0.7, false)];

/// A group of one row next to a larger group.
const GROUP_OF_SIZE_1_AMONG_OTHERS: &Rows = &[
    ("b", 0.1, false),
    ("a", 0.7, false),
    ("b", 0.9, false),
    ("b", 0.4, false),
];

macro_rules! cases {
    ($($test:ident: $rows:expr, $estimator:expr;)*) => {
        $(
            #[test]
            fn $test() {
                run_case(stringify!($test), $rows, $estimator);
            }
        )*
    };
}

cases! {
    grpo_no_hint: NO_HINT, Estimator::Grpo;
    grpo_hinted: HINTED, Estimator::Grpo;
    grpo_single_raw_row: SINGLE_RAW_ROW, Estimator::Grpo;
    grpo_std_zero: STD_ZERO, Estimator::Grpo;
    grpo_std_zero_no_hint: STD_ZERO_NO_HINT, Estimator::Grpo;
    grpo_one_group_of_size_1: ONE_GROUP_OF_SIZE_1, Estimator::Grpo;
    grpo_group_of_size_1_among_others: GROUP_OF_SIZE_1_AMONG_OTHERS, Estimator::Grpo;

    drgrpo_no_hint: NO_HINT, Estimator::Drgrpo;
    drgrpo_hinted: HINTED, Estimator::Drgrpo;
    drgrpo_single_raw_row: SINGLE_RAW_ROW, Estimator::Drgrpo;
    drgrpo_std_zero: STD_ZERO, Estimator::Drgrpo;
    drgrpo_std_zero_no_hint: STD_ZERO_NO_HINT, Estimator::Drgrpo;
    drgrpo_one_group_of_size_1: ONE_GROUP_OF_SIZE_1, Estimator::Drgrpo;
    drgrpo_group_of_size_1_among_others: GROUP_OF_SIZE_1_AMONG_OTHERS, Estimator::Drgrpo;

    rloo_no_hint: NO_HINT, Estimator::Rloo;
    rloo_hinted: HINTED, Estimator::Rloo;
    rloo_single_raw_row: SINGLE_RAW_ROW, Estimator::Rloo;
    rloo_std_zero: STD_ZERO, Estimator::Rloo;
    rloo_std_zero_no_hint: STD_ZERO_NO_HINT, Estimator::Rloo;
    rloo_one_group_of_size_1: ONE_GROUP_OF_SIZE_1, Estimator::Rloo;
    rloo_group_of_size_1_among_others: GROUP_OF_SIZE_1_AMONG_OTHERS, Estimator::Rloo;

    reinforce_pp_no_hint: NO_HINT, Estimator::ReinforcePp;
    reinforce_pp_hinted: HINTED, Estimator::ReinforcePp;
    reinforce_pp_single_raw_row: SINGLE_RAW_ROW, Estimator::ReinforcePp;
    reinforce_pp_std_zero: STD_ZERO, Estimator::ReinforcePp;
    reinforce_pp_std_zero_no_hint: STD_ZERO_NO_HINT, Estimator::ReinforcePp;
    reinforce_pp_one_group_of_size_1: ONE_GROUP_OF_SIZE_1, Estimator::ReinforcePp;
    reinforce_pp_group_of_size_1_among_others: GROUP_OF_SIZE_1_AMONG_OTHERS, Estimator::ReinforcePp;
}

/// Random steps (many groups, sizes 1 to 9, some hinted, some std 0)
/// against the reference, every estimator, with and without hints.
#[test]
fn every_estimator_matches_the_reference_on_random_steps() {
    use rand::{Rng, SeedableRng};
    const NAMES: [&str; 40] = [
        "g00", "g01", "g02", "g03", "g04", "g05", "g06", "g07", "g08", "g09", "g10", "g11", "g12", "g13",
        "g14", "g15", "g16", "g17", "g18", "g19", "g20", "g21", "g22", "g23", "g24", "g25", "g26", "g27",
        "g28", "g29", "g30", "g31", "g32", "g33", "g34", "g35", "g36", "g37", "g38", "g39",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    for round in 0..20 {
        let hint_rate = if round % 2 == 0 { 0.0 } else { 0.2 };
        let mut rows = Vec::new();
        for (g, name) in NAMES.iter().enumerate() {
            let size = rng.random_range(1..10);
            for _ in 0..size {
                // Every fifth group scores a constant on its raw rows.
                let hinted = rng.random_bool(hint_rate);
                let score = if g % 5 == 0 && !hinted {
                    1.0
                } else {
                    rng.random_range(-2.0..2.0)
                };
                rows.push((*name, score, hinted));
            }
        }
        // Interleave the groups.
        for i in (1..rows.len()).rev() {
            rows.swap(i, rng.random_range(0..=i));
        }
        for estimator in Estimator::ALL {
            run_case(&format!("random step {round}"), &rows, estimator);
        }
    }
}

/// The book's worked example (docs/advantages.md), numbers written out by hand: prompt q1 has
/// raw scores 0, 0, 1 and a hinted success; q2 has raw scores 1, 0.
const WORKED: &Rows = &[
    ("q1", 0.0, false),
    ("q1", 0.0, false),
    ("q1", 1.0, false),
    ("q1", 1.0, true),
    ("q2", 1.0, false),
    ("q2", 0.0, false),
];

fn worked(estimator: Estimator, advantage: [f64; 6], mean: [f64; 6], std: [f64; 6]) {
    worked_with(estimator, HintBaseline::Reference, advantage, mean, std)
}

fn worked_with(
    estimator: Estimator,
    hint_baseline: HintBaseline,
    advantage: [f64; 6],
    mean: [f64; 6],
    std: [f64; 6],
) {
    let want: Vec<Want> = (0..6)
        .map(|i| Want {
            advantage: advantage[i],
            mean: mean[i],
            std: std[i],
        })
        .collect();
    let options = AdvantageOptions {
        estimator,
        hint_baseline,
        ..AdvantageOptions::default()
    };
    run_all_paths("worked example", WORKED, &[], options, &want);
}

// q1's raw scores 0, 0, 1: mean 1/3, std sqrt(1/3); q2's 1, 0: mean 1/2,
// std sqrt(1/2). Over the step, raw scores 0, 0, 1, 1, 0: mean 0.4, std
// sqrt(0.3); all six scores 0, 0, 1, 1, 1, 0: mean 0.5, std sqrt(0.3) too.
// All four of q1's scores 0, 0, 1, 1: std sqrt(1/3) too.
const S1: f64 = 0.577_350_269_189_625_8; // sqrt(1/3)
const S2: f64 = std::f64::consts::FRAC_1_SQRT_2; // sqrt(1/2)
const SW: f64 = 0.547_722_557_505_166_1; // sqrt(0.3)

#[test]
fn worked_example_grpo() {
    let a1 = (0.0 - 1.0 / 3.0) / (S1 + EPS);
    let b1 = (1.0 - 1.0 / 3.0) / (S1 + EPS);
    let a2 = 0.5 / (S2 + EPS);
    // ≈ [-0.57735, -0.57735, 1.15470, 1.15470, 0.70711, -0.70711]
    worked(
        Estimator::Grpo,
        [a1, a1, b1, b1, a2, -a2],
        [1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.5, 0.5],
        [S1, S1, S1, S1, S2, S2],
    );
    assert!((a1 + 0.577_35).abs() < 1e-5 && (b1 - 1.154_70).abs() < 1e-5);
}

#[test]
fn worked_example_drgrpo() {
    let third = 1.0 / 3.0;
    worked(
        Estimator::Drgrpo,
        [-third, -third, 2.0 * third, 2.0 * third, 0.5, -0.5],
        [third, third, third, third, 0.5, 0.5],
        [S1, S1, S1, S1, S2, S2],
    );
}

#[test]
fn worked_example_rloo() {
    // The default, the reference's: the hinted row is a row like the
    // others. Every q1 row against the mean of q1's three other rows: r1
    // (0 − 2/3), r3 (1 − 1/3); the reference's (s − 0.5)·4/3 = ∓0.66667.
    let third = 1.0 / 3.0;
    worked(
        Estimator::Rloo,
        [-2.0 * third, -2.0 * third, 2.0 * third, 2.0 * third, 1.0, -1.0],
        [2.0 * third, 2.0 * third, third, third, 0.0, 1.0],
        [S1, S1, S1, S1, S2, S2],
    );
}

#[test]
fn worked_example_rloo_with_raw_hint_baseline() {
    // `hint_baseline = "raw"`: raw rows against the mean of the other raw
    // rows of their prompt; the hinted row against the mean of all of q1's
    // raw rows (1/3).
    worked_with(
        Estimator::Rloo,
        HintBaseline::Raw,
        [-0.5, -0.5, 1.0, 2.0 / 3.0, 1.0, -1.0],
        [0.5, 0.5, 0.0, 1.0 / 3.0, 0.0, 1.0],
        [S1, S1, S1, S1, S2, S2],
    );
}

#[test]
fn worked_example_reinforce_pp() {
    // The default: every row's one token, hinted or not: mean 0.5, var 0.3.
    let hi = 0.5 / (0.3f64 + WEPS).sqrt();
    // ≈ [-0.91287, -0.91287, 0.91287, 0.91287, 0.91287, -0.91287]
    worked(
        Estimator::ReinforcePp,
        [-hi, -hi, hi, hi, hi, -hi],
        [0.5; 6],
        [SW; 6],
    );
    assert!((hi - 0.912_87).abs() < 1e-5);
}

#[test]
fn worked_example_reinforce_pp_with_raw_hint_baseline() {
    // Raw rows only: mean 0.4, var 0.3.
    let lo = -0.4 / (0.3f64 + WEPS).sqrt();
    let hi = 0.6 / (0.3f64 + WEPS).sqrt();
    // ≈ [-0.73030, -0.73030, 1.09545, 1.09545, 1.09545, -0.73030]
    worked_with(
        Estimator::ReinforcePp,
        HintBaseline::Raw,
        [lo, lo, hi, hi, hi, lo],
        [0.4; 6],
        [SW; 6],
    );
    assert!((lo + 0.730_30).abs() < 1e-5 && (hi - 1.095_45).abs() < 1e-5);
}

/// The reference's own RLOO test (SkyRL test_ppo_utils.py): groups [6, 3],
/// [9, 12] and [1] give [3, −3], [−3, 3] and [0].
#[test]
fn rloo_matches_the_reference_trainers_test() {
    let rows: &Rows = &[
        ("x", 6.0, false),
        ("x", 3.0, false),
        ("y", 9.0, false),
        ("y", 12.0, false),
        ("z", 1.0, false),
    ];
    let (ids, n_groups) = dense(rows);
    let reward: Vec<f64> = rows.iter().map(|r| r.1).collect();
    let batch = Batch {
        group: &ids,
        n_groups,
        reward: &reward,
        hinted: &[false; 5],
        response_length: &[],
    };
    let options = AdvantageOptions {
        estimator: Estimator::Rloo,
        ..AdvantageOptions::default()
    };
    let (a, _) = normalize::compute(&batch, &options, Device::Cpu).unwrap();
    assert_eq!(a.advantage, vec![3.0, -3.0, -3.0, 3.0, 0.0]);
}

/// The std floor reaches the estimators that divide, and only the std
/// column of those that do not (raw-only baselines for all four, so that
/// every baseline has std 0).
#[test]
fn std_floor_applies_to_grpo_and_reinforce_pp_divisions() {
    let (ids, n_groups) = dense(STD_ZERO);
    let reward: Vec<f64> = STD_ZERO.iter().map(|r| r.1).collect();
    let hinted: Vec<bool> = STD_ZERO.iter().map(|r| r.2).collect();
    let batch = Batch {
        group: &ids,
        n_groups,
        reward: &reward,
        hinted: &hinted,
        response_length: &[],
    };
    for estimator in Estimator::ALL {
        let options = AdvantageOptions {
            estimator,
            std_floor: Some(0.1),
            hint_baseline: HintBaseline::Raw,
            ..AdvantageOptions::default()
        };
        let (a, _) = normalize::compute(&batch, &options, Device::Cpu).unwrap();
        // Row 3 is q "a"'s hinted failure (0.0) against raw scores all 1.0.
        let want = match estimator {
            Estimator::Grpo => -1.0 / (0.1 + EPS),
            Estimator::ReinforcePp => -1.0 / (0.01 + WEPS).sqrt(),
            Estimator::Drgrpo | Estimator::Rloo => -1.0,
        };
        assert!(close(a.advantage[3], want), "{estimator}: {}", a.advantage[3]);
        assert!(close(a.group_std[3], 0.1), "{estimator}: std {}", a.group_std[3]);
    }
}
