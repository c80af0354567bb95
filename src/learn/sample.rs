//! The seeded random stream of one group, and Beta draws from it: the same
//! group key gives the same numbers on every worker, run and restart.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

/// Domain separation of the seed: another use of the group key's hash
/// never shares this stream.
const SEED_DOMAIN: &[u8] = b"hintstream/arm-selection/v1\0";

/// A ChaCha8 stream seeded with SHA-256 of the group key. ChaCha8Rng's
/// output for a seed is fixed by `rand_chacha` (value-stable across
/// versions), so a group's draws do not change with the build.
pub struct GroupStream {
    rng: ChaCha8Rng,
}

impl GroupStream {
    pub fn new(group_key: &str) -> GroupStream {
        let mut hash = Sha256::new();
        hash.update(SEED_DOMAIN);
        hash.update(group_key.as_bytes());
        GroupStream {
            rng: ChaCha8Rng::from_seed(hash.finalize().into()),
        }
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    /// Uniform in (0, 1]: safe under `ln`.
    fn uniform_open_zero(&mut self) -> f64 {
        1.0 - self.uniform()
    }

    /// A standard normal draw (Box-Muller; the second value is discarded so
    /// that a draw depends on nothing but its place in the stream).
    fn normal(&mut self) -> f64 {
        let u1 = self.uniform_open_zero();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// A Gamma(shape, 1) draw, `shape` > 0: Marsaglia and Tsang's method,
    /// with Gamma(a) = Gamma(a + 1) * U^(1/a) for shapes below 1.
    pub fn gamma(&mut self, shape: f64) -> f64 {
        // Shapes come from posteriors, never below their (positive) priors;
        // anything else is taken as the smallest positive shape.
        let shape = if shape > 0.0 { shape } else { f64::MIN_POSITIVE };
        if shape < 1.0 {
            // Gamma(shape) = Gamma(shape + 1) * U^(1/shape), without recursion.
            let boost = self.uniform_open_zero().powf(1.0 / shape);
            return self.gamma_at_least_one(shape + 1.0) * boost;
        }
        self.gamma_at_least_one(shape)
    }

    /// Marsaglia and Tsang's method, for `shape` >= 1.
    fn gamma_at_least_one(&mut self, shape: f64) -> f64 {
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = 1.0 + c * x;
            if v <= 0.0 {
                continue;
            }
            let v = v * v * v;
            let u = self.uniform_open_zero();
            if u < 1.0 - 0.0331 * x.powi(4) || u.ln() < 0.5 * x * x + d * (1.0 - v + v.ln()) {
                return d * v;
            }
        }
    }

    /// A Beta(alpha, beta) draw, both > 0, as X / (X + Y) of two Gammas.
    pub fn beta(&mut self, alpha: f64, beta: f64) -> f64 {
        let x = self.gamma(alpha);
        let y = self.gamma(beta);
        let sum = x + y;
        if sum > 0.0 {
            x / sum
        } else {
            // Both underflowed (tiny shapes): the mean.
            alpha / (alpha + beta)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_gives_one_stream() {
        let draws = |key: &str| {
            let mut s = GroupStream::new(key);
            (0..5).map(|_| s.beta(2.0, 3.0)).collect::<Vec<_>>()
        };
        assert_eq!(draws("r/3/i"), draws("r/3/i"));
        assert_ne!(draws("r/3/i"), draws("r/3/j"));
    }

    #[test]
    fn beta_draws_have_the_beta_mean_and_variance() {
        for (a, b) in [(1.0, 1.0), (0.5, 0.5), (2.0, 8.0), (70.0, 30.0), (1.3, 0.2)] {
            let n = 20_000;
            let mut s = GroupStream::new(&format!("beta {a} {b}"));
            let xs: Vec<f64> = (0..n).map(|_| s.beta(a, b)).collect();
            assert!(xs.iter().all(|x| (0.0..=1.0).contains(x)));
            let mean = xs.iter().sum::<f64>() / n as f64;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            let want_mean = a / (a + b);
            let want_var = a * b / ((a + b).powi(2) * (a + b + 1.0));
            // Five standard errors of the mean; 10% on the variance.
            let se = (want_var / n as f64).sqrt();
            assert!(
                (mean - want_mean).abs() < 5.0 * se,
                "Beta({a},{b}) mean {mean} vs {want_mean}"
            );
            assert!(
                (var / want_var - 1.0).abs() < 0.1,
                "Beta({a},{b}) var {var} vs {want_var}"
            );
        }
    }
}
