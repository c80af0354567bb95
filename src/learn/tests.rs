//! Scenarios of the learning core: the counting rules, the bounds,
//! refinement, and a simulated run in which the best arm takes over.

use rand::{Rng, SeedableRng};

use super::*;
use crate::messages::{group_key, Hint, HintCategory, HintOutcome, HintSource, Usage};

const RUN: &str = "run-1";

fn three_arms(options: LearnOptions) -> Arms {
    Arms::new(
        vec![
            ArmSpec::llm("strong", &["model-a"]),
            ArmSpec::llm("weak", &["model-b"]),
            ArmSpec::control("control"),
        ],
        options,
    )
    .unwrap()
}

fn hint(arms: &Arms, arm: usize, step: i64, instance: &str, category: HintCategory) -> Hint {
    let spec = &arms.specs()[arm];
    Hint {
        schema_version: 1,
        hint_id: arms.hint_id(arm, &group_key(RUN, step, instance)),
        run_id: RUN.into(),
        step,
        instance_id: instance.into(),
        trajectory_id: format!("t-{instance}-{step}"),
        hint: format!("hint of {instance} at step {step} by {}", spec.name),
        category,
        model: None,
        prompt_version: spec.prompt_version.clone(),
        latency_ms: 0,
        usage: Usage::default(),
        cost_usd: if spec.is_static { 0.0 } else { 0.01 },
        failure_reason: None,
        source: HintSource {
            topic: "rl.trajectories.failed".into(),
            partition: 0,
            offset: 0,
        },
        created_at: "2026-01-01T00:00:00Z".into(),
        arm: spec.name.clone(),
        refines: Vec::new(),
        hint_truncated: false,
        hedged: false,
        leak: false,
        level: None,
    }
}

fn llm_hint(arms: &Arms, arm: usize, step: i64, instance: &str) -> Hint {
    let category = if arms.specs()[arm].is_static {
        HintCategory::StaticFallback
    } else {
        HintCategory::LlmSynthesized
    };
    hint(arms, arm, step, instance, category)
}

fn outcome(hint: &Hint, hinted_rollouts: i64, successes: i64) -> HintOutcome {
    HintOutcome {
        schema_version: 1,
        hint_id: hint.hint_id.clone(),
        run_id: hint.run_id.clone(),
        step: hint.step,
        instance_id: hint.instance_id.clone(),
        hinted_rollouts,
        successes,
        rescued: successes > 0,
        mean_reward: successes as f64 / hinted_rollouts as f64,
        transfer: None,
        reliance: None,
        created_at: "2026-01-01T00:00:00Z".into(),
    }
}

fn report<'a>(r: &'a RunReport, name: &str) -> &'a ArmReport {
    r.arms.iter().find(|a| a.name == name).unwrap()
}

#[test]
fn the_same_records_in_any_order_give_the_same_posteriors_and_arms() {
    let arms = three_arms(LearnOptions {
        half_life_steps: Some(3.0),
        ..LearnOptions::default()
    });
    let mut hints = Vec::new();
    let mut outcomes = Vec::new();
    for step in 0..6 {
        for g in 0..12 {
            let h = llm_hint(&arms, g % 3, step, &format!("task-{g}"));
            outcomes.push(outcome(&h, 2, i64::from((g + step as usize).is_multiple_of(4))));
            hints.push(h);
        }
    }
    // One worker reads every hint, then every outcome; another reads the
    // outcomes first, backwards, and the hints backwards.
    let mut a = LearnState::new(arms.clone());
    hints.iter().for_each(|h| a.observe_hint(h));
    outcomes.iter().for_each(|o| a.observe_outcome(o));
    let mut b = LearnState::new(arms.clone());
    outcomes.iter().rev().for_each(|o| b.observe_outcome(o));
    hints.iter().rev().for_each(|h| b.observe_hint(h));
    for step in 0..9 {
        assert_eq!(a.posteriors(RUN, step), b.posteriors(RUN, step), "step {step}");
        for g in 0..40 {
            let instance = format!("new-{g}");
            assert_eq!(a.choose(RUN, step, &instance), b.choose(RUN, step, &instance));
        }
    }
    assert_eq!(a.run_report(RUN), b.run_report(RUN));
}

