//! hintstream: a Kafka pipeline that rescues the GRPO learning signal of
//! prompts whose every rollout failed.
//!
//! # Layout
//!
//! The modules follow the pipeline, from the wire inwards, in layers: a
//! module imports only from its own layer or below (messages, normalize,
//! jsonl, allocator < config < batch, learn < metrics, health, telemetry < kafka <
//! stage < hints, llm, advantages < tools, eval, quickstart < cli), with no
//! circle; `tests/it/contract/layout.rs` checks it, and that this map and
//! the book's layout chapter (docs/layout.md) name every module.
//!
//! - [`messages`]: the wire contract (failed trajectories, hints, scored
//!   rollouts, step ends), their validation and keys; decoding untrusted bytes
//!   into typed values with a typed error per way of being wrong.
//! - [`config`]: layered settings (defaults, `hintstream.toml`, env
//!   `HINTSTREAM_<SECTION>__<KEY>`, flags) with the rules that span fields.
//! - [`kafka`]: everything that touches Kafka records: client construction
//!   and start-up checks, the offset tracker and its single commit point (the
//!   at-least-once contract), one handle per taken message, the dead-letter
//!   producer, bounded produce, the consume loop with drain on revoke and
//!   shutdown and the `Stage` contract it drives, whole-topic readers with a
//!   read barrier (the state both stages rebuild from topics), topic admin.
//! - [`stage`]: the skeleton both stages share: checks, clients, registry,
//!   metrics endpoint, the loop.
//! - [`llm`]: stage 1's model side: the HTTP clients (Anthropic,
//!   OpenAI-compatible), routing, the prompts (`v3`, untrusted text
//!   delimited, and the reference's byte for byte), the Python-literal
//!   parser, the chain walk with retries,
//!   the limits (rate, spend budget), the cassette.
//! - [`learn`]: hints that learn, the core, without Kafka: arms, Thompson
//!   selection, the state rebuilt from the hints and outcomes topics (its
//!   counting rules and bounds), refinement, per-arm reports; stage 1
//!   chooses with it, stage 2 and the eval report with it.
//! - [`hints`]: stage 1, `hintstream hints`: decode, group, choose the
//!   group's arm and refinement from what earlier hints did (hints that
//!   learn), synthesize (at most one LLM call per group: the hint cache;
//!   the LLM limits the consumer group's through the spend ledger),
//!   publish.
//! - [`batch`]: Arrow schemas, columnar scored rows, IPC framing,
//!   chunked steps (a step as several IPC messages under a byte bound) and
//!   synthetic steps for the benchmarks.
//! - [`normalize`]: the advantage estimators (GRPO, Dr.GRPO, RLOO,
//!   REINFORCE++) on CPU and CUDA, and dense group ids. It keeps the name of
//!   its config section, `[normalize]` (the reference's "advantage
//!   normalization"), which users already write.
//! - [`advantages`]: stage 2, `hintstream advantages`: decode, assemble
//!   steps, compute, publish advantages, step metrics and hint outcomes;
//!   `advantages compute` on files.
//! - [`metrics`]: the consume loop's Prometheus counters and a registry
//!   rendered as text.
//! - [`health`]: a stage's lifecycle (running, stopping, failed); what
//!   `/readyz` answers (in the group, producer connected, the stage's own
//!   conditions); the endpoint that serves `/metrics`, `/healthz` and
//!   `/readyz` under a header-read timeout, an idle timeout and a
//!   connection cap (where the connection idle longest makes room).
//! - [`telemetry`]: log output, OTLP span export, W3C `traceparent` on
//!   Kafka headers, one file each.
//! - [`tools`]: `produce`, `record` and `replay` for moving data in and out of
//!   topics, and reassembling chunked steps read back from a topic.
//! - [`eval`]: stage 1's synthesis over a recorded topic under several
//!   configs, with an LLM cassette, and the arm table of a recorded run
//!   (hints and outcomes), written as a JSON and HTML report.
//! - [`stages`]: the registry of stages the binary, the quick start and
//!   `topics create` read.
//! - [`quickstart`]: the whole pipeline in one process on sample data.
//! - [`jsonl`]: the line loop of every JSONL reader.
//! - [`allocator`]: the binary's allocators (jemalloc's zeroed blocks, glibc
//!   malloc's thresholds for librdkafka), which keep a step's pages for the next.
//! - [`cli`]: the command-line surface of the `hintstream` binary.

pub mod messages;

pub mod config;

pub mod kafka;
pub mod stage;

pub mod hints;
pub mod llm;

pub mod advantages;
pub mod batch;
pub mod learn;
pub mod normalize;

pub mod health;
pub mod metrics;
pub mod telemetry;

pub mod allocator;
pub mod eval;
pub mod jsonl;
pub mod quickstart;
pub mod stages;
pub mod tools;

pub mod cli;
