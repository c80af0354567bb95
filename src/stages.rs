//! The registry of stages: the one list the binary (one subcommand a
//! stage), the quick start and `hintstream topics create` read. A third
//! stage is a module of its own with a [`Registered`] entry, added here.

use crate::config::Config;
use crate::kafka::admin::{self, TopicSpec};
use crate::stage::Registered;

/// Every stage, in pipeline order.
pub const STAGES: [Registered; 2] = [
    crate::hints::service::REGISTERED,
    crate::advantages::service::REGISTERED,
];

/// The stage named `name`.
pub fn find(name: &str) -> Option<&'static Registered> {
    STAGES.iter().find(|s| s.name == name)
}

/// Every topic of every stage, each once: what `topics create` makes.
pub fn design_topics(config: &Config) -> Vec<TopicSpec> {
    admin::union(STAGES.iter().flat_map(|s| (s.topics)(config)))
}

/// The specs of `names` as the stages make them (a dead-letter topic with
/// its `max.message.bytes`, the outcomes and spend topics with their
/// retention), and any other name with the broker's defaults.
pub fn specs_of(config: &Config, names: &[String]) -> Vec<TopicSpec> {
    let known = design_topics(config);
    names
        .iter()
        .map(|name| {
            known
                .iter()
                .find(|t| &t.name == name)
                .cloned()
                .unwrap_or_else(|| TopicSpec::plain(name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_design_topics_are_every_stage_topic_once_with_their_configs() {
        let config = Config::default();
        let topics = design_topics(&config);
        let names: Vec<&str> = topics.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "rl.advantages",
                "rl.hints",
                "rl.hints.outcomes",
                "rl.hints.spend",
                "rl.metrics",
                "rl.rollouts.scored",
                "rl.rollouts.scored.dlq",
                "rl.trajectories.failed",
                "rl.trajectories.failed.dlq",
            ]
        );
        let configs = |name: &str| topics.iter().find(|t| t.name == name).unwrap().configs.clone();
        assert_eq!(configs("rl.trajectories.failed.dlq")[0].0, "max.message.bytes");
        assert_eq!(configs("rl.hints.outcomes")[0].0, "retention.ms");
        assert!(configs("rl.hints").is_empty());
        assert!(find("hints").is_some() && find("advantages").is_some() && find("eval").is_none());
        let named = specs_of(&config, &["rl.trajectories.failed.dlq".into(), "other".into()]);
        assert_eq!(
            named[0],
            TopicSpec::dead_letters(&config, "rl.trajectories.failed.dlq")
        );
        assert_eq!(named[1], TopicSpec::plain("other"));
    }
}
