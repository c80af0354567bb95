//! One model of the chain: the id as configured, the name its API knows it
//! by, the client of that API, and the context window its server reported.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use super::client::LlmClient;

/// One model of the chain: the id as configured, the name its API knows it
/// by, and the client of that API.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) id: String,
    pub(super) api_model: String,
    pub(super) client: LlmClient,
    /// The context window its server reported, once asked (`fitting`).
    pub(super) discovered: Discovered,
}

/// A model's window as its server reported it: unknown until asked and
/// answered (`None` inside when it said nothing).
#[derive(Debug, Default)]
pub(super) struct Discovered {
    pub(super) asked: AtomicBool,
    pub(super) window: Arc<OnceLock<Option<u32>>>,
}

/// The model of the chain being called, and the one after it: where a
/// hedged request's duplicate may go (`llm.hedge_to = "next"`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Turn<'a> {
    pub(super) link: &'a Link,
    /// `None` for the chain's last model.
    pub(super) next: Option<&'a Link>,
}
