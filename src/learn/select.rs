//! Choosing a failed group's arm: a pure function of the arms, their
//! posteriors and the group key.
//!
//! The draw is seeded from the group key alone ([`GroupStream`]): the same
//! group, given the same posteriors, gets the same arm on every worker, after
//! a redelivery and after a restart. Stage 1 makes the posteriors the same
//! everywhere by counting, for a group of step `s`, only outcomes of steps
//! `<= s - 2` (see [`super::state`]).
//!
//! What is guaranteed, per group: with probability `M = sum(min_share)` (the
//! first number of the group's stream decides) the group goes to forced
//! exploration, which gives arm `i` the probability `min_share_i`; otherwise
//! (probability `1 - M`) Thompson sampling draws each arm's Beta posterior
//! and takes the highest draw (ties to the first arm), or under
//! `arm_selection = "fixed"` the arms' weights decide. So every arm's
//! selection probability is at least its `min_share`, whatever the
//! posteriors. That is a floor on a probability, not on a count: the share an
//! arm realizes in one step of `n` groups is binomial around its probability
//! (for `n = 40` and `min_share = 0.05`, no group at all in about 13% of the
//! steps where the posteriors favour another arm fully).

use super::arms::{ArmSelection, Arms};
use super::sample::GroupStream;

/// The Beta posterior of one arm's rescue rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Posterior {
    pub alpha: f64,
    pub beta: f64,
}

impl Posterior {
    /// `alpha / (alpha + beta)`.
    pub fn mean(&self) -> f64 {
        self.alpha / (self.alpha + self.beta)
    }
}

/// Which way a group's arm was chosen (for metrics and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoiceKind {
    /// One arm only: nothing to choose.
    Only,
    /// Forced exploration (the `min_share` floors).
    Explore,
    /// Thompson sampling.
    Thompson,
    /// The fixed weights.
    Fixed,
}

