//! The Kafka plumbing under both stages: at-least-once, exactly-once (and a commit that times out under it), delivery, dead letters, revoke, failover, faults, group protocols (classic and KIP-848), static membership, chaos, codecs, secured clusters, record/replay, a starting stage's producer id, the pipeline of a pipelined stage, records produced together.

mod at_least_once;
mod chaos;
mod codecs;
mod dead_letters;
mod delivery;
mod exactly_once;
mod exactly_once_slow_commit;
mod failover;
mod faults;
mod group_protocol;
mod pipeline;
mod producer_id;
mod record_replay;
mod revoke;
mod secure_cluster;
mod send_all;
mod static_membership;
mod tail;
