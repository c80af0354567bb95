//! hintstream: a Kafka pipeline that rescues the GRPO learning signal of
//! prompts whose every rollout failed.
//!
//! # Layout
//!
//! The modules follow the pipeline, from the wire inwards:
//!
//! - [`messages`]: the wire contract (failed trajectories, hints, scored
//!   rollouts, step ends), their validation and keys; decoding untrusted bytes
//!   into typed values with a typed error per way of being wrong.
//! - [`config`]: layered settings (defaults, `hintstream.toml`, env
//!   `HINTSTREAM_<SECTION>__<KEY>`, flags) with the rules that span fields.
//! - [`kafka`]: everything that touches Kafka records: client construction,
//!   the offset tracker and its single commit point (the at-least-once
//!   contract), the dead-letter producer, the consume loop, topic admin.
//! - [`tools`]: `produce`, `record` and `replay` for moving data in and out of
//!   topics.
//! - [`eval`]: stage 1's synthesis over a recorded topic under several
//!   configs, with an LLM cassette, written as a JSON and HTML report.
//! - [`jsonl`]: the line loop of every JSONL reader.
//! - [`metrics`]: Prometheus counters and the `/metrics` endpoint.
//! - [`cli`]: the command-line surface of the `hintstream` binary.

pub mod advantages;
pub mod batch;
pub mod cli;
pub mod config;
pub mod eval;
pub mod hints;
pub mod jsonl;
pub mod kafka;
pub mod llm;
pub mod messages;
pub mod metrics;
pub mod normalize;
pub mod quickstart;
pub mod tools;
