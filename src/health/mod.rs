//! A stage's health: its lifecycle (running, stopping, failed), what
//! `/readyz` answers, and the HTTP endpoint that serves `/metrics`,
//! `/healthz` and `/readyz` with bounds on what one client can hold (its
//! connection slots in `slots`).
//!
//! Imports only `metrics` (the readiness gauge, the rendered registry); the
//! Kafka clients keep the readiness signals and share the lifecycle.

pub mod endpoint;
mod idle;
pub mod lifecycle;
pub mod readiness;
mod slots;

pub use endpoint::{serve, serve_health, serve_with_limits, EndpointLimits};
pub use lifecycle::Lifecycle;
pub use readiness::{Condition, Readiness, Signal};