#[test]
fn a_group_of_step_s_counts_only_outcomes_of_steps_up_to_s_minus_2() {
    let arms = three_arms(LearnOptions::default());
    let mut state = LearnState::new(arms.clone());
    let h = llm_hint(&arms, 0, 5, "task");
    state.observe_hint(&h);
    state.observe_outcome(&outcome(&h, 2, 1));
    let prior = Posterior {
        alpha: 1.0,
        beta: 1.0,
    };
    assert_eq!(state.posteriors(RUN, 5)[0], prior);
    assert_eq!(
        state.posteriors(RUN, 6)[0],
        prior,
        "step 6 must not see step 5 yet"
    );
    assert_eq!(
        state.posteriors(RUN, 7)[0],
        Posterior {
            alpha: 2.0,
            beta: 1.0
        }
    );
    // Another run starts from the priors.
    assert_eq!(state.posteriors("run-2", 7)[0], prior);
    // Metrics see it at once.
    assert_eq!(state.current_posteriors(RUN)[0].alpha, 2.0);
}

#[test]
fn old_outcomes_fade_with_the_half_life() {
    let arms = three_arms(LearnOptions {
        half_life_steps: Some(2.0),
        ..LearnOptions::default()
    });
    let mut state = LearnState::new(arms.clone());
    for g in 0..4 {
        let h = llm_hint(&arms, 1, 0, &format!("task-{g}"));
        state.observe_hint(&h);
        state.observe_outcome(&outcome(&h, 1, i64::from(g == 0)));
    }
    // Four steps on (two half-lives): a weight of 1/4 on 1 rescue, 3 failures.
    let p = state.posteriors(RUN, 4)[1];
    assert!(
        (p.alpha - 1.25).abs() < 1e-12 && (p.beta - 1.75).abs() < 1e-12,
        "{p:?}"
    );
    let p = state.posteriors(RUN, 2)[1];
    assert!(
        (p.alpha - 1.5).abs() < 1e-12 && (p.beta - 2.5).abs() < 1e-12,
        "{p:?}"
    );
}

#[test]
fn the_latest_outcome_of_a_hint_wins_and_counts_once() {
    let arms = three_arms(LearnOptions::default());
    let h = llm_hint(&arms, 0, 1, "task");
    // Joined: a rescue, then the step redone without one.
    let mut joined = LearnState::new(arms.clone());
    joined.observe_hint(&h);
    joined.observe_outcome(&outcome(&h, 2, 1));
    joined.observe_outcome(&outcome(&h, 2, 0));
    // Pending: both outcomes before the hint.
    let mut pending = LearnState::new(arms.clone());
    pending.observe_outcome(&outcome(&h, 2, 1));
    pending.observe_outcome(&outcome(&h, 2, 0));
    pending.observe_hint(&h);
    // The hint record itself delivered twice.
    joined.observe_hint(&h);
    for state in [&joined, &pending] {
        let r = state.run_report(RUN);
        let strong = report(&r, "strong");
        assert_eq!((strong.pulls, strong.trials, strong.rescues), (1, 1, 0));
        assert_eq!(
            state.posteriors(RUN, 3)[0],
            Posterior {
                alpha: 1.0,
                beta: 2.0
            }
        );
        assert_eq!(state.stats().outcomes_replaced, 1);
    }
    assert!((report(&joined.run_report(RUN), "strong").spend_usd - 0.01).abs() < 1e-12);
}

#[test]
fn a_static_fallback_on_an_llm_arms_turn_counts_for_the_control() {
    let arms = three_arms(LearnOptions::default());
    let mut state = LearnState::new(arms.clone());
    let fell_back = hint(&arms, 0, 1, "task-a", HintCategory::LlmFailedStaticFallback);
    let budget = hint(&arms, 1, 1, "task-b", HintCategory::StaticFallback);
    for h in [&fell_back, &budget] {
        state.observe_hint(h);
        state.observe_outcome(&outcome(h, 2, 1));
    }
    let r = state.run_report(RUN);
    let (strong, weak, control) = (report(&r, "strong"), report(&r, "weak"), report(&r, "control"));
    // Pulls and spend stay with the arms that tried ...
    assert_eq!((strong.pulls, weak.pulls, control.pulls), (1, 1, 0));
    assert!(strong.spend_usd > 0.0);
    // ... the rescues count for the control.
    assert_eq!(
        (strong.trials, weak.trials, control.trials, control.rescues),
        (0, 0, 2, 2)
    );
    assert_eq!(
        state.posteriors(RUN, 3)[2],
        Posterior {
            alpha: 3.0,
            beta: 1.0
        }
    );
    assert_eq!(strong.rescue_rate, None);
    assert_eq!(strong.cost_per_rescue_usd, None);

    // Without a control they count for nobody.
    let two = Arms::new(
        vec![ArmSpec::llm("strong", &["a"]), ArmSpec::llm("weak", &["b"])],
        LearnOptions::default(),
    )
    .unwrap();
    let mut state = LearnState::new(two.clone());
    let h = hint(&two, 0, 1, "task-a", HintCategory::LlmFailedStaticFallback);
    state.observe_hint(&h);
    state.observe_outcome(&outcome(&h, 2, 1));
    let r = state.run_report(RUN);
    assert_eq!((report(&r, "strong").pulls, report(&r, "strong").trials), (1, 0));
    assert_eq!(report(&r, "weak").trials, 0);
    assert_eq!(
        state.posteriors(RUN, 3),
        vec![
            Posterior {
                alpha: 1.0,
                beta: 1.0
            };
            2
        ]
    );
}

