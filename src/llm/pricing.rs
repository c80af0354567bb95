//! What a model's tokens cost: `llm.prices` (dollars per million input and
//! output tokens), looked up by the model's configured id, else by the name
//! its API knows it by. A model without a price costs nothing.

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
