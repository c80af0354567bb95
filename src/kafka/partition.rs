//! A partition of an input topic as the stage names it, and how log lines
//! show a rebalance's partitions.

use std::sync::Arc;

use rdkafka::TopicPartitionList;

/// A partition of an input topic.
pub type Partition = (Arc<str>, i32);

pub(crate) fn partitions_of(tpl: &TopicPartitionList) -> Vec<Partition> {
    tpl.elements()
        .iter()
        .map(|e| (Arc::from(e.topic()), e.partition()))
        .collect()
}

pub(crate) fn describe_partitions(partitions: &[Partition]) -> String {
    partitions
        .iter()
        .map(|(t, p)| format!("{t}[{p}]"))
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn describe(tpl: &TopicPartitionList) -> String {
    tpl.elements()
        .iter()
        .map(|e| format!("{}[{}]@{:?}", e.topic(), e.partition(), e.offset()))
        .collect::<Vec<_>>()
        .join(",")
}
