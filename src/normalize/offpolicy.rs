//! The two numbers of a hinted row that carries both log-probs and a length
//! L (issue 31, after Guide-GRPO's importance ratio made per-token as GSPO
//! does, and HiLL's hint reliance):
//!
//! - the per-token ratio ω = min(1, exp((logprob_unhinted − logprob_hinted) / L)),
//!   how likely the policy is to write the response without the hint, per
//!   token, relative to with it (capped at 1);
//! - the reliance ρ = (logprob_hinted − logprob_unhinted) / L, the nats a
//!   token the hint adds.
//!
//! Both are finite for finite log-probs at most 0 (their difference is at
//! most the larger magnitude) and L ≥ 1: ω is in [0, 1].
//!
//! [`HintedWeight`] says whether stage 2's output carries ω as each row's
//! off-policy `weight`.

use serde::{Deserialize, Serialize};

/// Whether the advantages carry an off-policy `weight` per row (config
/// `normalize.hinted_weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum HintedWeight {
    /// No `weight`: the output is as before.
    #[default]
    None,
    /// A Float64 `weight` column (a `weight` field in JSON): ω on hinted
    /// rows with both log-probs, 1.0 on every other row. A trainer
    /// multiplies each sample's policy-gradient term by it (Guide-GRPO's
    /// correction, per token as GSPO does).
    Ratio,
}

/// ω of a row with log-probs `hinted` and `unhinted` and length `length`.
pub fn ratio(hinted: f64, unhinted: f64, length: u32) -> f64 {
    ((unhinted - hinted) / f64::from(length.max(1))).exp().min(1.0)
}

/// ρ of a row with log-probs `hinted` and `unhinted` and length `length`,
/// in nats per token.
pub fn reliance(hinted: f64, unhinted: f64, length: u32) -> f64 {
    (hinted - unhinted) / f64::from(length.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_and_reliance_on_hand_computed_rows() {
        // 10 tokens, the hint adds 20 nats: ρ = 2 nats a token, ω = e^-2.
        assert_eq!(reliance(-5.0, -25.0, 10), 2.0);
        assert_eq!(ratio(-5.0, -25.0, 10), (-2.0f64).exp());
        // The unhinted prompt makes the response likelier: ω capped at 1,
        // ρ negative.
        assert_eq!(ratio(-30.0, -10.0, 4), 1.0);
        assert_eq!(reliance(-30.0, -10.0, 4), -5.0);
        // Equal log-probs: ω = 1, ρ = 0.
        assert_eq!((ratio(-7.0, -7.0, 3), reliance(-7.0, -7.0, 3)), (1.0, 0.0));
        // One token, 0.1 nats.
        assert!((ratio(-0.2, -0.3, 1) - (-0.1f64).exp()).abs() < 1e-15);
        // Extreme but finite log-probs stay finite.
        let (w, r) = (ratio(0.0, -1.7e308, 1), reliance(0.0, -1.7e308, 1));
        assert!(w == 0.0 && r == 1.7e308, "{w} {r}");
        assert_eq!(ratio(-1.7e308, 0.0, 1), 1.0);
    }
}
