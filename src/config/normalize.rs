//! The `[normalize]` section: how the advantage kernels compute (stage 2 and
//! `advantages compute`), and the flags of `advantages compute` over it.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::error::{invalid, non_negative, ConfigError};
use crate::normalize::{AdvantageOptions, Device, Estimator, DEFAULT_EPSILON};

/// How the advantage kernels compute (stage 2 and `advantages compute`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NormalizeConfig {
    /// The advantage estimator: `grpo` (the reference's default), `drgrpo`
    /// (mean baseline, no std division), `rloo` (leave-one-out baseline) or
    /// `batch_whiten` (REINFORCE++'s whitening over the whole step). With
    /// hinted rows in a step, every baseline comes from raw rows only.
    pub estimator: Estimator,
    /// `auto` (CUDA when present and the batch is large), `cpu` or `cuda`.
    pub device: Device,
    /// Divide by the group std (+ epsilon); off: A = s − mean.
    pub norm_by_std: bool,
    pub epsilon: f64,
    /// Opt-in floor for baseline std (0 = off, the reference's behaviour).
    pub std_floor: f64,
}

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
            epsilon: default_epsilon(),
            std_floor: default_std_floor(),
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
        Ok(())
    }

    pub fn options(&self) -> AdvantageOptions {
        AdvantageOptions {
            estimator: self.estimator,
            norm_by_std: self.norm_by_std,
            epsilon: self.epsilon,
            std_floor: (self.std_floor > 0.0).then_some(self.std_floor),
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
