//! The LLM side of stage 1: API clients (the only HTTP code), the versioned
//! prompt with its truncation rules, the Python-literal parser for verifier
//! accumulators, and the synthesizer that turns a failed trajectory into a
//! hint with retries, fallbacks and accounting.

pub mod budget;
pub mod cassette;
pub mod client;
pub mod prompt;
pub mod pyliteral;
pub mod synth;

pub use client::{ApiKey, Endpoint, LlmClient, LlmError, Provider};
pub use synth::{Synthesis, Synthesizer};
