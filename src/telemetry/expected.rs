//! librdkafka's warnings that report an expected state, left out of the log
//! lines: a state librdkafka retries out of by itself, with nothing for the
//! user to do (a fresh broker still loading its coordinators). A warning in
//! a user's log means the user must act.

use tracing::field::{Field, Visit};
use tracing::{Event, Metadata};
use tracing_log::NormalizeEvent;
use tracing_subscriber::layer::{Context, Filter};

/// The target of librdkafka's lines (rdkafka's `ClientContext::log`).
const LIBRDKAFKA: &str = "librdkafka";

/// (facility, words) of each expected state.
const EXPECTED: &[(&str, &str)] = &[
    // The idempotent producer asks a fresh broker for its producer id
    // while the broker loads its transaction coordinator; it retries.
    ("GETPID", "Coordinator load in progress"),
    ("GETPID", "Coordinator not available"),
];

/// Whether a librdkafka line (`librdkafka: FAC [thrd:..]: text`, as rdkafka
/// writes it) reports an expected state.
fn is_expected(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("librdkafka: ") else {
        return false;
    };
    EXPECTED.iter().any(|(facility, words)| {
        rest.starts_with(facility) && rest[facility.len()..].starts_with(' ') && rest.contains(words)
    })
}

/// The per-layer filter of the log lines that leaves the expected states
/// out.
pub(super) struct ExpectedStates;

impl<S> Filter<S> for ExpectedStates {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        // rdkafka writes through the `log` crate: its records arrive as
        // events of the bridge's target, their own in a field.
        let normalized = event.normalized_metadata();
        let target = normalized
            .as_ref()
            .map_or(event.metadata().target(), Metadata::target);
        if target != LIBRDKAFKA {
            return true;
        }
        let mut message = Message::default();
        event.record(&mut message);
        !is_expected(&message.0)
    }
}

/// An event's `message` field.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    #[test]
    fn a_fresh_brokers_coordinator_load_is_expected_and_other_warnings_are_not() {
        assert!(is_expected(
            "librdkafka: GETPID [thrd:main]: Failed to acquire idempotence PID from broker \
             127.0.0.1:39369/1: Broker: Coordinator load in progress: retrying"
        ));
        assert!(!is_expected(
            "librdkafka: SESSTMOUT [thrd:main]: Consumer group session timed out (in join-state steady)"
        ));
        assert!(!is_expected(
            "librdkafka: FAIL [thrd:main]: Coordinator load in progress"
        ));
    }

    #[test]
    fn the_filter_drops_only_expected_librdkafka_lines() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let keep = seen.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || Sink(keep.clone()))
            .with_filter(ExpectedStates);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "librdkafka", "librdkafka: GETPID [thrd:main]: Broker: Coordinator load in progress: retrying");
            tracing::warn!(target: "librdkafka", "librdkafka: SESSTMOUT [thrd:main]: Consumer group session timed out");
            tracing::warn!("GETPID Coordinator load in progress, from elsewhere");
            // As rdkafka writes them: through the `log` crate, whose records
            // reach tracing as events of the bridge's own target.
            for line in [
                "librdkafka: GETPID [thrd:main]: Failed to acquire idempotence PID: Coordinator load in \
                 progress: retrying (log)",
                "librdkafka: SESSTMOUT [thrd:main]: timed out (log)",
            ] {
                tracing_log::format_trace(
                    &log::Record::builder()
                        .target(LIBRDKAFKA)
                        .level(log::Level::Warn)
                        .args(format_args!("{line}"))
                        .build(),
                )
                .unwrap();
            }
        });
        let lines = seen.lock().unwrap().concat();
        assert!(!lines.contains("retrying"), "{lines}");
        assert!(lines.contains("timed out (log)"), "{lines}");
        assert!(lines.contains("SESSTMOUT"), "{lines}");
        assert!(lines.contains("from elsewhere"), "{lines}");
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(bytes).into_owned());
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
