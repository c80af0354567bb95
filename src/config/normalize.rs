//! The `[normalize]` section: how the advantage kernels compute (stage 2 and
//! `advantages compute`), and the flags of `advantages compute` over it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::error::{invalid, non_negative, ConfigError};
use crate::normalize::{
    AdvantageOptions, Device, Estimator, HintBaseline, HintedWeight, DEFAULT_EPSILON, DEFAULT_WHITEN_EPSILON,
};

/// How the advantage kernels compute (stage 2 and `advantages compute`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NormalizeConfig {
    /// The advantage estimator: `grpo` (the reference's default), `drgrpo`
    /// (mean baseline, no std division), `rloo` (leave-one-out baseline) or
    /// `reinforce_pp` (the reference's REINFORCE++: whitening over the
    /// step's tokens; `batch_whiten` is read as an alias of it). With hinted
    /// rows in a step, grpo's and drgrpo's baselines come from raw rows only;
    /// rloo's and reinforce_pp's as `hint_baseline` says.
    pub estimator: Estimator,
    /// `reference` (default: rloo and reinforce_pp ignore `is_hinted`, as
    /// the reference does) or `raw` (their baselines come from raw rows
    /// only when a step has a hinted row). grpo and drgrpo always use raw
    /// rows only.
    pub hint_baseline: HintBaseline,
    /// `auto` (CUDA when present and the batch is large), `cpu` or `cuda`.
    pub device: Device,
    /// Divide by the group std (+ epsilon); off: A = s − mean.
    pub norm_by_std: bool,
    /// Added to the std before grpo divides (the reference's 1e-6).
    pub epsilon: f64,
    /// reinforce_pp's `rsqrt(var + whiten_epsilon)` (the reference's 1e-8);
    /// finite and > 0. `epsilon` does not apply to reinforce_pp.
    pub whiten_epsilon: f64,
    /// Opt-in floor for baseline std (0 = off, the reference's behaviour).
    pub std_floor: f64,
    /// `none` (default: the output as before) or `ratio`: the output gains
    /// a Float64 column `weight` (a `weight` field in JSON): ω = min(1,
    /// exp((logprob_unhinted − logprob_hinted) / response_length)) on hinted
    /// rows with both log-probs, 1.0 on every other row. A trainer
    /// multiplies each sample's policy-gradient term by it.
    #[serde(default)]
    pub hinted_weight: HintedWeight,
}

/// The JSON Schema of the kernels' enums (for the configuration
/// reference), from their clap value names and help texts, so that it lists
/// what the config accepts: the names are serde's too (both `snake_case`).
macro_rules! value_enum_schema {
    ($($ty:ty),*) => {$(
        impl JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                use clap::ValueEnum;
                let variants: Vec<serde_json::Value> = <$ty>::value_variants()
                    .iter()
                    .filter_map(|v| v.to_possible_value())
                    .map(|v| match v.get_help() {
                        Some(help) => serde_json::json!({"const": v.get_name(), "description": help.to_string()}),
                        None => serde_json::json!({"const": v.get_name()}),
                    })
                    .collect();
                schemars::json_schema!({"type": "string", "oneOf": variants})
            }
        }
    )*};
}

value_enum_schema!(Estimator, HintBaseline, Device, HintedWeight);

fn default_estimator() -> Estimator {
    Estimator::Grpo
}

fn default_device() -> Device {
    Device::Auto
}

fn default_norm_by_std() -> bool {
    true
}

fn default_epsilon() -> f64 {
    DEFAULT_EPSILON
}

fn default_std_floor() -> f64 {
    0.0
}

impl Default for NormalizeConfig {
    fn default() -> Self {
        NormalizeConfig {
            estimator: default_estimator(),
            device: default_device(),
            norm_by_std: default_norm_by_std(),
            hint_baseline: HintBaseline::Reference,
            epsilon: default_epsilon(),
            whiten_epsilon: DEFAULT_WHITEN_EPSILON,
            std_floor: default_std_floor(),
            hinted_weight: HintedWeight::None,
        }
    }
}

/// The flags of `advantages compute`, each over its `[normalize]` key.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct NormalizeFlags {
    /// `--epsilon`.
    pub epsilon: Option<f64>,
    /// `--no-norm-by-std`.
    pub no_norm_by_std: bool,
    /// `--estimator`.
    pub estimator: Option<Estimator>,
    /// `--device`.
    pub device: Option<Device>,
}

