//! Errors of a one-off broker question (metadata, watermarks, offsets) that
//! the broker itself calls retriable: a leader that moved or is being
//! elected, a request that timed out, a connection that dropped. librdkafka
//! retries these inside a consumer's fetch loop, but returns them from its
//! blocking calls (`fetch_metadata`, `fetch_watermarks`, `offsets_for_times`);
//! their callers ask again, with backoff, up to a bound.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Whether the broker or librdkafka marks `error` as retriable: asking again
/// a moment later may succeed.
pub(crate) fn is_transient(error: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        error.rdkafka_error_code(),
        Some(
            NotLeaderForPartition
                | LeaderNotAvailable
                | ReplicaNotAvailable
                | FencedLeaderEpoch
                | UnknownLeaderEpoch
                | OffsetNotAvailable
                | RequestTimedOut
                | NetworkException
                | KafkaStorageError
                | OperationTimedOut
                | BrokerTransportFailure
                | AllBrokersDown
                | Resolve
        )
    )
}

/// Calls `op` until it succeeds, fails with an error that is not transient
/// ([`is_transient`] on the Kafka error `kafka_of` finds in it), or `within`
/// has passed since the first call; then its last error is returned. The
/// waits between calls grow from 100 ms to 2 s; a call that starts before
/// `within` is up runs to its own timeout.
pub(crate) async fn retry_transient<T, E, F, Fut>(
    within: Duration,
    kafka_of: fn(&E) -> Option<&KafkaError>,
    op: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let deadline = tokio::time::Instant::now() + within;
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_total_delay(Some(within))
        .without_max_times();
    op.retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|e| kafka_of(e).is_some_and(is_transient) && tokio::time::Instant::now() < deadline)
        .notify(|e, wait| tracing::debug!(error = %e, ?wait, "a transient broker error; asking again"))
        .await
}

/// A topic's own error in a metadata answer (`fetch_metadata` succeeds
/// while the topic's leader is, say, being elected) as a Kafka error when
/// it is transient, so that [`retry_transient`] asks again; `None` for no
/// error or one that is not transient (a missing topic, say), which the
/// caller reports itself.
pub(crate) fn transient_topic_error(error: Option<rdkafka::types::RDKafkaRespErr>) -> Option<KafkaError> {
    let error = KafkaError::MetadataFetch(RDKafkaErrorCode::from(error?));
    is_transient(&error).then_some(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_moved_leader_is_transient_and_a_missing_topic_or_denied_access_is_not() {
        assert!(is_transient(&KafkaError::MetadataFetch(
            RDKafkaErrorCode::NotLeaderForPartition
        )));
        assert!(is_transient(&KafkaError::MetadataFetch(
            RDKafkaErrorCode::OperationTimedOut
        )));
        assert!(!is_transient(&KafkaError::MetadataFetch(
            RDKafkaErrorCode::TopicAuthorizationFailed
        )));
        assert!(!is_transient(&KafkaError::MetadataFetch(
            RDKafkaErrorCode::UnknownTopicOrPartition
        )));
        assert!(!is_transient(&KafkaError::Canceled));
    }

    /// Calls [`retry_transient`] with a call that takes `each` and always
    /// fails with `code`: how many calls it made, and how long it took.
    async fn always_failing(within: Duration, each: Duration, code: RDKafkaErrorCode) -> (usize, Duration) {
        let started = tokio::time::Instant::now();
        let calls = AtomicUsize::new(0);
        let last: Result<u32, KafkaError> = retry_transient(
            within,
            |e| Some(e),
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(each).await;
                Err(KafkaError::MetadataFetch(code))
            },
        )
        .await;
        assert!(last.is_err());
        (calls.load(Ordering::SeqCst), started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_asked_again_until_an_answer_and_others_return_at_once() {
        let calls = AtomicUsize::new(0);
        let answer: Result<u32, KafkaError> = retry_transient(
            Duration::from_secs(10),
            |e| Some(e),
            || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0 | 1 => Err(KafkaError::MetadataFetch(RDKafkaErrorCode::NotLeaderForPartition)),
                    _ => Ok(7),
                }
            },
        )
        .await;
        assert_eq!(answer.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let (calls, _) = always_failing(
            Duration::from_secs(10),
            Duration::ZERO,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        )
        .await;
        assert_eq!(calls, 1, "a refusal is not asked again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_error_that_lasts_is_returned_once_the_bound_is_spent() {
        let (calls, took) = always_failing(
            Duration::from_secs(5),
            Duration::ZERO,
            RDKafkaErrorCode::LeaderNotAvailable,
        )
        .await;
        assert!(calls > 2, "{calls} calls");
        assert!(took <= Duration::from_secs(5), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_counts_the_calls_own_time_too() {
        // Each call times out itself after 4 s: one at 0 s, one at ~4.1 s,
        // none after 5 s.
        let (calls, took) = always_failing(
            Duration::from_secs(5),
            Duration::from_secs(4),
            RDKafkaErrorCode::OperationTimedOut,
        )
        .await;
        assert_eq!(calls, 2);
        assert!(took < Duration::from_secs(9), "{took:?}");
    }

    #[test]
    fn a_topic_whose_leader_is_elected_is_transient_and_a_missing_topic_is_not() {
        use rdkafka::types::RDKafkaRespErr;
        assert!(
            transient_topic_error(Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE)).is_some()
        );
        assert!(
            transient_topic_error(Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)).is_none()
        );
        assert!(transient_topic_error(None).is_none());
    }
}