#[test]
fn an_outcome_before_its_hint_waits_and_joins_when_the_hint_arrives() {
    let arms = three_arms(LearnOptions::default());
    let limits = StateLimits {
        max_pending_outcomes: 3,
        ..StateLimits::default()
    };
    let mut state = LearnState::with_limits(arms.clone(), limits);
    let hints: Vec<Hint> = (0..5)
        .map(|g| llm_hint(&arms, 0, 1, &format!("task-{g}")))
        .collect();
    for h in &hints {
        state.observe_outcome(&outcome(h, 1, 1));
    }
    // Five waiting, three kept: the two oldest dropped.
    assert_eq!((state.stats().pending, state.stats().pending_dropped), (3, 2));
    assert_eq!(state.run_report(RUN).arms[0].trials, 0);
    for h in &hints {
        state.observe_hint(h);
    }
    let strong = state.run_report(RUN).arms[0].clone();
    assert_eq!((strong.pulls, strong.trials, strong.rescues), (5, 3, 3));
    assert_eq!(state.stats().pending, 0);
}

#[test]
fn forgotten_tasks_leave_refinement_but_keep_their_counts() {
    let arms = three_arms(LearnOptions::default());
    let limits = StateLimits {
        max_tasks: 3,
        max_hints_tracked: 4,
        ..StateLimits::default()
    };
    let mut state = LearnState::with_limits(arms.clone(), limits);
    let long_text = "é".repeat(2 * MAX_REMEMBERED);
    for g in 0..10 {
        let mut h = llm_hint(&arms, 0, 1, &format!("task-{g}"));
        h.hint = long_text.clone();
        state.observe_hint(&h);
        state.observe_outcome(&outcome(&h, 2, 0));
    }
    assert_eq!(state.stats().tasks_forgotten, 7);
    assert_eq!(state.stats().hints_untracked, 6);
    assert!(state.earlier_unhelpful(RUN, "task-0", 5, 2).is_empty());
    let kept = state.earlier_unhelpful(RUN, "task-9", 5, 2);
    assert_eq!(kept.len(), 1);
    // Cut at a char boundary under the bound.
    assert!(kept[0].text.len() <= MAX_REMEMBERED + '…'.len_utf8() && kept[0].text.ends_with('…'));
    let strong = state.run_report(RUN).arms[0].clone();
    assert_eq!((strong.pulls, strong.trials), (10, 10));
    assert!(
        state.approx_bytes() <= limits.worst_case_bytes(32),
        "{}",
        state.approx_bytes()
    );
    // The defaults' bound as the module docs state it.
    assert_eq!(StateLimits::default().worst_case_bytes(40), 242_050_000);
}

const MAX_REMEMBERED: usize = limits::MAX_REMEMBERED_HINT_BYTES;

