//! What a model's tokens cost: `llm.prices` (dollars per million input and
//! output tokens), looked up by the model's configured id, else by the name
//! its API knows it by. A model without a price costs nothing. The spend
//! budget reserves an attempt at [`worst_case_cost_usd`]: input at the
//! highest input rate that can apply, output at the output rate.

use std::collections::BTreeMap;

use super::routing::Link;
use crate::config::ModelPrice;
use crate::messages::Usage;

/// The price of `link`'s model, by its configured id, else by its API name.
pub(super) fn price_of<'a>(prices: &'a BTreeMap<String, ModelPrice>, link: &Link) -> Option<&'a ModelPrice> {
    prices.get(&link.id).or_else(|| prices.get(&link.api_model))
}

/// What `usage` costs at `price`, in dollars.
pub(super) fn cost_usd(price: Option<&ModelPrice>, usage: &Usage) -> f64 {
    price.map_or(0.0, |p| {
        (usage.input_tokens as f64 * p.input_per_mtok + usage.output_tokens as f64 * p.output_per_mtok) / 1e6
    })
}

/// The highest rate, in dollars per million tokens, that an input token of
/// `price` can be billed at. Today that is `input_per_mtok`: no request
/// asks for prompt caching.
///
/// Prompt caching hook: when requests mark cacheable blocks, add the cache
/// write rate to [`ModelPrice`] and return the larger of the two here (a
/// cache write is billed above the plain input rate), so that reservations
/// stay the worst case; settle reads the cache fields of `usage` then.
pub(super) fn highest_input_per_mtok(price: &ModelPrice) -> f64 {
    price.input_per_mtok
}

/// What `usage` can cost at most at `price`: its input tokens at
/// [`highest_input_per_mtok`], its output at the output rate.
pub(super) fn worst_case_cost_usd(price: Option<&ModelPrice>, usage: &Usage) -> f64 {
    price.map_or(0.0, |p| {
        (usage.input_tokens as f64 * highest_input_per_mtok(p)
            + usage.output_tokens as f64 * p.output_per_mtok)
            / 1e6
    })
}
