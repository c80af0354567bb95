//! The estimators and their options (config `[normalize]`, flags of
//! `advantages compute`): which formula, which baseline rows, which
//! epsilons. The formulas are in the module docs of `normalize`.

use serde::{Deserialize, Serialize};

use super::batch::Batch;

/// The reference's epsilon.
pub const DEFAULT_EPSILON: f64 = 1e-6;

/// The reference's `masked_whiten` epsilon: `rsqrt(var + 1e-8)`.
pub const DEFAULT_WHITEN_EPSILON: f64 = 1e-8;

/// |advantage| above this counts as extreme in the step metrics: it happens
/// when a hinted success meets a baseline whose samples all scored the same.
pub const EXTREME_ADVANTAGE: f64 = 1e3;

/// Which advantage estimator a step is computed with (config
/// `normalize.estimator`; names on the wire and in config are `grpo`,
/// `drgrpo`, `rloo` and `reinforce_pp`, with `batch_whiten` read as an
/// alias of `reinforce_pp`). The module docs give the formulas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Estimator {
    /// Group mean and std of the baseline rows; the reference's default.
    #[default]
    Grpo,
    /// GRPO's group mean without the std division (Dr. GRPO).
    Drgrpo,
    /// Leave-one-out group mean (RLOO); 0 for a group of one.
    Rloo,
    /// The reference's REINFORCE++ for outcome rewards (γ = 1): scores
    /// whitened over the step's tokens. `batch_whiten` is read as this.
    #[serde(alias = "batch_whiten")]
    #[value(alias = "batch_whiten")]
    ReinforcePp,
}

impl Estimator {
    /// Every estimator, in declaration order (for tests, benches and checks).
    pub const ALL: [Estimator; 4] = [
        Estimator::Grpo,
        Estimator::Drgrpo,
        Estimator::Rloo,
        Estimator::ReinforcePp,
    ];

    /// The config and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Estimator::Grpo => "grpo",
            Estimator::Drgrpo => "drgrpo",
            Estimator::Rloo => "rloo",
            Estimator::ReinforcePp => "reinforce_pp",
        }
    }

    /// Whether A is divided by a std (`std + epsilon`, or for reinforce_pp
    /// `sqrt(var + whiten_epsilon)`) under `options`.
    pub fn divides_by_std(self, options: &AdvantageOptions) -> bool {
        match self {
            Estimator::Grpo => options.norm_by_std,
            Estimator::ReinforcePp => true,
            Estimator::Drgrpo | Estimator::Rloo => false,
        }
    }
}

impl Estimator {
    /// Whether the step's baseline rows are its raw rows only when `batch`
    /// has a hinted row: always for grpo and drgrpo (the reference's rule),
    /// for rloo and reinforce_pp only under [`HintBaseline::Raw`].
    pub fn raw_baselines(self, batch: &Batch<'_>, options: &AdvantageOptions) -> bool {
        let rule = match self {
            Estimator::Grpo | Estimator::Drgrpo => true,
            Estimator::Rloo | Estimator::ReinforcePp => options.hint_baseline == HintBaseline::Raw,
        };
        rule && batch.first_turn_baseline()
    }
}

/// Where rloo's and reinforce_pp's baselines come from in a step with hinted
/// rows (config `normalize.hint_baseline`). grpo and drgrpo always use raw
/// rows only, as the reference does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum HintBaseline {
    /// The reference's: rloo and reinforce_pp ignore `is_hinted`.
    #[default]
    Reference,
    /// Ours: rloo and reinforce_pp take baselines from raw rows only.
    Raw,
}

impl HintBaseline {
    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            HintBaseline::Reference => "reference",
            HintBaseline::Raw => "raw",
        }
    }
}

impl std::fmt::Display for HintBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Estimator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdvantageOptions {
    /// Divide by the group std (+ epsilon); when off, A = s − mean. Read by
    /// [`Estimator::Grpo`] only: drgrpo and rloo never divide, reinforce_pp
    /// always does.
    pub norm_by_std: bool,
    /// Added to the std before dividing (grpo only).
    pub epsilon: f64,
    /// Opt-in floor for the std of baselines with two or more samples (for
    /// reinforce_pp: two or more tokens). Off (`None`) by default for parity
    /// with the reference, where a std-0 baseline gives a hinted success an
    /// advantage of about 1e6. Applies to every estimator's `group_std` (so
    /// to the division of grpo and reinforce_pp).
    pub std_floor: Option<f64>,
    /// The estimator; `grpo` when absent.
    #[serde(default)]
    pub estimator: Estimator,
    /// Where rloo's and reinforce_pp's baselines come from in a step with
    /// hinted rows; `reference` when absent.
    #[serde(default)]
    pub hint_baseline: HintBaseline,
    /// reinforce_pp's `rsqrt(var + whiten_epsilon)`; 1e-8 when absent.
    #[serde(default = "default_whiten_epsilon")]
    pub whiten_epsilon: f64,
}

fn default_whiten_epsilon() -> f64 {
    DEFAULT_WHITEN_EPSILON
}

impl Default for AdvantageOptions {
    fn default() -> Self {
        AdvantageOptions {
            norm_by_std: true,
            epsilon: DEFAULT_EPSILON,
            std_floor: None,
            estimator: Estimator::Grpo,
            hint_baseline: HintBaseline::Reference,
            whiten_epsilon: DEFAULT_WHITEN_EPSILON,
        }
    }
}
