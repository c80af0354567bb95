//! What the cluster lets this client do on its topics (KIP-430): each
//! topic's authorized operations, read with librdkafka's `DescribeTopics`
//! (which rdkafka does not wrap), and the start-up check that a stage may
//! read its input and write every topic it writes.
//!
//! The broker answers for the client's own principal. A broker without an
//! authorizer answers every operation; one that does not report authorized
//! operations answers nothing, and the check then passes: it only refuses
//! what the broker says is refused. The quick start's embedded broker
//! (librdkafka's mock cluster) is not asked at all (`super::embedded`): it
//! answers DescribeTopics only after the request's own timeout.

use std::ffi::{CStr, CString};
use std::fmt;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::KafkaError;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use thiserror::Error;

/// An ACL operation on a topic (Kafka's `AclOperation`, those a topic has).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TopicOperation {
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    DescribeConfigs,
    AlterConfigs,
    /// Any operation librdkafka names that a topic does not have.
    Other(u32),
}

impl TopicOperation {
    fn from_code(code: u32) -> TopicOperation {
        use rd::rd_kafka_AclOperation_t::*;
        match code {
            c if c == RD_KAFKA_ACL_OPERATION_READ as u32 => TopicOperation::Read,
            c if c == RD_KAFKA_ACL_OPERATION_WRITE as u32 => TopicOperation::Write,
            c if c == RD_KAFKA_ACL_OPERATION_CREATE as u32 => TopicOperation::Create,
            c if c == RD_KAFKA_ACL_OPERATION_DELETE as u32 => TopicOperation::Delete,
            c if c == RD_KAFKA_ACL_OPERATION_ALTER as u32 => TopicOperation::Alter,
            c if c == RD_KAFKA_ACL_OPERATION_DESCRIBE as u32 => TopicOperation::Describe,
            c if c == RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS as u32 => TopicOperation::DescribeConfigs,
            c if c == RD_KAFKA_ACL_OPERATION_ALTER_CONFIGS as u32 => TopicOperation::AlterConfigs,
            c => TopicOperation::Other(c),
        }
    }
}

impl fmt::Display for TopicOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopicOperation::Read => f.write_str("READ"),
            TopicOperation::Write => f.write_str("WRITE"),
            TopicOperation::Create => f.write_str("CREATE"),
            TopicOperation::Delete => f.write_str("DELETE"),
            TopicOperation::Alter => f.write_str("ALTER"),
            TopicOperation::Describe => f.write_str("DESCRIBE"),
            TopicOperation::DescribeConfigs => f.write_str("DESCRIBE_CONFIGS"),
            TopicOperation::AlterConfigs => f.write_str("ALTER_CONFIGS"),
            TopicOperation::Other(code) => write!(f, "operation {code}"),
        }
    }
}

/// One topic as the broker describes it to this client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicAccess {
    pub topic: String,
    /// The topic's own error: `TopicAuthorizationFailed` when the principal
    /// may not even describe it, `UnknownTopicOrPartition` when it is absent.
    pub error: Option<RDKafkaErrorCode>,
    /// What the principal may do on it; `None` when the broker did not say.
    pub operations: Option<Vec<TopicOperation>>,
}

/// An operation a stage needs on a topic and is not granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingAcl {
    pub topic: String,
    pub operation: TopicOperation,
    /// What the principal may do there instead (empty: not even DESCRIBE).
    pub granted: Vec<TopicOperation>,
}

impl fmt::Display for MissingAcl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on topic {:?}", self.operation, self.topic)?;
        if self.granted.is_empty() {
            f.write_str(" (not even DESCRIBE: the broker refuses to describe it)")
        } else {
            let granted: Vec<String> = self.granted.iter().map(ToString::to_string).collect();
            write!(f, " (granted: {})", granted.join(", "))
        }
    }
}

