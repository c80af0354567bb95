//! What `/readyz` answers: a stage is ready when its consumer is in its
//! group (it holds an assignment, or is joined with nothing assigned), its
//! output producer is connected to a broker, and each condition the stage
//! adds holds (stage 1: its LLM provider answered once, or it has none);
//! never while it shuts down or after it failed. `/healthz` is liveness
//! only: it answers while the process's runtime runs.

use std::sync::{Arc, Mutex};

use super::lifecycle::Lifecycle;
use crate::metrics::StageMetrics;

/// One part of readiness that a callback keeps current (a client's
/// statistics, a rebalance): whether it holds, and why not.
#[derive(Debug)]
pub struct Signal {
    /// `None` while it holds.
    why_not: Mutex<Option<String>>,
}

impl Signal {
    /// A signal that does not hold yet, for `why`.
    pub fn new(why: impl Into<String>) -> Self {
        Signal {
            why_not: Mutex::new(Some(why.into())),
        }
    }

    pub fn hold(&self) {
        *self.lock() = None;
    }

    pub fn fail(&self, why: impl Into<String>) {
        *self.lock() = Some(why.into());
    }

    pub fn check(&self) -> Result<(), String> {
        self.lock().clone().map_or(Ok(()), Err)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // A plain assignment cannot leave it half-written.
        self.why_not.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A condition a stage adds: `Err` says why it is not ready.
pub type Condition = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// A stage's readiness, read by `/readyz` and mirrored in its `ready` gauge.
pub struct Readiness {
    lifecycle: Lifecycle,
    /// The consumer is in its group (kept by its rebalances and statistics).
    group: Arc<Signal>,
    /// The output producer has a broker connection (kept by its statistics).
    producer: Arc<Signal>,
    conditions: Mutex<Vec<Condition>>,
    metrics: Arc<StageMetrics>,
}

impl Readiness {
    pub fn new(
        lifecycle: Lifecycle,
        group: Arc<Signal>,
        producer: Arc<Signal>,
        metrics: Arc<StageMetrics>,
    ) -> Self {
        Readiness {
            lifecycle,
            group,
            producer,
            conditions: Mutex::new(Vec::new()),
            metrics,
        }
    }

    /// Adds a condition the stage must meet to be ready.
    pub fn require(&self, condition: Condition) {
        self.conditions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(condition);
    }

    /// `Ok` when the stage is ready, else why not; sets the `ready` gauge to
    /// match.
    pub fn check(&self) -> Result<(), String> {
        let result = self.evaluate();
        self.metrics.set_ready(result.is_ok());
        result
    }

    fn evaluate(&self) -> Result<(), String> {
        if let Some(failure) = self.lifecycle.failure() {
            return Err(format!("the stage failed: {failure}"));
        }
        if self.lifecycle.is_stopping() {
            return Err("the stage is shutting down".into());
        }
        self.group.check()?;
        self.producer.check()?;
        for condition in self.conditions.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            condition()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_part_holds_and_the_stage_runs() {
        let lifecycle = Lifecycle::new();
        let group = Arc::new(Signal::new("not joined"));
        let producer = Arc::new(Signal::new("no broker"));
        let metrics = Arc::new(StageMetrics::unregistered());
        let readiness = Readiness::new(
            lifecycle.clone(),
            group.clone(),
            producer.clone(),
            metrics.clone(),
        );
        assert_eq!(readiness.check(), Err("not joined".into()));
        group.hold();
        assert_eq!(readiness.check(), Err("no broker".into()));
        producer.hold();
        assert_eq!(readiness.check(), Ok(()));
        assert_eq!(metrics.ready(), 1);
        readiness.require(Box::new(|| Err("the LLM has not answered".into())));
        assert_eq!(readiness.check(), Err("the LLM has not answered".into()));
        assert_eq!(metrics.ready(), 0);
        let fresh = Readiness::new(lifecycle.clone(), group, producer, metrics);
        assert_eq!(fresh.check(), Ok(()));
        lifecycle.begin_shutdown(std::time::Duration::ZERO);
        assert_eq!(fresh.check(), Err("the stage is shutting down".into()));
    }
}
