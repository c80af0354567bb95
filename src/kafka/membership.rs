//! Whether a stage's consumer is in its group, from librdkafka's statistics,
//! and how long it may stay out before the stage gives up.
//!
//! A member the group evicted (a stall past `session.timeout.ms`) rejoins by
//! itself, a rebalance waits for the group's members up to
//! `max.poll.interval.ms`, and a client that can reach no broker bootstraps
//! again after `metadata.recovery.rebootstrap.trigger.ms`. Past both, waiting longer
//! does not help: librdkafka 2.12 was seen to drop every broker of a
//! consumer after its broker stalled for a minute, and to query for the
//! group's coordinator with no broker to ask from then on. The stage then
//! stops with the reason, so that whatever runs it (Kubernetes, a script)
//! starts it afresh, rather than stay unready forever.

use std::time::{Duration, Instant};

use rdkafka::statistics::Statistics;

use crate::config::Config;

/// librdkafka's defaults' bound (twice 45 s plus 300 s), for a config whose
/// properties do not parse (the config check refused those already).
const DEFAULT_LIMIT: Duration = Duration::from_secs(390);

/// The bound of `config`'s consumers: see
/// [`crate::config::KafkaConfig::out_of_group_limit_ms`].
pub(crate) fn out_of_group_limit(config: &Config) -> Duration {
    config
        .kafka
        .out_of_group_limit_ms()
        .map_or(DEFAULT_LIMIT, Duration::from_millis)
}

/// What one statistics report says of the consumer's group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupView {
    /// The group handler's state and join state; `None` before it exists.
    pub group: Option<(String, String)>,
    /// Brokers the client could ask for the coordinator (bootstrap or
    /// learned; not its internal and logical ones).
    pub brokers: usize,
}

impl GroupView {
    pub fn of(statistics: &Statistics) -> Self {
        GroupView {
            group: statistics
                .cgrp
                .as_ref()
                .map(|g| (g.state.clone(), g.join_state.clone())),
            brokers: statistics
                .brokers
                .values()
                .filter(|b| b.source == "learned" || b.source == "configured")
                .count(),
        }
    }

    /// Up (coordinator known and connected) and steady (no join or sync in
    /// progress), with or without partitions.
    fn joined(&self) -> bool {
        matches!(&self.group, Some((state, join)) if state == "up" && join == "steady")
    }

    fn describe(&self) -> String {
        match &self.group {
            Some((state, join)) => format!("group state {state}, join state {join}"),
            None => "no group handler yet".to_string(),
        }
    }
}

/// Where the consumer stands after a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Standing {
    In,
    /// Out of its group (not ready), for why.
    Out(String),
    /// Out for longer than the bound: the stage stops, for why.
    Lost(String),
}

/// Since when the consumer has been out of its group, against its bound.
#[derive(Debug)]
pub(crate) struct Membership {
    limit: Duration,
    out_since: Option<Instant>,
}

impl Membership {
    pub fn new(limit: Duration) -> Self {
        Membership {
            limit,
            out_since: None,
        }
    }

    pub fn observe(&mut self, view: &GroupView, now: Instant) -> Standing {
        if view.joined() {
            self.out_since = None;
            return Standing::In;
        }
        let since = *self.out_since.get_or_insert(now);
        let out_for = now.saturating_duration_since(since);
        let state = view.describe();
        if out_for <= self.limit {
            return Standing::Out(match &view.group {
                Some(_) => format!("the consumer is not in its group ({state})"),
                None => "the consumer has not joined its group yet".to_string(),
            });
        }
        let brokers = match view.brokers {
            0 => "librdkafka knows no broker to ask for the group's coordinator any more".to_string(),
            n => format!("{n} broker(s) known"),
        };
        Standing::Lost(format!(
            "the consumer has been out of its group for {} s, past its bound of {} s (twice \
             kafka.\"session.timeout.ms\" plus the longer of kafka.\"max.poll.interval.ms\" and \
             kafka.\"metadata.recovery.rebootstrap.trigger.ms\"); \
             {state}; {brokers}. The stage stops so that whatever runs it starts it afresh; \
             check that the brokers at bootstrap_servers answer",
            out_for.as_secs(),
            self.limit.as_secs()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(state: &str, join: &str, brokers: usize) -> GroupView {
        GroupView {
            group: Some((state.into(), join.into())),
            brokers,
        }
    }

    #[test]
    fn out_of_the_group_is_unready_until_the_bound_then_lost() {
        let mut m = Membership::new(Duration::from_secs(390));
        let t0 = Instant::now();
        assert_eq!(m.observe(&view("up", "steady", 1), t0), Standing::In);
        let out = view("query-coord", "init", 0);
        assert!(matches!(m.observe(&out, t0), Standing::Out(why) if why.contains("query-coord")));
        let at = t0 + Duration::from_secs(390);
        assert!(
            matches!(m.observe(&out, at), Standing::Out(_)),
            "at the bound it still waits"
        );
        match m.observe(&out, at + Duration::from_secs(1)) {
            Standing::Lost(why) => {
                assert!(why.contains("391 s"), "{why}");
                assert!(why.contains("knows no broker"), "{why}");
            }
            other => panic!("expected Lost, got {other:?}"),
        }
    }

    #[test]
    fn rejoining_restarts_the_clock() {
        let mut m = Membership::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let out = view("up", "wait-join", 1);
        m.observe(&out, t0);
        assert_eq!(
            m.observe(&view("up", "steady", 1), t0 + Duration::from_secs(8)),
            Standing::In
        );
        assert!(matches!(
            m.observe(&out, t0 + Duration::from_secs(15)),
            Standing::Out(_)
        ));
        assert!(matches!(
            m.observe(&out, t0 + Duration::from_secs(26)),
            Standing::Lost(why) if why.contains("1 broker(s) known")
        ));
    }

    #[test]
    fn before_any_group_handler_it_has_not_joined_yet() {
        let mut m = Membership::new(Duration::from_secs(10));
        let none = GroupView {
            group: None,
            brokers: 1,
        };
        assert_eq!(
            m.observe(&none, Instant::now()),
            Standing::Out("the consumer has not joined its group yet".into())
        );
    }
}