#[test]
fn refinement_shows_the_newest_unhelpful_hints_with_their_outcomes() {
    let arms = three_arms(LearnOptions::default());
    let mut state = LearnState::new(arms.clone());
    // Step 1 did not help, step 3 rescued, step 5 did not help, step 6 has
    // no outcome yet; another task's hint is not this task's.
    for (step, successes) in [(1, Some(0)), (3, Some(1)), (5, Some(0)), (6, None)] {
        let h = llm_hint(&arms, 0, step, "task");
        state.observe_hint(&h);
        if let Some(s) = successes {
            state.observe_outcome(&outcome(&h, 2, s));
        }
    }
    let other = llm_hint(&arms, 1, 2, "other");
    state.observe_hint(&other);
    state.observe_outcome(&outcome(&other, 1, 0));

    let steps = |v: Vec<EarlierHint>| v.iter().map(|h| h.step).collect::<Vec<_>>();
    assert_eq!(steps(state.earlier_unhelpful(RUN, "task", 7, 2)), vec![5, 1]);
    assert_eq!(steps(state.earlier_unhelpful(RUN, "task", 7, 1)), vec![5]);
    assert_eq!(steps(state.earlier_unhelpful(RUN, "task", 5, 2)), vec![1]);
    assert!(state.earlier_unhelpful(RUN, "task", 1, 2).is_empty());
    assert!(state.earlier_unhelpful("run-2", "task", 7, 2).is_empty());

    let r = state.refinement(RUN, 7, "task").unwrap();
    let step5 = llm_hint(&arms, 0, 5, "task");
    let step1 = llm_hint(&arms, 0, 1, "task");
    assert_eq!(r.refines, vec![step5.hint_id.clone(), step1.hint_id.clone()]);
    assert_eq!(steps(r.earlier.clone()), vec![5, 1]);
    assert_eq!(
        (
            r.earlier[0].text.as_str(),
            r.earlier[0].hinted_rollouts,
            r.earlier[0].successes
        ),
        (step5.hint.as_str(), 2, 0)
    );
    assert_eq!(refined_prompt_version("v3"), "v3+refine");
    assert_eq!(state.refinement(RUN, 2, "other"), None);

    // The task keeps 3 hints: the rescuing one went first; with none
    // rescuing left, the oldest goes.
    state.observe_hint(&llm_hint(&arms, 0, 8, "task"));
    assert_eq!(steps(state.earlier_unhelpful(RUN, "task", 9, 3)), vec![5]);
}

#[test]
fn refined_and_fresh_hints_are_counted_apart_and_undefined_rates_are_absent() {
    let arms = three_arms(LearnOptions::default());
    let mut state = LearnState::new(arms.clone());
    let fresh = llm_hint(&arms, 0, 4, "task-a");
    let mut refined = llm_hint(&arms, 0, 4, "task-b");
    refined.refines = vec!["earlier".into()];
    state.observe_hint(&fresh);
    state.observe_hint(&refined);
    state.observe_outcome(&outcome(&fresh, 2, 0));
    state.observe_outcome(&outcome(&refined, 2, 2));
    let m = state.step_metrics(RUN, 4);
    assert_eq!(m["hint/refined_rescue_rate"], 1.0);
    assert_eq!(m["hint/fresh_rescue_rate"], 0.0);
    assert_eq!(m["hint/arm/strong/rescue_rate"], 0.5);
    assert_eq!(m["hint/arm/strong/count"], 2.0);
    assert!((m["hint/cost_per_rescue_usd"] - 0.02).abs() < 1e-12);
    assert_eq!(m["hint/arm/weak/count"], 0.0);
    assert!(!m.contains_key("hint/arm/weak/rescue_rate"));
    // A step without outcomes: every rate absent.
    let empty = state.step_metrics(RUN, 5);
    assert!(empty.keys().all(|k| k.ends_with("/count")), "{empty:?}");
}

#[test]
fn an_arms_leak_rate_is_the_share_of_its_hints_of_the_step_flagged_leak() {
    let arms = three_arms(LearnOptions::default());
    let mut state = LearnState::new(arms.clone());
    let mut leaky = llm_hint(&arms, 0, 4, "task-a");
    leaky.leak = true;
    state.observe_hint(&leaky);
    state.observe_hint(&llm_hint(&arms, 0, 4, "task-b"));
    state.observe_hint(&llm_hint(&arms, 1, 4, "task-c"));
    // Read twice (a redelivered hint): counted once.
    state.observe_hint(&leaky);
    let m = state.step_metrics(RUN, 4);
    assert_eq!(m["hint/arm/strong/leak_rate"], 0.5);
    assert_eq!(m["hint/arm/weak/leak_rate"], 0.0);
    assert!(
        !m.contains_key("hint/arm/control/leak_rate"),
        "it wrote no hint: {m:?}"
    );
    assert_eq!(state.run_report(RUN).arms[0].leaks, 1);
}

