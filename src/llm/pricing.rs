//! What a model's tokens cost: `llm.prices` (dollars per million input,
//! output and cached input tokens), looked up by the model's configured id,
//! else by the name its API knows it by. A model without a price costs
//! nothing. Unset cache rates default by the model's API: Anthropic bills a
//! cache read at 0.1x the input price and a write at 1.25x (`cache_ttl =
//! "5m"`) or 2x (`"1h"`); OpenAI a read at 0.5x and no write premium. The
//! spend budget reserves an attempt at [`worst_case_cost_usd`]: input at
//! the highest input rate that can apply, output at the output rate.

use super::client::Provider;
use super::link::Link;
use crate::config::{CacheTtl, LlmConfig, ModelPrice};
use crate::messages::Usage;

/// Anthropic's cache read price, as a multiple of the input price.
pub const ANTHROPIC_CACHE_READ_MULTIPLIER: f64 = 0.1;
/// OpenAI's cached input price, as a multiple of the input price (the
/// published rate of the GPT-4o family).
pub const OPENAI_CACHE_READ_MULTIPLIER: f64 = 0.5;

/// The price of `link`'s model, by its configured id, else by its API
/// name, with its cache rates resolved for its API and `llm.cache_ttl`.
pub(super) fn price_of(config: &LlmConfig, link: &Link) -> Option<ModelPrice> {
    config
        .prices
        .get(&link.id)
        .or_else(|| config.prices.get(&link.api_model))
        .map(|p| resolved(p, link.client.provider(), config.cache_ttl))
}

/// `price` with its unset cache rates set to the defaults of `provider`.
pub fn resolved(price: &ModelPrice, provider: Provider, ttl: CacheTtl) -> ModelPrice {
    let (read, write) = match provider {
        Provider::Anthropic => (ANTHROPIC_CACHE_READ_MULTIPLIER, ttl.write_multiplier()),
        Provider::Openai => (OPENAI_CACHE_READ_MULTIPLIER, 1.0),
    };
    ModelPrice {
        cache_read_per_mtok: Some(price.cache_read_per_mtok.unwrap_or(price.input_per_mtok * read)),
        cache_write_per_mtok: Some(price.cache_write_per_mtok.unwrap_or(price.input_per_mtok * write)),
        ..*price
    }
}

fn read_rate(p: &ModelPrice) -> f64 {
    p.cache_read_per_mtok.unwrap_or(p.input_per_mtok)
}

fn write_rate(p: &ModelPrice) -> f64 {
    p.cache_write_per_mtok.unwrap_or(p.input_per_mtok)
}

/// What `usage` costs at `price`, in dollars: plain input, cache reads,
/// cache writes and output, each at its rate.
pub fn cost_usd(price: Option<&ModelPrice>, usage: &Usage) -> f64 {
    price.map_or(0.0, |p| {
        (usage.input_tokens as f64 * p.input_per_mtok
            + usage.cache_read_input_tokens.unwrap_or(0) as f64 * read_rate(p)
            + usage.cache_creation_input_tokens.unwrap_or(0) as f64 * write_rate(p)
            + usage.output_tokens as f64 * p.output_per_mtok)
            / 1e6
    })
}

/// What `usage` would have cost without the cache: every prompt token at
/// the input rate. `cost_usd` less it is what the cache saved (negative
/// when writes outweighed reads).
pub fn uncached_cost_usd(price: Option<&ModelPrice>, usage: &Usage) -> f64 {
    price.map_or(0.0, |p| {
        (usage.prompt_tokens() as f64 * p.input_per_mtok + usage.output_tokens as f64 * p.output_per_mtok)
            / 1e6
    })
}

/// The highest rate, in dollars per million tokens, that an input token of
/// `price` can be billed at: the cache write rate when the request marks a
/// cache breakpoint (`writes_cache`) and it is above the input rate, else
/// the input rate (a read is never above it).
pub(super) fn highest_input_per_mtok(price: &ModelPrice, writes_cache: bool) -> f64 {
    if writes_cache {
        price.input_per_mtok.max(write_rate(price))
    } else {
        price.input_per_mtok
    }
}

/// What `usage` can cost at most at `price`: its input tokens at
/// [`highest_input_per_mtok`], its output at the output rate.
pub(super) fn worst_case_cost_usd(price: Option<&ModelPrice>, usage: &Usage, writes_cache: bool) -> f64 {
    price.map_or(0.0, |p| {
        (usage.prompt_tokens() as f64 * highest_input_per_mtok(p, writes_cache)
            + usage.output_tokens as f64 * p.output_per_mtok)
            / 1e6
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_rates_default_by_api_and_ttl() {
        let base = ModelPrice::new(3.0, 15.0);
        let five = resolved(&base, Provider::Anthropic, CacheTtl::FiveMinutes);
        assert_eq!(five.cache_read_per_mtok, Some(0.30000000000000004));
        assert_eq!(five.cache_write_per_mtok, Some(3.75));
        let hour = resolved(&base, Provider::Anthropic, CacheTtl::OneHour);
        assert_eq!(hour.cache_write_per_mtok, Some(6.0));
        let openai = resolved(&base, Provider::Openai, CacheTtl::OneHour);
        assert_eq!(
            (openai.cache_read_per_mtok, openai.cache_write_per_mtok),
            (Some(1.5), Some(3.0))
        );
        let set = ModelPrice {
            cache_read_per_mtok: Some(0.2),
            ..base
        };
        assert_eq!(
            resolved(&set, Provider::Anthropic, CacheTtl::FiveMinutes).cache_read_per_mtok,
            Some(0.2)
        );
    }

    #[test]
    fn each_part_of_the_usage_is_billed_at_its_rate() {
        let p = resolved(
            &ModelPrice::new(3.0, 15.0),
            Provider::Anthropic,
            CacheTtl::FiveMinutes,
        );
        let usage = Usage {
            cache_read_input_tokens: Some(2000),
            cache_creation_input_tokens: Some(1000),
            ..Usage::new(100, 50)
        };
        let want = (100.0 * 3.0 + 2000.0 * 0.3 + 1000.0 * 3.75 + 50.0 * 15.0) / 1e6;
        assert!((cost_usd(Some(&p), &usage) - want).abs() < 1e-15);
        let uncached = (3100.0 * 3.0 + 50.0 * 15.0) / 1e6;
        assert!((uncached_cost_usd(Some(&p), &usage) - uncached).abs() < 1e-15);
    }

    #[test]
    fn the_worst_case_bills_every_input_token_at_the_write_rate_when_the_request_marks_a_breakpoint() {
        let p = resolved(
            &ModelPrice::new(3.0, 15.0),
            Provider::Anthropic,
            CacheTtl::OneHour,
        );
        assert_eq!(highest_input_per_mtok(&p, false), 3.0);
        assert_eq!(highest_input_per_mtok(&p, true), 6.0);
        let worst = Usage::new(1000, 100);
        assert!((worst_case_cost_usd(Some(&p), &worst, true) - (6000.0 + 1500.0) / 1e6).abs() < 1e-15);
    }
}