#[derive(Debug, Error)]
pub enum DescribeError {
    #[error("DescribeTopics: {0}")]
    Request(String),
    #[error("topic name {0:?} holds a NUL byte")]
    BadName(String),
    #[error("DescribeTopics did not answer within {0:?}")]
    Timeout(Duration),
    #[error("kafka client: {0}")]
    Client(#[from] KafkaError),
}

/// Describes `topics` with their authorized operations through `client`.
/// Blocking: at most `within`.
pub fn describe_topics<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    within: Duration,
) -> Result<Vec<TopicAccess>, DescribeError> {
    let names = topics
        .iter()
        .map(|t| CString::new(*t).map_err(|_| DescribeError::BadName(t.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let mut pointers: Vec<*const std::os::raw::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let timeout_ms = i32::try_from(within.as_millis()).unwrap_or(i32::MAX).max(1);
    let rk = client.native_ptr();
    // SAFETY: every handle made here is destroyed on every path below; the
    // names outlive the call that copies them; result pointers are read
    // before their event is destroyed.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        let options =
            rd::rd_kafka_AdminOptions_new(rk, rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS);
        let mut errstr = [0 as std::os::raw::c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(options, timeout_ms, errstr.as_mut_ptr(), errstr.len());
        let error = rd::rd_kafka_AdminOptions_set_include_authorized_operations(options, 1);
        if !error.is_null() {
            rd::rd_kafka_error_destroy(error);
        }
        let collection = rd::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len());
        rd::rd_kafka_DescribeTopics(rk, collection, options, queue);
        rd::rd_kafka_TopicCollection_destroy(collection);
        rd::rd_kafka_AdminOptions_destroy(options);
        let event = rd::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(1000));
        let outcome = if event.is_null() {
            Err(DescribeError::Timeout(within))
        } else {
            let outcome = read_result(event);
            rd::rd_kafka_event_destroy(event);
            outcome
        };
        rd::rd_kafka_queue_destroy(queue);
        outcome
    }
}

/// The topics of a DescribeTopics result event.
///
/// # Safety
/// `event` is a live event from a DescribeTopics call.
unsafe fn read_result(event: *mut rd::rd_kafka_event_t) -> Result<Vec<TopicAccess>, DescribeError> {
    let code = rd::rd_kafka_event_error(event);
    if code != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Err(DescribeError::Request(text(rd::rd_kafka_event_error_string(
            event,
        ))));
    }
    let result = rd::rd_kafka_event_DescribeTopics_result(event);
    if result.is_null() {
        return Err(DescribeError::Request("not a DescribeTopics result".into()));
    }
    let mut count = 0usize;
    let descriptions = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let description = *descriptions.add(i);
        let error = rd::rd_kafka_TopicDescription_error(description);
        let error = (!error.is_null()).then(|| RDKafkaErrorCode::from(rd::rd_kafka_error_code(error)));
        let mut n = 0usize;
        // Read as integers: a value outside the Rust enum must not be
        // materialized as one.
        let operations =
            rd::rd_kafka_TopicDescription_authorized_operations(description, &mut n) as *const u32;
        let operations = (!operations.is_null() && n > 0).then(|| {
            (0..n)
                .map(|j| TopicOperation::from_code(*operations.add(j)))
                .collect()
        });
        out.push(TopicAccess {
            topic: text(rd::rd_kafka_TopicDescription_name(description)),
            error: error.filter(|e| *e != RDKafkaErrorCode::NoError),
            operations,
        });
    }
    Ok(out)
}

/// # Safety
/// `s` is null or a NUL-terminated string that lives for this call.
unsafe fn text(s: *const std::os::raw::c_char) -> String {
    if s.is_null() {
        String::new()
    } else {
        CStr::from_ptr(s).to_string_lossy().into_owned()
    }
}