/// The arm a group goes to, by index into `arms.specs()`, and how it was
/// chosen. `posteriors` holds one entry per arm, in the same order; a
/// missing entry reads as the arm's prior.
pub fn select_arm(arms: &Arms, posteriors: &[Posterior], group_key: &str) -> (usize, ChoiceKind) {
    let specs = arms.specs();
    if specs.len() <= 1 {
        return (0, ChoiceKind::Only);
    }
    let mut stream = GroupStream::new(group_key);
    let u = stream.uniform();
    let floors: f64 = specs.iter().map(|s| s.min_share).sum();
    if u < floors {
        let mut below = 0.0;
        for (i, spec) in specs.iter().enumerate() {
            below += spec.min_share;
            if u < below {
                return (i, ChoiceKind::Explore);
            }
        }
        // Rounding left u past the last sum: the last arm with a floor.
        let last = specs.iter().rposition(|s| s.min_share > 0.0).unwrap_or(0);
        return (last, ChoiceKind::Explore);
    }
    match arms.options().arm_selection {
        ArmSelection::Fixed => {
            let total: f64 = specs.iter().map(|s| s.weight).sum();
            let target = stream.uniform() * total;
            let mut below = 0.0;
            for (i, spec) in specs.iter().enumerate() {
                below += spec.weight;
                if target < below {
                    return (i, ChoiceKind::Fixed);
                }
            }
            let last = specs.iter().rposition(|s| s.weight > 0.0).unwrap_or(0);
            (last, ChoiceKind::Fixed)
        }
        ArmSelection::Thompson => {
            let mut best = (0, f64::NEG_INFINITY);
            for (i, spec) in specs.iter().enumerate() {
                let p = posteriors.get(i).copied().unwrap_or(Posterior {
                    alpha: spec.prior_alpha,
                    beta: spec.prior_beta,
                });
                let draw = stream.beta(p.alpha, p.beta);
                if draw > best.1 {
                    best = (i, draw);
                }
            }
            (best.0, ChoiceKind::Thompson)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::arms::{ArmSpec, LearnOptions};

    fn three_arms(selection: ArmSelection) -> Arms {
        let mut specs = vec![
            ArmSpec::llm("good", &["m1"]),
            ArmSpec::llm("bad", &["m2"]),
            ArmSpec::control("static"),
        ];
        specs[0].weight = 3.0;
        Arms::new(
            specs,
            LearnOptions {
                arm_selection: selection,
                ..LearnOptions::default()
            },
        )
        .unwrap()
    }

    fn shares(arms: &Arms, posteriors: &[Posterior], n: usize) -> Vec<f64> {
        let mut counts = vec![0usize; arms.specs().len()];
        for g in 0..n {
            counts[select_arm(arms, posteriors, &format!("run/7/task-{g}")).0] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    #[test]
    fn the_same_group_gets_the_same_arm_from_separately_built_arms() {
        let posteriors = [
            Posterior {
                alpha: 3.0,
                beta: 2.0,
            },
            Posterior {
                alpha: 2.0,
                beta: 2.0,
            },
            Posterior {
                alpha: 1.0,
                beta: 3.0,
            },
        ];
        for g in 0..200 {
            let key = format!("run/7/task-{g}");
            let a = select_arm(&three_arms(ArmSelection::Thompson), &posteriors, &key);
            let b = select_arm(&three_arms(ArmSelection::Thompson), &posteriors.clone(), &key);
            assert_eq!(a, b, "{key}");
        }
    }

    #[test]
    fn thompson_favours_the_arm_with_the_better_posterior() {
        let arms = three_arms(ArmSelection::Thompson);
        // 70 rescues in 100 against 10 in 100 and 5 in 100.
        let posteriors = [
            Posterior {
                alpha: 71.0,
                beta: 31.0,
            },
            Posterior {
                alpha: 11.0,
                beta: 91.0,
            },
            Posterior {
                alpha: 6.0,
                beta: 96.0,
            },
        ];
        let s = shares(&arms, &posteriors, 4000);
        // 0.05 forced + 0.85 Thompson, which all but always picks arm 0.
        assert!(s[0] > 0.87, "{s:?}");
        // Two close arms split the Thompson share.
        let close = [
            Posterior {
                alpha: 51.0,
                beta: 51.0,
            },
            Posterior {
                alpha: 51.0,
                beta: 51.0,
            },
            Posterior {
                alpha: 1.0,
                beta: 200.0,
            },
        ];
        let s = shares(&arms, &close, 4000);
        assert!((s[0] - s[1]).abs() < 0.05 && s[0] > 0.4, "{s:?}");
    }

    #[test]
    fn every_arm_keeps_its_min_share_floor_over_many_groups() {
        let mut specs = vec![
            ArmSpec::llm("good", &["m1"]),
            ArmSpec::llm("bad", &["m2"]),
            ArmSpec::control("static"),
        ];
        specs[1].min_share = 0.1;
        let arms = Arms::new(specs, LearnOptions::default()).unwrap();
        // Posteriors that all but rule the other arms out.
        let posteriors = [
            Posterior {
                alpha: 900.0,
                beta: 100.0,
            },
            Posterior {
                alpha: 1.0,
                beta: 999.0,
            },
            Posterior {
                alpha: 1.0,
                beta: 999.0,
            },
        ];
        let n = 20_000;
        let s = shares(&arms, &posteriors, n);
        for (share, floor) in [(s[1], 0.1), (s[2], 0.05)] {
            // Binomial around the floor: within 4 standard errors.
            let se = (floor * (1.0 - floor) / n as f64).sqrt();
            assert!(
                (share - floor).abs() < 4.0 * se,
                "share {share} vs floor {floor}: {s:?}"
            );
        }
        assert!((s[0] - 0.85).abs() < 0.02, "{s:?}");
    }

    #[test]
    fn fixed_selection_splits_by_weight_above_the_floors() {
        let arms = three_arms(ArmSelection::Fixed);
        // Weights 3:1:1 over the 0.85 left after 3 x 0.05 floors.
        let s = shares(&arms, &[], 20_000);
        let want = [0.05 + 0.85 * 0.6, 0.05 + 0.85 * 0.2, 0.05 + 0.85 * 0.2];
        for (got, want) in s.iter().zip(want) {
            assert!((got - want).abs() < 0.015, "{s:?} vs {want:?}");
        }
    }

    #[test]
    fn one_arm_needs_no_draw() {
        let arms = Arms::from_config(Vec::new(), LearnOptions::default(), &["m".into()]).unwrap();
        assert_eq!(select_arm(&arms, &[], "r/1/i"), (0, ChoiceKind::Only));
    }
}
