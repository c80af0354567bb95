//! Whether a stage's consumer is in its group, from librdkafka's statistics,
//! and how long it may go without its group's coordinator before the stage
//! gives up.
//!
//! A member the group evicted (a stall past `session.timeout.ms`) rejoins by
//! itself, a rebalance waits for the group's members up to
//! `max.poll.interval.ms`, and a client that can reach no broker bootstraps
//! again after `metadata.recovery.rebootstrap.trigger.ms`. Past all three,
//! waiting longer does not help: librdkafka 2.12 was seen to drop every
//! broker of a consumer after its broker stalled for a minute, and to query
//! for the group's coordinator with no broker to ask from then on. The stage
//! then stops with the reason, so that whatever runs it (Kubernetes, a
//! script) starts it afresh, rather than stay unready forever.
//!
//! Only a group handler that is not `up` (no coordinator known and
//! connected) counts towards the bound. A member that is up but not steady
//! is unready only: it is rebalancing, which librdkafka bounds, or (KIP-848)
//! it is a spare member that the broker gave no partitions, which stays in
//! join state `init`.

use std::time::{Duration, Instant};

use rdkafka::statistics::Statistics;

use super::settings::client_brokers;
use crate::config::Config;

/// The bound of `config`'s consumers: see
/// [`crate::config::KafkaConfig::out_of_group_limit_ms`]. The config check
/// refused a config whose properties do not parse; librdkafka's defaults'
/// bound stands in for one that was never checked.
pub(crate) fn out_of_group_limit(config: &Config) -> Duration {
    let ms = config.kafka.out_of_group_limit_ms().unwrap_or_else(|_| {
        crate::config::KafkaConfig::default()
            .out_of_group_limit_ms()
            .expect("librdkafka's defaults parse")
    });
    Duration::from_millis(ms)
}

/// Reports in a row without a coordinator before the stage stops, whatever
/// the time between them: two reports a long `statistics.interval.ms` apart
/// that each caught a short moment without one are not an outage.
const REPORTS_BEFORE_LOST: u32 = 3;

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
            brokers: client_brokers(statistics).count(),
        }
    }

    /// Up (coordinator known and connected) and steady (no join or sync in
    /// progress), with or without partitions: ready.
    fn joined(&self) -> bool {
        matches!(&self.group, Some((state, join)) if state == "up" && join == "steady")
    }

    /// The coordinator is known and connected.
    fn up(&self) -> bool {
        matches!(&self.group, Some((state, _)) if state == "up")
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
    /// Without a coordinator for longer than the bound: the stage stops,
    /// for why.
    Lost(String),
}

/// Since when the consumer has been without its group's coordinator,
/// against its bound.
#[derive(Debug)]
pub(crate) struct Membership {
    limit: Duration,
    /// The first report without a coordinator since the last one with it
    /// (or the last assignment), and how many have come since.
    down_since: Option<(Instant, u32)>,
}

impl Membership {
    pub fn new(limit: Duration) -> Self {
        Membership {
            limit,
            down_since: None,
        }
    }

    /// Partitions were assigned: the consumer is in its group whatever
    /// reports queued before say.
    pub fn assigned(&mut self) {
        self.down_since = None;
    }

    pub fn observe(&mut self, view: &GroupView, now: Instant) -> Standing {
        if view.up() {
            self.down_since = None;
        } else {
            let (_, reports) = self.down_since.get_or_insert((now, 0));
            *reports += 1;
        }
        if view.joined() {
            return Standing::In;
        }
        let state = view.describe();
        let out = match &view.group {
            Some(_) => format!("the consumer is not in its group ({state})"),
            None => "the consumer has not joined its group yet".to_string(),
        };
        let Some((since, reports)) = self.down_since else {
            return Standing::Out(out);
        };
        let down_for = now.saturating_duration_since(since);
        if down_for <= self.limit || reports < REPORTS_BEFORE_LOST {
            return Standing::Out(out);
        }
        let brokers = match view.brokers {
            0 => "librdkafka knows no broker to ask for the group's coordinator any more".to_string(),
            n => format!("{n} broker(s) known"),
        };
        Standing::Lost(format!(
            "the consumer has been without its group's coordinator for {} s, past its bound of \
             {} s (twice the session timeout plus the longer of kafka.\"max.poll.interval.ms\" and \
             kafka.\"metadata.recovery.rebootstrap.trigger.ms\"); {state}; {brokers}. The stage \
             stops so that whatever runs it starts it afresh; check that the brokers at \
             bootstrap_servers answer",
            down_for.as_secs(),
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

    fn lost(standing: &Standing) -> bool {
        matches!(standing, Standing::Lost(_))
    }

    #[test]
    fn without_a_coordinator_it_is_unready_until_the_bound_then_lost() {
        let mut m = Membership::new(Duration::from_secs(390));
        let t0 = Instant::now();
        assert_eq!(m.observe(&view("up", "steady", 1), t0), Standing::In);
        let down = view("query-coord", "init", 0);
        assert!(matches!(m.observe(&down, t0), Standing::Out(why) if why.contains("query-coord")));
        let at = t0 + Duration::from_secs(390);
        assert!(!lost(&m.observe(&down, at)), "at the bound it still waits");
        match m.observe(&down, at + Duration::from_secs(1)) {
            Standing::Lost(why) => {
                assert!(why.contains("391 s"), "{why}");
                assert!(why.contains("knows no broker"), "{why}");
            }
            other => panic!("expected Lost, got {other:?}"),
        }
    }

    #[test]
    fn up_but_not_steady_is_unready_and_never_lost() {
        // A long rebalance, or (KIP-848) a spare member with no partitions,
        // which stays in join state init.
        let mut m = Membership::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for (i, join) in ["wait-join", "init", "init", "init"].iter().enumerate() {
            let standing = m.observe(&view("up", join, 1), t0 + Duration::from_secs(100 * i as u64));
            assert!(matches!(standing, Standing::Out(_)), "{join}: {standing:?}");
        }
    }

    #[test]
    fn the_coordinator_found_again_or_an_assignment_restarts_the_clock() {
        let mut m = Membership::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let down = view("wait-coord", "init", 1);
        let at = |s: u64| t0 + Duration::from_secs(s);
        m.observe(&down, at(0));
        m.observe(&down, at(5));
        assert!(!lost(&m.observe(&view("up", "wait-join", 1), at(8))));
        m.observe(&down, at(9));
        m.observe(&down, at(15));
        assert!(!lost(&m.observe(&down, at(19))), "10 s since it was up");
        assert!(lost(&m.observe(&down, at(20))));
        // Reports queued behind an assignment: the clock starts again.
        m.assigned();
        assert!(!lost(&m.observe(&down, at(21))));
        assert!(!lost(&m.observe(&down, at(22))));
    }

    #[test]
    fn two_reports_far_apart_are_not_an_outage() {
        let mut m = Membership::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let down = view("query-coord", "init", 1);
        m.observe(&down, t0);
        assert!(!lost(&m.observe(&down, t0 + Duration::from_secs(3600))));
        assert!(lost(&m.observe(&down, t0 + Duration::from_secs(3601))));
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