/// Two LLM arms with hidden rescue rates 0.7 and 0.1 and the static
/// control at 0.05; 40 failed groups a step for 15 steps; each step's
/// outcomes are read back after the step (so the two-step rule applies).
/// Run with `--nocapture` for the per-step table.
#[test]
fn simulated_run_the_best_arm_takes_over_and_every_arm_keeps_its_floor() {
    let arms = three_arms(LearnOptions::default());
    let rates = [0.7, 0.1, 0.05];
    let (steps, groups) = (15, 40);
    let mut state = LearnState::new(arms.clone());
    let mut world = rand_chacha::ChaCha8Rng::seed_from_u64(23);
    let mut records: Vec<(Hint, HintOutcome)> = Vec::new();
    let mut pulls: Vec<[usize; 3]> = Vec::new();
    println!("step | strong | weak | control | rescued | posterior means (strong, weak, control)");
    for step in 0..steps {
        let mut outcomes = Vec::new();
        let mut step_pulls = [0usize; 3];
        for g in 0..groups {
            let instance = format!("task-{step}-{g}");
            let choice = state.choose(RUN, step as i64, &instance);
            let h = llm_hint(&arms, choice.index, step as i64, &instance);
            assert_eq!(h.hint_id, choice.hint_id);
            state.observe_hint(&h);
            step_pulls[choice.index] += 1;
            let rescued = world.random::<f64>() < rates[choice.index];
            let o = outcome(&h, 1, i64::from(rescued));
            outcomes.push(o.clone());
            records.push((h, o));
        }
        let rescued = outcomes.iter().filter(|o| o.rescued).count();
        outcomes.iter().for_each(|o| state.observe_outcome(o));
        let means: Vec<String> = state
            .posteriors(RUN, step as i64)
            .iter()
            .map(|p| format!("{:.3}", p.mean()))
            .collect();
        let share = |i: usize| step_pulls[i] as f64 / groups as f64;
        println!(
            "{step:>4} | {:>6.3} | {:>4.3} | {:>7.3} | {rescued:>7} | {}",
            share(0),
            share(1),
            share(2),
            means.join(", ")
        );
        pulls.push(step_pulls);
    }
    // From step 10 on, the 0.7 arm gets >= 80% of the pulls.
    let late: usize = pulls[10..].iter().map(|p| p[0]).sum();
    let late_share = late as f64 / (groups * (steps - 10)) as f64;
    println!("steps 10-14: strong arm share {late_share:.3}");
    assert!(late_share >= 0.8, "strong arm share from step 10: {late_share}");
    for (step, p) in pulls.iter().enumerate().skip(10) {
        assert!(p[0] as f64 / groups as f64 >= 0.75, "step {step}: {p:?}");
    }
    // Every arm keeps its floor: overall share near or above 5%.
    for arm in 0..3 {
        let total: usize = pulls.iter().map(|p| p[arm]).sum();
        let share = total as f64 / (groups * steps) as f64;
        println!("overall share of {}: {share:.3}", arms.specs()[arm].name);
        // 5% of 600 groups is 30, one binomial standard error about 5.3.
        assert!(
            share >= 0.05 - 3.0 * (0.05f64 * 0.95 / 600.0).sqrt(),
            "arm {arm}: {share}"
        );
    }

    // A restarted worker reading the same records back, outcomes first,
    // reports the same posteriors.
    let mut restarted = LearnState::new(arms.clone());
    records
        .iter()
        .rev()
        .for_each(|(_, o)| restarted.observe_outcome(o));
    records.iter().for_each(|(h, _)| restarted.observe_hint(h));
    for (a, b) in state
        .current_posteriors(RUN)
        .iter()
        .zip(restarted.current_posteriors(RUN))
    {
        assert!((a.mean() - b.mean()).abs() < 1e-9, "{a:?} vs {b:?}");
    }
    assert_eq!(state.run_report(RUN), restarted.run_report(RUN));
}

/// A run of `run_id`'s: `hint` with its run set, and an outcome of it.
fn of_run(arms: &Arms, run_id: &str, arm: usize, step: i64, instance: &str) -> Hint {
    let mut h = llm_hint(arms, arm, step, instance);
    h.run_id = run_id.into();
    h.hint_id = arms.hint_id(arm, &group_key(run_id, step, instance));
    h
}

