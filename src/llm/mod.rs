//! The LLM side of stage 1: from a failed trajectory to a hint, with
//! retries, fallbacks and accounting.
//!
//! A hint goes down a one-way pipeline, each step a file that calls only
//! the next: [`synth`] → `chain` → `fitting` → `call` → `retry` → `hedge`
//! → `send` → [`client`].
//!
//! - [`synth`]: the [`Synthesizer`]: the chain, readiness, hint ids, the
//!   metrics observer (`observer`).
//! - `chain`: the chain walk, model after model, then the static hint.
//! - `fitting`: each model's context window, and its call with a fitted
//!   prompt (refitted once on a context-length error).
//! - `call`: one model's call, played from or recorded into the cassette.
//! - `retry`: one model's attempts, with backoff.
//! - `hedge`: hedged requests: one duplicate of an attempt slower than its
//!   model's p95, under a token bucket (`hedger`, `llm.hedge`).
//! - `send`: one admitted attempt, its spend settled.
//! - `attempt`: one attempt's `llm_attempt` span and report.
//! - `shared`: what a synthesizer's calls share, handed down the pipeline.
//! - `link`: one model of the chain; `tally`: what one synthesis used.
//! - [`client`]: the API clients (Anthropic, OpenAI-compatible), the only
//!   HTTP code, and [`LlmError`] with its failure reasons.
//! - [`env`](mod@env): the SDK variables the endpoints are resolved from.
//! - [`routing`]: which API, endpoint and key serve each model of the chain.
//! - [`limits`]: what bounds an attempt: rate limits, calls in flight and
//!   the spend budget ([`limits::budget`]).
//! - [`pricing`]: what a model's tokens cost, cache reads and writes
//!   included.
//! - [`context`]: the system context files, read at start-up.
//! - [`prompt_cache`]: where requests ask for provider prompt caching.
//! - [`cap`]: the cap on a hint's length (`llm.max_hint_chars`).
//! - `saturation`: a model's server that times out while requests queue.
//! - [`cassette`]: recorded exchanges, for deterministic reruns.
//! - [`fit`]: the prompt fitted to the model's context window.
//! - [`prompt`]: the versioned prompt with its truncation rules, the
//!   `<untrusted>` element that delimits what hintstream did not write,
//!   and the static hint.
//! - [`pyliteral`]: the Python-literal parser for verifier accumulators.

mod attempt;
mod call;
pub mod cap;
pub mod cassette;
mod chain;
pub mod client;
pub mod context;
pub mod env;
pub mod fit;
mod fitting;
mod hedge;
mod hedger;
pub mod limits;
mod link;
mod observer;
pub mod pricing;
pub mod prompt;
pub mod prompt_cache;
pub mod pyliteral;
mod retry;
pub mod routing;
mod saturation;
mod send;
mod shared;
pub mod synth;
mod tally;

/// `llm::budget` stays a path of the spend budget (it lives in `limits`).
pub use limits::budget;

pub use client::{ApiKey, Endpoint, LlmClient, LlmError, Provider};
pub use synth::{Synthesis, Synthesizer};
