//! An idempotent producer sends nothing before it has its producer id, and
//! librdkafka asks for one when it reads a metadata answer while a broker
//! it learned from metadata is up, else on a 500 ms timer. A stage's
//! start-up (`connect_output`) gets the id asked for at once: without it,
//! about one start in three held the stage's first outputs back half a
//! second. Timed on librdkafka's own clock (its statistics), so a busy
//! machine's scheduling does not move it.

use crate::common;

use std::time::Duration;

use hintstream::config::ClientKind;
use hintstream::kafka::{client_config, connect_output};
use rdkafka::client::ClientContext;
use rdkafka::producer::FutureProducer;
use rdkafka::statistics::Statistics;
use tokio::sync::watch;

/// librdkafka's retry timer for a producer id (`rd_kafka_idemp_pid_timer_restart`).
const PID_TIMER: Duration = Duration::from_millis(500);

/// The idempotent producer's state of librdkafka's last statistics
/// (every 10 ms), and when it entered it: ms after the producer was made,
/// on librdkafka's clock (`age` less `eos.idemp_stateage`).
struct IdState(watch::Sender<(String, i64)>);

impl ClientContext for IdState {
    fn stats(&self, statistics: Statistics) {
        if let Some(eos) = statistics.eos {
            self.0
                .send_replace((eos.idemp_state, statistics.age / 1000 - eos.idemp_stateage));
        }
    }
}

/// A producer with the stage's idempotence settings and its state's reports.
fn producer(bootstrap: &str) -> (FutureProducer<IdState>, watch::Receiver<(String, i64)>) {
    let mut client = client_config(&common::config_for(bootstrap), ClientKind::Producer);
    client
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("statistics.interval.ms", "10");
    let (tx, rx) = watch::channel((String::new(), 0));
    (client.create_with_context(IdState(tx)).unwrap(), rx)
}

/// Made, connected as a stage connects its output producer, and given its
/// id: ms after it was made that the id came (librdkafka's clock).
async fn id_after(bootstrap: &str, topic: &str) -> i64 {
    let within = Duration::from_secs(30);
    let (p, mut states) = producer(bootstrap);
    let t = topic.to_string();
    let connected = tokio::task::spawn_blocking(move || connect_output(&p, &t, within).then_some(p));
    let p = connected.await.unwrap().expect("the broker answers");
    let assigned = tokio::time::timeout(within, states.wait_for(|(state, _)| state == "Assigned"))
        .await
        .expect("a producer id within 30 s")
        .expect("statistics")
        .1;
    drop(p);
    assigned
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_connected_as_a_stage_starts_has_its_id_before_librdkafkas_retry_timer() {
    let broker = common::shared_kafka();
    let topic = common::unique("pid");
    common::create_topics(&common::config_for(&broker.bootstrap), &[&topic], 3).await;

    // A fresh broker refuses its first id while its coordinator loads
    // ("Coordinator load in progress"), and librdkafka asks again on the
    // timer: one producer first, so that every one after it is a start on
    // a running cluster.
    id_after(&broker.bootstrap, &topic).await;

    // A start that had no broker to ask waited for the timer (without
    // `connect_output`'s later questions, about one start in ten here, one in
    // three in the bench's): forty starts.
    for start in 0..40 {
        let at = id_after(&broker.bootstrap, &topic).await;
        assert!(
            at < PID_TIMER.as_millis() as i64,
            "start {start}: the producer id came {at} ms after the producer was made, when \
             librdkafka's retry timer fires ({} ms)",
            PID_TIMER.as_millis()
        );
    }
}