#[test]
fn outcomes_of_sixteen_other_runs_leave_the_live_runs_choices_as_they_were() {
    let arms = three_arms(LearnOptions::default());
    let mut state = LearnState::new(arms.clone());
    // 16 older runs wrote hints first (their tallies fill the runs kept).
    let old: Vec<Hint> = (0..16)
        .map(|r| of_run(&arms, &format!("old-{r}"), 1, 1, "task"))
        .collect();
    for h in &old {
        state.observe_hint(h);
    }
    // The live run: the strong arm rescues, the weak one does not.
    state.hinting(RUN);
    for step in 0..6 {
        for i in 0..8 {
            let strong = llm_hint(&arms, 0, step, &format!("s{i}"));
            let weak = llm_hint(&arms, 1, step, &format!("w{i}"));
            state.observe_hint(&strong);
            state.observe_hint(&weak);
            state.observe_outcome(&outcome(&strong, 4, 3));
            state.observe_outcome(&outcome(&weak, 4, 0));
        }
    }
    let choices = |state: &LearnState| -> Vec<usize> {
        (0..64)
            .map(|i| state.choose(RUN, 8, &format!("g{i}")).index)
            .collect()
    };
    let before = (state.posteriors(RUN, 8), choices(&state));
    // Outcomes of every old run's hint, then more hints of old runs.
    for h in &old {
        state.observe_outcome(&outcome(h, 4, 4));
    }
    for r in 16..40 {
        state.observe_hint(&of_run(&arms, &format!("old-{r}"), 1, 1, "task"));
    }
    for h in &old {
        state.observe_outcome(&outcome(h, 4, 0));
    }
    assert_eq!(
        (state.posteriors(RUN, 8), choices(&state)),
        before,
        "the live run kept its arms"
    );
    assert!(
        state.stats().outcomes_untracked > 0,
        "outcomes of dropped runs are counted and ignored"
    );
}

#[test]
fn posteriors_never_fall_below_their_priors() {
    let arms = three_arms(LearnOptions::default());
    let limits = StateLimits {
        max_runs: 1,
        ..StateLimits::default()
    };
    let mut state = LearnState::with_limits(arms.clone(), limits);
    let h = llm_hint(&arms, 0, 1, "t");
    state.observe_hint(&h);
    state.observe_outcome(&outcome(&h, 4, 4));
    // Another run pushes the tally out; the hint's run comes back with a
    // fresh tally, then the hint's record again takes back what it had.
    state.observe_hint(&of_run(&arms, "other", 0, 1, "t"));
    state.observe_hint(&llm_hint(&arms, 1, 2, "u"));
    state.observe_hint(&h);
    state.observe_outcome(&outcome(&h, 4, 0));
    for (p, spec) in state.posteriors(RUN, 10).iter().zip(arms.specs()) {
        assert!(p.alpha >= spec.prior_alpha && p.beta >= spec.prior_beta, "{p:?}");
    }
}

#[test]
fn twelve_thousand_outcomes_before_their_hints_give_the_posteriors_of_the_other_order() {
    let arms = three_arms(LearnOptions::default());
    let hints: Vec<Hint> = (0..12_000)
        .map(|i| llm_hint(&arms, i % 3, (i / 300) as i64, &format!("t{i}")))
        .collect();
    let outcomes: Vec<HintOutcome> = hints
        .iter()
        .enumerate()
        .map(|(i, h)| outcome(h, 4, (i % 5) as i64))
        .collect();
    let mut hints_first = LearnState::new(arms.clone());
    for h in &hints {
        hints_first.observe_hint(h);
    }
    for o in &outcomes {
        hints_first.observe_outcome(o);
    }
    let mut outcomes_first = LearnState::new(arms.clone());
    for o in &outcomes {
        outcomes_first.observe_outcome(o);
    }
    for h in &hints {
        outcomes_first.observe_hint(h);
    }
    assert_eq!(outcomes_first.stats().pending_dropped, 0, "nothing dropped");
    assert_eq!(outcomes_first.stats().pending, 0, "every outcome joined");
    assert_eq!(
        outcomes_first.posteriors(RUN, 100),
        hints_first.posteriors(RUN, 100)
    );
}

#[test]
fn the_gamma_sampler_takes_any_shape_without_recursion() {
    let mut s = super::sample::GroupStream::new("shapes");
    for shape in [1e-300, 0.0, -5.0, f64::NAN, 0.3, 1.0, 7.5] {
        let x = s.gamma(shape);
        assert!(x.is_finite() && x >= 0.0, "Gamma({shape}) drew {x}");
    }
}