/// A flag of `advantages compute` whose value cannot apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FlagError {
    #[error("--epsilon must be a finite number >= 0")]
    Epsilon,
}

impl NormalizeConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(non_negative(self.epsilon) && non_negative(self.std_floor)) {
            return invalid("normalize.epsilon and normalize.std_floor must be finite and >= 0");
        }
        if !(self.whiten_epsilon.is_finite() && self.whiten_epsilon > 0.0) {
            return invalid("normalize.whiten_epsilon must be finite and > 0 (the reference's is 1e-8)");
        }
        Ok(())
    }

    pub fn options(&self) -> AdvantageOptions {
        AdvantageOptions {
            estimator: self.estimator,
            norm_by_std: self.norm_by_std,
            epsilon: self.epsilon,
            std_floor: (self.std_floor > 0.0).then_some(self.std_floor),
            hint_baseline: self.hint_baseline,
            whiten_epsilon: self.whiten_epsilon,
        }
    }

    /// This section with the flags of `advantages compute` applied over it.
    pub fn with_flags(&self, flags: &NormalizeFlags) -> Result<NormalizeConfig, FlagError> {
        let mut config = self.clone();
        if let Some(epsilon) = flags.epsilon {
            if !non_negative(epsilon) {
                return Err(FlagError::Epsilon);
            }
            config.epsilon = epsilon;
        }
        config.norm_by_std &= !flags.no_norm_by_std;
        config.estimator = flags.estimator.unwrap_or(config.estimator);
        config.device = flags.device.unwrap_or(config.device);
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The section as the loader layers it: defaults, then `toml_text`.
    fn section(toml_text: &str) -> Result<NormalizeConfig, Box<figment::Error>> {
        use figment::providers::{Format, Serialized, Toml};
        figment::Figment::from(Serialized::defaults(NormalizeConfig::default()))
            .merge(Toml::string(toml_text))
            .extract()
            .map_err(Box::new)
    }

    #[test]
    fn hint_baseline_and_whiten_epsilon_default_to_the_reference_and_reach_the_options() {
        let config = NormalizeConfig::default();
        assert_eq!(config.hint_baseline, HintBaseline::Reference);
        assert_eq!(config.whiten_epsilon, 1e-8);
        let config =
            section("hint_baseline = \"raw\"\nwhiten_epsilon = 1e-5\nestimator = \"reinforce_pp\"").unwrap();
        config.validate().unwrap();
        let options = config.options();
        assert_eq!(options.hint_baseline, HintBaseline::Raw);
        assert_eq!(options.whiten_epsilon, 1e-5);
        assert_eq!(options.estimator, Estimator::ReinforcePp);
        assert!(section("hint_baseline = \"first_turn\"").is_err());
    }

    #[test]
    fn an_old_config_with_batch_whiten_reads_as_reinforce_pp() {
        let config = section("estimator = \"batch_whiten\"").unwrap();
        assert_eq!(config.estimator, Estimator::ReinforcePp);
    }

    #[test]
    fn whiten_epsilon_must_be_finite_and_positive() {
        for bad in [0.0, -1e-8, f64::NAN, f64::INFINITY] {
            let config = NormalizeConfig {
                whiten_epsilon: bad,
                ..NormalizeConfig::default()
            };
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains("whiten_epsilon"), "{bad}: {err}");
        }
    }

    #[test]
    fn compute_flags_override_the_section_and_reject_a_negative_epsilon() {
        let config = NormalizeConfig::default();
        let flags = NormalizeFlags {
            epsilon: Some(0.5),
            no_norm_by_std: true,
            estimator: Some(Estimator::Rloo),
            device: Some(Device::Cpu),
        };
        let applied = config.with_flags(&flags).unwrap();
        assert_eq!(applied.epsilon, 0.5);
        assert!(!applied.norm_by_std);
        assert_eq!(applied.estimator, Estimator::Rloo);
        assert_eq!(applied.device, Device::Cpu);
        assert_eq!(config.with_flags(&NormalizeFlags::default()).unwrap(), config);
        for epsilon in [-1.0, f64::NAN, f64::INFINITY] {
            let flags = NormalizeFlags {
                epsilon: Some(epsilon),
                ..NormalizeFlags::default()
            };
            assert_eq!(config.with_flags(&flags), Err(FlagError::Epsilon));
        }
    }
}
