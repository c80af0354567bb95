//! The integration tests, one binary (a binary per file linked the whole
//! crate 30 times). Modules per area follow the pipeline; `common` holds the
//! brokers, the loopback LLM server and the helpers they share. Run one area
//! or test with `cargo test --test it AREA::FILE::NAME`.

mod common;

mod advantages;
mod contract;
mod deploy;
mod hints;
mod kafka;
mod trainer;