/// The topics to describe for a stage that reads `reads` and writes
/// `writes`: each once, in order, whatever it is needed for. A broker
/// refuses a DescribeTopics that names a topic twice (Apache Kafka:
/// "Duplicate topics not allowed"), and one answer holds every operation.
pub fn topics_to_describe(reads: &[&str], writes: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for topic in reads.iter().chain(writes) {
        if !names.iter().any(|n| n == topic) {
            names.push((*topic).to_string());
        }
    }
    names
}

/// What a stage needs and lacks: READ on `reads`, WRITE on `writes`, from
/// the broker's answer `access`. A topic the broker did not describe, or
/// described without authorized operations, is not judged here (a missing
/// topic is reported by the caller).
pub fn missing_acls(access: &[TopicAccess], reads: &[&str], writes: &[&str]) -> Vec<MissingAcl> {
    let needs = reads
        .iter()
        .map(|t| (*t, TopicOperation::Read))
        .chain(writes.iter().map(|t| (*t, TopicOperation::Write)));
    let mut missing = vec![];
    for (topic, operation) in needs {
        let Some(a) = access.iter().find(|a| a.topic == topic) else {
            continue;
        };
        let granted = match (&a.error, &a.operations) {
            (Some(RDKafkaErrorCode::TopicAuthorizationFailed), _) => vec![],
            (Some(_), _) | (None, None) => continue,
            (None, Some(ops)) if ops.contains(&operation) => continue,
            (None, Some(ops)) => {
                let mut ops = ops.clone();
                ops.sort();
                ops
            }
        };
        if !missing
            .iter()
            .any(|m: &MissingAcl| m.topic == topic && m.operation == operation)
        {
            missing.push(MissingAcl {
                topic: topic.to_string(),
                operation,
                granted,
            });
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(topic: &str, error: Option<RDKafkaErrorCode>, ops: Option<&[TopicOperation]>) -> TopicAccess {
        TopicAccess {
            topic: topic.into(),
            error,
            operations: ops.map(<[TopicOperation]>::to_vec),
        }
    }

    #[test]
    fn a_topic_granted_read_but_not_write_is_named_with_what_it_has() {
        use TopicOperation::*;
        let answer = [
            access("in", None, Some(&[Read, Describe])),
            access("out", None, Some(&[Describe, Read])),
            access("dlq", None, Some(&[Write, Describe])),
        ];
        let missing = missing_acls(&answer, &["in"], &["out", "dlq"]);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert_eq!(
            missing[0].to_string(),
            "WRITE on topic \"out\" (granted: READ, DESCRIBE)"
        );
    }

    #[test]
    fn a_topic_the_principal_cannot_describe_lacks_everything_it_needs() {
        let answer = [access(
            "out",
            Some(RDKafkaErrorCode::TopicAuthorizationFailed),
            None,
        )];
        let missing = missing_acls(&answer, &[], &["out"]);
        assert_eq!(missing[0].operation, TopicOperation::Write);
        assert!(
            missing[0].to_string().contains("not even DESCRIBE"),
            "{}",
            missing[0]
        );
    }

    #[test]
    fn unknown_answers_and_absent_topics_are_not_judged() {
        let answer = [
            access("quiet", None, None),
            access("gone", Some(RDKafkaErrorCode::UnknownTopicOrPartition), None),
        ];
        assert!(missing_acls(&answer, &["quiet"], &["gone", "never-described"]).is_empty());
    }

    #[test]
    fn a_topic_read_and_written_is_described_once() {
        assert_eq!(
            topics_to_describe(&["spend", "in"], &["spend", "out", "in"]),
            ["spend", "in", "out"]
        );
    }

    #[test]
    fn a_topic_read_and_written_is_checked_for_both() {
        let answer = [access("both", None, Some(&[TopicOperation::Describe]))];
        let missing = missing_acls(&answer, &["both"], &["both", "both"]);
        let ops: Vec<_> = missing.iter().map(|m| m.operation).collect();
        assert_eq!(ops, [TopicOperation::Read, TopicOperation::Write]);
    }
}