/// An outcome of `hint` with `transfer` and `reliance` as given.
fn outcome_with(hint: &Hint, successes: i64, transfer: Option<f64>, reliance: Option<f64>) -> HintOutcome {
    HintOutcome {
        transfer,
        reliance,
        ..outcome(hint, 2, successes)
    }
}

#[test]
fn under_transfer_an_outcome_is_a_fractional_trial_and_one_without_transfer_counts_as_rescue() {
    let options = |arm_reward| LearnOptions {
        arm_reward,
        ..LearnOptions::default()
    };
    let feed = |arm_reward| {
        let arms = three_arms(options(arm_reward));
        let mut state = LearnState::new(arms.clone());
        let (a, b, c) = (
            llm_hint(&arms, 0, 1, "a"),
            llm_hint(&arms, 0, 1, "b"),
            llm_hint(&arms, 0, 1, "c"),
        );
        for h in [&a, &b, &c] {
            state.observe_hint(h);
        }
        // Rescued, transfer 0.3; failed, transfer 0; rescued, no transfer.
        state.observe_outcome(&outcome_with(&a, 1, Some(0.3), Some(2.0)));
        state.observe_outcome(&outcome_with(&b, 0, Some(0.0), None));
        state.observe_outcome(&outcome_with(&c, 2, None, None));
        state
    };
    let transfer = feed(ArmReward::Transfer);
    let p = transfer.posteriors(RUN, 3)[0];
    // α = 1 + 0.3 + 0 + 1 (the rescue without transfer), β = 1 + 0.7 + 1 + 0.
    assert!(
        (p.alpha - 2.3).abs() < 1e-9 && (p.beta - 2.7).abs() < 1e-9,
        "{p:?}"
    );
    assert_eq!(transfer.stats().outcomes_without_transfer, 1);
    let rescue = feed(ArmReward::Rescue);
    let p = rescue.posteriors(RUN, 3)[0];
    assert_eq!((p.alpha, p.beta), (3.0, 2.0));
    assert_eq!(rescue.stats().outcomes_without_transfer, 0);
    // The report is the same under both: transfer over the two that carried
    // one, reliance over the one.
    for state in [&transfer, &rescue] {
        let r = state.run_report(RUN);
        let strong = report(&r, "strong");
        assert_eq!(strong.transfer.n, 2);
        assert!((strong.transfer.mean().unwrap() - 0.15).abs() < 1e-12);
        assert!((strong.transfer.std().unwrap() - (0.045f64).sqrt()).abs() < 1e-9);
        assert_eq!((strong.reliance.n, strong.reliance.mean()), (1, Some(2.0)));
        assert_eq!(strong.reliance.std(), None, "one value: no spread");
        assert_eq!(report(&r, "weak").transfer.mean(), None, "absent, never 0");
    }
}

#[test]
fn a_later_outcome_of_one_hint_replaces_its_transfer() {
    let arms = three_arms(LearnOptions {
        arm_reward: ArmReward::Transfer,
        ..LearnOptions::default()
    });
    let mut state = LearnState::new(arms.clone());
    let h = llm_hint(&arms, 1, 1, "a");
    state.observe_hint(&h);
    state.observe_outcome(&outcome_with(&h, 1, Some(0.9), None));
    state.observe_outcome(&outcome_with(&h, 1, Some(0.25), None));
    let p = state.posteriors(RUN, 3)[1];
    assert!(
        (p.alpha - 1.25).abs() < 1e-9 && (p.beta - 1.75).abs() < 1e-9,
        "{p:?}"
    );
    let r = state.run_report(RUN);
    assert_eq!(report(&r, "weak").transfer_rate, Some(0.25));
}

#[test]
fn a_hostile_reliance_is_clamped_and_cannot_overflow_the_tally() {
    let arms = three_arms(LearnOptions::default());
    let mut state = LearnState::new(arms.clone());
    for i in 0..50 {
        let h = llm_hint(&arms, 0, 1, &format!("t{i}"));
        state.observe_hint(&h);
        state.observe_outcome(&outcome_with(&h, 1, Some(1.0), Some(1e300)));
    }
    let r = state.run_report(RUN);
    assert_eq!(report(&r, "strong").reliance.mean(), Some(state::MAX_RELIANCE));
}
